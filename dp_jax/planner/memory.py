"""Device memory, the one model the planner, the simulator and the orchestrator use.

A device holding a layer on g devices at global batch B keeps:
- the layer's parameters, gradients and optimizer state (param_bytes + params x (grad bytes +
  optimizer bytes per parameter)); a copy on every device holding the layer, or under a weight
  sharding on a (d, m) mesh the split parameters' 1/m share plus the replicated ones whole
  (sharded.param_share; the runtime's optimizer state follows its parameter, runtime/layout.py);
- the activations the layer saves for its backward pass for its B / g samples: the bytes of
  the residuals of the layer's forward-with-residuals program, per sample, as traced by XLA
  (LayerNode.saved_bytes_per_sample, dp_jax/models/trace.py); graphs without them (hand-written
  files) fall back to the layer's output. Saved bytes are rescaled from the traced dtype to the
  profile's (mixed fp16 saves 2-byte activations). A weight-sharded layer keeps them for its
  B / d samples: what its split keeps whole over the model group in full, the rest / m
  (split_saved_per_sample).
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
from dp_jax.planner.segments import Placement
from dp_jax.planner.sharded import Sharding

if TYPE_CHECKING:
  from dp_jax.planner.contract import Plan

__all__ = ["GB", "HEADS_WHOLE_OUTPUTS", "MOMENTUM_STATE_BYTES", "activation_bytes",
           "capacity_bytes", "check_fits", "device_bytes", "fits", "fits_alone", "job_bytes",
           "largest_layer_on", "layer_bytes", "layer_need", "layer_params", "placed_bytes",
           "saved_bytes_per_sample", "split_saved_per_sample", "state_bytes", "weight_fits",
           "weight_splits_that_fit"]

GB = 1e9


# --- per layer, from the graph (no cost model needed) -----------------------------------------


# Activations the runtime's heads-split GPT-2 block keeps whole over the model group besides
# its input, in block outputs per sample: 8 (+ 8 per-token layer-norm statistics, left out).
# Measured here: the per-device residuals of the runtime's stage program (runtime/step.py,
# `fwd`: jax.vjp inside jit) on two tiny GPT-2 configurations (d_model 32 and 64), for meshes
# (4, 2) and (2, 4): scripts/check_sharded_memory.py.
HEADS_WHOLE_OUTPUTS = 8


def split_saved_per_sample(saved: float, in_bytes: float, out_bytes: float,
                           sharding: Sharding | None) -> float:
  """Activation bytes per sample a device keeps for the layer's backward under `sharding`:
  what the split keeps whole plus the rest / m. Whole: the layer's input for every split (it
  arrives split by samples only, replicated over the model group, and the stage holds it until
  its backward: runtime/step.py keeps `ins` with the VJP); a heads-split block also
  HEADS_WHOLE_OUTPUTS outputs' worth (its layer norms and residual stream). Split / m: an
  out-split layer's output slice, an in-split layer's partial output, a block's attention and
  MLP activations."""
  if sharded.is_samples(sharding):
    return saved
  m, split = sharding
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
    sh = layer.sharding.weights
    state = sharded.param_share(n, sh) * state_bytes(n, grad_bytes_per_param,
                                                     optimizer_bytes_per_param,
                                                     param_bytes_per_param)
    ins = (sum(nodes[p].out_bytes_per_sample for p in n.inputs) * element_scale if n.inputs
           else first_input)
    per_sample = split_saved_per_sample(saved_bytes_per_sample(n, element_scale), ins,
                                        n.out_bytes_per_sample * element_scale, sh)
    for d, (a, b) in zip(layer.devices, layer.samples, strict=True):
      used[d] += state + (b - a) * per_sample
  return used


# --- over a cost model's candidate counts (the planner's tables) ------------------------------


def activation_bytes(model: CostModel) -> np.ndarray:
  """(L, C): activations a layer saves for backward on each of its devices, per count."""
  return model.saved_bytes[:, None] * (model.batch // model.counts)[None, :]


def layer_bytes(model: CostModel) -> np.ndarray:
  """(L, C): what one layer alone needs on each of its devices, per count."""
  return model.state_bytes[:, None] + activation_bytes(model)


def capacity_bytes(model: CostModel) -> float:
  return model.cluster.memory_gb_per_device * GB


def layer_need(model: CostModel, name: str, count: int, sharding: Sharding | None = None
               ) -> float:
  """Bytes a device holding only this layer needs on `count` devices: samples (None) keeps
  every parameter and B / count samples' activations; a weight sharding (m, split) its
  parameter share and B / (count / m) samples' activations as the split keeps them."""
  i = model.row[name]
  share = sharded.param_share(model.graph.node(name), sharding)
  d = count if sharded.is_samples(sharding) else count // sharding[0]
  saved = split_saved_per_sample(model.saved_bytes[i], model.in_bytes[i], model.out_bytes[i],
                                 sharding)
  return float(model.state_bytes[i] * share + saved * (model.batch // d))


def weight_splits_that_fit(model: CostModel, row: int, column: int,
                           allowed: tuple[str, ...] = ("samples", "weights")
                           ) -> tuple[Sharding, ...]:
  """The weight shardings (m, split) of layer `row` on counts[column] devices that fit alone
  (all of them when memory is not checked)."""
  name, count = model.names[row], int(model.counts[column])
  memo = pricing.memo(model)
  key = ("splits that fit", pricing.signature(model, name), count, tuple(allowed))
  hit = memo.get(key)  # identical layers (pricing.signature) need the same
  if hit is None:
    cands = pricing.shardings(model, name, count, tuple(allowed))[1:]
    if not model.options.check_memory:
      hit = tuple(cands)
    else:
      cap = capacity_bytes(model)
      hit = tuple(sh for sh in cands if layer_need(model, name, count, sh) <= cap)
    memo[key] = hit
  return hit


def weight_fits(model: CostModel) -> dict[tuple[int, int], tuple[Sharding, ...]]:
  """(row, column) -> the weight shardings that fit the layer alone on counts[column] devices
  under planner.sharding (empty without weights)."""
  if "weights" not in model.options.sharding:
    return {}
  memo = pricing.memo(model)
  hit = memo.get("weight_fits")
  if hit is not None:
    return hit
  out = memo["weight_fits"] = {}
  for r in range(len(model.names)):
    for c in range(len(model.counts)):
      fit = weight_splits_that_fit(model, r, c, model.options.sharding)
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
  weights = "weights" in model.options.sharding
  for i in np.flatnonzero(~ok.any(axis=1)):
    split = any(weight_splits_that_fit(model, i, c) for c in range(len(model.counts)))
    if weights and split:
      continue  # only a weight split fits it: the planner's masks offer those
    hint = "; planner.sharding=[samples,weights] can split its weights to fit" if split else ""
    raise UserError(
        f"layer '{model.names[i]}' does not fit in {model.cluster.memory_gb_per_device:g} GB per "
        f"device on {model.cluster.name} at any device count: it needs {need[i].min() / GB:.2f} "
        f"GB (params+grads+optimizer {model.state_bytes[i] / GB:.2f} GB){hint}; use devices with "
        "more memory or a smaller global batch")
  return ok


def device_bytes(model: CostModel, assignment: Mapping[str, Placement],
                 shardings: Mapping[str, Sharding] | None = None) -> np.ndarray:
  """Bytes each job device holds under the assignment and weight shardings (index = device)."""
  shardings = shardings or {}
  per_device = np.zeros(model.options.num_devices + 1)
  for name, (start, count) in assignment.items():
    need = layer_need(model, name, count, shardings.get(name))
    per_device[start] += need
    per_device[start + count] -= need
  return np.cumsum(per_device)[:-1]


def largest_layer_on(model: CostModel, assignment: Mapping[str, Placement], device: int,
                     shardings: Mapping[str, Sharding] | None = None) -> str:
  """The layer that takes the most memory on `device`."""
  best, best_bytes = "", -1.0
  for name, (start, count) in assignment.items():
    if start <= device < start + count:
      need = layer_need(model, name, count, (shardings or {}).get(name))
      if need > best_bytes:
        best, best_bytes = name, need
  return best


def fits(model: CostModel, assignment: Mapping[str, Placement],
         shardings: Mapping[str, Sharding] | None = None) -> bool:
  """Every device of the plan within its memory (always, with planner.check_memory off)."""
  if not model.options.check_memory:
    return True
  return bool(device_bytes(model, assignment, shardings).max() <= capacity_bytes(model))


def check_fits(model: CostModel, assignment: Mapping[str, Placement], what: str = "plan",
               shardings: Mapping[str, Sharding] | None = None) -> None:
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
        "global batch or devices with more memory")
