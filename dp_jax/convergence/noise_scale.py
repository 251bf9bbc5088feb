"""The simple gradient noise scale B_simple = tr(Sigma) / |G|^2, from per-example gradients.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", eq. 2.8): G is the true
gradient and Sigma the per-example gradient covariance. Here the distribution is the training
set itself (minibatches are drawn from it with replacement), so both are exact, not estimates:
G = mean_i g_i and tr(Sigma) = mean_i |g_i|^2 - |G|^2 over all N training examples.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dp_jax.convergence.steps_to_target import cross_entropy

CHUNK = 128  # examples per vmapped per-example-gradient batch (bounds memory)


def squared_norm(tree) -> jax.Array:
  """Sum of squares of every leaf of a pytree."""
  return sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree))


def noise_scale_fn(graphdef):
  """A function (params, x, y) -> B_simple and its parts (tr_sigma, grad_sq), jitted once."""
  grad = jax.grad(cross_entropy, argnums=1)

  @jax.jit
  def moments(params, x_NxHxWxC, y_N):
    """(mean_i |g_i|^2, |mean_i g_i|^2) over the examples."""

    def per_example(xy):
      x_HxWxC, y = xy
      return squared_norm(grad(graphdef, params, x_HxWxC[None], y[None]))

    sq_N = jax.lax.map(per_example, (x_NxHxWxC, y_N), batch_size=CHUNK)
    return jnp.mean(sq_N), squared_norm(grad(graphdef, params, x_NxHxWxC, y_N))

  def simple_noise_scale(params, x_NxHxWxC: np.ndarray, y_N: np.ndarray) -> dict:
    """B_simple = tr(Sigma) / |G|^2 at `params` over the given examples."""
    mean_sq, grad_sq = (float(v) for v in moments(params, jnp.asarray(x_NxHxWxC),
                                                   jnp.asarray(y_N)))
    tr_sigma = mean_sq - grad_sq
    return {"b_simple": tr_sigma / grad_sq if grad_sq > 0 else float("inf"),
            "tr_sigma": tr_sigma, "grad_sq": grad_sq}

  return simple_noise_scale
