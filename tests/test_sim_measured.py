"""A measured alone step as a chain timeline, filled by the shared policy."""

import math

import numpy as np
import pytest

from dp_jax.multiplex import BackgroundJob
from dp_jax.sim.measured import chain_timeline, fill_measured, spans_of

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
