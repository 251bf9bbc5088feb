"""Weight-sharded layers (plan schema /2) on 2-D (data, model) stage meshes: the collectives
GSPMD inserts, and exactness against one device (same tolerances as test_runtime_exact.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from runtime_helpers import (
  TINY_GPT2,
  batches,
  by_prefix,
  make_model,
  run_plan,
  run_reference,
  sgd,
  state_diffs,
)

from dp_jax.models.digits import DigitsMLP
from dp_jax.models.zoo import build_model
from dp_jax.planner.contract import check_plan, layout_plan
from dp_jax.runtime import data as datalib
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.stages import structure_graph
from dp_jax.runtime.step import build_program, init_state
from dp_jax.runtime.train_loop import train

ALL8 = range(8)
STEPS = 3


def digits_mlp(dtype=jnp.float32):
  return DigitsMLP(dtype=dtype, rngs=nnx.Rngs(0))


def _stage_hlo(shardings, layer="fc2", layout=lambda _: ALL8, batch=8):
  """Compiled HLO text of the forward and backward programs of the digits MLP's `layer` stage
  (`shardings` as in layout_plan); `layer` reads the 128 features of relu1."""
  model = digits_mlp()
  graph = structure_graph(model, "digits_mlp")
  plan = layout_plan(graph, layout, global_batch=batch, num_devices=8, shardings=shardings)
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, check_plan(plan, graph, available_devices=8), sgd(),
                          jax.devices())
  state = init_state(program, params, stats, sgd())
  sp = program.stages[program.stage_of[layer]]
  assert sp.fwd is not None and sp.stage.layers == (layer,)
  p = {n: state["params"][n] for n in sp.stage.layers}
  st = {n: state["stats"][n] for n in sp.stage.layers}
  (prev,) = sp.stage.inputs
  x_in = jax.device_put(np.ones((batch, 128), np.float32), sp.batch)
  ins = {prev: x_in}
  fwd = sp.fwd.lower(p, st, {}, ins, None).compile().as_text()
  outs, vjp, _ = sp.fwd(p, st, {}, ins, None)
  cots = {e: (jnp.ones_like(v),) for e, v in outs.items()}
  opt = {n: state["opt"][n] for n in sp.stage.layers}
  bwd = sp.bwd.lower(vjp, cots, p, {}, ins, opt, {}).compile().as_text()
  return sp, fwd, bwd


def test_out_split_linear_all_gathers_its_output_forward():
  sp, fwd, bwd = _stage_hlo({"fc2": ((1, 8), "out")})
  assert sp.mesh.devices.shape == (1, 8)
  kernel = sp.layouts["fc2"]["kernel"]
  assert kernel.spec == jax.sharding.PartitionSpec(None, "model")
  assert "all-gather" in fwd and "all-reduce" not in fwd
  # backward: the input gradient is summed over the model group; no weight-gradient
  # all-reduce exists on a (1, 8) mesh, so this is the only reduction
  assert "all-reduce" in bwd


def test_in_split_linear_all_reduces_its_output_forward():
  sp, fwd, bwd = _stage_hlo({"fc2": ((1, 8), "in")})
  assert sp.layouts["fc2"]["kernel"].spec == jax.sharding.PartitionSpec("model", None)
  assert "all-reduce" in fwd and "all-gather" not in fwd
  assert "all-gather" in bwd  # the input gradient, split over features, gathered


def test_samples_split_has_no_forward_collective():
  _, fwd, bwd = _stage_hlo({}, layout=lambda n: range(4) if n == "fc2" else ALL8)
  assert "all-gather" not in fwd and "all-reduce" not in fwd
  assert "all-reduce" in bwd  # the weight gradient over 8 devices


def _exact(name, layout, shardings, batch, loss_rtol, param_atol):
  """Train under the sharded plan and on one device; same losses and parameters."""
  data = batches(make_model(name), batch, STEPS)
  model = make_model(name)
  losses, program, state = run_plan(model, name, layout, data, sgd(), shardings=shardings)
  reference = make_model(name)
  ref_losses = run_reference(reference, data, sgd())
  np.testing.assert_allclose(losses, ref_losses, rtol=loss_rtol)
  assert losses[0] != losses[-1], "the model should train"
  diff, update = state_diffs(model, reference, make_model(name))
  assert diff < param_atol and update > 20 * param_atol, (diff, update)
  for layer, ((d, m), _) in shardings.items():
    sp = program.stages[program.stage_of[layer]]
    assert sp.mesh.devices.shape == (d, m), layer
    split = [a for a in state["params"].get(layer, {}).values()
             if not a.sharding.is_fully_replicated]
    assert split or layer == "lm_head", f"{layer} holds no split parameter"
  return program, state


# 4 stages: embed | h.0 + h.1 (one 4 x 2 program) | ln_f | lm_head (1 x 8, the tied wte split)
GPT2_LAYOUT = {"embed": range(4), "h.0": ALL8, "h.1": ALL8, "ln_f": [0, 1], "lm_head": ALL8}
GPT2_SHARDED = {"h.0": ((4, 2), "heads"), "h.1": ((4, 2), "heads"), "lm_head": ((1, 8), "out")}


def test_gpt2_heads_split_blocks_and_out_split_head_match_one_device():
  program, state = _exact("gpt2_small", GPT2_LAYOUT.__getitem__, GPT2_SHARDED, 8, 1e-5, 1e-6)
  assert program.stage_of["h.0"] == program.stage_of["h.1"] and len(program.stages) == 4
  head = program.stages[program.stage_of["lm_head"]]
  assert head.tied_in == ("embed:wte",)
  assert head.tied_sharding["embed:wte"].spec == jax.sharding.PartitionSpec("model", None)
  qkv = state["params"]["h.0"]["attn/c_attn/kernel"]
  assert qkv.addressable_shards[0].data.shape == (32, 48)  # 3 * 32 features over 2
  momentum = jax.tree.leaves(state["opt"]["h.0"])
  assert any(a.sharding == qkv.sharding for a in momentum)  # optimizer state follows


def vgg16_devices(name: str):
  """Features 4 -> 2 -> 2 devices (as test_runtime_exact), the classifier on all 8."""
  if name.startswith("features."):
    i = int(name.split(".")[1])
    return range(4) if i < 10 else [4, 5] if i < 20 else [6, 7]
  return [6, 7] if name == "flatten" else ALL8


VGG16_SHARDED = {"classifier.0": ((1, 8), "out"), "classifier.2": ((2, 4), "in"),
                 "classifier.4": ((1, 8), "in")}


@pytest.mark.slow
def test_vgg16_weight_sharded_classifier_matches_one_device():
  _exact("vgg16", vgg16_devices, VGG16_SHARDED, 8, 1e-5, 5e-5)


@pytest.mark.slow
def test_sharded_checkpoint_resumes_under_another_plan(tmp_path):
  """Saved from a weight-sharded plan, restored onto a samples-only one (and back): the
  per-layer state is plan-independent, so both continue the same training."""
  def run(folder, steps, shardings):
    model = build_model("gpt2_small", **TINY_GPT2)
    graph = structure_graph(model, "gpt2_small")
    plan = check_plan(layout_plan(graph, GPT2_LAYOUT, global_batch=8, num_devices=8,
                                  shardings=shardings), graph, available_devices=8)
    return train(model, graph, plan, steps=steps, optimizer=optax.adam(1e-2),
                 data=datalib.synthetic(model, seed=7), checkpoint_dir=folder / "ckpt",
                 checkpoint_every=2)

  full = run(tmp_path / "full", 4, GPT2_SHARDED)
  run(tmp_path / "part", 2, GPT2_SHARDED)
  rest = run(tmp_path / "part", 4, {})
  assert rest.start_step == 2
  assert rest.state["params"]["h.0"]["attn/c_attn/kernel"].sharding.is_fully_replicated
  np.testing.assert_allclose(rest.losses, full.losses[2:], rtol=1e-5)
  back = run(tmp_path / "part", 5, GPT2_SHARDED)
  assert back.start_step == 4
  assert not back.state["params"]["h.0"]["attn/c_attn/kernel"].sharding.is_fully_replicated


@pytest.mark.slow
def test_heads_split_block_forward_is_two_all_reduces_over_model_groups():
  """A heads split's forward communicates only the two priced all-reduces (attention out,
  MLP out): the fused qkv columns are ordered per head, so q, k, v stay local."""
  model = make_model("gpt2_small")
  graph = structure_graph(model, "gpt2_small")
  plan = layout_plan(graph, lambda n: ALL8 if n == "h.0" else range(4), global_batch=8,
                     num_devices=8, shardings={"h.0": ((4, 2), "heads")})
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, check_plan(plan, graph, available_devices=8), sgd(),
                          jax.devices())
  state = init_state(program, params, stats, sgd())
  sp = program.stages[program.stage_of["h.0"]]
  p, st = {"h.0": state["params"]["h.0"]}, {"h.0": state["stats"]["h.0"]}
  x = jax.device_put(np.ones((8, TINY_GPT2["seq_len"], TINY_GPT2["d_model"]), np.float32),
                     sp.batch)
  fwd = sp.fwd.lower(p, st, {}, {"embed": x}, None).compile().as_text()
  ops = [ln for ln in fwd.splitlines() if " = " in ln]
  reduces = [ln for ln in ops if " all-reduce(" in ln]
  assert len(reduces) == 2 and all("[4,2]<=[8]" in ln for ln in reduces)  # groups of m = 2
  others = ("all-gather(", "collective-permute(", "all-to-all(", "reduce-scatter(")
  assert not [ln for ln in ops if any(o in ln for o in others)]


DIGITS_CNN_SHARDED = {"conv1": ((4, 2), "out"), "conv2": ((2, 4), "out"),
                      "fc1": ((1, 8), "in"), "fc2": ((4, 2), "out")}


@pytest.mark.slow
def test_digits_cnn_with_split_convolutions_matches_one_device():
  """conv out-splits on 2-D meshes (weight gradients all-reduced over "data" too)."""
  _exact("digits_cnn", lambda _: ALL8, DIGITS_CNN_SHARDED, 8, 1e-5, 5e-5)


# ResNet-50's first layer2 block as a fork/join: the main path on devices 0-1, the shortcut's
# convolution weight-split (out) on devices 2-3 beside it: a weight-sharded concurrent lane off
# device 0, as the planner may now choose (docs/cost_model.md, "What the planner is exact over").
RESNET_LANE_LAYOUT = by_prefix([("conv1", ALL8), ("maxpool", ALL8), ("layer1", ALL8),
                                ("layer2.0.conv", [0, 1]), ("layer2.0.downsample", [2, 3]),
                                ("layer2", range(4)), ("layer3", range(4)), ("fc", [0])], [4, 5])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:scatter inputs have incompatible types:FutureWarning")
def test_weight_sharded_concurrent_lane_off_device_0_matches_one_device():
  """A split convolution in a fork/join branch on its own devices trains like one device."""
  shardings = {"layer2.0.downsample": ((1, 2), "out")}
  with jax.enable_x64(True):
    data = batches(make_model("resnet50", jnp.float64), 8, STEPS, dtype=jnp.float64)
    model = make_model("resnet50", jnp.float64)
    losses, program, state = run_plan(model, "resnet50", RESNET_LANE_LAYOUT, data, sgd(),
                                      shardings=shardings)
    reference = make_model("resnet50", jnp.float64)
    np.testing.assert_allclose(losses, run_reference(reference, data, sgd()), rtol=1e-9)
    diff, update = state_diffs(model, reference, make_model("resnet50", jnp.float64))
  assert diff < 1e-7 and update > 20 * 1e-7, (diff, update)
  lane = program.stages[program.stage_of["layer2.0.downsample"]]
  assert lane.stage.devices == (2, 3) and lane.mesh.devices.shape == (1, 2)
  assert any(not a.sharding.is_fully_replicated
             for a in state["params"]["layer2.0.downsample"].values())
