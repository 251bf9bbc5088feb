"""The validation study: registry entry, and its quick sweep aggregated (slow)."""

import pytest
from test_experiments import aggregate, read_csv, sweep

from experiments import studies
from experiments.validation import headline


def test_validation_study_is_registered_with_its_app():
  s = studies.study("validation")
  assert s.app == "validate" and "+experiment=validation" in s.doc
  assert "median_abs_pct_error" in s.csv_columns and "spearman" in s.csv_columns


def test_headline_prints_each_model_and_a_dash_for_undefined_spearman():
  md = headline([{"model": "m", "num_devices": 2, "plans": 2, "median_abs_pct_error": 12.34,
                  "max_abs_pct_error": 40, "spearman": None, "median_ratio": 0.9}])
  assert "| m | 2 | 2 | 12.3% | 40.0% | - | 0.90 |" in md


@pytest.mark.slow
def test_quick_validation_sweeps_and_aggregates(tmp_path):
  paths = aggregate("validation", sweep(tmp_path, "validation", "logger=disabled"),
                    tmp_path / "out")
  rows = read_csv(paths["csv"])
  assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["model"] == "gpt2_small"
  assert int(rows[0]["plans"]) >= 2 and float(rows[0]["median_abs_pct_error"]) >= 0
  assert (tmp_path / "out" / "gpt2_small_validation.csv").is_file()
  assert paths["figure scatter"].is_file()
