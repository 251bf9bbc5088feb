"""What a non-last stage's forward program keeps for its backward program.

A stage that is not last runs its forward and its backward as two programs, so everything the
backward reads must be an output of the forward: a buffer written to memory, handed back to
Python as an array and passed in again. Plain jax.vjp keeps every intermediate the backward
uses (a tiny GPT-2 block: 36 arrays, 9.3 MB at batch 32); one fused forward+backward program
keeps far fewer, because XLA fuses the cheap elementwise work into the backward's kernels.
`saved` keeps only the outputs of matrix products and convolutions (5 arrays, 2.6 MB per
block); the backward recomputes the rest (norms, activations, softmax, pooling) from them.
The values are the same functions of the same inputs (gradients agree to rounding; the
exactness tests hold), only where they are computed moves. The planner's memory model still
counts plain jax.vjp's residuals (dp_jax/trace.py): more than these stages keep.
"""

from __future__ import annotations

from jax import lax

_KEPT = (lax.dot_general_p, lax.conv_general_dilated_p)


def saved(prim, *_, **__) -> bool:
  """jax.checkpoint policy: keep a value for the backward iff a matmul or convolution made it."""
  return prim in _KEPT
