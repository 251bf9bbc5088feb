"""Background fill: pieces of a background job in the foreground's idle windows, under a cap.

Interference model (docs/simulator.md, "Background fill"):
- Background pieces run only in windows where a device has no foreground work on either stream:
  never beside foreground compute, all-reduce or moves (DeepPool issues no background tasklet
  during an all-reduce; our moves are far below its 500 us NCCL-recv override).
- A piece is never preempted. policy "fit": a piece starts only if it ends within the window's
  length in the alone schedule (the window is known from the replayed foreground), so the
  foreground waits for it only where earlier delays have shortened the window. policy
  "overrun": pieces start while the device is idle and the foreground's next task, once ready,
  waits for the running piece (DeepPool's reactive manager); the wait is foreground delay.
- Handing a device back from background to foreground costs switch_ms before the foreground's
  next task starts (default: the device's per-kernel overhead, dp_jax/profile/devices.py).
  Every foreground task on a device waits for the background piece running there; a window
  opens when all earlier foreground work on the device has ended.
- Delays propagate through the foreground's dependency graph (a re-timed schedule), over
  several iterations in a row, carrying the background step's progress across windows.
Windows are admitted longest first; the most that keeps every simulated iteration within
(1 + cap) x the alone iteration time is kept (binary search; delays only grow with more windows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dp_jax.errors import UserError
from dp_jax.sim.background import BackgroundJob
from dp_jax.sim.timeline import Event, Timeline
from dp_jax.sim.windows import EPS_MS, DeviceClasses, Window

POLICIES = ("fit", "overrun")


@dataclass(frozen=True, eq=False)
class Fill:
  """Result of filling idle windows: per simulated iteration (the warm-up one excluded)."""

  cap: float
  alone_ms: float
  admitted: np.ndarray  # (windows,) bool
  iteration_ms: np.ndarray  # (iterations,)
  bg_work_ms: np.ndarray  # (iterations,) device-ms of background pieces run
  bg_steps: np.ndarray  # (iterations,) background steps completed, summed over devices
  bg_free_ms: np.ndarray  # (iterations,) part of bg_work_ms on devices with no foreground work
  events: tuple[Event, ...]  # last iteration: foreground re-timed and background, from its start
  warmup_ms: float  # the first iteration (its wrap windows had no previous tail to fill)

  @property
  def slowdown(self) -> np.ndarray:
    """Per iteration: with background / alone - 1."""
    return self.iteration_ms / self.alone_ms - 1.0


def validate(cap: float, switch_ms: float, policy: str, iterations: int) -> None:
  """One-line errors for bad fill settings."""
  if isinstance(cap, bool) or not isinstance(cap, (int, float)) or math.isnan(cap) or cap < 0:
    raise UserError(f"background slowdown_cap must be a number >= 0 (0.1: the foreground may "
                    f"slow down by 10%), got {cap!r}")
  if not (isinstance(switch_ms, (int, float)) and math.isfinite(switch_ms) and switch_ms >= 0):
    shown = switch_ms * 1e3 if isinstance(switch_ms, (int, float)) else switch_ms
    raise UserError(f"interference switch_us must be a number >= 0, got {shown!r}")
  if policy not in POLICIES:
    raise UserError(f"interference policy '{policy}' is unknown (valid: {', '.join(POLICIES)})")
  if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
    raise UserError(f"iterations must be an integer >= 1, got {iterations!r}")


def fill(tl: Timeline, classes: DeviceClasses, windows: list[Window], job: BackgroundJob, *,
         cap: float, switch_ms: float, policy: str = "fit", iterations: int = 4) -> Fill:
  """Admit the most windows the cap allows and simulate `iterations` steady iterations."""
  validate(cap, switch_ms, policy, iterations)
  sim = _Sim(tl, classes, windows, job, switch_ms, policy, iterations)
  limit = (1.0 + cap) * tl.iteration_ms * (1 + 1e-12) + EPS_MS
  ranked = sorted((w for w, win in enumerate(windows) if win.opener >= 0
                   and win.length_ms >= sim.min_piece - EPS_MS),
                  key=lambda w: (-windows[w].length_ms, w))

  def admitted(m: int) -> np.ndarray:
    mask = np.array([win.opener < 0 for win in windows], dtype=bool)
    mask[ranked[:m]] = True
    return mask

  def ok(m: int) -> bool:
    times = sim.run(admitted(m), record=False)[0]
    return bool(times.max() <= limit)

  lo, hi = 0, len(ranked)
  if not ok(hi):
    while lo < hi - 1:  # invariant: ok(lo) (no window: the alone schedule), not ok(hi)
      mid = (lo + hi) // 2
      lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    hi = lo
  mask = admitted(hi)
  times, work, steps, free, events = sim.run(mask, record=True)
  if times.max() > limit:
    raise AssertionError(f"slowdown cap violated: {times.max():.6f} ms > {limit:.6f} ms")
  return Fill(float(cap), tl.iteration_ms, mask, times[1:], work[1:], steps[1:], free[1:],
              tuple(events), float(times[0]))


class _Sim:
  """Re-times the foreground task graph with background pieces in admitted windows."""

  def __init__(self, tl, classes, windows, job, switch_ms, policy, iterations):
    self.tl, self.classes, self.windows, self.job = tl, classes, windows, job
    self.switch, self.policy, self.iterations = switch_ms, policy, iterations
    self.order = np.lexsort((np.arange(len(tl.tasks)), tl.start_ms))
    self.deps = [t.deps for t in tl.tasks]
    self.dur = [t.duration_ms for t in tl.tasks]
    self.closing: list[list[int]] = [[] for _ in tl.tasks]
    for w, win in enumerate(windows):
      for i in win.closers:
        self.closing[i].append(w)
    self.cum = np.concatenate([[0.0], np.cumsum(job.pieces_ms)])
    self.step = float(self.cum[-1])
    self.min_piece = float(job.pieces_ms.min())
    self.sizes = classes.sizes
    self.ranges = [[tuple(int(x) for x in np.searchsorted(classes.bounds, [a, a + c]))
                    for a, c in t.spans] for t in tl.tasks]

  def take(self, phase: float, budget: float) -> float:
    """Background work done from step offset `phase` in `budget` ms (pieces whole)."""
    if budget <= EPS_MS:
      return 0.0
    target = phase + budget
    q = math.floor(target / self.step)
    r = target - q * self.step
    if self.policy == "fit":
      j = int(np.searchsorted(self.cum, r + EPS_MS, side="right")) - 1
    else:
      j = int(np.searchsorted(self.cum, r - EPS_MS, side="left"))
    return max(0.0, q * self.step + float(self.cum[j]) - phase)

  def run(self, admitted: np.ndarray, record: bool):
    """Per iteration (warm-up first): period, background device-ms and steps; last events."""
    tl, n, k_classes = self.tl, len(self.tl.tasks), len(self.classes)
    phase = np.zeros(k_classes)
    last_end = np.zeros(k_classes)  # end of the latest foreground task begun on each class
    bg_until = np.zeros(k_classes)  # when each class's running background piece hands back
    origin, first = 0.0, True
    times, work, steps, free = [], [], [], []
    events: list[Event] = []
    shown: list[tuple[int, float, float]] = []
    recorded = (0.0, 0.0)
    idle_classes = [w.cls for w, ok in zip(self.windows, admitted, strict=True)
                    if ok and w.opener < 0]
    # Recording runs one more iteration: the drawn one's tail is filled at the next one's start.
    for k in range(self.iterations + 1 + int(record)):
      start, end = np.zeros(n), np.zeros(n)
      done: set[int] = set()
      bg = 0.0
      last = record and k == self.iterations
      keep = record and k >= self.iterations
      for i in self.order:
        ready = max((end[d] for d in self.deps[i]), default=origin)
        for w in self.closing[i]:
          if w in done or not admitted[w]:
            continue
          done.add(w)
          win = self.windows[w]
          if win.wrap and first:
            continue  # the first iteration has no previous tail
          c = win.cls
          opened = max(last_end[c], bg_until[c])
          budget = win.length_ms if self.policy == "fit" else ready - opened
          did = self.take(phase[c], budget)
          if did > 0:
            phase[c] = (phase[c] + did) % self.step
            bg += did * self.sizes[c]
            bg_until[c] = opened + did + self.switch
            if keep:
              shown.append((c, opened, opened + did))
        s = ready
        for lo, hi in self.ranges[i]:
          s = max(s, float(bg_until[lo:hi].max()))
        start[i], end[i] = s, s + self.dur[i]
        for lo, hi in self.ranges[i]:
          np.maximum(last_end[lo:hi], end[i], out=last_end[lo:hi])
      finish = float(end.max()) if n else origin + tl.iteration_ms
      period = finish - origin
      free.append(sum(period * self.sizes[c] for c in idle_classes))
      bg += free[-1]
      if last:
        shown.extend((c, origin, finish) for c in idle_classes)
      times.append(period)
      work.append(bg)
      steps.append(bg / self.step)
      if last:
        events = self.tl.events(start - origin, end - origin)
        recorded = (origin, finish)
      origin, first = finish, False
    if record:
      events += self._pieces(shown, *recorded)
    m = self.iterations + 1
    return (np.array(times[:m]), np.array(work[:m]), np.array(steps[:m]), np.array(free[:m]),
            events)

  def _pieces(self, pieces, origin: float, finish: float) -> list[Event]:
    """Background pieces clipped to the recorded iteration, times from its start."""
    b = self.classes.bounds
    label = f"{self.job.model} x{self.job.batch}"
    out = []
    for c, s, e in pieces:
      s, e = max(s, origin), min(e, finish)
      if e > s:
        out.append(Event((int(b[c]), int(b[c + 1] - b[c])), "compute", "bg", label,
                         float(s - origin), float(e - origin)))
    return out
