"""A plan simulated alone and with its background job, written as metrics, timeline JSON and a
Gantt chart (the simulate app's and the pipeline's one path; no JAX), and the interference
group."""

from __future__ import annotations

import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dp_jax.base.checks import Checked, option
from dp_jax.base.jsonfile import write_json
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.multiplex.policy import DEFAULT_PIECE_MS
from dp_jax.simulator.engine import simulate
from dp_jax.simulator.fill import POLICIES
from dp_jax.simulator.gantt import plot_gantt
from dp_jax.simulator.job import background_job
from dp_jax.simulator.metrics import metrics as compute_metrics
from dp_jax.simulator.timeline import TIMELINE_SCHEMA


@dataclass(frozen=True)
class InterferenceConfig(Checked):
  """The interference group (conf/simulate.yaml's interference): how the simulator packs
  background pieces (docs/simulator.md): the fill policy (fit: the multiplexing policy the
  runtime runs, dp_jax/multiplex/policy.py), a piece's length (DeepPool's be_graph_split_ms)
  and the foreground's delay when a device is handed back (None: the device's per-kernel
  cost, dp_jax/hardware/devices.py)."""

  GROUP = "interference"

  policy: str = option("fit", choices=POLICIES)
  piece_ms: float = option(DEFAULT_PIECE_MS, low=0, low_open=True)
  switch_us: float | None = option(None, low=0)

  @property
  def switch_ms(self) -> float | None:
    return None if self.switch_us is None else self.switch_us / 1e3


def background_job_for(background: BackgroundConfig, graph, profile, cluster, plan,
                       interference: InterferenceConfig, job_graph=None, job_profile=None):
  """The simulator's view of `background` (None when no job runs): its own model's
  `job_graph` and `job_profile` when it has one, else the foreground's graph and profile."""
  if not background.active:
    return None
  opts = plan.plan_options
  return background_job(job_graph or graph, job_profile or profile, cluster,
                        background.batch_per_device, piece_ms=interference.piece_ms,
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
  """The Gantt headline: simulated; the model, G, B, cluster and iteration times, then the
  verdicts as the metrics' fair_comparison says them (what they rest on last)."""
  what = "data parallelism" if m.get("plan_data_parallel_devices") else "burst"
  head = (f"simulated: {m['model']}, G={m['num_devices']}, B={m['global_batch']}, "
          f"{m['cluster']} | {what} alone {m['alone_iteration_ms']:.2f} ms (planner "
          f"{m['planner_iteration_ms']:.2f})")
  if with_background:
    head += (f"; with background {m['background']} x{m['background_batch']} (cap "
             f"{m['slowdown_cap']:.0%}): {m['iteration_ms']:.2f} ms")
  return "\n".join([head, *textwrap.wrap(m["fair_comparison"].removeprefix("simulated: "), 130)])


def gantt(sim, metrics: dict[str, Any], path: Path) -> Path:
  m = metrics
  marks = [("alone iteration", m["alone_iteration_ms"])]
  events = sim.timeline.events()
  if sim.fill is not None:
    events = sim.fill.events
    if math.isfinite(sim.fill.cap):  # slowdown_cap=inf: no cap to mark
      marks.append(("slowdown cap", (1 + sim.fill.cap) * m["alone_iteration_ms"]))
  return plot_gantt(events, sim.plan.num_devices, path,
                    title=gantt_title(m, sim.fill is not None), classes=sim.classes, marks=marks)


def simulate_with(graph, profile, cluster, plan, *, background: BackgroundConfig,
                  interference: InterferenceConfig, iterations: int, tolerance: float,
                  job_graph=None, job_profile=None) -> tuple[Any, dict[str, Any]]:
  """(simulation, metrics) of `plan` alone and with `background` (`iterations` after a warm-up
  one); nothing written."""
  job = background_job_for(background, graph, profile, cluster, plan, interference, job_graph,
                           job_profile)
  t0 = time.perf_counter()
  sim = simulate(graph, profile, cluster, plan, job=job, cap=background.cap,
                 switch_ms=interference.switch_ms, policy=interference.policy,
                 iterations=iterations)
  m = compute_metrics(sim, tolerance)
  m.update(simulation_s=time.perf_counter() - t0, profile_source=profile.source)
  return sim, m


def write(sim, m: dict[str, Any], out_dir: Path) -> Path:
  """metrics.json, timeline.json and the Gantt chart of a simulation; the chart's path."""
  out_dir.mkdir(parents=True, exist_ok=True)
  write_json(out_dir / "metrics.json", m)
  write_json(out_dir / "timeline.json", timeline_json(sim, m), indent=None)
  return gantt(sim, m, out_dir / "gantt.png")


def simulate_and_write(graph, profile, cluster, plan, out_dir: Path, **kw: Any) -> dict[str, Any]:
  """Simulate `plan` (simulate_with's keywords) and write metrics, timeline and Gantt chart."""
  sim, m = simulate_with(graph, profile, cluster, plan, **kw)
  return {"metrics": m, "gantt": str(write(sim, m, out_dir))}
