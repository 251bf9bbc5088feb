"""The main job's slowdown under a machine whose load drifts: the background job on and off in
alternating windows (issue: the quick start failed its cap on a busy machine)."""

import pytest
from test_multiplex_agreement import ALONE, lockstep

from dp_jax.orchestrator.launch import measure
from dp_jax.orchestrator.scheduler import BackgroundScheduler

W = 3


def test_steps_alternate_on_and_off_and_the_first_off_step_counts_as_with():
  hook = BackgroundScheduler(None, start_after=ALONE, window_steps=W)
  kinds = [hook.step_kind(k) for k in range(ALONE + 4 * W)]
  assert kinds[:ALONE] == ["skipped"] * 2 + ["calibration"] * 3
  assert kinds[ALONE:] == (["with"] * W + ["with"] + ["alone"] * (W - 1)) * 2
  assert [hook.background_on(k) for k in range(ALONE, ALONE + 2 * W)] == [True] * W + [False] * W


def drifting_steps(n: int, hook, slowdown: float) -> list[float]:
  """Step times of a machine whose load grows 3% a step; the job adds `slowdown` where on."""
  return [100.0 * (1 + 0.03 * k) * (1 + slowdown * (hook.step_kind(k) == "with"))
          for k in range(n)]


def test_interleaved_windows_cancel_a_drift_that_sequential_ones_read_as_slowdown():
  n = ALONE + 8 * W
  sequential = BackgroundScheduler(None, start_after=ALONE)
  interleaved = BackgroundScheduler(None, start_after=ALONE, window_steps=W)
  seq = measure(drifting_steps(n, sequential, 0.05), sequential)
  inter = measure(drifting_steps(n, interleaved, 0.05), interleaved)
  assert seq["foreground_slowdown"] > 0.4  # the drift, read as the job's slowdown
  assert inter["foreground_slowdown"] == pytest.approx(0.05, abs=0.03)
  assert inter["window_steps"] == W and seq["window_steps"] is None
  assert inter["alone_steps_measured"] == 4 * (W - 1)
  assert inter["with_steps_measured"] == 4 * (W + 1)
  assert inter["host_cores"] >= 1 and inter["host_load"] >= 0


def test_no_piece_is_admitted_in_an_off_window():
  """The scheduler on a fake clock: every admitted piece's iteration is an on window's step."""
  hook, decisions = lockstep(10.0, steps=4 * W, window_steps=W)
  admitted_steps = {ALONE + d.iteration for d in decisions if d.admitted}
  assert admitted_steps, "the job ran no piece"
  assert all(hook.background_on(k) for k in admitted_steps), sorted(admitted_steps)
  on_windows = {(k - ALONE) // (2 * W) for k in admitted_steps}
  assert on_windows == {0, 1}, sorted(admitted_steps)  # it resumes after an off window
