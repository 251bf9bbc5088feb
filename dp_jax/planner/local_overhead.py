"""The local runtime's costs the per-layer profile does not see: stage calls, boundaries, update.

The planner prices compute, all-reduce and moves (dp_jax.planner.evaluate). Running a plan
also pays, per step: the host dispatch of its one program when it has one stage; what each
further stage adds in host work (its calls, hand-offs and cotangent plumbing, measured in place
on a toy model: `stage_us`); the forward/backward split of every stage but the last, which
runs a forward and a backward program instead of one fused program (profile.meta
["split_extra_ms"], per layer); the start of every stage but the first, which runs its first
layers from a program input, apart from the layers before them (profile.meta
["stage_start_ms"], by the stage's first layer); both measured on two-stage cuts of the model
(dp_jax.profile.boundary); and the optimizer update of every parameter unless the profile
already includes it (dp_jax.profile.loaded does not). All are measured
(dp_jax.profile.local_links, dp_jax.profile.in_context); the sum is added to evaluate()'s
iteration_ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def overhead_ms(stage_layers: Sequence[Sequence[str]], params_of: Mapping[str, int], *,
                dispatch_us: float, stage_us: float, update_ns_per_param: float,
                split_ms: float = 0.0, start_ms: float = 0.0) -> float:
  """One dispatch, stage_us per stage after the first, the split of non-last stages (split_ms),
  the start of stages after the first (start_ms) and the update of every parameter; in ms."""
  params = sum(params_of.get(n, 0) for layers in stage_layers for n in layers)
  extra = max(len(stage_layers) - 1, 0)
  return ((dispatch_us + extra * stage_us) / 1e3 + split_ms + start_ms
          + params * update_ns_per_param / 1e6)


def split_extra_ms(split_extra: Mapping[str, Mapping[str, float]],
                   stages: Sequence[tuple[Sequence[str], int]]) -> float:
  """What the stages (layers, per-device batch) that are not the last cost more as split
  forward and backward programs, from a profile's meta["split_extra_ms"]."""
  return layer_table_ms(split_extra, stages)


def stage_start_ms(stage_start: Mapping[str, Mapping[str, float]],
                   stages: Sequence[tuple[str, int]]) -> float:
  """What the stages (first layer, per-device batch) that are not the first cost more at their
  start, from a profile's meta["stage_start_ms"]."""
  return layer_table_ms(stage_start, [([first], batch) for first, batch in stages])


def layer_table_ms(table: Mapping[str, Mapping[str, float]],
                   stages: Sequence[tuple[Sequence[str], int]]) -> float:
  """The sum over the stages' (layers, per-device batch) of table[layer][batch] (ms; a batch
  not measured: the nearest measured one, scaled linearly; 0 for a layer absent)."""
  total = 0.0
  for layers, batch in stages:
    for n in layers:
      rows = table.get(n) or {}
      if str(batch) in rows:
        total += rows[str(batch)]
      elif rows:
        near = min(rows, key=lambda s: abs(math.log(int(s) / batch)))
        total += rows[near] * batch / int(near)
  return total
