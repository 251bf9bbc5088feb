"""scripts/validate_collectives.py: the collective model within 15% of each cited measurement."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "validate_collectives.py"


@pytest.fixture(scope="module")
def script():
  spec = importlib.util.spec_from_file_location("validate_collectives", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def test_every_cited_measurement_within_tolerance(script):
  rows = script.table()
  assert len(rows) >= 3
  for m, r in rows:
    assert r["busbw_ratio"] == pytest.approx(1, abs=script.TOLERANCE), m.source
    assert r["time_ratio"] == pytest.approx(1, abs=script.TOLERANCE), m.source


def test_flat_pricing_misses_multi_node_measurements_by_far(script):
  for m, r in script.table():
    if m.nodes > 1:
      assert r["flat_busbw_ratio"] < 0.5, m.source


def test_main_prints_the_ratios(script, capsys):
  assert script.main() == 0
  out = capsys.readouterr().out
  assert "model / measured (time)" in out and "worst time error" in out


def test_small_message_latency_within_tolerance_of_cited_measurements(script):
  rows = script.latency_table()
  assert {m.used_for for m, _, _ in rows} == {"intra_node_latency_us", "inter_node_latency_us",
                                              "inter_node_latency_per_doubling_us"}
  assert max(m.nodes * m.gpus_per_node for m, _, _ in rows) >= 64
  for m, model_us, measured_us in rows:
    assert model_us / measured_us == pytest.approx(1, abs=script.TOLERANCE), m.source
