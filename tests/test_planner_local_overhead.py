"""The local runtime overhead term: one dispatch, a cost per added stage, the update."""

import pytest

from dp_jax.planner.local_overhead import overhead_ms


def test_overhead_adds_dispatch_stages_and_update_per_param():
  params = {"a": 1000, "b": 0, "c": 3_000_000}
  kw = dict(dispatch_us=100, stage_us=700, update_ns_per_param=2)
  one = overhead_ms([["a", "b", "c"]], params, **kw)
  three = overhead_ms([["a"], ["b"], ["c"]], params, **kw)
  assert one == pytest.approx(0.1 + 3_001_000 * 2e-6)
  assert three - one == pytest.approx(2 * 0.7)  # two stages more
  assert overhead_ms([], params, **kw) == pytest.approx(0.1)


def test_split_extra_sums_non_last_stages_at_their_batch():
  from dp_jax.planner.local_overhead import split_extra_ms

  extra = {"a": {"8": 1.0, "4": 0.5}, "b": {"8": 2.0}}
  assert split_extra_ms(extra, [(["a", "b"], 8)]) == pytest.approx(3.0)
  assert split_extra_ms(extra, [(["a"], 4), (["b"], 4)]) == pytest.approx(0.5 + 1.0)  # b: scaled
  assert split_extra_ms({}, [(["a"], 8)]) == 0.0 and split_extra_ms(extra, []) == 0.0
  kw = dict(dispatch_us=100, stage_us=0, update_ns_per_param=0)
  assert overhead_ms([["a"]], {}, split_ms=2.5, **kw) == pytest.approx(0.1 + 2.5)


def test_stage_start_charges_each_later_stage_by_its_first_layer():
  from dp_jax.planner.local_overhead import stage_start_ms

  start = {"b": {"8": 3.0}, "c": {"4": 1.0}}
  assert stage_start_ms(start, [("b", 8), ("c", 4)]) == pytest.approx(4.0)
  assert stage_start_ms(start, [("c", 8)]) == pytest.approx(2.0)  # nearest batch, scaled
  assert stage_start_ms(start, [("a", 8)]) == 0.0
  kw = dict(dispatch_us=0, stage_us=0, update_ns_per_param=0)
  assert overhead_ms([["a"], ["b"]], {}, start_ms=3.0, **kw) == pytest.approx(3.0)
