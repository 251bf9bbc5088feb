"""Data parallelism: every layer on the same devices, priced by the same cost model."""

from __future__ import annotations

from collections.abc import Mapping

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import memory
from dp_jax.planner.contract import Plan
from dp_jax.planner.costs import CostModel, build_cost_model
from dp_jax.planner.evaluate import Evaluation, data_parallel_assignment, evaluate
from dp_jax.planner.options import data_parallel_count


def data_parallel(model: CostModel) -> tuple[int, Evaluation]:
  """(devices used, evaluation) of data parallelism on the job's devices (G, or the largest
  divisor of the batch below G)."""
  count = data_parallel_count(model.options)
  return count, evaluate(model, data_parallel_assignment(model, count))


def cheapest_within(model: CostModel, evaluations: Mapping[int, Evaluation],
                    tolerance: float) -> tuple[int | None, Evaluation | None]:
  """(d, evaluation) of the data parallelism with the least GPU time among the device counts
  d <= G whose iteration is within `tolerance` of the fastest one's and that fit in memory
  (fewest devices on a tie): the cheapest data parallelism as fast as the fastest, the fair
  baseline of GPU time saved. The fastest itself when none of them fits; (None, None) without
  evaluations (no data parallelism fits)."""
  if not evaluations:
    return None, None
  fastest = min(e.iteration_ms for e in evaluations.values())
  band = [(d, e) for d, e in sorted(evaluations.items())
          if e.iteration_ms <= fastest * (1 + tolerance) * (1 + 1e-9)
          and memory.fits(model, data_parallel_assignment(model, d))]
  if not band:
    return min(evaluations.items(), key=lambda kv: (kv[1].iteration_ms, kv[0]))
  return min(band, key=lambda kv: (kv[1].gpu_ms, kv[0]))


def cost_model_for(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                   plan: Plan) -> CostModel:
  """The planner's cost model for the plan's model, batch, devices and options (the ones it
  records, typed: Plan.plan_options)."""
  if plan.model != graph.model:
    raise UserError(f"plan is for model {plan.model} but the graph is {graph.model}; pass "
                    f"model={plan.model} (or the graph the plan was made for)")
  if plan.cluster != cluster.name:
    raise UserError(f"plan was made for cluster {plan.cluster} but the cluster is "
                    f"{cluster.name}; pass cluster={plan.cluster} so costs match the plan")
  return build_cost_model(graph, profile, cluster, plan.plan_options)


def data_parallel_evaluations(model: CostModel) -> dict[int, Evaluation]:
  """Data parallelism's evaluation on each device count d <= G the planner considers where it
  fits in the devices' memory: the only data parallelism a baseline may be (fastest, cheapest,
  matched); empty when it fits on no count (data_parallel_misfit says what it needs)."""
  out = {}
  for c in model.counts:
    assignment = data_parallel_assignment(model, int(c))
    if memory.fits(model, assignment):
      out[int(c)] = evaluate(model, assignment)
  return out


def data_parallel_ms(model: CostModel) -> dict[int, float]:
  """Data parallelism's iteration ms on each device count d <= G where it fits."""
  return {c: e.iteration_ms for c, e in data_parallel_evaluations(model).items()}


def data_parallel_misfit(model: CostModel) -> str:
  """Why no data parallelism on d <= G is a baseline: what it needs per device at its least
  (on G devices) against what a device holds."""
  need = float(memory.device_bytes(model, data_parallel_assignment(
      model, data_parallel_count(model.options))).max()) / memory.GB
  return (f"no data parallelism on d <= {model.options.num_devices} devices fits: on "
          f"{data_parallel_count(model.options)} it needs {need:.2f} GB per device, over the "
          f"{model.cluster.memory_gb_per_device:g} GB a device has")


def fastest_data_parallel(data_parallel_ms: dict[int, float]) -> tuple[int | None,
                                                                       float | None]:
  """(d, ms) of data parallelism's fastest device count d <= G (fewest devices on a tie);
  (None, None) when none fits."""
  if not data_parallel_ms:
    return None, None
  d, ms = min(data_parallel_ms.items(), key=lambda kv: (kv[1], kv[0]))
  return int(d), float(ms)
