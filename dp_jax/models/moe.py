"""Mixture-of-experts decoders: Mixtral-style (8 experts, top-2) and DeepSeek-MoE-style
(fine-grained: many small routed experts, top-k, shared experts), on the Llama blocks.

Planner layers of an MoE block i (a fork/join block):

    layers.i.attn ──> layers.i.router ──> layers.i.experts
          └───────────(identity)──────────────┘

`attn` is llama.Attention (x + attn(rmsnorm(x))). `router` reads its output h and returns
[rmsnorm(h), gates] concatenated on the last axis (B x T x (D + E)): the normalised tokens the
experts compute on and their dense routing weights (k non-zeros per token). The norm lives in
the router so that one layer owns its weight (no parameter is shared between layers); the
experts need the normalised tokens, the router output carries them. `experts` (the join)
reads h (the residual) and the router's output and returns h + sum_k gate_k * expert_k(x)
(+ the shared experts' output). A dense block (DeepSeek-MoE's first) is llama.Block.

Token dispatch by capacity (GShard / Switch Transformer style), per sequence: each expert takes
at most C = ceil(capacity_factor * k * T / E) of the sequence's T tokens (at most T): the factor
times an even share of the k T assignments (Switch's definition for k = 1);
assignments past an expert's capacity are dropped (their gate's term is missing from the sum;
the residual carries the token). Priority: all first choices in token order, then all second
choices, and so on. The work runs on E x C slots, so the layer's FLOPs (from XLA, as for any
layer) are those of the active experts times the capacity factor, not of every expert on every
token. The math is in pure functions on arrays (`capacity`, `top_k_gates`, `route`,
`dispatch_slots`, `dispatch`, `expert_swiglu`, `combine`, `moe_ffn`), so an expert-parallel
runtime (shard_map with an all_to_all over an expert axis between `dispatch` and
`expert_swiglu` and back before `combine`: `moe_ffn_all_to_all`, which dp_jax/runtime/experts.py
runs) reuses them; `dropped_assignments` counts the
assignments a batch drops (the hook for a runtime to report them). There is no auxiliary
load-balancing loss: the runtime's loss is the cross-entropy (dp_jax/runtime/loss.py).

capacity_factor: 1.25 for the published shapes (a capacity factor Switch Transformers trains
with: Fedus, Zoph, Shazeer, JMLR 2022, Table 1). Mixtral's and DeepSeek-MoE's released modeling
code routes without a capacity limit (no token dropped); at 1.25 the graph prices 1.25 times the
active experts' work and the layer drops what overflows. model.kwargs.capacity_factor=<E/k>
sizes every expert for every token (C = T: nothing dropped, every expert's work on every
token). The tiny models default to E / k.

Published shapes (checked in tests/test_models_moe.py):
  mixtral_8x7b  mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, d 4096, 32 heads / 8 KV
                heads, 8 experts of SwiGLU 14336, top-2 (weights renormalised over the two),
                vocab 32000, rope_theta 1e6, rms_norm_eps 1e-5, untied. Counted here:
                46,702,792,704 parameters, 12,879,925,248 active (published: 46.7B total,
                12.9B per token: Mistral AI's Mixtral announcement, 2023-12-11; Jiang et al.,
                "Mixtral of Experts", arXiv:2401.04088, rounds them to 47B and 13B). seq_len
                4096: our choice (the published context is 32768; set model.seq_len).
  deepseek_moe_16b  deepseek-ai/deepseek-moe-16b-base config.json: 28 layers, d 2048, 16 heads
                (no GQA), vocab 102400, rope_theta 10000, rms_norm_eps 1e-6, untied; layer 0
                dense (first_k_dense_replace 1, SwiGLU 10944), layers 1-27 MoE: 64 routed
                experts of SwiGLU 1408, top-6 (softmax weights, not renormalised:
                norm_topk_prob false), 2 shared experts (one SwiGLU of 2 x 1408). Counted here:
                16,375,728,128 parameters, 2,828,650,496 active (published: 16.4B total, 2.8B
                activated: Dai et al., "DeepSeekMoE", arXiv:2401.06066, sec. 5, and the model
                card). seq_len 4096 (the paper's training sequence length, sec. 5.1).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.models import init, llama
from dp_jax.models.base import LayerSpec, spec

PUBLISHED_CAPACITY_FACTOR = 1.25


# --- the MoE math: pure functions on arrays of one group (one sequence of T tokens) ------------


def capacity(tokens: int, n_expert: int, top_k: int, capacity_factor: float) -> int:
  """C: the slots of each expert for a group of `tokens` tokens (1 <= C <= tokens)."""
  return max(1, min(tokens, math.ceil(capacity_factor * top_k * tokens / n_expert)))


def top_k_gates(logits_xE, top_k: int, normalize: bool):
  """Dense routing weights (float32 or wider) over the last axis: softmax over the experts, the
  top k kept (renormalised to sum 1 over them if `normalize`), every other weight exactly 0."""
  probs_xE = jax.nn.softmax(logits_xE.astype(jnp.promote_types(logits_xE.dtype, jnp.float32)),
                            axis=-1)
  w_xK, e_xK = jax.lax.top_k(probs_xE, top_k)
  if normalize:
    w_xK = w_xK / jnp.sum(w_xK, axis=-1, keepdims=True)
  onehot_xKxE = jax.nn.one_hot(e_xK, logits_xE.shape[-1], dtype=w_xK.dtype)
  return jnp.sum(w_xK[..., None] * onehot_xKxE, axis=-2)


def route(gates_TxE, top_k: int):
  """(weights_TxK, experts_TxK): the k largest gates of each token and their experts (the
  router's non-zeros; a weight that underflowed to 0 may pick another zero-weight expert, whose
  term is 0 either way)."""
  return jax.lax.top_k(gates_TxE, top_k)


def dispatch_slots(experts_TxK, n_expert: int, cap: int):
  """slots_TxK: the slot e * C + position of each assignment in its expert's buffer, or E * C
  (the drop slot) when the expert's C slots are taken; first choices before second ones, tokens
  in order."""
  t, k = experts_TxK.shape
  onehot_KTxE = jax.nn.one_hot(experts_TxK.T.reshape(k * t), n_expert, dtype=jnp.int32)
  # a log-depth scan: jnp.cumsum lowers to a reduce_window on CPU and GPU whose cost XLA counts
  # as (K T)^2 E (5% of DeepSeek-MoE's expert FLOPs at 4096 tokens); this is K T E log2(K T)
  count_KTxE = jax.lax.associative_scan(jnp.add, onehot_KTxE, axis=0)
  position_KT = jnp.sum((count_KTxE - 1) * onehot_KTxE, axis=-1)
  expert_KT = experts_TxK.T.reshape(k * t)
  slots_KT = jnp.where(position_KT < cap, expert_KT * cap + position_KT, n_expert * cap)
  return slots_KT.reshape(k, t).T


def dispatch(x_TxD, slots_TxK, n_expert: int, cap: int):
  """x_ExCxD: each expert's buffer of tokens (zeros in unused slots); a gather, no FLOPs."""
  t, k = slots_TxK.shape
  token_of_slot = jnp.full((n_expert * cap + 1,), t, jnp.int32).at[slots_TxK.reshape(-1)].set(
      jnp.repeat(jnp.arange(t, dtype=jnp.int32), k))
  x_padded = jnp.concatenate([x_TxD, jnp.zeros((1, x_TxD.shape[-1]), x_TxD.dtype)])
  return x_padded[token_of_slot[:n_expert * cap]].reshape(n_expert, cap, x_TxD.shape[-1])


def expert_swiglu(x_ExCxD, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD):
  """Every expert's SwiGLU on its own C slots: y_ExCxD."""
  h_ExCxF = (jax.nn.silu(jnp.einsum("ecd,edf->ecf", x_ExCxD, w_gate_ExDxF))
             * jnp.einsum("ecd,edf->ecf", x_ExCxD, w_up_ExDxF))
  return jnp.einsum("ecf,efd->ecd", h_ExCxF, w_down_ExFxD)


def combine(y_ExCxD, slots_TxK, weights_TxK):
  """y_TxD = sum_k weight_k * (the expert output of assignment k); dropped ones add nothing."""
  e, c, d = y_ExCxD.shape
  y_padded = jnp.concatenate([y_ExCxD.reshape(e * c, d), jnp.zeros((1, d), y_ExCxD.dtype)])
  return jnp.einsum("tk,tkd->td", weights_TxK.astype(y_ExCxD.dtype), y_padded[slots_TxK])


def moe_ffn(x_TxD, gates_TxE, w_gate_ExDxF, w_up_ExDxF, w_down_ExFxD, top_k: int, cap: int):
  """The routed experts of one group: route, dispatch, compute, combine."""
  n_expert = gates_TxE.shape[-1]
  weights_TxK, experts_TxK = route(gates_TxE, top_k)
  slots_TxK = dispatch_slots(experts_TxK, n_expert, cap)
  y_ExCxD = expert_swiglu(dispatch(x_TxD, slots_TxK, n_expert, cap), w_gate_ExDxF, w_up_ExDxF,
                          w_down_ExFxD)
  return combine(y_ExCxD, slots_TxK, weights_TxK)


def moe_ffn_all_to_all(x_BxTxD, gates_BxTxE, w_gate_LxDxF, w_up_LxDxF, w_down_LxFxD,
                       top_k: int, cap: int, axis_name: str):
  """The routed experts of B local groups under expert parallelism, inside shard_map: the m
  devices of `axis_name` each hold their own B sequences and L = E / m experts (device j:
  experts j L .. j L + L - 1, the weights' leading axis split over `axis_name`). Each device
  routes and dispatches its own sequences (E x C slots each, as moe_ffn), one all-to-all sends
  every expert's slots to the device holding it (m B groups of L x C slots there), the experts
  compute, and one all-to-all returns the outputs for the local combine. Per sequence the same
  slots and the same arithmetic as moe_ffn, so the result equals the unsplit layer."""
  n_expert = gates_BxTxE.shape[-1]
  weights_BxTxK, experts_BxTxK = jax.vmap(lambda g: route(g, top_k))(gates_BxTxE)
  slots_BxTxK = jax.vmap(lambda e: dispatch_slots(e, n_expert, cap))(experts_BxTxK)
  x_BxExCxD = jax.vmap(lambda x, s: dispatch(x, s, n_expert, cap))(x_BxTxD, slots_BxTxK)
  # expert e's slots to device e // L; received groups stacked source device by source device
  x_GxLxCxD = jax.lax.all_to_all(x_BxExCxD, axis_name, 1, 0, tiled=True)
  y_GxLxCxD = jax.vmap(expert_swiglu, in_axes=(0, None, None, None))(
      x_GxLxCxD, w_gate_LxDxF, w_up_LxDxF, w_down_LxFxD)
  y_BxExCxD = jax.lax.all_to_all(y_GxLxCxD, axis_name, 0, 1, tiled=True)  # back, experts in order
  return jax.vmap(combine)(y_BxExCxD, slots_BxTxK, weights_BxTxK)


def dropped_assignments(gates_BxTxE, top_k: int, cap: int):
  """Dropped token-expert assignments of each sequence (B,): the hook to report drops."""
  n_expert = gates_BxTxE.shape[-1]

  def one(gates_TxE):
    slots_TxK = dispatch_slots(route(gates_TxE, top_k)[1], n_expert, cap)
    return jnp.sum(slots_TxK == n_expert * cap)

  return jax.vmap(one)(gates_BxTxE)


# --- the layers --------------------------------------------------------------------------------


class Router(nnx.Module):
  """One planner layer: h -> [rmsnorm(h), gates] (B x T x (D + E)), gates = top_k_gates of the
  gate projection of rmsnorm(h), in the model dtype."""

  kind = "moe_router"

  def __init__(self, d_model: int, n_expert: int, top_k: int, seq_len: int, *,
               normalize: bool, norm_eps: float, dtype: Any, rngs: nnx.Rngs):
    self.d_model, self.n_expert, self.top_k, self.seq_len = d_model, n_expert, top_k, seq_len
    self.normalize = normalize
    self.norm = llama.RMSNorm(d_model, norm_eps, dtype=dtype)
    self.gate = llama.linear(d_model, n_expert, dtype=dtype, rngs=rngs)

  def __call__(self, h_BxTxD):
    x_BxTxD = self.norm(h_BxTxD)
    gates_BxTxE = top_k_gates(self.gate(x_BxTxD), self.top_k, self.normalize)
    return jnp.concatenate([x_BxTxD, gates_BxTxE.astype(x_BxTxD.dtype)], axis=-1)

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.d_model, "n_expert": self.n_expert, "top_k": self.top_k,
            "seq_len": self.seq_len, "normalize": self.normalize}


class Experts(nnx.Module):
  """One planner layer (the block's join): h + routed experts (+ shared experts) of the
  router's normalised tokens. Routed experts are stacked: w_gate, w_up E x D x F, w_down
  E x F x D."""

  kind = "moe_experts"

  def __init__(self, d_model: int, n_expert: int, top_k: int, ffn_dim: int, seq_len: int, *,
               capacity_factor: float, shared_ffn_dim: int = 0, dtype: Any, rngs: nnx.Rngs):
    self.d_model, self.n_expert, self.top_k, self.ffn_dim = d_model, n_expert, top_k, ffn_dim
    self.seq_len, self.capacity_factor, self.shared_ffn_dim = (seq_len, capacity_factor,
                                                               shared_ffn_dim)
    normal = init.normal(llama.STD)
    self.w_gate = nnx.Param(normal(rngs.params(), (n_expert, d_model, ffn_dim), dtype))
    self.w_up = nnx.Param(normal(rngs.params(), (n_expert, d_model, ffn_dim), dtype))
    self.w_down = nnx.Param(normal(rngs.params(), (n_expert, ffn_dim, d_model), dtype))
    self.shared = (llama.SwiGLU(d_model, shared_ffn_dim, dtype=dtype, rngs=rngs)
                   if shared_ffn_dim else None)

  def capacity(self, tokens: int) -> int:
    return capacity(tokens, self.n_expert, self.top_k, self.capacity_factor)

  def split(self, routed_BxTxR):
    """(x_BxTxD, gates_BxTxE) of the router's output."""
    return routed_BxTxR[..., :self.d_model], routed_BxTxR[..., self.d_model:]

  def __call__(self, h_BxTxD, routed_BxTxR):
    x_BxTxD, gates_BxTxE = self.split(routed_BxTxR)
    cap = self.capacity(h_BxTxD.shape[1])
    w = (self.w_gate[...], self.w_up[...], self.w_down[...])
    y_BxTxD = jax.vmap(lambda x, g: moe_ffn(x, g, *w, self.top_k, cap))(x_BxTxD, gates_BxTxE)
    if self.shared is not None:
      y_BxTxD = y_BxTxD + self.shared(x_BxTxD)
    return h_BxTxD + y_BxTxD

  def dropped(self, routed_BxTxR):
    """Dropped assignments per sequence (B,) for this layer's input (see dropped_assignments)."""
    gates_BxTxE = self.split(routed_BxTxR)[1]
    return dropped_assignments(gates_BxTxE, self.top_k, self.capacity(gates_BxTxE.shape[1]))

  def attrs(self) -> dict[str, Any]:
    return {"d_model": self.d_model, "n_expert": self.n_expert, "top_k": self.top_k,
            "ffn_dim": self.ffn_dim, "seq_len": self.seq_len,
            "capacity_factor": self.capacity_factor, "capacity": self.capacity(self.seq_len),
            "shared_ffn_dim": self.shared_ffn_dim}


class MoEBlock(nnx.Module):
  """attn -> router -> experts (the experts also read attn's output): three planner layers."""

  def __init__(self, d_model: int, n_head: int, n_kv_head: int, seq_len: int, *, n_expert: int,
               top_k: int, expert_ffn_dim: int, shared_ffn_dim: int, normalize: bool,
               capacity_factor: float, rope_theta: float, norm_eps: float, dtype: Any,
               rngs: nnx.Rngs):
    kw = dict(dtype=dtype, rngs=rngs)
    self.attn = llama.Attention(d_model, n_head, n_kv_head, seq_len, rope_theta=rope_theta,
                                norm_eps=norm_eps, **kw)
    self.router = Router(d_model, n_expert, top_k, seq_len, normalize=normalize,
                         norm_eps=norm_eps, **kw)
    self.experts = Experts(d_model, n_expert, top_k, expert_ffn_dim, seq_len,
                           capacity_factor=capacity_factor, shared_ffn_dim=shared_ffn_dim, **kw)

  def __call__(self, x_BxTxD):
    h_BxTxD = self.attn(x_BxTxD)
    return self.experts(h_BxTxD, self.router(h_BxTxD))

  def specs(self, name: str, input_name: str) -> list[LayerSpec]:
    return [spec(f"{name}.attn", self.attn, (input_name,)),
            spec(f"{name}.router", self.router, (f"{name}.attn",)),
            spec(f"{name}.experts", self.experts, (f"{name}.attn", f"{name}.router"))]


class MoE(llama.Llama):
  """A Llama decoder whose blocks from `first_dense` on are MoE blocks (the first ones dense,
  with SwiGLU ffn_dim)."""

  def __init__(self, *, n_layer: int, d_model: int, n_head: int, n_kv_head: int, seq_len: int,
               vocab_size: int, n_expert: int, top_k: int, expert_ffn_dim: int,
               capacity_factor: float, n_shared: int = 0, first_dense: int = 0,
               ffn_dim: int = 0, normalize: bool = True, rope_theta: float = 10000.0,
               norm_eps: float = 1e-5, dtype: Any = jnp.float32, rngs: nnx.Rngs,
               name: str = "moe"):
    llama.check_heads(name, d_model, n_head, n_kv_head)
    _check_moe(name, n_expert, top_k, capacity_factor, first_dense, n_layer, ffn_dim)
    self.seq_len, self.vocab_size = seq_len, vocab_size
    self.config = {"n_layer": n_layer, "d_model": d_model, "n_head": n_head,
                   "n_kv_head": n_kv_head, "seq_len": seq_len, "vocab_size": vocab_size,
                   "n_expert": n_expert, "top_k": top_k, "expert_ffn_dim": expert_ffn_dim,
                   "n_shared": n_shared, "first_dense": first_dense, "ffn_dim": ffn_dim,
                   "capacity_factor": capacity_factor, "normalize": normalize,
                   "rope_theta": rope_theta, "norm_eps": norm_eps}
    kw = dict(dtype=dtype, rngs=rngs)
    common = dict(rope_theta=rope_theta, norm_eps=norm_eps, **kw)
    self.embed = llama.Embed(vocab_size, d_model, **kw)
    self.layers = nnx.List([
        llama.Block(d_model, n_head, n_kv_head, ffn_dim, seq_len, **common) if i < first_dense
        else MoEBlock(d_model, n_head, n_kv_head, seq_len, n_expert=n_expert, top_k=top_k,
                      expert_ffn_dim=expert_ffn_dim, shared_ffn_dim=n_shared * expert_ffn_dim,
                      normalize=normalize, capacity_factor=capacity_factor, **common)
        for i in range(n_layer)])
    self.norm = llama.RMSNorm(d_model, norm_eps, dtype=dtype)
    self.lm_head = llama.LMHead(vocab_size, d_model, seq_len, **kw)


def _check_moe(name: str, n_expert: int, top_k: int, capacity_factor: Any, first_dense: int,
               n_layer: int, ffn_dim: int) -> None:
  if not 1 <= top_k <= n_expert:
    raise UserError(f"top_k={top_k} for model {name} must be between 1 and n_expert={n_expert} "
                    "(model.kwargs.top_k, model.kwargs.n_expert)")
  if (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, int | float)
      or not capacity_factor > 0 or not math.isfinite(capacity_factor)):
    raise UserError(f"capacity_factor={capacity_factor!r} for model {name} must be a positive "
                    f"number (model.kwargs.capacity_factor; {n_expert / top_k:g} = E/k drops no "
                    "token)")
  if first_dense and not ffn_dim:
    raise UserError(f"model {name}: {first_dense} dense block(s) need ffn_dim > 0")
  if first_dense > n_layer:
    raise UserError(f"model {name}: first_dense={first_dense} exceeds n_layer={n_layer}")


def mixtral_8x7b(*, n_layer: int = 32, d_model: int = 4096, n_head: int = 32,
                 seq_len: int = 4096, vocab_size: int = 32000, n_kv_head: int = 8,
                 n_expert: int = 8, top_k: int = 2, expert_ffn_dim: int = 14336,
                 capacity_factor: float = PUBLISHED_CAPACITY_FACTOR,
                 rope_theta: float = 1e6, dtype: Any = jnp.float32, rngs: nnx.Rngs) -> MoE:
  """Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1 config.json; see the module docstring)."""
  return MoE(n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_kv_head,
             seq_len=seq_len, vocab_size=vocab_size, n_expert=n_expert, top_k=top_k,
             expert_ffn_dim=expert_ffn_dim, capacity_factor=capacity_factor, normalize=True,
             rope_theta=rope_theta, norm_eps=1e-5, dtype=dtype, rngs=rngs, name="mixtral_8x7b")


def deepseek_moe_16b(*, n_layer: int = 28, d_model: int = 2048, n_head: int = 16,
                     seq_len: int = 4096, vocab_size: int = 102400, n_kv_head: int = 16,
                     n_expert: int = 64, top_k: int = 6, expert_ffn_dim: int = 1408,
                     n_shared: int = 2, first_dense: int = 1, ffn_dim: int = 10944,
                     capacity_factor: float = PUBLISHED_CAPACITY_FACTOR,
                     rope_theta: float = 10000.0, dtype: Any = jnp.float32,
                     rngs: nnx.Rngs) -> MoE:
  """DeepSeek-MoE 16B (deepseek-ai/deepseek-moe-16b-base config.json; see the module
  docstring)."""
  return MoE(n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_kv_head,
             seq_len=seq_len, vocab_size=vocab_size, n_expert=n_expert, top_k=top_k,
             expert_ffn_dim=expert_ffn_dim, capacity_factor=capacity_factor, n_shared=n_shared,
             first_dense=first_dense, ffn_dim=ffn_dim, normalize=False, rope_theta=rope_theta,
             norm_eps=1e-6, dtype=dtype, rngs=rngs, name="deepseek_moe_16b")


def mixtral_tiny(*, n_layer: int = 2, d_model: int = 32, n_head: int = 4, seq_len: int = 16,
                 vocab_size: int = 64, n_kv_head: int = 2, n_expert: int = 8, top_k: int = 2,
                 expert_ffn_dim: int = 64, capacity_factor: float | None = None,
                 dtype: Any = jnp.float32, rngs: nnx.Rngs) -> MoE:
  """Mixtral-style at test size; capacity_factor None: E / k (C = T, no token dropped)."""
  return MoE(n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_kv_head,
             seq_len=seq_len, vocab_size=vocab_size, n_expert=n_expert, top_k=top_k,
             expert_ffn_dim=expert_ffn_dim, normalize=True, dtype=dtype, rngs=rngs,
             capacity_factor=n_expert / top_k if capacity_factor is None else capacity_factor,
             name="mixtral_tiny")


def deepseek_moe_tiny(*, n_layer: int = 3, d_model: int = 32, n_head: int = 4,
                      seq_len: int = 16, vocab_size: int = 64, n_kv_head: int = 4,
                      n_expert: int = 16, top_k: int = 4, expert_ffn_dim: int = 16,
                      n_shared: int = 2, first_dense: int = 1, ffn_dim: int = 96,
                      capacity_factor: float | None = None, dtype: Any = jnp.float32,
                      rngs: nnx.Rngs) -> MoE:
  """DeepSeek-MoE-style at test size (a dense first block, 16 experts top-4, 2 shared);
  capacity_factor None: E / k (C = T, no token dropped)."""
  return MoE(n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_kv_head,
             seq_len=seq_len, vocab_size=vocab_size, n_expert=n_expert, top_k=top_k,
             expert_ffn_dim=expert_ffn_dim, n_shared=n_shared, first_dense=first_dense,
             ffn_dim=ffn_dim, normalize=False, dtype=dtype, rngs=rngs,
             capacity_factor=n_expert / top_k if capacity_factor is None else capacity_factor,
             name="deepseek_moe_tiny")


def param_counts(model: nnx.Module) -> dict[str, int]:
  """Total parameters of a model, and those one token uses (active: every parameter but the
  routed experts a token is not sent to, i.e. (E - k) / E of each Experts layer's routed
  weights). Works on abstract models (nnx.eval_shape): nothing is allocated."""
  total = sum(int(np.prod(p.shape, dtype=np.int64))
              for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  inactive = 0
  for _, m in nnx.iter_graph(model):
    if isinstance(m, Experts):
      routed = sum(int(np.prod(p.shape, dtype=np.int64)) for p in (m.w_gate, m.w_up, m.w_down))
      inactive += routed * (m.n_expert - m.top_k) // m.n_expert
  return {"total": total, "active": total - inactive}
