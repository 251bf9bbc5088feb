"""One layer time: every pricing path reads a layer's time from planner.layer_time's parts, so
the search's tables, the amplification mask, the simulator's background pieces and the
evaluator price a layer alike (batch-norm synchronisation included, on every cluster model)."""

import math

import numpy as np
import pytest

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import allreduce_ms, class_allreduce_ms, link_class, named_cluster
from dp_jax.planner import pricing
from dp_jax.planner.amplification import prefix_times
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.layer_time import LayerTime, compose
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.search.tables import build_tables
from dp_jax.planner.synthetic import linear_profile
from dp_jax.simulator.job import background_job


def bn_chain(n: int = 4) -> LayerGraph:
  """Convolution-like layers with synchronised batch norm and parameters."""
  nodes, prev = [], ()
  for i in range(n):
    nodes.append(LayerNode(f"c{i}", "conv2d", prev, params=9 * 64 * 64,
                           param_bytes=4 * 9 * 64 * 64, out_shape=(14, 14, 64),
                           out_bytes_per_sample=4 * 14 * 14 * 64, flops_per_sample=2e8,
                           attrs={"batch_norm": True, "out_channels": 64}))
    prev = (f"c{i}",)
  return LayerGraph("bn_chain", (14, 14, 64), "float32", tuple(nodes))


@pytest.fixture(params=["dgx_a100", "dgx_h100", "a100_ethernet_10g"])
def model(request):
  graph = bn_chain()
  profile = linear_profile(graph, [1, 2, 4, 8, 16, 32, 64], np.random.default_rng(0))
  return build_cost_model(graph, profile, named_cluster(request.param),
                          PlanOptions(num_devices=64, global_batch=64,
                                      amplification_limit=math.inf))


def test_parts_add_up_and_a_recomputation_repeats_the_forward():
  t = compose(2.0, 3.0, 0.5, sync=0.25, moves=(0.1, 0.2), ratios=(0.5, 0.5))
  assert (t.forward, t.backward, t.update) == (1.0, 1.5, 0.5)
  assert t.total == pytest.approx(1.0 + 1.5 + 0.5 + 2 * 0.25 + 0.1 + 0.2)
  assert t.backward_total == pytest.approx(1.5 + 0.25 + 0.2)
  r = compose(2.0, 3.0, 0.5, sync=0.25, moves=(0.1, 0.2), ratios=(0.5, 0.5), recompute=True)
  assert r.backward == pytest.approx(t.backward + t.forward_total)
  assert r.total == pytest.approx(t.total + t.forward_total)


def test_the_per_class_all_reduce_is_the_all_reduce_of_a_range_of_that_class(model):
  cl, counts = model.cluster, model.counts
  nbytes = np.array([8.0 * 64, 1e5, 8e6])[:, None]
  table = class_allreduce_ms(cl, nbytes, counts[None, :])
  for start in (0, 4):
    for c, g in enumerate(counts):
      if start + g <= model.options.num_devices:
        k = link_class(cl, start, int(g))
        assert table[k, :, c] == pytest.approx(allreduce_ms(cl, nbytes[:, 0], start, int(g)))


def test_the_search_tables_and_the_mask_price_a_layer_as_layer_time(model):
  tables = build_tables(model, np.ones(model.compute_ms.shape, dtype=bool))
  prefix = prefix_times(model)
  for i, name in enumerate(model.names):
    for c, g in enumerate(model.counts):
      t = pricing.layer_time(model, name, (0, int(g)))
      assert isinstance(t, LayerTime) and (g == 1 or t.sync > 0)
      assert tables.compute[i, c] == pytest.approx(t.total)
      assert tables.bwd[i, c] == pytest.approx(t.backward_total)
      assert prefix.total[i, c] == pytest.approx(t.total)
      assert pricing.layer_ms(model, name, (0, int(g))) == pytest.approx(
          (t.total, t.backward_total))


def test_a_background_jobs_pieces_are_its_layers_times_on_one_device(model):
  graph, profile = model.graph, model.profile
  job = background_job(graph, profile, model.cluster, 8, piece_ms=1e9)  # one piece a pass
  one = build_cost_model(graph, profile, model.cluster.with_num_devices(1),
                         PlanOptions(num_devices=1, global_batch=8, check_memory=False))
  times = [pricing.layer_time(one, n, (0, 1)) for n in graph.names]
  assert sum(job.pieces_ms) == pytest.approx(sum(float(t.total) for t in times))
