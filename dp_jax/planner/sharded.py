"""A layer's strategy on its devices (Strategy) and what it costs beyond the samples split.

A strategy is (m, split, state, recompute) on the layer's g devices (docs/cost_model.md,
"Per-layer strategies"). The model:
- Weight splits (out, in, heads): a mesh (d, m), d x m = g; device start + i m + j holds sample
  range i of d. Activations at layer boundaries are laid out by samples only, so the layer
  first all-gathers its B/d input samples within its model group (m consecutive devices).
  out: forward all-gather of the output, backward all-reduce of the input gradient; in:
  forward all-reduce of the output, backward all-gather of the input gradient; heads: an
  all-reduce of the output forward and of the input gradient backward per Megatron pair (two in
  a GPT-2 block, one in a Llama attention or MLP layer). The layer reading the model input
  computes no input gradient: no backward collective.
- Experts (an MoE layer): the routed experts over the model axis (E / m per device), tokens
  over all g devices (B / g each, as the samples split lays them out: no entry gather); the
  dispatch and the combine are all-to-alls within the model group of the layer's slot buffer
  (E x C x D per sequence), two forward and two backward; compute is the whole layer's at
  B / g on E / m experts' weights; the shared experts stay replicated and their gradients are
  all-reduced over all g devices, the routed experts' over the data group.
- Compute of a weight split: the profile's time at per-device batch B/d times the analytic
  roofline's ratio of the sharded shape to the whole layer at that batch
  (dp_jax/layer_times/analytic.py), so measured and imported tables both work. Weight
  gradients: each device holds 1/m of the split parameters (replicated ones whole) and
  all-reduces them over its data group (d devices, stride m); none when d = 1.
- State over the data axis (ZeRO, FSDP): optimizer: the optimizer state in d shards, the
  gradient all-reduce becomes a reduce-scatter and an all-gather of the updated parameters
  (the same bytes), the update runs on 1/d of the parameters; full: parameters, gradients and
  optimizer state in d shards, the parameters all-gathered before the forward and again before
  the backward (in the layer's own forward and backward, not overlapped), the gradients
  reduce-scattered (half an all-reduce's bytes) in the stage's sync, the update on 1/d.
- Recompute: the backward runs the forward again (dp_jax/planner/layer_time.py, compose).
Collectives: dp_jax/hardware/cluster.py (the d model groups, or m data groups, side by side:
the slowest counts). A layer's prices under a cost model: dp_jax/planner/pricing.py; its
memory: dp_jax/planner/memory.py. Which strategy each layer of a stage takes is chosen exactly
by dp_jax/planner/stage_choice.py. Pure Python and numpy: no JAX.
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import link_class, strided_link_classes
from dp_jax.hardware.devices import DTYPE_BYTES, canonical_dtype, get_device
from dp_jax.layer_times.analytic import default_params, layer_cost, layer_times_ms
from dp_jax.layer_times.calibrated import layer_model
from dp_jax.planner.sharding import PLAIN as PLAIN  # the strategy type, re-exported
from dp_jax.planner.sharding import SAMPLES as SAMPLES
from dp_jax.planner.sharding import SPLITS, STATES, splits_for
from dp_jax.planner.sharding import Strategy as Strategy
from dp_jax.planner.sharding import is_samples as is_samples
from dp_jax.planner.sharding import strategy as strategy

if TYPE_CHECKING:
  from dp_jax.planner.contract import Plan


def candidates(node: LayerNode, count: int, allowed: tuple[str, ...],
               recompute: str = "none") -> list[Strategy]:
  """Strategies of a layer on `count` devices under planner.sharding (`allowed`) and
  planner.recompute, PLAIN first: its splits (weights: out / in / heads on every model axis m
  dividing count; experts: an MoE layer's experts over m), each with its state over the data
  axis (state: also optimizer and full where the data axis has 2 or more devices and the layer
  has parameters), with and without recomputation (choose; all: with only, PLAIN aside)."""
  splits = [(1, "samples")]
  if "weights" in allowed or "experts" in allowed:
    for m in _divisors(count):
      splits.extend((m, s) for s in splits_for(node, m) if s != "samples"
                    and ("experts" if s == "experts" else "weights") in allowed)
  again = {"none": (False,), "choose": (False, True), "all": (True,)}[recompute]
  out = [PLAIN]
  for m, split in splits:
    states = ["replicated"]
    if "state" in allowed and node.params > 0 and count // m >= 2:
      states += ["optimizer", "full"]
    out.extend(s for st in states for r in again
               if (s := Strategy(m, split, st, r)) != PLAIN)
  return out


@cache
def _divisors(count: int) -> tuple[int, ...]:
  """The divisors m >= 2 of count, ascending."""
  low = [m for m in range(2, math.isqrt(count) + 1) if count % m == 0]
  high = [count // m for m in reversed(low) if count // m != m]
  return tuple(low + high + ([count] if count >= 2 else []))


def check_sharding(node: LayerNode, count: int, sharding: Strategy) -> None:
  """One-line error for a strategy the layer cannot have on `count` devices."""
  sharding = strategy(sharding)
  m, split = sharding.m, sharding.split
  if split not in SPLITS:
    raise UserError(f"layer '{node.name}': split '{split}' is unknown (valid: "
                    f"{', '.join(SPLITS)})")
  if m < 1 or count % m:
    raise UserError(f"layer '{node.name}': model axis {m} does not divide its {count} devices")
  if split not in splits_for(node, m):
    raise UserError(f"layer '{node.name}' ({node.kind}) cannot split '{split}' {m} ways")
  if sharding.state not in STATES:
    raise UserError(f"layer '{node.name}': state '{sharding.state}' is unknown (valid: "
                    f"{', '.join(STATES)})")


def plan_shardings(plan: Plan) -> dict[str, Strategy]:
  """Layer -> Strategy of the plan's layers that are not PLAIN (their typed entries)."""
  return {lp.name: lp.strategy for lp in plan.layers if not lp.strategy.plain}


# --- parameters ------------------------------------------------------------------------------


def split_fraction(node: LayerNode, split: str) -> float:
  """Fraction of the layer's parameters split over the model axis (the rest is replicated)."""
  if split == "samples":
    return 0.0
  a, params = node.attrs, float(node.params)
  if params <= 0:
    return 1.0
  if split == "experts":  # the routed experts (w_gate, w_up, w_down); shared experts replicated
    routed = 3.0 * a.get("n_expert", 0) * a.get("d_model", 0) * a.get("ffn_dim", 0)
    return min(1.0, routed / params)
  replicated = 0.0
  if split == "in" and node.kind == "linear" and a.get("bias", True):
    replicated = float(a.get("out_features", 0))  # the bias is added after the all-reduce
  elif split == "heads" and node.kind == "transformer_block":
    replicated = 6.0 * float(a.get("d_model", 0))  # two layer norms, two projections' biases
  elif split == "heads":  # a Llama attention or MLP layer: its RMSNorm scale
    replicated = float(a.get("d_model", 0))
  return max(0.0, 1.0 - replicated / params)


def param_share(node: LayerNode, sharding: Strategy | None) -> float:
  """Fraction of the layer's parameters one device computes with: its split's share (the state
  sharding gathers them whole for the forward and the backward; memory.py holds the rest)."""
  if is_samples(sharding):
    return 1.0
  s = strategy(sharding)
  f = split_fraction(node, s.split)
  return f / s.m + (1.0 - f)


# --- compute at the sharded shape ------------------------------------------------------------


def _elements(shape) -> int:
  return math.prod(int(x) for x in shape) if shape else 1


@cache
def _device(name: str):
  try:
    return get_device(name)
  except UserError:
    return None


def whole_times(graph: LayerGraph, node: LayerNode, batch: int, device: str, dtype: str,
                source: str = "analytic"):
  """(the whole layer's roofline LayerCost, its knobs, forward ms, backward ms at per-device
  `batch`) under the roofline of profile `source` (calibrated: its own; else the analytic
  one), or None when the roofline does not know the device or dtype (compute_ratios' 1/m)."""
  dev = _device(device)
  try:
    DTYPE_BYTES[canonical_dtype(dtype)]
  except UserError:
    dev = None
  if dev is None:
    return None
  if source == "calibrated" and dev.name != "cpu":
    whole, params = layer_model(graph, node, dtype)
  else:
    whole, params = layer_cost(graph, node, dtype), default_params(dev)
  return (whole, params, *layer_times_ms(whole, dev, dtype, batch, params))


def sharded_cost(graph: LayerGraph, node: LayerNode, sharding: Strategy, whole, dtype: str):
  """The roofline LayerCost of the sharded shape, from the whole layer's (`whole`). Experts: a
  device's tokens (B / g) run through the experts as the whole layer's would (their slots
  spread over the model group's devices), on E / m experts' weights."""
  sharding = strategy(sharding)
  m, split = sharding.m, sharding.split
  if split == "experts":
    return whole.scaled(1.0, param_bytes=whole.param_bytes * param_share(node, sharding))
  itemsize = DTYPE_BYTES[canonical_dtype(dtype)]
  ins = sum(_elements(graph.node(p).out_shape) for p in node.inputs) if node.inputs else \
      _elements(graph.input_shape)
  in_b, out_b = ins * itemsize, _elements(node.out_shape) * itemsize
  act = whole.act_bytes_per_sample
  kept = {"out": in_b, "in": out_b, "heads": in_b + out_b}[split]  # read or written whole
  kept = min(kept, act)
  gemm = whole.gemm
  if gemm is not None and split != "in":
    gemm = (gemm[0], max(1, gemm[1] // m))
  return whole.scaled(1.0 / m, act_bytes_per_sample=kept + (act - kept) / m,
                      param_bytes=whole.param_bytes * param_share(node, sharding), gemm=gemm)


def compute_ratios(graph: LayerGraph, node: LayerNode, sharding: Strategy, batch: int,
                   device: str, dtype: str, whole=False, part=None,
                   source: str = "analytic") -> tuple[float, float]:
  """(forward, backward) time of the sharded shape / the whole layer at per-device `batch`,
  from the roofline of profile `source` (device unknown to it: the FLOPs ratio 1/m; 1 for
  experts). `whole`: the layer's whole_times at that batch and `part` its sharded_cost, when the
  caller has them."""
  sharding = strategy(sharding)
  m = 1 if sharding.split == "experts" else sharding.m
  if whole is False:
    whole = whole_times(graph, node, batch, device, dtype, source)
  if whole is None:
    return 1.0 / m, 1.0 / m
  whole, params, f0, b0 = whole
  if part is None:
    part = sharded_cost(graph, node, sharding, whole, dtype)
  f1, b1 = layer_times_ms(part, _device(device), dtype, batch, params)
  return (f1 / f0 if f0 > 0 else 1.0 / m), (b1 / b0 if b0 > 0 else 1.0 / m)


# --- collectives of the model and data groups (priced by dp_jax/planner/pricing.py) ----------


def model_groups(fn, cluster, nbytes: float, start: int, d: int, m: int) -> float:
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


def data_groups(cluster, nbytes: float, p: tuple[int, int], m: int, collective) -> float:
  """The slowest data group's collective (d devices, stride m; the m groups side by side)."""
  start, count = p
  d = count // m
  if d <= 1 or nbytes <= 0:
    return 0.0
  return max(float(collective(cluster, nbytes, j, d, m))
             for j in _data_group_firsts(cluster, start, d, m))


@cache
def _data_group_firsts(cluster, start: int, d: int, m: int) -> tuple[int, ...]:
  """First devices of one data group (d devices, stride m) per link class among the m groups
  (a strided group's collectives depend on it through its link class and size only)."""
  classes = strided_link_classes(cluster, start + np.arange(m), d, m)
  return tuple(start + int(j) for j in np.unique(classes, return_index=True)[1])
