"""The simulator's numbers, defined once (docs/simulator.md, "Metrics")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dp_jax.planner import memory
from dp_jax.planner.baseline import (
  cheapest_within,
  data_parallel_evaluations,
  data_parallel_misfit,
  fastest_data_parallel,
)
from dp_jax.planner.memory import GB
from dp_jax.report.compare import (
  VALIDATED_TOLERANCE,
  compare,
  data_parallel_on_all,
  describe,
  devices,
  fields,
  none_fields,
  ties_note,
)
from dp_jax.simulator.engine import Simulation
from dp_jax.simulator.windows import busy_ms


def gpu_ms(sim: Simulation) -> float:
  """Device-ms per iteration with foreground work on either stream (union over streams)."""
  return float((busy_ms(sim.timeline, sim.classes) * sim.classes.sizes).sum())


def metrics(sim: Simulation, tolerance: float = VALIDATED_TOLERANCE) -> dict[str, Any]:
  """Foreground alone and with background, background, cluster throughput vs data parallelism;
  every comparison with its margin and verdict (dp_jax/report/compare.py: within +-tolerance a
  tie)."""
  g, b = sim.plan.num_devices, sim.plan.global_batch
  alone = sim.timeline.iteration_ms
  busy = gpu_ms(sim)
  dp_count, dp = sim.data_parallel
  dp_sps = b / dp.iteration_ms * 1e3
  dp_fits = dp_count in sim.data_parallel_ms  # a baseline only where it fits in memory
  best_d, best_ms = fastest_data_parallel(sim.data_parallel_ms)
  cheap_d, cheap = cheapest_within(sim.model, data_parallel_evaluations(sim.model), tolerance)
  out: dict[str, Any] = {
      "model": sim.plan.model, "num_devices": g, "global_batch": b,
      "cluster": sim.plan.cluster,
      "basis": f"{sim.plan.basis()}; " + ties_note(sim.model.cluster.device, b / g, tolerance),
      "plan_data_parallel_devices": sim.plan.data_parallel_devices,
      "planner_iteration_ms": sim.evaluation.iteration_ms,
      "planner_gpu_ms": sim.evaluation.gpu_ms,
      "alone_iteration_ms": alone,
      "timeline_vs_planner": alone / sim.evaluation.iteration_ms - 1.0,
      "gpu_ms": busy,
      "alone_idle_fraction": 1.0 - busy / (g * alone),
      "alone_samples_per_s": b / alone * 1e3,
      "data_parallel_devices": dp_count,
      "data_parallel_fits": dp_fits,
      "data_parallel_note": None if sim.data_parallel_ms else data_parallel_misfit(sim.model),
      "data_parallel_iteration_ms": dp.iteration_ms,
      "data_parallel_samples_per_s": dp_sps,
      "best_data_parallel_devices": best_d, "best_data_parallel_iteration_ms": best_ms,
      "cheapest_data_parallel_devices": cheap_d,
      "cheapest_data_parallel_gpu_ms": None if cheap is None else cheap.gpu_ms,
      # GPU time saved, both sides priced by the planner's evaluation (gpu_ms above is the
      # timeline's union over streams, which data parallelism's evaluations do not have)
      "gpu_time_saving_vs_cheapest_data_parallel":
          None if cheap is None else 1 - sim.evaluation.gpu_ms / cheap.gpu_ms,
      "gpu_time_saving_vs_data_parallel":
          1 - sim.evaluation.gpu_ms / dp.gpu_ms if dp_fits else None,
      "comparison_tolerance": tolerance,
      **(fields("speedup_vs_data_parallel_alone",
                compare(alone, dp.iteration_ms, tolerance, lower_is_better=True))
         if dp_fits else none_fields("speedup_vs_data_parallel_alone")),
      **(fields("speedup_vs_best_data_parallel_alone",
                compare(alone, best_ms, tolerance, lower_is_better=True))
         if best_ms is not None else none_fields("speedup_vs_best_data_parallel_alone")),
      "foreground_memory_peak_gb": float(np.max(sim.foreground_bytes)) / GB,
      "planner_chooses_strategies": sim.model.options.chooses_strategies,
      **best_uniform_fields(sim, alone, tolerance),
  }
  f, job = sim.fill, sim.job
  weight = 1.0
  if f is None or job is None:
    iteration, bg_sps, idle = alone, 0.0, out["alone_idle_fraction"]
    out.update(background="none", slowdown_cap=None, max_slowdown=0.0)
  else:
    total = float(f.iteration_ms.sum())
    iteration = total / len(f.iteration_ms)
    bg_sps = float(f.bg_steps.sum()) * job.batch / total * 1e3
    idle = 1.0 - (busy * len(f.iteration_ms) + float(f.bg_work_ms.sum())) / (g * total)
    free_sps = float(f.bg_free_ms.sum()) / job.step_ms * job.batch / total * 1e3
    weight = background_weight(sim)
    out.update(background=job.model, background_batch=job.batch, background_weight=weight,
               background_devices_without_room=sim.background_devices_without_room,
               background_samples_per_s_on_free_devices=free_sps,
               background_samples_per_s_in_windows=bg_sps - free_sps,
               background_step_ms=job.step_ms, background_pieces=len(job.pieces_ms),
               background_memory_gb=job.memory_bytes / GB, slowdown_cap=f.cap,
               max_slowdown=float(f.slowdown.max()),
               windows_admitted=int(f.admitted.sum()), windows=len(f.admitted),
               simulated_iterations=len(f.iteration_ms))
    out.update(best_data_parallel_plus_background(sim))
  fg_sps = b / iteration * 1e3
  if f is not None and job is not None:
    per_device = background_per_device(sim)
    frontier = cluster_frontier(sim.data_parallel_ms, g, b, per_device)
    out["data_parallel_frontier"] = frontier
    out.update(matched(frontier, iteration, fg_sps + weight * bg_sps, tolerance,
                       "data_parallel"))
    uniform = cluster_frontier({d: u.evaluation.iteration_ms for d, u in sim.uniform.items()},
                               g, b, per_device,
                               {d: u.setting.describe() for d, u in sim.uniform.items()})
    out["uniform_frontier"] = uniform
    out.update(matched(uniform, iteration, fg_sps + weight * bg_sps, tolerance, "uniform"))
  cluster = fg_sps + weight * bg_sps
  out.update(iteration_ms=iteration, idle_fraction=idle, samples_per_s=fg_sps,
             background_samples_per_s=bg_sps, cluster_samples_per_s=cluster)
  out.update(**(fields("speedup_vs_data_parallel",
                       compare(iteration, dp.iteration_ms, tolerance, lower_is_better=True))
                if dp_fits else none_fields("speedup_vs_data_parallel")),
             **(fields("cluster_throughput_vs_data_parallel",
                       compare(cluster, dp_sps, tolerance, lower_is_better=False))
                if dp_fits else none_fields("cluster_throughput_vs_data_parallel")))
  if out.get("best_data_parallel_cluster_samples_per_s") is not None:
    out.update(fields("cluster_throughput_vs_best_data_parallel", compare(
        cluster, out["best_data_parallel_cluster_samples_per_s"], tolerance,
        lower_is_better=False)))
  out["fair_comparison"] = fair_comparison(out)
  return out


def fair_comparison(m: dict[str, Any]) -> str:
  """The simulated verdicts in words, one sentence: the foreground against the fastest data
  parallelism on <= G devices (or that the plan is data parallelism) with the cluster
  throughput against the matched baseline and against data parallelism alone on all G; then
  what they rest on. Where the planner's options reach beyond the samples split
  (planner_chooses_strategies) the best uniform strategy and the matched uniform strategy +
  background come first: they are the fair comparison then; data parallelism follows."""
  t, g = m["comparison_tolerance"], m["num_devices"]
  all_g = data_parallel_on_all(g, m["data_parallel_devices"], m["global_batch"])
  d = m.get("plan_data_parallel_devices")
  first = bool(m.get("planner_chooses_strategies"))
  no_dp = m.get("best_data_parallel_devices") is None
  if no_dp and not first:
    return (f"simulated: {m['data_parallel_note']}, so there is no data-parallel baseline — "
            f"{m['basis']}")
  parts = [_uniform_foreground(m, t, d)] if first else []
  if no_dp:
    parts.append(f"{m['data_parallel_note']}, so there is no data-parallel baseline")
  elif d is not None:
    fastest = (f"{describe(m['speedup_vs_best_data_parallel_alone'], t)} against the fastest, "
               f"on {m['best_data_parallel_devices']}")
    if not first:
      parts.append(f"the plan is data parallelism on {devices(d)} "
                   f"({m['alone_iteration_ms']:.3f} ms)"
                   + ("" if d == m["best_data_parallel_devices"] else f", {fastest}"))
    elif d != m["best_data_parallel_devices"]:
      parts.append(f"{describe(m['speedup_vs_best_data_parallel_alone'], t)} against the "
                   f"fastest data parallelism, on {m['best_data_parallel_devices']}")
  else:
    vs_all = (f"{describe(m['speedup_vs_data_parallel_alone'], t)} against {all_g}"
              if m.get("data_parallel_fits", True) else f"{all_g} does not fit in memory")
    parts.append(("" if first else "the burst foreground is ")
                 + f"{describe(m['speedup_vs_best_data_parallel_alone'], t)} against the "
                 f"fastest data parallelism on <= {g} (DP on "
                 f"{m['best_data_parallel_devices']}) and {vs_all}")
  fg = "; ".join(parts)
  if m.get("background", "none") == "none":
    return f"simulated: {fg} — {m['basis']}"
  cluster = [_matched_uniform(m, t, g)] if first else []
  if not no_dp:
    alone = (f"{describe(m['cluster_throughput_vs_data_parallel'], t)} against {all_g} "
             "alone" if m.get("data_parallel_fits", True) else f"{all_g} does not fit")
    if m.get("matched_data_parallel_devices") is None:
      cluster.append(f"{alone} (no data parallelism on <= {g} devices is within {t:.1%} of "
                     "the foreground, so there is no matched baseline)")
    else:
      cluster.append(f"{describe(m['cluster_throughput_vs_matched_data_parallel'], t)} against "
                     f"the matched DP on {m['matched_data_parallel_devices']} + background and "
                     f"{alone}")
  where = ""
  if m.get("background_devices_without_room"):
    where = (f" (on {g - m['background_devices_without_room']} of {g} devices: the others have "
             "no room beside the foreground)")
  unit = ""
  if m.get("background_weight", 1.0) != 1.0:
    unit = (f", a background sample counted as {m['background_weight']:.3g} foreground samples "
            "(its FLOPs)")
  return (f"simulated: {fg}, while with background {m['background']}{where} the cluster "
          f"throughput{unit} is {', '.join(cluster)} — {m['basis']}")


def _uniform_foreground(m: dict[str, Any], t: float, d: int | None) -> str:
  """The foreground against the best uniform strategy, in words (fair_comparison)."""
  if m.get("uniform_setting") is None:
    return f"{m['uniform_note']}, so there is no uniform baseline"
  who = ("the burst foreground is" if d is None else
         f"the plan is data parallelism on {devices(d)} ({m['alone_iteration_ms']:.3f} ms),")
  return (f"{who} {describe(m['speedup_vs_uniform_alone'], t)} against the best uniform "
          f"strategy ({m['uniform_setting']})")


def _matched_uniform(m: dict[str, Any], t: float, g: int) -> str:
  """The cluster throughput against the matched uniform strategy + background, in words."""
  if m.get("matched_uniform_devices") is None:
    return (f"not matched by a uniform strategy (none on <= {g} devices is within {t:.1%} of "
            "the foreground)")
  return (f"{describe(m['cluster_throughput_vs_matched_uniform'], t)} against the matched "
          f"uniform strategy ({m['matched_uniform_setting']}) + background")


# The baselines a frontier can hold: label -> what it is called
BASELINES = {"data_parallel": "data parallelism", "uniform": "uniform strategy"}


def cluster_frontier(iteration_ms: Mapping[int, float], g: int, b: int,
                     background_per_device_sps: float,
                     settings: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
  """A baseline on d <= G devices (d -> its iteration time) with the background job alone on
  the other G - d: per d, its iteration time, the cluster's samples/s and, where `settings`
  names it, its setting (the whole trade-off curve)."""
  return [{"devices": int(d), "iteration_ms": float(ms),
           "cluster_samples_per_s": b / ms * 1e3 + (g - d) * background_per_device_sps,
           **({} if settings is None else {"setting": settings[d]})}
          for d, ms in sorted(iteration_ms.items())]


def data_parallel_frontier(data_parallel_ms: Mapping[int, float], g: int, b: int,
                           background_per_device_sps: float) -> list[dict[str, Any]]:
  """cluster_frontier of data parallelism on each count that fits."""
  return cluster_frontier(data_parallel_ms, g, b, background_per_device_sps)


def matched_band(frontier: list[dict[str, Any]], iteration_ms: float,
                 tolerance: float) -> list[dict[str, Any]]:
  """The frontier's points whose foreground is within tolerance of the burst foreground (or
  faster): iteration_ms <= burst iteration x (1 + tolerance)."""
  return [p for p in frontier if p["iteration_ms"] <= iteration_ms * (1 + tolerance) * (1 + 1e-9)]


def matched(frontier: list[dict[str, Any]], iteration_ms: float, cluster_sps: float,
            tolerance: float, label: str) -> dict[str, Any]:
  """The fair baseline at matched foreground speed: of the frontier's points (the baseline
  `label` of BASELINES on each d <= G) whose foreground is within tolerance of the burst
  foreground (matched_band), with the background job on the other G - d, the one with the most
  cluster samples/s (fewest devices on a tie); None (and a note) when none is that fast.
  Keys matched_<label>_*, cluster_throughput_vs_matched_<label> (margin, verdict); a frontier
  of settings adds matched_<label>_setting."""
  name, key = BASELINES[label], f"matched_{label}"
  described = label == "uniform"
  band = matched_band(frontier, iteration_ms, tolerance)
  if not band:
    return {f"{key}_devices": None, **({f"{key}_setting": None} if described else {}),
            f"{key}_iteration_ms": None, f"{key}_cluster_samples_per_s": None,
            **none_fields(f"cluster_throughput_vs_{key}"),
            f"{key}_note": f"no {name} on d <= G is within {tolerance:.1%} of the burst "
                           "foreground"}
  p = max(band, key=lambda q: (q["cluster_samples_per_s"], -q["devices"]))
  what = (f"the {name} {p['setting']}" if described
          else f"{name} on {devices(p['devices'])}")
  return {f"{key}_devices": p["devices"],
          **({f"{key}_setting": p["setting"]} if described else {}),
          f"{key}_iteration_ms": p["iteration_ms"],
          f"{key}_cluster_samples_per_s": p["cluster_samples_per_s"],
          **fields(f"cluster_throughput_vs_{key}", compare(
              cluster_sps, p["cluster_samples_per_s"], tolerance, lower_is_better=False)),
          f"{key}_note": f"{what} (within {tolerance:.1%} of the burst foreground, the best "
                         "cluster throughput of those)"}


def matched_data_parallel(frontier: list[dict[str, Any]], iteration_ms: float,
                          cluster_sps: float, tolerance: float = VALIDATED_TOLERANCE
                          ) -> dict[str, Any]:
  """matched() of data parallelism on d <= G (data_parallel_frontier)."""
  return matched(frontier, iteration_ms, cluster_sps, tolerance, "data_parallel")


def best_uniform_fields(sim: Simulation, alone_ms: float, tolerance: float) -> dict[str, Any]:
  """The best uniform strategy on <= G devices (the uniform frontier's fastest: least
  iteration time, then GPU time, then fewest devices; planner/uniform.py's best_uniform), its
  time, GPU time and per-device peak, and the burst foreground alone against it (margin,
  verdict); None and a note where no uniform strategy fits."""
  if not sim.uniform:
    return {"uniform_devices": None, "uniform_setting": None, "uniform_iteration_ms": None,
            "uniform_gpu_ms": None, "uniform_memory_peak_gb": None,
            "uniform_note": f"no uniform strategy on d <= {sim.plan.num_devices} devices fits "
                            "in memory",
            **none_fields("speedup_vs_uniform_alone")}
  u = min(sim.uniform.values(), key=lambda u: (u.evaluation.iteration_ms, u.evaluation.gpu_ms,
                                               u.setting.devices))
  ev = u.evaluation
  return {"uniform_devices": u.setting.devices, "uniform_setting": u.setting.describe(),
          "uniform_iteration_ms": ev.iteration_ms, "uniform_gpu_ms": ev.gpu_ms,
          "uniform_memory_peak_gb": u.peak_bytes / GB, "uniform_note": None,
          **fields("speedup_vs_uniform_alone",
                   compare(alone_ms, ev.iteration_ms, tolerance, lower_is_better=True))}


def background_weight(sim: Simulation) -> float:
  """What one background sample counts for in cluster samples/s, in foreground samples: its
  model's forward FLOPs per sample over the foreground's (training is about three forwards for
  either, so the ratio is the training FLOPs'). 1 for a background of the foreground's own
  model, and where either count is unknown; so a ResNet-50 image beside a Llama-3 sequence
  counts for its 4 GFLOPs, not for one sample of 130 TFLOPs."""
  fg = sum(n.flops_per_sample for n in sim.model.graph.nodes)
  bg = sim.job.flops_per_sample
  if sim.job.model == sim.plan.model or not (fg > 0 and bg > 0):
    return 1.0
  return float(bg / fg)


def background_per_device(sim: Simulation) -> float:
  """The background job's throughput on a device of its own, in foreground samples/s
  (background_weight; 0 when it does not fit there)."""
  job = sim.job
  if job.memory_bytes > memory.capacity_bytes(sim.model):
    return 0.0
  return job.batch / job.step_ms * 1e3 * background_weight(sim)


def best_data_parallel_plus_background(sim: Simulation) -> dict[str, Any]:
  """A stronger baseline: data parallelism on its fastest device count d <= G that fits, and
  the background job alone at full speed on the G - d devices it leaves free."""
  g, b = sim.plan.num_devices, sim.plan.global_batch
  d, ms = fastest_data_parallel(sim.data_parallel_ms)
  sps = None if d is None else b / ms * 1e3 + (g - d) * background_per_device(sim)
  return {"best_data_parallel_devices": d, "best_data_parallel_iteration_ms": ms,
          "best_data_parallel_cluster_samples_per_s": sps}
