"""The multiplexing policy: background pieces admitted into foreground idle windows under a cap.

Pure Python (no JAX), shared by the simulator (dp_jax/sim/fill.py) and the runtime's
orchestrator (dp_jax/orchestrator/), so both describe one mechanism (docs/orchestrator.md).

A background job's training step is a sequence of pieces (per-layer-group forward programs, the
last group's forward+backward, then each group's backward with its optimizer update), each with
a profiled time. A piece is admitted into a device's idle window when its predicted time fits
what is left of the window; a piece that does not fit may still run if the time it would add to
the foreground (its predicted overrun) fits the iteration's budget, cap x alone iteration time,
shared by all devices. Predictions are the profile corrected online by measured/predicted (a
piece refused 8 times in a row has its correction moved halfway back to the profile, so a stale
measurement cannot starve it; no correction goes below a quarter of the profile), and the
measured slowdown of each iteration tightens (halves) the usable part of windows and the budget
when it exceeds the cap and relaxes them again when it does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dp_jax.errors import UserError

DEFAULT_PIECE_MS = 0.5  # DeepPool's be_graph_split_ms: background tasklets of about 0.5 ms
SMOOTHING = 0.5  # weight of the old value in the measured/predicted EWMA
RELAX = 0.125  # usable fraction regained per iteration whose slowdown is within the cap
STALE = 8  # refusals in a row after which a piece's correction moves back toward the profile
# Lowest measured/profiled ratio the correction keeps: the profile is the piece timed alone on
# its own device, so a piece measured at under a quarter of it is a timing artifact (a call
# that returned before its program ran), not a trend; without a floor, such measurements would
# shrink predictions toward 0 and admit any piece into any window.
RATIO_FLOOR = 0.25


@dataclass(frozen=True, eq=False)
class BackgroundJob:
  """A background model's step on one device: its pieces in order, their profiled ms, memory."""

  model: str
  batch: int
  piece_names: tuple[str, ...]
  pieces_ms: np.ndarray
  memory_bytes: float
  groups: tuple[tuple[str, ...], ...] = ()  # layers of each piece group (a stage each)

  @property
  def step_ms(self) -> float:
    return float(self.pieces_ms.sum())


def check_cap(cap) -> float:
  """A slowdown cap >= 0 (inf: no cap), or a one-line UserError."""
  if isinstance(cap, bool) or not isinstance(cap, (int, float)) or math.isnan(cap) or cap < 0:
    raise UserError(f"background slowdown_cap must be a number >= 0 (0.1: the foreground may "
                    f"slow down by 10%), got {cap!r}")
  return float(cap)


def layer_groups(names: Sequence[str], fwd_ms: Sequence[float], bwd_ms: Sequence[float],
                 piece_ms: float) -> list[list[int]]:
  """Consecutive layers grouped while a group's forward and backward each stay <= piece_ms."""
  if not (isinstance(piece_ms, (int, float)) and math.isfinite(piece_ms) and piece_ms > 0):
    raise UserError(f"background piece_ms must be a number > 0, got {piece_ms!r}")
  groups: list[list[int]] = []
  f = b = 0.0
  for i in range(len(names)):
    if groups and f + fwd_ms[i] <= piece_ms and b + bwd_ms[i] <= piece_ms:
      groups[-1].append(i)
      f, b = f + fwd_ms[i], b + bwd_ms[i]
    else:
      groups.append([i])
      f, b = fwd_ms[i], bwd_ms[i]
  return groups


def step_pieces(groups: Sequence[Sequence[int]], fwd_ms: Sequence[float],
                bwd_ms: Sequence[float]) -> list[tuple[str, int, float]]:
  """(phase, group, ms) of one step: fwd of each group but the last, fwd_bwd, bwd in reverse.

  The phases are the runtime's stage calls (dp_jax/runtime/step.py), one program each.
  """
  f = [sum(fwd_ms[i] for i in g) for g in groups]
  b = [sum(bwd_ms[i] for i in g) for g in groups]
  n = len(groups)
  return ([("fwd", g, f[g]) for g in range(n - 1)] + [("fwd_bwd", n - 1, f[-1] + b[-1])]
          + [("bwd", g, b[g]) for g in range(n - 2, -1, -1)])


class Correction:
  """Measured/predicted per piece (EWMA), falling back to the job-wide ratio for unseen pieces;
  no ratio below RATIO_FLOOR."""

  def __init__(self, pieces_ms: Sequence[float], smoothing: float = SMOOTHING):
    self.profile_ms = np.asarray(pieces_ms, dtype=float)
    self.smoothing = smoothing
    self.ratio = np.full(len(self.profile_ms), np.nan)
    self.refusals = np.zeros(len(self.profile_ms), dtype=np.int64)  # in a row, since measured
    self.overall = 1.0
    self.seen = 0

  def predicted_ms(self, k: int) -> float:
    r = self.ratio[k]
    return float(self.profile_ms[k] * (self.overall if math.isnan(r) else r))

  def observe(self, k: int, measured_ms: float) -> None:
    if self.profile_ms[k] <= 0 or not math.isfinite(measured_ms) or measured_ms < 0:
      return
    r = max(measured_ms / self.profile_ms[k], RATIO_FLOOR)
    self.refusals[k] = 0
    old = self.ratio[k]
    self.ratio[k] = r if math.isnan(old) else self.smoothing * old + (1 - self.smoothing) * r
    self.overall = r if self.seen == 0 else self.smoothing * self.overall + (
        1 - self.smoothing) * r
    self.seen += 1

  def refused(self, k: int) -> None:
    """After STALE refusals in a row, move piece k's ratio (and the job-wide one) halfway to 1,
    in log space: a piece refused on a stale, inflated measurement runs again, not starves."""
    self.refusals[k] += 1
    if self.refusals[k] < STALE:
      return
    self.refusals[k] = 0
    if not math.isnan(self.ratio[k]):
      self.ratio[k] = math.sqrt(self.ratio[k])
    self.overall = math.sqrt(self.overall)


class Admission:
  """Admits pieces into idle windows under a per-iteration budget of added foreground time.

  cap: allowed slowdown (inf: none); alone_ms: the foreground's iteration time alone;
  margin: a piece counts as predicted x (1 + margin); switch_ms: handing a device back to the
  foreground after a piece (added to every piece's cost).
  """

  def __init__(self, pieces_ms: Sequence[float], *, cap: float, alone_ms: float,
               margin: float = 0.0, switch_ms: float = 0.0, smoothing: float = SMOOTHING):
    self.cap = check_cap(cap)
    self.alone_ms = float(alone_ms)
    self.margin, self.switch = float(margin), float(switch_ms)
    self.correction = Correction(pieces_ms, smoothing)
    self.usable = 1.0  # fraction of windows and budget in use; halved when the cap is exceeded
    self.budget_ms = self._budget()
    self.charged_ms = 0.0  # predicted overrun admitted this iteration
    self.admitted = 0
    self.refused = 0

  @property
  def bounded(self) -> bool:
    return math.isfinite(self.cap)

  def _budget(self) -> float:
    return self.usable * self.cap * self.alone_ms if self.bounded else math.inf

  def predicted_ms(self, k: int) -> float:
    """Piece k's corrected prediction (without margin or switch)."""
    return self.correction.predicted_ms(k)

  def cost_ms(self, k: int) -> float:
    """Device time piece k is assumed to hold: prediction x (1 + margin) + switch."""
    return self.predicted_ms(k) * (1 + self.margin) + self.switch

  def overrun_ms(self, k: int, left_ms: float) -> float:
    """Foreground time piece k would add if started with left_ms of its window remaining."""
    usable = left_ms * self.usable if self.bounded else left_ms
    return max(0.0, self.cost_ms(k) - usable)

  def admit(self, k: int, left_ms: float) -> bool:
    """Whether piece k may start now, left_ms before its window's predicted end (charges it)."""
    if left_ms <= 0:
      return False
    over = self.overrun_ms(k, left_ms)
    if over > self.budget_ms:
      self.refused += 1
      self.correction.refused(k)
      return False
    self.budget_ms -= over
    self.charged_ms += over
    self.admitted += 1
    return True

  def observe(self, k: int, measured_ms: float) -> None:
    """A finished piece's measured time (device time, without the switch)."""
    self.correction.observe(k, measured_ms)

  def next_iteration(self, measured_ms: float | None = None) -> None:
    """Start a new iteration; measured_ms (the one that ended) feeds the slowdown back."""
    if measured_ms is not None and self.bounded and self.alone_ms > 0:
      slowdown = measured_ms / self.alone_ms - 1.0
      if slowdown > self.cap:
        self.usable *= 0.5
      else:
        self.usable = min(1.0, self.usable + RELAX)
    self.budget_ms = self._budget()
    self.charged_ms = 0.0
