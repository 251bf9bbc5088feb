"""The multiplexing policy: admission keeps the added foreground time within the cap (+ error)."""

import math
import statistics

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dp_jax.base.errors import UserError
from dp_jax.multiplex.policy import (
  RATIO_FLOOR,
  STALE,
  T99,
  WINDOW,
  Admission,
  Correction,
  layer_groups,
  step_pieces,
)


def run_windows(policy, windows_ms, actual_of, pieces):
  """Fill windows in order with pieces (cyclic); (added foreground ms, sum of last predictions).

  actual_of(p) is a piece's measured time given its prediction p (a bounded prediction error).
  """
  added, last_predicted, k = 0.0, 0.0, 0
  for length in windows_ms:
    t, last = 0.0, 0.0
    while policy.admit(k % pieces, length - t):
      p = policy.predicted_ms(k % pieces)
      a = actual_of(p)
      policy.observe(k % pieces, a)
      t += a + policy.switch
      last = p
      k += 1
      assert k < 200_000, "admission never closed the window"
    if t > length:
      added += t - length
      last_predicted += last
  return added, last_predicted


@settings(max_examples=200, deadline=None)
@given(windows=st.lists(st.floats(0.0, 20.0), min_size=1, max_size=30),
       profile=st.lists(st.floats(0.01, 15.0), min_size=1, max_size=12),
       cap=st.sampled_from([0.0, 0.05, 0.1, 0.25, 1.0]), alone=st.floats(1.0, 200.0),
       bound=st.floats(0.0, 0.5), margin=st.floats(0.0, 0.6),
       switch=st.floats(0.01, 0.5),  # > 0, as on hardware: bounds the pieces per window
       seed=st.integers(0, 2**32 - 1))
def test_added_foreground_time_stays_within_cap_plus_the_error_bound(
    windows, profile, cap, alone, bound, margin, switch, seed):
  rng = np.random.default_rng(seed)
  policy = Admission(profile, cap=cap, alone_ms=alone, margin=margin, switch_ms=switch)
  added, last = run_windows(policy, windows, lambda p: p * (1 + rng.uniform(-bound, bound)),
                            len(profile))
  slack = max(0.0, bound - margin) * last
  assert added <= cap * alone + slack + 1e-9
  if margin >= bound:
    assert added <= cap * alone + 1e-9


@settings(max_examples=50, deadline=None)
@given(windows=st.lists(st.floats(0.0, 20.0), min_size=1, max_size=20),
       profile=st.lists(st.floats(0.01, 5.0), min_size=1, max_size=8))
def test_exact_predictions_at_cap_zero_never_delay_the_foreground(windows, profile):
  policy = Admission(profile, cap=0.0, alone_ms=100.0)
  added, _ = run_windows(policy, windows, lambda p: p, len(profile))
  assert added <= 1e-9


def test_pieces_that_fit_are_admitted_and_no_cap_admits_while_the_window_is_open():
  fit = Admission([2.0, 3.0], cap=0.0, alone_ms=10.0)
  assert fit.admit(0, 2.5) and not fit.admit(1, 2.5) and fit.refused == 1
  free = Admission([2.0, 30.0], cap=math.inf, alone_ms=10.0)
  assert free.admit(1, 0.1) and not free.admit(1, 0.0)


def test_overrun_is_charged_to_the_iteration_budget_shared_by_all_devices():
  policy = Admission([5.0], cap=0.1, alone_ms=20.0)  # budget 2 ms per iteration
  assert policy.admit(0, 3.5)  # overrun 1.5
  assert not policy.admit(0, 3.5)  # another 1.5 would exceed the 0.5 left
  assert policy.charged_ms == pytest.approx(1.5)
  policy.next_iteration(20.0)
  assert policy.budget_ms == pytest.approx(2.0) and policy.admit(0, 3.5)


def test_online_correction_learns_measured_over_predicted():
  c = Correction([1.0, 2.0, 4.0], smoothing=0.5)
  for _ in range(20):
    c.observe(0, 3.0)
    c.observe(1, 6.0)
  assert c.predicted_ms(0) == pytest.approx(3.0)
  assert c.predicted_ms(1) == pytest.approx(6.0)
  assert c.predicted_ms(2) == pytest.approx(12.0)  # unseen: the job-wide ratio


def test_the_correction_cannot_shrink_predictions_below_its_floor():
  c = Correction([4.0, 2.0], smoothing=0.5)
  for _ in range(50):
    c.observe(0, 0.0)  # a call that returned before its program ran
  assert c.predicted_ms(0) == pytest.approx(RATIO_FLOOR * 4.0)
  assert c.predicted_ms(1) == pytest.approx(RATIO_FLOOR * 2.0)  # the job-wide ratio too
  c.observe(0, 3.0)  # a real measurement still moves it up
  assert c.predicted_ms(0) > RATIO_FLOOR * 4.0
  policy = Admission([4.0], cap=0.0, alone_ms=100.0)
  for _ in range(50):
    policy.observe(0, 1e-6)
  assert not policy.admit(0, 0.9 * RATIO_FLOOR * 4.0)  # still too long for this window
  assert policy.admit(0, RATIO_FLOOR * 4.0)


def test_a_refused_piece_is_not_starved_by_a_stale_measurement():
  policy = Admission([1.0], cap=0.0, alone_ms=100.0)
  policy.observe(0, 50.0)  # one slow outlier
  refusals = 0
  while not policy.admit(0, 2.0):
    refusals += 1
    assert refusals < 40
  assert refusals == STALE and policy.predicted_ms(0) == 1.0


@settings(max_examples=200, deadline=None)
@given(profile=st.lists(st.floats(0.5, 200.0), min_size=2, max_size=10),
       slow=st.floats(1.0, 8.0), cap=st.sampled_from([0.0, 0.05, 0.1, 0.25]),
       alone=st.floats(50.0, 500.0), switch=st.floats(0.0, 5.0), use=st.floats(0.0, 0.99))
def test_a_stale_ratio_refuses_a_piece_that_fits_at_its_profile_at_most_stale_times(
    profile, slow, cap, alone, switch, use):
  """The job's pieces run in order, so while its last piece is refused nothing is measured: a
  job-wide ratio learnt from the others (slow x) must not keep it out of windows it fits at its
  profile (its overrun within the budget) for more than STALE iterations."""
  policy = Admission(profile, cap=cap, alone_ms=alone, switch_ms=switch)
  k = len(profile) - 1
  for j in range(k):
    policy.observe(j, slow * profile[j])
  left = profile[k] + switch - use * policy.budget_ms
  assume(left > 0)
  refusals = 0
  while not policy.admit(k, left):
    refusals += 1
    policy.next_iteration()
    assert refusals <= STALE


def test_the_decision_log_says_why():
  policy = Admission([2.0, 30.0], cap=0.1, alone_ms=100.0, switch_ms=1.0, log_decisions=True)
  assert policy.admit(0, 5.0) and policy.admit(1, 25.0, device=3, window=7)
  assert not policy.admit(1, 5.0) and not policy.admit(0, 0.0)
  policy.next_iteration(100.0)
  assert [(d.iteration, d.piece, d.admitted, d.why) for d in policy.decisions] == [
      (0, 0, True, "fits"), (0, 1, True, "overrun within budget"), (0, 1, False, "over budget"),
      (0, 0, False, "window closed")]
  second = policy.decisions[1]
  assert (second.device, second.window, second.cost_ms, second.overrun_ms, second.budget_ms) == (
      3, 7, 31.0, 6.0, 10.0)
  assert Admission([1.0], cap=0.1, alone_ms=1.0).decisions is None  # off by default


def test_slowdown_above_the_cap_tightens_admission_and_recovers():
  policy = Admission([1.0], cap=0.1, alone_ms=100.0)
  assert policy.admit(0, 1.0)
  policy.next_iteration(150.0)  # 50% slower than alone: over the cap
  assert policy.usable == 0.5 and policy.budget_ms == pytest.approx(5.0)
  assert not Admission([1.0], cap=0.0, alone_ms=1.0).admit(0, 0.5)
  assert policy.overrun_ms(0, 1.0) == pytest.approx(0.5)  # only half the window is used
  for _ in range(10):
    policy.next_iteration(100.0)
  assert policy.usable == 1.0 and policy.budget_ms == pytest.approx(10.0)


def noisy_ms(rng, n, mean=100.0, amplitude=0.05):
  """n iteration times of a foreground alone: mean x (1 +- amplitude), uniform."""
  return list(mean * (1 + rng.uniform(-amplitude, amplitude, n)))


@pytest.mark.parametrize("n_alone", [4, 8])
def test_the_foregrounds_own_noise_never_tightens_the_feedback_at_cap_0_05(n_alone):
  seeds, old_rule = 50, 0
  for seed in range(seeds):
    rng = np.random.default_rng(seed)
    alone = noisy_ms(rng, n_alone)
    policy = Admission([1.0], cap=0.05, alone_ms=statistics.median(alone), alone_steps_ms=alone)
    # the rule before: one iteration's slowdown against the cap, no noise
    single = Admission([1.0], cap=0.05, alone_ms=statistics.median(alone), window=1)
    for ms in noisy_ms(rng, 100):  # no background at all
      policy.next_iteration(ms)
      single.next_iteration(ms)
      assert policy.usable == 1.0 and policy.budget_ms == pytest.approx(0.05 * policy.alone_ms)
    old_rule += single.tightened > 0
  assert old_rule >= seeds // 4  # the single-iteration rule throttles on noise alone


@pytest.mark.parametrize("n_alone", [4, 8])
def test_a_real_sustained_excess_still_tightens_and_recovers_when_it_ends(n_alone):
  for seed in range(50):
    rng = np.random.default_rng(seed)
    alone = noisy_ms(rng, n_alone)
    policy = Admission([1.0], cap=0.05, alone_ms=statistics.median(alone), alone_steps_ms=alone)
    slow = [1.2 * ms for ms in noisy_ms(rng, 40)]  # 20% slower: 15% over the cap
    for i, ms in enumerate(slow):
      policy.next_iteration(ms)
      if i + 1 == WINDOW:
        assert policy.tightened >= 1
    assert policy.usable <= 0.5 ** 3
    for ms in noisy_ms(rng, 40):  # the excess ends
      policy.next_iteration(ms)
    assert policy.usable == 1.0


def test_the_noise_threshold_shrinks_with_more_iterations_and_more_alone_steps():
  rng = np.random.default_rng(0)
  alone = noisy_ms(rng, 16)
  few = Admission([1.0], cap=0.1, alone_ms=100.0, alone_steps_ms=alone[:4])
  many = Admission([1.0], cap=0.1, alone_ms=100.0, alone_steps_ms=alone)
  s4, s16 = statistics.stdev(alone[:4]), statistics.stdev(alone)
  assert few.excess_threshold_ms(1) == pytest.approx(T99[2] * s4 * math.sqrt(1 + 1 / 4))
  assert many.excess_threshold_ms(8) == pytest.approx(T99[14] * s16 * math.sqrt(1 / 8 + 1 / 16))
  assert many.excess_threshold_ms(8) < many.excess_threshold_ms(1)
  assert Admission([1.0], cap=0.1, alone_ms=100.0).excess_threshold_ms(8) == 0.0  # no noise


def test_the_t_quantiles_are_students():
  stats = pytest.importorskip("scipy.stats")
  assert T99 == pytest.approx([stats.t.ppf(0.99, d) for d in range(1, len(T99) + 1)], abs=1e-3)


@settings(max_examples=100, deadline=None)
@given(alone=st.lists(st.floats(50.0, 150.0), max_size=10),
       measured=st.lists(st.floats(0.0, 400.0), min_size=1, max_size=40),
       cap=st.sampled_from([0.0, 0.05, 0.1, 0.25]),
       windows=st.lists(st.floats(0.0, 20.0), min_size=1, max_size=6),
       profile=st.lists(st.floats(0.01, 15.0), min_size=1, max_size=6))
def test_the_feedback_never_raises_the_budget_above_the_cap(alone, measured, cap, windows,
                                                           profile):
  base = statistics.median(alone) if alone else 100.0
  policy = Admission(profile, cap=cap, alone_ms=base, alone_steps_ms=alone, switch_ms=0.1)
  for ms in measured:
    policy.next_iteration(ms)
    assert 0 < policy.usable <= 1.0 and policy.budget_ms <= cap * base + 1e-9
    added, _ = run_windows(policy, windows, lambda p: p, len(profile))  # exact predictions
    assert policy.charged_ms <= cap * base + 1e-9 and added <= cap * base + 1e-9


def test_groups_and_pieces_of_a_step():
  fwd, bwd = [0.2, 0.2, 0.2, 1.0, 0.1], [0.4, 0.2, 0.3, 2.0, 0.1]
  groups = layer_groups(["a", "b", "c", "d", "e"], fwd, bwd, 0.5)
  assert groups == [[0], [1, 2], [3], [4]]
  pieces = step_pieces(groups, fwd, bwd)
  assert [(p, g) for p, g, _ in pieces] == [("fwd", 0), ("fwd", 1), ("fwd", 2), ("fwd_bwd", 3),
                                            ("bwd", 2), ("bwd", 1), ("bwd", 0)]
  assert sum(ms for *_, ms in pieces) == pytest.approx(sum(fwd) + sum(bwd))


@pytest.mark.parametrize("cap", [-0.1, float("nan"), "x", True])
def test_bad_cap_is_one_line_user_error(cap):
  with pytest.raises(UserError, match="slowdown_cap must be a number >= 0"):
    Admission([1.0], cap=cap, alone_ms=1.0)
