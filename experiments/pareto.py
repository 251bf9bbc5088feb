"""Pareto front of (iteration_ms, gpu_ms) points: the plans no other plan beats on both."""

from __future__ import annotations

from collections.abc import Sequence


def dominated(p: tuple[float, float], q: tuple[float, float]) -> bool:
  """q is at least as good as p on both and strictly better on one (lower is better)."""
  return q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1])


def on_front(points: Sequence[tuple[float, float]]) -> list[bool]:
  """For each point, whether no other point dominates it (equal points are both kept)."""
  return [not any(dominated(p, q) for q in points) for p in points]
