"""McCandlish et al.'s steps-vs-batch model and time to accuracy from steps x time per step.

"An Empirical Model of Large-Batch Training" (McCandlish et al. 2018, eq. 2.11): to reach a
given result, S(B) = S_min (1 + B_noise / B) optimisation steps and E(B) = E_min (1 + B /
B_noise) samples, with E_min = S_min B_noise. No JAX: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dp_jax.base.errors import UserError

# B_noise candidates of the 1-D search: log-spaced, 0.02% apart, wide enough for any batch grid
B_NOISE_GRID = np.logspace(-3, 7, 50_001)


@dataclass(frozen=True)
class StepsFit:
  """S_min and B_noise fitted to (B, steps) points in log space, and the fit's residual."""

  s_min: float
  b_noise: float
  log_rms: float  # root mean square of log(steps / fitted steps)
  points: int

  @property
  def e_min(self) -> float:
    """The fewest samples to the target (the small-batch limit): S_min * B_noise."""
    return self.s_min * self.b_noise

  def steps(self, batch: float) -> float:
    """Fitted steps to the target at global batch `batch`."""
    return self.s_min * (1 + self.b_noise / batch)


def _s_min_and_residual(b_B: np.ndarray, log_steps_B: np.ndarray, b_noise_K: np.ndarray):
  """Best log S_min for each B_noise candidate (closed form) and the squared residual."""
  log_shape_KxB = np.log1p(b_noise_K[:, None] / b_B[None, :])
  log_s_min_K = np.mean(log_steps_B[None, :] - log_shape_KxB, axis=1)
  resid_KxB = log_steps_B[None, :] - log_s_min_K[:, None] - log_shape_KxB
  return log_s_min_K, np.sum(resid_KxB ** 2, axis=1)


def fit_steps(batches: Sequence[float], steps: Sequence[float]) -> StepsFit:
  """Least squares of log S(B) over a fine B_noise grid (S_min in closed form per candidate)."""
  b_B, s_B = np.asarray(batches, float), np.asarray(steps, float)
  keep = np.isfinite(s_B) & (s_B > 0) & (b_B > 0)
  b_B, s_B = b_B[keep], s_B[keep]
  if len(set(b_B.tolist())) < 2:
    raise UserError(f"fitting steps(B) needs finite steps at >= 2 batch sizes, got "
                    f"{len(b_B)} point(s); widen the batch grid or lower the target")
  log_s_min_K, sq_K = _s_min_and_residual(b_B, np.log(s_B), B_NOISE_GRID)
  k = int(np.argmin(sq_K))
  return StepsFit(float(np.exp(log_s_min_K[k])), float(B_NOISE_GRID[k]),
                  math.sqrt(sq_K[k] / len(b_B)), len(b_B))


def leave_one_out(batches: Sequence[float], steps: Sequence[float]) -> list[StepsFit]:
  """The fit without each batch size in turn (how much one point moves B_noise)."""
  pts = [(b, s) for b, s in zip(batches, steps, strict=True) if math.isfinite(s) and s > 0]
  return [fit_steps([b for j, (b, _) in enumerate(pts) if j != i],
                    [s for j, (_, s) in enumerate(pts) if j != i])
          for i in range(len(pts)) if len(pts) > 2]


def time_to_accuracy_s(steps: float, iteration_ms: float) -> float:
  """Wall-clock seconds to the target: steps x predicted time per step."""
  return steps * iteration_ms / 1e3


def best_batch(times_by_batch: dict[int, float]) -> tuple[int, float] | None:
  """(B, seconds) of the fastest batch size among finite times (ties: the smaller B)."""
  finite = sorted((t, b) for b, t in times_by_batch.items() if math.isfinite(t))
  return None if not finite else (finite[0][1], finite[0][0])
