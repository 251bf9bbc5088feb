"""Dispatching background steps at the foreground's stage boundaries.

The runtime calls the hook with (stage_program, phase) just before it dispatches each stage
call ("fwd", "fwd_bwd" for the last stage, "bwd"). The hook then dispatches background steps
on the job's devices that this stage does not use. JAX dispatch is asynchronous and each
device runs its programs in order, so a background step lands in an idle device's queue
between its foreground stages; devices the stage needs get nothing new. At most
`max_in_flight` background steps per device are outstanding, so they never pile up.

The hook also times the foreground: a step starts when stage 0 is dispatched in the forward
direction. The first `start_after` steps of a run are left alone (warm-up and the baseline);
the baseline step time is the median of those after the first two (compile, timed step).
With a slowdown cap, dispatching pauses while the smoothed step time exceeds
(1 + cap) x baseline (DeepPool's target_slowdown_factor), and resumes when it falls below.
A failing job (exception at dispatch or in a step's result) is logged and stopped; the
foreground never sees its errors.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

from dp_jax.errors import UserError
from dp_jax.orchestrator.background import BackgroundJob

log = logging.getLogger(__name__)
SKIP_STEPS = 2  # a call's first two steps: compilation, and the timed (fully waited) step
EWMA = 0.5


def check_cap(cap: Any) -> float | None:
  """A slowdown cap >= 0 (None: no cap), or a one-line UserError."""
  if cap is None:
    return None
  if isinstance(cap, bool) or not isinstance(cap, (int, float)) or math.isnan(cap) or cap < 0:
    raise UserError(f"background slowdown_cap must be a number >= 0 (0.1: the foreground may "
                    f"slow down by 10%), got {cap!r}")
  return float(cap)


def idle_devices(stage_devices: Iterable[int], job_devices: Iterable[int]) -> tuple[int, ...]:
  """The job's devices a stage leaves idle."""
  used = set(stage_devices)
  return tuple(d for d in job_devices if d not in used)


def idle_by_stage(stages: Sequence[Any], job_devices: Iterable[int]) -> dict[int, tuple[int, ...]]:
  """Stage index -> the job's devices idle while it runs (stages: runtime Stage objects)."""
  devs = tuple(job_devices)
  return {s.index: idle_devices(s.devices, devs) for s in stages}


@dataclass
class BackgroundStats:
  """What the background job did: per-device completed steps, failures, its active window."""

  completed: dict[int, int] = field(default_factory=dict)
  dispatched: int = 0
  failures: int = 0
  errors: list[str] = field(default_factory=list)
  paused_steps: int = 0
  active_s: float = 0.0  # wall time from its first foreground step to drain()
  batch: int = 0

  @property
  def steps(self) -> int:
    return sum(self.completed.values())

  @property
  def samples_per_s(self) -> float | None:
    return self.steps * self.batch / self.active_s if self.active_s > 0 else None

  def metrics(self) -> dict[str, Any]:
    return {"steps": self.steps, "dispatched": self.dispatched, "failures": self.failures,
            "paused_steps": self.paused_steps, "samples_per_s": self.samples_per_s}


class BackgroundScheduler:
  """The on_stage hook: dispatches background steps on the devices each stage leaves idle."""

  def __init__(self, job: BackgroundJob | None, *, max_in_flight: int = 1, start_after: int = 0,
               slowdown_cap: float | None = None, failures: Sequence[str] = ()):
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
      raise UserError(f"background max_in_flight must be an integer >= 1, got {max_in_flight!r}")
    self.job = job
    self.max_in_flight = max_in_flight
    self.start_after = start_after
    self.cap = check_cap(slowdown_cap)
    devices = tuple(job.copies) if job is not None else ()
    self.stats = BackgroundStats({d: 0 for d in devices}, failures=len(failures),
                                 errors=list(failures), batch=job.batch if job else 0)
    self.in_flight: dict[int, deque] = {d: deque() for d in devices}
    self.step_starts: list[float] = []
    self.baseline_ms: float | None = None
    self.ratio: float | None = None
    self.paused = False
    self._t0: float | None = None

  @property
  def alive(self) -> bool:
    return self.job is not None

  @property
  def step(self) -> int:
    """Index (in this run) of the foreground step being dispatched."""
    return len(self.step_starts) - 1

  def __call__(self, sp, phase: str) -> None:
    if sp.stage.index == 0 and phase != "bwd":
      self._step_started()
    if not self.alive or self.step < self.start_after or self.paused:
      return
    for d in idle_devices(sp.stage.devices, self.in_flight):
      self._poll(d)
      if self.alive and len(self.in_flight[d]) < self.max_in_flight:
        self._dispatch(d)

  def drain(self) -> BackgroundStats:
    """Wait for every outstanding background step; close the active window."""
    for d in list(self.in_flight):
      while self.alive and self.in_flight[d]:
        self._collect(d, self.in_flight[d].popleft())
    if self._t0 is not None:
      self.stats.active_s = time.perf_counter() - self._t0
    return self.stats

  # --- internals -----------------------------------------------------------------------------

  def _step_started(self) -> None:
    now = time.perf_counter()
    self.step_starts.append(now)
    k = self.step
    if k == self.start_after:
      self._t0 = now
      times = [1e3 * (b - a) for a, b in zip(self.step_starts, self.step_starts[1:], strict=False)]
      alone = times[SKIP_STEPS:]
      self.baseline_ms = statistics.median(alone) if alone else None
    elif k > self.start_after and self.cap is not None and self.baseline_ms:
      r = 1e3 * (now - self.step_starts[-2]) / self.baseline_ms
      self.ratio = r if self.ratio is None else EWMA * self.ratio + (1 - EWMA) * r
      self.paused = self.ratio > 1 + self.cap
      self.stats.paused_steps += self.paused
    for d in list(self.in_flight):
      self._poll(d)

  def _dispatch(self, d: int) -> None:
    try:
      self.in_flight[d].append(self.job.dispatch(d))
      self.stats.dispatched += 1
    except Exception as e:  # noqa: BLE001 - a background failure must not reach the foreground
      self._fail(e)

  def _poll(self, d: int) -> None:
    """Count the device's finished steps (in order) without waiting."""
    q = self.in_flight.get(d, ())
    while self.alive and q and q[0].is_ready():
      self._collect(d, q.popleft())

  def _collect(self, d: int, loss: jax.Array) -> None:
    try:
      value = float(loss)
    except Exception as e:  # noqa: BLE001
      self._fail(e)
      return
    if not math.isfinite(value):
      self._fail(FloatingPointError(f"background loss is {value} on device {d}"))
      return
    self.stats.completed[d] += 1

  def _fail(self, e: BaseException) -> None:
    name = self.job.name if self.job is not None else "?"
    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    log.warning("background job %s failed and is stopped (the foreground continues): %s",
                name, msg)
    self.stats.failures += 1
    self.stats.errors.append(msg)
    self.job = None
    for q in self.in_flight.values():
      q.clear()


def make_background_hook(job: BackgroundJob | None, **kwargs) -> BackgroundScheduler:
  """The on_stage(stage_program, phase) hook of `job`; its counters are in `.stats`."""
  return BackgroundScheduler(job, **kwargs)
