"""The local runtime's costs the per-layer profile does not see: stage calls, boundaries, update.

The planner prices compute, all-reduce and moves (dp_jax.planner.evaluate). Running a plan
also pays, per step: the host dispatch of its one program when it has one stage; what each
further stage adds in host work (its calls, hand-offs and cotangent plumbing, measured in place
on a toy model: `stage_us`); what each stage boundary adds in program time (the stage before it
runs split forward and backward programs instead of one fused program, the stage after it
starts from a program input), measured as two-stage cuts of the model beside the uncut model
(profile.meta["boundary_ms"], per per-device batch and cut position; dp_jax.profile.boundary);
and the optimizer update of every parameter unless the profile already includes it
(dp_jax.profile.loaded does not). All are measured (dp_jax.profile.local_links,
dp_jax.profile.in_context); the sum is added to evaluate()'s iteration_ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def overhead_ms(stage_layers: Sequence[Sequence[str]], params_of: Mapping[str, int], *,
                dispatch_us: float, stage_us: float, update_ns_per_param: float,
                boundary_ms: float = 0.0) -> float:
  """One dispatch, stage_us per stage after the first, the stage boundaries' program time
  (boundary_ms) and the update of every parameter; in ms."""
  params = sum(params_of.get(n, 0) for layers in stage_layers for n in layers)
  extra = max(len(stage_layers) - 1, 0)
  return ((dispatch_us + extra * stage_us) / 1e3 + boundary_ms
          + params * update_ns_per_param / 1e6)


def boundaries_ms(table: Mapping[str, Mapping[str, float]],
                  boundaries: Sequence[tuple[int, int, int]]) -> float:
  """The program time of stage boundaries (k: layers before the later stage, per-device batch
  of the stage before, of the stage after), from a profile's meta["boundary_ms"][batch][k]:
  the mean of the two batches' costs at k (linear in k between measured cuts, nearest outside;
  a batch not measured: the nearest measured one, scaled linearly); 0 without a table."""
  return sum((cost_at(table, b1, k) + cost_at(table, b2, k)) / 2 for k, b1, b2 in boundaries)


def cost_at(table: Mapping[str, Mapping[str, float]], batch: int, k: int) -> float:
  """table[batch] interpolated at k (see boundaries_ms)."""
  rows = {b: r for b, r in table.items() if r}
  if not rows:
    return 0.0
  near = min(rows, key=lambda s: abs(math.log(int(s) / batch)))
  xs = sorted(int(x) for x in rows[near])
  value = float(np.interp(k, xs, [rows[near][str(x)] for x in xs]))
  return value * batch / int(near)
