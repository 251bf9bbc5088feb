"""The runtime's gate and the simulator make the same admission decisions on the same inputs.

One foreground step of three calls (device 1 idle during the middle one) and one background job
whose pieces take fixed times, on both sides: the runtime's BackgroundScheduler (hook, dispatch
thread, gate) driven on a fake clock in lockstep with a fake runner, and the simulator's
fill_measured on the same calls; their decision logs (multiplex.Decision) must agree.
"""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dp_jax.multiplex.policy import STALE, BackgroundJob
from dp_jax.orchestrator.scheduler import BackgroundScheduler
from dp_jax.simulator.measured import fill_measured

CALLS = [((0, 1), 20.0, "0:fwd"), ((0,), 150.0, "1:fwd_bwd"), ((0, 1), 50.0, "0:bwd")]
STAGES = 3  # the job's stages: pieces fwd 0, fwd 1, fwd_bwd 2, bwd 1, bwd 0
PROFILE_MS = np.array([10.0, 60.0, 100.0, 30.0, 140.0])
# The first four pieces run 1.3x their profile (the runtime measured such ratios in a first window),
# the last as profiled: the job-wide ratio overpredicts the 140 ms piece.
ACTUAL_MS = PROFILE_MS * np.array([1.3, 1.3, 1.3, 1.3, 1.0])
SWITCH_MS, ALONE, STEPS = 2.0, 5, 30


class Clock:
  """Seconds, advanced only by the test's foreground and the fake runner's pieces."""

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


class FakeRunner:
  """A job on one device: each piece passes the gate, then 'runs' its actual time on the clock
  (and the switch after it), recorded in `timer` as the runtime's step does."""

  def __init__(self, clock: Clock):
    self.clock, self.busy_until = clock, clock.now
    stage = SimpleNamespace(mesh=SimpleNamespace(devices=np.array([])))
    self.program = SimpleNamespace(stages=[stage] * STAGES)

  def step(self, gate, timer):
    order = ([(i, "fwd") for i in range(STAGES - 1)] + [(STAGES - 1, "fwd_bwd")]
             + [(i, "bwd") for i in range(STAGES - 2, -1, -1)])
    for k, (stage, phase) in enumerate(order):
      gate(SimpleNamespace(stage=SimpleNamespace(index=stage)), phase)
      start = self.clock.now
      self.clock.now += ACTUAL_MS[k] / 1e3
      timer.append({"phase": phase, "start_s": start, "end_s": self.clock.now})
      self.clock.now += SWITCH_MS / 1e3
      self.busy_until = self.clock.now
    return 0.0


def call(hook, index: int, devices, phase: str) -> None:
  hook(SimpleNamespace(stage=SimpleNamespace(index=index, devices=devices)), phase)


def wait_for_refusal(hook, seen: int) -> None:
  """Until the dispatch thread logs a refusal after decision `seen` (it then waits for the
  next window)."""
  deadline = time.monotonic() + 10.0
  while not any(not d.admitted for d in hook.admission.decisions[seen:]):
    assert time.monotonic() < deadline, "the dispatch thread made no decision"
    threading.Event().wait(0.0005)


def lockstep(cap: float, *, steps: int = STEPS, batch: int = 1, switch_ms: float = SWITCH_MS,
             **scheduler):
  """The runtime's hook driven in lockstep with a fake runner on a fake clock: ALONE steps
  alone, then `steps` (the job admitted in the steps background_on allows); `scheduler`: more
  BackgroundScheduler options. Returns (hook, its decisions), the hook drained."""
  clock = Clock()
  runner = FakeRunner(clock)
  job = BackgroundJob("fake", batch, tuple(map(str, range(len(PROFILE_MS)))), PROFILE_MS, 0.0)
  hook = BackgroundScheduler(job, {1: runner}, start_after=ALONE, slowdown_cap=cap,
                             switch_ms=switch_ms, log_decisions=True, clock=clock, **scheduler)
  (busy0, ms0, _), (busy1, ms1, _), (busy2, ms2, _) = CALLS
  for step in range(ALONE + steps):
    call(hook, 0, busy0, "fwd")
    clock.now += ms0 / 1e3
    seen, opened = len(hook.admission.decisions) if hook.admission else 0, clock.now
    call(hook, 1, busy1, "fwd_bwd")
    if hook.background_on(step):
      wait_for_refusal(hook, seen)  # the pieces moved the clock
    # the foreground's next call waits for a piece still running on device 1
    clock.now = max(opened + ms1 / 1e3, runner.busy_until)
    call(hook, 0, busy2, "bwd")
    clock.now += ms2 / 1e3
  decisions = list(hook.admission.decisions)
  hook.drain()
  return hook, decisions


def runtime_decisions(cap: float):
  """The runtime's decisions: ALONE steps alone, then STEPS with the job, in lockstep."""
  return lockstep(cap)


def key(d):
  return (d.iteration, d.piece, d.admitted, d.why)


@pytest.mark.parametrize("cap", [0.05, 0.25])
def test_the_runtime_gate_and_the_simulator_decide_alike_on_the_same_inputs(cap):
  hook, runtime = runtime_decisions(cap)
  sim = fill_measured(CALLS, 2, hook.job, cap=cap, iterations=STEPS, switch_ms=SWITCH_MS,
                      actual_ms=ACTUAL_MS, alone_steps_ms=hook.alone_steps_ms,
                      log_decisions=True)
  # the runtime also logs a piece asked after its window ended; the simulator stops there
  asked = [d for d in runtime if d.why != "window closed"]
  simulated = [d for d in sim.decisions if d.why != "window closed" and d.iteration < STEPS]
  assert hook.admission.switch == SWITCH_MS and hook.baseline_ms == pytest.approx(220.0)
  assert [key(d) for d in asked] == [key(d) for d in simulated]
  for a, s in zip(asked, simulated, strict=True):
    assert a.left_ms == pytest.approx(s.left_ms, abs=1e-6)
    assert a.cost_ms == pytest.approx(s.cost_ms, abs=1e-6)
    assert a.budget_ms == pytest.approx(s.budget_ms, abs=1e-6)
  assert sum(d.admitted for d in asked) > 2 * len(PROFILE_MS)  # whole steps ran
  assert any(d.why == "over budget" for d in asked)


def test_a_stale_job_wide_ratio_refuses_a_piece_at_most_stale_times_in_a_row():
  """The 140 ms piece fits window + budget at its profile, not at the 1.3x job-wide ratio the
  first pieces taught: it waits STALE windows, then runs (it starved the job before)."""
  _, runtime = runtime_decisions(0.05)
  run = longest = 0
  for d in runtime:
    if d.piece == 4 and d.why == "over budget":
      run += 1
      longest = max(longest, run)
    elif d.piece == 4 and d.admitted:
      run = 0
  assert longest == STALE
  assert any(d.piece == 4 and d.admitted for d in runtime)


def test_a_hold_that_ends_while_a_piece_runs_probes_no_move():
  """A probe times hold end -> next call as the move; a piece of this process still running
  would delay that call too (cap inf on a loaded machine: 166-224 ms probes for a 158 ms call,
  which closed every later window)."""
  clock = Clock()
  job = BackgroundJob("fake", 1, tuple(map(str, range(len(PROFILE_MS)))), PROFILE_MS, 0.0)
  hook = BackgroundScheduler(job, {1: FakeRunner(clock)}, own_devices=[1], clock=clock)
  hook.running.add(1)
  hook._hold(0, clock.now)
  assert hook._released is None and hook.spoilt_probes == 1
  hook.running.clear()
  hook._hold(0, clock.now)
  assert hook._released == (0, clock.now) and hook.spoilt_probes == 1
