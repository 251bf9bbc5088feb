"""The public jax.vjp contract the runtime's fwd/bwd split relies on (a canary for JAX upgrades)."""

import jax
import jax.numpy as jnp
import numpy as np


def _layer(params, x_BxD):
  return jnp.tanh(x_BxD @ params["w_DxE"] + params["b_E"])


def test_vjp_object_crosses_jit_without_its_args_and_restores_by_structure():
  params = {"w_DxE": jnp.arange(12.0).reshape(3, 4) / 10, "b_E": jnp.ones(4)}
  x_BxD = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)

  @jax.jit
  def fwd(params, x_BxD):
    return jax.vjp(_layer, params, x_BxD, saveable_args=False)

  @jax.jit
  def bwd(vjp, params, x_BxD, ct_BxE):
    return vjp.replace(args_res=[params, x_BxD])(ct_BxE)

  y_BxE, vjp = fwd(params, x_BxD)
  shapes = [v.shape for v in jax.tree.leaves(vjp)]
  assert (3, 4) not in shapes, "the weights must not be part of the saved state"
  g_params, g_x = bwd(vjp, params, x_BxD, jnp.ones_like(y_BxE))
  ref_params, ref_x = jax.grad(lambda p, x: _layer(p, x).sum(), argnums=(0, 1))(params, x_BxD)
  # float32, two programs: a few units in the last place apart where a sum cancels
  np.testing.assert_allclose(g_params["w_DxE"], ref_params["w_DxE"], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(g_params["b_E"], ref_params["b_E"], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(g_x, ref_x, rtol=1e-6, atol=1e-6)


def _mlp(params, x_BxD):
  h_BxF = jax.nn.gelu(x_BxD @ params["w_DxF"])
  return jnp.tanh(h_BxF @ params["w_FxD"])


def test_saved_policy_keeps_only_matmul_outputs_and_the_same_gradients():
  from dp_jax.runtime import residuals

  params = {"w_DxF": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4),
            "w_FxD": jnp.linspace(1.0, -1.0, 12).reshape(4, 3)}
  x_BxD = jnp.linspace(-2.0, 2.0, 15).reshape(5, 3)

  def residual_shapes(f):
    _, vjp = jax.vjp(f, params, x_BxD, saveable_args=False)
    return sorted(v.shape for v in jax.tree.leaves(vjp))

  kept = residual_shapes(jax.checkpoint(_mlp, policy=residuals.saved))
  assert kept == [(5, 3), (5, 4)], kept  # the two matmul outputs, nothing else
  assert len(residual_shapes(_mlp)) > len(kept)  # plain vjp also keeps gelu/tanh pieces
  g = jax.grad(lambda p, x: _mlp(p, x).sum(), argnums=(0, 1))
  g_saved = jax.grad(lambda p, x: jax.checkpoint(_mlp, policy=residuals.saved)(p, x).sum(),
                     argnums=(0, 1))
  for a, b in zip(jax.tree.leaves(g(params, x_BxD)), jax.tree.leaves(g_saved(params, x_BxD)),
                  strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_saved_policy_keeps_convolution_outputs():
  from dp_jax.runtime import residuals

  k_HWIO = jnp.linspace(-1.0, 1.0, 3 * 3 * 2 * 4).reshape(3, 3, 2, 4)
  x_NHWC = jnp.linspace(-1.0, 1.0, 2 * 6 * 6 * 2).reshape(2, 6, 6, 2)

  def conv_relu(k, x):
    y = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y) ** 2

  _, vjp = jax.vjp(jax.checkpoint(conv_relu, policy=residuals.saved), k_HWIO, x_NHWC,
                   saveable_args=False)
  assert [v.shape for v in jax.tree.leaves(vjp)] == [(2, 6, 6, 4)]


def test_a_transformer_block_stage_hands_its_backward_only_matmul_outputs():
  from runtime_helpers import TINY_GPT2, by_prefix, make_model, sgd

  from dp_jax.planner.contract import check_plan, layout_plan
  from dp_jax.runtime.functional import split_layers
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.runtime.step import build_program

  model = make_model("gpt2")
  graph = structure_graph(model, "gpt2")
  layout = by_prefix([("h.0", [2, 3])], [0, 1])  # h.0 alone, a stage that is not last
  checked = check_plan(layout_plan(graph, layout, global_batch=4, num_devices=4), graph,
                       available_devices=len(jax.devices()))
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, checked, sgd(), jax.devices())
  sp = next(s for s in program.stages if s.stage.layers == ("h.0",))
  p = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sp.replicated),
                   params["h.0"])
  d, t = TINY_GPT2["d_model"], TINY_GPT2["seq_len"]
  x_BxTxD = jax.ShapeDtypeStruct((4, t, d), jnp.float32, sharding=sp.batch)
  _, vjp, _ = jax.eval_shape(sp.fwd, {"h.0": p}, {"h.0": {}}, {},
                             {"embed": x_BxTxD}, None)
  # qkv projection, attention scores and output, MLP hidden layer (plain jax.vjp: 36 arrays)
  shapes = [v.shape for v in jax.tree.leaves(vjp)]
  assert len(shapes) <= 5, shapes
  assert (4, t, 3 * d) in shapes and (4, t, 4 * d) in shapes, shapes
