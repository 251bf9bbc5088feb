"""A LLaVA-style vision-language model: a CLIP ViT encoder, a 2-layer MLP projector and a
Llama decoder (llama.py) over [image tokens; text tokens].

The model input is one int32 array per sample: the image's S x S x 3 pixel values (0-255, the
uint8 image in row-major H, W, C order) followed by the T text token ids; the labels are the T
next-token ids of the text (`label_spec`), so the loss (mean cross-entropy over every labelled
position, dp_jax/runtime/loss.py) covers the text positions only: the head computes no logits
for the image positions, as LLaVA's labels ignore them. `image_prefix` (3 S^2) tells the data
loader which leading input values are pixels.

Planner layers (series-parallel: the vision tower is a fork/join branch beside an identity, so
the planner can give it devices of its own):

    inputs ──> vision.embed ──> vision.blocks.0 ... ──> projector ──> embed ──> layers.0.attn ...
       └──────────────────────(identity: the token ids)───────────────┘

`inputs` (the fork) turns the int32 input into float32: pixels normalised as CLIP's
preprocessing does, token ids as exact float32 integers (vocabularies below 2^24). The vision
branch embeds patches, runs the encoder blocks (one planner layer each) and projects the patch
features (the class token dropped) to the decoder width. `embed` (the join) embeds the token
ids and concatenates [image features; token embeddings]. Then the Llama decoder: attention and
MLP layers, `norm`, `lm_head` (logits of the text positions only).

Published shape `llava_1_5_7b` (LLaVA-1.5, Liu et al., "Improved Baselines with Visual
Instruction Tuning", arXiv:2310.03744; liuhaotian/llava-v1.5-7b config.json):
  vision: openai/clip-vit-large-patch14-336 (its config.json): 336 px, patch 14 (576 patches +
    a class token), width 1024, 16 heads, MLP 4096 (quick_gelu), pre-norm, layer_norm_eps 1e-5.
    LLaVA takes the features of the second-to-last of its 24 layers (mm_vision_select_layer
    -2, the patch tokens), so 23 blocks run; the 24th and the post-layernorm are never used and
    are not built (12,598,272 parameters fewer than the whole CLIP tower).
  projector: mlp2x_gelu, 1024 -> 4096 -> GELU -> 4096.
  decoder: lmsys/vicuna-7b-v1.5 (Llama-2 7B shape): 32 layers, d 4096, 32 heads (no GQA),
    SwiGLU 11008, vocab 32000, rope_theta 10000, rms_norm_eps 1e-5, untied.
  text tokens: seq_len 1472 = LLaVA-1.5's model_max_length 2048 minus the 576 image tokens.
  Counted here: 7,050,304,512 parameters (published: about 7.06B = Vicuna-7B 6.74B + CLIP
  ViT-L/14-336 0.30B + projector 0.02B; with the unused CLIP layer: 7,062,902,784).
`llava_tiny`: a test size (28 px images in 7 px patches, 2 encoder blocks of width 32, a 2-layer
decoder of width 64, 16 text tokens, vocabulary 128).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.models import init, llama
from dp_jax.models.base import GraphModel, LayerSpec, spec
from dp_jax.models.vit import attention

# CLIP's image normalisation (OpenAI CLIP, clip/clip.py `_transform`; the same numbers in
# openai/clip-vit-large-patch14-336 preprocessor_config.json image_mean / image_std)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_EXACT_TOKEN = 2 ** 24  # float32 holds every integer below this exactly


def _linear(d_in: int, d_out: int, *, bias: bool = True, dtype: Any, rngs: nnx.Rngs):
  return nnx.Linear(d_in, d_out, use_bias=bias, kernel_init=init.normal(llama.STD), dtype=dtype,
                    param_dtype=dtype, rngs=rngs)


def _layernorm(dim: int, *, dtype: Any, rngs: nnx.Rngs):
  return nnx.LayerNorm(dim, epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs)


class Inputs(nnx.Module):
  """The fork: input_BxL (int32, L = P + T) -> float32 B x L: the P pixel values normalised
  ((v / 255 - mean) / std per channel), the T token ids as exact floats. No parameters."""

  kind = "vlm_inputs"

  def __init__(self, image_size: int, seq_len: int):
    self.image_size, self.seq_len = image_size, seq_len
    self.pixels = 3 * image_size * image_size

  def __call__(self, input_BxL):
    b = input_BxL.shape[0]
    pixels_BxSxSx3 = input_BxL[:, :self.pixels].reshape(b, self.image_size, self.image_size, 3)
    mean, std = np.asarray(CLIP_MEAN, np.float32), np.asarray(CLIP_STD, np.float32)
    normed_BxSxSx3 = (pixels_BxSxSx3.astype(jnp.float32) / 255.0 - mean) / std
    tokens_BxT = input_BxL[:, self.pixels:].astype(jnp.float32)
    return jnp.concatenate([normed_BxSxSx3.reshape(b, self.pixels), tokens_BxT], axis=1)

  def attrs(self) -> dict[str, Any]:
    return {"image_size": self.image_size, "seq_len": self.seq_len}


class VisionEmbed(nnx.Module):
  """CLIP's embeddings: the pixels of the inputs layer's output as S/p x S/p patches -> linear
  (no bias), a class token, learned positions, then CLIP's pre-layernorm: B x (1 + S^2/p^2) x W."""

  kind = "patch_embed"

  def __init__(self, image_size: int, patch_size: int, dim: int, *, dtype: Any,
               rngs: nnx.Rngs):
    self.image_size, self.patch_size, self.in_channels, self.dim = image_size, patch_size, 3, dim
    tokens = (image_size // patch_size) ** 2
    normal = init.normal(llama.STD)
    self.proj = _linear(3 * patch_size * patch_size, dim, bias=False, dtype=dtype, rngs=rngs)
    self.cls = nnx.Param(normal(rngs.params(), (1, dim), dtype))
    self.pos = nnx.Param(normal(rngs.params(), (tokens + 1, dim), dtype))
    self.pre_norm = _layernorm(dim, dtype=dtype, rngs=rngs)

  def __call__(self, inputs_BxL):
    b, s, p = inputs_BxL.shape[0], self.image_size, self.patch_size
    dtype = self.proj.kernel.dtype
    image = inputs_BxL[:, :3 * s * s].reshape(b, s // p, p, s // p, p, 3).astype(dtype)
    patches_BxNxF = image.transpose(0, 1, 3, 2, 4, 5).reshape(b, (s // p) ** 2, p * p * 3)
    tokens_BxNxW = self.proj(patches_BxNxF)
    cls_Bx1xW = jnp.broadcast_to(self.cls[...][None], (b, 1, self.dim))
    return self.pre_norm(jnp.concatenate([cls_Bx1xW, tokens_BxNxW], axis=1) + self.pos[...])

  def attrs(self) -> dict[str, Any]:
    return {"image_size": self.image_size, "patch_size": self.patch_size,
            "in_channels": self.in_channels, "dim": self.dim}


def quick_gelu(x):
  """CLIP's activation: x * sigmoid(1.702 x)."""
  return x * jax.nn.sigmoid(1.702 * x)


class VisionBlock(nnx.Module):
  """One planner layer, a CLIP encoder block (pre-norm): x + attn(ln1(x)), then
  + fc2(quick_gelu(fc1(ln2(.)))); attention over all tokens, projections with biases."""

  kind = "vit_block"

  def __init__(self, dim: int, n_head: int, mlp_dim: int, tokens: int, *, dtype: Any,
               rngs: nnx.Rngs):
    self.dim, self.n_head, self.mlp_dim, self.tokens = dim, n_head, mlp_dim, tokens
    kw = dict(dtype=dtype, rngs=rngs)
    self.ln1 = _layernorm(dim, **kw)
    self.q_proj, self.k_proj, self.v_proj = (_linear(dim, dim, **kw) for _ in range(3))
    self.out_proj = _linear(dim, dim, **kw)
    self.ln2 = _layernorm(dim, **kw)
    self.fc1 = _linear(dim, mlp_dim, **kw)
    self.fc2 = _linear(mlp_dim, dim, **kw)

  def __call__(self, x_BxNxW):
    b, n, w = x_BxNxW.shape
    h = self.ln1(x_BxNxW)
    q, k, v = (proj(h).reshape(b, n, self.n_head, w // self.n_head)
               for proj in (self.q_proj, self.k_proj, self.v_proj))
    x_BxNxW = x_BxNxW + self.out_proj(attention(q, k, v).reshape(b, n, w))
    return x_BxNxW + self.fc2(quick_gelu(self.fc1(self.ln2(x_BxNxW))))

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.dim, "n_head": self.n_head, "mlp_dim": self.mlp_dim,
            "seq_len": self.tokens}


class VisionTower(nnx.Module):
  """The encoder: embed and its blocks (not a layer itself)."""

  def __init__(self, image_size: int, patch_size: int, dim: int, n_head: int, mlp_dim: int,
               n_layer: int, *, dtype: Any, rngs: nnx.Rngs):
    tokens = (image_size // patch_size) ** 2 + 1
    self.embed = VisionEmbed(image_size, patch_size, dim, dtype=dtype, rngs=rngs)
    self.blocks = nnx.List([VisionBlock(dim, n_head, mlp_dim, tokens, dtype=dtype, rngs=rngs)
                            for _ in range(n_layer)])


class Projector(nnx.Module):
  """One planner layer: the patch features (class token dropped) -> linear -> GELU -> linear:
  B x N x W -> B x (N - 1) x D (LLaVA-1.5's mlp2x_gelu)."""

  kind = "projector"

  def __init__(self, dim: int, d_model: int, *, dtype: Any, rngs: nnx.Rngs):
    self.dim, self.d_model = dim, d_model
    self.fc1 = _linear(dim, d_model, dtype=dtype, rngs=rngs)
    self.fc2 = _linear(d_model, d_model, dtype=dtype, rngs=rngs)

  def __call__(self, x_BxNxW):
    return self.fc2(jax.nn.gelu(self.fc1(x_BxNxW[:, 1:]), approximate=False))

  def attrs(self) -> dict[str, Any]:
    return {"in_features": self.dim, "hidden": self.d_model, "out_features": self.d_model}


class Embed(llama.Embed):
  """The join: [image features; token embeddings] (B x (I + T) x D) of the inputs layer's token
  ids (its last T values) and the projector's image features (B x I x D)."""

  def __init__(self, vocab_size: int, d_model: int, image_tokens: int, seq_len: int, *,
               dtype: Any, rngs: nnx.Rngs):
    super().__init__(vocab_size, d_model, dtype=dtype, rngs=rngs)
    self.image_tokens, self.seq_len = image_tokens, seq_len

  def __call__(self, inputs_BxL, image_BxIxD):
    tokens_BxT = inputs_BxL[:, inputs_BxL.shape[1] - self.seq_len:].astype(jnp.int32)
    text_BxTxD = super().__call__(tokens_BxT)
    return jnp.concatenate([image_BxIxD.astype(text_BxTxD.dtype), text_BxTxD], axis=1)

  def attrs(self) -> dict[str, Any]:
    return {**super().attrs(), "image_tokens": self.image_tokens, "seq_len": self.seq_len}


class VLM(GraphModel):
  """LLaVA-style: inputs (fork), vision tower, projector, embed (join), Llama decoder."""

  def __init__(self, *, image_size: int, patch_size: int, vision_dim: int, vision_n_head: int,
               vision_mlp_dim: int, vision_layers: int, n_layer: int, d_model: int, n_head: int,
               n_kv_head: int, ffn_dim: int, seq_len: int, vocab_size: int,
               rope_theta: float = 10000.0, norm_eps: float = 1e-5, dtype: Any = jnp.float32,
               rngs: nnx.Rngs, name: str = "vlm"):
    llama.check_heads(name, d_model, n_head, n_kv_head)
    if image_size % patch_size:
      raise UserError(f"image_size={image_size} for model {name} must be a multiple of "
                      f"patch_size={patch_size} (model.kwargs.patch_size)")
    if vision_dim % vision_n_head:
      raise UserError(f"vision_dim={vision_dim} for model {name} must be divisible by "
                      f"vision_n_head={vision_n_head} (model.kwargs)")
    if vocab_size >= MAX_EXACT_TOKEN:
      raise UserError(f"vocab_size={vocab_size} for model {name} must be below 2^24 (token ids "
                      "travel as float32 beside the image)")
    self.image_size, self.seq_len, self.vocab_size = image_size, seq_len, vocab_size
    self.image_prefix = 3 * image_size * image_size  # leading input values that are pixels
    self.image_tokens = (image_size // patch_size) ** 2
    self.config = {"image_size": image_size, "patch_size": patch_size, "vision_dim": vision_dim,
                   "vision_n_head": vision_n_head, "vision_mlp_dim": vision_mlp_dim,
                   "vision_layers": vision_layers, "n_layer": n_layer, "d_model": d_model,
                   "n_head": n_head, "n_kv_head": n_kv_head, "ffn_dim": ffn_dim,
                   "seq_len": seq_len, "vocab_size": vocab_size, "rope_theta": rope_theta,
                   "norm_eps": norm_eps}
    kw = dict(dtype=dtype, rngs=rngs)
    tokens = self.image_tokens + seq_len  # the decoder's sequence
    self.inputs = Inputs(image_size, seq_len)
    self.vision = VisionTower(image_size, patch_size, vision_dim, vision_n_head, vision_mlp_dim,
                              vision_layers, **kw)
    self.projector = Projector(vision_dim, d_model, **kw)
    self.embed = Embed(vocab_size, d_model, self.image_tokens, seq_len, **kw)
    self.layers = nnx.List([llama.Block(d_model, n_head, n_kv_head, ffn_dim, tokens,
                                        rope_theta=rope_theta, norm_eps=norm_eps, **kw)
                            for _ in range(n_layer)])
    self.norm = llama.RMSNorm(d_model, norm_eps, dtype=dtype)
    self.lm_head = llama.LMHead(vocab_size, d_model, seq_len, skip=self.image_tokens, **kw)

  def __call__(self, input_BxL):
    inputs = self.inputs(input_BxL)
    v = self.vision.embed(inputs)
    for block in self.vision.blocks:
      v = block(v)
    x = self.embed(inputs, self.projector(v))
    for block in self.layers:
      x = block(x)
    return self.lm_head(self.norm(x))

  def layer_specs(self) -> list[LayerSpec]:
    vision = [("vision.embed", self.vision.embed)] + [
        (f"vision.blocks.{i}", b) for i, b in enumerate(self.vision.blocks)]
    specs = [spec("inputs", self.inputs)]
    for name, module in vision + [("projector", self.projector)]:
      specs.append(spec(name, module, (specs[-1].name,)))
    specs.append(spec("embed", self.embed, ("inputs", "projector")))
    blocks = llama.block_specs(self.layers, "layers", "embed")
    return [*specs, *blocks, spec("norm", self.norm, (blocks[-1].name,)),
            spec("lm_head", self.lm_head, ("norm",))]

  def input_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.image_prefix + self.seq_len), jnp.int32)

  def label_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.seq_len), jnp.int32)


def llava_1_5_7b(*, image_size: int = 336, n_layer: int = 32, d_model: int = 4096,
                 n_head: int = 32, seq_len: int = 1472, vocab_size: int = 32000,
                 n_kv_head: int = 32, ffn_dim: int = 11008, patch_size: int = 14,
                 vision_dim: int = 1024, vision_n_head: int = 16, vision_mlp_dim: int = 4096,
                 vision_layers: int = 23, dtype: Any = jnp.float32, rngs: nnx.Rngs) -> VLM:
  """LLaVA-1.5 7B (see the module docstring for the sources of every size)."""
  return VLM(image_size=image_size, patch_size=patch_size, vision_dim=vision_dim,
             vision_n_head=vision_n_head, vision_mlp_dim=vision_mlp_dim,
             vision_layers=vision_layers, n_layer=n_layer, d_model=d_model, n_head=n_head,
             n_kv_head=n_kv_head, ffn_dim=ffn_dim, seq_len=seq_len, vocab_size=vocab_size,
             dtype=dtype, rngs=rngs, name="llava_1_5_7b")


def llava_tiny(*, image_size: int = 28, n_layer: int = 2, d_model: int = 64, n_head: int = 4,
               seq_len: int = 16, vocab_size: int = 128, n_kv_head: int = 4, ffn_dim: int = 128,
               patch_size: int = 7, vision_dim: int = 32, vision_n_head: int = 2,
               vision_mlp_dim: int = 64, vision_layers: int = 2, dtype: Any = jnp.float32,
               rngs: nnx.Rngs) -> VLM:
  """A LLaVA-style model of test size."""
  return VLM(image_size=image_size, patch_size=patch_size, vision_dim=vision_dim,
             vision_n_head=vision_n_head, vision_mlp_dim=vision_mlp_dim,
             vision_layers=vision_layers, n_layer=n_layer, d_model=d_model, n_head=n_head,
             n_kv_head=n_kv_head, ffn_dim=ffn_dim, seq_len=seq_len, vocab_size=vocab_size,
             dtype=dtype, rngs=rngs, name="llava_tiny")
