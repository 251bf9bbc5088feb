"""Background fill: the multiplexing policy (dp_jax/multiplex/policy.py) replayed on the foreground.

Interference model (docs/simulator.md, "Background fill"):
- Background pieces run only in windows where a device has no foreground work on either stream:
  never beside foreground compute, all-reduce or moves (DeepPool issues no background tasklet
  during an all-reduce; our moves are far below its 500 us NCCL-recv override).
- When a window opens, the device's next pieces are offered to the policy one at a time, with
  the window's predicted length (from the alone schedule, as the runtime predicts it from its
  alone steps) minus the time already used. An admitted piece runs for its true time (the
  profile unless `actual_ms` says otherwise), is never preempted, and its measured time corrects
  the policy's next predictions. Handing the device back costs switch_ms after each piece
  (default: the device's per-kernel overhead, dp_jax/hardware/devices.py); the policy charges
  switch_ms, the time advances by `actual_switch_ms` when given (a run's measured host gap
  between pieces, dp_jax/orchestrator/replay.py), as the true piece times differ from the
  profile.
- Every foreground task on a device waits for the background piece running there; a piece that
  outlasts the window delays the foreground. The policy charges that predicted overrun to one
  budget per iteration (cap x alone iteration) shared by all devices, so the cap holds at
  admission (delays along the dependency graph are at most the sum of the overruns).
- A piece starts only while its window is open: before the window's predicted end (the
  policy) and before the closing foreground task is ready (the runtime's hook closes the
  window when the foreground calls that task).
- Delays propagate through the foreground's dependency graph (a re-timed schedule), over
  several iterations in a row; each iteration's simulated time feeds the policy's slowdown
  feedback. Devices with no foreground work run the job all the time.
- Foreground noise (optional): given the measured alone iterations (`alone_steps_ms`), each
  simulated iteration's foreground tasks are scaled by one factor drawn (seeded) from those
  steps over their median, so the simulated foreground alone varies from step to step as the
  measured one does around the baseline the runtime predicts from (their median), and the
  policy gets the same steps, rescaled, to learn that noise from, as the runtime does.
  Windows are still predicted from the un-noised schedule. Without them: no noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.multiplex.policy import Admission, BackgroundJob, Decision, check_cap
from dp_jax.simulator.timeline import Event, Timeline
from dp_jax.simulator.windows import DeviceClasses, Window

POLICIES = ("fit",)


@dataclass(frozen=True, eq=False)
class Fill:
  """Result of filling idle windows: per simulated iteration (the warm-up one excluded)."""

  cap: float
  alone_ms: float
  admitted: np.ndarray  # (windows,) bool: the window ran at least one piece
  iteration_ms: np.ndarray  # (iterations,)
  bg_work_ms: np.ndarray  # (iterations,) device-ms of background pieces run
  bg_steps: np.ndarray  # (iterations,) background steps completed, summed over devices
  bg_free_ms: np.ndarray  # (iterations,) part of bg_work_ms on devices with no foreground work
  events: tuple[Event, ...]  # last iteration: foreground re-timed and background, from its start
  warmup_ms: float  # the first iteration (its wrap windows had no previous tail to fill)
  pieces_admitted: int = 0
  pieces_refused: int = 0
  alone_mean_ms: float = math.nan  # mean alone iteration under the noise (alone_ms without)
  tightened: int = 0  # times the slowdown feedback halved the usable windows
  usable_at_end: float = 1.0  # the policy's usable fraction after the last iteration
  decisions: tuple[Decision, ...] = ()  # every admission decision, warm-up first (log_decisions)

  @property
  def slowdown(self) -> np.ndarray:
    """Per iteration: with background / alone - 1 (the foreground's noise included)."""
    return self.iteration_ms / self.alone_ms - 1.0


def validate(cap: float, switch_ms: float, policy: str, iterations: int) -> None:
  """One-line errors for bad fill settings."""
  check_cap(cap)
  if not (isinstance(switch_ms, (int, float)) and math.isfinite(switch_ms) and switch_ms >= 0):
    shown = switch_ms * 1e3 if isinstance(switch_ms, (int, float)) else switch_ms
    raise UserError(f"interference switch_us must be a number >= 0, got {shown!r}")
  if policy not in POLICIES:
    raise UserError(f"interference policy '{policy}' is unknown (valid: {', '.join(POLICIES)})")
  if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
    raise UserError(f"iterations must be an integer >= 1, got {iterations!r}")


def noise_factors(alone_steps_ms) -> np.ndarray:
  """Measured alone iterations over their median (the runtime's baseline); [1.0] if fewer
  than two finite, positive ones (no noise)."""
  steps = np.asarray([] if alone_steps_ms is None else alone_steps_ms, dtype=float).ravel()
  steps = steps[np.isfinite(steps) & (steps > 0)]
  return steps / np.median(steps) if len(steps) >= 2 else np.ones(1)


def fill(tl: Timeline, classes: DeviceClasses, windows: list[Window], job: BackgroundJob, *,
         cap: float, switch_ms: float, policy: str = "fit", iterations: int = 4,
         margin: float = 0.0, actual_ms: np.ndarray | None = None,
         actual_switch_ms: float | None = None, alone_steps_ms=None, seed: int = 0,
         log_decisions: bool = False) -> Fill:
  """Run the policy over `iterations` steady iterations (after a warm-up one).

  actual_ms: each piece's true time (default: its profiled time, the policy's prediction);
  actual_switch_ms: the true host time after each piece (default: switch_ms, the one charged);
  alone_steps_ms: measured alone iterations whose spread is the foreground's noise (seeded by
  `seed`; default: none, no noise); log_decisions: return every admission decision.
  """
  validate(cap, switch_ms, policy, iterations)
  true_switch = switch_ms if actual_switch_ms is None else actual_switch_ms
  validate(cap, true_switch, policy, iterations)
  actual = job.pieces_ms if actual_ms is None else np.asarray(actual_ms, dtype=float)
  if actual.shape != job.pieces_ms.shape:
    raise ValueError(f"actual_ms has {actual.shape} pieces, the job {job.pieces_ms.shape}")
  factors = noise_factors(alone_steps_ms)
  noisy = len(factors) >= 2
  admission = Admission(job.pieces_ms, cap=cap, alone_ms=tl.iteration_ms, margin=margin,
                        switch_ms=switch_ms,
                        alone_steps_ms=tl.iteration_ms * factors if noisy else (),
                        log_decisions=log_decisions)
  scale = (np.random.default_rng(seed).choice(factors, size=iterations + 2) if noisy
           else np.ones(iterations + 2))
  sim = _Sim(tl, classes, windows, job, actual, admission, iterations, scale, float(true_switch))
  times, work, steps, free, events = sim.run()
  return Fill(float(cap), tl.iteration_ms, sim.used, times[1:], work[1:], steps[1:], free[1:],
              tuple(events), float(times[0]), admission.admitted, admission.refused,
              tl.iteration_ms * float(factors.mean()), admission.tightened, admission.usable,
              tuple(admission.decisions or ()))


class _Sim:
  """Re-times the foreground task graph with the pieces the policy admits."""

  def __init__(self, tl, classes, windows, job, actual, admission, iterations, scale, switch):
    self.tl, self.classes, self.windows, self.job = tl, classes, windows, job
    self.switch = switch  # the true host time after each piece (the policy charges its own)
    self.actual, self.policy, self.iterations = actual, admission, iterations
    self.scale = scale  # per iteration (warm-up first): the foreground's noise factor
    self.order = np.lexsort((np.arange(len(tl.tasks)), tl.start_ms))
    self.deps = [t.deps for t in tl.tasks]
    self.dur = [t.duration_ms for t in tl.tasks]
    self.closing: list[list[int]] = [[] for _ in tl.tasks]
    for w, win in enumerate(windows):
      if win.opener >= 0:
        for i in win.closers:
          self.closing[i].append(w)
    self.step = float(actual.sum())
    self.sizes = classes.sizes
    self.ranges = [[tuple(int(x) for x in np.searchsorted(classes.bounds, [a, a + c]))
                    for a, c in t.spans] for t in tl.tasks]
    self.used = np.zeros(len(windows), dtype=bool)

  def pieces(self, w: int, c: int, opened: float, closes: float,
             nxt: np.ndarray) -> list[tuple[float, float]]:
    """Pieces the policy admits into window w of class c, as (start, end) device times; none
    starts at or after `closes`, when the closing foreground task is ready."""
    length, t, out = self.windows[w].length_ms, 0.0, []
    n = len(self.actual)
    device = int(self.classes.bounds[c])
    while opened + t < closes and self.policy.admit(int(nxt[c]), length - t, device=device,
                                                    window=w):
      k = int(nxt[c])
      a = float(self.actual[k])
      self.policy.observe(k, a)
      out.append((opened + t, opened + t + a))
      t += a + self.switch
      nxt[c] = (k + 1) % n
    if out:
      self.used[w] = True
    return out

  def run(self):
    """Per iteration (warm-up first): period, background device-ms and steps; last events."""
    tl, n, k_classes = self.tl, len(self.tl.tasks), len(self.classes)
    nxt = np.zeros(k_classes, dtype=np.int64)
    last_end = np.zeros(k_classes)  # end of the latest foreground task begun on each class
    bg_until = np.zeros(k_classes)  # when each class's running background piece hands back
    origin, first, previous = 0.0, True, None
    times, work, steps, free = [], [], [], []
    events: list[Event] = []
    shown: list[tuple[int, float, float]] = []
    recorded = (0.0, 0.0)
    idle_classes = sorted({w.cls for w in self.windows if w.opener < 0})
    self.used[[w for w, win in enumerate(self.windows) if win.opener < 0]] = True
    # One more iteration than reported: the last one's tail is filled at the next one's start.
    for k in range(self.iterations + 2):
      if k:  # the policy's iterations count as the runtime's: the first starts at creation
        self.policy.next_iteration(previous)
      start, end = np.zeros(n), np.zeros(n)
      done: set[int] = set()
      bg = 0.0
      dur = [d * float(self.scale[k]) for d in self.dur]
      last = k == self.iterations
      keep = k >= self.iterations
      for i in self.order:
        ready = max((end[d] for d in self.deps[i]), default=origin)
        for w in self.closing[i]:
          if w in done:
            continue
          done.add(w)
          if self.windows[w].wrap and first:
            continue  # the first iteration has no previous tail
          c = self.windows[w].cls
          opened = max(last_end[c], bg_until[c])
          ran = self.pieces(w, c, opened, ready, nxt)
          if ran:
            bg += sum(e - s for s, e in ran) * self.sizes[c]
            bg_until[c] = ran[-1][1] + self.switch
            if keep:
              shown.extend((c, s, e) for s, e in ran)
        s = ready
        for lo, hi in self.ranges[i]:
          s = max(s, float(bg_until[lo:hi].max()))
        start[i], end[i] = s, s + dur[i]
        for lo, hi in self.ranges[i]:
          np.maximum(last_end[lo:hi], end[i], out=last_end[lo:hi])
      finish = float(end.max()) if n else origin + tl.iteration_ms * float(self.scale[k])
      period = finish - origin
      free.append(sum(period * self.sizes[c] for c in idle_classes))
      bg += free[-1]
      if last:
        shown.extend((c, origin, finish) for c in idle_classes)
        events = self.tl.events(start - origin, end - origin)
        recorded = (origin, finish)
      times.append(period)
      work.append(bg)
      steps.append(bg / self.step)
      origin, first, previous = finish, False, period
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
