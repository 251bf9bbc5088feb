"""simulate(): a plan's alone timeline, its data-parallel and uniform baselines and its background
fill."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.hardware.devices import get_device
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import memory
from dp_jax.planner.baseline import cost_model_for, data_parallel, data_parallel_ms
from dp_jax.planner.contract import Plan
from dp_jax.planner.costs import CostModel
from dp_jax.planner.evaluate import Evaluation, evaluate
from dp_jax.planner.sharded import plan_shardings
from dp_jax.planner.uniform import Uniform, uniform_frontier
from dp_jax.simulator.fill import Fill, fill, validate
from dp_jax.simulator.job import BackgroundJob, check_memory, rooms
from dp_jax.simulator.timeline import Timeline, build_timeline
from dp_jax.simulator.windows import DeviceClasses, Window, device_classes, idle_windows


@dataclass(frozen=True, eq=False)
class Simulation:
  """Everything one simulation computed; metrics.metrics() turns it into numbers."""

  plan: Plan
  model: CostModel
  evaluation: Evaluation
  timeline: Timeline
  classes: DeviceClasses
  windows: tuple[Window, ...]
  data_parallel: tuple[int, Evaluation]
  foreground_bytes: np.ndarray  # (devices,)
  data_parallel_ms: dict[int, float]  # data parallelism on each candidate count <= G
  job: BackgroundJob | None = None
  fill: Fill | None = None
  # the best uniform strategy on each candidate count <= G that fits (planner/uniform.py)
  uniform: Mapping[int, Uniform] = field(default_factory=dict)
  # devices whose foreground leaves no room for the background job (it runs on the others)
  background_devices_without_room: int = 0


def default_switch_ms(cluster: ClusterConfig) -> float:
  """One kernel's fixed overhead on the cluster's device (dp_jax/hardware/devices.py)."""
  return get_device(cluster.device).kernel_overhead_us / 1e3


def simulate(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig, plan: Plan, *,
             job: BackgroundJob | None = None, cap: float = 0.1, switch_ms: float | None = None,
             policy: str = "fit", iterations: int = 4) -> Simulation:
  """Simulate the plan's iteration alone (its shardings and its stages, as the planner priced
  them), then with `job` filling idle windows under `cap`."""
  switch = default_switch_ms(cluster) if switch_ms is None else switch_ms
  validate(cap, switch, policy, iterations)
  model = cost_model_for(graph, profile, cluster, plan)
  assignment = plan.assignment()
  shardings = plan_shardings(plan)
  ev = evaluate(model, assignment, shardings, plan.stage_layers)
  tl = build_timeline(model, assignment, shardings, plan.stage_layers)
  classes = device_classes(tl)
  windows = tuple(idle_windows(tl, classes))
  fg_bytes = memory.device_bytes(model, assignment, shardings)
  result, without_room = None, 0
  if job is not None:
    capacity = memory.capacity_bytes(model)
    room = rooms(job, fg_bytes, capacity, classes.bounds)
    if not room.any():
      check_memory(job, fg_bytes, capacity)  # its one-line error
    without_room = int(classes.sizes[~room].sum())
    result = fill(tl, classes, [w for w in windows if room[w.cls]], job, cap=cap,
                  switch_ms=switch, policy=policy, iterations=iterations)
  return Simulation(plan, model, ev, tl, classes, windows, data_parallel(model), fg_bytes,
                    data_parallel_ms(model), job, result, uniform_frontier(model), without_room)
