"""Start N worker processes on localhost joined by jax.distributed (CPU devices, gloo)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
         "DP_JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
         "DP_JAX_NUM_PROCESSES": str(num_processes), "DP_JAX_PROCESS_ID": str(process_id)}
  return {**env, **(extra or {})}


def start(args: list[str], num_processes: int, devices_per_process: int, log_dir: Path,
          extra_env: dict | None = None) -> list[subprocess.Popen]:
  """Start `python args...` once per process; each writes log_dir/process_<i>.log."""
  port = free_port()
  procs = []
  for i in range(num_processes):
    log = (Path(log_dir) / f"process_{i}.log").open("w")
    procs.append(subprocess.Popen(
        [sys.executable, *args], cwd=log_dir, stdout=log, stderr=subprocess.STDOUT,
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
  return "\n".join(f"--- process {i}\n" + (Path(log_dir) / f"process_{i}.log").read_text()[-4000:]
                   for i in range(num_processes))
