"""dp_jax/convergence/noise_scale.py: B_simple = tr(Sigma) / |G|^2 from per-example gradients."""

import jax
import numpy as np
import pytest
from flax import nnx

from dp_jax.convergence import digits
from dp_jax.convergence.noise_scale import noise_scale_fn
from dp_jax.convergence.steps_to_target import cross_entropy
from dp_jax.models.zoo import build_model


@pytest.fixture(scope="module")
def setup():
  model = build_model("digits_mlp", seed=0)
  d = digits.load(0)
  return nnx.graphdef(model), nnx.state(model, nnx.Param), d.x_train_Nx8x8x1, d.y_train_N


def test_matches_explicit_per_example_gradients(setup):
  graphdef, params, x, y = setup
  x, y = x[:150], y[:150]  # more than one CHUNK, not a multiple of it
  def one(p, x_HxWxC, label):
    return jax.grad(lambda q: cross_entropy(graphdef, q, x_HxWxC[None], label[None]))(p)

  per_example = jax.jit(jax.vmap(one, in_axes=(None, 0, 0)))(params, x, y)
  g_NxP = np.concatenate([np.asarray(v).reshape(len(y), -1) for v in jax.tree.leaves(
      per_example)], axis=1).astype(np.float64)
  mean_P = g_NxP.mean(axis=0)
  tr_sigma = np.mean(np.sum((g_NxP - mean_P) ** 2, axis=1))
  got = noise_scale_fn(graphdef)(params, x, y)
  assert got["grad_sq"] == pytest.approx(np.sum(mean_P ** 2), rel=1e-4)
  assert got["tr_sigma"] == pytest.approx(tr_sigma, rel=1e-3)
  assert got["b_simple"] == pytest.approx(tr_sigma / np.sum(mean_P ** 2), rel=1e-3)


def test_copies_of_the_data_leave_it_unchanged_and_identical_examples_have_no_noise(setup):
  graphdef, params, x, y = setup
  scale = noise_scale_fn(graphdef)
  once = scale(params, x[:64], y[:64])["b_simple"]
  twice = scale(params, np.concatenate([x[:64]] * 2), np.concatenate([y[:64]] * 2))["b_simple"]
  assert twice == pytest.approx(once, rel=1e-4) and once > 1
  same = scale(params, np.repeat(x[:1], 32, axis=0), np.repeat(y[:1], 32))
  assert abs(same["b_simple"]) < 1e-3
