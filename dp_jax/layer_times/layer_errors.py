"""Per-layer error of one profile (predicted) against another (reference)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dp_jax.base.errors import UserError
from dp_jax.layer_times.table import ProfileTable


@dataclass(frozen=True)
class Comparison:
  """Reference and predicted forward+backward ms of one layer group at one batch."""

  group: str
  batch: int
  reference_ms: float
  predicted_ms: float

  @property
  def rel_error(self) -> float:
    return abs(self.predicted_ms - self.reference_ms) / self.reference_ms

  @property
  def ratio(self) -> float:
    return self.predicted_ms / self.reference_ms


def layer_groups(layers: Iterable[str],
                 groups: Sequence[Sequence[str]] = ()) -> dict[str, list[str]]:
  """Group name -> layers: each multi-layer group (named by its last layer), else one layer each."""
  layers = list(layers)
  out: dict[str, list[str]] = {}
  grouped = set()
  for g in groups:
    members = [n for n in g if n in layers]
    if members:
      out[members[-1]] = members
      grouped.update(members)
  for n in layers:
    if n not in grouped:
      out[n] = [n]
  return out


def compare(reference: ProfileTable, predicted: ProfileTable, layers: Iterable[str],
            batches: Iterable[int] | None = None,
            groups: Sequence[Sequence[str]] = ()) -> list[Comparison]:
  """Errors at the reference's own (not interpolated) batches, optionally only `batches`."""
  keep = None if batches is None else set(batches)
  out = []
  for name, members in layer_groups(layers, groups).items():
    common = set.intersection(*(set(reference.batches(n)) for n in members))
    for b in sorted(common):
      if keep is not None and b not in keep:
        continue
      ref = sum(reference.lookup(n, b).total_ms for n in members)
      if ref <= 0:
        continue
      pred = sum(predicted.lookup(n, b).total_ms for n in members)
      out.append(Comparison(name, b, ref, pred))
  return out


@dataclass(frozen=True)
class ErrorSummary:
  """Median and worst relative error over comparisons, and where the worst one is."""

  n: int
  median: float
  worst: float
  worst_at: str
  median_ratio: float  # predicted / reference: < 1 means the model is optimistic


def summarize(rows: Sequence[Comparison]) -> ErrorSummary:
  if not rows:
    raise UserError("nothing to compare: the two profiles share no layer at any batch")
  worst = max(rows, key=lambda r: r.rel_error)
  return ErrorSummary(len(rows), statistics.median(r.rel_error for r in rows), worst.rel_error,
                      f"{worst.group} @ {worst.batch}", statistics.median(r.ratio for r in rows))
