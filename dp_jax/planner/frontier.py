"""Pareto front of (iteration_ms, gpu_ms): plans from a sweep of the amplification limit.

Each limit gives the fastest plan under that limit; lower limits trade foreground speed for
fewer busy device-milliseconds. The front keeps the plans no other plan beats on both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from dp_jax.planner.costs import Placement

DEFAULT_LIMITS = (1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, math.inf)


@dataclass(frozen=True)
class FrontierPoint:
  """One plan on (or considered for) the front."""

  amplification_limit: float
  iteration_ms: float
  gpu_ms: float
  assignment: Mapping[str, Placement]
  shardings: Mapping[str, tuple[int, str]] = field(default_factory=dict)  # weight-sharded layers
  lower_bound_ms: float | None = None  # a lower bound on the search space's best (make.optimality)
  heuristic_blocks: int = 0  # blocks its search priced heuristically

  def to_json(self) -> dict:
    limit = None if math.isinf(self.amplification_limit) else self.amplification_limit
    return {"amplification_limit": limit, "iteration_ms": self.iteration_ms,
            "gpu_ms": self.gpu_ms}


def pareto(points: Iterable[FrontierPoint]) -> list[FrontierPoint]:
  """Non-dominated points, fastest first (ties keep the one with fewer gpu_ms)."""
  ordered = sorted(points, key=lambda p: (p.iteration_ms, p.gpu_ms))
  front: list[FrontierPoint] = []
  for p in ordered:
    if not front or p.gpu_ms < front[-1].gpu_ms:
      front.append(p)
  return front


def sweep(plan_for_limit: Callable[[float], FrontierPoint],
          limits: Iterable[float] = DEFAULT_LIMITS) -> list[FrontierPoint]:
  """The Pareto front of the plans found for each limit."""
  return pareto(plan_for_limit(float(a)) for a in limits)
