"""Llama-style decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, untied
embedding and head. Also the building blocks of the VLM (vlm.py) and MoE (moe.py) decoders.

Planner layers: `embed` (token table), per block `layers.i.attn` (x + attn(rmsnorm(x))) and
`layers.i.mlp` (x + swiglu(rmsnorm(x))), the final `norm` and the untied `lm_head`.
Tensor names: B batch, T tokens, D d_model, N query heads, K key/value heads, G = N / K query
heads per key/value head, H head_dim, F the MLP's hidden size, V the vocabulary.

Published shapes (the checkpoints' config.json on the Hugging Face hub; counts of this code,
checked in tests/test_models_llm.py against the published ones):
  llama3_8b   meta-llama/Meta-Llama-3-8B: 32 layers, d 4096, 32 heads / 8 KV heads, SwiGLU
              14336, vocab 128256, rope_theta 500000, rms_norm_eps 1e-5, untied; 8,030,261,248
              parameters (published: 8.03B, model card).
  llama3_70b  meta-llama/Meta-Llama-3-70B: 80 layers, d 8192, 64 heads / 8 KV heads, SwiGLU
              28672, vocab 128256, rope_theta 500000; 70,553,706,496 (published: 70.6B).
  seq_len 8192: Llama 3's pretraining sequence length ("We train the models on sequences of
  8,192 tokens", Meta's Llama 3 announcement, 2024-04-18).
  llama_tiny  a test size (2 layers, d 64, 4 heads / 2 KV heads, 16 tokens, vocabulary 128).

Initialisation: N(0, 0.02) for every matrix and table (config.json initializer_range 0.02),
ones for the norms. Attention is causal softmax attention as dp_jax/models/ops.py computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.models import init, ops
from dp_jax.models.base import GraphModel, LayerSpec, spec

STD = 0.02  # initializer_range of the Llama configs


def linear(d_in: int, d_out: int, *, dtype: Any, rngs: nnx.Rngs) -> nnx.Linear:
  """A bias-free projection (all Llama projections are)."""
  return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=init.normal(STD), dtype=dtype,
                    param_dtype=dtype, rngs=rngs)


class RMSNorm(nnx.Module):
  """x / sqrt(mean(x^2) + eps) * weight, the statistics in float32 or wider (as Llama computes
  them)."""

  kind = "rmsnorm"

  def __init__(self, dim: int, eps: float, *, dtype: Any):
    self.dim, self.eps = dim, eps
    self.weight = nnx.Param(jnp.ones((dim,), dtype))

  def __call__(self, x_BxTxD):
    x32 = x_BxTxD.astype(jnp.promote_types(x_BxTxD.dtype, jnp.float32))
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return y.astype(x_BxTxD.dtype) * self.weight[...]

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.dim}


def rope(x_BxTxNxH, theta: float):
  """Rotary position embedding of positions 0..T-1 in the rotate-half layout (the first and the
  second half of H are the two coordinates of each pair), computed in float32 or wider."""
  t, h = x_BxTxNxH.shape[1], x_BxTxNxH.shape[-1]
  wide = jnp.promote_types(x_BxTxNxH.dtype, jnp.float32)
  inv_freq_Hh = theta ** (-jnp.arange(0, h, 2, dtype=wide) / h)
  angle_TxHh = jnp.arange(t, dtype=wide)[:, None] * inv_freq_Hh[None]
  cos_Tx1xH = jnp.cos(jnp.concatenate([angle_TxHh, angle_TxHh], -1))[:, None]
  sin_Tx1xH = jnp.sin(jnp.concatenate([angle_TxHh, angle_TxHh], -1))[:, None]
  x = x_BxTxNxH.astype(wide)
  rotated = jnp.concatenate([-x[..., h // 2:], x[..., :h // 2]], axis=-1)
  return (x * cos_Tx1xH + rotated * sin_Tx1xH).astype(x_BxTxNxH.dtype)


def grouped_causal_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH):
  """Causal attention with K key/value heads shared by groups of G = N / K query heads (query
  head n reads key/value head n // G): ops.causal_attention mapped over the group axis, so the
  keys and values are never repeated. The backward recomputes the scores from q, k and v
  (jax.checkpoint saving nothing inside), as FlashAttention's backward does (Dao et al., 2022,
  sec. 3.1): the saved activations are q, k, v, not the B x N x T x T probabilities."""
  b, t, n, h = q_BxTxNxH.shape
  kv = k_BxSxKxH.shape[2]
  q_BxTxKxGxH = q_BxTxNxH.reshape(b, t, kv, n // kv, h)
  attend = jax.vmap(ops.causal_attention, in_axes=(3, None, None), out_axes=3)
  y_BxTxKxGxH = jax.checkpoint(attend, policy=jax.checkpoint_policies.nothing_saveable)(
      q_BxTxKxGxH, k_BxSxKxH, v_BxSxKxH)
  return y_BxTxKxGxH.reshape(b, t, n, h)


class Attention(nnx.Module):
  """One planner layer: x + W_o attn(rope(W_q h), rope(W_k h), W_v h), h = rmsnorm(x)."""

  kind = "gqa_attention"

  def __init__(self, d_model: int, n_head: int, n_kv_head: int, seq_len: int, *,
               rope_theta: float, norm_eps: float, dtype: Any, rngs: nnx.Rngs):
    self.d_model, self.n_head, self.n_kv_head, self.seq_len = d_model, n_head, n_kv_head, seq_len
    self.head_dim, self.rope_theta = d_model // n_head, rope_theta
    hd = self.head_dim
    kw = dict(dtype=dtype, rngs=rngs)
    self.norm = RMSNorm(d_model, norm_eps, dtype=dtype)
    self.q_proj = linear(d_model, n_head * hd, **kw)
    self.k_proj = linear(d_model, n_kv_head * hd, **kw)
    self.v_proj = linear(d_model, n_kv_head * hd, **kw)
    self.o_proj = linear(n_head * hd, d_model, **kw)

  def __call__(self, x_BxTxD):
    b, t, _ = x_BxTxD.shape
    n, kv, hd = self.n_head, self.n_kv_head, self.head_dim
    h_BxTxD = self.norm(x_BxTxD)
    q_BxTxNxH = rope(self.q_proj(h_BxTxD).reshape(b, t, n, hd), self.rope_theta)
    k_BxTxKxH = rope(self.k_proj(h_BxTxD).reshape(b, t, kv, hd), self.rope_theta)
    v_BxTxKxH = self.v_proj(h_BxTxD).reshape(b, t, kv, hd)
    y_BxTxNxH = grouped_causal_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH)
    return x_BxTxD + self.o_proj(y_BxTxNxH.reshape(b, t, n * hd))

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.d_model, "n_head": self.n_head, "n_kv_head": self.n_kv_head,
            "head_dim": self.head_dim, "seq_len": self.seq_len}


def swiglu(x_xD, w_gate_DxF, w_up_DxF, w_down_FxD):
  """down(silu(x @ gate) * (x @ up)) over the last axis: Llama's MLP, and each MoE expert's."""
  return (jax.nn.silu(x_xD @ w_gate_DxF) * (x_xD @ w_up_DxF)) @ w_down_FxD


class SwiGLU(nnx.Module):
  """The SwiGLU feed-forward network D -> F -> D (no norm, no residual)."""

  def __init__(self, d_model: int, ffn_dim: int, *, dtype: Any, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, rngs=rngs)
    self.gate_proj = linear(d_model, ffn_dim, **kw)
    self.up_proj = linear(d_model, ffn_dim, **kw)
    self.down_proj = linear(ffn_dim, d_model, **kw)

  def __call__(self, x_BxTxD):
    return swiglu(x_BxTxD, self.gate_proj.kernel[...], self.up_proj.kernel[...],
                  self.down_proj.kernel[...])


class MLP(nnx.Module):
  """One planner layer: x + swiglu(rmsnorm(x))."""

  kind = "swiglu_mlp"

  def __init__(self, d_model: int, ffn_dim: int, seq_len: int, *, norm_eps: float, dtype: Any,
               rngs: nnx.Rngs):
    self.d_model, self.ffn_dim, self.seq_len = d_model, ffn_dim, seq_len
    self.norm = RMSNorm(d_model, norm_eps, dtype=dtype)
    self.ffn = SwiGLU(d_model, ffn_dim, dtype=dtype, rngs=rngs)

  def __call__(self, x_BxTxD):
    return x_BxTxD + self.ffn(self.norm(x_BxTxD))

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.d_model, "ffn_dim": self.ffn_dim, "seq_len": self.seq_len}


class Embed(nnx.Module):
  """Token embedding: tokens_BxT -> rows of the V x D table wte (no positions: rope)."""

  kind = "embed"

  def __init__(self, vocab_size: int, d_model: int, *, dtype: Any, rngs: nnx.Rngs):
    self.vocab_size, self.d_model = vocab_size, d_model
    self.wte = nnx.Param(init.normal(STD)(rngs.params(), (vocab_size, d_model), dtype))

  def __call__(self, tokens_BxT):
    return jnp.take(self.wte[...], tokens_BxT, axis=0)

  def attrs(self) -> dict[str, Any]:
    return {"vocab_size": self.vocab_size, "d_model": self.d_model}


class LMHead(nnx.Module):
  """Untied head: logits_BxTxV = x_BxTxD @ wte.T with its own V x D table (named wte, as the
  lm_head contract of the planner has it). `skip` leading positions get no logits (a VLM's image
  positions, which carry no labels); seq_len is the number of positions it computes."""

  kind = "lm_head"

  def __init__(self, vocab_size: int, d_model: int, seq_len: int, *, skip: int = 0, dtype: Any,
               rngs: nnx.Rngs):
    self.vocab_size, self.d_model, self.seq_len, self.skip = vocab_size, d_model, seq_len, skip
    self.wte = nnx.Param(init.normal(STD)(rngs.params(), (vocab_size, d_model), dtype))

  def __call__(self, x_BxTxD):
    wte_VxD = self.wte[...]
    return jnp.einsum("btd,vd->btv", x_BxTxD[:, self.skip:].astype(wte_VxD.dtype), wte_VxD)

  def attrs(self) -> dict[str, Any]:
    return {"vocab_size": self.vocab_size, "d_model": self.d_model, "seq_len": self.seq_len}


class Block(nnx.Module):
  """A decoder block: the attention layer, then the MLP layer (two planner layers)."""

  def __init__(self, d_model: int, n_head: int, n_kv_head: int, ffn_dim: int, seq_len: int, *,
               rope_theta: float, norm_eps: float, dtype: Any, rngs: nnx.Rngs):
    self.attn = Attention(d_model, n_head, n_kv_head, seq_len, rope_theta=rope_theta,
                          norm_eps=norm_eps, dtype=dtype, rngs=rngs)
    self.mlp = MLP(d_model, ffn_dim, seq_len, norm_eps=norm_eps, dtype=dtype, rngs=rngs)

  def __call__(self, x_BxTxD):
    return self.mlp(self.attn(x_BxTxD))

  def specs(self, name: str, input_name: str) -> list[LayerSpec]:
    return [spec(f"{name}.attn", self.attn, (input_name,)),
            spec(f"{name}.mlp", self.mlp, (f"{name}.attn",))]


def block_specs(blocks: Sequence[nnx.Module], prefix: str, input_name: str) -> list[LayerSpec]:
  """The specs of decoder blocks run one after another (each block has `specs(name, input)`)."""
  specs: list[LayerSpec] = []
  for i, b in enumerate(blocks):
    specs += b.specs(f"{prefix}.{i}", specs[-1].name if specs else input_name)
  return specs


def check_heads(name: str, d_model: int, n_head: int, n_kv_head: int) -> None:
  """One-line errors for head counts the attention cannot use."""
  if d_model % n_head:
    raise UserError(f"d_model={d_model} for model {name} must be divisible by n_head={n_head}; "
                    "pick n_head dividing d_model")
  if n_head % n_kv_head:
    raise UserError(f"n_head={n_head} for model {name} must be divisible by "
                    f"n_kv_head={n_kv_head} (model.kwargs.n_kv_head); pick a divisor")
  if (d_model // n_head) % 2:
    raise UserError(f"head_dim = d_model / n_head = {d_model // n_head} for model {name} must be "
                    "even (rotary embeddings rotate pairs)")


class Llama(GraphModel):
  """Llama: embed, n_layer blocks (attn, mlp), norm, untied lm_head; next-token labels."""

  def __init__(self, *, n_layer: int, d_model: int, n_head: int, n_kv_head: int, ffn_dim: int,
               seq_len: int, vocab_size: int, rope_theta: float = 10000.0,
               norm_eps: float = 1e-5, dtype: Any = jnp.float32, rngs: nnx.Rngs,
               name: str = "llama"):
    check_heads(name, d_model, n_head, n_kv_head)
    self.seq_len, self.vocab_size = seq_len, vocab_size
    self.config = {"n_layer": n_layer, "d_model": d_model, "n_head": n_head,
                   "n_kv_head": n_kv_head, "ffn_dim": ffn_dim, "seq_len": seq_len,
                   "vocab_size": vocab_size, "rope_theta": rope_theta, "norm_eps": norm_eps}
    kw = dict(dtype=dtype, rngs=rngs)
    self.embed = Embed(vocab_size, d_model, **kw)
    self.layers = nnx.List([Block(d_model, n_head, n_kv_head, ffn_dim, seq_len,
                                  rope_theta=rope_theta, norm_eps=norm_eps, **kw)
                            for _ in range(n_layer)])
    self.norm = RMSNorm(d_model, norm_eps, dtype=dtype)
    self.lm_head = LMHead(vocab_size, d_model, seq_len, **kw)

  def __call__(self, tokens_BxT):
    x = self.embed(tokens_BxT)
    for block in self.layers:
      x = block(x)
    return self.lm_head(self.norm(x))

  def layer_specs(self) -> list[LayerSpec]:
    blocks = block_specs(self.layers, "layers", "embed")
    return [spec("embed", self.embed), *blocks, spec("norm", self.norm, (blocks[-1].name,)),
            spec("lm_head", self.lm_head, ("norm",))]

  def input_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.seq_len), jnp.int32)

  def label_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.seq_len), jnp.int32)


def _preset(name: str, n_layer: int, d_model: int, n_head: int, n_kv_head: int, ffn_dim: int,
            seq_len: int, vocab_size: int, rope_theta: float, doc: str):
  def make(*, n_layer: int = n_layer, d_model: int = d_model, n_head: int = n_head,
           seq_len: int = seq_len, vocab_size: int = vocab_size, n_kv_head: int = n_kv_head,
           ffn_dim: int = ffn_dim, rope_theta: float = rope_theta, dtype: Any = jnp.float32,
           rngs: nnx.Rngs) -> Llama:
    return Llama(n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_kv_head,
                 ffn_dim=ffn_dim, seq_len=seq_len, vocab_size=vocab_size, rope_theta=rope_theta,
                 dtype=dtype, rngs=rngs, name=name)

  make.__name__ = make.__qualname__ = name
  make.__doc__ = doc
  return make


llama3_8b = _preset("llama3_8b", 32, 4096, 32, 8, 14336, 8192, 128256, 500000.0,
                    "Llama-3 8B (meta-llama/Meta-Llama-3-8B config.json).")
llama3_70b = _preset("llama3_70b", 80, 8192, 64, 8, 28672, 8192, 128256, 500000.0,
                     "Llama-3 70B (meta-llama/Meta-Llama-3-70B config.json).")
llama_tiny = _preset("llama_tiny", 2, 64, 4, 2, 128, 16, 128, 10000.0,
                     "A Llama-style decoder of test size.")
