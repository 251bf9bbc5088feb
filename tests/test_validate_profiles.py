"""scripts/validate_profiles.py: whole-model throughput from each profile source vs published."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "validate_profiles.py"


def test_prints_a_ratio_for_each_profile_source_against_published_rows(capsys):
  spec = importlib.util.spec_from_file_location("validate_profiles", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  assert module.main() == 0
  out = capsys.readouterr().out
  rows = [line.strip("| ").split(" | ") for line in out.splitlines()
          if line.startswith("| ") and not line.startswith(("| published", "| ---"))]
  assert len({r[0] for r in rows}) >= 3  # distinct published measurements
  sources = {r[2] for r in rows}
  assert sources == {"calibrated", "analytic", "deeppool_a100"}
  for r in rows:
    measured, predicted, ratio = (float(x.replace(",", "")) for x in r[4:7])
    assert measured > 0 and predicted > 0
    assert abs(predicted / measured - ratio) < 0.01
  medians = [ln for ln in out.splitlines() if ": median predicted / published " in ln]
  assert [m.split(":")[0] for m in medians] == ["calibrated", "analytic", "deeppool_a100"]
