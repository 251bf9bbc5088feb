"""Cost of one layer under a weight sharding: a (d, m) mesh on its g devices, split `split`.

The model (docs/cost_model.md, "Weight sharding"): a layer on devices [start, start + g) runs
on a mesh (d, m), d x m = g; device start + i m + j holds sample range i of d. Activations at
layer boundaries are laid out by samples only, so a layer with m > 1 first all-gathers its
B/d input samples within its model group (m consecutive devices). Per split:
- out: forward all-gather of the output over the model group, backward all-reduce of the
  input gradient;
- in: forward all-reduce of the output, backward all-gather of the input gradient;
- heads: forward 2 all-reduces of the output, backward 2 all-reduces of the input gradient.
The layer reading the model input computes no input gradient: no backward collective.
Compute: the profile's time at per-device batch B/d times the analytic roofline's ratio of
the sharded shape to the whole layer at that batch (dp_jax/profile/analytic.py), so measured
and imported tables both work. Weight gradients: each device holds 1/m of the split
parameters (replicated ones whole) and all-reduces them over its data group (d devices,
stride m); none when d = 1. Collectives: dp_jax/cluster.py (the d model groups, or m data
groups, side by side: the slowest counts). Which sharding each layer of a stage takes is
chosen exactly by dp_jax/planner/stage_choice.py. Pure Python and numpy: no JAX.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from dp_jax.cluster import (
  allgather_ms,
  allreduce_ms,
  group_collective_ms,
  link_class,
  strided_link_classes,
  strided_volume_ms,
)
from dp_jax.errors import UserError
from dp_jax.graph import LayerGraph, LayerNode
from dp_jax.profile.analytic import default_params, layer_cost, layer_times_ms
from dp_jax.profile.devices import DTYPE_BYTES, canonical_dtype, get_device
from dp_jax.sharding import SPLITS, splits_for

if TYPE_CHECKING:
  from dp_jax.planner.costs import CostModel, Placement
  from dp_jax.planner.plan import Plan

Sharding = tuple[int, str]  # (model axis m, split); the data axis is d = count // m
SAMPLES: Sharding = (1, "samples")


def is_samples(sharding: Sharding | None) -> bool:
  return sharding is None or sharding[1] == "samples"


def candidates(node: LayerNode, count: int, allowed: tuple[str, ...]) -> list[Sharding]:
  """Shardings of a layer on `count` devices under planner.sharding (samples first)."""
  out = [SAMPLES]
  if "weights" in allowed:
    for m in range(2, count + 1):
      if count % m == 0:
        out.extend((m, s) for s in splits_for(node, m) if s != "samples")
  return out


def check_sharding(node: LayerNode, count: int, sharding: Sharding) -> None:
  """One-line error for a sharding the layer cannot have on `count` devices."""
  m, split = sharding
  if split not in SPLITS:
    raise UserError(f"layer '{node.name}': split '{split}' is unknown (valid: "
                    f"{', '.join(SPLITS)})")
  if m < 1 or count % m:
    raise UserError(f"layer '{node.name}': model axis {m} does not divide its {count} devices")
  if split not in splits_for(node, m):
    raise UserError(f"layer '{node.name}' ({node.kind}) cannot split '{split}' {m} ways")


def plan_shardings(plan: Plan) -> dict[str, Sharding]:
  """Layer -> (m, split) of a plan's weight-sharded layers (their typed sharding entries)."""
  return {lp.name: lp.sharding.weights for lp in plan.layers
          if lp.sharding.weights is not None}


# --- parameters ------------------------------------------------------------------------------


def split_fraction(node: LayerNode, split: str) -> float:
  """Fraction of the layer's parameters split over the model axis (the rest is replicated)."""
  if split == "samples":
    return 0.0
  a, params = node.attrs, float(node.params)
  if params <= 0:
    return 1.0
  replicated = 0.0
  if split == "in" and node.kind == "linear" and a.get("bias", True):
    replicated = float(a.get("out_features", 0))  # the bias is added after the all-reduce
  elif split == "heads":  # two layer norms (scale, bias) and the two output projections' biases
    replicated = 6.0 * float(a.get("d_model", 0))
  return max(0.0, 1.0 - replicated / params)


def param_share(node: LayerNode, sharding: Sharding | None) -> float:
  """Fraction of the layer's parameters one device holds."""
  if is_samples(sharding):
    return 1.0
  m, split = sharding
  f = split_fraction(node, split)
  return f / m + (1.0 - f)


# --- compute at the sharded shape ------------------------------------------------------------


def _elements(shape) -> int:
  return math.prod(int(x) for x in shape) if shape else 1


@cache
def _device(name: str):
  try:
    return get_device(name)
  except UserError:
    return None


def compute_ratios(graph: LayerGraph, node: LayerNode, sharding: Sharding, batch: int,
                   device: str, dtype: str) -> tuple[float, float]:
  """(forward, backward) time of the sharded shape / the whole layer at per-device `batch`,
  from the analytic roofline (device unknown to it: the FLOPs ratio 1/m)."""
  m, split = sharding
  dev = _device(device)
  try:
    itemsize = DTYPE_BYTES[canonical_dtype(dtype)]
  except UserError:
    dev = None
  if dev is None:
    return 1.0 / m, 1.0 / m
  whole = layer_cost(graph, node, dtype)
  ins = sum(_elements(graph.node(p).out_shape) for p in node.inputs) if node.inputs else \
      _elements(graph.input_shape)
  in_b, out_b = ins * itemsize, _elements(node.out_shape) * itemsize
  act = whole.act_bytes_per_sample
  kept = {"out": in_b, "in": out_b, "heads": in_b + out_b}[split]  # read or written whole
  kept = min(kept, act)
  gemm = whole.gemm
  if gemm is not None and split != "in":
    gemm = (gemm[0], max(1, gemm[1] // m))
  part = replace(whole, flops_per_sample=whole.flops_per_sample / m,
                 act_bytes_per_sample=kept + (act - kept) / m,
                 param_bytes=whole.param_bytes * param_share(node, sharding), gemm=gemm)
  params = default_params(dev)
  f0, b0 = layer_times_ms(whole, dev, dtype, batch, params)
  f1, b1 = layer_times_ms(part, dev, dtype, batch, params)
  return (f1 / f0 if f0 > 0 else 1.0 / m), (b1 / b0 if b0 > 0 else 1.0 / m)


# --- per layer on a placement ------------------------------------------------------------------


def _model_groups(fn, cluster, nbytes: float, start: int, d: int, m: int) -> float:
  """The slowest model group's collective (the d groups run side by side)."""
  if m <= 1 or nbytes <= 0:
    return 0.0
  return max(float(fn(cluster, nbytes, j, m)) for j in _model_group_firsts(cluster, start, d, m))


@cache
def _model_group_firsts(cluster, start: int, d: int, m: int) -> tuple[int, ...]:
  """First devices of one model group [start + m i, + m) per link class among the d groups (a
  range's collectives depend on it through its link class and size only)."""
  firsts = start + m * np.arange(d)
  classes = link_class(cluster, firsts, m)
  return tuple(int(firsts[i]) for i in np.unique(classes, return_index=True)[1])


def activation_ms(model: CostModel, name: str, p: Placement, sharding: Sharding
                  ) -> tuple[float, float]:
  """(forward, backward) ms of the entry gather and the split's activation collectives."""
  start, count = p
  m, split = sharding
  d = count // m
  i = model.row[name]
  rows = model.batch // d
  x, y = rows * model.in_bytes[i], rows * model.out_bytes[i]
  cl = model.cluster
  gather = _model_groups(allgather_ms, cl, x, start, d, m)
  first = not model.graph.node(name).inputs  # no input gradient
  if split == "out":
    fwd = _model_groups(allgather_ms, cl, y, start, d, m)
    bwd = 0.0 if first else _model_groups(allreduce_ms, cl, x, start, d, m)
  elif split == "in":
    fwd = _model_groups(allreduce_ms, cl, y, start, d, m)
    bwd = 0.0 if first else _model_groups(allgather_ms, cl, x, start, d, m)
  else:  # heads
    fwd = 2 * _model_groups(allreduce_ms, cl, y, start, d, m)
    bwd = 0.0 if first else 2 * _model_groups(allreduce_ms, cl, x, start, d, m)
  return gather + fwd, bwd


def _data_groups(model: CostModel, nbytes: float, p: Placement, m: int, collective) -> float:
  """The slowest data group's collective (d devices, stride m; the m groups side by side)."""
  start, count = p
  d = count // m
  if d <= 1 or nbytes <= 0:
    return 0.0
  return max(float(collective(model.cluster, nbytes, j, d, m))
             for j in _data_group_firsts(model.cluster, start, d, m))


@cache
def _data_group_firsts(cluster, start: int, d: int, m: int) -> tuple[int, ...]:
  """First devices of one data group (d devices, stride m) per link class among the m groups
  (a strided group's collectives depend on it through its link class and size only)."""
  classes = strided_link_classes(cluster, start + np.arange(m), d, m)
  return tuple(start + int(j) for j in np.unique(classes, return_index=True)[1])


def layer_ms(model: CostModel, name: str, p: Placement, sharding: Sharding
             ) -> tuple[float, float]:
  """(fwd + bwd + update ms, bwd ms) of a weight-sharded layer, with its batch-norm syncs and
  the optimizer update of its parameter share."""
  m, _ = sharding
  d = p[1] // m
  node = model.graph.node(name)
  t = model.profile.lookup(name, model.batch // d)
  rf, rb = compute_ratios(model.graph, node, sharding, model.batch // d, model.profile.device,
                          model.profile.dtype)
  af, ab = activation_ms(model, name, p, sharding)
  fwd, bwd = t.fwd_ms * rf + af, t.bwd_ms * rb + ab
  share = param_share(node, sharding)
  bn = model.bn_bytes[model.row[name]] * share
  sync = _data_groups(model, bn, p, m, group_collective_ms)
  update = model.layer_update_ms(name, share)  # each device updates its share
  return fwd + bwd + update + 2 * sync, bwd + sync


def grad_bytes(model: CostModel, name: str, sharding: Sharding | None) -> float:
  """Gradient bytes one device all-reduces for the layer."""
  return float(model.grad_bytes[model.row[name]]) * param_share(model.graph.node(name), sharding)


def band_ms(model: CostModel, name: str, p: Placement, sharding: Sharding) -> float:
  """Bandwidth part of the layer's weight-gradient all-reduce over its data groups."""
  return _data_groups(model, grad_bytes(model, name, sharding), p, sharding[0],
                      strided_volume_ms)

