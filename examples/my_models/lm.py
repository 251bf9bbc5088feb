"""A small decoder-only language model whose blocks are fork/joins: attention and MLP read the
same input side by side and one join adds both to it (parallel blocks, as in GPT-J and PaLM).

Its layers are not a plain sequence, so it writes its own `layer_specs` (three planner layers
per block: `blocks.i.attn` and `blocks.i.mlp` fork from the block's input, `blocks.i.join`
closes the fork), and, as a token model, its own `input_spec` (int32 token ids, batch x
seq_len) and `label_spec` (int32 next-token ids, one per position whose logits the head
returns). `vocab_size` is the label range. docs/extending.md, "Token models".
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import GraphModel, LayerSpec, spec


class TokenEmbed(nnx.Module):
  """Token ids (B, T) -> token + learned position embeddings (B, T, D)."""

  kind = "embed"

  def __init__(self, vocab_size: int, seq_len: int, d_model: int, *, dtype: Any,
               rngs: nnx.Rngs):
    self.vocab_size, self.d_model = vocab_size, d_model
    self.tokens = nnx.Embed(vocab_size, d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.positions = nnx.Embed(seq_len, d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)

  def __call__(self, tokens_BxT):
    return self.tokens(tokens_BxT) + self.positions(jnp.arange(tokens_BxT.shape[1]))

  def attrs(self) -> dict[str, Any]:
    return {"vocab_size": self.vocab_size, "d_model": self.d_model}


class CausalAttention(nnx.Module):
  """Pre-norm multi-head causal self-attention, (B, T, D) -> (B, T, D) (the branch only).

  Kind `self_attention` (a known kind: the analytic model prices it on the matrix units)."""

  kind = "self_attention"

  def __init__(self, d_model: int, n_head: int, *, dtype: Any, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.d_model, self.n_head = d_model, n_head
    self.norm = nnx.LayerNorm(d_model, **kw)
    self.qkv = nnx.Linear(d_model, 3 * d_model, **kw)
    self.out = nnx.Linear(d_model, d_model, **kw)

  def __call__(self, x_BxTxD):
    b, t, d = x_BxTxD.shape
    h = self.n_head
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = jnp.split(
        self.qkv(self.norm(x_BxTxD)).reshape(b, t, 3 * h, d // h), 3, axis=2)
    scores_BxHxTxT = jnp.einsum("bqhk,bshk->bhqs", q_BxTxHxK, k_BxTxHxK) / jnp.sqrt(d // h)
    causal_TxT = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores_BxHxTxT = jnp.where(causal_TxT, scores_BxHxTxT, jnp.finfo(scores_BxHxTxT.dtype).min)
    y_BxTxHxK = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores_BxHxTxT, axis=-1),
                           v_BxTxHxK)
    return self.out(y_BxTxHxK.reshape(b, t, d))

  def attrs(self) -> dict[str, Any]:
    return {"dim": self.d_model, "heads": self.n_head, "dim_head": self.d_model // self.n_head}


class FeedForward(nnx.Module):
  """Pre-norm GELU MLP, (B, T, D) -> (B, T, D) (the branch only; kind `mlp_block`)."""

  kind = "mlp_block"

  def __init__(self, d_model: int, hidden: int, *, dtype: Any, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.d_model, self.hidden = d_model, hidden
    self.norm = nnx.LayerNorm(d_model, **kw)
    self.up, self.down = nnx.Linear(d_model, hidden, **kw), nnx.Linear(hidden, d_model, **kw)

  def __call__(self, x_BxTxD):
    return self.down(jax.nn.gelu(self.up(self.norm(x_BxTxD))))

  def attrs(self) -> dict[str, Any]:
    return {"dim": self.d_model, "hidden": self.hidden}


class Join(nnx.Module):
  """The block's output: its input plus both branches (no parameters)."""

  kind = "add"

  def __call__(self, x_BxTxD, attn_BxTxD, mlp_BxTxD):
    return x_BxTxD + attn_BxTxD + mlp_BxTxD


class ParallelBlock(nnx.Module):
  """One block: attn and mlp both read x; join adds them to x."""

  def __init__(self, d_model: int, n_head: int, hidden: int, *, dtype: Any, rngs: nnx.Rngs):
    self.attn = CausalAttention(d_model, n_head, dtype=dtype, rngs=rngs)
    self.mlp = FeedForward(d_model, hidden, dtype=dtype, rngs=rngs)
    self.join = Join()

  def __call__(self, x_BxTxD):
    return self.join(x_BxTxD, self.attn(x_BxTxD), self.mlp(x_BxTxD))


class ParallelLM(GraphModel):
  """Embeddings, `n_layer` parallel blocks, a final layer norm and a linear head to the
  vocabulary: logits (B, T, vocab_size) for int32 token ids (B, T)."""

  def __init__(self, *, vocab_size: int = 64, seq_len: int = 16, d_model: int = 32,
               n_layer: int = 2, n_head: int = 2, mlp_ratio: int = 4,
               dtype: Any = jnp.float32, rngs: nnx.Rngs):
    if d_model % n_head:
      raise ValueError(f"d_model={d_model} must be a multiple of n_head={n_head}")
    self.vocab_size, self.seq_len = vocab_size, seq_len
    self.config = {"vocab_size": vocab_size, "seq_len": seq_len, "d_model": d_model,
                   "n_layer": n_layer, "n_head": n_head}
    kw = dict(dtype=dtype, rngs=rngs)
    self.embed = TokenEmbed(vocab_size, seq_len, d_model, **kw)
    self.blocks = nnx.List([ParallelBlock(d_model, n_head, mlp_ratio * d_model, **kw)
                            for _ in range(n_layer)])
    self.norm = nnx.LayerNorm(d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
    self.head = nnx.Linear(d_model, vocab_size, use_bias=False, dtype=dtype, param_dtype=dtype,
                           rngs=rngs)

  def layer_specs(self) -> list[LayerSpec]:
    """embed, then per block attn and mlp side by side from its input and join closing the
    fork, then norm and head (the logits). Names are the modules' attribute paths."""
    specs, prev = [spec("embed", self.embed)], "embed"
    for i, block in enumerate(self.blocks):
      at = f"blocks.{i}"
      specs += [spec(f"{at}.attn", block.attn, [prev]), spec(f"{at}.mlp", block.mlp, [prev]),
                spec(f"{at}.join", block.join, [prev, f"{at}.attn", f"{at}.mlp"])]
      prev = f"{at}.join"
    return specs + [spec("norm", self.norm, [prev]), spec("head", self.head, ["norm"])]

  def __call__(self, tokens_BxT):
    x_BxTxD = self.embed(tokens_BxT)
    for block in self.blocks:
      x_BxTxD = block(x_BxTxD)
    return self.head(self.norm(x_BxTxD))

  def input_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.seq_len), jnp.int32)

  def label_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.seq_len), jnp.int32)
