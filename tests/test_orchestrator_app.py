"""python -m dp_jax.train background=...: the summary reports slowdown and background output."""

import json

import pytest
from apps import assert_one_line_error, run_app
from test_train_app import TINY, burst_plan_file


@pytest.mark.slow  # ~4 min on the loaded 2-core VM (subprocess; per-piece programs on 8 devices)
def test_train_app_with_background_reports_slowdown(tmp_path):
  plan = burst_plan_file(tmp_path)
  result = run_app("train", *TINY, "steps=16", f"plan={plan}", "background=same_family",
                   "background.batch_per_device=2", "background.slowdown_cap=100",
                   "runtime.share_cores=true", cwd=tmp_path, timeout=900)
  assert result.returncode == 0, result.stderr
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["background"] == "same_family" and status["final_step"] == 16
  assert status["background_failures"] == 0 and status["background_steps"] > 0
  assert status["background_samples_per_s"] > 0
  assert status["measured_step_ms"] > 0 and status["measured_step_ms_with_background"] > 0
  assert isinstance(status["foreground_slowdown"], float)
  assert (tmp_path / "run" / "background_checkpoint" / "background.npz").is_file()


def test_train_app_rejects_negative_slowdown_cap(tmp_path):
  plan = burst_plan_file(tmp_path)
  result = run_app("train", *TINY, "steps=6", f"plan={plan}", "background=same_family",
                   "background.slowdown_cap=-1", cwd=tmp_path)
  assert_one_line_error(result, "background.slowdown_cap=-1.0 must be >= 0")


def test_a_cap_on_more_devices_than_cores_is_refused_in_one_line_naming_the_way_round(tmp_path):
  """8 host devices on this machine's cores: an idle device is no idle core, the cap cannot
  hold; refused before any work, naming the option that runs it anyway."""
  import os

  cores = len(os.sched_getaffinity(0))
  if cores >= 8:
    pytest.skip(f"{cores} cores fit 8 devices")
  result = run_app("train", *TINY, "steps=6", "plan=data_parallel", "batch_size=8",
                   "background=same_family", cwd=tmp_path)
  assert_one_line_error(result, "runtime.num_devices=8 with background=same_family",
                        f"runtime.num_devices<={cores}", "runtime.share_cores=true")
  assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "failed"
