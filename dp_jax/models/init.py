"""Weight initializers that sample on the host (numpy), seeded from the JAX key.

XLA:CPU compiles a separate RNG kernel for every distinct parameter shape (about a second
each), which made building Inception-v3 take ~40 s on a CPU. Sampling with numpy (directly
for a concrete key, through `jax.pure_callback` under `jax.jit` / `nnx.eval_shape`) costs
almost nothing to compile, and the same key gives the same values either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Initializer = Callable[[jax.Array, Sequence[int], Any], jax.Array]


def _fans(shape: Sequence[int]) -> tuple[int, int]:
  """(fan_in, fan_out) of a dense (in, out) or conv (kh, kw, in, out) kernel."""
  receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
  return shape[-2] * receptive, shape[-1] * receptive


def normal(std: float | Callable[[Sequence[int]], float]) -> Initializer:
  """N(0, std^2); std may be a function of the shape."""

  def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    shape = tuple(int(d) for d in shape)
    scale = float(std(shape) if callable(std) else std)

    def sample(key_data):
      rng = np.random.default_rng(np.asarray(key_data, dtype=np.uint32).ravel().tolist())
      return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    key_data = jax.random.key_data(key)
    try:
      out = jnp.asarray(sample(np.asarray(key_data)))  # concrete key: no XLA program at all
    except jax.errors.TracerArrayConversionError:
      out = jax.pure_callback(sample, jax.ShapeDtypeStruct(shape, jnp.float32), key_data)
    return out.astype(dtype)

  return init


def kaiming_normal_fan_out() -> Initializer:
  """He normal over fan_out, as torchvision initialises ResNet/VGG convolutions."""
  return normal(lambda shape: (2.0 / _fans(shape)[1]) ** 0.5)


def lecun_normal() -> Initializer:
  """N(0, 1/fan_in), for fully connected layers."""
  return normal(lambda shape: (1.0 / _fans(shape)[0]) ** 0.5)
