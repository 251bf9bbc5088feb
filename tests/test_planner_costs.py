"""Cost terms: sample moves, stage all-reduce exposure, amplification, candidate counts."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import allreduce_ms, collective_latency_ms
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import pricing
from dp_jax.planner.amplification import allowed_counts, amplification
from dp_jax.planner.costs import (
  allreduce_volume_ms,
  build_cost_model,
  busiest_samples,
  devices_in_move,
  move_ms,
  moved_bytes_per_sample,
  stage_sync_ms,
)
from dp_jax.planner.options import PlanOptions, candidate_counts, data_parallel_count
from dp_jax.planner.synthetic import cluster as synthetic_cluster
from dp_jax.planner.synthetic import linear_profile, resnet_like

CLUSTER = synthetic_cluster("t", "synthetic", 16, 4, 80.0, 100.0, 2.0, 10.0, 5.0,
                      update_memory_GBps=1e3)


def busiest_by_device(batch, sp, gp, sc, gc):
  """Reference: per device, samples held but not needed (out) and needed but not held (in)."""
  have, need = {}, {}
  for i in range(gp):
    have[sp + i] = set(range(i * batch // gp, (i + 1) * batch // gp))
  for j in range(gc):
    need[sc + j] = set(range(j * batch // gc, (j + 1) * batch // gc))
  worst = 0
  for d in set(have) | set(need):
    h, n = have.get(d, set()), need.get(d, set())
    worst = max(worst, len(h - n), len(n - h))
  return worst


@settings(max_examples=300, deadline=None)
@given(batch_div=st.sampled_from([(24, [1, 2, 3, 4, 6, 8, 12, 24]), (16, [1, 2, 4, 8, 16])]),
       data=st.data())
def test_busiest_samples_matches_per_device_count(batch_div, data):
  batch, divs = batch_div
  gp, gc = data.draw(st.sampled_from(divs)), data.draw(st.sampled_from(divs))
  sp, sc = data.draw(st.integers(0, 20)), data.draw(st.integers(0, 20))
  assert int(busiest_samples(batch, sp, gp, sc, gc)) == busiest_by_device(batch, sp, gp, sc, gc)


def test_nested_prefixes_move_only_what_changes_device():
  assert int(busiest_samples(32, 0, 4, 0, 4)) == 0
  assert int(busiest_samples(32, 0, 1, 0, 4)) == 24  # scatter: device 0 keeps its quarter
  assert int(busiest_samples(32, 0, 4, 0, 1)) == 24  # gather
  assert int(busiest_samples(12, 0, 3, 0, 4)) == 3  # device 2 keeps 1 of its 4, dev 3 gets 3
  assert int(devices_in_move(0, 4, 2, 4)) == 6


def test_move_is_forward_plus_backward_on_slowest_link():
  # 8 samples x 1e6 bytes leave device 0 for devices 4..7 on another node (10 GB/s, 5 us)
  ms = float(move_ms(CLUSTER, 8, 1e6, 0, 1, 4, 4))  # one NIC per device, efficiency 1
  assert ms == pytest.approx(2 * (8e6 / 10e6 + 5e-3))
  assert float(move_ms(CLUSTER, 8, 1e6, 0, 2, 0, 2)) == 0.0


def channel(a, b, lat):
  """Reference event simulation: one channel, layer l's gradients ready after its backward."""
  t, free = 0.0, 0.0
  for al, bl in zip(reversed(a), reversed(b), strict=True):
    t += bl
    free = max(free, t) + al
  return lat + max(free - t, 0.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(0, 5)), min_size=1, max_size=8),
       st.floats(0, 1))
def test_overlapped_sync_matches_a_channel_simulation(layers, lat):
  a, b = [x for x, _ in layers], [y for _, y in layers]
  if not any(x > 0 for x in a):
    assert stage_sync_ms(a, b, lat, True) == 0.0
    return
  assert stage_sync_ms(a, b, lat, True) == pytest.approx(channel(a, b, lat), abs=1e-9)
  assert stage_sync_ms(a, b, lat, False) == pytest.approx(lat + sum(a))
  assert stage_sync_ms(a, b, lat, True) <= stage_sync_ms(a, b, lat, False) + 1e-12


@pytest.mark.parametrize("devices", [range(1), range(4), range(8), range(2, 6), range(3, 7)])
def test_stage_sync_is_the_cluster_allreduce(devices):
  g, start = len(devices), devices[0]
  volume = float(allreduce_volume_ms(CLUSTER, 3e8, start, g))
  latency = float(collective_latency_ms(CLUSTER, start, g))
  # the stage's line (NCCL's protocol at 8 MiB, the bus bandwidth) is NCCL's own choice at
  # 300 MB within 1% (its protocols' latencies differ by tens of us)
  assert volume + latency == pytest.approx(float(allreduce_ms(CLUSTER, 3e8, start, g)),
                                           rel=0.01)
  assert stage_sync_ms([volume], [0.0], latency, False) == pytest.approx(
      float(allreduce_ms(CLUSTER, 3e8, start, g)) if g > 1 else 0.0, rel=0.01)


@pytest.mark.parametrize("dtype,size", [("mixed fp16", 2), ("float32", 4), ("bfloat16", 2)])
def test_moves_are_sized_in_the_profile_dtype(dtype, size):
  node = LayerNode(name="a", kind="relu", inputs=(), params=0, param_bytes=0,
                   out_shape=(4, 4, 8), out_bytes_per_sample=4 * 4 * 8 * 4)
  graph = LayerGraph(model="m", input_shape=(4, 4, 8), input_dtype="float32", nodes=(node,))
  profile = ProfileTable(model="m", device="d", dtype=dtype, source="analytic",
                         layers={"a": {1: (0.1, 0.2)}})
  assert moved_bytes_per_sample(graph, profile)[0] == 4 * 4 * 8 * size


def test_candidate_counts():
  opts = PlanOptions(num_devices=960, global_batch=960, amplification_limit=math.inf)
  assert len(candidate_counts(opts)) == 28
  opts = PlanOptions(num_devices=12, global_batch=24, device_counts="powers_of_two",
                     amplification_limit=math.inf)
  assert list(candidate_counts(opts)) == [1, 2, 4, 8, 12]
  assert data_parallel_count(PlanOptions(num_devices=10, global_batch=24,
                                         amplification_limit=math.inf)) == 8


def model_for(**kw):
  graph = resnet_like(blocks=(1, 1))
  profile = linear_profile(graph, [1, 2, 4, 8, 16], np.random.default_rng(0))
  return build_cost_model(graph, profile, CLUSTER,
                          PlanOptions(num_devices=16, global_batch=16, **kw))


def test_amplification_definition():
  model = model_for(amplification_floor_ms=0.0)
  amp = amplification(model)
  assert np.allclose(amp[:, 0], 1.0)
  i, c = 0, 2
  g = int(model.counts[c])
  expected = g * model.compute_ms[i, c] / model.compute_ms[i, 0]  # stem conv of a synthetic
  if model.grad_bytes[i] > 0:
    expected += g * 2 * (g - 1) / g * model.grad_bytes[i] / 100e6 / model.compute_ms[i, 0]
  assert amp[i, c] == pytest.approx(expected)


def test_floor_exempts_small_layers_and_fallback_is_least_amplifying():
  model = model_for(amplification_floor_ms=1e9)
  assert np.all(amplification(model) == 1.0)
  model = model_for(amplification_floor_ms=0.0)
  fits = np.ones(model.compute_ms.shape, dtype=bool)
  fits[:, 0] = False  # no layer may run on one device
  ok = allowed_counts(model, 1.0, fits)
  amp = amplification(model)
  for i in range(len(ok)):
    assert ok[i].any() and not ok[i, 0]
    assert math.isclose(amp[i][ok[i]].max(), amp[i, 1:].min()) or (amp[i][ok[i]] <= 1.0).all()


@pytest.mark.parametrize("mode", ["sync", "local"])
def test_batch_norm_statistics_are_priced_as_the_runtime_runs_them(mode):
  conv = LayerNode(name="c", kind="conv2d", inputs=(), params=64, param_bytes=256,
                   out_shape=(4, 4, 16), out_bytes_per_sample=4 * 4 * 16 * 4,
                   attrs={"batch_norm": True, "out_channels": 16})
  relu = LayerNode(name="r", kind="relu", inputs=("c",), out_shape=(4, 4, 16),
                   out_bytes_per_sample=4 * 4 * 16 * 4)
  graph = LayerGraph(model="m", input_shape=(4, 4, 3), input_dtype="float32", nodes=(conv, relu))
  profile = ProfileTable(model="m", device="d", dtype="float32", source="analytic",
                         layers={n: {b: (0.1, 0.2) for b in (1, 2, 4, 8)} for n in "cr"})
  opts = PlanOptions(num_devices=8, global_batch=8, batch_norm=mode, amplification_limit=math.inf)
  model = build_cost_model(graph, profile, CLUSTER, opts)
  one = float(allreduce_ms(CLUSTER, 2 * 16 * 4, 0, 8))  # sum and sum of squares, fp32
  total, bwd = pricing.layer_ms(model, "c", (0, 8))
  extra = 1 if mode == "sync" else 0
  update = pricing.layer_update_ms(model, "c")  # the optimizer update: part of its compute
  assert update > 0
  assert total == pytest.approx(0.3 + update + 2 * one * extra)
  assert bwd == pytest.approx(0.2 + one * extra)
  assert pricing.layer_ms(model, "c", (0, 1)) == (pytest.approx(0.3 + update), pytest.approx(0.2))
  assert pricing.layer_ms(model, "r", (0, 8)) == (pytest.approx(0.3), pytest.approx(0.2))


def test_stage_terms_are_charged_once_per_stage_in_its_backward():
  """Per-stage terms (CostModel.stage_ms / enter_ms / leave_ms) add to the stage that holds
  them: a two-stage plan pays stage_ms twice, the first stage's leave and the second's enter."""
  import dataclasses

  from dp_jax.planner.evaluate import evaluate

  graph = resnet_like(blocks=(1,))
  profile = linear_profile(graph, [1, 2, 4, 8, 16], np.random.default_rng(1))
  base = build_cost_model(graph, profile, CLUSTER, PlanOptions(num_devices=4, global_batch=16,
                                                               amplification_limit=math.inf))
  rows, cols = len(base.names), len(base.counts)
  rng = np.random.default_rng(0)
  stage, enter, leave = rng.uniform(1, 2, cols), rng.uniform(1, 2, (rows, cols)), \
      rng.uniform(1, 2, (rows, cols))
  model = dataclasses.replace(base, stage_ms=stage, enter_ms=enter, leave_ms=leave)
  names = list(base.names)
  # cut inside the top-level chain at a node, not inside a block
  chain = graph.decompose().items
  cut_name = next(i for i in chain[1:] if isinstance(i, str))
  cut = names.index(cut_name)
  one = {n: (0, 4) for n in names}
  two = {n: ((0, 4) if i < cut else (0, 2)) for i, n in enumerate(names)}
  c4, c2 = int(np.searchsorted(base.counts, 4)), int(np.searchsorted(base.counts, 2))
  plain1, plain2 = evaluate(base, one), evaluate(base, two)
  with1, with2 = evaluate(model, one), evaluate(model, two)
  assert with1.iteration_ms - plain1.iteration_ms == pytest.approx(
      stage[c4] + enter[0, c4] + leave[rows - 1, c4])
  first, second = names[cut - 1], names[cut]
  extra = (stage[c4] + enter[0, c4] + leave[base.row[first], c4]
           + stage[c2] + enter[base.row[second], c2] + leave[rows - 1, c2])
  assert with2.iteration_ms - plain2.iteration_ms == pytest.approx(extra)
  assert with2.forward_ms == pytest.approx(plain2.forward_ms)  # charged in the backward
  assert sum(s.overhead_ms for s in with2.stages) == pytest.approx(extra)


def test_a_cost_model_is_data_and_its_prices_are_memoised_off_it():
  """CostModel carries no memo: pricing memoises per model beside it, a replaced model is
  priced afresh from its own arrays, and a dropped model takes its memo with it."""
  import dataclasses
  import gc
  import weakref

  from dp_jax.planner.costs import CostModel

  assert all(not f.name.startswith("_") for f in dataclasses.fields(CostModel))
  graph = resnet_like(blocks=(1,))
  profile = linear_profile(graph, [1, 2, 4, 8, 16], np.random.default_rng(2))
  model = build_cost_model(graph, profile, CLUSTER,
                           PlanOptions(num_devices=4, global_batch=16, batch_norm="local",
                                       amplification_limit=math.inf))
  run = tuple(model.names[:3])
  compute, _ = pricing.stage_cost(model, run, (0, 4))
  assert compute > 0 and ("stage", run, (0, 4), (None,) * 3) in pricing.memo(model)
  assert pricing.stage_cost(model, run, (0, 4))[0] == compute  # the memoised value
  doubled = dataclasses.replace(model, fwd_ms=2 * model.fwd_ms, bwd_ms=2 * model.bwd_ms,
                                update_ms=2 * model.update_ms)
  assert pricing.stage_cost(doubled, run, (0, 4))[0] == pytest.approx(2 * compute)
  gone = weakref.ref(model)
  before = len(pricing._MEMOS)
  del model, doubled
  gc.collect()
  assert gone() is None and len(pricing._MEMOS) == before - 2
