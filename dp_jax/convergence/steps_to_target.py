"""Steps to a target test accuracy: every (learning rate, seed) of one batch size in one jit.

Runs are plain SGD with heavy-ball momentum (v <- mu v + g; w <- w - lr v, PyTorch's form) on
minibatches drawn i.i.d. with replacement from the training set (the sampling McCandlish et
al. 2018 assume), one independent data stream and initialisation per seed, shared by every
learning rate (common random numbers). All runs advance together under jax.vmap; test accuracy
is checked every `eval_every` steps and training stops once every seed of some learning rate
has reached the target (that learning rate's steps are then known, and any learning rate
without a majority of its seeds at the target has a larger median).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.convergence.digits import Split


@dataclass(frozen=True)
class Sweep:
  """What one batch size trains: its learning rates x seeds, target and budget."""

  batch: int
  lrs: tuple[float, ...]
  seeds: tuple[int, ...]
  target: float  # test accuracy in (0, 1]
  max_steps: int
  eval_every: int
  momentum: float = 0.9


@dataclass(frozen=True)
class Outcome:
  """Steps to the target per (lr, seed) (-1: not reached) and the parameters there."""

  steps_LxS: np.ndarray
  steps_run: int  # steps every run took before the loop stopped
  graphdef: Any
  params_at_target_R: Any  # R = L*S runs, lr-major; a run that never reached keeps its last


def check(sweep: Sweep) -> None:
  """UserError unless the sweep's numbers make sense."""
  if sweep.batch < 1 or sweep.max_steps < 1 or sweep.eval_every < 1:
    raise UserError(f"batch ({sweep.batch}), max_steps ({sweep.max_steps}) and eval_every "
                    f"({sweep.eval_every}) must be >= 1")
  if not sweep.lrs or not sweep.seeds or min(sweep.lrs) <= 0:
    raise UserError(f"learning rates {list(sweep.lrs)} must be positive and seeds "
                    f"{list(sweep.seeds)} non-empty")
  if not 0 < sweep.target <= 1:
    raise UserError(f"target accuracy {sweep.target} must be in (0, 1]")


def stacked_params(build, seeds: Sequence[int], copies: int):
  """graphdef and parameters of build(seed) stacked lr-major: run r = (r // S, r % S)."""
  models = [build(s) for s in seeds]
  graphdef = nnx.graphdef(models[0])
  states = [nnx.state(m, nnx.Param) for m in models]
  if any(jax.tree.leaves(nnx.state(m, nnx.Not(nnx.Param))) for m in models):
    raise UserError("steps to accuracy supports models whose only state is parameters "
                    "(no batch norm); use digits_cnn or digits_mlp")
  per_seed = jax.tree.map(lambda *a: jnp.stack(a), *states)
  return graphdef, jax.tree.map(lambda p: jnp.concatenate([p] * copies), per_seed)


def cross_entropy(graphdef, params, x_BxHxWxC, y_B):
  """Mean softmax cross-entropy of the model's logits."""
  logits_BxK = nnx.merge(graphdef, params)(x_BxHxWxC)
  logp_BxK = jax.nn.log_softmax(logits_BxK)
  return -jnp.mean(jnp.take_along_axis(logp_BxK, y_B[:, None], axis=1))


def accuracy(graphdef, params, x_MxHxWxC, y_M):
  """Fraction of test images classified correctly."""
  logits_MxK = nnx.merge(graphdef, params)(x_MxHxWxC)
  return jnp.mean(jnp.argmax(logits_MxK, axis=1) == y_M)


def train_to_target(build, data: Split, sweep: Sweep) -> Outcome:
  """Train every (lr, seed) of the sweep until the stopping rule above; steps to the target."""
  check(sweep)
  num_l, num_s = len(sweep.lrs), len(sweep.seeds)
  graphdef, params_R = stacked_params(build, sweep.seeds, num_l)
  lr_R = jnp.repeat(jnp.asarray(sweep.lrs, jnp.float32), num_s)
  key_R = jnp.stack([jax.random.key_data(jax.random.key(s)) for s in sweep.seeds] * num_l)
  x_tr, y_tr = jnp.asarray(data.x_train_Nx8x8x1), jnp.asarray(data.y_train_N)
  x_te, y_te = jnp.asarray(data.x_test_Mx8x8x1), jnp.asarray(data.y_test_M)
  n, b, mu = x_tr.shape[0], sweep.batch, sweep.momentum
  grad = jax.grad(cross_entropy, argnums=1)

  def sgd_step(t, params, vel, key_data, lr):
    """One momentum-SGD step of one run on batch t of its own data stream."""
    key = jax.random.fold_in(jax.random.wrap_key_data(key_data), t)
    idx_B = jax.random.randint(key, (b,), 0, n)
    g = grad(graphdef, params, x_tr[idx_B], y_tr[idx_B])
    vel = jax.tree.map(lambda v, gi: mu * v + gi, vel, g)
    return jax.tree.map(lambda p, v: p - lr * v, params, vel), vel

  steps = jax.vmap(sgd_step, in_axes=(None, 0, 0, 0, 0))
  acc = jax.vmap(accuracy, in_axes=(None, 0, None, None))

  def body(state):
    t, params, vel, reached, snap = state

    def one(i, pv):
      return steps(t + i, *pv, key_R, lr_R)

    params, vel = jax.lax.fori_loop(0, sweep.eval_every, one, (params, vel))
    t = t + sweep.eval_every
    new_R = (acc(graphdef, params, x_te, y_te) >= sweep.target) & (reached < 0)
    reached = jnp.where(new_R, t, reached)
    snap = jax.tree.map(lambda s, p: jnp.where(new_R.reshape((-1,) + (1,) * (p.ndim - 1)), p, s),
                        snap, params)
    return t, params, vel, reached, snap

  def cond(state):
    t, _, _, reached, _ = state
    some_lr_done = jnp.any(jnp.all((reached >= 0).reshape(num_l, num_s), axis=1))
    return (t < sweep.max_steps) & ~some_lr_done

  @jax.jit
  def run(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    init = (jnp.int32(0), params, zeros, jnp.full((num_l * num_s,), -1, jnp.int32), params)
    t, _, _, reached, snap = jax.lax.while_loop(cond, body, init)
    return t, reached, snap

  t, reached, snap = run(params_R)
  return Outcome(np.asarray(reached).reshape(num_l, num_s), int(t), graphdef, snap)


def median_steps(steps_S: np.ndarray) -> float:
  """Median over seeds, counting a seed that never reached the target as infinitely slow."""
  return float(np.median(np.where(steps_S >= 0, steps_S, np.inf)))


def best_lr(steps_LxS: np.ndarray) -> int:
  """Index of the learning rate with the fewest median steps (ties: the smaller index)."""
  medians = [median_steps(s) for s in steps_LxS]
  return int(np.argmin(medians)) if any(math.isfinite(m) for m in medians) else -1
