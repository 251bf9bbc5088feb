"""The cost model's data (CostModel, build_cost_model) and the cost terms shared by burst
plans and data parallelism: compute, gradient sync, sample moves. Pricing a layer, stage or
move under a CostModel: dp_jax/planner/pricing.py.

A placement is (start, count): devices [start, start + count) of the job, each holding a
contiguous range of global_batch / count samples, in order. All functions are pure; the
array versions broadcast over numpy arrays so the search can price every count at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import (
  ClusterConfig,
  bus_bandwidth_GBps,
  class_allreduce_ms,
  p2p_link,
  volume_ms,
)
from dp_jax.hardware.devices import DTYPE_BYTES, canonical_dtype
from dp_jax.layer_times.table import MissingProfileError, ProfileTable
from dp_jax.planner import footprint, stage_terms
from dp_jax.planner.layer_time import compose
from dp_jax.planner.options import PlanOptions, candidate_counts
from dp_jax.planner.segments import Placement  # noqa: F401 (re-exported: first device, count)

# --- collectives ------------------------------------------------------------------------------


def allreduce_volume_ms(cluster: ClusterConfig, nbytes, start, count):
  """Bandwidth part of an all-reduce over devices [start, start + count)
  (dp_jax/hardware/cluster.py)."""
  return volume_ms(nbytes, count, bus_bandwidth_GBps(cluster, start, count))


def stage_sync_ms(bandwidth_ms: Sequence[float], bwd_ms: Sequence[float], latency_ms: float,
                  overlap: bool) -> float:
  """Exposed time of one stage's combined all-reduce; layers in forward order.

  Without overlap: latency + sum of bandwidth terms, after the stage's backward. With overlap,
  a single channel sends each layer's gradients once its backward is done (last layer first)
  while the backward of earlier layers runs: exposed = latency + max over l of
  (bandwidth of layers <= l) - (backward of layers < l). No parameters: no all-reduce, 0.
  """
  if not any(a > 0 for a in bandwidth_ms):
    return 0.0
  if not overlap:
    return latency_ms + float(sum(bandwidth_ms))
  exposed, sent, hidden = 0.0, 0.0, 0.0
  for a, b in zip(bandwidth_ms, bwd_ms, strict=True):
    sent += a
    exposed = max(exposed, sent - hidden)
    hidden += b
  return latency_ms + exposed


# --- sample moves ----------------------------------------------------------------------------


def busiest_samples(batch: int, src_start, src_count, dst_start, dst_count):
  """Samples the busiest device sends or receives when a layout changes (0 if none moves).

  Device src_start + i holds samples [i P, (i+1) P), P = batch / src_count; device
  dst_start + j needs [j Q, (j+1) Q). A device sends what it holds but does not need and
  receives what it needs but does not hold. The overlap of the two ranges is a concave
  function of the device index, so its minimum over the shared devices is at an end.
  """
  sp, gp, sc, gc = (np.asarray(x, dtype=np.int64) for x in (src_start, src_count, dst_start,
                                                               dst_count))
  p, q = batch // gp, batch // gc
  lo, hi = np.maximum(sp, sc), np.minimum(sp + gp, sc + gc)
  shared = np.maximum(hi - lo, 0)

  def overlap(d):
    x, y = (d - sp) * p, (d - sc) * q
    return np.maximum(0, np.minimum(x + p, y + q) - np.maximum(x, y))

  least = np.minimum(overlap(lo), overlap(hi - 1))
  out = np.where(shared > 0, np.maximum(p, q) - least, 0)
  out = np.maximum(out, np.where(shared < gp, p, 0))
  return np.maximum(out, np.where(shared < gc, q, 0))


def devices_in_move(src_start, src_count, dst_start, dst_count):
  """Devices of both layouts together (all take part in the move)."""
  shared = np.maximum(np.minimum(np.asarray(src_start) + src_count,
                                 np.asarray(dst_start) + dst_count)
                      - np.maximum(src_start, dst_start), 0)
  return np.asarray(src_count) + dst_count - shared


def move_parts(cluster: ClusterConfig, batch: int, src_start, src_count, dst_start, dst_count):
  """(busiest samples, link bandwidth in bytes/ms, link latency ms) of a layout change."""
  samples = busiest_samples(batch, src_start, src_count, dst_start, dst_count)
  first = np.minimum(src_start, dst_start)
  last = np.maximum(np.asarray(src_start) + src_count, np.asarray(dst_start) + dst_count) - 1
  bw, lat = p2p_link(cluster, first, last)
  return samples, bw, lat


def move_from_parts(parts, bytes_per_sample):
  """Forward activations plus backward gradients: 2 x (busiest bytes / bw + latency), 0 if none."""
  samples, bw, lat = parts
  nbytes = samples * np.asarray(bytes_per_sample, dtype=float)
  return np.where(samples > 0, 2.0 * (nbytes / bw + lat), 0.0)


def move_ms(cluster: ClusterConfig, batch: int, bytes_per_sample, src_start, src_count, dst_start,
            dst_count):
  """Forward activations plus backward gradients of one edge: 2 x (busiest bytes / bw + lat)."""
  parts = move_parts(cluster, batch, src_start, src_count, dst_start, dst_count)
  return move_from_parts(parts, bytes_per_sample)


# --- per-layer tables ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CostModel:
  """Per-layer costs over the candidate device counts and the graph, profile, cluster and
  options they were built from: data only (priced by dp_jax/planner/pricing.py). Compared and
  hashed by identity (pricing memoises per model)."""

  graph: LayerGraph
  profile: ProfileTable
  cluster: ClusterConfig
  options: PlanOptions
  counts: np.ndarray  # (C,) ascending, counts[0] == 1
  names: tuple[str, ...]  # graph order
  row: dict[str, int]
  fwd_ms: np.ndarray  # (L, C) the profile's forward at B / count per device
  bwd_ms: np.ndarray  # (L, C) the profile's backward
  grad_bytes: np.ndarray  # (L,) gradient bytes all-reduced per step
  out_bytes: np.ndarray  # (L,) output bytes per sample (what a move sends)
  in_bytes: np.ndarray  # (L,) input bytes per sample (the model input for the first layer)
  saved_bytes: np.ndarray  # (L,) activation bytes per sample saved for backward
  state_bytes: np.ndarray  # (L,) params + gradients + optimizer state per device holding it
  param_bytes: np.ndarray  # (L,) of it the parameters (what FSDP all-gathers)
  optimizer_bytes: np.ndarray  # (L,) of it the optimizer state (what ZeRO-1 shards)
  bn_bytes: np.ndarray  # (L,) bytes of one batch-norm statistics all-reduce (0: none)
  interpolated: frozenset[str] = frozenset()  # layers priced from interpolated profile rows
  # (L,) optimizer update of the layer's parameters on one device holding them whole, included
  # in compute_ms (not in bwd_ms); a weight-sharded layer updates its share
  # (dp_jax/planner/stage_terms.py). None: zero.
  update_ms: np.ndarray | None = None
  # Per-stage terms (a stage: a maximal run of layers on one placement, rows i..k in forward
  # order): it pays stage_ms[c] + enter_ms[i, c] + leave_ms[k, c] on count index c, in its
  # backward (program launch, a boundary's host work and program time: priced by
  # dp_jax/planner/stage_terms.py); None: zero. enter_ms of the model's input layer and
  # leave_ms of its output layer are zero by construction.
  stage_ms: np.ndarray | None = None  # (C,)
  enter_ms: np.ndarray | None = None  # (L, C)
  leave_ms: np.ndarray | None = None  # (L, C)

  @property
  def batch(self) -> int:
    return self.options.global_batch

  @cached_property
  def compute_ms(self) -> np.ndarray:
    """(L, C) forward + backward + optimizer update, split by samples (layer_time.compose)."""
    upd = np.zeros(len(self.names)) if self.update_ms is None else self.update_ms
    return compose(self.fwd_ms, self.bwd_ms, upd[:, None]).total


# Synchronised batch norm all-reduces, per layer and step, the sum and the sum of squares of
# its channels in forward and two per-channel sums in backward: 2 x channels float32 each.
BN_STAT_BYTES_PER_CHANNEL = 2 * 4


def batch_norm_bytes(node) -> float:
  """Bytes of one statistics all-reduce of a layer with batch norm (0 without)."""
  if not node.attrs.get("batch_norm"):
    return 0.0
  channels = node.attrs.get("out_channels") or (node.out_shape[-1] if node.out_shape else 0)
  return float(BN_STAT_BYTES_PER_CHANNEL * int(channels))


def batch_norm_ms(model: CostModel) -> np.ndarray:
  """(K, L, C): one statistics all-reduce per link class, layer and count (0 on one device or
  without batch norm): the cluster's all-reduce, as a layer's time prices it."""
  k = model.counts
  ms = class_allreduce_ms(model.cluster, model.bn_bytes[:, None], k[None, :])
  return np.where((model.bn_bytes[None, :, None] > 0) & (k[None, None, :] > 1), ms, 0.0)


def element_bytes(dtype: str) -> int | None:
  """Bytes of one activation element in a profile's dtype (mixed precision: the half type)."""
  try:
    return DTYPE_BYTES[canonical_dtype(dtype)]
  except UserError:
    return None


def element_scales(graph: LayerGraph, profile: ProfileTable) -> np.ndarray:
  """(L,) profile element size / traced element size of each layer's output (1 if unknown).

  The graph records bytes in its traced dtype; a profile measured in mixed fp16 (the A100
  tables) moves and saves 2-byte activations, a float32 one 4-byte.
  """
  size = element_bytes(profile.dtype)
  out = []
  for n in graph.nodes:
    numel = math.prod(n.out_shape) if n.out_shape else 0
    traced = n.out_bytes_per_sample / numel if numel and n.out_bytes_per_sample else 0
    out.append(size / traced if size and traced else 1.0)
  return np.array(out, dtype=float)


def moved_bytes_per_sample(graph: LayerGraph, profile: ProfileTable) -> np.ndarray:
  """(L,) bytes per sample of each layer's output in the profile's dtype (what a move sends)."""
  return np.array([n.out_bytes_per_sample for n in graph.nodes], dtype=float) * element_scales(
      graph, profile)


def input_bytes_per_sample(graph: LayerGraph, profile: ProfileTable) -> np.ndarray:
  """(L,) bytes per sample each layer reads: its inputs' outputs in the profile's dtype, the
  model input (in its own dtype) for the first layer."""
  moved = dict(zip(graph.names, moved_bytes_per_sample(graph, profile), strict=True))
  size = element_bytes(graph.input_dtype) or 4
  first = math.prod(graph.input_shape) * size if graph.input_shape else 0
  return np.array([sum(moved[p] for p in n.inputs) if n.inputs else first for n in graph.nodes],
                  dtype=float)


def build_cost_model(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                     options: PlanOptions) -> CostModel:
  """Look every layer up at every candidate count once."""
  missing = profile.missing(list(graph.names))
  if missing:
    more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
    raise MissingProfileError(
        f"profile of {profile.model} on {profile.device} has no timing for layer(s) "
        f"{', '.join(repr(n) for n in missing[:5])}{more}; profile them (python -m "
        "dp_jax.profile) or pass a profile that covers every layer of the graph")
  if options.num_devices > cluster.pod_devices:
    raise UserError(f"cluster {cluster.name} has at most {cluster.pod_devices} devices "
                    f"({cluster.num_nodes} nodes x {cluster.devices_per_node}), got "
                    f"num_devices={options.num_devices}; use fewer devices or a larger cluster")
  counts = candidate_counts(options)
  names = graph.names
  fwd = np.zeros((len(names), len(counts)))
  bwd = np.zeros_like(fwd)
  interpolated = set()
  for i, name in enumerate(names):
    for c, g in enumerate(counts):
      t = profile.lookup(name, options.global_batch // int(g))
      fwd[i, c], bwd[i, c] = t.fwd_ms, t.bwd_ms
      if t.interpolated:
        interpolated.add(name)
  params = np.array([footprint.layer_params(n, options.param_bytes_per_param) for n in graph.nodes])
  update = stage_terms.update_ms(params, profile, cluster, options)
  stage_ms, enter_ms, leave_ms = stage_terms.stage_terms(graph, profile, cluster, options, counts)
  # a profile timed on the stage's devices has the gradient all-reduce inside its programs
  # (dp_jax.measurement.in_context): the cluster's all-reduce is not priced again
  grads = 0.0 if profile.meta.get("includes_allreduce") else options.grad_bytes_per_param
  scales = element_scales(graph, profile)
  model = CostModel(
      graph=graph, profile=profile, cluster=cluster, options=options, counts=counts,
      names=names, row={n: i for i, n in enumerate(names)}, fwd_ms=fwd, bwd_ms=bwd,
      grad_bytes=params * grads,
      out_bytes=moved_bytes_per_sample(graph, profile),
      in_bytes=input_bytes_per_sample(graph, profile),
      saved_bytes=np.array([footprint.saved_bytes_per_sample(n, x)
                            for n, x in zip(graph.nodes, scales, strict=True)]),
      bn_bytes=np.array([batch_norm_bytes(n) if options.batch_norm == "sync" else 0.0
                         for n in graph.nodes]),
      state_bytes=np.array([footprint.state_bytes(n, options.grad_bytes_per_param,
                                               options.optimizer_bytes_per_param,
                                               options.param_bytes_per_param)
                            for n in graph.nodes]),
      param_bytes=np.array([float(n.param_bytes) for n in graph.nodes]),
      optimizer_bytes=params * options.optimizer_bytes_per_param,
      interpolated=frozenset(interpolated), update_ms=update, stage_ms=stage_ms,
      enter_ms=enter_ms, leave_ms=leave_ms)
  return model
