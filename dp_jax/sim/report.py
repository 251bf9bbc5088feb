"""A plan simulated alone and with the config's background job, written as metrics, timeline
JSON and a Gantt chart (the simulate app's and the pipeline's one path; no JAX)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dp_jax.base.jsonfile import write_json
from dp_jax.sim.timeline import TIMELINE_SCHEMA


def background_for(cfg: Any, graph, profile, cluster, plan):
  """The background job the config names (None for background=none)."""
  from dp_jax.profiling.sources import load_profile, profile_batches
  from dp_jax.sim.background import background_job
  from dp_jax.sim.engine import plan_options

  bg = cfg.background
  if bg.name == "none":
    return None
  if bg.model is not None:  # another model than the foreground's: trace and profile it
    from dp_jax.models import zoo

    graph = zoo.graph_of(bg.model, seed=cfg.seed)
    profile = load_profile(cfg.profile, graph, cluster.device,
                           profile_batches(bg.batch_per_device), bg.model)
  opts = plan_options(plan)
  return background_job(graph, profile, cluster, int(bg.batch_per_device),
                        piece_ms=float(cfg.interference.piece_ms),
                        gradient_precision=opts.gradient_precision, optimizer=opts.optimizer,
                        param_bytes_per_param=opts.param_bytes_per_param)


def timeline_json(sim, metrics: dict[str, Any]) -> dict[str, Any]:
  """Alone and with-background events of one iteration, devices as [first, count] ranges."""
  out = {"schema": TIMELINE_SCHEMA, "model": sim.plan.model, "num_devices": sim.plan.num_devices,
         "global_batch": sim.plan.global_batch, "cluster": sim.plan.cluster,
         "device_groups": [int(b) for b in sim.classes.bounds],
         "alone": {"iteration_ms": sim.timeline.iteration_ms,
                   "events": [e.to_json() for e in sim.timeline.events()]}}
  if sim.fill is not None:
    out["with_background"] = {
        "iteration_ms": float(sim.fill.iteration_ms[-1]),
        "iteration_ms_all": [float(t) for t in sim.fill.iteration_ms],
        "slowdown_cap": sim.fill.cap, "max_slowdown": metrics["max_slowdown"],
        "events": [e.to_json() for e in sim.fill.events]}
  return out


def gantt_title(m: dict[str, Any], with_background: bool) -> str:
  """The Gantt headline: simulated, the fair baseline first (matched DP + background, the
  fastest DP on <= G devices), data parallelism on all G last, each with its margin."""
  from dp_jax.report.compare import describe

  t, g = m["comparison_tolerance"], m["num_devices"]
  head = (f"simulated: {m['model']}, G={g}, B={m['global_batch']}, {m['cluster']} | burst alone "
          f"{m['alone_iteration_ms']:.2f} ms (planner {m['planner_iteration_ms']:.2f})")
  fg = (f"foreground vs fastest DP on <= {g} ({m['best_data_parallel_devices']} devices, "
        f"{m['best_data_parallel_iteration_ms']:.2f} ms): "
        f"{describe(m['speedup_vs_best_data_parallel_alone'], t)}; vs DP on all {g} "
        f"({m['data_parallel_iteration_ms']:.2f} ms): "
        f"{describe(m['speedup_vs_data_parallel_alone'], t)}")
  if not with_background:
    return f"{head}\n{fg}"
  d = m.get("matched_data_parallel_devices")
  matched = ("no DP on <= G within the tolerance of the burst foreground" if d is None else
             f"vs matched DP on {d} + background: "
             f"{describe(m['cluster_throughput_vs_matched_data_parallel'], t)}")
  return (f"{head}\nwith background {m['background']} x{m['background_batch']} (cap "
          f"{m['slowdown_cap']:.0%}): {m['iteration_ms']:.2f} ms; cluster throughput {matched}; "
          f"vs DP alone on all {g}: {describe(m['cluster_throughput_vs_data_parallel'], t)}"
          f"\n{fg}")


def gantt(sim, metrics: dict[str, Any], path: Path) -> Path:
  from dp_jax.sim.gantt import plot_gantt

  m = metrics
  marks = [("alone iteration", m["alone_iteration_ms"])]
  events = sim.timeline.events()
  if sim.fill is not None:
    events = sim.fill.events
    marks.append(("slowdown cap", (1 + sim.fill.cap) * m["alone_iteration_ms"]))
  return plot_gantt(events, sim.plan.num_devices, path,
                    title=gantt_title(m, sim.fill is not None), classes=sim.classes, marks=marks)


def interference(cfg: Any) -> tuple[str, float | None]:
  """(fill policy, switch ms) of the config, after checking the cap, policy and iterations."""
  from dp_jax.config import workflow
  from dp_jax.sim.fill import validate

  policy = workflow.enum_value(cfg.interference.policy)
  switch_ms = None if cfg.interference.switch_us is None else cfg.interference.switch_us / 1e3
  validate(float(cfg.background.slowdown_cap), switch_ms or 0.0, policy, cfg.iterations)
  return policy, switch_ms


def simulate_and_write(cfg: Any, graph, profile, cluster, plan, out_dir: Path) -> dict[str, Any]:
  """Simulate `plan` alone and with cfg.background; write metrics, timeline and Gantt chart."""
  from dp_jax.report.compare import tolerance_of
  from dp_jax.sim.engine import simulate
  from dp_jax.sim.metrics import metrics as compute_metrics

  tolerance = tolerance_of(cfg, cluster.device)
  policy, switch_ms = interference(cfg)
  job = background_for(cfg, graph, profile, cluster, plan)
  t0 = time.perf_counter()
  sim = simulate(graph, profile, cluster, plan, job=job, cap=float(cfg.background.slowdown_cap),
                 switch_ms=switch_ms, policy=policy, iterations=cfg.iterations)
  m = compute_metrics(sim, tolerance)
  m.update(simulation_s=time.perf_counter() - t0, profile_source=profile.source)
  write_json(out_dir / "metrics.json", m)
  write_json(out_dir / "timeline.json", timeline_json(sim, m), indent=None)
  png = gantt(sim, m, out_dir / "gantt.png")
  return {"metrics": m, "gantt": str(png)}
