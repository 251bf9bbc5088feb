"""The training loss: mean softmax cross-entropy over every labelled position of the batch."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def cross_entropy(logits, labels):
  """Mean CE of integer labels: over samples (B,) or over all tokens (B, T); float32."""
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels).mean()
