"""A measured alone step as a chain timeline, filled by the shared policy."""

import math

import numpy as np
import pytest

from dp_jax.multiplex.policy import Admission, BackgroundJob
from dp_jax.simulator.measured import chain_timeline, fill_measured, spans_of

CALLS = [((0, 1), 4.0, "0:fwd"), ((0,), 6.0, "1:fwd_bwd"), ((0, 1), 5.0, "0:bwd")]


def job(pieces):
  return BackgroundJob("bg", 2, tuple(str(i) for i in range(len(pieces))), np.array(pieces), 0.0)


def test_spans_and_chain():
  assert spans_of([3, 0, 1]) == ((0, 2), (3, 1))
  tl = chain_timeline(CALLS, 2)
  assert tl.iteration_ms == 15.0 and list(tl.start_ms) == [0.0, 4.0, 10.0]


def test_device_1_fills_its_window_and_the_cap_bounds_the_overrun():
  fitting = fill_measured(CALLS, 2, job([2.0, 2.0, 2.0]), cap=0.0, iterations=3)
  assert np.allclose(fitting.iteration_ms, 15.0)
  assert fitting.bg_steps == pytest.approx([1.0, 1.0, 1.0])  # 3 x 2 ms in the 6 ms window
  long = fill_measured(CALLS, 2, job([4.0, 4.0]), cap=0.1, iterations=3)
  assert long.iteration_ms.max() <= 16.5 + 1e-9
  free = fill_measured(CALLS, 2, job([4.0, 4.0]), cap=math.inf, iterations=3)
  assert free.iteration_ms.max() == pytest.approx(17.0)  # 2 pieces: 8 ms in a 6 ms window
  assert free.bg_steps.sum() > long.bg_steps.sum()


def test_alone_noise_scales_each_simulated_iteration_by_a_measured_factor():
  steps = [14.0, 15.0, 16.0, 15.5, 13.5]  # median 15: factors 14/15, 1, 16/15, ...
  never = job([100.0])  # never fits the 6 ms window: the foreground alone
  a = fill_measured(CALLS, 2, never, cap=0.0, iterations=30, alone_steps_ms=steps, seed=1)
  b = fill_measured(CALLS, 2, never, cap=0.0, iterations=30, alone_steps_ms=steps, seed=1)
  c = fill_measured(CALLS, 2, never, cap=0.0, iterations=30, alone_steps_ms=steps, seed=2)
  assert a.bg_steps.sum() == 0 and np.array_equal(a.iteration_ms, b.iteration_ms)
  assert not np.array_equal(a.iteration_ms, c.iteration_ms)
  assert set(np.round(a.iteration_ms, 9)) <= set(np.round(steps, 9))  # 15 x steps / 15
  assert len(set(a.iteration_ms)) > 1
  assert a.alone_ms == 15.0 and a.alone_mean_ms == pytest.approx(np.mean(steps))
  quiet = fill_measured(CALLS, 2, never, cap=0.0, iterations=3)
  assert np.allclose(quiet.iteration_ms, 15.0) and quiet.alone_mean_ms == 15.0


def test_a_piece_never_starts_after_the_foreground_is_back():
  """At half speed device 1's window is 3 ms, not the predicted 6: of three 2 ms pieces that fit
  the prediction, the third would start after the foreground's call and does not."""
  sim = fill_measured(CALLS, 2, job([2.0, 2.0, 2.0]), cap=math.inf, iterations=20,
                      alone_steps_ms=[7.5, 15.0, 15.0], seed=0)
  fast = sim.iteration_ms < 10.0
  assert fast.any() and (~fast).any()
  assert np.allclose(sim.bg_work_ms[fast], 4.0)  # pieces at 0 and 2 ms into the window
  assert np.allclose(sim.iteration_ms[fast], 8.5)  # 7.5 + the second piece's 1 ms overrun
  assert np.allclose(sim.bg_work_ms[~fast], 6.0) and np.allclose(sim.iteration_ms[~fast], 15.0)


def test_the_simulated_feedback_learns_the_same_noise(monkeypatch):
  steps = [150.0, 160.0, 170.0, 180.0, 190.0, 200.0, 210.0, 180.0]  # +-17% around the median
  args = (CALLS, 2, job([2.0, 2.0, 2.0]))
  kw = dict(cap=0.05, iterations=40, alone_steps_ms=steps, seed=3)
  sim = fill_measured(*args, **kw)
  assert sim.tightened == 0 and sim.usable_at_end == 1.0 and sim.bg_steps.sum() > 0
  monkeypatch.setattr(Admission, "excess_threshold_ms", lambda self, m=None: 0.0)
  assert fill_measured(*args, **kw).tightened > 0  # the same noise, taken for an excess
