"""Calibrate the local cluster by measurement: transfers, all-reduce, dispatch, optimizer update.

- transfer: jax.device_put of n bytes from device 0 to device 1, fitted to latency + n / bw;
- all-reduce: a jitted sum over the mesh of devices 0..G-1 of a (G, n/4) float32 array sharded
  on its first axis, fitted to the ring model 2(G-1) x latency + 2(G-1)/G x n / bw;
- dispatch: one call of a trivial jitted program on the G-device mesh, waited for (what every
  stage call of the runtime pays besides its compute);
- update: an optax SGD-momentum update of float32 params replicated on the G-device mesh, per
  parameter (the per-layer profile times forward and backward only);
- stage: what one more stage costs the runtime, measured in place: a toy GPT-2 (4 layers,
  width 8) trained by the runtime as one stage and as one stage per layer, all on the same G
  devices (nothing moves), steps interleaved, each timed right after a step of the same plan
  (dp_jax.measurement.plan_timing.turns): (t_4 - t_1) / 3 (host dispatch of its programs,
  thread hand-offs, cotangent plumbing; under load from other processes each hand-off waits
  for a core, so this grows with the load where the trivial-call `dispatch` does not).
Each is the median of `repeats` after a warm-up; stored as JSON next to the profile cache.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax

from dp_jax.base.jsonfile import write_json
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.measurement.plan_timing import stepper, timed, turns
from dp_jax.models.zoo import build_model
from dp_jax.planner.contract import check_plan, staged_data_parallel_plan
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.stage_terms import update_bytes_per_param
from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime.local_devices import cpu_cores, other_xla_flags
from dp_jax.runtime.stages import structure_graph

CALIBRATION_SCHEMA = "dp_jax.local_calibration/3"
SIZES_BYTES = (4 << 10, 256 << 10, 2 << 20, 8 << 20, 32 << 20)


@dataclass(frozen=True)
class LocalCalibration:
  """What the local devices measured: link fits, per-call dispatch, optimizer update."""

  num_devices: int
  cores: int
  transfer_GBps: float
  transfer_latency_us: float
  allreduce_GBps: float
  allreduce_latency_us: float
  dispatch_us: float
  stage_us: float
  update_ns_per_param: float
  points: dict  # the raw (bytes, ms) medians behind each fit

  def cluster(self, base: ClusterConfig) -> ClusterConfig:
    """`base` with the measured links (all-reduce bandwidth, transfer latency, G devices) and
    stage terms: a stage's program launch (dispatch_us), the host work a boundary adds beyond
    the added stage's launch (stage_us - dispatch_us, so k stages cost dispatch_us + (k - 1)
    stage_us) and the update bandwidth of the measured momentum SGD update."""
    momentum = update_bytes_per_param(PlanOptions(num_devices=1, global_batch=1,
                                                  optimizer="momentum"))
    return replace(base, name=f"{base.name}_calibrated", num_nodes=1,
                   devices_per_node=self.num_devices,
                   intra_node_bandwidth_GBps=self.allreduce_GBps,
                   intra_node_latency_us=self.transfer_latency_us,
                   inter_node_bandwidth_GBps=self.allreduce_GBps,
                   inter_node_latency_us=self.transfer_latency_us,
                   inter_node_latency_per_doubling_us=0.0,
                   program_launch_us=self.dispatch_us,
                   stage_boundary_us=max(self.stage_us - self.dispatch_us, 0.0),
                   update_memory_GBps=momentum / max(self.update_ns_per_param, 1e-9))


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
  """Median wall ms of fn() waited for."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
  """(slope, intercept >= 0) minimising the squared relative error (small sizes count too)."""
  x, y = np.asarray(xs, float), np.asarray(ys, float)
  a = np.stack([1 / y, x / y], axis=1)
  (icpt, slope), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
  if icpt < 0:  # refit through the origin
    icpt, slope = 0.0, float(np.sum(x / y) / np.sum((x / y) ** 2))
  return max(float(slope), 1e-12), float(icpt)


def transfer_points(devices, repeats: int) -> list[list]:
  src, dst = devices[0], devices[1 % len(devices)]
  out = []
  for n in SIZES_BYTES:
    x = jax.device_put(np.ones(n // 4, np.float32), src)
    out.append([n, median_ms(lambda x=x: jax.device_put(x, dst), repeats)])
  return out


def allreduce_points(devices, repeats: int) -> list[list]:
  g = len(devices)
  mesh = meshlib.stage_mesh(devices)
  total = jax.jit(lambda x: x.sum(0), out_shardings=meshlib.replicated(mesh))
  out = []
  for n in SIZES_BYTES:
    x = jax.device_put(np.ones((g, n // 4), np.float32), meshlib.batch_sharding(mesh))
    out.append([n, median_ms(lambda x=x: total(x), repeats)])
  return out


def dispatch_us(devices, repeats: int) -> float:
  mesh = meshlib.stage_mesh(devices)
  x = jax.device_put(np.ones((len(devices), 8), np.float32), meshlib.batch_sharding(mesh))
  f = jax.jit(lambda x: x + 1)
  return 1e3 * median_ms(lambda: f(x), repeats)


def update_ns_per_param(devices, repeats: int, params: int = 4 << 20) -> float:
  mesh = meshlib.stage_mesh(devices)
  rep = meshlib.replicated(mesh)
  opt = optax.sgd(0.01, momentum=0.9)
  p = jax.device_put(jnp.ones(params, jnp.float32), rep)
  state = jax.jit(opt.init, out_shardings=rep)(p)

  def step(p, s, g):
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  f = jax.jit(step)
  return 1e6 * median_ms(lambda: f(p, state, p), repeats) / params


def stage_us(devices, steps: int = 15) -> float:
  """Runtime cost of one more stage: toy model as 1 stage vs one stage per layer, same devices."""
  def toy():
    return build_model("gpt2_small", n_layer=1, d_model=8, n_head=1, seq_len=4, vocab_size=16)

  g, graph = len(devices), structure_graph(toy(), "gpt2_small")
  opt = optax.sgd(0.01, momentum=0.9)
  runs = []
  for k in (1, len(graph.names)):
    plan = check_plan(staged_data_parallel_plan(graph, k, g, global_batch=g), graph,
                      available_devices=g * k)
    runs.append(stepper(toy(), graph, plan, list(devices) * k, opt))
  fused_us, split_us = ([1e3 * ms for ms, _ in r]
                        for r in turns([timed(step) for step, _ in runs], steps, warmup=2))
  (_, s1), (_, sk) = runs
  return max(statistics.median(split_us) - statistics.median(fused_us), 0.0) / (sk - s1)


def calibrate(devices=None, repeats: int = 7) -> LocalCalibration:
  """Measure the local links, dispatch and update on `devices` (default: all local devices)."""
  devices = list(devices or jax.devices())
  g = len(devices)
  tp = transfer_points(devices, repeats)
  slope, icpt = fit_line([n for n, _ in tp], [ms for _, ms in tp])
  transfer_bw, transfer_lat = 1e-6 / slope, 1e3 * icpt
  if g > 1:
    ap = allreduce_points(devices, repeats)
    slope, icpt = fit_line([2 * (g - 1) / g * n for n, _ in ap], [ms for _, ms in ap])
    ar_bw, ar_lat = 1e-6 / slope, 1e3 * icpt / (2 * (g - 1))
  else:
    ap, ar_bw, ar_lat = [], transfer_bw, transfer_lat
  return LocalCalibration(
      num_devices=g, cores=cpu_cores(), transfer_GBps=transfer_bw,
      transfer_latency_us=transfer_lat, allreduce_GBps=ar_bw, allreduce_latency_us=ar_lat,
      dispatch_us=dispatch_us(devices, 4 * repeats), stage_us=stage_us(devices, 2 * repeats),
      update_ns_per_param=update_ns_per_param(devices, repeats),
      points={"transfer_bytes_ms": tp, "allreduce_bytes_ms": ap})


def cache_key(num_devices: int) -> dict:
  """What a calibration depends on: the backend, device kind and count, the cores, the JAX and
  jaxlib versions, XLA's flags (less the host device count) and the measuring code (this
  module, the plan timing it uses, and the runtime whose stage costs it measures)."""
  root = Path(__file__).resolve().parents[1]  # dp_jax/
  code = hashlib.sha256()
  for f in [Path(__file__), root / "measurement" / "plan_timing.py",
            *sorted((root / "runtime").glob("*.py"))]:
    code.update(f.name.encode() + f.read_bytes())
  return {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
          "num_devices": num_devices, "cores": cpu_cores(), "jax": jax.__version__,
          "jaxlib": getattr(jaxlib, "__version__", None) or metadata.version("jaxlib"),
          "xla_flags": other_xla_flags(), "code": code.hexdigest()[:16]}


def cache_path(cache_dir: str | Path, num_devices: int) -> Path:
  key = cache_key(num_devices)
  kind = str(key["device_kind"]).replace(" ", "_").replace("/", "_")
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
  name = f"{key['backend']}-{kind}-{num_devices}dev-{key['cores']}cores-{digest}"
  return Path(cache_dir) / "calibration" / f"{name}.json"


def load_or_calibrate(cache_dir: str | Path, devices=None, *, refresh: bool = False,
                      repeats: int = 7) -> tuple[LocalCalibration, Path, bool]:
  """(calibration, its file, whether it was measured now) from the cache (an entry of the same
  cache_key only) or measured now."""
  devices = list(devices or jax.devices())
  path, key = cache_path(cache_dir, len(devices)), cache_key(len(devices))
  if path.is_file() and not refresh:
    try:
      d = json.loads(path.read_text())
      if d.get("schema") == CALIBRATION_SCHEMA and d.get("key") == key:
        d.pop("schema"), d.pop("key")
        return LocalCalibration(**d), path, False
    except (json.JSONDecodeError, TypeError, AttributeError):
      pass
  cal = calibrate(devices, repeats)
  write_json(path, {"schema": CALIBRATION_SCHEMA, "key": key, **asdict(cal)})
  return cal, path, True
