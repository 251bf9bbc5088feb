"""Honest local devices: as many CPU devices as cores, a dispatch thread per device.

What XLA:CPU does here (jax 0.12, measured with xla_thread_ticks on the 2-core machine):
- one program on one device spreads its work over every core (its "tf_XLAEigen" and
  "tf_XLAExecute" threads all run), with or without --xla_cpu_multi_thread_eigen=false or
  NPROC=1: no in-process setting confines a device to one core; only the process's CPU
  affinity (taskset) bounds the thread pool, and it bounds all devices of the process together;
- a program issued from one Python thread runs inline, so two devices only run at once when
  each is driven from its own thread (the GIL is released while XLA runs);
- the partitions of one jit over a multi-device mesh run at once.
So a local device is one core only when every device is busy. The validation therefore uses as
many devices as cores and measures each layer with the devices its stage uses all busy at
once (dp_jax.measurement.loaded), and dispatches concurrent work from one thread per device.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dp_jax.base.errors import UserError

HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def cpu_cores() -> int:
  """Cores this process may run on (its CPU affinity, which taskset narrows)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def honest_device_count(requested: int | None = None) -> int:
  """Host devices for timing: one per core (requested, if given, must not exceed the cores)."""
  cores = cpu_cores()
  if requested is None:
    return cores
  if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
    raise UserError(f"number of local devices must be a positive integer, got {requested!r}")
  if requested > cores:
    raise UserError(f"{requested} local devices on {cores} cores would share cores and time "
                    f"nothing physical; use at most {cores} devices (one per core)")
  return requested


def other_xla_flags(flags: str | None = None) -> str:
  """XLA's flags (`flags`, or this process's XLA_FLAGS) without the host device count: what a
  process keeps when it sets its own devices, and what a measurement's cache key holds of them
  (a timing compiled under another optimisation level, say, is another timing)."""
  flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
  return " ".join(re.sub(rf"{HOST_DEVICES_FLAG}=\d+", "", flags).split())


def xla_flags_with_devices(n: int, flags: str | None = None) -> str:
  """XLA's flags (`flags`, or this process's XLA_FLAGS) asking for `n` host devices."""
  return f"{other_xla_flags(flags)} {HOST_DEVICES_FLAG}={n}".strip()


def set_host_device_count(n: int) -> None:
  """Ask XLA's CPU backend for `n` host devices (takes effect only before JAX initialises)."""
  os.environ["XLA_FLAGS"] = xla_flags_with_devices(n)


class DeviceThreads:
  """One dispatch thread per device: work submitted for device i runs on thread i, in order."""

  def __init__(self, num_devices: int):
    self.pools = [ThreadPoolExecutor(1, thread_name_prefix=f"dp_jax_dev{i}")
                  for i in range(num_devices)]

  def run(self, jobs: Sequence[tuple[int, Callable[[], Any]]]) -> list[Any]:
    """Run fn() for each (device, fn) on that device's thread; all at once; results in order."""
    futures = [self.pools[d].submit(fn) for d, fn in jobs]
    return [f.result() for f in futures]

  def close(self) -> None:
    for p in self.pools:
      p.shutdown(wait=True)

  def __enter__(self) -> DeviceThreads:
    return self

  def __exit__(self, *exc) -> bool:
    self.close()
    return False


def run_concurrently(fns: Sequence[Callable[[], Any]]) -> tuple[list[Any], float]:
  """(results, wall seconds) of calling every fn at once, each on its own thread."""
  results: list[Any] = [None] * len(fns)
  errors: list[BaseException] = []
  barrier = threading.Barrier(len(fns) + 1)

  def body(i: int) -> None:
    barrier.wait()
    try:
      results[i] = fns[i]()
    except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
      errors.append(e)

  threads = [threading.Thread(target=body, args=(i,)) for i in range(len(fns))]
  for t in threads:
    t.start()
  barrier.wait()
  start = time.perf_counter()
  for t in threads:
    t.join()
  wall = time.perf_counter() - start
  if errors:
    raise errors[0]
  return results, wall


def xla_thread_ticks() -> dict[str, int]:
  """CPU clock ticks so far of each of this process's threads, by 'name/tid' (Linux only)."""
  out = {}
  try:
    tids = os.listdir("/proc/self/task")
  except OSError:
    return out
  for tid in tids:
    try:
      stat = open(f"/proc/self/task/{tid}/stat").read()
    except OSError:
      continue
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    out[f"{name}/{tid}"] = int(fields[11]) + int(fields[12])  # utime + stime
  return out


def busy_threads(fn: Callable[[], Any], share: float = 0.1) -> list[str]:
  """Names of the threads that did at least `share` of the CPU work of calling fn()."""
  before = xla_thread_ticks()
  fn()
  after = xla_thread_ticks()
  used = {k: v - before.get(k, 0) for k, v in after.items()}
  total = sum(used.values())
  if total <= 0:
    return []
  return sorted(k.split("/")[0] for k, v in used.items() if v >= share * total)


def timing_devices(requested: int | None = None) -> list:
  """Devices to time on: one per core on the CPU backend, else the first `requested` (or all)."""
  import jax  # JAX: not at import, so set_host_device_count can run before JAX starts

  available = jax.devices()
  if jax.default_backend() == "cpu":
    g = honest_device_count(requested) if requested else min(cpu_cores(), len(available))
  else:
    g = requested or len(available)
  if g > len(available):
    raise UserError(f"{g} devices requested but JAX has {len(available)} "
                    f"{jax.default_backend()} device(s); request at most {len(available)}")
  return available[:g]
