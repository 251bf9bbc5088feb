"""The measured timeline JSON (simulator event format) and multi-host configuration."""

import pytest

from dp_jax.runtime.measured_timeline import spans, stage_ms, timeline_json
from dp_jax.runtime.stages import Stage


def test_spans_are_maximal_contiguous_runs():
  assert spans([0, 1, 2, 5, 6, 9]) == [(0, 3), (5, 2), (9, 1)]


def test_timeline_has_simulator_events_per_device_span():
  stages = [Stage(0, (0, 1, 2, 3), ("a",), ("<input>",), ("a",)),
            Stage(1, (4, 6), ("b",), ("a",), ("b",))]
  events = [{"stage": 0, "phase": "fwd", "start_s": 10.0, "end_s": 10.002},
            {"stage": 1, "phase": "transfer_fwd", "start_s": 10.002, "end_s": 10.003},
            {"stage": 1, "phase": "fwd_bwd", "start_s": 10.003, "end_s": 10.010},
            {"stage": 0, "phase": "bwd", "start_s": 10.010, "end_s": 10.014}]
  t = timeline_json(events, stages, model="m", global_batch=8, num_devices=8, step=2)
  ev = t["alone"]["events"]
  assert t["schema"] == "dp_jax.timeline/1" and t["source"] == "measured"
  assert [e["devices"] for e in ev] == [[0, 4], [4, 1], [6, 1], [4, 1], [6, 1], [0, 4]]
  assert [e["kind"] for e in ev] == ["fwd", "move", "move", "bwd", "bwd", "bwd"]
  assert ev[0]["start_ms"] == 0 and t["alone"]["iteration_ms"] == pytest.approx(14)
  assert stage_ms(events) == {"0": pytest.approx(6), "1": pytest.approx(7)}

