"""The local runtime's costs the per-layer profile does not see: stage calls and the update.

The planner prices compute, all-reduce and moves (dp_jax.planner.evaluate). Running a plan
also pays, per step: one host dispatch per stage call (every stage but the last runs a forward
and a backward program, the last one fused program), and the optimizer update of every
parameter (inside those programs, not in the forward/backward profile). Both are measured
here by dp_jax.profile.local_links; the terms are added to evaluate()'s iteration_ms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def stage_calls(num_stages: int) -> int:
  """Program calls of one step: fwd + bwd per stage, one fused call for the last."""
  return max(2 * num_stages - 1, 0)


def overhead_ms(stage_layers: Sequence[Sequence[str]], params_of: Mapping[str, int], *,
                dispatch_us: float, update_ns_per_param: float) -> float:
  """Dispatch of every stage call plus the update of every stage's parameters, in ms."""
  params = sum(params_of.get(n, 0) for layers in stage_layers for n in layers)
  return stage_calls(len(stage_layers)) * dispatch_us / 1e3 + params * update_ns_per_param / 1e6
