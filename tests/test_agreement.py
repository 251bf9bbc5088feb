"""Prediction-vs-measurement errors and Spearman rank correlation."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.report import agreement


def test_ranks_share_ties():
  assert agreement.ranks([10, 30, 20, 20]) == [1.0, 4.0, 2.5, 2.5]


def test_spearman_is_one_for_any_monotone_map_and_minus_one_reversed():
  xs = [1.0, 5.0, 2.0, 9.0, 3.0]
  assert agreement.spearman(xs, [x ** 3 + 7 for x in xs]) == pytest.approx(1.0)
  assert agreement.spearman(xs, [-x for x in xs]) == pytest.approx(-1.0)


def test_spearman_matches_the_textbook_formula_without_ties():
  xs, ys = [1, 2, 3, 4, 5], [2, 1, 4, 3, 5]
  d2 = sum((a - b) ** 2 for a, b in zip(agreement.ranks(xs), agreement.ranks(ys), strict=True))
  assert agreement.spearman(xs, ys) == pytest.approx(1 - 6 * d2 / (5 * (25 - 1)))


def test_spearman_undefined_cases():
  assert agreement.spearman([1, 2], [1, 2]) is None
  assert agreement.spearman([1, 2, 3], [4, 4, 4]) is None


def test_summary_errors():
  s = agreement.summary([11.0, 8.0, 30.0], [10.0, 10.0, 20.0])
  assert s["median_abs_pct_error"] == pytest.approx(20.0)
  assert s["max_abs_pct_error"] == pytest.approx(50.0)
  assert s["median_ratio"] == pytest.approx(1.1)
  assert s["plans"] == 3
  with pytest.raises(UserError, match="> 0"):
    agreement.summary([1.0], [0.0])
