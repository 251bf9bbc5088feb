"""Weight sharding for memory: the planner's masks offer a weight split where only it fits, the
amplification limit applies to the layer's time under that split, and every layer of the plan
fits per the memory model (planner, plan JSON and simulator alike)."""

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from apps import assert_one_line_error, run_app
from test_planner_sharding import WEIGHTS, cost_model, mlp_graph
from test_planner_zoo import a100_profile, cluster, graph

from dp_jax.base.errors import UserError
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.planner import Plan, make_plan, memory, pricing, sharded
from dp_jax.planner.amplification import amplification, offers, sharded_amplification
from dp_jax.planner.contract import as_plan
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.options import PlanOptions
from dp_jax.simulator.engine import simulate

WIDE = 65536  # fc1: 1024 x 65536 parameters, 1.07 GB of params + grads + Adam state
CAP_GB = 0.5  # a device smaller than fc1's state: only a weight split fits it


def small_cluster(gb=CAP_GB):
  return dataclasses.replace(cluster("a100_nvlink_8"), memory_gb_per_device=gb)


def profile(g):
  return analytic_profile(g, "A100-SXM4-40GB", "float32", [32 // d for d in (1, 2, 4, 8)])


def plan(num_devices, sharding, gb=CAP_GB, limit=math.inf):
  g = mlp_graph(WIDE)
  return make_plan(g, profile(g), small_cluster(gb), num_devices=num_devices, global_batch=32,
                   amplification_limit=limit, sharding=sharding)


def model_for(num_devices, gb=CAP_GB, **kw):
  return cost_model(mlp_graph(WIDE), small_cluster(gb), num_devices=num_devices, sharding=WEIGHTS,
                    **kw)


def test_samples_split_does_not_fit_but_a_weight_split_does():
  model = model_for(8)
  cap = memory.capacity_bytes(model)
  r = model.row["fc1"]
  assert not memory.fits_alone(model)[r].any()  # on any count, samples keep all of fc1
  assert memory.layer_need(model, "fc1", 8) > cap
  fit = memory.weight_fits(model)
  assert fit, "some weight split of fc1 should fit"
  for c, count in enumerate(model.counts):
    cands = sharded.candidates(model.graph.node("fc1"), int(count), WEIGHTS)[1:]
    for sh in cands:  # offered exactly when it fits alone
      fits = memory.layer_need(model, "fc1", int(count), sh) <= cap
      assert fits == (sh in fit.get((r, c), ())), (count, sh)


@pytest.mark.parametrize("num_devices,limit", [(4, math.inf), (8, math.inf), (8, 2.0)])
def test_plan_splits_weights_to_fit_and_every_layer_fits(num_devices, limit):
  p = plan(num_devices, WEIGHTS, limit=limit)
  fc1 = p.layers[0]
  assert fc1.name == "fc1" and fc1.sharding.split in ("out", "in"), fc1.sharding
  g = mlp_graph(WIDE)
  model = build_cost_model(g, profile(g), small_cluster(),
                           PlanOptions(num_devices=num_devices, global_batch=32,
                                       amplification_limit=limit, sharding=WEIGHTS))
  cap = memory.capacity_bytes(model)
  shardings = sharded.plan_shardings(p)
  assert "fc1" in shardings
  for name, (_, count) in p.assignment().items():
    assert memory.layer_need(model, name, count, shardings.get(name)) <= cap, name
  used = memory.device_bytes(model, p.assignment(), shardings)
  assert used.max() <= cap
  assert p.predicted["memory_peak_gb"] == pytest.approx(used.max() / memory.GB)
  # the plan JSON (dp_jax.plan/2) gives the same bytes to the orchestrator and the simulator
  back = Plan.from_json(p.to_json())
  placed = memory.placed_bytes(g, back)
  np.testing.assert_allclose(placed, used, rtol=1e-12)
  sim = simulate(g, profile(g), small_cluster(), back)
  np.testing.assert_allclose(sim.foreground_bytes, used, rtol=1e-12)


def test_samples_only_gives_the_one_line_memory_error_with_a_hint():
  with pytest.raises(UserError) as err:
    plan(8, ("samples",))
  msg = str(err.value)
  assert "\n" not in msg
  assert msg.startswith(f"layer 'fc1' does not fit in {CAP_GB:g} GB per device")
  assert "planner.sharding=[samples,weights,state,experts] (weights split" in msg


def test_a_layer_no_split_fits_is_named_without_the_hint():
  with pytest.raises(UserError, match="layer 'fc1' does not fit in 0.05 GB") as err:
    plan(8, WEIGHTS, gb=0.05)  # an eighth of fc1's state is 0.13 GB
  assert "weights" not in str(err.value)


def test_sharded_amplification_is_the_layers_time_under_the_split():
  model = model_for(8, amplification_floor_ms=0.0)
  r = model.row["fc1"]
  single = model.compute_ms[r, 0]
  for sh in ((8, "out"), (4, "in"), (2, "out")):
    total, _ = pricing.layer_ms(model, "fc1", (0, 8), sh)
    expected = 8 * (total + pricing.band_ms(model, "fc1", (0, 8), sh)) / single
    assert sharded_amplification(model, "fc1", 8, sh) == pytest.approx(expected)
  assert sharded_amplification(model_for(8), "relu", 8, (8, "out")) == 1.0  # below the floor


def test_offers_keep_splits_within_the_limit_or_the_least_amplifying():
  model = model_for(8, amplification_floor_ms=0.0)
  fits = memory.fits_alone(model)
  fit = memory.weight_fits(model)
  r = model.row["fc1"]
  amps = {(c, sh): sharded_amplification(model, "fc1", int(model.counts[c]), sh)
          for (row, c), shs in fit.items() if row == r for sh in shs}
  ranked = sorted(set(amps.values()))
  assert len(ranked) >= 2
  limit = (ranked[0] + ranked[1]) / 2  # only the least-amplifying split is within it
  got = offers(model, limit, fits, fit)
  kept = {(c, sh) for (row, c), shs in got.weights.items() if row == r for sh in shs}
  assert kept == {k for k, a in amps.items() if a <= limit}
  assert not got.samples[r].any()  # fc1's samples splits do not fit
  below = offers(model, ranked[0] / 2, fits, fit)  # nothing within: the least stays
  kept = {(c, sh) for (row, c), shs in below.weights.items() if row == r for sh in shs}
  assert kept == {k for k, a in amps.items() if a == ranked[0]}
  everything = offers(model, math.inf, fits, fit)  # no limit: whatever fits
  assert np.array_equal(everything.samples, fits) and everything.weights == fit


def _script():
  path = Path(__file__).resolve().parents[1] / "scripts" / "check_sharded_memory.py"
  spec = importlib.util.spec_from_file_location("check_sharded_memory", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.slow
@pytest.mark.parametrize("case,exact", [(("vgg16_32", "classifier.0", (2, 4), "out"), True),
                                        (("vgg16_32", "classifier.2", (2, 4), "in"), True),
                                        (("gpt2_d64", "h.0", (2, 4), "heads"), False)])
def test_split_activations_are_what_the_runtime_keeps(case, exact):
  """Predicted bytes a device keeps for a split layer's backward vs the runtime's stage program
  (its VJP residuals and the stage input it holds; none of them whole-batch). A non-last stage
  keeps only matmul and convolution outputs (dp_jax/runtime/residuals.py) while the model counts
  plain jax.vjp's residuals: exact for linear layers, an upper bound for a transformer block."""
  row = _script().measure(*case)
  if exact:
    assert row["predicted_bytes"] == pytest.approx(row["runtime_bytes"], rel=0.05)
  else:
    assert row["predicted_bytes"] >= row["runtime_bytes"]
  assert row["runtime_unsplit_per_sample_bytes"] == 0
  assert row["predicted_bytes"] < row["unsplit_predicted_bytes"] or case[3] != "heads"


VGG16_SMALL = ("model=vgg16", "cluster=a100_nvlink_8", "cluster.memory_gb_per_device=1",
               "batch_size=8", "profile=deeppool_a100")


@pytest.mark.slow
def test_plan_app_fits_vgg16_on_a_1gb_device_only_by_splitting_weights(tmp_path):
  """A hypothetical 1 GB device: classifier.0's state alone (1.64 GB) fits no samples split."""
  (tmp_path / "s").mkdir()
  (tmp_path / "w").mkdir()
  samples = run_app("plan", *VGG16_SMALL, "planner.sharding=[samples]", cwd=tmp_path / "s")
  assert_one_line_error(samples, "layer 'classifier.0' does not fit in 1 GB per device",
                        "planner.sharding=[samples,weights,state,experts] (weights split")
  weights = run_app("plan", *VGG16_SMALL, "planner.sharding=[samples,weights]",
                    cwd=tmp_path / "w")
  assert weights.returncode == 0, weights.stderr
  plan = json.loads((tmp_path / "w" / "run" / "plan.json").read_text())
  split = {lp["name"]: lp["sharding"] for lp in plan["layers"] if "sharding" in lp}
  assert "classifier.0" in split, split
  assert plan["predicted"]["memory_peak_gb"] <= 1.0
  used = memory.placed_bytes(graph("vgg16"), as_plan(plan), element_scale=0.5)  # fp16
  assert used.max() <= 1e9
  assert used.max() / memory.GB == pytest.approx(plan["predicted"]["memory_peak_gb"], rel=1e-9)


def test_limit_applies_to_the_time_under_the_split_vgg16_across_nodes():
  """dgx_a100, G=32, A=2: split layers sit on counts where their samples split would amplify
  past the limit; each within it under its split, as the plan records."""
  g, prof = graph("vgg16"), a100_profile("vgg16")
  kw = dict(num_devices=32, global_batch=32, amplification_limit=2.0)
  p = make_plan(g, prof, cluster("dgx_a100"), sharding=WEIGHTS, **kw)
  samples = make_plan(g, prof, cluster("dgx_a100"), **kw)
  assert p.predicted["iteration_ms"] <= samples.predicted["iteration_ms"] * (1 + 1e-9)
  model = build_cost_model(g, prof, cluster("dgx_a100"),
                           PlanOptions(sharding=WEIGHTS, **kw))
  amp = amplification(model)
  beyond = 0
  for lp in p.layers:
    if lp.split == "samples":
      continue
    count = len(lp.devices)
    sh = None if lp.strategy.plain else lp.strategy
    a = sharded_amplification(model, lp.name, count, sh)
    assert lp.extra["amplification"] == pytest.approx(a)
    assert a <= 2.0 * (1 + 1e-12), (lp.name, a)
    beyond += amp[model.row[lp.name], int(np.searchsorted(model.counts, count))] > 2.0
  assert beyond, "some split layer should sit where its samples split exceeds the limit"


def test_what_each_split_keeps_whole():
  saved, x, y = 1000.0, 100.0, 10.0
  assert memory.split_saved_per_sample(saved, x, y, None) == saved
  for split in ("out", "in"):  # the input arrives whole over the model group
    assert memory.split_saved_per_sample(saved, x, y, (4, split)) == x + (saved - x) / 4
  whole = x + memory.HEADS_WHOLE_OUTPUTS * y
  assert memory.split_saved_per_sample(saved, x, y, (2, "heads")) == whole + (saved - whole) / 2
  assert memory.split_saved_per_sample(50.0, x, y, (4, "out")) == 50.0  # never above unsplit
