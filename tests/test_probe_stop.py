"""Probe rows of issue 41 on stopping a run: SIGTERM or Ctrl-C ends every worker process with
the run, status.json says how it ended, and the rerun resumes one run, not two interleaved."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from apps import REPO, assert_one_line_error, run_app
from test_probe_resume import TINY, cache  # noqa: F401 - the fixture

from dp_jax.runtime.local_devices import other_xla_flags

PINNED = [*(a for a in TINY if not a.startswith("plan=")), "background=same_family",
          "background.batch_per_device=2"]
STEPS = 40


def idle_plan(folder):
  """A 2-device plan whose middle layers leave device 1 idle (a background job's windows)."""
  from dp_jax.graph.layer_graph import LayerGraph, LayerNode
  from dp_jax.planner.contract import layout_plan

  names = ["embed", "h.0", "h.1", "ln_f", "lm_head"]
  graph = LayerGraph("gpt2_small", (16,), "int32", tuple(
      LayerNode(n, "x", (names[i - 1],) if i else ()) for i, n in enumerate(names)))
  layout = {"embed": [0, 1], "h.0": [0, 1], "h.1": [0], "ln_f": [0], "lm_head": [0, 1]}
  path = folder / "idle.json"
  path.write_text(json.dumps(layout_plan(graph, layout, global_batch=4, num_devices=2)))
  return f"plan={path}"


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
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  cmd = [sys.executable, "-m", "dp_jax.train", *PINNED, idle_plan(tmp_path), f"steps={STEPS}",
         f"hydra.run.dir={tmp_path}/run"]
  proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
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


@pytest.mark.slow  # ~40 s each: pinned workers with a background job (fast: the two below)
@pytest.mark.parametrize("signum, status, code", [
    (signal.SIGTERM, "terminated", 128 + signal.SIGTERM),
    (signal.SIGINT, "interrupted", 130)])
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
  result = run_app("train", *PINNED, idle_plan(tmp_path), f"steps={STEPS}", cwd=tmp_path,
                   env=cache)
  assert result.returncode == 0, result.stderr
  steps = [json.loads(ln)["step"] for ln in (tmp_path / "run" / "metrics.jsonl").open()]
  assert steps == list(range(1, STEPS + 1))


def test_a_background_job_beside_a_plan_with_no_idle_device_is_refused_up_front(tmp_path,
                                                                              cache):  # noqa: F811
  """Issue 41: it trained to status ok with 0 background steps and 0 pieces."""
  result = run_app("train", *PINNED, "plan=data_parallel", "steps=8", cwd=tmp_path, env=cache)
  assert_one_line_error(result, "background=same_family: the plan leaves no device idle",
                        "every layer runs on all 2 devices", "use background=none")
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


WORKER = """
import os, sys, time
from dp_jax.orchestrator.jobs import end_with_parent
end_with_parent(int(sys.argv[1]))
print(os.getpid(), flush=True)
time.sleep(60)
"""
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(__import__("os").getpid())],
                         stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def test_a_worker_ends_with_its_parent_even_when_the_parent_is_killed(tmp_path):
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  parent = subprocess.Popen([sys.executable, "-c", PARENT, WORKER], env=env,
                            stdout=subprocess.PIPE, text=True)
  worker = int(parent.stdout.readline())
  assert alive(worker)
  parent.kill()  # no chance to stop its child itself
  parent.wait()
  deadline = time.time() + 10
  while alive(worker) and time.time() < deadline:
    time.sleep(0.05)
  assert not alive(worker)


def test_sigterm_unwinds_like_ctrl_c_and_says_how_the_run_ended():
  from dp_jax.cli.hydra_app import Stopped, ending, stop_on_signals

  saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
  try:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup: stays ignored
    stop_on_signals()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    with pytest.raises(Stopped) as e:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(1)
  finally:
    signal.signal(signal.SIGTERM, saved[0])
    signal.signal(signal.SIGHUP, saved[1])
  assert ending(e.value) == ("terminated", "stopped by SIGTERM", 143)
  assert ending(KeyboardInterrupt()) == ("interrupted", "stopped by SIGINT (Ctrl-C)", 130)
