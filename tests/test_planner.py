"""make_plan end to end: baseline comparison, limits, frontier, Plan JSON, errors, memory."""

import json
import math

import numpy as np
import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.layer_times.table import MissingProfileError, ProfileTable
from dp_jax.planner import PLAN_SCHEMA, Plan, data_parallel_plan, evaluate_plan, make_plan, pareto
from dp_jax.planner.frontier import FrontierPoint
from dp_jax.planner.synthetic import (
  analytic_profile,
  inception_like,
  linear_profile,
  random_series_parallel,
  resnet_like,
)
from dp_jax.planner.synthetic import cluster as synthetic_cluster

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
NVLINK = synthetic_cluster("nvlink", "A100-SXM4-40GB", 1, 8, 40.0, 300.0, 2.0, 25.0, 5.0)
PODS = synthetic_cluster("pods", "A100-SXM4-40GB", 16, 8, 40.0, 300.0, 2.0, 25.0, 5.0)
SLOW = synthetic_cluster("slow", "A100-SXM4-40GB", 16, 4, 40.0, 50.0, 10.0, 1.25, 25.0)


@pytest.fixture(scope="module")
def resnet():
  g = resnet_like(blocks=(2, 2, 2, 2))
  return g, analytic_profile(g, BATCHES)


@pytest.fixture(scope="module")
def inception():
  g = inception_like(modules=5)
  return g, analytic_profile(g, BATCHES)


@pytest.mark.parametrize("cluster", [NVLINK, PODS, SLOW], ids=lambda c: c.name)
@pytest.mark.parametrize("overlap", [False, True])
def test_fastest_plan_is_never_slower_than_data_parallel(resnet, inception, cluster, overlap):
  for graph, profile in (resnet, inception):
    for g, b in ((8, 32), (8, 8), (6, 24)):
      p = make_plan(graph, profile, cluster, num_devices=g, global_batch=b,
                    overlap_allreduce=overlap, amplification_limit=math.inf)
      assert p.predicted["iteration_ms"] <= p.predicted["data_parallel_iteration_ms"] * (1 + 1e-9)


def test_random_graphs_never_slower_than_data_parallel():
  for seed in range(25):
    rng = np.random.default_rng(seed)
    graph = random_series_parallel(rng, max_layers=10)
    profile = linear_profile(graph, BATCHES, rng)
    p = make_plan(graph, profile, SLOW, num_devices=16, global_batch=32,
                  amplification_limit=math.inf)
    assert p.predicted["iteration_ms"] <= p.predicted["data_parallel_iteration_ms"] * (1 + 1e-9)


def test_limit_one_keeps_every_layer_within_it(inception):
  graph, profile = inception
  p = make_plan(graph, profile, PODS, num_devices=32, global_batch=32, amplification_limit=1.0,
                amplification_floor_ms=0.0)
  for layer in p.layers:
    assert layer.extra["amplification"] <= 1.0 + 1e-9, layer.name
  fast = make_plan(graph, profile, PODS, num_devices=32, global_batch=32,
                   amplification_limit=math.inf)
  assert fast.predicted["iteration_ms"] <= p.predicted["iteration_ms"] + 1e-9
  assert fast.predicted["gpu_ms"] >= p.predicted["gpu_ms"] - 1e-9


def test_frontier_is_pareto(resnet):
  graph, profile = resnet
  p = make_plan(graph, profile, PODS, num_devices=64, global_batch=64, mode="frontier",
                amplification_floor_ms=0.0, amplification_limit=math.inf)
  front = p.extra["frontier"]
  assert front and front[0]["iteration_ms"] == pytest.approx(p.predicted["iteration_ms"])
  for a, b in zip(front, front[1:], strict=False):
    assert a["iteration_ms"] < b["iteration_ms"] and a["gpu_ms"] > b["gpu_ms"]
  pts = [FrontierPoint(1, 1.0, 5.0, {}), FrontierPoint(2, 2.0, 5.0, {}),
         FrontierPoint(3, 2.0, 1.0, {}), FrontierPoint(4, 0.5, 9.0, {})]
  assert [x.amplification_limit for x in pareto(pts)] == [4, 1, 3]


def test_plan_json_round_trip_and_contract(resnet, tmp_path):
  graph, profile = resnet
  p = make_plan(graph, profile, PODS, num_devices=16, global_batch=32, amplification_limit=math.inf)
  d = p.to_json()
  for key in ("schema", "model", "global_batch", "num_devices", "cluster",
              "amplification_limit", "layers", "predicted", "planner_seconds"):
    assert key in d
  assert d["schema"] == PLAN_SCHEMA and d["amplification_limit"] is None
  for key in ("iteration_ms", "gpu_ms", "data_parallel_iteration_ms", "data_parallel_gpu_ms"):
    assert math.isfinite(d["predicted"][key])
  assert [x["name"] for x in d["layers"]] == list(graph.names)
  for x in d["layers"]:
    assert len(x["devices"]) == len(x["samples"])
    assert x["samples"][0][0] == 0 and x["samples"][-1][1] == 32
    assert {"compute_ms", "sync_ms", "stage"} <= set(x)
  text = json.dumps(d, allow_nan=False)
  again = Plan.from_json(json.loads(text))
  assert again.to_json() == d
  assert Plan.load(p.save(tmp_path / "plan.json")).to_json() == d
  ev = evaluate_plan(graph, profile, PODS, again.assignment(), global_batch=32, num_devices=16)
  assert ev.iteration_ms == pytest.approx(p.predicted["iteration_ms"])


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.pop("layers"), "missing required field 'layers'"),
    (lambda d: d.update(schema="x/2"), "schema 'x/2' is not supported"),
    (lambda d: d["layers"][0].update(samples=[[0, 5]]), "samples"),
    (lambda d: d["layers"][0].update(devices=[99]), "uses device 99, outside the plan's 4"),
    (lambda d: d["predicted"].pop("gpu_ms"), "predicted is missing 'gpu_ms'"),
])
def test_plan_json_errors(resnet, mutate, needle):
  graph, profile = resnet
  d = make_plan(graph, profile, NVLINK, num_devices=4, global_batch=8,
                amplification_limit=math.inf).to_json()
  mutate(d)
  with pytest.raises(UserError, match=needle):
    Plan.from_json(d)


def test_data_parallel_plan(resnet):
  graph, profile = resnet
  p = data_parallel_plan(graph, profile, PODS, num_devices=16, global_batch=32)
  assert all(layer.devices == tuple(range(16)) for layer in p.layers)
  assert p.predicted["iteration_ms"] == p.predicted["data_parallel_iteration_ms"]
  assert p.predicted["idle_fraction"] == pytest.approx(0.0, abs=1e-12)
  burst = make_plan(graph, profile, PODS, num_devices=16, global_batch=32,
                    amplification_limit=math.inf)
  assert burst.predicted["data_parallel_iteration_ms"] == p.predicted["iteration_ms"]


@pytest.mark.parametrize("kw,needle", [
    (dict(num_devices=0), "cluster.num_devices=0 must be an integer >= 1"),
    (dict(global_batch=0), "batch_size=0 must be an integer >= 1"),
    (dict(num_devices=64, global_batch=32), "64 devices (cluster.num_devices) for a global batch "
                                             "of 32 (batch_size)"),
    (dict(amplification_limit=0.5), "planner.amplification_limit=0.5 must be >= 1 (or inf)"),
    (dict(device_counts="all"), "planner.device_counts='all' is unknown"),
    (dict(mode="slowest"), "planner.mode='slowest' is unknown"),
    (dict(num_devices=256, global_batch=256), "cluster pods has at most 128 devices"),
])
def test_bad_input_is_one_line(resnet, kw, needle):
  graph, profile = resnet
  args = {"num_devices": 8, "global_batch": 32, **kw}
  with pytest.raises(UserError) as e:
    make_plan(graph, profile, PODS, **args)
  assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_profile_and_cycle(resnet):
  graph, profile = resnet
  layers = dict(profile.layers)
  layers.pop("fc")
  partial = ProfileTable(profile.model, profile.device, profile.dtype, profile.source, layers)
  with pytest.raises(MissingProfileError, match="no timing for layer.*'fc'"):
    make_plan(graph, partial, PODS, num_devices=8, global_batch=32, amplification_limit=math.inf)
  d = {"model": "c", "nodes": [
      {"name": "a", "kind": "x", "inputs": ["b"], "param_bytes": 0, "out_bytes_per_sample": 1},
      {"name": "b", "kind": "x", "inputs": ["a"], "param_bytes": 0, "out_bytes_per_sample": 1}]}
  with pytest.raises(UserError, match="cycle"):
    LayerGraph.from_json(d)


def chain_graph(n, params=0, out_bytes=10**6):
  nodes = [LayerNode(name=f"l{i}", kind="dense", inputs=(f"l{i - 1}",) if i else (),
                     params=params, param_bytes=4 * params, out_bytes_per_sample=out_bytes)
           for i in range(n)]
  return LayerGraph(model="chain", input_shape=(1,), input_dtype="float32", nodes=tuple(nodes))


def flat_profile(graph, ms=1.0):
  """Every layer takes `ms` at any batch: one device is fastest (no sync, no moves)."""
  return ProfileTable(graph.model, "synthetic", "float32", "analytic",
                      {n: {b: (ms, ms) for b in BATCHES} for n in graph.names})


def test_layer_that_never_fits_is_named():
  graph = chain_graph(3)
  big = LayerNode(name="huge", kind="dense", inputs=("l2",), params=10**8, param_bytes=4 * 10**8,
                  out_bytes_per_sample=4)
  graph = LayerGraph(model="chain", input_shape=(1,), input_dtype="float32",
                     nodes=graph.nodes + (big,))
  small = synthetic_cluster("small", "x", 1, 8, 1.0, 100.0, 1.0, 10.0, 1.0, update_memory_GBps=1e3)
  with pytest.raises(UserError, match="layer 'huge' does not fit in 1 GB per device"):
    make_plan(graph, flat_profile(graph), small, num_devices=8, global_batch=8,
              amplification_limit=math.inf)


def test_memory_overflow_is_repaired_or_named():
  graph = chain_graph(10, out_bytes=10**7)  # 10 layers x 8 samples x 10 MB = 0.8 GB on one device
  profile = flat_profile(graph)
  roomy = synthetic_cluster("roomy", "x", 1, 8, 10.0, 100.0, 1.0, 10.0, 1.0, update_memory_GBps=1e3)
  fast = make_plan(graph, profile, roomy, num_devices=8, global_batch=8,
                   amplification_limit=math.inf)
  assert fast.predicted["memory_peak_gb"] == pytest.approx(0.8)
  tight = synthetic_cluster("tight", "x", 1, 8, 0.5, 100.0, 1.0, 10.0, 1.0, update_memory_GBps=1e3)
  p = make_plan(graph, profile, tight, num_devices=8, global_batch=8, amplification_limit=math.inf)
  assert p.predicted["memory_peak_gb"] <= 0.5
  assert p.predicted["iteration_ms"] >= fast.predicted["iteration_ms"]
  tiny = synthetic_cluster("tiny", "x", 1, 8, 0.05, 100.0, 1.0, 10.0, 1.0, update_memory_GBps=1e3)
  with pytest.raises(UserError, match=r"no plan fits in 0.05 GB per device: device \d+ needs"):
    make_plan(graph, profile, tiny, num_devices=8, global_batch=8, amplification_limit=math.inf)


def test_powers_of_two_and_g_not_dividing_b(resnet):
  graph, profile = resnet
  p = make_plan(graph, profile, PODS, num_devices=12, global_batch=32, amplification_limit=math.inf)
  assert p.predicted["data_parallel_devices"] == 8
  assert p.predicted["iteration_ms"] <= p.predicted["data_parallel_iteration_ms"] * (1 + 1e-9)
  q = make_plan(graph, profile, PODS, num_devices=24, global_batch=48,
                device_counts="powers_of_two", amplification_limit=math.inf)
  assert q.extra["candidate_counts"] == [1, 2, 4, 8, 16, 24]
  assert {len(x.devices) for x in q.layers} <= {1, 2, 4, 8, 16, 24}
