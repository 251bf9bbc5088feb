"""Data parallelism: every layer on the same devices, priced by the same cost model."""

from __future__ import annotations

from dp_jax.planner.costs import CostModel
from dp_jax.planner.evaluate import Evaluation, data_parallel_assignment, evaluate
from dp_jax.planner.options import data_parallel_count


def data_parallel(model: CostModel) -> tuple[int, Evaluation]:
  """(devices used, evaluation) of data parallelism on the job's devices (G, or the largest
  divisor of the batch below G)."""
  count = data_parallel_count(model.options)
  return count, evaluate(model, data_parallel_assignment(model, count))
