"""simulate(): a plan's alone timeline, its data-parallel baseline and its background fill."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterSpec
from dp_jax.hardware.devices import get_device
from dp_jax.planner import memory
from dp_jax.planner.baseline import data_parallel
from dp_jax.planner.costs import CostModel, build_cost_model
from dp_jax.planner.evaluate import Evaluation, data_parallel_assignment, evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.plan import Plan
from dp_jax.planner.sharded import plan_shardings
from dp_jax.profiling.table import ProfileTable
from dp_jax.sim.fill import Fill, fill, validate
from dp_jax.sim.job import BackgroundJob, check_memory
from dp_jax.sim.timeline import Timeline, build_timeline
from dp_jax.sim.windows import DeviceClasses, Window, device_classes, idle_windows

_OPTION_NAMES = tuple(f.name for f in fields(PlanOptions))


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


def plan_options(plan: Plan) -> PlanOptions:
  """The planner options a plan was made with (its 'options' entry), else the defaults."""
  given = plan.extra.get("options") or {}
  if not isinstance(given, dict):
    raise UserError("plan 'options' must be an object of planner options")
  kw = {k: v for k, v in given.items() if k in _OPTION_NAMES}
  legacy = {"grad_bytes_per_param": ("gradient_precision", {4: "fp32", 2: "bf16"}),
            "optimizer_bytes_per_param": ("optimizer", {0: "sgd", 4: "momentum", 8: "adam"})}
  for old, (new, names) in legacy.items():  # plans written before the named options
    if old in given and new not in given:
      if given[old] not in names:
        raise UserError(f"plan option {old}={given[old]!r} has no {new} (valid: "
                        f"{', '.join(str(k) for k in names)}); re-make the plan")
      kw[new] = names[given[old]]
  if kw.get("amplification_limit", 0) is None:
    kw["amplification_limit"] = math.inf
  kw.update(num_devices=plan.num_devices, global_batch=plan.global_batch)
  return PlanOptions(**kw)


def cost_model_for(graph: LayerGraph, profile: ProfileTable, cluster: ClusterSpec,
                   plan: Plan) -> CostModel:
  """The planner's cost model for the plan's model, batch, devices and options."""
  if plan.model != graph.model:
    raise UserError(f"plan is for model {plan.model} but the graph is {graph.model}; pass "
                    f"model={plan.model} (or the graph the plan was made for)")
  if plan.cluster != cluster.name:
    raise UserError(f"plan was made for cluster {plan.cluster} but the cluster is "
                    f"{cluster.name}; pass cluster={plan.cluster} so costs match the plan")
  return build_cost_model(graph, profile, cluster, plan_options(plan))


def default_switch_ms(cluster: ClusterSpec) -> float:
  """One kernel's fixed overhead on the cluster's device (dp_jax/hardware/devices.py)."""
  return get_device(cluster.device).kernel_overhead_us / 1e3


def simulate(graph: LayerGraph, profile: ProfileTable, cluster: ClusterSpec, plan: Plan, *,
             job: BackgroundJob | None = None, cap: float = 0.1, switch_ms: float | None = None,
             policy: str = "fit", iterations: int = 4) -> Simulation:
  """Simulate the plan's iteration alone, then with `job` filling idle windows under `cap`."""
  switch = default_switch_ms(cluster) if switch_ms is None else switch_ms
  validate(cap, switch, policy, iterations)
  model = cost_model_for(graph, profile, cluster, plan)
  assignment = plan.assignment()
  shardings = plan_shardings(plan)
  ev = evaluate(model, assignment, shardings)
  tl = build_timeline(model, assignment, shardings)
  classes = device_classes(tl)
  windows = tuple(idle_windows(tl, classes))
  fg_bytes = memory.device_bytes(model, assignment, shardings)
  result = None
  if job is not None:
    check_memory(job, fg_bytes, memory.capacity_bytes(model))
    result = fill(tl, classes, list(windows), job, cap=cap, switch_ms=switch, policy=policy,
                  iterations=iterations)
  return Simulation(plan, model, ev, tl, classes, windows, data_parallel(model), fg_bytes,
                    data_parallel_ms(model), job, result)


def data_parallel_evaluations(model: CostModel) -> dict[int, Evaluation]:
  """Data parallelism's evaluation on each device count d <= G the planner considers."""
  return {int(c): evaluate(model, data_parallel_assignment(model, int(c))) for c in model.counts}


def data_parallel_ms(model: CostModel) -> dict[int, float]:
  """Data parallelism's iteration ms on each device count d <= G the planner considers."""
  return {c: e.iteration_ms for c, e in data_parallel_evaluations(model).items()}
