"""Studies end to end: each quick overlay as a Hydra multirun, then its aggregation."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from apps import REPO

from dp_jax.runtime.local_devices import other_xla_flags
from experiments import aggregate as report
from experiments import studies

QUICK = {"strong_scaling": 4, "amplification": 3, "cluster_throughput": 2, "network": 2,
         "weight_sharding": 2}
# The train app's jitted stages warn about donated buffers XLA could not reuse (a JAX
# performance note, not an error); every other warning still fails the run.
IGNORED = ("ignore:Some donated buffers were not usable:UserWarning",)


def sweep(tmp_path: Path, study: str, *overrides: str, failed_cells: int = 0) -> Path:
  """`python -W error -m dp_jax.<app> -m +experiment=<study>_quick` under tmp_path; its folder.

  A sweep with failed cells exits non-zero after its summary table.
  """
  env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
         "WANDB_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  warnings = [f for w in IGNORED for f in ("-W", w)]
  result = subprocess.run(
      [sys.executable, "-W", "error", *warnings, "-m", f"dp_jax.{studies.study(study).app}", "-m",
       f"+experiment={study}_quick", *overrides, f"hydra.sweep.dir={tmp_path}/sweep"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  if failed_cells:
    assert result.returncode != 0 and f"{failed_cells} sweep cell(s) failed" in result.stderr
    assert f"{failed_cells} failed" in result.stdout  # the summary table's title
  else:
    assert result.returncode == 0, result.stderr[-3000:]
  return tmp_path / "sweep"


def aggregate(study: str, sweep_dir: Path, out: Path) -> dict[str, Path]:
  s = studies.study(study)
  rows, prov = report.load(s, sweep_dir)
  return report.write(s, rows, prov, out)


def read_csv(path: Path) -> list[dict[str, str]]:
  with path.open() as f:
    return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
  """Each quick study swept once per test module (the slow part), by study name."""
  cache: dict[str, Path] = {}

  def get(study: str) -> Path:
    if study not in cache:
      cache[study] = sweep(tmp_path_factory.mktemp(study), study)
    return cache[study]

  return get


# every quick study with -m slow; the default run sweeps and aggregates a quick study from a
# fresh clone (test_bare_clone: network) and a two-cell sweep below (an impossible cell)
SLOW_QUICK = ("strong_scaling", "amplification", "cluster_throughput", "network",
              "weight_sharding")


@pytest.mark.parametrize("study", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_QUICK
                                   else s for s in QUICK])
def test_quick_study_sweeps_and_aggregates(study, sweeps, tmp_path):
  sweep_dir = sweeps(study)
  paths = aggregate(study, sweep_dir, tmp_path / "out")
  rows = read_csv(paths["csv"])
  assert list(rows[0]) == studies.study(study).csv_columns
  assert len(rows) == QUICK[study] and {r["status"] for r in rows} == {"ok"}
  assert all(len(r["git_sha"]) == 40 and r["seed"] == "0" for r in rows)
  assert "## Failed cells\n\nnone" in paths["markdown"].read_text()
  assert [k for k in paths if k.startswith("figure")]
  job = sweep_dir / "0"
  cfg = json.loads((job / "config.json").read_text())
  assert cfg["logger"]["group"] == f"{study}_quick"
  assert json.loads((job / "provenance.json").read_text())["packages"]["jax"]
  assert list((job / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_runtime_study_measures_both_plans(tmp_path):
  paths = aggregate("runtime", sweep(tmp_path, "runtime", "logger=disabled"), tmp_path / "out")
  rows = {r["plan"]: r for r in read_csv(paths["csv"])}
  assert list(next(iter(rows.values()))) == studies.study("runtime").csv_columns
  assert set(rows) == {"data_parallel", "burst"}, rows
  assert all(r["status"] == "ok" and float(r["median_step_ms"]) > 0 for r in rows.values()), rows
  assert int(rows["burst"]["stages"]) >= 1 and float(rows["burst"]["speedup_vs_data_parallel"]) > 0
  assert float(rows["burst"]["predicted_iteration_ms"]) > 0


@pytest.mark.slow  # 16 s: a second sweep of a study
def test_a_simulated_study_gives_the_same_csv_twice(sweeps, tmp_path):
  first = aggregate("cluster_throughput", sweeps("cluster_throughput"), tmp_path / "a")["csv"]
  again = sweep(tmp_path, "cluster_throughput")
  second = aggregate("cluster_throughput", again, tmp_path / "b")["csv"]
  assert first.read_bytes() == second.read_bytes()


def test_an_impossible_cell_fails_alone_and_is_listed(tmp_path, capsys):
  sweep_dir = sweep(tmp_path, "amplification", "planner.amplification_limit=2",
                    "cluster.num_devices=8,64", "logger=disabled", failed_cells=1)
  assert report.main(studies.study("amplification"), [str(sweep_dir), "--out",
                                                      str(tmp_path / "out")]) == 0
  printed = capsys.readouterr().out
  assert "2 cells, 1 ok, 1 failed" in printed and "cluster.num_devices=64" in printed
  rows = {r["num_devices"]: r for r in read_csv(tmp_path / "out" / "amplification.csv")}
  assert rows["8"]["status"] == "ok" and float(rows["8"]["iteration_ms"]) > 0
  assert rows["64"]["status"] == "failed"
  assert "global batch of 32 (batch_size)" in rows["64"]["error"]
  md = (tmp_path / "out" / "README.md").read_text()
  assert "1 failed" in md and "cluster.num_devices=64" in md.split("## Failed cells")[1]


@pytest.mark.slow  # the default run's reproduce.sh: test_bare_clone's quick study
def test_reproduce_script_runs_sweep_and_aggregation(tmp_path):
  env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO),
         "WANDB_DIR": str(tmp_path)}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  result = subprocess.run(
      ["bash", str(REPO / "scripts" / "reproduce.sh"), "amplification", "--quick", "--out",
       str(tmp_path / "out"), "--sweep", str(tmp_path / "sweep"), "logger=disabled"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"csv: {tmp_path / 'out' / 'amplification.csv'}" in result.stdout
  assert (tmp_path / "out" / "README.md").is_file()
  assert (tmp_path / "sweep" / "sweep.log").is_file()


def test_reproduce_script_rejects_an_unknown_study(tmp_path):
  result = subprocess.run(["bash", str(REPO / "scripts" / "reproduce.sh"), "nope"], cwd=tmp_path,
                          env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 2 and result.stderr.startswith("error: unknown study 'nope'")
