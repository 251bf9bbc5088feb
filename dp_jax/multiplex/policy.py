"""The multiplexing policy: background pieces admitted into foreground idle windows under a cap.

Pure Python (no JAX), shared by the simulator (dp_jax/simulator/fill.py) and the runtime's
orchestrator (dp_jax/orchestrator/), so both describe one mechanism (docs/orchestrator.md).

A background job's training step is a sequence of pieces (per-layer-group forward programs, the
last group's forward+backward, then each group's backward with its optimizer update), each with
a profiled time. A piece is admitted into a device's idle window when its predicted time fits
what is left of the window; a piece that does not fit may still run if the time it would add to
the foreground (its predicted overrun) fits the iteration's budget, cap x alone iteration time,
shared by all devices. Predictions are the profile corrected online by measured/predicted (a
piece refused 8 times in a row is predicted at its profile again: the job's pieces run in order,
so while one is refused no measurement arrives to correct a stale ratio; a piece whose profile
fits a window (or its overrun the budget) is refused at most 8 times in a row by such windows;
no correction goes below a quarter of the profile). The slowdown
feedback compares the mean of the last iterations (at most WINDOW, since the last tightening)
with the alone iteration time: it tightens (halves) the usable part of windows and the budget
only when that mean exceeds (1 + cap) x alone by more than the foreground's own step-to-step
noise explains (a one-sided Student t test, `Admission.excess_threshold_ms`), and relaxes them
again when the mean is within the cap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dp_jax.base.errors import UserError

DEFAULT_PIECE_MS = 0.5  # DeepPool's be_graph_split_ms: background tasklets of about 0.5 ms
SMOOTHING = 0.5  # weight of the old value in the measured/predicted EWMA
RELAX = 0.125  # usable fraction regained per iteration whose slowdown is within the cap
STALE = 8  # refusals in a row after which a piece is predicted at its profile again
# Lowest measured/profiled ratio the correction keeps: the profile is the piece timed alone on
# its own device, so a piece measured at under a quarter of it is a timing artifact (a call
# that returned before its program ran), not a trend; without a floor, such measurements would
# shrink predictions toward 0 and admit any piece into any window.
RATIO_FLOOR = 0.25
WINDOW = 8  # iterations whose mean time the slowdown feedback compares with the cap
# One-sided 99% quantiles of Student's t for 1..30 degrees of freedom (any statistics table,
# e.g. the NIST/SEMATECH e-Handbook, 1.3.6.7.2; tests/test_multiplex.py checks them against
# scipy); beyond 30 the 30's value (slightly above the normal's 2.326: fewer false alarms).
T99 = (31.821, 6.965, 4.541, 3.747, 3.365, 3.143, 2.998, 2.896, 2.821, 2.764, 2.718, 2.681,
       2.650, 2.624, 2.602, 2.583, 2.567, 2.552, 2.539, 2.528, 2.518, 2.508, 2.500, 2.492,
       2.485, 2.479, 2.473, 2.467, 2.462, 2.457)


def noise_threshold_ms(alone_sd_ms: float, n: int, m: int) -> float:
  """The excess of a mean of m steps over the mean of n alone steps (standard deviation
  alone_sd_ms) that the steps' own noise passes with probability 1% (one-sided Student t,
  n - 1 degrees of freedom): t_0.99(n - 1) x sd x sqrt(1/m + 1/n); 0 when n < 2 or m < 1 (the
  noise is unknown). Admission.excess_threshold_ms says why."""
  if n < 2 or m < 1:
    return 0.0
  return T99[min(n - 1, len(T99)) - 1] * alone_sd_ms * math.sqrt(1.0 / m + 1.0 / n)


@dataclass(frozen=True, eq=False)
class BackgroundJob:
  """A background model's step on one device: its pieces in order, their profiled ms, memory."""

  model: str
  batch: int
  piece_names: tuple[str, ...]
  pieces_ms: np.ndarray
  memory_bytes: float
  groups: tuple[tuple[str, ...], ...] = ()  # layers of each piece group (a stage each)
  flops_per_sample: float = 0.0  # its model's forward FLOPs per sample (0: not known)

  @property
  def step_ms(self) -> float:
    return float(self.pieces_ms.sum())


def busy_in_every_layer(placed: Iterable[Iterable[int]], num_devices: int) -> set[int]:
  """The devices of [0, num_devices) that every layer (or stage) in `placed` uses: never idle,
  so no background job runs there."""
  busy = set(range(num_devices))
  for devices in placed:
    busy &= set(devices)
  return busy


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
    """After STALE refusals in a row, predict piece k at its profile again (its ratio forgotten,
    the job-wide one back to 1): while a piece is refused the job stands still (its pieces run
    in order), so no measurement arrives to correct a stale ratio (docs/orchestrator.md)."""
    self.refusals[k] += 1
    if self.refusals[k] < STALE:
      return
    self.refusals[k] = 0
    self.ratio[k] = math.nan
    self.overall = 1.0


@dataclass(frozen=True)
class Decision:
  """One admission decision (Admission.decisions): where, the numbers it used, and why."""

  iteration: int  # feedback iterations started before it (next_iteration calls)
  device: int  # the caller's device (runtime) or the class's first device (simulator); -1: none
  window: int  # the caller's window: foreground call index (runtime), window index (simulator)
  piece: int
  left_ms: float  # what was left of the window
  cost_ms: float  # prediction x (1 + margin) + switch
  overrun_ms: float
  budget_ms: float  # the iteration's budget left before this decision
  admitted: bool
  why: str  # "fits" | "overrun within budget" | "over budget" | "window closed"


class Admission:
  """Admits pieces into idle windows under a per-iteration budget of added foreground time.

  cap: allowed slowdown (inf: none); alone_ms: the foreground's iteration time alone;
  alone_steps_ms: the measured alone iterations alone_ms comes from (their spread is the
  feedback's noise; none: no noise); margin: a piece counts as predicted x (1 + margin);
  switch_ms: handing a device back to the foreground after a piece (added to every piece's
  cost); window: how many iterations the slowdown feedback averages; log_decisions: keep every
  admission decision in `decisions` (a diagnosis aid: the runtime and the simulator log the same
  records).
  """

  def __init__(self, pieces_ms: Sequence[float], *, cap: float, alone_ms: float,
               alone_steps_ms: Sequence[float] = (), margin: float = 0.0,
               switch_ms: float = 0.0, smoothing: float = SMOOTHING, window: int = WINDOW,
               log_decisions: bool = False):
    self.cap = check_cap(cap)
    self.alone_ms = float(alone_ms)
    steps = [float(x) for x in alone_steps_ms if math.isfinite(x)]
    self.alone_n = len(steps)
    self.alone_sd_ms = statistics.stdev(steps) if len(steps) >= 2 else 0.0
    self.margin, self.switch = float(margin), float(switch_ms)
    self.correction = Correction(pieces_ms, smoothing)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
      raise ValueError(f"window must be an integer >= 1, got {window!r}")
    self.window = window
    self.recent: list[float] = []  # measured iterations since the last tightening (<= window)
    self.usable = 1.0  # fraction of windows and budget in use; halved when the cap is exceeded
    self.tightened = 0  # times the feedback halved `usable`
    self.budget_ms = self._budget()
    self.charged_ms = 0.0  # predicted overrun admitted this iteration
    self.admitted = 0
    self.refused = 0
    self.iteration = 0  # next_iteration calls so far
    self.decisions: list[Decision] | None = [] if log_decisions else None
    # (iteration, piece, measured ms, predicted ms before it) per observation, when logging
    self.observations: list[tuple[int, int, float, float]] | None = (
        [] if log_decisions else None)

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

  def admit(self, k: int, left_ms: float, *, device: int = -1, window: int = -1) -> bool:
    """Whether piece k may start now, left_ms before its window's predicted end (charges it);
    device and window only label the decision log."""
    if left_ms <= 0:
      self._log(k, left_ms, 0.0, False, "window closed", device, window)
      return False
    over = self.overrun_ms(k, left_ms)
    if over > self.budget_ms:
      self._log(k, left_ms, over, False, "over budget", device, window)
      self.refused += 1
      self.correction.refused(k)
      return False
    self._log(k, left_ms, over, True, "overrun within budget" if over > 0 else "fits", device,
              window)
    self.budget_ms -= over
    self.charged_ms += over
    self.admitted += 1
    return True

  def _log(self, k: int, left_ms: float, over: float, admitted: bool, why: str, device: int,
           window: int) -> None:
    if self.decisions is not None:
      self.decisions.append(Decision(self.iteration, device, window, k, float(left_ms),
                                     self.cost_ms(k), float(over), float(self.budget_ms),
                                     admitted, why))

  def observe(self, k: int, measured_ms: float) -> None:
    """A finished piece's measured time (device time, without the switch)."""
    if self.observations is not None:
      self.observations.append((self.iteration, k, float(measured_ms), self.predicted_ms(k)))
    self.correction.observe(k, measured_ms)

  def excess_threshold_ms(self, m: int | None = None) -> float:
    """How far the mean of m measured iterations (default: those kept) may lie above
    (1 + cap) x alone_ms before the feedback counts it as a real excess.

    With s the standard deviation of the n alone steps, the mean of m iterations scatters
    around the true alone time with a standard error of s / sqrt(m), and alone_ms (a mean or
    median of the n steps) with about s / sqrt(n); for independent, roughly normal steps their
    difference over s x sqrt(1/m + 1/n) is Student-t distributed with n - 1 degrees of freedom.
    The threshold t_0.99(n - 1) x s x sqrt(1/m + 1/n) is therefore crossed by the foreground's
    own noise, with no background at all, with probability 1% per check (one-sided; the checks
    of one run share alone_ms's error, so they are not independent), whatever the noise's
    size; few alone steps widen it (t, 1/n), a real excess above it still tightens. Without
    alone steps (n < 2) the noise is unknown and taken as 0.
    """
    m = len(self.recent) if m is None else m
    return noise_threshold_ms(self.alone_sd_ms, self.alone_n, m)

  def rebase(self, alone_ms: float) -> None:
    """Measure from now on against a newer alone iteration time (the alone steps of an
    interleaved off window: the machine's load now); the kept iterations and the budget follow."""
    self.alone_ms = float(alone_ms)
    self.recent = []
    self.budget_ms = self._budget()

  def next_iteration(self, measured_ms: float | None = None) -> None:
    """Start a new iteration; measured_ms (the one that ended) feeds the slowdown back: halve
    `usable` when the mean of the kept iterations exceeds the cap by more than the noise
    threshold (and start a new mean), give back RELAX when the mean is within the cap."""
    if (measured_ms is not None and self.bounded and self.alone_ms > 0
        and math.isfinite(measured_ms)):
      self.recent = [*self.recent, float(measured_ms)][-self.window:]
      excess_ms = statistics.fmean(self.recent) - (1.0 + self.cap) * self.alone_ms
      if excess_ms > self.excess_threshold_ms():
        self.usable *= 0.5
        self.tightened += 1
        self.recent = []  # the iterations from now on measure the tightened admission
      elif excess_ms <= 0:
        self.usable = min(1.0, self.usable + RELAX)
    self.budget_ms = self._budget()
    self.charged_ms = 0.0
    self.iteration += 1
