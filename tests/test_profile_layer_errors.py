"""Comparing profiles: groups summed, only reference batches, median/worst summary."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.layer_times.layer_errors import compare, layer_groups, summarize
from dp_jax.layer_times.table import ProfileTable


def _t(rows, source="imported"):
  return ProfileTable("m", "A100-SXM4-40GB", "mixed fp16", source, rows)


def test_groups_and_errors():
  ref = _t({"a": {1: (1.0, 1.0), 4: (2.0, 2.0)}, "b": {1: (1.0, 0.0)}, "c": {1: (1.0, 1.0)}})
  pred = _t({"a": {1: (1.0, 0.0), 2: (9.0, 9.0), 4: (2.0, 2.0)}, "b": {1: (2.0, 0.0)},
             "c": {1: (3.0, 3.0)}}, "analytic")
  assert layer_groups(["a", "b", "c"], [["a", "b"]]) == {"b": ["a", "b"], "c": ["c"]}
  rows = compare(ref, pred, ["a", "b", "c"], groups=[["a", "b"]])
  assert [(r.group, r.batch) for r in rows] == [("b", 1), ("c", 1)]  # batch 4 lacks b
  assert rows[0].rel_error == pytest.approx(0.0)  # 3 ms vs 3 ms summed over the group
  s = summarize(rows)
  assert s.worst == pytest.approx(2.0) and s.worst_at == "c @ 1" and s.n == 2


def test_empty_comparison_is_an_error():
  with pytest.raises(UserError, match="share no layer"):
    summarize([])
