"""Weight sharding in the planner: each split's cost terms, the choice, never slower than samples,
planner == simulator on sharded plans, and planner.sharding."""

import dataclasses
import math

import numpy as np
import pytest
from apps import assert_one_line_error, run_app
from test_planner_zoo import ZOO, a100_profile, cluster, graph

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import (
  allgather_ms,
  allreduce_ms,
  class_bus_GBps,
  class_latency_ms,
  group_collective_ms,
  link_class,
  strided_link_class,
  volume_ms,
)
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.planner import Plan, make_plan, memory, pricing, sharded
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.search import build_tables, search
from dp_jax.planner.sharding import Strategy
from dp_jax.simulator.engine import simulate
from dp_jax.simulator.metrics import metrics

WEIGHTS = ("samples", "weights")


def mlp_graph(width=4096):
  """input -> fc1 (linear 1024 -> width) -> relu -> fc2 (linear width -> 10)."""
  nodes = [
      LayerNode("fc1", "linear", (), 1024 * width + width, 4 * (1024 * width + width), (width,),
                4 * width, attrs={"in_features": 1024, "out_features": width, "bias": True}),
      LayerNode("relu", "relu", ("fc1",), 0, 0, (width,), 4 * width),
      LayerNode("fc2", "linear", ("relu",), width * 10 + 10, 4 * (width * 10 + 10), (10,), 40,
                attrs={"in_features": width, "out_features": 10, "bias": True}),
  ]
  return LayerGraph(model="mlp", input_shape=(1024,), input_dtype="float32", nodes=tuple(nodes))


def cost_model(g, cl, num_devices=8, batch=32, **kw):
  prof = analytic_profile(g, "A100-SXM4-40GB", "float32", [batch // d for d in (1, 2, 4, 8, 16,
                                                                             32)])
  return build_cost_model(g, prof, cl, PlanOptions(num_devices=num_devices, global_batch=batch,
                                                   **kw))


# --- the collective model of strided groups ------------------------------------------------------


def test_strided_link_class_matches_ranges_and_counts_devices_per_node():
  cl = cluster("dgx_a100")  # 8 devices per node
  for first, count in [(0, 8), (4, 8), (6, 4), (0, 32), (3, 2)]:
    assert strided_link_class(cl, first, count, 1) == int(link_class(cl, first, count))
  assert strided_link_class(cl, 0, 2, 4) == 0  # devices 0, 4: one node
  assert strided_link_class(cl, 0, 4, 8) == 1  # devices 0, 8, 16, 24: one per node
  assert strided_link_class(cl, 1, 4, 4) == 2  # 1, 5 | 9, 13: two per node
  one = group_collective_ms(cl, 1e8, 0, 4, 8)
  bw = class_bus_GBps(cl)[1]
  assert one == pytest.approx(float(volume_ms(1e8, 4, bw)) + float(class_latency_ms(cl, 4)[1]))
  assert group_collective_ms(cl, 1e8, 0, 1, 8) == 0.0


# --- each split's terms ----------------------------------------------------------------------


def test_out_split_collectives_and_gradients_follow_the_contract():
  g = mlp_graph()
  cl = cluster("a100_nvlink_8")
  model = cost_model(g, cl)
  i = model.row["fc1"]
  # fc2 on (d, m) = (2, 4), out features split: nothing divides 10 by 4, so use fc1
  p, sh = (0, 8), (4, "out")
  fwd, bwd = pricing.activation_ms(model, "fc1", p, sh)
  rows = 32 // 2
  x, y = rows * model.in_bytes[i], rows * model.out_bytes[i]
  gather_in = max(float(allgather_ms(cl, x, s, 4)) for s in (0, 4))
  gather_out = max(float(allgather_ms(cl, y, s, 4)) for s in (0, 4))
  assert fwd == pytest.approx(gather_in + gather_out)
  assert bwd == 0.0  # fc1 reads the model input: no input gradient
  j = model.row["fc2"]
  fwd2, bwd2 = pricing.activation_ms(model, "fc2", p, (4, "in"))
  x2, y2 = rows * model.in_bytes[j], rows * model.out_bytes[j]
  assert fwd2 == pytest.approx(float(allgather_ms(cl, x2, 0, 4))
                               + float(allreduce_ms(cl, y2, 0, 4)))
  assert bwd2 == pytest.approx(float(allgather_ms(cl, x2, 0, 4)))
  # weight gradients: a quarter of fc1's over each data group of 2 (stride 4); none when d = 1
  share = model.grad_bytes[i] / 4
  bus = class_bus_GBps(cl)[0]
  assert pricing.band_ms(model, "fc1", p, sh) == pytest.approx(float(volume_ms(share, 2, bus)))
  assert pricing.band_ms(model, "fc1", p, (8, "out")) == 0.0
  # fc2 'in': the bias (10 values) stays whole on every device
  assert sharded.param_share(g.node("fc2"), (4, "in")) == pytest.approx(
      (10 * 4096 / 4 + 10) / (10 * 4096 + 10))


def test_sharded_compute_is_the_roofline_ratio_applied_to_the_profile():
  g = mlp_graph(8192)
  model = cost_model(g, cluster("a100_nvlink_8"))
  t = model.profile.lookup("fc1", 32)
  rf, rb = sharded.compute_ratios(g, g.node("fc1"), (8, "out"), 32, "A100-SXM4-40GB", "float32")
  total, bwd = pricing.layer_ms(model, "fc1", (0, 8), (8, "out"))
  af, ab = pricing.activation_ms(model, "fc1", (0, 8), (8, "out"))
  update = pricing.layer_update_ms(model, "fc1", sharded.param_share(g.node("fc1"), (8, "out")))
  assert 0 < update < pricing.layer_update_ms(model, "fc1")  # each device updates its 1/8
  assert total == pytest.approx(t.fwd_ms * rf + t.bwd_ms * rb + af + ab + update)
  assert bwd == pytest.approx(t.bwd_ms * rb + ab)
  # an eighth of the work, but never less than an eighth of the time (kernel overheads stay)
  assert 1 / 8 - 1e-12 <= rf < 1 and 1 / 8 - 1e-12 <= rb < 1


def test_sharded_state_is_split_and_saved_activations_are_for_b_over_d_samples():
  g = mlp_graph()
  model = cost_model(g, cluster("a100_nvlink_8"))
  a = {n: (0, 8) for n in g.names}
  alone = memory.device_bytes(model, a)[0]
  cut = memory.device_bytes(model, a, {"fc1": (8, "out")})[0]
  i = model.row["fc1"]
  saved, x = model.saved_bytes[i], model.in_bytes[i]
  kept = min(saved, x)  # the gathered input stays whole, the rest is split 8 ways
  expected = model.state_bytes[i] * (7 / 8) + saved * 4 - (kept + (saved - kept) / 8) * 32
  assert alone - cut == pytest.approx(expected)


def test_evaluate_refuses_a_sharding_the_layer_cannot_have():
  g = mlp_graph()
  model = cost_model(g, cluster("a100_nvlink_8"))
  a = {n: (0, 8) for n in g.names}
  with pytest.raises(UserError, match="cannot split 'out' 4 ways"):
    evaluate(model, a, {"fc2": (4, "out")})  # 10 output features
  with pytest.raises(UserError, match="does not divide"):
    evaluate(model, a, {"fc1": (3, "out")})


# --- the planner -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", [False, True])
def test_exact_tables_offer_every_sharding_or_one_no_worse(overlap):
  g = mlp_graph(16384)
  model = cost_model(g, cluster("a100_nvlink_8"), sharding=WEIGHTS, overlap_allreduce=overlap)
  mask = np.ones(model.compute_ms.shape, dtype=bool)
  assert build_tables(model, mask).options is None  # the samples rule: no weight sharding
  opts = build_tables(model, mask, rule="exact").options
  assert any(sh is not None for row in opts.shardings for cell in row for sh in cell), \
      "a 16k-wide layer on 8 devices should offer weight shardings"
  dropped = 0
  for r, name in enumerate(model.names):
    for c, count in enumerate(model.counts):
      p = (0, int(count))
      kept = [(opts.compute[r, c, o], opts.compute[r, c, o] + opts.band[r, c, o],
               opts.compute[r, c, o] + opts.band[r, c, o] - opts.bwd[r, c, o])
              for o in range(len(opts.shardings[r][c]))]
      for sh in sharded.candidates(g.node(name), int(count), WEIGHTS):
        sh = None if sh[1] == "samples" else sh
        total, back = pricing.layer_ms(model, name, p, sh)
        sent = pricing.band_ms(model, name, p, sh)
        keys = (total, total + sent, total + sent - back)  # what a stage's cost grows with
        assert any(all(x <= y + 1e-9 for x, y in zip(k, keys, strict=True)) for k in kept)
        dropped += sh not in opts.shardings[r][c]
  assert dropped, "some sharding should be dominated"


def test_offers_limit_the_shardings_and_place_a_layer_samples_cannot_take():
  g = mlp_graph(16384)
  # without stage terms: the search's value is evaluate()'s (the search does not price them yet)
  bare = dataclasses.replace(cluster("a100_nvlink_8"), program_launch_us=0.0,
                             stage_boundary_us=0.0, what_if=True)
  model = cost_model(g, bare, sharding=WEIGHTS)
  r, c = model.row["fc1"], int(np.searchsorted(model.counts, 8))
  allowed = np.ones(model.compute_ms.shape, dtype=bool)
  allowed[r, :] = False
  allowed[r, 0] = True  # fc1 splits samples on one device only
  t = build_tables(model, allowed, rule="exact")  # no offers: shardings only where samples is
  assignment, shardings, _ = search(t)[:3]
  assert assignment["fc1"] == (0, 1) and "fc1" not in shardings
  t = build_tables(model, allowed, rule="exact", offers={(r, c): ((8, "out"),)})
  assert [sh for sh in t.options.shardings[r][c] if sh] == [Strategy(8, "out")]
  assignment, shardings, value = search(t)[:3]
  assert assignment["fc1"] == (0, 8) and shardings["fc1"] == Strategy(8, "out")
  assert evaluate(model, assignment, shardings).iteration_ms == pytest.approx(value, rel=1e-9)


def test_weights_off_gives_todays_plan_exactly():
  g = graph("vgg16")
  prof = a100_profile("vgg16")
  old = make_plan(g, prof, cluster("a100_nvlink_8"), num_devices=8, global_batch=32,
                  amplification_limit=math.inf)
  same = make_plan(g, prof, cluster("a100_nvlink_8"), num_devices=8, global_batch=32,
                   sharding=["samples"], amplification_limit=math.inf)
  assert old.assignment() == same.assignment()
  assert old.predicted["iteration_ms"] == same.predicted["iteration_ms"]
  assert all(lp.split == "samples" for lp in old.layers)


def check_never_slower(name, num_devices=8, cl="a100_nvlink_8"):
  g, prof = graph(name), a100_profile(name)
  kw = dict(num_devices=num_devices, global_batch=32, amplification_limit=math.inf)
  samples = make_plan(g, prof, cluster(cl), **kw)
  weights = make_plan(g, prof, cluster(cl), sharding=WEIGHTS, **kw)
  assert weights.predicted["iteration_ms"] <= samples.predicted["iteration_ms"] * (1 + 1e-9)
  return samples, weights


def check_planner_equals_simulator(plan, name, cl):
  m = metrics(simulate(graph(name), a100_profile(name), cluster(cl), plan))
  assert m["alone_iteration_ms"] == pytest.approx(plan.predicted["iteration_ms"], rel=1e-3)
  assert m["gpu_ms"] == pytest.approx(plan.predicted["gpu_ms"], rel=1e-3)


def test_vgg16_shards_its_classifier_and_is_faster_and_the_simulator_agrees():
  samples, weights = check_never_slower("vgg16")
  split = {lp.name: lp.sharding for lp in weights.layers if lp.split != "samples"}
  assert any(n.startswith("classifier") for n in split), split
  assert weights.predicted["iteration_ms"] < samples.predicted["iteration_ms"]
  check_planner_equals_simulator(Plan.from_json(weights.to_json()), "vgg16", "a100_nvlink_8")


def test_sharded_plan_across_nodes_matches_the_simulator():
  g, prof = graph("vgg16"), a100_profile("vgg16")
  plan = make_plan(g, prof, cluster("dgx_a100"), num_devices=32, global_batch=32,
                   amplification_limit=math.inf, sharding=WEIGHTS)
  meshes = [list(lp.sharding.mesh) for lp in plan.layers if lp.split != "samples"]
  assert meshes
  check_planner_equals_simulator(plan, "vgg16", "dgx_a100")


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_weight_sharding_is_never_slower_on_every_zoo_model(name):
  _, weights = check_never_slower(name)
  check_planner_equals_simulator(weights, name, "a100_nvlink_8")


# --- the option --------------------------------------------------------------------------------


@pytest.mark.parametrize("value, fragment", [
    (["samples", "pipeline"], r"planner.sharding\[1\]='pipeline' is unknown"),
    (["weights"], "must include samples"),
    ([], r"planner.sharding=\[\] is empty"),
])
def test_bad_sharding_option_is_a_user_error(value, fragment):
  with pytest.raises(UserError, match=fragment):
    PlanOptions(num_devices=8, global_batch=32, sharding=value, amplification_limit=math.inf)


def test_sharding_option_is_normalised():
  opts = PlanOptions(num_devices=8, global_batch=32, sharding=["weights", "samples"],
                     amplification_limit=math.inf)
  assert opts.sharding == ("samples", "weights")
  assert dataclasses.replace(opts).sharding == ("samples", "weights")


def test_vgg16_at_the_default_amplification_limit_shards_weights():
  plan = make_plan(graph("vgg16"), a100_profile("vgg16"), cluster("a100_nvlink_8"),
                   num_devices=8, global_batch=32, amplification_limit=2.0, sharding=WEIGHTS)
  assert any(lp.sharding.split != "samples" for lp in plan.layers)


@pytest.mark.slow
def test_plan_app_writes_weight_sharded_vgg16_layers(tmp_path):
  result = run_app("plan", "model=vgg16", "cluster=a100_nvlink_8", "batch_size=32",
                   "profile=deeppool_a100", "planner.sharding=[samples,weights]",
                   "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  plan = Plan.load(tmp_path / "run" / "plan.json")
  split = [lp for lp in plan.layers if lp.sharding.split != "samples"]
  assert split, "no weight-sharded layer"
  for lp in split:
    d, m = lp.sharding.mesh
    assert d * m == len(lp.devices) and m > 1
  assert plan.options.sharding == ("samples", "weights")  # recorded, typed


def test_plan_app_refuses_an_unknown_sharding(tmp_path):
  result = run_app("plan", "model=digits_mlp", "cluster=a100_nvlink_8", "batch_size=32",
                   "planner.sharding=[samples,tensor]", "logger=disabled", cwd=tmp_path)
  assert_one_line_error(result, "planner.sharding[1]='tensor' is unknown")
