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


def test_boundaries_average_the_two_stages_batches_and_interpolate_in_k():
  from dp_jax.planner.local_overhead import boundaries_ms

  table = {"8": {"2": 1.0, "6": 5.0}, "16": {"2": 3.0, "6": 3.0}}
  assert boundaries_ms(table, [(4, 8, 8)]) == pytest.approx(3.0)  # halfway between cuts
  assert boundaries_ms(table, [(1, 8, 8), (9, 8, 8)]) == pytest.approx(1.0 + 5.0)  # nearest
  assert boundaries_ms(table, [(4, 8, 16)]) == pytest.approx((3.0 + 3.0) / 2)
  assert boundaries_ms(table, [(2, 4, 4)]) == pytest.approx(0.5)  # nearest batch, scaled
  assert boundaries_ms({}, [(2, 8, 8)]) == 0.0 and boundaries_ms(table, []) == 0.0
  kw = dict(dispatch_us=100, stage_us=0, update_ns_per_param=0)
  assert overhead_ms([["a"], ["b"]], {}, boundary_ms=2.5, **kw) == pytest.approx(0.1 + 2.5)
