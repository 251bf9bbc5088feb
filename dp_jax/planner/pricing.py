"""What a layer, a stage and a move cost under a CostModel: pure functions of its data.

dp_jax/planner/costs.py holds the cost model's data (per-layer arrays over the candidate
counts, built once per plan); this module prices placements, weight shardings, stages and
sample moves from it, the one pricing the search, evaluate, make and the simulator share.
A placement is (start, count): devices [start, start + count) of the job.

Memo: the same (layer, placement, sharding), move and stage are priced many times by one
search, so results are memoised per cost model in `memo(model)`, a dict held in a weak-keyed
table here (never on the model, freed with it). A CostModel is immutable, so a memoised value
is the one a fresh computation returns. A weight-sharded layer's prices are memoised by the
layer's content (`signature`), not its name, so identical layers (ResNet's repeated blocks)
are priced once. Pure Python and numpy: no JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Mapping

import numpy as np

from dp_jax.hardware.cluster import (
  allgather_ms,
  allreduce_ms,
  alltoall_ms,
  collective_latency_ms,
  group_collective_ms,
  strided_volume_ms,
)
from dp_jax.planner import sharded
from dp_jax.planner.costs import (
  CostModel,
  allreduce_volume_ms,
  devices_in_move,
  move_ms,
  stage_sync_ms,
)
from dp_jax.planner.layer_time import LayerTime, compose
from dp_jax.planner.segments import Placement
from dp_jax.planner.sharded import (
  Strategy,
  candidates,
  compute_ratios,
  data_groups,
  is_samples,
  model_groups,
  param_share,
  sharded_cost,
  strategy,
  whole_times,
)

_MEMOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_LAST: list = [None, None]  # (weak reference to the last model asked for, its memo)


def memo(model: CostModel) -> dict:
  """The memo of one cost model's prices (created on first use, dropped with the model)."""
  ref, hit = _LAST
  if ref is not None and ref() is model:  # the common case: one model at a time
    return hit
  hit = _MEMOS.get(model)
  if hit is None:
    hit = _MEMOS[model] = {}
  _LAST[:] = [weakref.ref(model, _forget), hit]
  return hit


def _forget(ref) -> None:
  if _LAST[0] is ref:
    _LAST[:] = [None, None]


def column(model: CostModel, count: int) -> int | None:
  """Index of `count` among the candidate counts (None: not a candidate)."""
  c = int(np.searchsorted(model.counts, count))
  return c if c < len(model.counts) and model.counts[c] == count else None


def _frozen(value):
  """A hashable copy of a JSON-like value (dicts and lists become sorted / plain tuples)."""
  if isinstance(value, Mapping):
    return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value


def signature(model: CostModel, name: str) -> int:
  """The row of the first layer with the same content as `name` as far as its weight-sharded
  prices and its memory read it (the node's fields but its name and inputs' names, its input
  shapes, its profile rows and the cost model's per-layer data): two layers with the same
  signature cost and need the same under every (placement, sharding)."""
  m = memo(model)
  key = ("signature", name)
  hit = m.get(key)
  if hit is None:
    node, i = model.graph.node(name), model.row[name]
    fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)
              if f.name not in ("name", "inputs")}
    inputs = tuple(tuple(model.graph.node(p).out_shape) for p in node.inputs) if node.inputs \
        else ("model input", tuple(model.graph.input_shape))
    rows = model.profile.layers.get(name, {})
    update = 0.0 if model.update_ms is None else float(model.update_ms[i])
    rows = tuple(sorted((b, tuple(v)) for b, v in rows.items()))  # batch -> (fwd, bwd)
    content = ("signature of", _frozen(fields), inputs, rows, float(model.in_bytes[i]),
               float(model.out_bytes[i]), float(model.bn_bytes[i]),
               float(model.grad_bytes[i]), update, float(model.saved_bytes[i]),
               float(model.state_bytes[i]))
    hit = m[key] = m.setdefault(content, i)  # the first layer of its content names it
  return hit


def shardings(model: CostModel, name: str, count: int,
              allowed: tuple[str, ...] | None = None) -> list[Strategy]:
  """sharded.candidates of the layer under the model's planner.sharding (or `allowed`) and
  planner.recompute, PLAIN first, memoised by its signature (read-only)."""
  allowed = tuple(model.options.sharding) if allowed is None else tuple(allowed)
  key = ("candidates", signature(model, name), count, allowed)
  m = memo(model)
  hit = m.get(key)
  if hit is None:
    hit = m[key] = candidates(model.graph.node(name), count, allowed, model.options.recompute)
  return hit


# --- per layer, splitting samples --------------------------------------------------------------


def layer_update_ms(model: CostModel, name: str, share: float = 1.0) -> float:
  """The optimizer update of `share` of a layer's parameters on one device."""
  return 0.0 if model.update_ms is None else float(model.update_ms[model.row[name]]) * share


def layer_time(model: CostModel, name: str, p: Placement,
               sharding: Strategy | tuple | None = None) -> LayerTime:
  """The layer's time on placement p under its strategy (None: PLAIN), as its parts
  (dp_jax/planner/layer_time.py): the one layer time every pricing path reads. Samples split:
  the cost model's tables at a candidate count (the profile elsewhere), its batch-norm
  statistics all-reduces over its devices. A weight split (m, split): compute at the sharded
  shape, the split's activation collectives, the syncs over its data groups
  (dp_jax/planner/sharded.py). Then its state: the optimizer update of the parameters each
  device updates (its split's share; 1/d of it with state optimizer or full), and with state
  full the all-gathers of its parameters before its forward and its backward; recompute: one
  more forward in its backward."""
  s = strategy(sharding)
  m = memo(model)
  key = ("layer time", name if s.plain else signature(model, name), p, s)
  hit = m.get(key)
  if hit is None:
    parts = (_samples_parts(model, name, p) if is_samples(s) else
             _sharded_parts(model, name, p, s))
    hit = m[key] = compose(**_state_parts(model, name, p, s, parts), recompute=s.recompute)
  return hit


def _state_parts(model: CostModel, name: str, p: Placement, s: Strategy, parts: dict) -> dict:
  """A layer's parts under its state over the data axis: the update of 1/d of its share
  (optimizer, full) and, full, its parameters all-gathered before the forward and again before
  the backward (each in the pass that waits for it)."""
  d = s.data_devices(p[1])
  if s.state == "replicated" or d < 2:
    return parts
  share = param_share(model.graph.node(name), s)
  out = {**parts, "update": layer_update_ms(model, name, share / d)}
  if s.state == "full":
    gather = _data_groups(model, float(model.param_bytes[model.row[name]]) * share, p, s.m,
                          _allgather_groups)
    fwd, bwd = parts.get("moves", (0.0, 0.0))
    # recomputing, the backward's forward gathers them and the backward reuses that gather
    out["moves"] = (fwd + gather, bwd + (0.0 if s.recompute else gather))
  return out


def _samples_parts(model: CostModel, name: str, p: Placement) -> dict:
  i, (start, count) = model.row[name], p
  c = column(model, count)
  if c is not None:
    fwd, bwd = model.fwd_ms[i, c], model.bwd_ms[i, c]
  else:
    t = model.profile.lookup(name, model.batch // count)
    fwd, bwd = t.fwd_ms, t.bwd_ms
  b = model.bn_bytes[i]
  sync = float(allreduce_ms(model.cluster, b, start, count)) if b > 0 and count > 1 else 0.0
  return {"forward": float(fwd), "backward": float(bwd), "update": layer_update_ms(model, name),
          "sync": sync}


def _sharded_parts(model: CostModel, name: str, p: Placement, sharding: Strategy) -> dict:
  m = sharding.m
  rows = model.batch // sharding.sample_groups(p[1])  # samples per device
  weights = sharding._replace(state="replicated", recompute=False)  # its split alone
  node = model.graph.node(name)
  t = model.profile.lookup(name, rows)
  whole = _whole_times(model, name, rows)
  part = None
  if whole is not None:  # the sharded shape's cost does not depend on the batch
    key = ("sharded cost", signature(model, name), weights)
    memos = memo(model)
    part = memos.get(key)
    if part is None:
      part = memos[key] = sharded_cost(model.graph, node, weights, whole[0],
                                       model.profile.dtype)
  ratios = compute_ratios(model.graph, node, weights, rows, model.profile.device,
                          model.profile.dtype, whole, part, model.profile.source)
  share = param_share(node, weights)
  sync = _data_groups(model, model.bn_bytes[model.row[name]] * share, p, m, group_collective_ms)
  return {"forward": t.fwd_ms, "backward": t.bwd_ms,
          "update": layer_update_ms(model, name, share), "sync": sync,
          "moves": activation_ms(model, name, p, weights), "ratios": ratios}


def layer_ms(model: CostModel, name: str, p: Placement,
             sharding: Strategy | None = None) -> tuple[float, float]:
  """(the layer's whole time in a step, its backward part) on placement p (layer_time)."""
  t = layer_time(model, name, p, sharding)
  return float(t.total), float(t.backward_total)


def band_ms(model: CostModel, name: str, p: Placement,
            sharding: Strategy | tuple | None = None) -> float:
  """Bandwidth part of a layer's weight-gradient sync on placement p, in the stage's combined
  sync (its latency is the stage's): an all-reduce over the layer's devices, or under a weight
  split over its data groups (sharded_band_ms); state optimizer: a reduce-scatter of the
  gradients and an all-gather of the updated parameters; state full: the reduce-scatter alone
  (its parameters are gathered in its forward and backward: layer_time)."""
  s = strategy(sharding)
  if s.plain:
    return float(allreduce_volume_ms(model.cluster, model.grad_bytes[model.row[name]], *p))
  key = ("band", signature(model, name), p, s)
  m = memo(model)
  hit = m.get(key)
  if hit is None:
    hit = m[key] = sharded_band_ms(model, name, p, s)
  return hit


# --- per layer under a weight sharding (the model: dp_jax/planner/sharded.py) -------------------


def _model_groups(model: CostModel, fn, nbytes, start: int, d: int, m: int) -> float:
  """sharded.model_groups, memoised (layers of one size share their collectives)."""
  key = ("model groups", fn, float(nbytes), start, d, m)
  memos = memo(model)
  hit = memos.get(key)
  if hit is None:
    hit = memos[key] = model_groups(fn, model.cluster, nbytes, start, d, m)
  return hit


def _data_groups(model: CostModel, nbytes, p: Placement, m: int, collective) -> float:
  """sharded.data_groups, memoised."""
  key = ("data groups", collective, float(nbytes), p, m)
  memos = memo(model)
  hit = memos.get(key)
  if hit is None:
    hit = memos[key] = data_groups(model.cluster, nbytes, p, m, collective)
  return hit


def _whole_times(model: CostModel, name: str, batch: int):
  """sharded.whole_times of a layer, memoised by its signature."""
  key = ("whole times", signature(model, name), batch)
  memos = memo(model)
  hit = memos.get(key)
  if hit is None:
    hit = memos[key] = whole_times(model.graph, model.graph.node(name), batch,
                                   model.profile.device, model.profile.dtype,
                                   model.profile.source)
  return hit


def activation_ms(model: CostModel, name: str, p: Placement, sharding: Strategy
                  ) -> tuple[float, float]:
  """(forward, backward) ms of the entry gather and the split's activation collectives
  (experts: the dispatch and combine all-to-alls, twice each way)."""
  start, count = p
  sharding = strategy(sharding)
  m, split = sharding.m, sharding.split
  d = count // m
  i = model.row[name]
  node = model.graph.node(name)

  def groups(fn, nbytes):
    return _model_groups(model, fn, nbytes, start, d, m)

  if split == "experts":
    a = node.attrs
    slots = a.get("n_expert", 0) * a.get("capacity", 0) / max(a.get("seq_len", 1), 1)
    buffer = model.batch // count * model.out_bytes[i] * slots  # E x C x D per sequence
    each = groups(alltoall_ms, buffer)
    return 2 * each, 2 * each
  rows = model.batch // d
  x, y = rows * model.in_bytes[i], rows * model.out_bytes[i]
  gather = groups(allgather_ms, x)
  first = not node.inputs  # no input gradient
  pairs = 2 if node.kind == "transformer_block" else 1  # Megatron pairs of a heads split
  if split == "out":
    fwd = groups(allgather_ms, y)
    bwd = 0.0 if first else groups(allreduce_ms, x)
  elif split == "in":
    fwd = groups(allreduce_ms, y)
    bwd = 0.0 if first else groups(allgather_ms, x)
  else:  # heads
    fwd = pairs * groups(allreduce_ms, y)
    bwd = 0.0 if first else pairs * groups(allreduce_ms, x)
  return gather + fwd, bwd


def grad_bytes(model: CostModel, name: str, sharding: Strategy | tuple | None) -> float:
  """Gradient bytes one device sends in its stage's sync for the layer (its split's share)."""
  return float(model.grad_bytes[model.row[name]]) * param_share(model.graph.node(name),
                                                                strategy(sharding))


def sharded_band_ms(model: CostModel, name: str, p: Placement, sharding: Strategy) -> float:
  """Bandwidth part of the layer's weight-gradient sync over its data groups (d devices, stride
  m; the samples split's are its range), by its state (band_ms). Experts: the routed experts'
  share over the data groups, the replicated rest (shared experts) over all its devices."""
  s = strategy(sharding)
  i, node = model.row[name], model.graph.node(name)
  share = param_share(node, s)
  grads = float(model.grad_bytes[i])
  routed = sharded.split_fraction(node, s.split) if s.split == "experts" else None
  if routed is not None:  # shared experts: their gradients differ over the model axis too
    mine, everywhere = grads * routed / s.m, grads * (1.0 - routed)
  else:
    mine, everywhere = grads * share, 0.0
  factor = 1.0 if s.state != "replicated" and s.data_devices(p[1]) > 1 else 2.0
  out = _data_groups(model, mine, p, s.m, _volume(factor))
  if everywhere > 0:
    out += float(allreduce_volume_ms(model.cluster, everywhere, *p)) * factor / 2.0
  if s.state == "optimizer" and s.data_devices(p[1]) > 1:  # the updated parameters gathered
    out += _data_groups(model, float(model.param_bytes[i]) * share, p, s.m, _volume(1.0))
  return out


def _volume(factor: float):
  """strided_volume_ms with `factor` (2: all-reduce; 1: reduce-scatter or all-gather), one
  function per factor (the memo keys on it)."""
  return _VOLUMES[factor]


_VOLUMES = {f: functools.partial(strided_volume_ms, factor=f) for f in (1.0, 2.0)}
_allgather_groups = functools.partial(group_collective_ms, factor=1.0)


# --- stages and moves ---------------------------------------------------------------------------


def stage_overhead_ms(model: CostModel, first: str, last: str, count: int) -> float:
  """The per-stage terms of a stage from layer `first` to layer `last` on `count` devices."""
  c = int(np.searchsorted(model.counts, count))
  ms = 0.0 if model.stage_ms is None else float(model.stage_ms[c])
  if model.enter_ms is not None:
    ms += float(model.enter_ms[model.row[first], c])
  if model.leave_ms is not None:
    ms += float(model.leave_ms[model.row[last], c])
  return ms


def stage_cost(model: CostModel, layers: tuple[str, ...], p: Placement,
               shardings: Mapping[str, Strategy] | None = None) -> tuple[float, float]:
  """(compute ms, exposed all-reduce ms) of one stage: `layers` in forward order on p
  (`shardings`: the weight-sharded ones; the latency is the range's, once)."""
  shards = tuple((shardings or {}).get(n) for n in layers)
  key = ("stage", layers, p, shards)
  m = memo(model)
  hit = m.get(key)
  if hit is None:
    start, count = p
    band = [band_ms(model, n, p, s) for n, s in zip(layers, shards, strict=True)]
    bwd = [layer_ms(model, n, p, s)[1] for n, s in zip(layers, shards, strict=True)]
    compute = float(sum(layer_ms(model, n, p, s)[0] for n, s in zip(layers, shards, strict=True)))
    sync = stage_sync_ms(band, bwd, float(collective_latency_ms(model.cluster, start, count)),
                         model.options.overlap_allreduce)
    hit = m[key] = (compute, float(sync))
  return hit


def move_cost(model: CostModel, src: str, a: Placement, b: Placement) -> tuple[float, int]:
  """(fwd + bwd ms, devices taking part) of moving `src`'s output from layout a to b."""
  key = ("move", src, a, b)
  m = memo(model)
  hit = m.get(key)
  if hit is None:
    ms = float(move_ms(model.cluster, model.batch, model.out_bytes[model.row[src]], *a, *b))
    hit = m[key] = (ms, int(devices_in_move(*a, *b)))
  return hit
