"""Vision Transformer in DeepPool's configuration (its examples/vit.py, runStrongScalingBench),
NHWC.

Layers, as DeepPool times them (vitLayerGpuProfileA100.txt): `embed` (patches -> linear, a
class token, learned positions; DeepPool's `prep`), per block an attention sub-block
`blocks.i.attn` (TransBlockA: post-norm, LN(x + W_o MHSA(x)), projections without bias) and an
MLP sub-block `blocks.i.mlp` (TransBlockB: LN(x + W_2 relu(W_1 x))), `pool` (the class token's
row; prepOut) and the linear `head`. Defaults: image 256, patch 16, dim 512, 6 blocks, 4 heads
of 128, MLP 1024, 1000 classes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.models import init, ops
from dp_jax.models.base import ImageModel, LayerSpec, chain
from dp_jax.models.layers import Linear

_normal = init.normal


class PatchEmbed(nnx.Module):
  """image_BxHxWxC -> (B, 1 + patches, dim): linear patch projection, class token, positions."""

  kind = "patch_embed"

  def __init__(self, image_size: int, patch_size: int, in_channels: int, dim: int, *,
               dtype: Any, rngs: nnx.Rngs):
    self.image_size, self.patch_size, self.in_channels, self.dim = (
        image_size, patch_size, in_channels, dim)
    tokens = (image_size // patch_size) ** 2
    self.proj = Linear(patch_size * patch_size * in_channels, dim, dtype=dtype, rngs=rngs)
    self.cls = nnx.Param(_normal(0.02)(rngs.params(), (1, dim), dtype))
    self.pos = nnx.Param(_normal(0.02)(rngs.params(), (tokens + 1, dim), dtype))

  def __call__(self, x_BxHxWxC):
    b, h, w, c = x_BxHxWxC.shape
    p = self.patch_size
    patches = x_BxHxWxC.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    tokens_BxTxD = self.proj(patches.reshape(b, (h // p) * (w // p), p * p * c))
    cls_Bx1xD = jnp.broadcast_to(self.cls[...][None], (b, 1, self.dim)).astype(tokens_BxTxD.dtype)
    return jnp.concatenate([cls_Bx1xD, tokens_BxTxD], axis=1) + self.pos[...]

  def attrs(self) -> dict[str, Any]:
    return {"image_size": self.image_size, "patch_size": self.patch_size,
            "in_channels": self.in_channels, "dim": self.dim}


def attention(q_BxTxNxH, k_BxTxNxH, v_BxTxNxH):
  """Softmax attention over all tokens (float32 logits scaled by 1/sqrt(H))."""
  h = q_BxTxNxH.shape[-1]
  logits_BxNxTxT = jnp.einsum("BTNH,BSNH->BNTS", q_BxTxNxH, k_BxTxNxH,
                              preferred_element_type=jnp.float32) / np.sqrt(h)
  probs_BxNxTxT = jax.nn.softmax(logits_BxNxTxT, axis=-1).astype(v_BxTxNxH.dtype)
  return jnp.einsum("BNTS,BSNH->BTNH", probs_BxNxTxT, v_BxTxNxH)


class SelfAttention(nnx.Module):
  """LN(x + W_o MHSA(x)) (post-norm); the fused qkv output is ordered per head (q, k, v)."""

  kind = "self_attention"

  def __init__(self, dim: int, heads: int, dim_head: int, *, dtype: Any, rngs: nnx.Rngs):
    self.dim, self.heads, self.dim_head = dim, heads, dim_head
    lin = dict(use_bias=False, dtype=dtype, rngs=rngs)
    self.qkv = Linear(dim, 3 * heads * dim_head, **lin)
    self.out = Linear(heads * dim_head, dim, **lin)
    self.norm = nnx.LayerNorm(dim, epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs)

  def __call__(self, x_BxTxD):
    b, t, _ = x_BxTxD.shape
    qkv_BxTxNx3xH = self.qkv(x_BxTxD).reshape(b, t, self.heads, 3, self.dim_head)
    q, k, v = (qkv_BxTxNx3xH[:, :, :, i] for i in range(3))
    y_BxTxNxH = attention(q, k, v)
    return self.norm(x_BxTxD + self.out(y_BxTxNxH.reshape(b, t, self.heads * self.dim_head)))

  def attrs(self) -> dict[str, Any]:
    return {"dim": self.dim, "heads": self.heads, "dim_head": self.dim_head}


class MLPBlock(nnx.Module):
  """LN(x + W_2 relu(W_1 x + b_1) + b_2) (post-norm)."""

  kind = "mlp_block"

  def __init__(self, dim: int, hidden: int, *, dtype: Any, rngs: nnx.Rngs):
    self.dim, self.hidden = dim, hidden
    self.fc1 = Linear(dim, hidden, dtype=dtype, rngs=rngs)
    self.fc2 = Linear(hidden, dim, dtype=dtype, rngs=rngs)
    self.norm = nnx.LayerNorm(dim, epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs)

  def __call__(self, x_BxTxD):
    return self.norm(x_BxTxD + self.fc2(ops.relu(self.fc1(x_BxTxD))))

  def attrs(self) -> dict[str, Any]:
    return {"dim": self.dim, "hidden": self.hidden}


class ClassToken(nnx.Module):
  """(B, T, D) -> (B, D): the class token's row."""

  kind = "class_token"

  def __call__(self, x_BxTxD):
    return x_BxTxD[:, 0]

  def attrs(self) -> dict[str, Any]:
    return {}


class Block(nnx.Module):
  """One transformer block: the attention sub-block, then the MLP sub-block (two layers)."""

  def __init__(self, dim: int, heads: int, dim_head: int, hidden: int, *, dtype: Any,
               rngs: nnx.Rngs):
    self.attn = SelfAttention(dim, heads, dim_head, dtype=dtype, rngs=rngs)
    self.mlp = MLPBlock(dim, hidden, dtype=dtype, rngs=rngs)


class ViT(ImageModel):
  """ViT: embed, n_layer blocks (attn, mlp), the class token's row, a linear head."""

  def __init__(self, *, image_size: int = 256, num_classes: int = 1000, n_layer: int = 6,
               d_model: int = 512, n_head: int = 4, patch_size: int = 16, mlp_dim: int = 1024,
               dim_head: int | None = None, dtype: Any = jnp.float32, rngs: nnx.Rngs):
    if image_size % patch_size:
      raise UserError(f"image_size={image_size} for model vit must be a multiple of "
                      f"patch_size={patch_size}")
    dim_head = dim_head or d_model // n_head
    if dim_head < 1:
      raise UserError(f"d_model={d_model} for model vit must be at least n_head={n_head}")
    self.image_size, self.num_classes = image_size, num_classes
    self.config = {"image_size": image_size, "num_classes": num_classes, "n_layer": n_layer,
                   "d_model": d_model, "n_head": n_head, "patch_size": patch_size,
                   "mlp_dim": mlp_dim, "dim_head": dim_head}
    kw = dict(dtype=dtype, rngs=rngs)
    self.embed = PatchEmbed(image_size, patch_size, 3, d_model, **kw)
    self.blocks = nnx.List([Block(d_model, n_head, dim_head, mlp_dim, **kw)
                            for _ in range(n_layer)])
    self.pool = ClassToken()
    self.head = Linear(d_model, num_classes, **kw)

  def __call__(self, x_BxHxWxC):
    x = self.embed(x_BxHxWxC)
    for block in self.blocks:
      x = block.mlp(block.attn(x))
    return self.head(self.pool(x))

  def layer_specs(self) -> list[LayerSpec]:
    items = [("embed", self.embed)]
    for i, block in enumerate(self.blocks):
      items += [(f"blocks.{i}.attn", block.attn), (f"blocks.{i}.mlp", block.mlp)]
    return chain(items + [("pool", self.pool), ("head", self.head)])
