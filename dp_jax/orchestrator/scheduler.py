"""Multiplexing on real devices: the foreground's on_stage hook and a dispatch thread per device.

The runtime calls the hook with (stage_program, phase) just before each foreground stage call
(fwd | fwd_bwd | bwd). The first `start_after` steps run alone: compile, the timed step, then
the alone steps whose call-to-call times predict each idle window (the baseline). From then on,
at every call the hook marks the job's devices the stage uses as busy and every other device as
idle until its next predicted foreground call, and wakes the dispatch threads.

Interleaved windows (`window_steps` > 0): after the alone steps the background job is on for
window_steps steps, off for window_steps, on, off, ... (`step_kind`). A slowdown measured as the
mean of the "with" steps over the mean of the "alone" ones then compares steps taken side by
side in time, so a change in the machine's load from other processes cancels to first order
instead of reading as a slowdown (or hiding one). The first step of an off window counts as a
"with" step (a piece admitted before it may still run), and each on window's admission is
rebased on the alone time of the off window before it (`Admission.rebase`).

Each job device has one dispatch thread running the job's steps (orchestrator/runners.py);
before each piece, the thread asks the shared policy (dp_jax/multiplex/policy.py) whether the
piece's
predicted time (plus the switch cost, `switch_ms`, as the simulator charges it) fits what is
left of the device's window or its overrun fits the iteration's budget; if not, it waits for the
next window (`log_decisions`: the policy keeps every decision, as the simulator's can). Each
piece is waited for and measured (one piece outstanding per device) and corrects the next
predictions; each foreground step's time feeds the slowdown back (the policy compares the mean
of the last steps with the cap, beyond the noise of the alone steps it is given). On CPU a
program runs on the thread that dispatches it, so only separate threads let pieces run beside
the foreground; on a GPU the same threads issue into each device's queue. With several
processes, a process that owns none of a stage's devices is held until the call's predicted end,
so that the move it would post next does not occupy its idle devices. A failing job (exception
or non-finite loss) is logged and stopped; the foreground never reads background arrays.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.multiplex.policy import Admission, BackgroundJob, check_cap
from dp_jax.orchestrator.runners import PIECE_PHASES, DeviceRunner, piece_index

log = logging.getLogger(__name__)
SKIP_STEPS = 2  # a call's first two steps: compilation, and the timed (fully waited) step
# Full-length holds whose end-to-next-call times measure a move (several processes): a probe
# ending while the stage is still running measures more than the move, so the shortest of a few
# is taken; one late stage (another job's spike) does not spoil it.
PROBES = 3
CHECKPOINT_FILE = "background.npz"


def idle_devices(stage_devices: Iterable[int], job_devices: Iterable[int]) -> tuple[int, ...]:
  """The job's devices a stage leaves idle."""
  used = set(stage_devices)
  return tuple(d for d in job_devices if d not in used)


def idle_by_stage(stages: Sequence[Any], job_devices: Iterable[int]) -> dict[int, tuple[int, ...]]:
  """Stage index -> the job's devices idle while it runs (stages: runtime Stage objects)."""
  devs = tuple(job_devices)
  return {s.index: idle_devices(s.devices, devs) for s in stages}


def window_ms(durations: Sequence[float], uses: Sequence[frozenset[int]],
              devices: Iterable[int]) -> list[dict[int, float]]:
  """Per call j, per device idle at j: predicted ms until the next call that uses it (cyclic;
  inf if no call does)."""
  n = len(durations)
  out: list[dict[int, float]] = []
  for j in range(n):
    row = {}
    for d in devices:
      if d in uses[j]:
        continue
      total, hit = 0.0, False
      for i in range(n):
        c = (j + i) % n
        if d in uses[c]:
          hit = True
          break
        total += durations[c]
      row[d] = total if hit else math.inf
    out.append(row)
  return out


@dataclass
class BackgroundStats:
  """What the background job did: completed steps per device, pieces, failures, active time."""

  completed: dict[int, int] = field(default_factory=dict)
  dispatched: int = 0  # pieces started
  failures: int = 0
  errors: list[str] = field(default_factory=list)
  refused: int = 0  # admission refusals
  active_s: float = 0.0  # wall time the job was on: from its first step to drain(), less off
  # windows (interleaved)
  piece_ms: float = 0.0  # measured device time of the pieces run before drain(), all devices
  batch: int = 0
  # what the replay runs on (orchestrator/replay.py): per piece index, each measured time (ms)
  # of the pieces run before drain(); and each host gap (ms) from a piece's end to the next
  # piece's start on its device when the gate admitted that one at once (no wait for a window)
  piece_times_ms: dict[int, list[float]] = field(default_factory=dict)
  gaps_ms: list[float] = field(default_factory=list)

  @property
  def steps(self) -> int:
    return sum(self.completed.values())

  @property
  def samples_per_s(self) -> float | None:
    return self.steps * self.batch / self.active_s if self.active_s > 0 else None

  def metrics(self) -> dict[str, Any]:
    return {"steps": self.steps, "dispatched": self.dispatched, "failures": self.failures,
            "refused": self.refused, "samples_per_s": self.samples_per_s}


class _Stop(Exception):
  """Raised in a dispatch thread's gate when the job is stopped mid-step."""


class BackgroundScheduler:
  """The on_stage hook of a background job; its counters are in `.stats`."""

  def __init__(self, job: BackgroundJob | None, runners: dict[int, DeviceRunner] | None = None,
               *, start_after: int = 0, slowdown_cap: float = math.inf, margin: float = 0.0,
               switch_ms: float = 0.0, failures: Sequence[str] = (),
               checkpoint_dir: str | Path | None = None, checkpoint_every: int = 0,
               own_devices: Iterable[int] | None = None, log_decisions: bool = False,
               window_steps: int = 0, clock: Callable[[], float] = time.perf_counter):
    self.job = job
    if isinstance(window_steps, bool) or not isinstance(window_steps, int) or window_steps < 0:
      raise ValueError(f"window_steps must be an integer >= 0, got {window_steps!r}")
    self.window_steps = window_steps  # 0: the job on at every step after start_after
    self.clock = clock  # seconds; a test drives the hook and the pieces on one fake clock
    self.log_decisions = log_decisions  # the policy keeps every decision (admission.decisions)
    # Several processes: this process's devices; a stage on none of them is held (see __call__)
    self.own_devices = frozenset(own_devices) if own_devices is not None else None
    self.runners = dict(runners or {})
    # CPU programs may run after their call returns; waiting for each foreground stage call
    # makes the hook's call-to-call times execution times (windows). Not on GPUs: see docs.
    self.wait_for_stages = any(
        d.platform == "cpu" for r in self.runners.values()
        for d in r.program.stages[0].mesh.devices.flat)
    self.start_after = start_after
    self.cap = check_cap(math.inf if slowdown_cap is None else slowdown_cap)
    self.margin = margin
    self.switch_ms = switch_ms  # host time to hand a device back after a piece (policy's switch)
    self.stats = BackgroundStats({d: 0 for d in self.runners}, failures=len(failures),
                                 errors=list(failures), batch=job.batch if job else 0)
    self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    self.checkpoint_every = checkpoint_every
    self.cond = threading.Condition()
    self.window_end: dict[int, float | None] = {d: None for d in self.runners}
    self.window_call: dict[int, int] = {d: -1 for d in self.runners}  # call that opened it
    self.running: set[int] = set()  # devices whose admitted piece has not handed back yet
    self.spoilt_probes = 0  # holds that ended while a piece ran: not taken as move probes
    self.generation = 0
    self.admission: Admission | None = None
    self.step_starts: list[float] = []
    self.calls: list[list[tuple[int, str, frozenset[int], float]]] = []
    self.positions: dict[tuple[int, str], int] = {}
    self.windows: list[dict[int, float]] = []
    self.durations: list[float] = []  # predicted ms from each call to the next (alone steps)
    self.held_s = 0.0  # time the foreground was held for its idle devices (several processes)
    self.move_ms: dict[int, list[float]] = {}  # per held call: probe's end -> next call, ms
    self._released: tuple[int, float] | None = None  # (held call, when its hold ended)
    self.alone_calls: list[tuple[tuple[int, ...], float, str]] = []  # (devices, ms, stage:phase)
    self.baseline_ms: float | None = None  # median of alone_steps_ms
    self.alone_steps_ms: list[float] = []  # the alone steps after the first two (their noise)
    self.threads: list[threading.Thread] = []
    self.stopping = False
    self.free_run = False  # pieces run without admission (drain, checkpoint)
    self.pause_requested = False
    self.paused: set[int] = set()  # threads waiting at a step boundary
    self._t0: float | None = None
    self._t_stop: float | None = None
    self.on_s = 0.0  # seconds of the steps that admitted the job (interleaved windows)

  @property
  def alive(self) -> bool:
    return self.job is not None

  @property
  def step(self) -> int:
    """Index (in this run) of the foreground step being dispatched."""
    return len(self.step_starts) - 1

  def background_on(self, k: int) -> bool:
    """Whether step k of this run admits background pieces (see window_steps)."""
    if k < self.start_after:
      return False
    return not self.window_steps or (k - self.start_after) // self.window_steps % 2 == 0

  def step_kind(self, k: int) -> str:
    """What step k measures: "skipped" (compile, the timed step), "calibration" (the alone
    steps that predict the windows), "with" (the job admitted during it, or in the step before,
    whose pieces may spill into it) or "alone" (an off window's step after its first)."""
    if k < min(SKIP_STEPS, self.start_after):
      return "skipped"
    if k < self.start_after:
      return "calibration"
    return "with" if self.background_on(k) or self.background_on(k - 1) else "alone"

  # --- the foreground's hook (main thread) ---------------------------------------------------

  def __call__(self, sp, phase: str) -> None:
    now = self.clock()
    if sp.stage.index == 0 and phase != "bwd":
      self._step_started(now)
    devices = frozenset(sp.stage.devices)
    if self.step < self.start_after:
      self.calls[-1].append((sp.stage.index, phase, devices, now))
      return
    if not self.threads or not self.background_on(self.step):
      return
    j = self.positions.get((sp.stage.index, phase))
    if self._released is not None:  # the previous call was a probe: its move's time
      k, released = self._released
      self.move_ms.setdefault(k, []).append(1e3 * (now - released))
      self._released = None
    held = (j is not None and self.own_devices is not None and self.alive
            and not devices & self.own_devices)
    until = now + (self.durations[j] - self.lead_ms(j)) / 1e3 if held else math.inf
    with self.cond:
      for d in self.window_end:
        if d in devices:
          self.window_end[d] = None
        elif j is not None:
          self.window_end[d] = min(now + self.windows[j][d] / 1e3, until)
          self.window_call[d] = j
      self.generation += 1
      self.cond.notify_all()
    if held:
      self._hold(j, until)

  def _hold(self, j: int, until: float) -> None:
    """Hold the foreground's thread until `until`: call j's predicted end, less its move's time.

    With several processes, a process that owns none of a stage's devices skips the call and
    would at once post the move that follows: a collective program that occupies its devices
    until the stage's owners reach it, so its devices are not idle. Holding the thread keeps
    them idle for the pieces. After PROBES full-length holds that probed the move, a hold ends
    early by the move's time (`lead_ms`), so that the move is posted when the stage's owners
    reach it; a late stage waits for the move as it would anyway, an early one waits for the
    hold (window error, docs/orchestrator.md). A hold that ends while one of this process's
    pieces still runs is no probe: the next call waits for the piece too.
    """
    left = until - self.clock()
    if left > 0:
      time.sleep(left)
      self.held_s += left
    if len(self.move_ms.get(j, ())) < PROBES:
      with self.cond:
        busy = bool(self.running)
      if busy:  # the next call would wait for the piece too: not the move's time
        self.spoilt_probes += 1
      else:
        self._released = (j, self.clock())

  def lead_ms(self, j: int) -> float:
    """How much earlier than call j's predicted end its hold ends: 0 until PROBES holds probed
    the move (full length), then the shortest time seen from a probe's end to the next call."""
    seen = self.move_ms.get(j, ())
    return min(seen) if len(seen) >= PROBES else 0.0

  def _step_started(self, now: float) -> None:
    self.step_starts.append(now)
    k = self.step
    if k < self.start_after:
      self.calls.append([])
      return
    if k == self.start_after:
      self._t0 = now
      self._calibrate()
      if self.alive and self.runners:
        self._start_threads()
    elif self.admission is not None:
      last_ms = 1e3 * (now - self.step_starts[-2])
      if self.background_on(k - 1):
        self.on_s += last_ms / 1e3
      with self.cond:
        # an alone step (an off window's) is no measure of the job's slowdown
        self.admission.next_iteration(last_ms if self.background_on(k - 1) else None)
        if self.background_on(k) and not self.background_on(k - 1):
          self._rebase(k)
        elif not self.background_on(k):  # an off window: no device is lent
          for d in self.window_end:
            self.window_end[d] = None
          self.generation += 1
          self.cond.notify_all()
    since = k - self.start_after
    if (self.checkpoint_every and self.checkpoint_dir is not None and self.threads
        and self.alive and since > 0 and since % self.checkpoint_every == 0):
      self.save(self.checkpoint_dir)

  def _rebase(self, k: int) -> None:
    """An on window starts at step k: its admission measures against the alone steps of the
    off window that just ended (the machine's load now), when it has two or more."""
    ms = [1e3 * (b - a) for i, (a, b) in enumerate(zip(self.step_starts[:-1],
                                                       self.step_starts[1:], strict=True))
          if i >= k - self.window_steps and self.step_kind(i) == "alone"]
    if len(ms) >= 2:
      self.admission.rebase(statistics.median(ms))

  def _calibrate(self) -> None:
    """Baseline step time and per-call durations from the alone steps after the first two."""
    steps = list(zip(self.calls, self.step_starts[1:], strict=False))[SKIP_STEPS:]
    if not steps or not self.alive:
      return
    self.alone_steps_ms = [1e3 * (b - a) for a, b in zip(
        self.step_starts[SKIP_STEPS:], self.step_starts[SKIP_STEPS + 1:], strict=False)]
    self.baseline_ms = statistics.median(self.alone_steps_ms)
    seq = [(s, p, d) for s, p, d, _ in steps[-1][0]]
    durations = []
    for j in range(len(seq)):
      per = []
      for calls, end in steps:
        if [(s, p, d) for s, p, d, _ in calls] != seq:
          continue
        nxt = calls[j + 1][3] if j + 1 < len(calls) else end
        per.append(1e3 * (nxt - calls[j][3]))
      durations.append(statistics.median(per))
    self.positions = {(s, p): j for j, (s, p, _) in enumerate(seq)}
    self.durations = durations
    self.alone_calls = [(tuple(sorted(d)), ms, f"{s}:{p}")
                        for (s, p, d), ms in zip(seq, durations, strict=True)]
    self.windows = window_ms(durations, [d for *_, d in seq], self.window_end)
    self.admission = Admission(self.job.pieces_ms, cap=self.cap, alone_ms=self.baseline_ms,
                               alone_steps_ms=self.alone_steps_ms, margin=self.margin,
                               switch_ms=self.switch_ms, log_decisions=self.log_decisions)

  # --- dispatch threads ----------------------------------------------------------------------

  def _start_threads(self) -> None:
    if self.admission is None:
      log.warning("background job %s has no alone steps to predict windows from; stopped",
                  self.job.model)
      self.job = None
      return
    for d in self.runners:
      t = threading.Thread(target=self._worker, args=(d,), name=f"dp_jax-bg-{d}", daemon=True)
      self.threads.append(t)
      t.start()

  def _worker(self, d: int) -> None:
    runner = self.runners[d]
    n = len(runner.program.stages)
    timer: list[dict[str, Any]] = []
    # last: the piece admitted last; end: when the device's last piece ended; gap_from: that
    # end if the gate admitted the next piece at once (its start - end is then host time)
    state = {"seen": 0, "last": None, "end": None, "gap_from": None}

    def observe() -> None:
      calls = [t for t in timer if t["phase"] in PIECE_PHASES]
      if len(calls) > state["seen"] and state["last"] is not None:
        t = calls[-1]
        ms = 1e3 * (t["end_s"] - t["start_s"])
        with self.cond:
          self.admission.observe(state["last"], ms)
          if self._t_stop is None:
            self.stats.piece_ms += ms
            self.stats.piece_times_ms.setdefault(state["last"], []).append(ms)
            if state["gap_from"] is not None:
              self.stats.gaps_ms.append(1e3 * (t["start_s"] - state["gap_from"]))
        state["end"] = t["end_s"]
      state["seen"] = len(calls)

    def gate(sp, phase: str) -> None:
      observe()
      k = piece_index(n, sp.stage.index, phase)
      with self.cond:
        self.running.discard(d)
        at_once = not self.free_run
        while not self.free_run:
          end, g = self.window_end[d], self.generation
          if end is not None and self.admission.admit(
              k, 1e3 * (end - self.clock()), device=d, window=self.window_call[d]):
            break
          if end is not None:
            self.stats.refused += 1
          at_once = False
          self.cond.wait_for(lambda g=g: self.free_run or self.generation != g)
        state["gap_from"] = state["end"] if at_once else None
        if self.stopping and self.job is None:
          raise _Stop
        self.stats.dispatched += 1
        self.running.add(d)
      state["last"] = k

    try:
      while True:
        with self.cond:
          if self.pause_requested and not self.stopping:
            self.paused.add(d)
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.pause_requested or self.stopping)
            self.paused.discard(d)
            state["end"] = None  # the pause is no host time of the job's
          if self.stopping:
            return
        timer.clear()
        state["seen"] = 0
        loss = runner.step(gate, timer)
        with self.cond:
          self.running.discard(d)
        observe()
        value = float(loss)
        if not math.isfinite(value):
          raise FloatingPointError(f"background loss is {value} on device {d}")
        with self.cond:
          if self._t_stop is None:
            self.stats.completed[d] += 1
    except _Stop:
      return
    except Exception as e:  # noqa: BLE001 - a background failure must not reach the foreground
      self._fail(e)

  def _fail(self, e: BaseException) -> None:
    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    with self.cond:
      name = self.job.model if self.job is not None else "?"
      log.warning("background job %s failed and is stopped (the foreground continues): %s",
                  name, msg)
      self.stats.failures += 1
      self.stats.errors.append(msg)
      self.job = None
      self.stopping = self.free_run = True
      self.cond.notify_all()

  # --- drain and checkpoints (main thread) ---------------------------------------------------

  def _pause_all(self) -> None:
    """Let every thread finish its step (pieces run freely) and wait at a step boundary."""
    with self.cond:
      self.pause_requested = self.free_run = True
      self.cond.notify_all()
      self.cond.wait_for(lambda: self.stopping or all(
          d in self.paused or not t.is_alive()
          for d, t in zip(self.runners, self.threads, strict=True)))

  def _resume_all(self) -> None:
    with self.cond:
      self.pause_requested = False
      self.free_run = self.stopping
      self.cond.notify_all()

  def drain(self) -> BackgroundStats:
    """Stop the threads after their current step; close the active window."""
    if self._t0 is not None and self._t_stop is None:
      self._t_stop = self.clock()
      if self.window_steps:  # the time the job was on: steps that admitted it
        last_on = self.background_on(self.step)
        self.stats.active_s = self.on_s + (self._t_stop - self.step_starts[-1] if last_on
                                           else 0.0)
      else:
        self.stats.active_s = self._t_stop - self._t0
    with self.cond:
      self.stopping = self.free_run = True
      self.cond.notify_all()
    for t in self.threads:
      t.join()
    if self.checkpoint_dir is not None and self.alive and self.threads:
      self.save(self.checkpoint_dir, paused=True)
    return self.stats

  def save(self, directory: str | Path, paused: bool = False) -> Path:
    """Write every device's job state (and step count) to directory/background.npz."""
    if not paused:
      self._pause_all()
    flat: dict[str, np.ndarray] = {}
    for d, r in self.runners.items():
      h = r.host_state()
      flat[f"{d}/steps"] = np.asarray(h["steps"])
      for path, leaf in _flatten(h["state"]):
        flat[f"{d}/{path}"] = leaf
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (CHECKPOINT_FILE + ".tmp.npz")
    np.savez(tmp, **flat)
    tmp.replace(directory / CHECKPOINT_FILE)
    if not paused:
      self._resume_all()
    return directory / CHECKPOINT_FILE


def load_checkpoint(runners: dict[int, DeviceRunner], directory: str | Path) -> bool:
  """Restore each runner from directory/background.npz if it is there; False if absent."""
  path = Path(directory) / CHECKPOINT_FILE
  if not path.is_file():
    return False
  with np.load(path) as saved:
    for d, r in runners.items():
      if f"{d}/steps" not in saved:
        raise UserError(f"{path} has no background state for device {d}; use another "
                        "checkpoint folder or the same background devices")
      leaves = []
      for p, leaf in _flatten(r.host_state()["state"]):
        key = f"{d}/{p}"
        if key not in saved or saved[key].shape != leaf.shape:
          raise UserError(f"{path} holds a different background job ({key}); use another "
                          "checkpoint folder or the same background model and batch")
        leaves.append(saved[key])
      treedef = jax.tree.structure(r.state)
      r.load({"state": jax.tree.unflatten(treedef, leaves), "steps": int(saved[f"{d}/steps"])})
  return True


def _flatten(tree) -> list[tuple[str, np.ndarray]]:
  return [(jax.tree_util.keystr(p), np.asarray(v))
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]]


def make_background_hook(job: BackgroundJob | None, runners: dict[int, DeviceRunner] | None = None,
                         **kwargs) -> BackgroundScheduler:
  """The on_stage(stage_program, phase) hook of `job` on its runners."""
  return BackgroundScheduler(job, runners, **kwargs)
