"""Micro-benchmark of the current JAX backend: matmul FLOP/s, memory bandwidth, dispatch overhead.

python scripts/bench_device.py [--size 2048] [--mbytes 256] [--repeats 20]

The numbers it prints are what dp_jax/hardware/devices.py records for the "cpu" device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp


def _median_s(fn, *args, repeats: int) -> float:
  """Median wall time of fn(*args) after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def matmul_flops(size: int, dtype: str, repeats: int) -> float:
  """FLOP/s of a square (size x size) @ (size x size) matmul in `dtype`."""
  k1, k2 = jax.random.split(jax.random.key(0))
  a = jax.random.normal(k1, (size, size), jnp.float32).astype(dtype)
  b = jax.random.normal(k2, (size, size), jnp.float32).astype(dtype)
  f = jax.jit(lambda x, y: x @ y)
  return 2 * size**3 / _median_s(f, a, b, repeats=repeats)


def stream_bandwidth(mbytes: int, repeats: int) -> float:
  """Bytes/s of a STREAM-triad-like a + 2*b over float32 arrays (2 reads + 1 write)."""
  n = mbytes * 2**20 // 4
  a = jnp.ones((n,), jnp.float32)
  b = jnp.ones((n,), jnp.float32)
  f = jax.jit(lambda x, y: x + 2.0 * y)
  return 3 * n * 4 / _median_s(f, a, b, repeats=repeats)


def numpy_add_bandwidth(mbytes: int, repeats: int) -> float:
  """Bytes/s of numpy's in-place c = a + b over float32 arrays (no allocation in the loop)."""
  import numpy as np

  n = mbytes * 2**20 // 4
  a, b, c = np.ones(n, np.float32), np.ones(n, np.float32), np.empty(n, np.float32)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    np.add(a, b, out=c)
    times.append(time.perf_counter() - t0)
  return 3 * n * 4 / statistics.median(times)


def dispatch_overhead_us(repeats: int) -> float:
  """Wall time of a jitted op on a 1-element array: the per-kernel fixed cost of this backend."""
  x = jnp.ones((1,), jnp.float32)
  f = jax.jit(lambda v: v + 1.0)
  return 1e6 * _median_s(f, x, repeats=max(repeats, 200))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", type=int, default=2048)
  p.add_argument("--mbytes", type=int, default=256)
  p.add_argument("--repeats", type=int, default=20)
  a = p.parse_args()
  dev = jax.devices()[0]
  out = {
      "date": datetime.date.today().isoformat(), "backend": jax.default_backend(),
      "device_kind": dev.device_kind, "processor": platform.processor() or platform.machine(),
      "jax": jax.__version__, "matmul_size": a.size, "stream_mbytes": a.mbytes,
      "matmul_flops": {dt: matmul_flops(a.size, dt, a.repeats)
                       for dt in ("float32", "bfloat16", "float16")},
      "stream_bytes_per_s": stream_bandwidth(a.mbytes, a.repeats),
      "numpy_add_bytes_per_s": numpy_add_bandwidth(a.mbytes, a.repeats),
      "dispatch_overhead_us": dispatch_overhead_us(a.repeats),
  }
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
