"""One process per core: N local processes, each pinned to its own core with one CPU device.

XLA:CPU spreads a program over every core its process may use (dp_jax/runtime/local_devices.py),
so in one process an "idle" device is not an idle core. Pinning each process to one core
(CPU affinity, set by the child itself before JAX starts, inherited by every thread) and joining
the processes with jax.distributed on localhost gives one device per core: device i's work runs
on core i only, and an idle device is an idle core. The worker side checks its pinning before
JAX starts (`check_pinned`) and, after its work, that every thread stayed on that core
(`thread_cores`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dp_jax.base.errors import UserError
from dp_jax.runtime.local_devices import xla_flags_with_devices, xla_thread_ticks

PIN_CORE_ENV = "DP_JAX_PIN_CORE"  # the core a started process pins itself to (check_pinned)


def cores_for(n: int, available: Sequence[int] | None = None) -> list[int]:
  """The core of each of n processes: the first n cores this process may use, one each."""
  cores = sorted(os.sched_getaffinity(0) if available is None else available)
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise UserError(f"number of pinned processes must be a positive integer, got {n!r}")
  if n > len(cores):
    raise UserError(f"{n} pinned processes need {n} cores, but only {len(cores)} are available "
                    f"({','.join(map(str, cores))}); use at most {len(cores)}")
  return cores[:n]


def free_port() -> int:
  """A free TCP port on localhost (for the coordinator)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def worker_env(process_id: int, num_processes: int, port: int,
               base: dict[str, str] | None = None) -> dict[str, str]:
  """Worker `process_id`'s environment: the CPU backend, one host device, the coordinator."""
  env = dict(os.environ if base is None else base)
  env.update({"JAX_PLATFORMS": "cpu",
              "XLA_FLAGS": xla_flags_with_devices(1, env.get("XLA_FLAGS", "")),
              "DP_JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
              "DP_JAX_NUM_PROCESSES": str(num_processes), "DP_JAX_PROCESS_ID": str(process_id)})
  return env


def start(argv: Sequence[str], num_processes: int, log_dir: str | Path,
          cores: Sequence[int] | None = None, *, echo_first: bool = False,
          cwd: str | Path | None = None) -> list[subprocess.Popen]:
  """Start `python argv...` once per process, process i pinned to cores[i].

  Process i writes log_dir/process_<i>.log (process 0 to this terminal with echo_first).
  """
  cores = cores_for(num_processes) if cores is None else list(cores)
  port = free_port()
  procs = []
  for i in range(num_processes):
    out = None if (echo_first and i == 0) else (Path(log_dir) / f"process_{i}.log").open("w")
    env = {**worker_env(i, num_processes, port), PIN_CORE_ENV: str(cores[i])}
    procs.append(subprocess.Popen(
        [sys.executable, *argv], cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out else None,
        env=env))
  return procs


def wait(procs: Sequence[subprocess.Popen], timeout_s: float, grace_s: float = 20.0) -> list[int]:
  """Exit codes; the others are ended grace_s after one fails (a dead peer blocks them), or at
  the timeout."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline and any(p.poll() is None for p in procs):
    if any(p.poll() not in (None, 0) for p in procs):
      deadline = min(deadline, time.monotonic() + grace_s)
    time.sleep(0.2)
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  for p in procs:
    try:
      p.wait(5)
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()
  return [p.returncode for p in procs]


def check_pinned() -> int:
  """The one core this process may run on; a UserError if it may run on several.

  A process started by `start` pins itself here (to the core in DP_JAX_PIN_CORE, every thread
  it has so far): not in the parent between fork and exec, which is unsafe when the parent
  runs threads (JAX's). Call it before JAX starts: XLA sizes its thread pools from the cores
  it may use, and every later thread inherits the affinity.
  """
  pin = os.environ.get(PIN_CORE_ENV)
  if pin is not None:
    for tid in os.listdir("/proc/self/task"):
      os.sched_setaffinity(int(tid), {int(pin)})
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) != 1:
    raise UserError(f"this worker may run on {len(cores)} cores ({cores_text(cores)}); start it "
                    "pinned to one (dp_jax.runtime.pinned.start, or taskset -c <core>)")
  return cores[0]


def cores_text(cores: Sequence[int]) -> str:
  return ",".join(map(str, cores))


def thread_cores(share: float = 0.01) -> dict[str, dict]:
  """Per thread ('name/tid') that did >= share of this process's CPU time so far: its CPU
  seconds, the cores it may run on and the core it last ran on (Linux /proc)."""
  ticks = xla_thread_ticks()
  total = sum(ticks.values())
  hz = os.sysconf("SC_CLK_TCK")
  out = {}
  for key, t in ticks.items():
    if total <= 0 or t < share * total:
      continue
    tid = int(key.rsplit("/", 1)[1])
    try:
      allowed = sorted(os.sched_getaffinity(tid))
      stat = open(f"/proc/self/task/{tid}/stat").read()
    except OSError:
      continue  # the thread ended
    last = int(stat[stat.rindex(")") + 2:].split()[36])  # field 39: processor
    out[key] = {"cpu_s": t / hz, "allowed": allowed, "last_core": last}
  return out


def confined_to(core: int, threads: dict[str, dict]) -> bool:
  """Whether every listed thread may run on `core` only and last ran there."""
  return all(v["allowed"] == [core] and v["last_core"] == core for v in threads.values())

