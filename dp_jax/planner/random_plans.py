"""Random valid plans from the planner's own space: contiguous device ranges, allowed counts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.planner.costs import Placement


def placements(counts: Sequence[int], num_devices: int) -> list[Placement]:
  """Every (first device, count) a layer may take: count from `counts`, inside the G devices."""
  return [(s, int(c)) for c in counts for s in range(num_devices - int(c) + 1)]


def random_assignment(graph: LayerGraph, counts: Sequence[int], num_devices: int,
                      rng: np.random.Generator, max_segments: int = 6) -> dict[str, Placement]:
  """Layers in graph order cut into 1..max_segments runs, each run on one random placement."""
  names = graph.names
  k = int(rng.integers(1, min(max_segments, len(names)) + 1))
  cuts = sorted(rng.choice(np.arange(1, len(names)), size=k - 1, replace=False)) if k > 1 else []
  options = placements(counts, num_devices)
  out: dict[str, Placement] = {}
  bounds = [0, *[int(c) for c in cuts], len(names)]
  for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
    p = options[int(rng.integers(len(options)))]
    out.update({n: p for n in names[lo:hi]})
  return out


def random_assignments(graph: LayerGraph, counts: Sequence[int], num_devices: int, n: int,
                       seed: int, exclude: Sequence[dict[str, Placement]] = (),
                       max_segments: int = 6) -> list[dict[str, Placement]]:
  """`n` distinct random assignments (seeded), none equal to one in `exclude` (fewer if the
  space has fewer)."""
  rng = np.random.default_rng(seed)
  seen = [dict(a) for a in exclude]
  out: list[dict[str, Placement]] = []
  for _ in range(50 * max(n, 1)):
    if len(out) >= n:
      break
    a = random_assignment(graph, counts, num_devices, rng, max_segments)
    if a not in seen:
      seen.append(a)
      out.append(a)
  return out
