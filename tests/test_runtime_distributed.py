"""Multi-process start-up: settings, one-line errors, one run folder, a lone process waiting."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mp_launch import REPO, free_port, start, wait, wait_for_output

from dp_jax.base.errors import UserError
from dp_jax.runtime import distributed, fatal_filter
from dp_jax.runtime.local_devices import other_xla_flags

ENV_NAMES = ("DP_JAX_COORDINATOR_ADDRESS", "DP_JAX_NUM_PROCESSES", "DP_JAX_PROCESS_ID")
MP_WORKER = str(Path(__file__).with_name("mp_worker.py"))
HEARTBEAT_S = 4
ABORT_S = 5  # within the heartbeat timeout, plus the abort itself on a loaded machine
JAX_REPORT = ("Terminating process", "absl::Status", "Check failure", "coordination_service",
              "Fatal Python error", "Traceback")


@pytest.fixture
def no_env(monkeypatch):
  for name in ENV_NAMES:
    monkeypatch.delenv(name, raising=False)


def test_distributed_is_a_no_op_by_default(no_env):
  assert distributed.initialize() is False
  assert not distributed.configured(None)
  assert distributed.process_index() == 0


def test_distributed_settings_come_from_config_then_environment(monkeypatch):
  monkeypatch.setenv("DP_JAX_COORDINATOR_ADDRESS", "h0:1234")
  monkeypatch.setenv("DP_JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("DP_JAX_PROCESS_ID", "2")
  c = distributed.resolve(distributed.DistributedConfig(process_id=1, heartbeat_timeout_s=7))
  assert (c.coordinator_address, c.num_processes, c.process_id) == ("h0:1234", 4, 1)
  assert c.heartbeat_timeout_s == 7 and distributed.configured(None)


@pytest.mark.parametrize("cfg, message", [
    (dict(num_processes=2), "no coordinator_address"),
    (dict(coordinator_address="h:1", num_processes=2), "together"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), "must lie in"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=0, heartbeat_timeout_s=0),
     "heartbeat_timeout_s"),
])
def test_incomplete_distributed_settings_are_one_line_errors(no_env, cfg, message):
  with pytest.raises(UserError, match=message):
    distributed.initialize(distributed.DistributedConfig(**cfg))


def test_shared_dir_is_the_local_folder_in_one_process(tmp_path):
  assert distributed.shared_dir(tmp_path / "run") == (tmp_path / "run").resolve()


def test_other_processes_log_to_their_own_file_and_leave_no_hydra_folder(tmp_path):
  import logging

  run, own = tmp_path / "run", tmp_path / "own"
  (own / ".hydra").mkdir(parents=True)
  (own / "train.log").write_text("")
  root = logging.getLogger()
  before = list(root.handlers)
  try:
    path = distributed.log_to_own_file(run, 1, hydra_dir=own)
    logging.getLogger("dp_jax.x").warning("hello from process 1")
    assert path == run / "process_1.log" and "hello from process 1" in path.read_text()
    assert not own.exists()
  finally:
    for h in list(root.handlers):
      if h not in before:
        root.removeHandler(h)
        h.close()
    for h in before:
      if h not in root.handlers:
        root.addHandler(h)


@pytest.mark.slow
def test_a_lone_process_says_once_that_it_waits_then_exits_non_zero(tmp_path):
  """Process 0 of 2 started alone: one line naming the coordinator, then a bounded failure."""
  address = f"localhost:{free_port()}"
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
         "DP_JAX_COORDINATOR_ADDRESS": address, "DP_JAX_NUM_PROCESSES": "2",
         "DP_JAX_PROCESS_ID": "0"}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  start = time.monotonic()
  result = subprocess.run(
      [sys.executable, "-m", "dp_jax.train", "model=gpt2", "model.n_layer=1", "model.d_model=16",
       "model.n_head=2", "model.seq_len=8", "model.vocab_size=32", "runtime.num_devices=2",
       "logger=disabled", "runtime.distributed.initialization_timeout_s=4",
       f"hydra.run.dir={tmp_path}/run"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  waits = [ln for ln in result.stderr.splitlines() if "waiting for the other processes" in ln]
  assert len(waits) == 1 and address in waits[0], result.stderr
  assert not any(text in result.stderr for text in JAX_REPORT), result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: process 0 of 2: the other processes did not join coordinator {address} in time; "
      "start every process, or raise runtime.distributed.initialization_timeout_s")
  assert time.monotonic() - start < 90
  assert not (tmp_path / "run" / "config.json").exists(), "nothing is written before joining"


def test_auto_lets_jax_read_the_cluster_environment(no_env, monkeypatch):
  """coordinator_address=auto (SLURM, Open MPI): JAX gets no address/count/id and detects them."""
  import jax

  calls, updates, filters = [], {}, []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda k, v: updates.__setitem__(k, v))
  monkeypatch.setattr(jax, "process_index", lambda: 3)
  monkeypatch.setattr(jax, "process_count", lambda: 4)
  monkeypatch.setattr(fatal_filter, "install", lambda *a: filters.append(a))
  monkeypatch.setattr(fatal_filter, "set_identity", filters.append)
  cfg = distributed.DistributedConfig(coordinator_address="auto", heartbeat_timeout_s=12)
  assert distributed.initialize(cfg, num_devices=16) is True
  (kw,) = calls
  assert kw["coordinator_address"] is None and kw["num_processes"] is None
  assert kw["process_id"] is None and kw["heartbeat_timeout_seconds"] == 12
  assert updates == {"jax_enable_preemption_service": False}, "no CPU split without a count"
  assert filters == [("this process", 12, "auto"), "process 3 of 4"], "named once JAX knows"


def test_explicit_settings_split_the_cpu_devices_evenly(no_env, monkeypatch):
  import jax

  calls, updates, filters = [], {}, []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda k, v: updates.__setitem__(k, v))
  monkeypatch.setattr(fatal_filter, "install", lambda *a: filters.append(a))
  cfg = distributed.DistributedConfig("h:1", num_processes=2, process_id=1)
  assert distributed.initialize(cfg, num_devices=8) is True
  assert calls[0]["coordinator_address"] == "h:1" and calls[0]["process_id"] == 1
  assert filters == [("process 1 of 2", 30, "h:1")], "stderr goes through the filter"
  assert updates["jax_num_cpu_devices"] == 4
  with pytest.raises(UserError, match="split evenly"):
    distributed.initialize(cfg, num_devices=7)


@pytest.mark.slow
@pytest.mark.parametrize("victim, sig, reason", [
    (1, signal.SIGKILL, r"process 1 stopped sending heartbeats \(heartbeat timeout 4 s\)"),
    (0, signal.SIGTERM, r"the coordinator \(process 0 at localhost:\d+\) stopped answering"),
], ids=["kill -9 process 1", "SIGTERM the coordinator"])
def test_a_dead_peer_ends_the_survivor_with_one_line(tmp_path, victim, sig, reason):
  """The survivor exits non-zero within the heartbeat timeout; its stderr ends in one line."""
  procs = start([MP_WORKER, "loop", "-", str(HEARTBEAT_S)], 2, 2, tmp_path, stderr_apart=True)
  try:
    wait_for_output(tmp_path, ["process 0 ready", "process 1 ready"], procs, 240)
    time.sleep(1)
    procs[victim].send_signal(sig)
    killed = time.monotonic()
    survivor = 1 - victim
    code = procs[survivor].wait(timeout=HEARTBEAT_S + 60)
    took = time.monotonic() - killed
  finally:
    wait(procs, 10, grace=0)
  assert code != 0
  assert took < HEARTBEAT_S + ABORT_S, f"process {survivor} needed {took:.1f} s"
  err = (tmp_path / f"process_{survivor}.err").read_text()
  assert not any(text in err for text in JAX_REPORT), err
  (line,) = [ln for ln in err.splitlines() if ln.strip()][-1:]
  assert re.fullmatch(rf"error: process {survivor} of 2: {reason}.*; rerun the same command to "
                      "resume from the last checkpoint", line), err
  assert err.count("error: ") == 1, err
