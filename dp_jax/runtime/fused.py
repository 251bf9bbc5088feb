"""The baseline: the whole model as one jax.jit step on one mesh (batch sharded, params replicated).

Used as the data-parallel reference of scripts/bench_runtime.py and as the single-device
reference of the exactness tests. It runs the model's natural __call__ on nnx state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime.loss import cross_entropy


def fused_step(model, optimizer: optax.GradientTransformation,
               mesh: Mesh) -> tuple[Callable, tuple[Any, Any, Any]]:
  """(step, (params, rest, opt)): step(params, rest, opt, x, y) -> (loss, params, rest, opt)."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  rep = meshlib.replicated(mesh)
  params, rest = jax.device_put((params, rest), rep)
  opt_state = jax.jit(optimizer.init, out_shardings=rep)(params)

  def step(params, rest, opt_state, x, y):
    def loss_fn(params):
      # fresh Variables in this trace (batch norm writes its running statistics into them)
      m = nnx.merge(graphdef, params, jax.tree.map(lambda a: a, rest))
      loss = cross_entropy(m(x), y)
      return loss, nnx.state(m, nnx.Not(nnx.Param))

    (loss, new_rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), new_rest, opt_state

  return jax.jit(step, donate_argnums=(0, 1, 2)), (params, rest, opt_state)
