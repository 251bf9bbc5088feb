"""planner.plan_with_idle_device: the fastest plan with an idle device when the plan is data
parallelism (the main job's background job needs an idle device; dp_jax/pipeline.py)."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import PlanOptions, idle_device_limit, plan_with, plan_with_idle_device
from dp_jax.planner.synthetic import cluster as synthetic_cluster

CLUSTER = synthetic_cluster("t", "synthetic", 1, 2, 4096.0, 100.0, 1.0, 25.0, 5.0,
                            update_memory_GBps=1e3)


def chain(half_batch_ms: float) -> tuple[LayerGraph, ProfileTable]:
  """Three weightless layers taking 1 ms at batch 8 and `half_batch_ms` at batch 4."""
  names = ("a", "b", "c")
  nodes = tuple(LayerNode(n, "synthetic", (names[i - 1],) if i else (), out_bytes_per_sample=4)
                for i, n in enumerate(names))
  graph = LayerGraph(model="chain", input_shape=(4,), input_dtype="float32", nodes=nodes)
  layers = {n: {8: (1.0, 2.0), 4: (half_batch_ms, 2 * half_batch_ms)} for n in names}
  return graph, ProfileTable(model="chain", device="synthetic", dtype="float32",
                             source="analytic", layers=layers)


def counts(graph, profile, limit: float) -> set[int]:
  options = PlanOptions(num_devices=2, global_batch=8, amplification_limit=limit)
  return {c for _, c in plan_with(graph, profile, CLUSTER, options).assignment().values()}


def test_the_highest_limit_below_the_asked_one_whose_plan_leaves_a_device_idle():
  graph, profile = chain(0.65)  # 2 devices: 1.3x the GPU time, 1.54x faster
  assert counts(graph, profile, 1.5) == {2}  # data parallelism: no device idles
  options = PlanOptions(num_devices=2, global_batch=8, amplification_limit=1.5)
  limit = idle_device_limit(graph, profile, CLUSTER, options)
  assert limit == 1.25 and counts(graph, profile, limit) == {1}
  # a plan that already leaves a device idle keeps its own limit
  graph, profile = chain(0.9)  # 1.8x the GPU time
  assert counts(graph, profile, 1.5) == {1}
  assert idle_device_limit(graph, profile, CLUSTER, options) == 1.5


def test_none_when_every_limit_gives_data_parallelism():
  graph, profile = chain(0.45)  # layers run more than 2x faster on 2 devices
  assert counts(graph, profile, 1.0) == {2}
  assert idle_device_limit(graph, profile, CLUSTER, PlanOptions(
      num_devices=2, global_batch=8, amplification_limit=1.5)) is None


def test_the_plan_with_an_idle_device_replaces_data_parallelism_or_the_search_fails_loudly():
  options = PlanOptions(num_devices=2, global_batch=8, amplification_limit=1.5)
  graph, profile = chain(0.65)
  plan, limit = plan_with_idle_device(graph, profile, CLUSTER, options)
  assert limit == 1.25 and {c for _, c in plan.assignment().values()} == {1}
  assert plan.options.amplification_limit == 1.25  # what it was made under, recorded
  graph, profile = chain(0.9)  # the plan already leaves a device idle: kept, no limit
  plan, limit = plan_with_idle_device(graph, profile, CLUSTER, options)
  assert limit is None and plan.options.amplification_limit == 1.5
  graph, profile = chain(0.45)
  with pytest.raises(UserError, match="every plan of chain on 2 devices, down to"):
    plan_with_idle_device(graph, profile, CLUSTER, options)
