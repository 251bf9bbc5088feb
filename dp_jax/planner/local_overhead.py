"""The local runtime's costs the per-layer profile does not see: stage calls and the update.

The planner prices compute, all-reduce and moves (dp_jax.planner.evaluate). Running a plan
also pays, per step: the host dispatch of its one program when it has one stage; what each
further stage adds (a forward and a backward program instead of one fused program, their
hand-offs and the cotangent plumbing, measured in place on a toy model); and the optimizer
update of every parameter (inside those programs, not in the forward/backward profile). All
are measured by dp_jax.profile.local_links; the sum is added to evaluate()'s iteration_ms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def overhead_ms(stage_layers: Sequence[Sequence[str]], params_of: Mapping[str, int], *,
                dispatch_us: float, stage_us: float, update_ns_per_param: float) -> float:
  """One dispatch, stage_us per stage after the first, the update of every parameter; in ms."""
  params = sum(params_of.get(n, 0) for layers in stage_layers for n in layers)
  extra = max(len(stage_layers) - 1, 0)
  return (dispatch_us + extra * stage_us) / 1e3 + params * update_ns_per_param / 1e6
