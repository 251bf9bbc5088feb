"""scripts/bench_multiplex.py: merging the pinned workers' rows, its errors, and (slow) a run."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_multiplex.py"
KEYS = {"cap", "measured_slowdown", "background_samples_per_s", "simulated_slowdown",
        "simulated_background_samples_per_s", "details"}


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("bench_multiplex", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def row(alone, with_bg, samples, **sim):
  return {"cap": 0.1, "alone_ms": alone, "with_ms": with_bg, "background_samples_per_s": samples,
          "background_steps": 3, "pieces_run": 9, "pieces_refused": 1, "piece_ms": 50.0,
          "active_s": 2.0, "cpu_ms_alone": [80.0], "cpu_ms_with": [84.0], **sim}


def test_merge_takes_the_foreground_from_process_0_and_sums_the_background(bench):
  p0 = {"rows": [row([100.0, 100.0], [110.0, 120.0], 0.0)]}
  p1 = {"rows": [row([90.0, 90.0], [99.0, 99.0], 40.0, simulated_alone_ms=95.0,
                     simulated_added_ms=1.9, simulated_samples_per_s=50.0,
                     simulated_piece_ms_per_s=300.0, simulated_steps_per_iteration=2.0)]}
  (r,) = bench.merge([p0, p1])
  assert r["measured_slowdown"] == pytest.approx(0.15)  # process 0's clock
  assert r["background_samples_per_s"] == 40.0 and r["simulated_background_samples_per_s"] == 50.0
  assert r["simulated_slowdown"] == pytest.approx(0.02)
  assert r["measured_piece_ms_per_s"] == pytest.approx(50.0)  # 25 ms/s on each process
  assert r["pieces_run"] == 18 and r["foreground_cpu_ms_with"] == 84.0
  assert r["background_steps_per_iteration"] == 3.0  # 6 steps over 2 foreground steps


def test_the_simulated_chain_ends_a_held_call_by_its_move_and_a_whole_move_leaves_no_window(bench):
  class Hook:  # process 1 owns device 1; call 1 runs on device 0 only (held)
    alone_calls = [((0, 1), 20.0, "0:fwd"), ((0,), 150.0, "1:fwd_bwd"), ((0, 1), 50.0, "0:bwd")]

    def __init__(self, lead):
      self.lead = lead

    def lead_ms(self, j):
      return self.lead

  assert bench.sim_calls(Hook(0.0), 2, {1}, {1})[1] == ((0,), 150.0, "1:fwd_bwd")
  part = bench.sim_calls(Hook(30.0), 2, {1}, {1})
  assert part[1:3] == [((0,), 120.0, "1:fwd_bwd"), ((0, 1), 30.0, "1:fwd_bwd:move")]
  whole = bench.sim_calls(Hook(170.0), 2, {1}, {1})  # the runtime's hold ends at once
  assert whole[1] == ((0, 1), 150.0, "1:fwd_bwd:move") and len(whole) == 3


def test_more_processes_than_cores_is_a_one_line_error():
  cores = len(os.sched_getaffinity(0))
  out = subprocess.run([sys.executable, str(SCRIPT), "--processes", str(cores + 1)],
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 2
  assert out.stderr.strip().count("\n") == 0 and "need" in out.stderr and "cores" in out.stderr


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_pinned_run_writes_the_issue_json_and_threads_stay_on_their_cores(tmp_path):
  out = tmp_path / "bench.json"
  env = {**os.environ, "WANDB_MODE": "offline"}
  run = subprocess.run([sys.executable, str(SCRIPT), "--processes", "2", "--alone", "3",
                        "--steps", "3", "--caps", "0.1", "inf", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=env)
  assert run.returncode == 0, run.stdout + run.stderr
  rows = json.loads(out.read_text())
  assert [r["cap"] for r in rows] == [0.1, "inf"]
  assert all(set(r) == KEYS for r in rows)
  procs = rows[0]["details"]["processes"]
  assert [p["core"] for p in procs] == sorted(os.sched_getaffinity(0))[:2]
  assert all(p["confined"] for p in procs)
  assert procs[0]["background_devices"] == [] and procs[1]["background_devices"] == [1]
  assert rows[1]["background_samples_per_s"] > 0
  assert rows[1]["simulated_background_samples_per_s"] > 0
