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
  np.testing.assert_allclose(g_params["w_DxE"], ref_params["w_DxE"], rtol=1e-6)
  np.testing.assert_allclose(g_params["b_E"], ref_params["b_E"], rtol=1e-6)
  np.testing.assert_allclose(g_x, ref_x, rtol=1e-6)
