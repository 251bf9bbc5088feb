"""Ops whose backward keeps only residuals computed from the data (so split by samples).

jax.vjp keeps, next to the data-derived residuals, every constant the linearised backward
reads: jax.nn.relu keeps a float32 array of zeros the size of its output, and
jax.nn.dot_product_attention(is_causal=True) keeps its causal mask and such a zeros array, both
broadcast to the batch's (B, N, T, T). Constants carry no sharding: returned from a stage's
forward program (runtime/step.py) GSPMD replicates them, so every device held them for the whole
global batch. These ops compute the same values and gradients without those constants.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


@jax.custom_vjp
def relu(x):
  """max(x, 0) with gradient 0 at 0, as jax.nn.relu; its backward keeps only the mask x > 0."""
  return jnp.maximum(x, 0)


def _relu_fwd(x):
  return jnp.maximum(x, 0), x > 0


def _relu_bwd(positive, g):
  return (jnp.where(positive, g, jnp.zeros((), g.dtype)),)


relu.defvjp(_relu_fwd, _relu_bwd)


def causal_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH):
  """jax.nn.dot_product_attention(q, k, v, is_causal=True) as its XLA form computes it
  (float32 logits scaled by 1/sqrt(H), softmax in float32), with the causal mask added as a
  T x S bias instead of selected per (batch, head): for float32 logits below 1e31 in magnitude
  the masked logits are the same -0.7 * float32 max, and nothing batch-sized is a constant."""
  h = q_BxTxNxH.shape[-1]
  t, s = q_BxTxNxH.shape[1], k_BxSxNxH.shape[1]
  logits_dtype = jnp.promote_types(q_BxTxNxH.dtype, np.float32)
  precision = {jnp.dtype(jnp.bfloat16): jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
               jnp.dtype(jnp.float16): jax.lax.DotAlgorithmPreset.F16_F16_F32}.get(
                   jnp.dtype(q_BxTxNxH.dtype))
  logits_BxNxTxS = jnp.einsum("BTNH,BSNH->BNTS", q_BxTxNxH, k_BxSxNxH, precision=precision,
                              preferred_element_type=logits_dtype)
  logits_BxNxTxS = logits_BxNxTxS * jnp.array(1.0 / np.sqrt(h), dtype=logits_dtype)
  large_negative = -0.7 * float(jnp.finfo(np.float32).max)
  bias_TxS = jnp.where(jnp.tril(jnp.ones((t, s), dtype=bool)), jnp.zeros((), logits_dtype),
                       jnp.asarray(large_negative, logits_dtype))
  logits_BxNxTxS = logits_BxNxTxS + bias_TxS
  probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS.astype(np.float32), axis=-1)
  return jnp.einsum("BNTS,BSNH->BTNH", probs_BxNxTxS.astype(k_BxSxNxH.dtype), v_BxSxNxH)
