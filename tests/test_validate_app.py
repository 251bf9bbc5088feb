"""python -m dp_jax.validate as a user runs it: outputs, errors summary, one-line bad input."""

import csv
import json

import pytest
from apps import assert_one_line_error, run_app

QUICK_PROFILE = ["local.profile_repeats=1", "local.profile_passes=1",
                 "local.profile_cuts=1"]
TINY = ["model=gpt2", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
        "model.seq_len=8", "model.vocab_size=64", "batch_size=8", "logger=disabled"]


@pytest.mark.slow
def test_validate_writes_csv_metrics_and_scatter(tmp_path):
  result = run_app("validate", *TINY, "validate.plans=2", "local.steps=2",
                   "local.warmup=1", "local.num_devices=2", *QUICK_PROFILE,
                   "validate.amplification_limits=[1.5]", f"local.cache_dir={tmp_path}/c",
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  run = tmp_path / "run"
  rows = list(csv.DictReader((run / "validation.csv").open()))
  kinds = [r["kind"] for r in rows]
  assert kinds[0] == "data_parallel" and kinds.count("random") == 2
  for r in rows:
    assert float(r["predicted_ms"]) > 0 and float(r["measured_ms"]) > 0
    assert int(r["devices_used"]) in (1, 2) and int(r["stages"]) >= 1
  m = json.loads((run / "metrics.json").read_text())
  assert m["plans"] == len(rows) and m["num_devices"] == 2
  errs = [abs(float(r["error_pct"])) for r in rows]
  assert abs(m["max_abs_pct_error"] - max(errs)) < 1e-6
  assert m["calibration"]["allreduce_GBps"] > 0
  assert (run / "scatter.png").stat().st_size > 1000
  assert (tmp_path / "c" / "calibration").is_dir()  # stored with the profile cache
  status = json.loads((run / "status.json").read_text())
  assert status["status"] == "ok" and "spearman" in status


def test_validate_one_device_one_plan_quick(tmp_path):
  result = run_app("validate", *TINY, "validate.plans=0", "local.steps=1", "local.warmup=1",
                   "local.num_devices=1", *QUICK_PROFILE,  # on 1 device burst = data parallel
                   "validate.amplification_limits=[1]", f"local.cache_dir={tmp_path}/c",
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = list(csv.DictReader((tmp_path / "run" / "validation.csv").open()))
  assert [r["plan"] for r in rows] == ["data_parallel"]
  assert rows[0]["devices_used"] == "1" and float(rows[0]["measured_ms"]) > 0
  m = json.loads((tmp_path / "run" / "metrics.json").read_text())
  assert m["spearman"] is None and m["plans"] == 1


def test_more_devices_than_cores_is_a_one_line_error(tmp_path):
  result = run_app("validate", *TINY, "local.num_devices=4096", cwd=tmp_path)
  assert_one_line_error(result, "one per core")
