"""Fit the analytic model's efficiency knobs to one measured profile (log-space, grid search)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.devices import DeviceSpec
from dp_jax.layer_times.analytic import AnalyticParams, layer_cost, layer_times_ms
from dp_jax.layer_times.layer_errors import layer_groups
from dp_jax.layer_times.table import ProfileTable

COMPUTE_EFF = tuple(round(0.05 * i, 2) for i in range(1, 21))
MEMORY_EFF = tuple(round(0.05 * i, 2) for i in range(1, 21))
OVERHEAD_US = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0)
SMALL_BATCH_FLOPS = (0.0, 1e8, 2e8, 5e8, 1e9, 2e9, 5e9)
TILES = (0, 16, 32, 64, 128, 256)


def _points(graph: LayerGraph, measured: ProfileTable, dtype: str, batches, groups):
  """(costs of a group's layers, batch, measured ms) for every comparable point."""
  names = [n for n in graph.names if measured.batches(n)]
  pts = []
  for members in layer_groups(names, groups).values():
    costs = [layer_cost(graph, graph.node(n), dtype) for n in members]
    common = set.intersection(*(set(measured.batches(n)) for n in members))
    for b in sorted(common):
      if batches is not None and b not in batches:
        continue
      ms = sum(measured.lookup(n, b).total_ms for n in members)
      if ms > 0:
        pts.append((costs, b, ms))
  return pts


def log_error(params: AnalyticParams, pts, device: DeviceSpec, dtype: str) -> float:
  """Mean |log(predicted / measured)| over the points."""
  total = 0.0
  for costs, b, ms in pts:
    pred = sum(sum(layer_times_ms(c, device, dtype, b, params)) for c in costs)
    total += abs(math.log(pred / ms))
  return total / len(pts)


def fit_params(graph: LayerGraph, measured: ProfileTable, device: DeviceSpec, dtype: str, *,
               batches: Sequence[int] | None = None, groups: Sequence[Sequence[str]] = (),
               small_batch: str | None = None) -> tuple[AnalyticParams, float]:
  """Best (params, mean |log error|) on a grid, with an optional small-batch term.

  A joint grid over compute_eff, memory_eff and the per-kernel overhead; then a joint grid
  over the small-batch knob (small_batch="flops": small_batch_flops, "tile": tile) and
  compute_eff; then coordinate descent over all of them until no single change helps.
  """
  pts = _points(graph, measured, dtype, None if batches is None else set(batches), groups)

  def err(p: AnalyticParams) -> float:
    return log_error(p, pts, device, dtype)

  best, best_err = None, math.inf
  for ce, me, ov in itertools.product(COMPUTE_EFF, MEMORY_EFF, OVERHEAD_US):
    p = AnalyticParams(compute_eff=ce, memory_eff=me, kernel_overhead_us=ov)
    e = err(p)
    if e < best_err:
      best, best_err = p, e
  axes = {"compute_eff": COMPUTE_EFF, "memory_eff": MEMORY_EFF, "kernel_overhead_us": OVERHEAD_US}
  if small_batch:
    knob, grid = {"flops": ("small_batch_flops", SMALL_BATCH_FLOPS),
                  "tile": ("tile", TILES)}[small_batch]
    axes[knob] = grid
    for v, ce in itertools.product(grid, COMPUTE_EFF):  # the knob trades off against compute_eff
      p = replace(best, **{knob: v, "compute_eff": ce})
      e = err(p)
      if e < best_err:
        best, best_err = p, e
  improved = True
  while improved:
    improved = False
    for name, grid in axes.items():
      for v in grid:
        p = replace(best, **{name: v})
        e = err(p)
        if e < best_err - 1e-12:
          best, best_err, improved = p, e, True
  return best, best_err
