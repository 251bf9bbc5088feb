"""Optional multi-host start-up: jax.distributed.initialize() when a coordinator is configured.

No-op by default. Configure with runtime.distributed.coordinator_address / num_processes /
process_id, or the environment variables DP_JAX_COORDINATOR_ADDRESS, DP_JAX_NUM_PROCESSES and
DP_JAX_PROCESS_ID (config wins). Call it before anything touches a JAX device. Every process
runs the same command; plan device indices then refer to jax.devices() across all hosts, each
process loads only the samples of its own devices and orbax writes checkpoints collectively.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dp_jax.errors import UserError


@dataclass
class DistributedConfig:
  """Multi-host settings; all None (the default) means a single process."""

  coordinator_address: str | None = None  # host:port of process 0
  num_processes: int | None = None
  process_id: int | None = None


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
                           pick(cfg.process_id, "DP_JAX_PROCESS_ID", int))


def initialize(cfg: DistributedConfig | None = None) -> bool:
  """Join the multi-host job if a coordinator is configured; return whether it did."""
  c = resolve(cfg)
  if c.coordinator_address is None:
    if c.num_processes not in (None, 1) or c.process_id not in (None, 0):
      raise UserError("num_processes/process_id are set but no coordinator_address; set "
                      "runtime.distributed.coordinator_address=<host:port of process 0>")
    return False
  if c.num_processes is None or c.process_id is None:
    raise UserError("multi-host needs coordinator_address, num_processes and process_id "
                    "together; set all three (or the DP_JAX_* environment variables)")
  if not 0 <= c.process_id < c.num_processes:
    raise UserError(f"process_id={c.process_id} must lie in [0, num_processes={c.num_processes})")
  import jax

  jax.distributed.initialize(coordinator_address=c.coordinator_address,
                             num_processes=c.num_processes, process_id=c.process_id)
  return True
