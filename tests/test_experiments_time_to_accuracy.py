"""The time_to_accuracy study: quick sweep end to end (twice: same CSV), and its aggregation."""

import csv
import json
import os
import subprocess
import sys

import pytest
from apps import REPO

from dp_jax.runtime.local_devices import other_xla_flags
from experiments import studies
from experiments import time_to_accuracy as tta


def reproduce(tmp_path, name, *overrides):
  env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO),
         "WANDB_DIR": str(tmp_path)}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  result = subprocess.run(
      ["bash", str(REPO / "scripts" / "reproduce.sh"), "time_to_accuracy", "--quick", "--out",
       str(tmp_path / name), "--sweep", str(tmp_path / f"{name}_sweep"), *overrides],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout + result.stderr
  return tmp_path / name


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("tta")
  return tmp, reproduce(tmp, "a")


def read_csv(path):
  with path.open() as f:
    return list(csv.DictReader(f))


@pytest.mark.slow  # a sweep of training runs (~20 s); the fit and tables are tested below
def test_quick_study_measures_steps_fits_and_combines(quick):
  tmp, out = quick
  rows = read_csv(out / "time_to_accuracy.csv")
  assert list(rows[0]) == studies.study("time_to_accuracy").csv_columns
  assert [r["global_batch"] for r in rows] == ["32", "256"]
  assert all(r["status"] == "ok" and r["seeds_reached"] == "2" for r in rows)
  small, large = (float(r["steps"]) for r in rows)
  assert small > large > 0  # more steps at the smaller batch, fewer samples
  assert small * 32 < large * 256
  assert all(float(r["noise_scale_at_target"]) > 1 and float(r["fit_b_noise"]) > 0 for r in rows)
  fit = json.loads((out / "time_to_accuracy_fit.json").read_text())["digits_mlp"]
  assert fit["points"] == 2 and fit["b_simple_median"] > 0
  devices = read_csv(out / "time_to_accuracy_by_devices.csv")
  assert {(r["strategy"], r["num_devices"]) for r in devices} == {
      (s, g) for s in ("data_parallel", "burst") for g in ("1", "8")}
  assert sum(r["best_for_devices"] == "True" for r in devices) == 4  # one B per strategy, G
  assert (out / "time_to_accuracy_steps.png").is_file()
  assert (out / "time_to_accuracy_vs_devices.png").is_file()
  cell = json.loads((tmp / "a_sweep" / "0" / "config.json").read_text())
  assert cell["logger"]["group"] == "time_to_accuracy_quick"
  assert list((tmp / "a_sweep" / "fit" / "wandb").glob("offline-run-*"))


@pytest.mark.slow  # a second sweep; the first one's checks stay in the default run
def test_quick_study_gives_the_same_csv_on_rerun(quick, tmp_path):
  _, first = quick
  again = reproduce(tmp_path, "b")  # the same overrides: the cell column lists them
  for name in ("time_to_accuracy.csv", "time_to_accuracy_by_devices.csv",
               "time_to_accuracy_fit.json"):
    assert (first / name).read_bytes() == (again / name).read_bytes(), name


def cell(b, steps, dp_ms, burst_ms, noise=100.0):
  return {"status": "ok", "model": "m", "global_batch": b, "steps": steps,
          "noise_scale_at_target": noise,
          "predicted": [{"num_devices": g, "data_parallel_ms": dp_ms[g], "burst_ms": burst_ms[g]}
                        for g in dp_ms if g <= b]}


def test_best_batch_per_device_count_minimises_steps_times_step_time():
  rows = [cell(8, 1000, {1: 1.0, 8: 0.5}, {1: 1.0, 8: 0.4}),
          cell(64, 200, {1: 8.0, 8: 2.0, 64: 5.0}, {1: 8.0, 8: 1.0, 64: 0.5})]
  best = {(q["strategy"], q["num_devices"]): q for q in tta.by_devices(rows)
          if q["best_for_devices"]}
  assert best["data_parallel", 1]["global_batch"] == 8  # 1.0 s vs 1.6 s
  assert best["data_parallel", 8]["global_batch"] == 64  # 0.5 s vs 0.4 s
  assert best["burst", 8]["seconds_to_target"] == pytest.approx(0.2)
  assert best["burst", 64]["global_batch"] == 64


def test_step_times_of_another_model_make_a_separate_hypothetical_table():
  rows = [{**cell(8, 1000, {1: 1.0}, {1: 1.0}), "what_if": {"big": [
              {"num_devices": 1, "data_parallel_ms": 10.0, "burst_ms": 10.0}]}},
          {**cell(64, 200, {1: 2.0}, {1: 2.0}), "what_if": {"big": [
              {"num_devices": 1, "data_parallel_ms": 80.0, "burst_ms": 80.0}]}}]
  best = {(q["step_time_model"], q["strategy"]): q for q in tta.by_devices(rows)
          if q["best_for_devices"]}
  assert best["m", "burst"]["global_batch"] == 64  # 0.4 s vs 1.0 s
  assert best["big", "burst"]["global_batch"] == 8  # 10 s vs 16 s
  text = tta.headline([{**r, "best_lr": 0.1, "fitted_steps": None} for r in rows])
  assert "Hypothetical" in text and "| m | big | burst | 10000.0 ms @B=8 |" in text


def test_fit_columns_and_the_fit_table():
  rows = [cell(b, 30 * (1 + 100 / b), {1: 1.0}, {1: 1.0}, noise=50.0) for b in (8, 32, 128)]
  out = tta.add_fit(rows)
  assert all(r["fit_b_noise"] == pytest.approx(100, rel=1e-3) for r in out)
  assert out[0]["fitted_steps"] == pytest.approx(30 * (1 + 100 / 8), rel=1e-3)
  assert "| m | 30.0 | 100.0 |" in tta.fit_table(rows) and "| 2.00 |" in tta.fit_table(rows)
