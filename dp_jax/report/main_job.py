"""The main job's summary (python -m dp_jax.pipeline): every number labelled predicted,
simulated or measured, the tables it prints and the story in plain words (no JAX).

The local part's numbers travel as {quantity: (value, kind)}, kind one of config, predicted,
simulated, measured; the paper part's as rows of dp_jax.studies.paper.COLUMNS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dp_jax.multiplex.background import BackgroundSpec
from dp_jax.multiplex.policy import busy_in_every_layer
from dp_jax.report.compare import describe, validated_tolerance
from dp_jax.studies.paper import COLUMNS as PAPER_COLUMNS

Measured = dict[str, tuple[Any, str]]  # quantity -> (value, kind)
KINDS = ("config", "predicted", "simulated", "measured")
TRAINED_KEYS = ("final_step", "loss_first", "final_loss", "measured_step_ms",
                "measured_step_ms_with_background", "foreground_slowdown",
                "background_steps", "background_samples_per_s", "background_failures",
                "background_pieces", "background_refused", "simulated_slowdown",
                "simulated_background_samples_per_s")
PINNED_KEYS = ("final_step", "measured_step_ms", "measured_step_ms_with_background")
SIMULATED_KEYS = ("alone_iteration_ms", "iteration_ms", "alone_idle_fraction",
                  "background_samples_per_s", "cluster_throughput_vs_data_parallel")
AGREE = (0.8, 1.25)  # measured / predicted counted as agreement


@dataclass(frozen=True)
class MainJobFacts:
  """What the summary's words name: the paper's model and batch, the local plan's
  amplification limit and the background job."""

  paper_model: str
  paper_batch: int
  amplification_limit: float
  background: BackgroundSpec


# --- the local part's quantities ------------------------------------------------------------


def idle_devices(assignment: dict[str, tuple[int, int]], g: int) -> int:
  """Devices some layer of the plan leaves idle: where a background job can run (0 when every
  layer uses all g devices, i.e. the plan is data parallelism on all g)."""
  return g - len(busy_in_every_layer(
      (range(first, first + count) for first, count in assignment.values()), g))


def plan_quantities(graph, plan, g: int, b: int) -> Measured:
  """The local run's model, devices and batch, and the shape of its burst plan."""
  burst = plan.assignment()
  stages = {lp.extra.get("stage") for lp in plan.layers} - {None}
  return {"model": (f"{graph.model} {'x'.join(map(str, graph.input_shape))}", "config"),
          "devices": (g, "config"), "global_batch": (b, "config"),
          "plan_stages": (len(stages) or None, "predicted"),
          "burst_devices_per_layer": ("/".join(str(c) for c in sorted(
              {c for _, c in burst.values()}, reverse=True)), "predicted"),
          "devices_idle_in_some_layer": (idle_devices(burst, g), "predicted")}


def timed_quantities(predicted_ms: dict[str, float], measured_ms: dict[str, float]) -> Measured:
  """Predicted, measured and measured / predicted ms per step of burst and data parallelism,
  and the measured speed-up of burst over data parallelism."""
  out: Measured = {}
  for name in ("burst", "data_parallel"):
    p, m = predicted_ms[name], measured_ms[name]
    out.update({f"{name}_predicted_ms": (p, "predicted"), f"{name}_measured_ms": (m, "measured"),
                f"{name}_measured_over_predicted": (m / p, "measured")})
  out["burst_vs_data_parallel_measured"] = (measured_ms["data_parallel"] / measured_ms["burst"],
                                            "measured")
  return out


def simulated_quantities(m: dict[str, Any]) -> Measured:
  """The simulation of the burst plan on the in-context profile (alone and with background)."""
  out: Measured = {f"simulated_on_profile_{k}": (m[k], "simulated") for k in SIMULATED_KEYS
                   if k in m}
  if m.get("alone_iteration_ms") and m.get("iteration_ms"):
    out["simulated_on_profile_slowdown"] = (m["iteration_ms"] / m["alone_iteration_ms"] - 1,
                                            "simulated")
  return out


def trained_quantities(trained: dict[str, Any]) -> Measured:
  """The pinned training's summary: measured, but for the simulator's replay of it."""
  return {f"pinned_{k}" if k in PINNED_KEYS else k: (
      v, "simulated" if k.startswith("simulated") else "measured")
      for k, v in trained.items() if k in TRAINED_KEYS}


# --- the summary ------------------------------------------------------------------------------


def summary(facts: MainJobFacts, paper: list[list[Any]], fair: list[str], local: Measured,
            plots: dict[str, str]) -> dict[str, Any]:
  """summary.json: the paper rows, their fair comparisons, the local quantities, the plots and
  the story."""
  return {"a100": [dict(zip(PAPER_COLUMNS, r, strict=True)) for r in paper],
          "a100_fair_comparison": fair,
          "local": {k: {"value": v, "kind": kind} for k, (v, kind) in local.items()},
          "plots": plots, "story": story(facts, paper, local)}


def flat(paper: list[list[Any]], local: Measured, seconds: float) -> dict[str, Any]:
  """The run's flat metrics (status.json, W&B): the job's seconds, every local quantity and
  each paper setting's speed-up and cluster throughput."""
  out = {"job_seconds": seconds, **{f"local/{k}": v for k, (v, _) in local.items()}}
  for r in paper:
    out[f"a100/{r[0]}_g{r[1]}/speedup"] = r[4]
    out[f"a100/{r[0]}_g{r[1]}/cluster_throughput_vs_dp"] = r[7]
  return out


def header(name: str, what: str, seconds: float) -> None:
  """A header line: the part, what it does, the seconds since the job started."""
  from rich.console import Console  # rich: only to print (its import is not free)

  Console(width=110).rule(f"[bold]{name}[/bold] ({seconds:.0f} s): {what}")


def print_summary(facts: MainJobFacts, paper: list[list[Any]], fair: list[str], local: Measured,
                  plots: dict[str, str]) -> None:
  """The paper table, its fair comparisons, the local table, the plots and the story."""
  # rich: only to print (its import is not free)
  from rich.console import Console
  from rich.table import Table

  console = Console(width=150)
  if paper:
    t = Table(title=f"{facts.paper_model}, B={facts.paper_batch}, on the calibrated A100 "
                    "profile: burst vs data parallelism (DP)",
              caption="P: predicted by the cost model; S: simulated. Matched: the best DP on d "
                      "devices + background on the rest, over every d whose foreground is "
                      "within the comparison tolerance of the burst plan's.")
    for c in ("cluster", "G", "burst ms P", "DP ms P", "speed-up P", "GPU time saved P",
              "background samples/s S", "cluster / DP S", "cluster / matched DP S"):
      t.add_column(c, justify="left" if c == "cluster" else "right")
    for r in paper:
      t.add_row(r[0], str(r[1]), f"{r[2]:.2f}", f"{r[3]:.2f}", f"{r[4]:.2f}x", f"{r[5]:.0%}",
                _fmt(r[6]), _fmt(r[7], "x"), _fmt(r[8]))
    console.print(t)
    for line in fair:  # the fair baseline first (matched DP, fastest DP on <= G), then all G
      console.print(line)
  t = Table(title="on this machine's devices")
  for c in ("quantity", "value", "kind"):
    t.add_column(c, justify="right" if c == "value" else "left")
  for k, (v, kind) in local.items():
    t.add_row(k, _fmt(v), kind)
  console.print(t)
  for k, v in plots.items():
    console.print(f"{k}: {v}")
  print("\nIn plain words:")
  for line in story(facts, paper, local):
    print(f"- {line}")


def story(facts: MainJobFacts, paper: list[list[Any]], local: Measured) -> list[str]:
  """What was predicted on A100s, what was measured here, and whether they agree."""
  out = [_paper_line(facts, r) for r in paper]
  v = {k: val for k, (val, _) in local.items()}
  if "burst_measured_ms" in v:
    out += _measured_lines(v)
  if v.get("devices_idle_in_some_layer") == 0:
    out.append(
        f"The planner's plan here uses all {v['devices']} devices in every layer (it is data "
        "parallelism): no device is ever idle, so the background job had nowhere to run "
        "(0 background steps is that, not a failure). The measured profile decides it: a layer "
        "stays on fewer devices only where more would raise its GPU time beyond the "
        f"amplification limit ({facts.amplification_limit}x), and on a loaded machine the "
        "small layers' costs are noise; run the main job again on a quiet machine.")
  if "background_steps" in v:
    out += _background_lines(facts.background, v)
  return out


def _paper_line(facts: MainJobFacts, r: list[Any]) -> str:
  matched = (f"{_fmt(r[8])} the work of the matched data parallelism (with the background "
             "job on the GPUs it leaves)" if r[8] and not str(r[8]).startswith("no DP") else
             "no data parallelism on fewer GPUs is as fast (no matched baseline)")
  return (f"On A100s ({r[0]}, G={r[1]}; predicted on the calibrated profile): "
          f"{facts.paper_model} B={facts.paper_batch} takes {r[2]:.1f} ms per iteration as a "
          f"burst plan and {r[3]:.1f} ms as data parallelism on all {r[1]} GPUs ({r[4]:.2f}x), "
          f"using {r[5]:.0%} less GPU time; with a background job in the idle GPUs the cluster "
          f"does {matched} and {_fmt(r[7], 'x')} that of data parallelism alone on all GPUs "
          "(simulated).")


def _measured_lines(v: dict[str, Any]) -> list[str]:
  ratios = {n: v[f"{n}_measured_over_predicted"] for n in ("burst", "data_parallel")}
  off = [n.replace("_", " ") for n, x in ratios.items() if not AGREE[0] <= x <= AGREE[1]]
  versus = describe(v["burst_vs_data_parallel_measured"], validated_tolerance("cpu"))
  return [
      f"Here ({v['devices']} CPU devices, one per core; {v['model']}, B={v['global_batch']}): "
      f"the burst plan was predicted at {v['burst_predicted_ms']:.1f} ms per step and "
      f"measured at {v['burst_measured_ms']:.1f} ms (measured / predicted "
      f"{ratios['burst']:.2f}); data parallelism {v['data_parallel_predicted_ms']:.1f} ms "
      f"predicted, {v['data_parallel_measured_ms']:.1f} ms measured "
      f"({ratios['data_parallel']:.2f}). Measured, the burst plan against data "
      f"parallelism: {versus}.",
      "Prediction and measurement agree within "
      f"{AGREE[0]:.2f}-{AGREE[1]:.2f}x for both plans." if not off else
      f"Prediction and measurement disagree (outside {AGREE[0]:.2f}-{AGREE[1]:.2f}x) "
      f"for: {', '.join(off)}."]


def _background_lines(bg: BackgroundSpec, v: dict[str, Any]) -> list[str]:
  out = [
      f"The background job {bg.name} (batch {bg.batch_per_device} per device) beside the burst "
      f"plan, on one pinned process per core, under the slowdown cap {bg.cap:.0%}: measured "
      f"foreground slowdown {_pct(v.get('foreground_slowdown'))}, simulated "
      f"{_pct(v.get('simulated_slowdown'))} (the simulator's policy on the measured alone step "
      "and pieces; on the in-context profile "
      f"{_pct(v.get('simulated_on_profile_slowdown'))}); {v['background_steps']} background "
      f"steps ({_fmt(v.get('background_samples_per_s'))} samples/s measured, "
      f"{_fmt(v.get('simulated_background_samples_per_s'))} simulated), "
      f"{v['background_failures']} failures."]
  over = v.get("foreground_slowdown")
  if over is not None and over > bg.cap:
    out.append(
        f"The measured slowdown is above the {bg.cap:.0%} cap: the policy tightens only on an "
        "excess that the alone steps' own noise cannot explain (a one-sided t test at 1%, "
        "dp_jax/multiplex/policy.py), so on short, noisy pinned steps the measured mean can "
        "pass the cap by that noise; `python -m dp_jax.train` on seconds-long steps holds it "
        "(docs/orchestrator.md).")
  if v.get("pinned_measured_step_ms") and v.get("burst_measured_ms"):
    out.append(
        f"On the pinned processes the burst step alone took "
        f"{v['pinned_measured_step_ms']:.0f} ms (measured; {v['burst_measured_ms']:.0f} ms in "
        f"one process): {pinned_causes(v)}. The measured Gantt chart shows where; the "
        "slowdown above is against that step, not the one predicted.")
  return out


def pinned_causes(v: dict[str, Any]) -> str:
  """Why the pinned processes' step differs from the in-process one, for this plan's shape."""
  counts = [int(c) for c in str(v.get("burst_devices_per_layer") or "").split("/") if c]
  causes = []
  if counts and max(counts) > 1 or (v.get("plan_stages") or 1) > 1:
    causes.append("their all-reduces and moves cross processes through gloo on localhost")
  if counts and min(counts) < v["devices"]:
    causes.append("each has one core, while in one process a stage on fewer devices than "
                  "cores also uses the idle cores (docs/validation.md, one device per core)")
  return "; ".join(causes) or "each is one process per core"


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{x:+.1%}"


def _fmt(v: Any, suffix: str = "") -> str:
  if v is None:
    return "-"
  return f"{v:.4g}{suffix}" if isinstance(v, float) else f"{v}{suffix}"
