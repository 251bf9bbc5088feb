"""The local runtime overhead term: stage calls and the optimizer update."""

import pytest

from dp_jax.planner.local_overhead import overhead_ms, stage_calls


def test_stage_calls():
  assert [stage_calls(s) for s in (0, 1, 2, 5)] == [0, 1, 3, 9]


def test_overhead_adds_dispatch_per_call_and_update_per_param():
  params = {"a": 1000, "b": 0, "c": 3_000_000}
  one = overhead_ms([["a", "b", "c"]], params, dispatch_us=100, update_ns_per_param=2)
  three = overhead_ms([["a"], ["b"], ["c"]], params, dispatch_us=100, update_ns_per_param=2)
  assert one == pytest.approx(0.1 + 3_001_000 * 2e-6)
  assert three - one == pytest.approx(4 * 0.1)  # 5 calls instead of 1
