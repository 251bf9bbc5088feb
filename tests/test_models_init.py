"""Host-side initializers: deterministic per key, right scale, usable under tracing."""

import jax
import jax.numpy as jnp
import numpy as np

from dp_jax.models import init


def test_same_key_same_values_eager_and_jitted():
  f = init.normal(0.5)
  key = jax.random.key(7)
  eager = f(key, (64, 32), jnp.float32)
  jitted = jax.jit(lambda k: f(k, (64, 32), jnp.float32))(key)
  np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))
  assert not np.array_equal(np.asarray(eager), np.asarray(f(jax.random.key(8), (64, 32))))


def test_kaiming_fan_out_scale():
  w = init.kaiming_normal_fan_out()(jax.random.key(0), (3, 3, 16, 64), jnp.float32)
  np.testing.assert_allclose(float(jnp.std(w)), (2.0 / (9 * 64)) ** 0.5, rtol=0.05)


def test_lecun_scale_and_dtype():
  w = init.lecun_normal()(jax.random.key(0), (400, 300), jnp.bfloat16)
  assert w.dtype == jnp.bfloat16
  np.testing.assert_allclose(float(jnp.std(w.astype(jnp.float32))), 400 ** -0.5, rtol=0.05)


def test_abstract_under_eval_shape():
  out = jax.eval_shape(lambda k: init.normal(1.0)(k, (5, 6), jnp.float16), jax.random.key(0))
  assert out == jax.ShapeDtypeStruct((5, 6), jnp.float16)
