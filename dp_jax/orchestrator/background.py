"""A background training job: one independent copy of a model per device, synthetic data.

Each device holds its own parameters and optimizer state (no gradient sync, as DeepPool's
background tasks: one model per GPU) and runs a whole training step as one jitted program
whose batch is drawn on the device from a key seeded by (seed, device index, step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dp_jax.errors import UserError
from dp_jax.planner import memory
from dp_jax.runtime.loss import cross_entropy

GB = 1e9


@dataclass(eq=False)
class DeviceCopy:
  """One device's copy of the job: its state, data key and steps dispatched so far."""

  device: jax.Device
  state: tuple[Any, Any, Any]  # (params, rest, opt)
  key: jax.Array
  steps: int = 0


@dataclass(eq=False)
class BackgroundJob:
  """A background model trained independently on each of its devices."""

  name: str
  batch: int
  step_fn: Callable  # (params, rest, opt, key, step) -> (loss, params, rest, opt)
  copies: dict[int, DeviceCopy] = field(default_factory=dict)  # job device index -> copy

  def dispatch(self, index: int) -> jax.Array:
    """Start one step on device `index` (asynchronous); returns its loss (not waited for)."""
    c = self.copies[index]
    loss, *c.state = self.step_fn(*c.state, c.key, jnp.int32(c.steps))
    c.state = tuple(c.state)
    c.steps += 1
    return loss


def check_batch(batch: Any) -> int:
  """The per-device batch as an int >= 1, or a one-line UserError."""
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
    raise UserError(f"background batch_per_device must be an integer >= 1, got {batch!r}")
  return batch


def memory_bytes(graph, batch: int, state_copies: int = 3) -> float:
  """Params, grads and momentum (state_copies x param bytes) + saved activations at `batch`
  (the planner's memory model, dp_jax/planner/memory.py)."""
  return memory.job_bytes(graph, batch, grad_bytes_per_param=4,
                          optimizer_bytes_per_param=4 * (state_copies - 2))


def make_step(model, optimizer: optax.GradientTransformation, batch: int) -> Callable:
  """A jitted whole-model step drawing its own synthetic batch from (key, step)."""
  graphdef, _, _ = nnx.split(model, nnx.Param, ...)
  x_spec, y_spec = model.input_spec(batch), model.label_spec(batch)
  labels = int(getattr(model, "num_classes", None) or model.vocab_size)

  def step(params, rest, opt_state, key, i):
    kx, ky = jax.random.split(jax.random.fold_in(key, i))
    if jnp.issubdtype(x_spec.dtype, jnp.integer):
      x = jax.random.randint(kx, x_spec.shape, 0, labels, x_spec.dtype)
    else:
      x = jax.random.normal(kx, x_spec.shape, x_spec.dtype)
    y = jax.random.randint(ky, y_spec.shape, 0, labels, y_spec.dtype)

    def loss_fn(params):
      m = nnx.merge(graphdef, params, jax.tree.map(lambda a: a, rest))
      return cross_entropy(m(x), y), nnx.state(m, nnx.Not(nnx.Param))

    (loss, new_rest), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), new_rest, opt_state

  return jax.jit(step, donate_argnums=(0, 1, 2))


def build_job(name: str, model, optimizer: optax.GradientTransformation, batch: int,
              devices: dict[int, jax.Device], *, seed: int = 0) -> BackgroundJob:
  """Copies of `model` (its current values) with fresh optimizer state on each device."""
  batch = check_batch(batch)
  _, params, rest = nnx.split(model, nnx.Param, ...)
  job = BackgroundJob(name, batch, make_step(model, optimizer, batch))
  init = jax.jit(optimizer.init)
  for i, d in devices.items():
    p, r = jax.device_put((params, rest), d)
    key = jax.device_put(jax.random.fold_in(jax.random.key(seed), i), d)
    opt = jax.device_put(init(p), d)  # committed like the step's outputs (no recompile)
    job.copies[i] = DeviceCopy(d, (p, r, opt), key)
  return job
