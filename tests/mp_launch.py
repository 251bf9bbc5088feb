"""Start N worker processes on localhost joined by jax.distributed (CPU devices, gloo)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dp_jax.runtime.local_devices import xla_flags_with_devices

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def worker_env(process_id: int, num_processes: int, port: int, devices_per_process: int,
               extra: dict | None = None) -> dict[str, str]:
  """The environment of worker `process_id`: its share of CPU devices and the coordinator."""
  env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{TESTS}", "JAX_PLATFORMS": "cpu",
         "PYTHONFAULTHANDLER": "1",
         "XLA_FLAGS": xla_flags_with_devices(devices_per_process),
         "DP_JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
         "DP_JAX_NUM_PROCESSES": str(num_processes), "DP_JAX_PROCESS_ID": str(process_id)}
  return {**env, **(extra or {})}


def start(args: list[str], num_processes: int, devices_per_process: int, log_dir: Path,
          extra_env: dict | None = None, *, stderr_apart: bool = False) -> list[subprocess.Popen]:
  """Start `python args...` once per process; each writes log_dir/process_<i>.log.

  stderr_apart: stderr goes to log_dir/process_<i>.err instead.
  """
  port = free_port()
  procs = []
  for i in range(num_processes):
    log = (Path(log_dir) / f"process_{i}.log").open("w")
    err = (Path(log_dir) / f"process_{i}.err").open("w") if stderr_apart else subprocess.STDOUT
    procs.append(subprocess.Popen(
        [sys.executable, *args], cwd=log_dir, stdout=log, stderr=err,
        env=worker_env(i, num_processes, port, devices_per_process, extra_env)))
  return procs


def wait(procs: list[subprocess.Popen], timeout: float, grace: float = 30.0) -> list[int]:
  """Exit codes of all processes; the rest are killed `grace` s after one fails, or at timeout."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and any(p.poll() is None for p in procs):
    if any(p.poll() not in (None, 0) for p in procs):
      deadline = min(deadline, time.monotonic() + grace)
    time.sleep(0.2)
  hung = [p for p in procs if p.poll() is None]
  for p in hung:
    p.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: the log shows where it hung
  time.sleep(2 if hung else 0)
  for p in hung:
    if p.poll() is None:
      p.kill()
  return [p.wait() for p in procs]


def logs(log_dir: Path, num_processes: int) -> str:
  """The tail of every process's output (and of its stderr file, if apart)."""
  out = []
  for i in range(num_processes):
    for suffix in ("log", "err"):
      path = Path(log_dir) / f"process_{i}.{suffix}"
      if path.exists():
        out.append(f"--- process {i} ({suffix})\n" + path.read_text()[-4000:])
  return "\n".join(out)


def wait_for_output(log_dir: Path, texts: list[str], procs: list[subprocess.Popen],
                    timeout: float) -> None:
  """Wait until process i's output holds texts[i]; fail if one exits or time runs out."""
  deadline = time.monotonic() + timeout
  paths = [Path(log_dir) / f"process_{i}.log" for i in range(len(texts))]
  while not all(t in p.read_text() for t, p in zip(texts, paths, strict=True)):
    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
      raise AssertionError(f"the processes did not start\n{logs(log_dir, len(procs))}")
    time.sleep(0.2)
