"""Data parallelism: every layer on the same devices, priced by the same cost model."""

from __future__ import annotations

from collections.abc import Mapping

from dp_jax.planner import memory
from dp_jax.planner.costs import CostModel
from dp_jax.planner.evaluate import Evaluation, data_parallel_assignment, evaluate
from dp_jax.planner.options import data_parallel_count


def data_parallel(model: CostModel) -> tuple[int, Evaluation]:
  """(devices used, evaluation) of data parallelism on the job's devices (G, or the largest
  divisor of the batch below G)."""
  count = data_parallel_count(model.options)
  return count, evaluate(model, data_parallel_assignment(model, count))


def cheapest_within(model: CostModel, evaluations: Mapping[int, Evaluation],
                    tolerance: float) -> tuple[int, Evaluation]:
  """(d, evaluation) of the data parallelism with the least GPU time among the device counts
  d <= G whose iteration is within `tolerance` of the fastest one's and that fit in memory
  (fewest devices on a tie): the cheapest data parallelism as fast as the fastest, the fair
  baseline of GPU time saved. The fastest itself when none of them fits."""
  fastest = min(e.iteration_ms for e in evaluations.values())
  band = [(d, e) for d, e in sorted(evaluations.items())
          if e.iteration_ms <= fastest * (1 + tolerance) * (1 + 1e-9)
          and memory.fits(model, data_parallel_assignment(model, d))]
  if not band:
    return min(evaluations.items(), key=lambda kv: (kv[1].iteration_ms, kv[0]))
  return min(band, key=lambda kv: (kv[1].gpu_ms, kv[0]))
