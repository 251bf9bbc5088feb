"""A plan presented: its per-layer table, its per-device memory, the predicted fair comparison
(the best uniform strategy first where the planner may choose more than the samples split,
dp_jax/planner/uniform.py; then the fastest data parallelism on <= G devices, then data
parallelism on all G), the devices-per-layer chart (no JAX; rich and matplotlib imported when
used)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from dp_jax.planner import memory
from dp_jax.planner.baseline import (
  cheapest_within,
  cost_model_for,
  data_parallel_evaluations,
  data_parallel_misfit,
  fastest_data_parallel,
)
from dp_jax.planner.evaluate import data_parallel_assignment
from dp_jax.planner.uniform import STATE_NAMES, best_uniform
from dp_jax.report.compare import (
  compare,
  data_parallel_on_all,
  describe,
  devices,
  fields,
  gpu_time_change,
  none_fields,
  ties_note,
)
from dp_jax.report.tables import table

COLUMNS = ["layer", "kind", "devices", "first device", "per-device batch", "compute ms",
           "sync ms", "move-in ms", "amplification", "stage", "split"]


def plan_summary(plan, fair: dict[str, Any], path: Path) -> dict[str, Any]:
  """The plan app's summary (status.json, W&B, a sweep's cells): the plan, its predictions and
  the fair comparison (comparisons())."""
  p = plan.predicted
  optimality = plan.extra.get("optimality", {})
  return {"model": plan.model, "num_devices": plan.num_devices, "global_batch": plan.global_batch,
          "cluster": plan.cluster, "amplification_limit": plan.amplification_limit,
          "iteration_ms": p["iteration_ms"], "gpu_ms": p["gpu_ms"],
          "data_parallel_iteration_ms": p["data_parallel_iteration_ms"],
          "data_parallel_gpu_ms": p["data_parallel_gpu_ms"],
          **{k: v for k, v in fair.items() if k != "uniform"},
          "fair_comparison": fair_comparison(plan, fair),
          "uniform_comparison": uniform_comparison(plan, fair),
          "gpu_time_saving": (1 - p["gpu_ms"] / p["data_parallel_gpu_ms"]
                              if fair.get("data_parallel_fits", True) else None),
          "weight_sharded_layers": sum(lp.sharding.split != "samples" for lp in plan.layers),
          "memory_peak_gb": p.get("memory_peak_gb"),
          "lower_bound_ms": optimality.get("lower_bound_ms"),
          "optimality_gap": optimality.get("gap"),
          "planner_seconds": plan.planner_seconds, "plan": str(path)}


def layer_rows(plan) -> list[list[Any]]:
  """One row per layer of the plan."""
  rows = []
  for lp in plan.layers:
    x = dict(lp.extra)
    rows.append([lp.name, x.get("kind", ""), len(lp.devices), lp.devices[0],
                 x.get("per_device_batch", ""), _r(x.get("compute_ms")), _r(x.get("sync_ms")),
                 _r(x.get("move_in_ms")), _r(x.get("amplification")), x.get("stage", ""),
                 _split(lp.sharding, lp.recompute)])
  return rows


def _split(sharding, recompute: bool = False) -> str:
  """'samples', or a weight split with its mesh: 'out 2x4' (d x m); then the state sharded
  over the data axis (ZeRO-1, FSDP) and 'recompute' where the layer recomputes."""
  d, m = sharding.mesh
  text = "samples" if sharding.split == "samples" else f"{sharding.split} {d}x{m}"
  if sharding.state != "replicated":
    text += f" {STATE_NAMES[sharding.state]}"
  return f"{text} recompute" if recompute else text


def _r(v: Any) -> Any:
  return round(v, 4) if isinstance(v, float) and math.isfinite(v) else v


def comparisons(graph, profile, cluster, plan, tolerance: float,
                uniform: bool | None = None) -> dict[str, Any]:
  """Predicted: the burst plan against the best uniform strategy (uniform_fields; `uniform`:
  whether to search it, by default where the plan's options let a layer take more than the
  samples split: otherwise it is the fastest data parallelism), against the fastest data
  parallelism on d <= G devices and against data parallelism on all G, each with its margin
  and verdict; its GPU time against the cheapest data parallelism within the tolerance of the
  fastest one's time; whether the plan is itself data parallelism, and what the verdicts rest
  on. Only data parallelism that fits in the devices' memory is a baseline: where none fits the
  comparisons are missing and `data_parallel_note` says what it would need."""
  p = plan.predicted
  model = cost_model_for(graph, profile, cluster, plan)
  if uniform is None:
    uniform = model.options.chooses_strategies
  best = uniform_fields(model, plan, tolerance) if uniform else {}
  dp = data_parallel_evaluations(model)
  d, ms = fastest_data_parallel({c: e.iteration_ms for c, e in dp.items()})
  cheap_d, cheap = cheapest_within(model, dp, tolerance)
  on_all = int(p.get("data_parallel_devices") or plan.num_devices)
  note = ties_note(cluster.device, plan.global_batch / plan.num_devices, tolerance)
  return {"comparison_tolerance": tolerance, "basis": f"{plan.basis()}; {note}", **best,
          "plan_data_parallel_devices": plan.data_parallel_devices,
          "data_parallel_fits": on_all in dp,
          "data_parallel_note": None if dp else data_parallel_misfit(model),
          "best_data_parallel_devices": d, "best_data_parallel_iteration_ms": ms,
          "cheapest_data_parallel_devices": cheap_d,
          "cheapest_data_parallel_iteration_ms": None if cheap is None else cheap.iteration_ms,
          "cheapest_data_parallel_gpu_ms": None if cheap is None else cheap.gpu_ms,
          "gpu_time_saving_vs_cheapest_data_parallel":
              None if cheap is None else 1 - p["gpu_ms"] / cheap.gpu_ms,
          **dominating_data_parallel(model, dp, p["iteration_ms"], p["gpu_ms"], tolerance),
          **(none_fields("speedup_vs_best_data_parallel") if ms is None else fields(
              "speedup_vs_best_data_parallel",
              compare(p["iteration_ms"], ms, tolerance, lower_is_better=True))),
          **(fields("speedup", compare(p["iteration_ms"], p["data_parallel_iteration_ms"],
                                       tolerance, lower_is_better=True))
             if on_all in dp else none_fields("speedup"))}


def uniform_fields(model, plan, tolerance: float) -> dict[str, Any]:
  """The best uniform strategy (planner.uniform.best_uniform) against the plan: its record
  (`uniform`, what the plan JSON keeps in extra), its setting, time, GPU time and per-device
  peak, the plan's speed-up over it (margin, verdict) and the GPU time saved; the reason where
  no uniform strategy fits."""
  p = plan.predicted
  u = best_uniform(model)
  record = u.to_json()
  if u.setting is None:
    return {"uniform": record, "uniform_setting": None, "uniform_iteration_ms": None,
            "uniform_gpu_ms": None, "uniform_memory_peak_gb": None,
            "uniform_note": u.reason, "gpu_time_saving_vs_uniform": None,
            **none_fields("speedup_vs_uniform")}
  ev = u.evaluation
  return {"uniform": record, "uniform_setting": u.setting.describe(),
          "uniform_iteration_ms": ev.iteration_ms, "uniform_gpu_ms": ev.gpu_ms,
          "uniform_memory_peak_gb": record["memory_peak_gb"], "uniform_note": None,
          "gpu_time_saving_vs_uniform": 1 - p["gpu_ms"] / ev.gpu_ms,
          **fields("speedup_vs_uniform", compare(p["iteration_ms"], ev.iteration_ms, tolerance,
                                                 lower_is_better=True))}


def uniform_comparison(plan, c: dict[str, Any]) -> str | None:
  """The plan against the best uniform strategy in words (None where it was not searched):
  time, GPU time and per-device peak of both, the ratio and its verdict under the tolerance the
  basis names; or why no uniform strategy fits."""
  if "uniform" not in c:
    return None
  p, t = plan.predicted, c["comparison_tolerance"]
  d = plan.data_parallel_devices
  what = "burst" if d is None else f"the plan (every layer on the same {devices(d)})"
  head = f"predicted: {what} {p['iteration_ms']:.3f} ms/iter"
  if c["uniform_setting"] is None:
    return f"{head}; {c['uniform_note']}, so there is no uniform baseline — {c['basis']}"
  peak = p.get("memory_peak_gb")
  mine = "" if peak is None else f", peak {peak:.2f} GB per device"
  return (f"{head} ({p['gpu_ms']:.0f} GPU-ms{mine}) vs the best uniform strategy "
          f"({c['uniform_setting']}: {c['uniform_iteration_ms']:.3f} ms/iter, "
          f"{c['uniform_gpu_ms']:.0f} GPU-ms, peak {c['uniform_memory_peak_gb']:.2f} GB per "
          f"device): {describe(c['speedup_vs_uniform'], t)}; "
          f"{gpu_time_change(c['gpu_time_saving_vs_uniform'])} — {c['basis']}")


MEMORY_RANGES = 8  # device ranges the memory line shows at most


def device_ranges(values, most: int = MEMORY_RANGES) -> list[tuple[int, int, float, float]]:
  """(first device, last device, least GB, most GB) of runs of consecutive devices: devices
  with the same peak (to 0.01 GB) together, or, where that gives more than `most` runs, `most`
  equal runs of devices with their least and most."""
  vals = [round(float(v), 2) for v in values]
  runs: list[list[int]] = []
  for i, v in enumerate(vals):
    if runs and vals[runs[-1][0]] == v:
      runs[-1][1] = i
    else:
      runs.append([i, i])
  if len(runs) > most:
    n = len(vals)
    cuts = [round(k * n / most) for k in range(most + 1)]
    runs = [[a, b - 1] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
  return [(a, b, min(vals[a:b + 1]), max(vals[a:b + 1])) for a, b in runs]


def experts_line(plan) -> str | None:
  """The mixture-of-experts layers' routing as planned: capacity factor, capacity, top-k (a
  token past an expert's capacity is dropped: the runtime counts them); None without them."""
  rec = plan.extra.get("experts")
  if not rec:
    return None
  def one(r: dict[str, Any]) -> str:
    parts = [f"capacity factor {r['capacity_factor']:g}" if r.get("capacity_factor") is not None
             else "capacity factor not recorded"]
    if r.get("capacity") is not None:
      parts.append(f"{r['capacity']} tokens per expert per sequence"
                   + (f" of {r['seq_len']}" if r.get("seq_len") else ""))
    if r.get("top_k") is not None:
      parts.append(f"top-{r['top_k']}" + (f" of {r['n_expert']}" if r.get("n_expert") else ""))
    return ", ".join(parts)

  kinds = list(dict.fromkeys(one(r) for r in rec.values()))
  return "experts (model config): " + "; ".join(kinds) + f" in {len(rec)} layers"


def memory_line(plan, c: dict[str, Any] | None = None) -> str | None:
  """The plan's predicted per-device peak memory (its largest, and by device range), and the
  best uniform strategy's beside it; None for a plan without per-device memory."""
  per = plan.extra.get("memory_gb_per_device")
  if not per:
    return None
  p = plan.predicted
  cap = p.get("memory_capacity_gb")
  top = max(range(len(per)), key=lambda i: per[i])
  parts = []
  for a, b, low, high in device_ranges(per):
    where = f"device {a}" if a == b else f"devices {a}-{b}"
    parts.append(f"{where}: {low:.2f} GB" if low == high else
                 f"{where}: {low:.2f}-{high:.2f} GB")
  text = (f"memory per device (predicted): the plan's peak {per[top]:.2f} GB"
          f"{'' if cap is None else f' of {cap:g} GB'} (device {top}); {'; '.join(parts)}")
  if c and c.get("uniform_setting"):
    u = c["uniform"]
    text += (f" | best uniform: {c['uniform_memory_peak_gb']:.2f} GB on each of its "
             f"{u['devices']} devices")
  return text


def dominating_data_parallel(model, data_parallel: dict[int, Any], iteration_ms: float,
                             gpu_ms: float, tolerance: float) -> dict[str, Any]:
  """Data parallelism on the d <= G devices that is faster than the plan and uses less GPU
  time, both beyond the tolerance, and fits in memory (the fastest such d), or None: a plan the
  amplification limit forced off data parallelism can lose on both (the limit is per layer).
  data_parallel: d -> its evaluation (planner.baseline.data_parallel_evaluations)."""
  best = None
  for c, e in sorted(data_parallel.items()):
    if (e.iteration_ms * (1 + tolerance) < iteration_ms and e.gpu_ms * (1 + tolerance) < gpu_ms
        and (best is None or e.iteration_ms < best[1])
        and memory.fits(model, data_parallel_assignment(model, c))):
      best = (c, float(e.iteration_ms), float(e.gpu_ms))
  keys = ("dominated_by_data_parallel_devices", "dominated_by_data_parallel_iteration_ms",
          "dominated_by_data_parallel_gpu_ms")
  return dict(zip(keys, best or (None, None, None), strict=True))


def dominated_note(plan, c: dict[str, Any]) -> str | None:
  """One line when data parallelism on d <= G beats the plan in time and in GPU time."""
  d = c.get("dominated_by_data_parallel_devices")
  if d is None:
    return None
  return (f"note: data parallelism on {devices(d)} is faster "
          f"({c['dominated_by_data_parallel_iteration_ms']:.3f} ms) and uses less GPU time "
          f"({c['dominated_by_data_parallel_gpu_ms']:.3f} vs {plan.predicted['gpu_ms']:.3f} "
          f"GPU-ms) than this plan (predicted); the amplification limit "
          f"({plan.amplification_limit}) is per layer and some layer exceeds it there; raise "
          f"planner.amplification_limit or run data parallelism on those devices — "
          f"{plan.basis()}")


def fair_comparison(plan, c: dict[str, Any]) -> str:
  """The predicted comparisons in words (fastest data parallelism on <= G first), or that the
  plan is data parallelism, or that no data parallelism fits; what they rest on last."""
  p, g, t = plan.predicted, plan.num_devices, c["comparison_tolerance"]
  all_g = data_parallel_on_all(g, int(p.get("data_parallel_devices") or g), plan.global_batch)
  d, best = c.get("plan_data_parallel_devices"), c["best_data_parallel_devices"]
  if best is None:
    return (f"predicted: burst {p['iteration_ms']:.3f} ms/iter; {c['data_parallel_note']}, so "
            f"there is no data-parallel baseline — {c['basis']}")
  vs_all = (f"vs {all_g} ({p['data_parallel_iteration_ms']:.3f} ms): "
            f"{describe(c['speedup'], t)}" if c.get("data_parallel_fits", True) else
            f"{all_g} does not fit in memory")
  if d is not None:
    text = (f"predicted: the plan is data parallelism on {devices(d)} "
            f"({p['iteration_ms']:.3f} ms/iter)")
    if d != best:
      text += (f"; data parallelism on {devices(best)}, the fastest on <= {g}, takes "
               f"{c['best_data_parallel_iteration_ms']:.3f} ms: the plan against it "
               f"{describe(c['speedup_vs_best_data_parallel'], t)}")
    if d != int(p.get("data_parallel_devices") or g):
      text += (f"; {all_g}: {p['data_parallel_iteration_ms']:.3f} ms"
               if c.get("data_parallel_fits", True) else f"; {vs_all}")
    return f"{text} — {c['basis']}"
  return (f"predicted: burst {p['iteration_ms']:.3f} ms/iter vs fastest data parallelism on "
          f"<= {g} devices ({best} devices, {c['best_data_parallel_iteration_ms']:.3f} ms): "
          f"{describe(c['speedup_vs_best_data_parallel'], t)}; {vs_all} — {c['basis']}")


def gpu_time_line(plan, c: dict[str, Any]) -> str:
  """Predicted GPU time against data parallelism on all G and against the cheapest data
  parallelism within the tolerance of the fastest one's time (the fair baseline)."""
  p, g, t = plan.predicted, plan.num_devices, c["comparison_tolerance"]
  all_g = data_parallel_on_all(g, int(p.get("data_parallel_devices") or g), plan.global_batch)
  d, own = c["cheapest_data_parallel_devices"], c.get("plan_data_parallel_devices")
  head = f"predicted GPU time: {p['gpu_ms']:.3f} GPU-ms per iteration"
  if d is None:
    return f"{head} (no data parallelism fits to compare with) — {c['basis']}"
  cheapest = (f"the cheapest data parallelism within {t:.1%} of the fastest one's time (on {d} "
              f"devices, {c['cheapest_data_parallel_gpu_ms']:.3f} GPU-ms)")
  if own is not None:  # the plan is data parallelism: its GPU time is data parallelism's
    tail = ("" if own == d else f"; {cheapest}: the plan uses "
            f"{gpu_time_change(c['gpu_time_saving_vs_cheapest_data_parallel'])}")
    return f"{head} (the plan is data parallelism on {own}){tail} — {c['basis']}"
  vs_all = (f"vs {all_g} ({p['data_parallel_gpu_ms']:.3f} GPU-ms): "
            f"{gpu_time_change(1 - p['gpu_ms'] / p['data_parallel_gpu_ms'])}"
            if c.get("data_parallel_fits", True) else f"{all_g} does not fit")
  return (f"{head}; vs {cheapest}: "
          f"{gpu_time_change(c['gpu_time_saving_vs_cheapest_data_parallel'])}; {vs_all} — "
          f"{c['basis']}")


def print_plan(plan, rows: list[list[Any]], fair: dict[str, Any] | None = None) -> None:
  """The per-layer table, then the predicted comparisons (`fair`: from comparisons(); without
  it only data parallelism on all G is known, and the line says so)."""
  from rich.console import Console  # rich: only to print (its import is not free)

  p = plan.predicted
  console = Console(width=140)
  console.print(table(f"{plan.model}: B={plan.global_batch} on {plan.num_devices} devices "
                      f"({plan.cluster}), amplification limit {plan.amplification_limit} "
                      "(predicted)", COLUMNS, rows, left=("kind",)))
  mem = memory_line(plan, fair)
  if mem:
    console.print(mem)
  moe = experts_line(plan)
  if moe:
    console.print(moe)
  if fair is None:
    all_g = data_parallel_on_all(plan.num_devices, int(p.get("data_parallel_devices")
                                                       or plan.num_devices), plan.global_batch)
    console.print(f"predicted: burst {p['iteration_ms']:.3f} ms/iter; {all_g}: "
                  f"{p['data_parallel_iteration_ms']:.3f} ms/iter (the fastest data "
                  f"parallelism on fewer devices was not computed) — {plan.basis()}")
  else:
    uniform = uniform_comparison(plan, fair)
    if uniform:  # the fair baseline first: one recipe for every layer, searched
      console.print(uniform)
    console.print(fair_comparison(plan, fair))
    console.print(gpu_time_line(plan, fair))
    note = dominated_note(plan, fair)
    if note:
      console.print(note)
  searched = (fair or {}).get("uniform")
  console.print(f"planned in {plan.planner_seconds:.3f} s" + (
      "" if not searched else f"; best uniform strategy searched in {searched['seconds']:.3f} s "
      f"({searched['settings_priced']} settings, {searched['settings_fit']} fit)"))


def chart_title(plan, fair: dict[str, Any] | None = None) -> str:
  """Predicted; model, B, G, cluster and what the verdicts rest on (plan.basis), then the plan
  against the fastest data parallelism on <= G (when `fair` is given) and on all G, or that the
  plan is data parallelism."""
  p, g = plan.predicted, plan.num_devices
  head = (f"predicted: {plan.model}, B={plan.global_batch}, G={g} ({plan.cluster}); "
          f"{plan.basis()}\n")
  d = plan.data_parallel_devices
  if d is not None:
    return head + (f"the plan is data parallelism on {devices(d)}: "
                   f"{p['iteration_ms']:.2f} ms/iteration")
  all_g = data_parallel_on_all(g, int(p.get("data_parallel_devices") or g), plan.global_batch)
  return (head + f"burst {p['iteration_ms']:.2f} ms/iteration" + (
      "" if fair is None or fair.get("best_data_parallel_devices") is None else
      f"; fastest DP on <= {g} ({fair['best_data_parallel_devices']} devices) "
      f"{fair['best_data_parallel_iteration_ms']:.2f} ms: "
      f"{describe(fair['speedup_vs_best_data_parallel'], fair['comparison_tolerance'])}")
      + f"; {all_g}: {p['data_parallel_iteration_ms']:.2f} ms")


CHART_WIDTH_IN = 6.5  # a paper's text width: the chart prints at its saved size
CHART_DPI = 150
CHART_FONT = 8  # pt at the saved size: ticks and the G mark; labels and the title 9


def devices_per_layer_figure(plan, fair: dict[str, Any] | None = None):
  """The devices-per-layer chart as a matplotlib Figure (not saved): one step per layer in
  topological order, integer device ticks, G dashed, a few layer-index ticks (the names are in
  the per-layer table), the title wrapped to the width. Its layout is fixed in inches, so the
  saved file is exactly CHART_WIDTH_IN wide and no text is laid out twice."""
  # matplotlib: only to draw (chart=false plans without it); a Figure without pyplot
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator

  counts = [len(lp.devices) for lp in plan.layers]
  n, g = len(counts), plan.num_devices
  chars = int(CHART_WIDTH_IN * 72 / (0.6 * 9))  # a glyph is about 0.55 em wide on average
  title = "\n".join(textwrap.fill(line, chars) for line in chart_title(plan, fair).split("\n"))
  top, plot, bottom, left, right = 0.12 + 0.165 * (title.count("\n") + 1), 1.9, 0.5, 0.6, 0.2
  height = top + plot + bottom
  fig = Figure(figsize=(CHART_WIDTH_IN, height), dpi=CHART_DPI)
  ax = fig.add_axes((left / CHART_WIDTH_IN, bottom / height,
                     (CHART_WIDTH_IN - left - right) / CHART_WIDTH_IN, plot / height))
  ax.stairs(counts, [i - 0.5 for i in range(n + 1)], fill=True, color="tab:blue", lw=0)
  ax.axhline(g, color="tab:red", lw=1, ls="--")
  ax.annotate(f"G = {g}", (n - 0.5, g), xytext=(0, 2), textcoords="offset points",
              color="tab:red", fontsize=CHART_FONT, ha="right", va="bottom")
  ax.set_xlim(-0.5, n - 0.5)
  ax.set_ylim(0, g * 1.18 + 0.2)
  for axis, bins in ((ax.xaxis, 10), (ax.yaxis, 6)):
    axis.set_major_locator(MaxNLocator(nbins=bins, integer=True, min_n_ticks=2))
  ax.tick_params(labelsize=CHART_FONT)
  ax.set_xlabel("layer index, topological order (names: the per-layer table)", fontsize=9)
  ax.set_ylabel("devices of the layer", fontsize=9)
  fig.suptitle(title, fontsize=9, y=1 - 0.06 / height, va="top")
  return fig


def plot_devices_per_layer(plan, path: Path, fair: dict[str, Any] | None = None, *,
                           pdf: bool = True) -> Path:
  """The devices-per-layer chart (devices_per_layer_figure) as PNG, and as PDF beside it when
  `pdf` (matplotlib's PDF backend costs about as much start-up as the rest of the chart)."""
  fig = devices_per_layer_figure(plan, fair)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path)
  if pdf:
    fig.savefig(path.with_suffix(".pdf"), metadata={"CreationDate": None})
  return path
