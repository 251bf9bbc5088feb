"""scripts/validate_profiles.py: whole-model throughput from each profile source vs published."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "validate_profiles.py"


def test_prints_ratios_against_at_least_three_published_measurements(capsys):
  spec = importlib.util.spec_from_file_location("validate_profiles", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  assert module.main() == 0
  out = capsys.readouterr().out
  rows = [line for line in out.splitlines() if line.startswith("| DGX")]
  assert len({r.split(" | ")[0] for r in rows}) >= 3  # distinct published measurements
  sources = {r.split(" | ")[2] for r in rows}
  assert any("tables" in s for s in sources) and any("analytic" in s for s in sources)
  for r in rows:
    measured, predicted, ratio = (float(x.replace(",", "")) for x in r.split(" | ")[3:6])
    assert measured > 0 and predicted > 0
    assert abs(predicted / measured - ratio) < 0.01
