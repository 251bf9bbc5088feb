"""A small pre-norm Vision Transformer, its layers listed by hand in layer_specs().

Layers: `embed` (16x16 patches by a strided convolution, a class token, learned positions),
`blocks.i` (one pre-norm transformer block each: x + MHSA(LN(x)), then x + MLP(LN(x)), GELU),
`head` (LN of the class token, then a linear classifier).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import ImageModel, LayerSpec, chain


class PatchEmbedding(nnx.Module):
  """(B, H, W, 3) -> (B, 1 + patches, dim)."""

  def __init__(self, image_size: int, patch: int, dim: int, *, dtype: Any, rngs: nnx.Rngs):
    self.conv = nnx.Conv(3, dim, (patch, patch), strides=(patch, patch), padding="VALID",
                         dtype=dtype, param_dtype=dtype, rngs=rngs)
    tokens = (image_size // patch) ** 2 + 1
    init = nnx.initializers.normal(0.02)
    self.cls = nnx.Param(init(rngs.params(), (1, 1, dim), dtype))
    self.pos = nnx.Param(init(rngs.params(), (1, tokens, dim), dtype))

  def __call__(self, x):
    y = self.conv(x)
    b, h, w, d = y.shape
    y = y.reshape(b, h * w, d)
    cls = jnp.broadcast_to(self.cls[...], (b, 1, d)).astype(y.dtype)
    return jnp.concatenate([cls, y], axis=1) + self.pos[...]


class EncoderBlock(nnx.Module):
  """Pre-norm transformer block (one planner layer)."""

  def __init__(self, dim: int, heads: int, mlp_ratio: int, *, dtype: Any, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.ln1 = nnx.LayerNorm(dim, **kw)
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False, **kw)
    self.ln2 = nnx.LayerNorm(dim, **kw)
    self.fc1 = nnx.Linear(dim, mlp_ratio * dim, **kw)
    self.fc2 = nnx.Linear(mlp_ratio * dim, dim, **kw)

  def __call__(self, x):
    x = x + self.attn(self.ln1(x))
    return x + self.fc2(jax.nn.gelu(self.fc1(self.ln2(x))))


class ClassifierHead(nnx.Module):
  """LN of the class token, then logits."""

  def __init__(self, dim: int, num_classes: int, *, dtype: Any, rngs: nnx.Rngs):
    self.ln = nnx.LayerNorm(dim, dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.fc = nnx.Linear(dim, num_classes, dtype=dtype, param_dtype=dtype, rngs=rngs)

  def __call__(self, x):
    return self.fc(self.ln(x[:, 0]))


class ViT(ImageModel):
  """Patch embedding, `depth` encoder blocks, a classifier head."""

  def __init__(self, *, image_size: int = 32, num_classes: int = 10, patch: int = 8,
               dim: int = 64, depth: int = 2, heads: int = 2, mlp_ratio: int = 2,
               dtype: Any = jnp.float32, rngs: nnx.Rngs):
    self.image_size, self.num_classes = image_size, num_classes
    self.config = {"image_size": image_size, "patch": patch, "dim": dim, "depth": depth}
    kw = dict(dtype=dtype, rngs=rngs)
    self.embed = PatchEmbedding(image_size, patch, dim, **kw)
    self.blocks = nnx.List([EncoderBlock(dim, heads, mlp_ratio, **kw) for _ in range(depth)])
    self.head = ClassifierHead(dim, num_classes, **kw)

  def __call__(self, x):
    x = self.embed(x)
    for block in self.blocks:
      x = block(x)
    return self.head(x)

  def layer_specs(self) -> list[LayerSpec]:
    items = [("embed", self.embed)] + [(f"blocks.{i}", b) for i, b in enumerate(self.blocks)]
    return chain(items + [("head", self.head)])
