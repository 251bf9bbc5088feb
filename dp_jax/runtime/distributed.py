"""Multi-process start-up: jax.distributed.initialize() when a coordinator is configured.

No-op by default. Configure with runtime.distributed.coordinator_address / num_processes /
process_id, or the environment variables DP_JAX_COORDINATOR_ADDRESS, DP_JAX_NUM_PROCESSES and
DP_JAX_PROCESS_ID (config wins); coordinator_address=auto lets JAX read a cluster's environment
(SLURM, Open MPI). Call it before anything touches a JAX device. Every process runs the same
command; plan device indices refer to jax.devices() across all processes (process 0's first).

Failure handling: a process that stops sending heartbeats for heartbeat_timeout_s is declared
dead by the coordinator and every other process exits non-zero; JAX's preemption service is
off, so SIGTERM ends a process at once (its peers follow within the heartbeat timeout). JAX
aborts the survivors with a multi-line report; fatal_filter turns it into one `error:` line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dp_jax.base.checks import Checked, option
from dp_jax.base.errors import UserError
from dp_jax.runtime import fatal_filter

log = logging.getLogger(__name__)
AUTO = "auto"  # coordinator_address: let jax.distributed read the cluster's environment
WAIT_NOTICE_S = 3.0  # say that we wait for the peers once joining takes longer than this


@dataclass(frozen=True)
class DistributedConfig(Checked):
  """Multi-process settings (runtime.distributed); coordinator_address None (the default)
  means a single process, else host:port of process 0, or auto (SLURM, Open MPI); a process
  silent for heartbeat_timeout_s is dead (the others exit); initialization_timeout_s: how long
  to wait for every process to join."""

  GROUP = "runtime.distributed"

  coordinator_address: str | None = None
  num_processes: int | None = option(None, low=1, integer=True)
  process_id: int | None = option(None, low=0, integer=True)
  heartbeat_timeout_s: int = option(30, low=1, integer=True)
  initialization_timeout_s: int = option(300, low=1, integer=True)


def resolve(cfg: DistributedConfig | None) -> DistributedConfig:
  """Config values, filled from DP_JAX_* environment variables where unset."""
  cfg = cfg or DistributedConfig()
  env = os.environ

  def pick(value, name, cast):
    raw = env.get(name)
    if value is not None or raw is None:
      return value
    try:
      return cast(raw)
    except ValueError:
      raise UserError(f"environment variable {name}={raw!r} must be an integer") from None

  return DistributedConfig(pick(cfg.coordinator_address, "DP_JAX_COORDINATOR_ADDRESS", str),
                           pick(cfg.num_processes, "DP_JAX_NUM_PROCESSES", int),
                           pick(cfg.process_id, "DP_JAX_PROCESS_ID", int),
                           _get(cfg, "heartbeat_timeout_s", DistributedConfig.heartbeat_timeout_s),
                           _get(cfg, "initialization_timeout_s",
                                DistributedConfig.initialization_timeout_s))


def configured(cfg: DistributedConfig | None) -> bool:
  """Whether this job is (meant to be) one of several processes."""
  return resolve(cfg).coordinator_address is not None


def initialize(cfg: DistributedConfig | None = None, *, num_devices: int | None = None) -> bool:
  """Join the multi-process job if a coordinator is configured; return whether it did.

  num_devices: the job's total device count; on CPU each process then gets num_devices /
  num_processes host devices (overriding XLA_FLAGS). Calling it again is a no-op.
  """
  c = _checked(resolve(cfg))
  if c.coordinator_address is None:
    return False
  # JAX: only for a multi-process job (every app's Hydra edge imports this module)
  import jax

  if jax.distributed.is_initialized():
    return True
  if num_devices is not None and c.num_processes:
    if num_devices % c.num_processes:
      raise UserError(f"runtime.num_devices={num_devices} must split evenly over "
                      f"num_processes={c.num_processes}")
    jax.config.update("jax_num_cpu_devices", num_devices // c.num_processes)
  jax.config.update("jax_enable_preemption_service", False)  # SIGTERM ends the process
  auto = c.coordinator_address == AUTO
  who = f"process {c.process_id} of {c.num_processes}" if not auto else "this process"
  fatal_filter.install(who, c.heartbeat_timeout_s, c.coordinator_address)
  notice = threading.Timer(WAIT_NOTICE_S, _say, (
      f"{who}: waiting for the other processes at coordinator {c.coordinator_address} "
      f"(up to {c.initialization_timeout_s} s)",))
  notice.daemon = True
  notice.start()
  try:
    jax.distributed.initialize(
        coordinator_address=None if auto else c.coordinator_address,
        num_processes=None if auto else c.num_processes,
        process_id=None if auto else c.process_id,
        initialization_timeout=c.initialization_timeout_s,
        heartbeat_timeout_seconds=c.heartbeat_timeout_s,
        shutdown_timeout_seconds=c.heartbeat_timeout_s)
  except Exception as e:  # noqa: BLE001 - JAX raises several types here
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f"{who} could not join coordinator {c.coordinator_address} within "
                    f"{c.initialization_timeout_s} s ({first[:200]}); start every process, or "
                    "raise runtime.distributed.initialization_timeout_s") from None
  finally:
    notice.cancel()
  if auto:
    fatal_filter.set_identity(f"process {jax.process_index()} of {jax.process_count()}")
  return True


def process_index() -> int:
  """This process's index (0 without jax.distributed)."""
  if "jax" not in sys.modules:
    return 0
  import jax  # JAX: already imported (checked above); an app without it reads 0

  return jax.process_index() if jax.distributed.is_initialized() else 0


def shared_dir(local: str | Path) -> Path:
  """Process 0's folder, sent to every process (one run folder per job, whatever the clocks)."""
  local = Path(local).resolve()
  return Path(_from_process_0_bytes(str(local).encode()).decode())


def from_process_0(value: Any) -> Any:
  """Process 0's value of a JSON object, on every process (value itself in one process).

  For what each process computes for itself but all must share (the plan: a measured
  profile, or a plan file that differs between hosts, would otherwise split the job).
  """
  if not _several():
    return value
  return json.loads(_from_process_0_bytes(json.dumps(value).encode()))


def gather_json(value: Any) -> list[Any]:
  """Every process's value of a JSON object, in process order ([value] in one process)."""
  if not _several():
    return [value]
  from jax.experimental import multihost_utils  # JAX: only across processes (see _several)

  raw = np.frombuffer(json.dumps(value, default=str).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([raw.size], np.int32)))
  buf = np.zeros(int(sizes.max()), np.uint8)
  buf[:raw.size] = raw
  every = np.asarray(multihost_utils.process_allgather(buf)).astype(np.uint8)
  return [json.loads(every[i, :int(n)].tobytes()) for i, n in enumerate(sizes.reshape(-1))]


def _several() -> bool:
  # JAX: only for a multi-process job (every app's Hydra edge imports this module)
  import jax

  return jax.distributed.is_initialized() and jax.process_count() > 1


def _from_process_0_bytes(raw: bytes) -> bytes:
  if not _several():
    return raw
  from jax.experimental import multihost_utils  # JAX: only across processes (see _several)

  size_1 = multihost_utils.broadcast_one_to_all(np.array([len(raw)], np.int32))
  size = int(np.asarray(size_1)[0])
  buf = np.zeros(size, np.uint8)
  buf[:min(size, len(raw))] = np.frombuffer(raw, np.uint8)[:size]
  return np.asarray(multihost_utils.broadcast_one_to_all(buf)).astype(np.uint8).tobytes()


def log_to_own_file(run_dir: str | Path, rank: int, *, hydra_dir: str | Path) -> Path:
  """Send this process's log records to run_dir/process_<rank>.log instead of Hydra's job log.

  Hydra made a folder of its own for this process (hydra_dir); if it is not the run folder
  and holds nothing but Hydra's files, it is removed, so a job leaves one folder.
  """
  run_dir, hydra_dir = Path(run_dir), Path(hydra_dir).resolve()
  run_dir.mkdir(parents=True, exist_ok=True)
  path = run_dir / f"process_{rank}.log"
  root = logging.getLogger()
  for h in list(root.handlers):
    if isinstance(h, logging.FileHandler):
      root.removeHandler(h)
      h.close()
  handler = logging.FileHandler(path)
  handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
  root.addHandler(handler)
  if hydra_dir != run_dir.resolve() and hydra_dir.is_dir() and all(
      p.name == ".hydra" or p.suffix == ".log" for p in hydra_dir.iterdir()):
    shutil.rmtree(hydra_dir, ignore_errors=True)
  return path


def _checked(c: DistributedConfig) -> DistributedConfig:
  if c.heartbeat_timeout_s < 1 or c.initialization_timeout_s < 1:
    raise UserError("runtime.distributed.heartbeat_timeout_s and initialization_timeout_s "
                    "must be >= 1 second")
  if c.coordinator_address is None:
    if c.num_processes not in (None, 1) or c.process_id not in (None, 0):
      raise UserError("num_processes/process_id are set but no coordinator_address; set "
                      "runtime.distributed.coordinator_address=<host:port of process 0>")
    return c
  if c.coordinator_address == AUTO:
    return c
  if c.num_processes is None or c.process_id is None:
    raise UserError("multi-process needs coordinator_address, num_processes and process_id "
                    "together; set all three (or the DP_JAX_* environment variables)")
  if not 0 <= c.process_id < c.num_processes:
    raise UserError(f"process_id={c.process_id} must lie in [0, num_processes={c.num_processes})")
  return c


def _get(cfg, name: str, default):
  value = getattr(cfg, name, None)
  return default if value is None else value


def _say(line: str) -> None:
  print(line, file=sys.stderr, flush=True)
