"""dp_jax/convergence/steps_fit.py: McCandlish's steps(B) fit and time to accuracy."""

import math

import numpy as np
import pytest

from dp_jax.base.errors import UserError
from dp_jax.convergence.steps_fit import (
  StepsFit,
  best_batch,
  fit_steps,
  leave_one_out,
  time_to_accuracy_s,
)

BATCHES = [8, 16, 32, 64, 128, 256, 512]


@pytest.mark.parametrize("s_min,b_noise", [(30.0, 100.0), (5.0, 2000.0), (400.0, 12.0)])
def test_fit_recovers_the_model_from_exact_points(s_min, b_noise):
  steps = [s_min * (1 + b_noise / b) for b in BATCHES]
  fit = fit_steps(BATCHES, steps)
  assert fit.b_noise == pytest.approx(b_noise, rel=1e-3)
  assert fit.s_min == pytest.approx(s_min, rel=1e-3)
  assert fit.e_min == pytest.approx(s_min * b_noise, rel=2e-3)
  assert fit.log_rms < 1e-3 and fit.points == len(BATCHES)


def test_fit_with_noise_stays_close_and_reports_the_residual():
  rng = np.random.default_rng(0)
  steps = [30 * (1 + 100 / b) * math.exp(rng.normal(0, 0.1)) for b in BATCHES]
  fit = fit_steps(BATCHES, steps)
  assert 60 < fit.b_noise < 160 and 0.03 < fit.log_rms < 0.2
  assert fit.steps(100) == pytest.approx(fit.s_min * (1 + fit.b_noise / 100))


def test_points_that_never_reached_are_left_out():
  steps = [30 * (1 + 100 / b) for b in BATCHES]
  fit = fit_steps(BATCHES + [1024], steps + [math.inf])
  assert fit.points == len(BATCHES) and fit.b_noise == pytest.approx(100, rel=1e-3)


def test_fewer_than_two_batch_sizes_is_a_user_error():
  with pytest.raises(UserError, match="needs finite steps at >= 2 batch sizes"):
    fit_steps([8, 16], [100, math.inf])


def test_leave_one_out_fits_each_subset():
  steps = [30 * (1 + 100 / b) for b in BATCHES]
  loo = leave_one_out(BATCHES, steps)
  assert len(loo) == len(BATCHES) and all(isinstance(f, StepsFit) for f in loo)
  assert all(f.b_noise == pytest.approx(100, rel=1e-3) for f in loo)
  assert leave_one_out([8, 16], [50, 30]) == []


def test_time_to_accuracy_and_best_batch():
  assert time_to_accuracy_s(200, 5.0) == pytest.approx(1.0)
  assert best_batch({8: 2.0, 16: 1.0, 32: 1.0, 64: math.inf}) == (16, 1.0)
  assert best_batch({8: math.inf}) is None
