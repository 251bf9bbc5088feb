"""The main job's summary (python -m dp_jax.pipeline): every number labelled predicted,
simulated or measured, the tables it prints and the story in plain words (no JAX).

The local part's numbers travel as {quantity: (value, kind)}, kind one of config, predicted,
simulated, measured; the paper part's as rows keyed as dp_jax.main_job.paper_setting.COLUMNS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dp_jax.main_job.paper_setting import COLUMNS as PAPER_COLUMNS
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.multiplex.policy import busy_in_every_layer
from dp_jax.orchestrator.jobs import idle_cause
from dp_jax.planner.contract import limit_label
from dp_jax.report.compare import describe, gpu_time_change, validated_tolerance, verdict
from dp_jax.report.tables import table

Measured = dict[str, tuple[Any, str]]  # quantity -> (value, kind)
KINDS = ("config", "predicted", "simulated", "measured")
TRAINED_KEYS = ("final_step", "loss_first", "final_loss", "measured_step_ms",
                "measured_step_ms_with_background", "foreground_slowdown",
                "background_steps", "background_samples_per_s", "background_failures",
                "background_pieces", "background_refused", "foreground_slowdown_noise",
                "simulated_slowdown",
                "simulated_background_samples_per_s", "alone_steps_measured",
                "with_steps_measured", "window_steps", "host_load", "host_cores")
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
  background: BackgroundConfig


# --- the local part's quantities ------------------------------------------------------------


def idle_devices(assignment: dict[str, tuple[int, int]], g: int) -> int:
  """Devices some layer of the plan leaves idle: where a background job can run (0 when every
  layer uses all g devices, i.e. the plan is data parallelism on all g)."""
  return g - len(busy_in_every_layer(
      (range(first, first + count) for first, count in assignment.values()), g))


def plan_quantities(graph, plan, g: int, b: int, *, limit: float,
                    planned_data_parallel: bool = False) -> Measured:
  """The local run's model, devices and batch, and the shape of its burst plan, made under
  amplification limit `limit`; planned_data_parallel: the planner's plan at the asked limit
  was data parallelism on all g devices, and `plan` is the fastest with an idle device
  (planner.idle_device_limit)."""
  burst = plan.assignment()
  stages = {lp.extra.get("stage") for lp in plan.layers} - {None}
  return {"model": (f"{graph.model} {'x'.join(map(str, graph.input_shape))}", "config"),
          "devices": (g, "config"), "global_batch": (b, "config"),
          "planned_is_data_parallel": (planned_data_parallel, "predicted"),
          "plan_amplification_limit": (limit, "config"), "basis": (plan.basis(), "config"),
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


def trained_quantities(trained: dict[str, Any], cap: float) -> Measured:
  """The pinned training's summary: measured, but for the simulator's replay of it; and
  whether the measured slowdown held the cap (cap_held)."""
  out = {f"pinned_{k}" if k in PINNED_KEYS else k: (
      v, "simulated" if k.startswith("simulated") else "measured")
      for k, v in trained.items() if k in TRAINED_KEYS}
  out["cap_held"] = (cap_held(cap, trained.get("foreground_slowdown"),
                              trained.get("foreground_slowdown_noise")), "measured")
  return out


def cap_held(cap: float, slowdown: float | None, noise: float | None) -> bool | None:
  """The measured foreground slowdown within the cap plus its noise (the slowdown the alone
  steps' own scatter reaches with probability 1%, the policy's test; 0 when unknown); None
  when no slowdown was measured."""
  return None if slowdown is None else slowdown <= cap + (noise or 0.0)


def background_failure(bg: BackgroundConfig, local: Measured) -> str | None:
  """Why the main job failed to show what it exists for (one line), or None: the background
  job ran no step beside the plan, or the measured slowdown broke the cap beyond its noise."""
  v = {k: val for k, (val, _) in local.items()}
  if not v.get("background_steps"):
    cause = idle_cause({**v, "background": bg.name, "background_slowdown_cap": bg.cap}) or (
        f"its {v.get('background_pieces') or 0} pieces completed no step within the run "
        f"({v.get('background_refused') or 0} refused, {v.get('background_failures') or 0} "
        "failed)")
    return (f"the background job {bg.name} ran no step beside the plan: {cause}; the main job "
            "did not show multiplexing (its measured Gantt chart shows the idle windows)")
  if v.get("cap_held") is False:
    return (f"the measured foreground slowdown {_pct(v['foreground_slowdown'])} broke the "
            f"{bg.cap:.0%} cap beyond its noise ({_noise(v)}): the multiplexing policy did "
            "not hold its cap here (docs/orchestrator.md)")
  return None


# --- the summary ------------------------------------------------------------------------------


def summary(facts: MainJobFacts, paper: list[dict[str, Any]], fair: list[str], local: Measured,
            plots: dict[str, str]) -> dict[str, Any]:
  """summary.json: the paper rows (labelled as PAPER_COLUMNS), their fair comparisons, the local
  quantities, the plots and the story."""
  return {"a100": [{PAPER_COLUMNS[k]: r[k] for k in PAPER_COLUMNS} for r in paper],
          "a100_fair_comparison": fair,
          "local": {k: {"value": v, "kind": kind} for k, (v, kind) in local.items()},
          "plots": plots, "story": story(facts, paper, local)}


def flat(paper: list[dict[str, Any]], local: Measured, seconds: float) -> dict[str, Any]:
  """The run's flat metrics (status.json, W&B): the job's seconds, every local quantity and
  each paper setting's speed-up over the fastest DP and cluster throughput over DP on all G."""
  out = {"job_seconds": seconds, **{f"local/{k}": v for k, (v, _) in local.items()}}
  for r in paper:
    out[f"a100/{r['cluster']}_g{r['G']}/speedup_vs_fastest_dp"] = r["speedup_vs_fastest_dp"]
    out[f"a100/{r['cluster']}_g{r['G']}/cluster_throughput_vs_dp"] = r["cluster_vs_dp_all"]
  return out


def header(name: str, what: str, seconds: float) -> None:
  """A header line: the part, what it does, the seconds since the job started."""
  from rich.console import Console  # rich: only to print (its import is not free)

  Console(width=110).rule(f"[bold]{name}[/bold] ({seconds:.0f} s): {what}")


def print_summary(facts: MainJobFacts, paper: list[dict[str, Any]], fair: list[str],
                  local: Measured, plots: dict[str, str]) -> None:
  """The paper table, its fair comparisons, the local table, the plots and the story."""
  from rich.console import Console  # rich: only to print (its import is not free)

  console = Console(width=150)
  if paper:
    rows = []
    for r in paper:
      dp = r["plan_data_parallel_devices"]
      rows.append([
          r["cluster"], r["G"], "burst" if dp is None else f"DP on {dp}", f"{r['plan_ms']:.2f}",
          f"{r['fastest_dp_ms']:.2f} (on {r['fastest_dp_devices']})",
          "-" if dp is not None else _short(r["speedup_vs_fastest_dp"], r["tolerance"]),
          f"{gpu_time_change(r['saved_vs_cheapest_dp'], '')} (DP on "
          f"{r['cheapest_dp_devices']})",
          gpu_time_change(r["saved_vs_dp_all"], ""), _fmt(r["background_samples_per_s"]),
          _times(r["cluster_vs_dp_all"]), "-" if r["cluster_vs_matched"] is None else
          f"{r['cluster_vs_matched']:.2f}x (DP on {r['matched_dp_devices']})"])
    console.print(table(
        f"{facts.paper_model}, B={facts.paper_batch}, on the calibrated A100 profile: the plan "
        "vs data parallelism (DP)",
        ["cluster", "G", "plan", "plan ms P", "fastest DP ms P", "vs fastest DP P",
         "GPU time vs cheapest DP P", "vs DP on all G P", "background samples/s S",
         "cluster / DP on all G S", "cluster / matched DP S"], rows, left=("plan",),
        caption="P: predicted by the cost model; S: simulated. Fastest DP: on the d <= G that "
                "runs fastest; cheapest DP: the least GPU time within the tolerance of the "
                "fastest DP's time; matched DP: the best DP on d devices + background on the "
                "rest, over every d whose foreground is within the tolerance of the plan's. "
                f"Every row: {paper[0]['basis']}."))
    for line in fair:  # the fair baseline first (fastest DP on <= G), then all G
      console.print(line, markup=False)
  if local:
    console.print(table("on this machine's devices", ["quantity", "value", "kind"],
                        [(k, _fmt(v), kind) for k, (v, kind) in local.items()], left=("kind",)))
  _print_rest(console, facts, paper, local, plots)


def _print_rest(console, facts: MainJobFacts, paper: list[dict[str, Any]], local: Measured,
                plots: dict[str, str]) -> None:
  for k, v in plots.items():
    console.print(f"{k}: {v}")
  print("\nIn plain words:")
  for line in story(facts, paper, local):
    print(f"- {line}")


def story(facts: MainJobFacts, paper: list[dict[str, Any]], local: Measured) -> list[str]:
  """What was predicted on A100s, what was measured here, and whether they agree."""
  out = [_paper_line(facts, r) for r in paper]
  v = {k: val for k, (val, _) in local.items()}
  if v.get("planned_is_data_parallel"):
    out.append(
        f"At amplification limit {limit_label(facts.amplification_limit)} the planner's plan "
        f"here is data parallelism on all {v['devices']} devices: no device idles, so a "
        "background job has nowhere to run. The main job runs the fastest plan with an idle "
        f"device instead (limit {limit_label(v['plan_amplification_limit'])}; "
        "planner.plan_with_idle_device): "
        + (f"predicted {v['burst_predicted_ms']:.1f} ms per step against data parallelism's "
           f"{v['data_parallel_predicted_ms']:.1f} ms. " if "burst_predicted_ms" in v else "")
        + "Its numbers below are that plan's.")
  elif v.get("devices_idle_in_some_layer") == 0:
    out.append(
        f"The planner's plan here is data parallelism: it uses all {v['devices']} devices in "
        "every layer (a layer stays on fewer devices only where more would raise its GPU time "
        f"beyond the amplification limit, {facts.amplification_limit}x), so no device idles.")
  if "burst_measured_ms" in v:
    out += _measured_lines(v)
  if "background_steps" in v:
    out += _background_lines(facts.background, v)
  return out


def _paper_line(facts: MainJobFacts, r: dict[str, Any]) -> str:
  where = f"On A100s ({r['cluster']}, G={r['G']}; {r['basis']})"
  what = f"{facts.paper_model} B={facts.paper_batch}"
  t = r["tolerance"]
  if r["plan_data_parallel_devices"] is not None:
    d = r["plan_data_parallel_devices"]
    return (f"{where}: the plan for {what} is data parallelism on {d} GPUs "
            f"({r['plan_ms']:.1f} ms per iteration)" + (
                "; no GPU idles, so no background job runs beside it." if d == r["G"] else
                f"; the background job runs alone on the other {r['G'] - d} GPUs: the cluster "
                f"does {_times(r['cluster_vs_dp_all'])} the work of data parallelism alone "
                "on all of them (simulated)."))
  if r["cluster_vs_matched"] is None:
    cluster = (f"{_times(r['cluster_vs_dp_all'])} the work of data parallelism alone on all "
               f"{r['G']} (no data parallelism on fewer GPUs is within the tolerance of the "
               "plan's speed, so there is no matched baseline)")
  else:
    cluster = (f"{r['cluster_vs_matched']:.2f}x the work of the matched data parallelism (on "
               f"{r['matched_dp_devices']} GPUs, the background job on the rest) and "
               f"{_times(r['cluster_vs_dp_all'])} that of data parallelism alone on all "
               f"{r['G']}")
  return (f"{where}: {what} takes {r['plan_ms']:.1f} ms per iteration as a burst plan, "
          f"{describe(r['speedup_vs_fastest_dp'], t)} against the fastest data parallelism "
          f"(on {r['fastest_dp_devices']} GPUs, {r['fastest_dp_ms']:.1f} ms), using "
          f"{_than(r['saved_vs_cheapest_dp'])} the cheapest data parallelism "
          f"within {t:.1%} of that speed (on {r['cheapest_dp_devices']} GPUs) and "
          f"{_than(r['saved_vs_dp_all'], '')} data parallelism on all {r['G']}; with a "
          f"background job in its idle GPUs the cluster does {cluster}, while its foreground "
          f"runs {_short(r['speedup_vs_fastest_dp'], t)} the fastest data parallelism's speed "
          "(simulated).")


def _than(saving: float, noun: str = "GPU time") -> str:
  """'1.07x more GPU time than' / '2.08x less than' / 'the same GPU time as'."""
  change = gpu_time_change(saving, noun)
  return f"{change} as" if change.startswith("the same") else f"{change} than"


def _short(ratio: float | None, tolerance: float) -> str:
  """'0.76x (behind)': a ratio and its verdict."""
  return "-" if ratio is None else f"{ratio:.2f}x ({verdict(ratio, tolerance)})"


def _measured_lines(v: dict[str, Any]) -> list[str]:
  ratios = {n: v[f"{n}_measured_over_predicted"] for n in ("burst", "data_parallel")}
  off = [n.replace("_", " ") for n, x in ratios.items() if not AGREE[0] <= x <= AGREE[1]]
  versus = describe(v["burst_vs_data_parallel_measured"], validated_tolerance("cpu"))
  rests = f" — {v['basis']}" if v.get("basis") else ""
  if v.get("devices_idle_in_some_layer") == 0:  # the plan is data parallelism on every device
    return [f"Here ({v['devices']} CPU devices, one per core; {v['model']}, "
            f"B={v['global_batch']}): the plan is data parallelism, predicted at "
            f"{v['data_parallel_predicted_ms']:.1f} ms per step and measured at "
            f"{v['data_parallel_measured_ms']:.1f} ms (measured / predicted "
            f"{ratios['data_parallel']:.2f}){rests}."]
  return [
      f"Here ({v['devices']} CPU devices, one per core; {v['model']}, B={v['global_batch']}): "
      f"the {_plan_name(v)} was predicted at {v['burst_predicted_ms']:.1f} ms per step and "
      f"measured at {v['burst_measured_ms']:.1f} ms (measured / predicted "
      f"{ratios['burst']:.2f}); data parallelism {v['data_parallel_predicted_ms']:.1f} ms "
      f"predicted, {v['data_parallel_measured_ms']:.1f} ms measured "
      f"({ratios['data_parallel']:.2f}). Measured, the {_plan_name(v)} against data "
      f"parallelism: {versus}{rests}.",
      "Prediction and measurement agree within "
      f"{AGREE[0]:.2f}-{AGREE[1]:.2f}x for both plans." if not off else
      f"Prediction and measurement disagree (outside {AGREE[0]:.2f}-{AGREE[1]:.2f}x) "
      f"for: {', '.join(off)}."]


def _background_lines(bg: BackgroundConfig, v: dict[str, Any]) -> list[str]:
  held = v.get("cap_held")
  verdict = ("the cap held" if held else "the cap did not hold" if held is False else
             "no slowdown measured")
  out = [
      f"The background job {bg.name} (batch {bg.batch_per_device} per device) beside the "
      f"{_plan_name(v)}, on one pinned process per core, under the slowdown cap {bg.cap:.0%}: "
      f"measured foreground slowdown {_pct(v.get('foreground_slowdown'))} against the cap plus "
      f"its noise ({_noise(v)}): {verdict}; simulated {_pct(v.get('simulated_slowdown'))} (the "
      "simulator's policy on the measured alone step and pieces; on the in-context profile "
      f"{_pct(v.get('simulated_on_profile_slowdown'))}); {v['background_steps']} background "
      f"steps ({_fmt(v.get('background_samples_per_s'))} samples/s measured, "
      f"{_fmt(v.get('simulated_background_samples_per_s'))} simulated), "
      f"{v['background_failures']} failures.", _load_line(v)]
  over = v.get("foreground_slowdown")
  if held and over is not None and over > bg.cap:
    out.append(
        f"The measured slowdown is above the {bg.cap:.0%} cap by less than its noise: the "
        "policy tightens only on an excess that the alone steps' own noise cannot explain (the "
        "same one-sided t test at 1%, dp_jax/multiplex/policy.py), so on short, noisy pinned "
        "steps the measured mean can pass the cap by that noise; `python -m dp_jax.train` on "
        "seconds-long steps holds it (docs/orchestrator.md).")
  if v.get("pinned_measured_step_ms") and v.get("burst_measured_ms"):
    out.append(
        f"On the pinned processes the plan's step alone took "
        f"{v['pinned_measured_step_ms']:.0f} ms (measured; {v['burst_measured_ms']:.0f} ms in "
        f"one process): {pinned_causes(v)}. The measured Gantt chart shows where; the "
        "slowdown above is against that step, not the one predicted.")
  return out


def _load_line(v: dict[str, Any]) -> str:
  """How the slowdown was measured, and the machine's load while it was."""
  how = (f"{v.get('with_steps_measured')} steps with the job against "
         f"{v.get('alone_steps_measured')} alone, in alternating windows of "
         f"{v['window_steps']} steps (a change in other processes' load cancels)"
         if v.get("window_steps") else
         f"{v.get('with_steps_measured')} steps with the job after "
         f"{v.get('alone_steps_measured')} alone")
  load, cores = v.get("host_load"), v.get("host_cores")
  if load is None or not cores:
    return f"Measured on {how}."
  busy = (f": other processes shared the {cores} cores" if load > cores + 0.5 else
          f" on {cores} cores")
  return f"Measured on {how}; host load {load:.1f} (1-minute average){busy}."


def _plan_name(v: dict[str, Any]) -> str:
  return ("fastest plan with an idle device" if v.get("planned_is_data_parallel") else
          "burst plan")


def _noise(v: dict[str, Any]) -> str:
  noise = v.get("foreground_slowdown_noise")
  return ("noise unknown: fewer than 2 alone steps" if noise is None else
          f"{noise:.1%}, the slowdown the alone steps' own "
          "scatter reaches once in 100")


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


def _times(v: float | None) -> str:
  """A ratio as the apps print one: 1.38x ('-' when missing)."""
  return "-" if v is None else f"{v:.2f}x"


def _fmt(v: Any, suffix: str = "") -> str:
  if v is None:
    return "-"
  return f"{v:.4g}{suffix}" if isinstance(v, float) else f"{v}{suffix}"
