"""What running a plan costs beyond its layers' compute, priced from the cluster and profile.

Two terms every evaluation (and the search, the simulator and validate) charges:
- the optimizer update (update_ms): each device holding a layer streams its parameters,
  gradients and optimizer state through memory once per step: read and write the float32
  parameter and each state buffer, read the gradient (in its all-reduce precision), at the
  cluster's update bandwidth (update_memory_GBps, else the device's datasheet HBM
  bandwidth); 0 when the profile's timings already include it (meta["includes_update"]);
- the per-stage terms of costs.CostModel (stage_ms, enter_ms, leave_ms): a stage launches its
  program (program_launch_us); a boundary between two stages adds host work
  (stage_boundary_us: the stage before runs split forward and backward programs, hand-offs)
  and, where the profile measured it (meta["boundary_ms"][batch][k], dp_jax.measurement.boundary:
  the runtime's two-stage cut after k layers beside the uncut model), program time. A boundary
  at position k (layers before it, series-parallel order) between a stage at per-device batch
  b1 and one at b2 costs stage_boundary_us + (boundary_k(b1) + boundary_k(b2)) / 2: half is
  the leave term of the stage ending at layer k - 1, half the enter term of the stage starting
  at layer k, each at its own batch. A cut measured faster than the uncut model (the paired
  difference of two noisy timings; docs/validation.md) is priced at 0: the search needs the
  terms >= 0, and a boundary adds programs, it does not remove work. Pure numpy: no JAX.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, flat_layers
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.hardware.devices import get_device
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner.options import PlanOptions

MASTER_BYTES = 4  # the optimizer updates a float32 copy of every parameter


def update_bytes_per_param(options: PlanOptions) -> float:
  """Bytes the update moves per parameter: parameter read + write, gradient read, state read +
  write (SGD 12, momentum 20, Adam / AdamW 28 with fp32 gradients)."""
  return 2 * MASTER_BYTES + options.grad_bytes_per_param + 2 * options.optimizer_bytes_per_param


def update_GBps(cluster: ClusterConfig) -> float:
  """Bandwidth of the optimizer update: the cluster's, else the device's datasheet HBM."""
  if cluster.update_memory_GBps > 0:
    return cluster.update_memory_GBps
  try:
    return get_device(cluster.device).mem_bandwidth / 1e9
  except UserError:
    raise UserError(f"cluster {cluster.name}: device '{cluster.device}' has no datasheet memory "
                    "bandwidth to price the optimizer update; set update_memory_GBps in the "
                    "cluster config") from None


def update_ms(params: np.ndarray, profile: ProfileTable, cluster: ClusterConfig,
              options: PlanOptions) -> np.ndarray:
  """(L,) ms of each layer's optimizer update on one device holding all of its parameters."""
  if profile.meta.get("includes_update"):
    return np.zeros(len(params))
  per_ms = update_GBps(cluster) * 1e6  # bytes per ms
  return np.asarray(params, dtype=float) * update_bytes_per_param(options) / per_ms


def boundary_at(table: Mapping[str, Mapping[str, float]], batch: int, k: int) -> float:
  """A profile's measured boundary cost at position k and per-device batch (table[batch][k],
  linear in k between measured cuts, nearest outside; a batch not measured: the nearest one,
  scaled linearly); 0 without a table."""
  rows = {b: r for b, r in table.items() if r}
  if not rows:
    return 0.0
  near = min(rows, key=lambda s: abs(math.log(int(s) / batch)))
  xs = sorted(int(x) for x in rows[near])
  value = float(np.interp(k, xs, [rows[near][str(x)] for x in xs]))
  return value * batch / int(near)


def stage_terms(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                options: PlanOptions, counts: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(stage_ms (C,), enter_ms (L, C), leave_ms (L, C)) in graph order (costs.CostModel)."""
  names = graph.names
  pos = {n: i for i, n in enumerate(flat_layers(graph.decompose()))}
  table = profile.meta.get("boundary_ms") or {}
  host = cluster.stage_boundary_us / 1e3 / 2
  last = len(names) - 1
  enter = np.zeros((len(names), len(counts)))
  leave = np.zeros_like(enter)
  for c, g in enumerate(counts):
    b = options.global_batch // int(g)
    for i, n in enumerate(names):
      k = pos[n]
      if k > 0:
        enter[i, c] = host + max(boundary_at(table, b, k), 0.0) / 2
      if k < last:
        leave[i, c] = host + max(boundary_at(table, b, k + 1), 0.0) / 2
  stage = np.full(len(counts), cluster.program_launch_us / 1e3)
  return stage, enter, leave
