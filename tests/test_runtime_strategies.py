"""Per-layer strategies on the runtime (dp_jax/planner/sharding.py Strategy): state sharded over
the data axis (ZeRO-1, FSDP), recomputation, heads splits of the Llama layers and expert
parallelism, each trained on 8 CPU devices and compared with one device (float64, 3 steps, the
tolerances of tests/test_models_llm.py), and what each does on the devices checked: shard
shapes, the residuals a stage keeps, the all-to-alls of the compiled program."""

import json
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from runtime_helpers import by_prefix, run_plan, run_reference, sgd, state_diffs
from test_models_moe import token_batches

from dp_jax.base.errors import UserError
from dp_jax.models import llama, moe
from dp_jax.planner.contract import check_plan, layout_plan
from dp_jax.planner.sharding import param_specs, state_spec
from dp_jax.runtime import data as datalib
from dp_jax.runtime import experts, residuals
from dp_jax.runtime.functional import PARAM, split_layers
from dp_jax.runtime.stages import structure_graph
from dp_jax.runtime.step import build_program, init_state
from dp_jax.runtime.train_loop import train

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

ALL8, FIRST4, LAST4 = range(8), range(4), range(4, 8)
MAKE = {"llama_tiny": llama.llama_tiny, "mixtral_tiny": moe.mixtral_tiny,
        "deepseek_moe_tiny": moe.deepseek_moe_tiny}


def _f64(name, **kw):
  return MAKE[name](dtype=jnp.float64, rngs=nnx.Rngs(0), **kw)


def _exact(name, layout, shardings, **kw):
  """Train `name` (float64) under the layout and per-layer strategies and on one device: the
  same losses and weights; (program, state)."""
  with jax.enable_x64(True):
    model = _f64(name, **kw)
    steps = token_batches(model, 8, 3)
    losses, program, state = run_plan(model, name, layout, steps, sgd(), shardings=shardings)
    reference = _f64(name, **kw)
    ref_losses = run_reference(reference, steps, sgd())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    assert losses[0] != losses[-1], "the model should train"
    diff, update = state_diffs(model, reference, _f64(name, **kw))
    assert diff < 1e-7 and update > 1e-3, (diff, update)
  return program, state


def _shard_shape(shape, spec, mesh_shape):
  """The shape one device holds of an array of `shape` under PartitionSpec entries `spec`."""
  sizes = dict(zip(("data", "model"), mesh_shape, strict=True))
  out = list(shape)
  for i, e in enumerate(spec or ()):
    for axis in ([] if e is None else [e] if isinstance(e, str) else e):
      out[i] //= sizes[axis]
  return tuple(out)


def _device0(a):
  return next(s.data.shape for s in a.addressable_shards if s.device == jax.devices()[0])


def _opt_leaves(opt_state, key):
  """The optimizer-state leaves of parameter `key` (momentum: one)."""
  return [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(opt_state)
          if any(getattr(p, "key", None) == key for p in path)]


# --- state: ZeRO-1 (optimizer) and FSDP (full) -------------------------------------------------

# two stages of (8, 1) and one of (4, 2); each state in a forward/backward stage and in the last
# (fused) one; FSDP on a heads-split layer too
STATE = {"embed": ((8, 1), "samples", "full"),
         "layers.0.attn": ((8, 1), "samples", "optimizer"),
         "layers.0.mlp": ((4, 2), "heads", "full"),
         "layers.1.mlp": ((8, 1), "samples", "optimizer"),
         "lm_head": ((8, 1), "samples", "full")}


def test_state_sharding_holds_1_over_d_and_trains_like_one_device():
  program, state = _exact("llama_tiny", lambda _: ALL8, STATE)
  assert len(program.stages) == 3
  defs = program.defs
  graph = structure_graph(llama.llama_tiny(rngs=nnx.Rngs(0)), "llama_tiny")
  for layer, ((d, m), split, how) in STATE.items():
    node_attrs = graph.node(layer)
    specs = param_specs(node_attrs.kind, node_attrs.attrs, split)
    split_keys = 0
    for key, role in zip(defs[layer].keys, defs[layer].roles, strict=True):
      if role != PARAM:
        continue
      p = state["params"][layer][key]
      model_only = _shard_shape(p.shape, specs.get(key), (d, m))
      spec = state_spec(tuple(p.shape), specs.get(key, ()), d, m)
      if spec is None:
        whole = model_only
      else:
        whole = _shard_shape(p.shape, spec, (d, m))
        assert math.prod(whole) * d == math.prod(model_only), (layer, key)
        split_keys += 1
      assert _device0(p) == (whole if how == "full" else model_only), (layer, key)
      [momentum] = _opt_leaves(state["opt"][layer], key)
      assert momentum.shape == p.shape and _device0(momentum) == whole, (layer, key)
    assert split_keys, f"{layer}: no array sharded over data"


def _collectives(hlo_text):
  ops = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
  lines = [ln for ln in hlo_text.splitlines() if " = " in ln]
  return {op: sum(f" {op}(" in ln for ln in lines) for op in ops}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["replicated", "optimizer", "full"])
def test_state_sharding_collectives_of_a_forward_backward_stage(how):
  """The digits MLP's fc2 alone on 8 devices: ZeRO-1 gathers the updated parameters after
  the update, FSDP gathers them before the forward and again in the backward."""
  from test_runtime_sharded import _stage_hlo
  _, fwd, bwd = _stage_hlo({"fc2": ((8, 1), "samples", how)},
                           layout=lambda n: ALL8 if n == "fc2" else FIRST4)
  fwd, bwd = _collectives(fwd), _collectives(bwd)
  assert bwd["all-reduce"] >= 1  # the gradients over "data" (on CPU: then sliced 1/d)
  assert (fwd["all-gather"] > 0) == (how == "full")
  assert (bwd["all-gather"] > 0) == (how != "replicated")


# --- recompute ---------------------------------------------------------------------------------

RECOMPUTE_LAYOUT = by_prefix([("embed", FIRST4), ("layers.0", FIRST4)], ALL8)


def _stage0_residuals(model, name, shardings):
  """The first stage's residuals (its VJP) for batch 8 (runtime/residuals.py rows)."""
  graph = structure_graph(model, name)
  plan = check_plan(layout_plan(graph, RECOMPUTE_LAYOUT, global_batch=8, num_devices=8,
                                shardings=shardings), graph, available_devices=8)
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, plan, sgd(), jax.devices())
  state = init_state(program, params, stats, sgd())
  sp = program.stages[0]
  layers = sp.stage.layers
  x = jax.device_put(token_batches(model, 8, 1)[0][0], sp.batch)
  _, rows = residuals.stage_residuals(sp, {n: state["params"][n] for n in layers},
                                      {n: state["stats"][n] for n in layers}, {}, {}, x)
  return sp, rows


def test_recompute_keeps_less_for_the_backward_and_trains_like_one_device():
  marked = {"layers.0.attn": ((4, 1), "samples", "replicated", True),
            "layers.0.mlp": ((4, 1), "samples", "replicated", True),
            "layers.1.mlp": ((8, 1), "samples", "replicated", True)}  # in the last stage
  program, _ = _exact("llama_tiny", RECOMPUTE_LAYOUT, marked)
  assert program.stages[0].recompute == {"layers.0.attn", "layers.0.mlp"}
  assert program.stages[-1].recompute == {"layers.1.mlp"}
  model = llama.llama_tiny(rngs=nnx.Rngs(0))
  sp, plain = _stage0_residuals(model, "llama_tiny", {})
  assert sp.stage.layers == ("embed", "layers.0.attn", "layers.0.mlp") and not sp.recompute
  _, kept = _stage0_residuals(model, "llama_tiny", marked)
  # both layers keep only their inputs, B x T x D floats each (the embedding's output and the
  # attention's), beside the tokens the embedding's backward reads; no matmul output
  floats = [r.shape for r in kept if r.dtype == "float32"]
  assert floats == [(8, model.seq_len, 64)] * 2, kept
  assert all(r.device_bytes * 4 == r.global_bytes for r in kept)  # split over d = 4
  assert sum(r.device_bytes for r in kept) < sum(r.device_bytes for r in plain) / 4


# --- heads: the Llama layers split over the model axis -----------------------------------------

HEADS = {"layers.0.attn": ((4, 2), "heads"), "layers.0.mlp": ((4, 2), "heads"),
         "layers.1.attn": ((4, 2), "heads"), "layers.1.mlp": ((2, 4), "heads"),
         "lm_head": ((1, 8), "out")}


def test_llama_heads_split_trains_like_one_device():
  program, state = _exact("llama_tiny", by_prefix([("embed", FIRST4)], ALL8), HEADS)
  assert program.stage_of["layers.0.attn"] == program.stage_of["layers.1.attn"]  # one (4, 2)
  # llama_tiny: d 64, 4 heads of 16 / 2 KV heads, ffn 128: m = 2 holds 2 heads and 1 KV head
  p = state["params"]
  assert _device0(p["layers.0.attn"]["q_proj/kernel"]) == (64, 32)
  assert _device0(p["layers.0.attn"]["k_proj/kernel"]) == (64, 16)
  assert _device0(p["layers.0.attn"]["o_proj/kernel"]) == (32, 64)
  assert _device0(p["layers.1.mlp"]["ffn/down_proj/kernel"]) == (128 // 4, 64)


# --- experts: expert parallelism ---------------------------------------------------------------

# mixtral_tiny: three stages, block 0's experts alone on a 2 x 4 mesh between two (8, 1) ones;
# deepseek_moe_tiny (slow): a burst layout, experts on 1 x 8 and, FSDP-sharded, on 2 x 2
EP_LAYOUTS = {
    "mixtral_tiny": lambda _: ALL8,
    "deepseek_moe_tiny": by_prefix([("embed", FIRST4), ("layers.0", ALL8),
                                    ("layers.1.router", [4]), ("layers.1.experts", ALL8),
                                    ("layers.2.experts", FIRST4), ("lm_head", [2, 3])], FIRST4),
}
EP = {"mixtral_tiny": {"layers.0.experts": ((2, 4), "experts")},
      "deepseek_moe_tiny": {"layers.1.experts": ((1, 8), "experts"),
                            "layers.2.experts": ((2, 2), "experts", "full")}}


@pytest.mark.parametrize("name", [
    "mixtral_tiny",
    pytest.param("deepseek_moe_tiny", marks=pytest.mark.slow)])
def test_expert_parallel_layers_train_like_one_device(name):
  program, state = _exact(name, EP_LAYOUTS[name], EP[name])
  model = MAKE[name](rngs=nnx.Rngs(0))
  for layer, ((d, m), _, *how) in EP[name].items():
    sp = program.stages[program.stage_of[layer]]
    assert sp.mesh.devices.shape == (d, m)
    w = state["params"][layer]["w_up"]
    spec = ("model", None, None)
    if how == ["full"]:  # FSDP on top: "data" splits another dimension (state_spec)
      spec = state_spec(tuple(w.shape), spec, d, m)
      assert spec[0] == "model" and "data" in spec
    assert w.shape[0] == model.layers[-1].experts.n_expert
    assert _device0(w) == _shard_shape(w.shape, spec, (d, m))
    if sp.stage.layers == (layer,):  # alone: its stage takes and returns tokens split d m ways
      assert sp.batch.spec == experts.TOKENS
  if name == "mixtral_tiny":  # the compiled forward moves the slots with two all-to-alls
    sp = program.stages[program.stage_of["layers.0.experts"]]
    hlo = _compiled_fwd(sp, state, {"layers.0.attn": (8, 16, 32), "layers.0.router": (8, 16, 40)})
    ops = [ln for ln in hlo.splitlines() if " all-to-all(" in ln]
    assert len(ops) >= 2, hlo[-2000:]


def _compiled_fwd(sp, state, inputs):
  """The compiled text of stage `sp`'s forward on arrays of these shapes (float64)."""
  def struct(a):
    return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)

  layers = sp.stage.layers
  with jax.enable_x64(True):
    params = {n: jax.tree.map(struct, state["params"][n]) for n in layers}
    stats = {n: {} for n in layers}
    ins = {p: jax.ShapeDtypeStruct(s, jnp.float64, sharding=sp.batch) for p, s in inputs.items()}
    return sp.fwd.lower(params, stats, {}, ins, None).compile().as_text()


# --- dropped tokens ----------------------------------------------------------------------------


@nnx.jit
def _dropped_reference(model, x):
  """Assignments each MoE layer drops on one device for the batch x (the model's own forward)."""
  outs, dropped = {}, {}
  for s in model.layer_specs():
    args = [outs[p] for p in s.inputs] if s.inputs else [x]
    if isinstance(s.module, moe.Experts):
      dropped[s.name] = jnp.sum(s.module.dropped(args[1]))
    outs[s.name] = s.module(*args)
  return dropped


@pytest.mark.slow  # a training run; the count itself: test_models_moe (fast)
def test_a_run_that_drops_tokens_reports_how_many(tmp_path, caplog):
  # capacity factor 1: 4 slots per expert for 32 assignments of 16 tokens over 8 experts;
  # block 0 in a forward/backward stage, block 1 in the last (fused) one
  model = moe.mixtral_tiny(capacity_factor=1.0, rngs=nnx.Rngs(0))
  graph = structure_graph(model, "mixtral_tiny")
  layout = by_prefix([("embed", ALL8), ("layers.0", ALL8)], FIRST4)
  plan = check_plan(layout_plan(graph, layout, global_batch=8, num_devices=8), graph,
                    available_devices=8)
  src = datalib.synthetic(model, seed=3)
  one = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)),
                                   jax.sharding.PartitionSpec())
  x, _ = datalib.batch_at(src, 0, 8, one, one)
  expected = {n: int(v) for n, v in _dropped_reference(model, x).items()}
  assert all(expected.values()), expected
  with caplog.at_level(logging.WARNING):
    result = train(model, graph, plan, steps=1, optimizer=sgd(), data=src,
                   output_dir=tmp_path)
  [line] = [json.loads(ln) for ln in result.metrics_path.read_text().splitlines()]
  assert line["dropped_assignments"] == sum(expected.values())
  assert f"dropped {sum(expected.values())} token-expert assignments" in caplog.text


@pytest.mark.slow
def test_expert_parallel_drops_the_same_tokens_as_one_device():
  """At capacity factor 1 the split layer drops what the unsplit one does: equal training."""
  _exact("mixtral_tiny", EP_LAYOUTS["mixtral_tiny"], EP["mixtral_tiny"], capacity_factor=1.0)


# --- what the runtime cannot run ---------------------------------------------------------------


def test_state_sharding_of_a_layer_it_cannot_shard_is_a_user_error():
  # the final norm's one parameter (64 scales) on a data axis of 3: nothing to shard
  model = llama.llama_tiny(rngs=nnx.Rngs(0))
  graph = structure_graph(model, "llama_tiny")
  layout = by_prefix([("norm", [0, 1, 2])], range(6))
  plan = check_plan(layout_plan(graph, layout, global_batch=6, num_devices=6,
                                shardings={"norm": ((3, 1), "samples", "optimizer")}),
                    graph, available_devices=8)
  defs, _, _ = split_layers(model)
  with pytest.raises(UserError, match=r"layer 'norm': state 'optimizer'.*(64,).*divides by 3"):
    build_program(graph, defs, plan, sgd(), jax.devices())
