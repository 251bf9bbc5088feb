"""python -m dp_jax.train over 2 processes as users run it: kill -9 and resume; SLURM-like sweeps.

Each test takes minutes on 2 shared cores (slow); the default suite covers the same paths with
test_runtime_transfer.py and test_runtime_distributed.py.
"""

import json
import re
import signal
import time

import pytest
from apps import run_app
from mp_launch import logs, start, wait
from test_train_app import TINY, burst_plan_file

from dp_jax.runtime.local_devices import other_xla_flags

HEARTBEAT_S = 10
ABORT_S = 5  # within the heartbeat timeout, plus the abort itself on a loaded machine
JAX_REPORT = ("Terminating process", "absl::Status", "Check failure", "coordination_service",
              "Fatal Python error", "Traceback")
STEPS = ["steps=8", "runtime.checkpoint_every=2"]


def _metrics(run_dir):
  path = run_dir / "metrics.jsonl"
  return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_kill_one_process_the_other_exits_and_a_resume_matches(tmp_path):
  plan = burst_plan_file(tmp_path)
  run_dir = tmp_path / "run"
  args = ["-m", "dp_jax.train", *TINY, *STEPS, f"plan={plan}", f"hydra.run.dir={run_dir}",
          f"runtime.distributed.heartbeat_timeout_s={HEARTBEAT_S}"]
  procs = start(args, 2, 4, tmp_path, {"DP_JAX_STEP_SLEEP_S": "1"}, stderr_apart=True)
  deadline = time.monotonic() + 400
  while len(_metrics(run_dir)) < 3 and time.monotonic() < deadline:
    assert all(p.poll() is None for p in procs), logs(tmp_path, 2)
    time.sleep(0.3)
  assert len(_metrics(run_dir)) >= 3, logs(tmp_path, 2)
  procs[1].send_signal(signal.SIGKILL)
  killed = time.monotonic()
  survivor = procs[0].wait(timeout=HEARTBEAT_S + 60)
  took = time.monotonic() - killed
  assert survivor != 0
  assert took < HEARTBEAT_S + ABORT_S, f"process 0 needed {took:.1f} s to notice"
  wait(procs, 10)
  err = (tmp_path / "process_0.err").read_text()
  assert not any(text in err for text in JAX_REPORT), err
  assert err.count("error: ") == 1, err
  assert re.fullmatch(r"error: process 0 of 2: process 1 stopped sending heartbeats \(heartbeat "
                      rf"timeout {HEARTBEAT_S} s\).*; rerun the same command to resume from the "
                      "last checkpoint", err.strip().splitlines()[-1]), err

  resumed = start(args, 2, 4, tmp_path)
  assert wait(resumed, 600) == [0, 0], logs(tmp_path, 2)
  status = json.loads((run_dir / "status.json").read_text())
  assert status["final_step"] == 8 and status["resumed_from_step"] >= 2
  assert [m["step"] for m in _metrics(run_dir)] == list(range(1, 9)), "each step once"

  alone = tmp_path / "alone"
  alone.mkdir()
  result = run_app("train", *TINY, *STEPS, f"plan={plan}", cwd=alone)
  assert result.returncode == 0, result.stderr
  expected = json.loads((alone / "run" / "status.json").read_text())["final_loss"]
  assert status["final_loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_submitit_local_sweep_of_the_train_app_runs_two_cells(tmp_path):
  tiny = [a for a in TINY if not a.startswith("runtime.num_devices")]
  result = run_app("train", "-m", "hydra/launcher=submitit_local", *tiny,
                   "runtime.num_devices=2", "batch_size=4", "steps=1,2", cwd=tmp_path, timeout=600)
  assert result.returncode == 0, result.stderr
  cells = sorted((tmp_path / "sweep").glob("[0-9]*/status.json"))
  assert len(cells) == 2
  steps = sorted(json.loads(c.read_text())["final_step"] for c in cells)
  assert steps == [1, 2]


@pytest.mark.slow
def test_launch_local_validates_against_one_process(tmp_path):
  import os
  import re
  import subprocess

  from apps import REPO

  plan = burst_plan_file(tmp_path)
  env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  result = subprocess.run(
      [str(REPO / "scripts" / "launch_local.sh"), "2", *TINY, "steps=3", f"plan={plan}",
       f"hydra.run.dir={tmp_path}/run", "validate_against_single=true"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  last = result.stdout.strip().splitlines()[-1]
  match = re.fullmatch(r"max loss difference vs single process: (\S+)", last)
  assert match and float(match.group(1)) < 1e-4, last
  assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3
