"""dp_jax/convergence/steps_to_target.py: every (lr, seed) of a batch size trained to a target in
one jit."""

import numpy as np
import pytest

from dp_jax.base.errors import UserError
from dp_jax.convergence import digits
from dp_jax.convergence import steps_to_target as convergence
from dp_jax.convergence.steps_to_target import Sweep
from dp_jax.models.zoo import build_model


def build(seed):
  return build_model("digits_mlp", seed=seed)


@pytest.fixture(scope="module")
def data():
  return digits.load(0)


@pytest.fixture(scope="module")
def outcome(data):
  sweep = Sweep(batch=64, lrs=(1e-6, 0.1), seeds=(0, 1), target=0.85, max_steps=60, eval_every=2)
  return sweep, convergence.train_to_target(build, data, sweep)


def test_a_useful_lr_reaches_the_target_and_a_tiny_one_does_not(outcome):
  sweep, out = outcome
  assert out.steps_LxS.shape == (2, 2)
  assert (out.steps_LxS[0] == -1).all()  # lr 1e-6 barely moves the weights
  assert (out.steps_LxS[1] > 0).all() and (out.steps_LxS[1] % sweep.eval_every == 0).all()
  # the loop stops once every seed of one lr is there, well before the budget
  assert out.steps_run == out.steps_LxS[1].max() < sweep.max_steps
  assert convergence.best_lr(out.steps_LxS) == 1


def test_params_at_target_classify_at_least_the_target(outcome, data):
  import jax

  sweep, out = outcome
  for j in range(len(sweep.seeds)):
    params = jax.tree.map(lambda p, j=j: p[len(sweep.seeds) + j], out.params_at_target_R)
    acc = float(convergence.accuracy(out.graphdef, params, data.x_test_Mx8x8x1, data.y_test_M))
    assert acc >= sweep.target


def test_training_is_deterministic(outcome, data):
  sweep, out = outcome
  again = convergence.train_to_target(build, data, sweep)
  assert np.array_equal(again.steps_LxS, out.steps_LxS) and again.steps_run == out.steps_run


def test_median_and_best_lr_count_unreached_seeds_as_infinitely_slow():
  assert convergence.median_steps(np.array([10, 20, -1])) == 20
  assert convergence.median_steps(np.array([10, -1, -1])) == float("inf")
  steps = np.array([[10, -1, -1], [30, 40, 50], [30, 40, 60]])
  assert convergence.best_lr(steps) == 1
  assert convergence.best_lr(np.array([[-1, -1]])) == -1


@pytest.mark.parametrize("kw,match", [
    (dict(batch=0), "must be >= 1"),
    (dict(lrs=(0.1, -1.0)), "must be positive"),
    (dict(seeds=()), "non-empty"),
    (dict(target=1.5), "must be in"),
])
def test_bad_sweeps_are_user_errors(kw, match):
  base = dict(batch=8, lrs=(0.1,), seeds=(0,), target=0.9, max_steps=10, eval_every=1)
  with pytest.raises(UserError, match=match):
    convergence.check(Sweep(**{**base, **kw}))
