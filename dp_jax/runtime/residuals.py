"""What a stage's forward keeps for its backward: the VJP's residual leaves and where they live.

A non-last stage's `fwd` program (runtime/step.py) returns its VJP; the residual leaves stay on
the stage's devices until `bwd`. Each leaf is reported with its global shape, its sharding and
the most bytes one device holds of it, and whether it grows with the batch (its shape at twice
the batch, from jax.eval_shape, differs). A leaf that grows with the batch should be split over
the "data" axis: at most 1/d of its global bytes on a device of a (d, m) mesh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax


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

