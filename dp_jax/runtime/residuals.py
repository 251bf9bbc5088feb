"""What a non-last stage's forward program keeps for its backward program, and where it lives.

A stage that is not last runs its forward and its backward as two programs, so everything the
backward reads must be an output of the forward: a buffer written to memory, handed back to
Python as an array and passed in again. Plain jax.vjp keeps every intermediate the backward
uses (a tiny GPT-2 block: 36 arrays, 9.3 MB at batch 32); one fused forward+backward program
keeps far fewer, because XLA fuses the cheap elementwise work into the backward's kernels.
`saved` keeps only the outputs of matrix products and convolutions (5 arrays, 2.6 MB per
block); the backward recomputes the rest (norms, activations, softmax, pooling) from them.
The values are the same functions of the same inputs (gradients agree to rounding; the
exactness tests hold), only where they are computed moves. The planner's memory model still
counts plain jax.vjp's residuals (dp_jax/models/trace.py): more than these stages keep.

`stage_residuals` describes the residual leaves a stage's VJP holds until `bwd`: each with its
global shape, its sharding, the most bytes one device holds of it, and whether it grows with
the batch (its shape at twice the batch, from jax.eval_shape, differs). A leaf that grows with
the batch should be split over the "data" axis: at most 1/d of its global bytes on a device of
a (d, m) mesh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
from jax import lax

_KEPT = (lax.dot_general_p, lax.conv_general_dilated_p)


def saved(prim, *_, **__) -> bool:
  """jax.checkpoint policy: keep a value for the backward iff a matmul or convolution made it."""
  return prim in _KEPT


@dataclass(frozen=True)
class Residual:
  """One residual leaf of a stage's VJP."""

  shape: tuple[int, ...]
  dtype: str
  spec: str  # its PartitionSpec, as text
  global_bytes: int
  device_bytes: int  # the most any one device holds
  per_sample: bool  # grows with the batch


def stage_residuals(sp, params: Mapping[str, Any], stats: Mapping[str, Any],
                    tied: Mapping[str, Any], ins: Mapping[str, jax.Array],
                    x: jax.Array | None) -> tuple[Any, list[Residual]]:
  """Run stage program `sp`'s forward once on these arguments (its own layers' params and
  stats, tied values, inputs split by samples; the stats are donated): its VJP and a
  description of every residual leaf."""
  doubled = jax.eval_shape(sp.fwd, params, stats, tied, _doubled(ins), _doubled(x))[1]
  _, vjp, _ = sp.fwd(params, stats, tied, ins, x)
  rows = []
  for a, a2 in zip(jax.tree.leaves(vjp), jax.tree.leaves(doubled), strict=True):
    per_device: dict[Any, int] = {}
    for s in a.addressable_shards:
      per_device[s.device] = per_device.get(s.device, 0) + s.data.nbytes
    rows.append(Residual(tuple(a.shape), str(a.dtype), str(a.sharding.spec), int(a.nbytes),
                         max(per_device.values()), tuple(a2.shape) != tuple(a.shape)))
  return vjp, rows


def _doubled(tree):
  """ShapeDtypeStructs of `tree`'s arrays with twice the batch (leading axis), same sharding."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct((2 * a.shape[0], *a.shape[1:]), a.dtype,
                                                     sharding=a.sharding), tree)
