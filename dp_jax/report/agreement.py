"""How well predictions match measurements: absolute % errors and Spearman rank correlation."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from dp_jax.base.errors import UserError


def abs_pct_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
  """|predicted - measured| / measured x 100 for each pair."""
  if len(predicted) != len(measured) or not measured:
    raise UserError("need as many predictions as measurements, and at least one")
  if any(m <= 0 for m in measured):
    raise UserError("measured times must be > 0")
  return [abs(p - m) / m * 100 for p, m in zip(predicted, measured, strict=True)]


def ranks(xs: Sequence[float]) -> list[float]:
  """1-based ranks, ties sharing their average rank."""
  order = sorted(range(len(xs)), key=lambda i: xs[i])
  out = [0.0] * len(xs)
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
      j += 1
    for k in range(i, j + 1):
      out[order[k]] = (i + j) / 2 + 1
    i = j + 1
  return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
  """Spearman rank correlation (None with fewer than 3 points or a constant side)."""
  if len(xs) != len(ys) or len(xs) < 3:
    return None
  rx, ry = ranks(xs), ranks(ys)
  mx, my = statistics.fmean(rx), statistics.fmean(ry)
  cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
  vx = sum((a - mx) ** 2 for a in rx)
  vy = sum((b - my) ** 2 for b in ry)
  return None if vx == 0 or vy == 0 else cov / (vx * vy) ** 0.5


def summary(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float | None]:
  """median/max absolute % error, Spearman, median predicted/measured ratio, plan count."""
  errs = abs_pct_errors(predicted, measured)
  return {"plans": len(errs), "median_abs_pct_error": statistics.median(errs),
          "max_abs_pct_error": max(errs), "spearman": spearman(predicted, measured),
          "median_ratio": statistics.median(p / m for p, m in zip(predicted, measured,
                                                                   strict=True))}
