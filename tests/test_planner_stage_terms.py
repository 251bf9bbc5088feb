"""Stage terms and the optimizer update, priced by the cost model (planner/stage_terms.py)."""

import dataclasses
import math

import numpy as np
import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode, flat_layers
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.stage_terms import boundary_at, update_bytes_per_param
from dp_jax.planner.synthetic import cluster as synthetic_cluster
from dp_jax.planner.synthetic import linear_profile

BW = 100.0  # GB/s of the update


def cluster(**kw) -> ClusterConfig:
  base = dict(name="t", device="synthetic", num_nodes=1, devices_per_node=4,
              memory_gb_per_device=80.0, intra_node_bandwidth_GBps=100.0,
              intra_node_latency_us=2.0, inter_node_bandwidth_GBps=10.0,
              inter_node_latency_us=5.0, update_memory_GBps=BW)
  return synthetic_cluster(**{**base, **kw})


def mlp(widths) -> LayerGraph:
  """A chain of linear layers of these widths (input width first)."""
  nodes, prev = [], None
  for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
    nodes.append(LayerNode(name=f"fc{i}", kind="linear", inputs=(prev,) if prev else (),
                           params=a * b + b, param_bytes=4 * (a * b + b), out_shape=(b,),
                           out_bytes_per_sample=4 * b,
                           attrs={"in_features": a, "out_features": b}))
    prev = f"fc{i}"
  return LayerGraph(model="mlp", input_shape=(widths[0],), input_dtype="float32",
                    nodes=tuple(nodes))


def with_meta(profile: ProfileTable, **meta) -> ProfileTable:
  return dataclasses.replace(profile, meta={**profile.meta, **meta})


def test_boundary_table_interpolates_in_k_and_scales_to_the_nearest_batch():
  table = {"8": {"2": 1.0, "6": 5.0}, "16": {"2": 3.0, "6": 3.0}}
  assert boundary_at(table, 8, 4) == pytest.approx(3.0)  # halfway between cuts
  assert boundary_at(table, 8, 1) == pytest.approx(1.0)  # nearest cut outside
  assert boundary_at(table, 8, 9) == pytest.approx(5.0)
  assert boundary_at(table, 4, 2) == pytest.approx(0.5)  # nearest batch, scaled
  assert boundary_at({}, 8, 2) == 0.0


@pytest.mark.parametrize("optimizer,precision,bytes_", [
    ("sgd", "fp32", 12), ("momentum", "fp32", 20), ("adam", "fp32", 28), ("adamw", "bf16", 26)])
def test_update_bytes_per_parameter(optimizer, precision, bytes_):
  opts = PlanOptions(num_devices=1, global_batch=1, optimizer=optimizer,
                     gradient_precision=precision, amplification_limit=math.inf)
  assert update_bytes_per_param(opts) == bytes_


def test_update_is_in_compute_not_backward_and_reported_per_stage():
  graph = mlp(widths=(64, 128, 10))
  profile = linear_profile(graph, [1, 2, 4, 8], np.random.default_rng(0))
  opts = PlanOptions(num_devices=4, global_batch=8, optimizer="adam", amplification_limit=math.inf)
  model = build_cost_model(graph, profile, cluster(), opts)
  params = np.array([n.params for n in graph.nodes], dtype=float)
  expected = params * 28 / (BW * 1e6)
  assert np.allclose(model.update_ms, expected) and expected.sum() > 0
  plain = build_cost_model(graph, with_meta(profile, includes_update=True), cluster(), opts)
  assert np.allclose(model.compute_ms - plain.compute_ms, expected[:, None])
  assert np.allclose(model.bwd_ms, plain.bwd_ms)
  dp = {n: (0, 4) for n in model.names}
  ev, ev0 = evaluate(model, dp), evaluate(plain, dp)
  assert ev.update_ms == pytest.approx(expected.sum())
  assert ev.iteration_ms - ev0.iteration_ms == pytest.approx(expected.sum())
  assert ev.gpu_ms - ev0.gpu_ms == pytest.approx(4 * expected.sum())  # every device updates


def test_unknown_device_without_update_bandwidth_is_one_line_error():
  graph = mlp(widths=(8, 4))
  profile = linear_profile(graph, [1, 2], np.random.default_rng(0))
  with pytest.raises(UserError, match="update_memory_GBps"):
    build_cost_model(graph, profile, cluster(update_memory_GBps=0.0),
                     PlanOptions(num_devices=2, global_batch=2, amplification_limit=math.inf))


def old_overhead_ms(stage_layers, order, counts_of, table, batch, dispatch_us, stage_us):
  """The term validate added before the cost model priced it (dp_jax/planner/local_overhead.py
  at commit 94f49a3): one dispatch, stage_us per added stage, each boundary the mean of the
  two stages' measured cost at its position."""
  pos = {n: i for i, n in enumerate(order)}
  stage_of = {n: i for i, s in enumerate(stage_layers) for n in s}
  total = (dispatch_us + (len(stage_layers) - 1) * stage_us) / 1e3
  for i, s in enumerate(stage_layers):
    k = min(pos[n] for n in s)
    if k > 0:
      b1 = batch // counts_of[stage_of[order[k - 1]]]
      b2 = batch // counts_of[i]
      total += (boundary_at(table, b1, k) + boundary_at(table, b2, k)) / 2
  return total


def test_stage_terms_reproduce_the_old_local_overhead_exactly():
  """Launch per stage + half of each boundary on either side = one dispatch, stage_us per
  added stage and the mean of the two batches' boundary costs (what validate added)."""
  graph = mlp(widths=(16, 32, 32, 32, 32, 8))
  order = list(flat_layers(graph.decompose()))
  profile = linear_profile(graph, [1, 2, 4, 8], np.random.default_rng(2))
  table = {"2": {"1": 0.4, "3": 1.2, "5": 0.8}, "4": {"1": 0.2, "4": 0.6}, "8": {"2": 0.5}}
  profile = with_meta(profile, boundary_ms=table, includes_update=True)
  dispatch, stage = 130.0, 900.0
  cl = cluster(program_launch_us=dispatch, stage_boundary_us=stage - dispatch)
  model = build_cost_model(graph, profile, cl, PlanOptions(num_devices=4, global_batch=8,
                                                           amplification_limit=math.inf))
  names = list(model.names)
  layouts = [{n: (0, 4) for n in names},
             {n: ((0, 4) if i < 2 else (0, 2)) for i, n in enumerate(names)},
             {n: ((0, 4), (0, 1), (0, 2))[i % 3] for i, n in enumerate(names)}]
  for a in layouts:
    ev = evaluate(model, a)
    stages = [s.layers for s in ev.stages]
    counts = [s.placement[1] for s in ev.stages]
    assert ev.overhead_ms == pytest.approx(
        old_overhead_ms(stages, order, counts, table, 8, dispatch, stage))


def test_a_boundary_measured_below_zero_is_priced_at_zero():
  """The profile's paired cut differences can come out negative within its noise; the search
  needs non-negative terms, so such a boundary costs only the host term."""
  from dp_jax.planner.stage_terms import stage_terms

  graph = mlp([8, 16, 16, 16, 4])
  profile = linear_profile(graph, [1, 2, 4, 8, 16], np.random.default_rng(1))
  profile = dataclasses.replace(profile, meta={"boundary_ms": {"4": {"1": -5.0, "3": -3.0}}})
  stage, enter, leave = stage_terms(graph, profile, cluster(stage_boundary_us=20.0),
                                    PlanOptions(num_devices=4, global_batch=16,
                                                amplification_limit=math.inf),
                                    np.array([1, 2, 4]))
  assert (enter >= 0).all() and (leave >= 0).all()
  assert enter[1:].max() == pytest.approx(0.01) and leave[:-1].max() == pytest.approx(0.01)
