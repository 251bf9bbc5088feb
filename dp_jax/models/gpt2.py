"""GPT-2 style decoder (pre-LN, causal, GELU MLP) with the token embedding tied to the LM head.

The tie: `GPT2.lm_head.wte` IS the `nnx.Param` object `GPT2.embed.wte` (one Variable, two
owners). `nnx.split(model)` therefore holds it once, under the path ('embed', 'wte') (NNX
visits attributes in sorted order, so 'embed' comes before 'lm_head'), and gradients of the
whole model sum both uses. A runtime that splits the layers into separately jitted stages
sees the same Variable in the 'embed' layer and in the 'lm_head' layer: it must treat
'embed' as the owner (the traced graph gives lm_head params=0, attrs tied_to='embed'),
pass the embed's current wte value to the lm_head stage, and add the lm_head stage's
gradient for wte into the embed's gradient before the update. LMHead computes
logits_BxTxV = x_BxTxD @ wte.T (no bias).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.models import init, ops
from dp_jax.models.base import GraphModel, LayerSpec, chain

PRESETS = {"gpt2_small": dict(n_layer=12, d_model=768, n_head=12),
           "gpt2_medium": dict(n_layer=24, d_model=1024, n_head=16)}

_normal = init.normal


class Embed(nnx.Module):
  """Token + learned position embeddings; owns the tied token table wte (V x D)."""

  kind = "embed"

  def __init__(self, vocab_size: int, d_model: int, seq_len: int, *, dtype: Any,
               rngs: nnx.Rngs):
    self.vocab_size, self.d_model, self.seq_len = vocab_size, d_model, seq_len
    self.wte = nnx.Param(_normal(0.02)(rngs.params(), (vocab_size, d_model), dtype))
    self.wpe = nnx.Param(_normal(0.01)(rngs.params(), (seq_len, d_model), dtype))

  def __call__(self, tokens_BxT):
    t = tokens_BxT.shape[1]
    if t > self.seq_len:
      raise ValueError(f"sequence of {t} tokens is longer than seq_len={self.seq_len}")
    return jnp.take(self.wte[...], tokens_BxT, axis=0) + self.wpe[...][:t]

  def attrs(self) -> dict[str, Any]:
    return {"vocab_size": self.vocab_size, "d_model": self.d_model, "seq_len": self.seq_len}


class CausalSelfAttention(nnx.Module):
  """Multi-head causal self-attention with a fused qkv projection whose 3D output columns are
  ordered per head (q, k, v of head 0, then of head 1, ...), so splitting them into m
  contiguous blocks splits whole heads (the `heads` sharding needs no exchange of q, k, v)."""

  def __init__(self, d_model: int, n_head: int, proj_std: float, *, dtype: Any,
               rngs: nnx.Rngs):
    self.n_head = n_head
    lin = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.c_attn = nnx.Linear(d_model, 3 * d_model, kernel_init=_normal(0.02), **lin)
    self.c_proj = nnx.Linear(d_model, d_model, kernel_init=_normal(proj_std), **lin)

  def __call__(self, x_BxTxD):
    b, t, d = x_BxTxD.shape
    qkv_BxTxNx3xH = self.c_attn(x_BxTxD).reshape(b, t, self.n_head, 3, d // self.n_head)
    q, k, v = (qkv_BxTxNx3xH[:, :, :, i] for i in range(3))
    y_BxTxNxH = ops.causal_attention(q, k, v)
    return self.c_proj(y_BxTxNxH.reshape(b, t, d))


class MLP(nnx.Module):
  """D -> 4D -> GELU (tanh) -> D."""

  def __init__(self, d_model: int, proj_std: float, *, dtype: Any, rngs: nnx.Rngs):
    lin = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.c_fc = nnx.Linear(d_model, 4 * d_model, kernel_init=_normal(0.02), **lin)
    self.c_proj = nnx.Linear(4 * d_model, d_model, kernel_init=_normal(proj_std), **lin)

  def __call__(self, x_BxTxD):
    return self.c_proj(jax.nn.gelu(self.c_fc(x_BxTxD), approximate=True))


class TransformerBlock(nnx.Module):
  """Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(.)); one planner layer."""

  kind = "transformer_block"

  def __init__(self, d_model: int, n_head: int, seq_len: int, n_layer: int, *, dtype: Any,
               rngs: nnx.Rngs):
    self.d_model, self.n_head, self.seq_len = d_model, n_head, seq_len
    proj_std = 0.02 / (2 * n_layer) ** 0.5
    ln = dict(epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.ln_1 = nnx.LayerNorm(d_model, **ln)
    self.attn = CausalSelfAttention(d_model, n_head, proj_std, dtype=dtype, rngs=rngs)
    self.ln_2 = nnx.LayerNorm(d_model, **ln)
    self.mlp = MLP(d_model, proj_std, dtype=dtype, rngs=rngs)

  def __call__(self, x_BxTxD):
    x = x_BxTxD + self.attn(self.ln_1(x_BxTxD))
    return x + self.mlp(self.ln_2(x))

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.d_model, "n_head": self.n_head, "seq_len": self.seq_len}


class LayerNorm(nnx.LayerNorm):
  """Final layer norm (ln_f) as a planner layer."""

  kind = "layernorm"

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.num_features}


class LMHead(nnx.Module):
  """Logits from the tied token table: x_BxTxD @ wte.T; `wte` is the embed layer's Param."""

  kind = "lm_head"

  def __init__(self, wte: nnx.Param):
    self.wte = wte
    self.vocab_size, self.d_model = wte.shape

  def __call__(self, x_BxTxD):
    wte_VxD = self.wte[...]
    return jnp.einsum("btd,vd->btv", x_BxTxD.astype(wte_VxD.dtype), wte_VxD)

  def attrs(self) -> dict[str, Any]:
    return {"tied_to": "embed", "vocab_size": self.vocab_size, "d_model": self.d_model}


class GPT2(GraphModel):
  """GPT-2: embed, n_layer transformer blocks (h.i), ln_f, tied lm_head."""

  def __init__(self, *, n_layer: int = 12, d_model: int = 768, n_head: int = 12,
               seq_len: int = 1024, vocab_size: int = 50257, dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    self.seq_len, self.vocab_size = seq_len, vocab_size
    self.config = {"n_layer": n_layer, "d_model": d_model, "n_head": n_head,
                   "seq_len": seq_len, "vocab_size": vocab_size}
    self.embed = Embed(vocab_size, d_model, seq_len, dtype=dtype, rngs=rngs)
    self.h = nnx.List([TransformerBlock(d_model, n_head, seq_len, n_layer, dtype=dtype,
                                        rngs=rngs) for _ in range(n_layer)])
    self.ln_f = LayerNorm(d_model, epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.lm_head = LMHead(self.embed.wte)

  def __call__(self, tokens_BxT):
    x = self.embed(tokens_BxT)
    for block in self.h:
      x = block(x)
    return self.lm_head(self.ln_f(x))

  def layer_specs(self) -> list[LayerSpec]:
    items = [("embed", self.embed)] + [(f"h.{i}", b) for i, b in enumerate(self.h)]
    return chain(items + [("ln_f", self.ln_f), ("lm_head", self.lm_head)])

  def input_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.seq_len), jnp.int32)

  def label_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.seq_len), jnp.int32)


def _preset(name: str):
  size = PRESETS[name]

  def make(*, n_layer: int = size["n_layer"], d_model: int = size["d_model"],
           n_head: int = size["n_head"], seq_len: int = 1024, vocab_size: int = 50257,
           dtype: Any = jnp.float32, rngs: nnx.Rngs) -> GPT2:
    if d_model % n_head:
      raise UserError(f"d_model={d_model} for model {name} must be divisible by "
                      f"n_head={n_head}; pick n_head dividing d_model")
    return GPT2(n_layer=n_layer, d_model=d_model, n_head=n_head, seq_len=seq_len,
                vocab_size=vocab_size, dtype=dtype, rngs=rngs)

  make.__doc__ = f"GPT-2 {name.split('_')[1]}: {size}, 1024 tokens, the GPT-2 vocabulary."
  return make


gpt2_small = _preset("gpt2_small")
gpt2_medium = _preset("gpt2_medium")
