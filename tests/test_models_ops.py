"""models/ops.py: relu and causal attention compute what jax.nn's do, and their backward keeps
no constant the size of the batch (only residuals computed from the data)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dp_jax.models.ops import causal_attention, relu

B = 3  # a batch size no other axis below has


def _residuals(f, *args):
  """Shapes and dtypes of the residuals jax.vjp keeps for f's backward (traced, not run)."""
  return jax.tree.leaves(jax.eval_shape(lambda *a: jax.vjp(f, *a)[1], *args))


def test_relu_matches_jax_nn_relu_with_zero_gradient_at_zero():
  x = jnp.asarray([[-2.0, -0.0, 0.0, 0.5], [1.0, -1e-30, 3.0, np.nan]], jnp.float32)
  np.testing.assert_array_equal(relu(x), jax.nn.relu(x))
  g = jnp.arange(8, dtype=jnp.float32).reshape(2, 4) + 1
  mine = jax.vjp(relu, x)[1](g)[0]
  np.testing.assert_array_equal(mine, jax.vjp(jax.nn.relu, x)[1](g)[0])
  assert mine[0, 2] == 0.0  # relu'(0) = 0, as jax.nn.relu
  assert [(r.shape, r.dtype) for r in _residuals(relu, x)] == [(x.shape, jnp.bool_)]
  assert any(r.dtype == jnp.float32 for r in _residuals(jax.nn.relu, x))  # its zeros


@pytest.mark.parametrize("dtype,atol", [(jnp.float32, 2e-6),
                                        pytest.param(jnp.bfloat16, 1e-2, marks=pytest.mark.slow)])
def test_causal_attention_matches_jax_nn_dot_product_attention(dtype, atol):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((B, 16, 2, 8)), dtype) for _ in range(3))

  def ref(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)

  ct = jnp.asarray(rng.standard_normal(q.shape), dtype)
  mine, theirs = (_value_and_cotangents(f, q, k, v, ct) for f in (causal_attention, ref))
  for a, b in zip(mine, theirs, strict=True):
    np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=2 * atol)


@jax.jit(static_argnums=0)
def _value_and_cotangents(f, q, k, v, ct):
  out, vjp = jax.vjp(f, q, k, v)
  return (out, *vjp(ct))


def test_causal_attention_keeps_no_batch_sized_constant():
  q = jnp.ones((B, 16, 2, 8), jnp.float32)
  # jax.nn's form keeps its causal mask and a float32 zeros array broadcast to (1, B, N, T, T)
  theirs = _residuals(lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True), q)
  assert any(r.dtype == jnp.bool_ and B in r.shape for r in theirs)
  for r in _residuals(causal_attention, q, q, q):  # data: q, k, v, probabilities, statistics
    assert r.ndim == 0 or r.shape[0] == B, r.shape
    assert r.dtype != jnp.bool_
