"""A small MLP-Mixer (Tolstikhin et al. 2021) whose layers are a plain sequence.

It keeps its layers in `self.layers`, so dp_jax derives its layer specs (`layers.0`, ...)
and its forward from that sequence: nothing else to write but `input_spec` (ImageModel's).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import ImageModel


class Patches(nnx.Module):
  """(B, H, W, C) -> (B, patches, dim): non-overlapping patches, linearly projected."""

  def __init__(self, patch: int, dim: int, *, dtype: Any, rngs: nnx.Rngs):
    self.patch = patch
    self.proj = nnx.Linear(3 * patch * patch, dim, dtype=dtype, param_dtype=dtype, rngs=rngs)

  def __call__(self, x):
    b, h, w, c = x.shape
    p = self.patch
    x = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return self.proj(x.reshape(b, (h // p) * (w // p), p * p * c))


class MixerBlock(nnx.Module):
  """x + token-mixing MLP over patches, then x + channel-mixing MLP (pre-norm, GELU)."""

  def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int, *,
               dtype: Any, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.ln1, self.ln2 = nnx.LayerNorm(dim, **kw), nnx.LayerNorm(dim, **kw)
    self.tok1, self.tok2 = nnx.Linear(tokens, token_hidden, **kw), nnx.Linear(token_hidden,
                                                                             tokens, **kw)
    self.ch1, self.ch2 = nnx.Linear(dim, channel_hidden, **kw), nnx.Linear(channel_hidden,
                                                                          dim, **kw)

  def __call__(self, x):
    y = self.ln1(x).swapaxes(1, 2)
    x = x + self.tok2(jax.nn.gelu(self.tok1(y))).swapaxes(1, 2)
    return x + self.ch2(jax.nn.gelu(self.ch1(self.ln2(x))))


class MeanPool(nnx.Module):
  """(B, T, D) -> (B, D)."""

  def __call__(self, x):
    return x.mean(axis=1)


class Mixer(ImageModel):
  """Patches, `depth` mixer blocks, layer norm + mean over patches, a linear head."""

  def __init__(self, *, image_size: int = 32, num_classes: int = 10, patch: int = 8,
               dim: int = 64, depth: int = 2, token_hidden: int = 32, channel_hidden: int = 128,
               dtype: Any = jnp.float32, rngs: nnx.Rngs):
    self.image_size, self.num_classes = image_size, num_classes
    self.config = {"image_size": image_size, "patch": patch, "dim": dim, "depth": depth}
    kw = dict(dtype=dtype, rngs=rngs)
    tokens = (image_size // patch) ** 2
    self.layers = nnx.List([
        Patches(patch, dim, **kw),
        *[MixerBlock(tokens, dim, token_hidden, channel_hidden, **kw) for _ in range(depth)],
        nnx.LayerNorm(dim, dtype=dtype, param_dtype=dtype, rngs=rngs),
        MeanPool(),
        nnx.Linear(dim, num_classes, dtype=dtype, param_dtype=dtype, rngs=rngs)])
