"""Probe rows of issue 41 on stopping a run: SIGTERM or Ctrl-C ends every worker process with
the run, status.json says how it ended, and the rerun resumes one run, not two interleaved."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from apps import REPO, run_app
from test_probe_resume import TINY, cache  # noqa: F401 - the fixture

PINNED = [*TINY, "background=same_family", "background.batch_per_device=2"]
STEPS = 40


def children(pid):
  """Pids whose parent is `pid` (Linux /proc)."""
  out = []
  for d in os.listdir("/proc"):
    if d.isdigit():
      try:
        stat = open(f"/proc/{d}/stat").read()
      except OSError:
        continue
      if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
        out.append(int(d))
  return out


def alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
  return state != "Z"


def metrics_lines(run_dir):
  path = run_dir / "metrics.jsonl"
  return len(path.read_text().splitlines()) if path.exists() else 0


def stopped_run(tmp_path, cache, signum):  # noqa: F811
  env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPO), **cache,
         "DP_JAX_STEP_SLEEP_S": "0.2"}
  env.pop("XLA_FLAGS", None)
  proc = subprocess.Popen([sys.executable, "-m", "dp_jax.train", *PINNED, f"steps={STEPS}",
                           f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 240
  while metrics_lines(tmp_path / "run") < 2:
    assert proc.poll() is None, proc.stderr.read()
    assert time.time() < deadline
    time.sleep(0.1)
  workers = [w for w in children(proc.pid) if w != proc.pid]
  assert workers, "the run trains in pinned worker processes"
  proc.send_signal(signum)
  code = proc.wait(timeout=60)
  return code, proc.stderr.read(), workers


@pytest.mark.parametrize("signum, status, code", [
    (signal.SIGTERM, "terminated", 128 + signal.SIGTERM),
    pytest.param(signal.SIGINT, "interrupted", 130, marks=pytest.mark.slow)])
def test_a_stopped_run_ends_its_workers_and_says_how_it_ended(tmp_path, cache, signum,  # noqa: F811
                                                              status, code):
  got, stderr, workers = stopped_run(tmp_path, cache, signum)
  assert got == code, stderr
  assert stderr.strip().splitlines()[-1].startswith(f"{status}: stopped by "), stderr
  deadline = time.time() + 10
  while any(alive(w) for w in workers) and time.time() < deadline:
    time.sleep(0.1)
  assert not any(alive(w) for w in workers), "a worker outlived the run"
  lines = metrics_lines(tmp_path / "run")
  time.sleep(2)
  assert metrics_lines(tmp_path / "run") == lines, "something still trains into the folder"
  recorded = json.loads((tmp_path / "run" / "status.json").read_text())
  assert recorded["status"] == status and recorded["error"].startswith("stopped by"), recorded


@pytest.mark.slow
def test_the_rerun_of_a_killed_run_resumes_one_run(tmp_path, cache):  # noqa: F811
  """SIGKILL gives the parent no chance to stop its workers: the kernel ends them with it."""
  got, stderr, workers = stopped_run(tmp_path, cache, signal.SIGKILL)
  assert got == -signal.SIGKILL, stderr
  time.sleep(1)
  assert not any(alive(w) for w in workers), "a worker outlived its killed parent"
  result = run_app("train", *PINNED, f"steps={STEPS}", cwd=tmp_path, env=cache)
  assert result.returncode == 0, result.stderr
  steps = [json.loads(ln)["step"] for ln in (tmp_path / "run" / "metrics.jsonl").open()]
  assert steps == list(range(1, STEPS + 1))
