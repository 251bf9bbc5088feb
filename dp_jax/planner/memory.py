"""Device memory, the one model the planner, the simulator and the orchestrator use.

A device holding a layer on g devices at global batch B keeps:
- the layer's parameters, gradients and optimizer state (param_bytes + params x (grad bytes +
  optimizer bytes per parameter)); a copy on every device holding the layer, or under a weight
  split on a (d, m) mesh the split parameters' 1/m share plus the replicated ones whole
  (sharded.param_share; the runtime's optimizer state follows its parameter, runtime/layout.py);
  with its state sharded over the data axis of d devices, the optimizer state / d (ZeRO-1) or
  all of it / d (FSDP: sharded_state);
- the activations the layer saves for its backward pass for its B / g samples: the bytes of
  the residuals of the layer's forward-with-residuals program, per sample, as traced by XLA
  (LayerNode.saved_bytes_per_sample, dp_jax/models/trace.py); graphs without them (hand-written
  files) fall back to the layer's output. Saved bytes are rescaled from the traced dtype to the
  profile's (mixed fp16 saves 2-byte activations). A weight-sharded layer keeps them for its
  B / d samples: what its split keeps whole over the model group in full, the rest / m
  (split_saved_per_sample); an experts split its own B / g tokens'; a recomputed layer its input
  alone;
- while a layer runs, one layer at a time: FSDP's gathered parameters and whole gradients, or
  a recomputed layer's activations saved again (transient_need): a device's peak is what its
  layers keep plus the largest of these (device_bytes).
Pure numpy: no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.planner import pricing, sharded
from dp_jax.planner.costs import CostModel
from dp_jax.planner.footprint import (  # the per-layer part, re-exported
  MOMENTUM_STATE_BYTES,
  layer_params,
  saved_bytes_per_sample,
  state_bytes,
)
from dp_jax.planner.options import SHARDING_CHOICES
from dp_jax.planner.segments import Placement
from dp_jax.planner.sharded import Strategy

if TYPE_CHECKING:
  from dp_jax.planner.contract import Plan

__all__ = ["GB", "HEADS_WHOLE_OUTPUTS", "MOMENTUM_STATE_BYTES", "activation_bytes",
           "capacity_bytes", "check_fits", "device_bytes", "fits", "fits_alone", "job_bytes",
           "largest_layer_on", "layer_bytes", "layer_need", "layer_params", "placed_bytes",
           "saved_bytes_per_sample", "sharded_state", "split_saved_per_sample", "state_bytes",
           "state_need", "transient_need", "weight_fits", "weight_splits_that_fit"]

GB = 1e9


# --- per layer, from the graph (no cost model needed) -----------------------------------------


# Activations the runtime's heads-split GPT-2 block keeps whole over the model group besides
# its input, in block outputs per sample: 8 (+ 8 per-token layer-norm statistics, left out).
# Measured here: the per-device residuals of the runtime's stage program (runtime/step.py,
# `fwd`: jax.vjp inside jit) on two tiny GPT-2 configurations (d_model 32 and 64), for meshes
# (4, 2) and (2, 4): scripts/check_sharded_memory.py.
HEADS_WHOLE_OUTPUTS = 8


def split_saved_per_sample(saved: float, in_bytes: float, out_bytes: float,
                           sharding: Strategy | tuple | None) -> float:
  """Activation bytes per sample a device keeps for the layer's backward under `sharding`:
  what the split keeps whole plus the rest / m. Whole: the layer's input for every split (it
  arrives split by samples only, replicated over the model group, and the stage holds it until
  its backward: runtime/step.py keeps `ins` with the VJP); a heads-split block also
  HEADS_WHOLE_OUTPUTS outputs' worth (its layer norms and residual stream). Split / m: an
  out-split layer's output slice, an in-split layer's partial output, a block's attention and
  MLP activations."""
  s = sharded.strategy(sharding)
  if s.recompute:  # jax.checkpoint keeps the layer's input alone (a weight split's, whole)
    return min(saved, in_bytes)
  if s.split in ("samples", "experts"):  # experts: each device its own tokens' activations
    return saved
  m, split = s.m, s.split
  whole = in_bytes + (HEADS_WHOLE_OUTPUTS * out_bytes if split == "heads" else 0.0)
  kept = min(saved, whole)
  return kept + (saved - kept) / m


def job_bytes(graph: LayerGraph, batch: int, *, grad_bytes_per_param: float = 4,
              optimizer_bytes_per_param: float = MOMENTUM_STATE_BYTES,
              param_bytes_per_param: float = 4, element_scale: float = 1.0) -> float:
  """One device training the whole model at `batch` (a background job's copy)."""
  return float(sum(state_bytes(n, grad_bytes_per_param, optimizer_bytes_per_param,
                               param_bytes_per_param)
                   + batch * saved_bytes_per_sample(n, element_scale) for n in graph.nodes))


def placed_bytes(graph: LayerGraph, plan: Plan, num_devices: int | None = None, *,
                 grad_bytes_per_param: float = 4,
                 optimizer_bytes_per_param: float = MOMENTUM_STATE_BYTES,
                 param_bytes_per_param: float = 4, element_scale: float = 1.0) -> np.ndarray:
  """(devices,) bytes each device holds under the plan's layers (their devices, sample ranges
  and weight shardings); num_devices defaults to the plan's."""
  nodes = {n.name: n for n in graph.nodes}
  first_input = float(np.prod(graph.input_shape)) * np.dtype(graph.input_dtype).itemsize \
      if graph.input_shape else 0.0  # the model input, in its own dtype (as costs.py)
  used = np.zeros(plan.num_devices if num_devices is None else num_devices)
  for layer in plan.layers:
    n = nodes[layer.name]
    sh = layer.strategy
    share = sharded.param_share(n, sh)
    total = share * state_bytes(n, grad_bytes_per_param, optimizer_bytes_per_param,
                                param_bytes_per_param)
    opt = share * layer_params(n, param_bytes_per_param) * optimizer_bytes_per_param
    state = sharded_state(total, opt, sh, len(layer.devices))
    ins = (sum(nodes[p].out_bytes_per_sample for p in n.inputs) * element_scale if n.inputs
           else first_input)
    per_sample = split_saved_per_sample(saved_bytes_per_sample(n, element_scale), ins,
                                        n.out_bytes_per_sample * element_scale, sh)
    for d, (a, b) in zip(layer.devices, layer.samples, strict=True):
      used[d] += state + (b - a) * per_sample
  return used


def sharded_state(total: float, optimizer: float, s: Strategy, count: int) -> float:
  """Of a layer's state share (`total`, of which `optimizer` is optimizer state) what one
  device keeps on `count` devices under state s.state over its data axis of d: all of it
  (replicated, or d = 1), the optimizer state in d shards (optimizer), all of it in d (full)."""
  d = s.data_devices(count)
  if d < 2 or s.state == "replicated":
    return total
  if s.state == "optimizer":
    return total - optimizer + optimizer / d
  return total / d


# --- over a cost model's candidate counts (the planner's tables) ------------------------------


def activation_bytes(model: CostModel) -> np.ndarray:
  """(L, C): activations a layer saves for backward on each of its devices, per count."""
  return model.saved_bytes[:, None] * (model.batch // model.counts)[None, :]


def layer_bytes(model: CostModel) -> np.ndarray:
  """(L, C): what one layer alone needs on each of its devices, per count."""
  return model.state_bytes[:, None] + activation_bytes(model)


def capacity_bytes(model: CostModel) -> float:
  return model.cluster.memory_gb_per_device * GB


def layer_need(model: CostModel, name: str, count: int,
               sharding: Strategy | tuple | None = None) -> float:
  """Bytes a device holding this layer keeps through the step on `count` devices under its
  strategy (None: PLAIN): its state (state_need) and the activations it saves for its backward
  for the samples the device holds (B / count; a weight split's B / d, as the split keeps them;
  recomputing: its input alone). What it needs only while it runs: transient_need."""
  s = sharded.strategy(sharding)
  i = model.row[name]
  saved = split_saved_per_sample(model.saved_bytes[i], model.in_bytes[i], model.out_bytes[i], s)
  return float(state_need(model, name, count, s) + saved * (model.batch //
                                                           s.sample_groups(count)))


def state_need(model: CostModel, name: str, count: int, s: Strategy) -> float:
  """Parameters, gradients and optimizer state a device keeps for the layer: its split's share
  (sharded.param_share), with the optimizer state (state optimizer) or all three (full) in d
  shards over the data axis."""
  i = model.row[name]
  share = sharded.param_share(model.graph.node(name), s)
  return sharded_state(float(model.state_bytes[i]) * share,
                       float(model.optimizer_bytes[i]) * share, s, count)


def transient_need(model: CostModel, name: str, count: int,
                   sharding: Strategy | tuple | None = None) -> float:
  """Bytes a device needs for the layer only while the layer runs, one layer at a time: under
  state full its gathered parameters and their whole gradients before the reduce-scatter (FSDP's
  gather buffers); recomputing, the activations its forward saves again in its backward."""
  s = sharded.strategy(sharding)
  i = model.row[name]
  out = 0.0
  if s.state == "full" and s.data_devices(count) >= 2:
    share = sharded.param_share(model.graph.node(name), s)
    out += (float(model.state_bytes[i]) - float(model.optimizer_bytes[i])) * share
  if s.recompute:
    again = split_saved_per_sample(model.saved_bytes[i], model.in_bytes[i], model.out_bytes[i],
                                   s._replace(recompute=False))
    out += again * (model.batch // s.sample_groups(count))
  return out


def weight_splits_that_fit(model: CostModel, row: int, column: int,
                           allowed: tuple[str, ...] | None = None) -> tuple[Strategy, ...]:
  """The strategies other than PLAIN of layer `row` on counts[column] devices that fit alone,
  gather buffers and recomputation included (all of them when memory is not checked), under
  planner.sharding (or `allowed`)."""
  name, count = model.names[row], int(model.counts[column])
  memo = pricing.memo(model)
  key = ("splits that fit", pricing.signature(model, name), count, allowed)
  hit = memo.get(key)  # identical layers (pricing.signature) need the same
  if hit is None:
    cands = pricing.shardings(model, name, count, allowed)[1:]
    if not model.options.check_memory:
      hit = tuple(cands)
    else:
      cap = capacity_bytes(model)
      hit = tuple(sh for sh in cands if layer_need(model, name, count, sh)
                  + transient_need(model, name, count, sh) <= cap)
    memo[key] = hit
  return hit


def weight_fits(model: CostModel) -> dict[tuple[int, int], tuple[Strategy, ...]]:
  """(row, column) -> the weight shardings that fit the layer alone on counts[column] devices
  under planner.sharding (empty without weights)."""
  if not model.options.chooses_strategies:
    return {}
  memo = pricing.memo(model)
  hit = memo.get("weight_fits")
  if hit is not None:
    return hit
  out = memo["weight_fits"] = {}
  for r in range(len(model.names)):
    for c in range(len(model.counts)):
      fit = weight_splits_that_fit(model, r, c)
      if fit:
        out[(r, c)] = fit
  return out


def fits_alone(model: CostModel) -> np.ndarray:
  """(L, C) bool: the layer fits on its devices by itself splitting samples; raises naming a
  layer that fits at no count, neither splitting samples nor (planner.sharding with weights)
  under any weight split."""
  if not model.options.check_memory:
    return np.ones(model.compute_ms.shape, dtype=bool)
  need = layer_bytes(model)
  ok = need <= capacity_bytes(model)
  chooses = model.options.chooses_strategies
  for i in np.flatnonzero(~ok.any(axis=1)):
    if chooses and any(weight_splits_that_fit(model, i, c) for c in range(len(model.counts))):
      continue  # only another strategy fits it: the planner's masks offer those
    broad = ("samples", "weights", "state", "experts")
    could = any(weight_splits_that_fit(model, i, c, broad) for c in range(len(model.counts)))
    hint = ("; planner.sharding=[samples,weights,state,experts] (weights split, state sharded "
            "as ZeRO / FSDP) can fit it" if could else "")
    raise UserError(
        f"layer '{model.names[i]}' does not fit in {model.cluster.memory_gb_per_device:g} GB per "
        f"device on {model.cluster.name} at any device count: it needs {need[i].min() / GB:.2f} "
        f"GB (params+grads+optimizer {model.state_bytes[i] / GB:.2f} GB){hint}; use devices with "
        "more memory or a smaller global batch")
  return ok


def device_bytes(model: CostModel, assignment: Mapping[str, Placement],
                 shardings: Mapping[str, Strategy] | None = None) -> np.ndarray:
  """Peak bytes of each job device under the assignment and strategies (index = device): what
  its layers keep through the step (layer_need) plus the largest transient need of one of them
  (transient_need: gather buffers, a recomputation's activations)."""
  shardings = shardings or {}
  per_device = np.zeros(model.options.num_devices + 1)
  peak = np.zeros(model.options.num_devices)
  for name, (start, count) in assignment.items():
    s = shardings.get(name)
    need = layer_need(model, name, count, s)
    per_device[start] += need
    per_device[start + count] -= need
    if s is not None:
      extra = transient_need(model, name, count, s)
      if extra > 0:
        peak[start:start + count] = np.maximum(peak[start:start + count], extra)
  return np.cumsum(per_device)[:-1] + peak


def largest_layer_on(model: CostModel, assignment: Mapping[str, Placement], device: int,
                     shardings: Mapping[str, Strategy] | None = None) -> str:
  """The layer that takes the most memory on `device`."""
  best, best_bytes = "", -1.0
  for name, (start, count) in assignment.items():
    if start <= device < start + count:
      need = layer_need(model, name, count, (shardings or {}).get(name))
      if need > best_bytes:
        best, best_bytes = name, need
  return best


def fits(model: CostModel, assignment: Mapping[str, Placement],
         shardings: Mapping[str, Strategy] | None = None) -> bool:
  """Every device of the plan within its memory (always, with planner.check_memory off)."""
  if not model.options.check_memory:
    return True
  return bool(device_bytes(model, assignment, shardings).max() <= capacity_bytes(model))


def check_fits(model: CostModel, assignment: Mapping[str, Placement], what: str = "plan",
               shardings: Mapping[str, Strategy] | None = None) -> None:
  """Raise a one-line UserError when some device of the plan runs out of memory."""
  if not model.options.check_memory:
    return
  used = device_bytes(model, assignment, shardings)
  d = int(np.argmax(used))
  if used[d] > capacity_bytes(model):
    raise UserError(
        f"no {what} fits in {model.cluster.memory_gb_per_device:g} GB per device: device {d} needs "
        f"{used[d] / GB:.2f} GB; largest layer there is "
        f"'{largest_layer_on(model, assignment, d, shardings)}'; use more devices, a smaller "
        f"global batch or devices with more memory{_more_strategies(model.options)}")


def _more_strategies(options) -> str:
  """The planner options that could fit a plan the current ones cannot (or nothing)."""
  more = [f"planner.sharding=[{','.join(SHARDING_CHOICES)}]"] if set(
      options.sharding) != set(SHARDING_CHOICES) else []
  if options.recompute == "none":
    more.append("planner.recompute=choose")
  return f", or let the planner shard or recompute ({' '.join(more)})" if more else ""
