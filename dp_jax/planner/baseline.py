"""Data parallelism: every layer on the same devices, priced by the same cost model."""

from __future__ import annotations

import math
import time

from dp_jax.cluster import ClusterSpec
from dp_jax.graph import LayerGraph
from dp_jax.planner.costs import CostModel, build_cost_model
from dp_jax.planner.evaluate import Evaluation, data_parallel_assignment, evaluate
from dp_jax.planner.options import PlanOptions, data_parallel_count
from dp_jax.planner.plan import Plan
from dp_jax.profile.table import ProfileTable


def data_parallel(model: CostModel) -> tuple[int, Evaluation]:
  """(devices used, evaluation) of data parallelism on the job's devices (G, or the largest
  divisor of the batch below G)."""
  count = data_parallel_count(model.options)
  return count, evaluate(model, data_parallel_assignment(model, count))


def data_parallel_plan(graph: LayerGraph, profile: ProfileTable, cluster: ClusterSpec, *,
                       num_devices: int, global_batch: int, overlap_allreduce: bool = True,
                       **options) -> Plan:
  """The data-parallel plan with predicted and data-parallel numbers (they coincide)."""
  from dp_jax.planner.make import build_plan

  start = time.perf_counter()
  opts = PlanOptions(num_devices=num_devices, global_batch=global_batch,
                     overlap_allreduce=overlap_allreduce, amplification_limit=math.inf,
                     **options)
  model = build_cost_model(graph, profile, cluster, opts)
  count, ev = data_parallel(model)
  return build_plan(model, data_parallel_assignment(model, count), ev, (count, ev),
                    seconds=time.perf_counter() - start, extra={"strategy": "data_parallel"})
