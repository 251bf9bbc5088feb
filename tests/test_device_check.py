"""scripts/device_check.sh (--list, --dry-run on CPU), device_compare.py and bench_runtime.py."""

import csv
import json
import os
import subprocess
import sys

import pytest
from apps import REPO

from dp_jax.runtime.local_devices import other_xla_flags

ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHON": sys.executable, "WANDB_MODE": "offline"}
ENV["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices


def test_list_names_every_step_and_the_output_folder(tmp_path):
  r = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "--dry-run", "--list",
                      "--out", str(tmp_path / "o")], capture_output=True, text=True, env=ENV,
                     timeout=60)
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  assert lines[0] == f"device: cpu_dry_run -> {tmp_path / 'o'}"
  steps = lines[1:]
  assert len(steps) == 5
  assert "bench_device.py" in steps[0] and "device_compare.py" in steps[1]
  assert "dp_jax.validate model=vgg16" in steps[2] and "dp_jax.validate model=gpt2" in steps[3]
  assert "bench_runtime.py" in steps[4] and all(str(tmp_path / "o") in s for s in steps)


def test_bad_option_is_rejected():
  r = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "--nope"], capture_output=True,
                     text=True, env=ENV, timeout=60)
  assert r.returncode == 2 and "usage" in r.stderr


@pytest.mark.slow
def test_device_compare_measures_and_compares_a_tiny_model(tmp_path):
  r = subprocess.run([sys.executable, str(REPO / "scripts" / "device_compare.py"), "--out",
                      str(tmp_path), "--models", "gpt2_small", "--tiny", "--max-batch", "2",
                      "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True,
                     env={**ENV, "JAX_PLATFORMS": "cpu"}, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  rows = list(csv.DictReader((tmp_path / "compare.csv").open()))
  assert [row["predicted"] for row in rows] == ["analytic"]
  assert int(rows[0]["points"]) == 2 * 5  # 5 layers x batches 1, 2
  assert float(rows[0]["median_abs_pct_error"]) >= 0
  measured = json.loads((tmp_path / "gpt2_small_measured.json").read_text())
  assert set(measured["layers"]["lm_head"]) == {"1", "2"}


@pytest.mark.slow
def test_dry_run_runs_every_step_on_cpu(tmp_path):
  r = subprocess.run([str(REPO / "scripts" / "device_check.sh"), "--dry-run", "--out",
                      str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=1800,
                     cwd=tmp_path)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert json.loads((tmp_path / "bench_device.json").read_text())["backend"] == "cpu"
  assert (tmp_path / "layers" / "compare.csv").is_file()
  for m in ("vgg16", "gpt2"):
    assert (tmp_path / f"validate_{m}" / "validation.csv").is_file()
  bench = json.loads((tmp_path / "bench_runtime.json").read_text())
  assert bench["runs"]["b_2"]["stages"] == 2


@pytest.mark.slow
def test_bench_runtime_prints_ratios_and_per_stage_overhead(tmp_path):
  out = tmp_path / "b.json"
  r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_runtime.py"), "--steps", "2",
                      "--splits", "1,0", "--out", str(out)], capture_output=True, text=True,
                     env=ENV, timeout=900)
  assert r.returncode == 0, r.stderr[-2000:]
  b = json.loads(out.read_text())
  assert b["runs"]["b_1"]["stages"] == 1 and b["runs"]["b_all"]["stages"] == 5
  assert b["runs"]["b_all"]["overhead_us_per_added_stage"] is not None
  assert "(b_all)/(a) =" in r.stdout
