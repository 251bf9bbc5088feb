"""Burst-parallel search: dynamic programming over the series-parallel decomposition.

The objective is exactly evaluate() (dp_jax/planner/evaluate.py) over this plan space:
- every chain lives on a prefix [0, count) of the job's devices, one count per layer;
- a fork/join block is either merged into a stage (fork, branches and join on one count),
  serialized (each branch a chain of its own on prefixes, branches one after another), or
  concurrent (each non-identity branch on its own contiguous lane [s, s + count), lanes side
  by side in branch order, sum of lanes <= G, every layer of a branch on its lane).

Chain DP. V[k][f, g]: least cost of the chain up to node item k, given the enclosing fork
runs on count f and node k on count g. A stage is a run of items i..k on one count g, so
V[k][:, g] = min over run starts i of Vin[i][:, g] + run(i..k, g), where Vin[i] prices
everything before i (the move into i, or the block that i joins). Runs may be cut where
evaluate() would not cut them; that never helps (latency is paid once, exposure is
sub-additive), so the minimum is evaluate()'s optimum. Cost O(items^2 C + items C^3) per
chain with C candidate counts.

Weight sharding (planner.sharding with weights): the prefix tables (compute, bwd,
prefix_band, prefix_params) hold, per (layer, count), one sharding chosen by a rule
(choose_sharding), so the DP above is unchanged and exact given that choice; lanes split
samples. make.plan_for_limit runs one search per rule and keeps the faster plan.

Block DP. A block's cost is a matrix over (fork count, join count): serialized sums the
branch chains (each solved once with its fork context); concurrent runs a min-max DP over
lanes whose state is the devices used so far (0..G): O(branches G C^3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dp_jax.cluster import class_bus_GBps, class_latency_ms, link_class, volume_ms
from dp_jax.graph import Chain, Parallel
from dp_jax.planner.costs import (
  CostModel,
  Placement,
  batch_norm_ms,
  move_from_parts,
  move_parts,
)
from dp_jax.planner.sharded import candidates, syncs
from dp_jax.planner.structure import first_layer, flat_layers, last_layer

# Single-input elementwise layers: XLA fuses them into their producer (DeepPool's ReLUs run in
# place), so the search never changes device count (or devices) into one of them.
ELEMENTWISE_KINDS = frozenset({"relu", "gelu", "tanh", "sigmoid", "dropout"})

INF = np.inf


@dataclass
class _Tables:
  """Arrays the DP reads, over layers (rows) and candidate counts (columns)."""

  model: CostModel
  counts: np.ndarray
  budget: int
  allowed: np.ndarray
  compute: np.ndarray  # (L, C) fwd + bwd on the prefix [0, count) (batch-norm syncs included)
  bwd: np.ndarray  # (L, C)
  compute_k: np.ndarray  # (K, L, C) the same per link class (lanes)
  bwd_k: np.ndarray  # (K, L, C)
  band: np.ndarray  # (K, L, C) all-reduce bandwidth term per link class (cluster.link_class)
  lat: np.ndarray  # (K, C) all-reduce latency term per link class
  link0: np.ndarray  # (C,) link class of prefix [0, count)
  has_params: np.ndarray
  prefix_band: np.ndarray | None = None  # (L, C) all-reduce bandwidth on the prefix [0, count)
  prefix_params: np.ndarray | None = None  # (L, C) bool: the layer all-reduces gradients there
  shardings: dict = field(default_factory=dict)  # (row, column) -> weight sharding on the prefix
  chained: set = field(default_factory=set)  # layers the last reconstruction placed on prefixes
  edges: dict = field(default_factory=dict)
  lanes: tuple | None = None

  def edge(self, src_row: int) -> np.ndarray:
    """(C, C) move cost from a layer on prefix count a to one on prefix count b."""
    hit = self.edges.get(src_row)
    if hit is None:
      if "prefix" not in self.edges:
        k = self.counts
        self.edges["prefix"] = move_parts(self.model.cluster, self.model.batch, 0, k[:, None], 0,
                                          k[None, :])
      hit = self.edges[src_row] = move_from_parts(self.edges["prefix"],
                                                  self.model.out_bytes[src_row])
    return hit

  def lane_moves(self):
    """Move parts into and out of every lane [s, s + count): [s, c, fork or join count]."""
    if self.lanes is None:
      k, b, cl = self.counts, self.model.batch, self.model.cluster
      s = np.arange(self.budget + 1)[:, None, None]
      self.lanes = (move_parts(cl, b, 0, k[None, None, :], s, k[None, :, None]),
                    move_parts(cl, b, s, k[None, :, None], 0, k[None, None, :]))
    return self.lanes


SHARDING_RULES = ("samples", "dominant", "cheapest")  # samples: no weight sharding


def build_tables(model: CostModel, allowed: np.ndarray, penalty_ms: np.ndarray | None = None,
                 rule: str = "samples"):
  """Tables for one search; `penalty_ms` (L, C) is added to compute (memory repair only).

  With planner.sharding including weights, each (layer, count) on the prefix [0, count) takes
  one sharding by `rule` (choose_sharding; "samples": none); lanes split samples.
  """
  k = model.counts
  cl = model.cluster
  band = np.stack([volume_ms(model.grad_bytes[:, None], k[None, :], bw)
                   for bw in class_bus_GBps(cl)])
  lat = class_latency_ms(cl, k)
  bn = batch_norm_ms(model)
  compute_k = model.compute_ms[None] + 2 * bn
  bwd_k = model.bwd_ms[None] + bn
  link0 = link_class(cl, 0, k)
  cols = np.arange(len(k))
  compute, bwd = compute_k[link0, :, cols].T, bwd_k[link0, :, cols].T
  prefix_band = band[link0, :, cols].T
  prefix_params = np.repeat((model.grad_bytes > 0)[:, None], len(k), axis=1)
  shardings = {}
  if rule not in SHARDING_RULES:
    raise ValueError(f"unknown sharding rule {rule!r}")
  if "weights" in model.options.sharding and rule != "samples":
    for r, name in enumerate(model.names):
      node = model.graph.node(name)
      for c, g in enumerate(k):
        cands = candidates(node, int(g), model.options.sharding)[1:]
        if not cands:
          continue
        pick = choose_sharding(model, name, int(g), cands,
                               (compute[r, c], bwd[r, c], prefix_band[r, c]), rule)
        if pick is not None:
          sh, (total, back, sent) = pick
          shardings[(r, c)] = sh
          compute[r, c], bwd[r, c], prefix_band[r, c] = total, back, sent
          prefix_params[r, c] = syncs(model, name, int(g), sh)
  if penalty_ms is not None:
    compute_k = compute_k + penalty_ms[None]
    compute = compute + penalty_ms
  return _Tables(model=model, counts=k, budget=model.options.num_devices, allowed=allowed,
                 compute=compute, bwd=bwd, compute_k=compute_k, bwd_k=bwd_k, band=band,
                 lat=lat, link0=link0, has_params=model.grad_bytes > 0, prefix_band=prefix_band,
                 prefix_params=prefix_params, shardings=shardings)


def choose_sharding(model: CostModel, name: str, count: int, cands: list, samples: tuple,
                    rule: str = "samples"):
  """A weight sharding of a layer on the prefix [0, count) (samples = its (fwd + bwd, bwd,
  all-reduce bandwidth) there), or None for samples.

  A stage's cost is sum(compute) + latency + max over layers l of (bandwidth of layers <= l)
  - (backward of layers < l) with overlap (else + sum(bandwidth)). rule "dominant": only a
  sharding that costs no more than samples in every stage it can sit in (its compute, compute
  + bandwidth and, with overlap, compute + bandwidth - backward all no larger; it never syncs
  more). rule "cheapest": any sharding with no larger compute + bandwidth (the stage cost
  without overlap). Either way the least compute + bandwidth (then compute) wins.
  """
  overlap = model.options.overlap_allreduce and rule == "dominant"
  c0, b0, a0 = samples
  slack = 1e-9 * (1.0 + c0 + a0)
  best = None
  for sh in cands:
    total, back = model.layer_ms(name, (0, count), sh)
    sent = model.band_ms(name, (0, count), sh)
    keys = [total + sent - c0 - a0]
    if overlap:
      keys += [total - c0, total + sent - back - (c0 + a0 - b0)]
    if max(keys) > slack:
      continue
    rank = (total + sent, total)
    if best is None or rank < best[0]:
      best = (rank, sh, (total, back, sent))
  return None if best is None else (best[1], best[2])


def chain_shardings(t: _Tables, assignment: dict) -> dict:
  """Weight shardings of the layers the last reconstruction placed on prefixes (layer ->
  (m, split)); the others split samples."""
  out = {}
  for name in t.chained:
    start, count = assignment[name]
    c = int(np.searchsorted(t.counts, count))
    sh = t.shardings.get((t.model.row[name], c))
    if start == 0 and sh is not None:
      out[name] = sh
  return out


def _run_sync(t: _Tables, rows: np.ndarray, kind: int) -> np.ndarray:
  """(C,) exposed all-reduce time of one stage holding `rows` (forward order), per count, on a
  range of link class `kind`."""
  band, lat, bwd = t.band[kind][rows], t.lat[kind], t.bwd_k[kind][rows]
  if t.model.options.overlap_allreduce:
    sent = np.cumsum(band, axis=0)
    hidden = np.cumsum(bwd, axis=0) - bwd
    exposed = (sent - hidden).max(axis=0)
  else:
    exposed = band.sum(axis=0)
  return np.where(t.has_params[rows].any(), lat + exposed, 0.0)


# --- chains ----------------------------------------------------------------------------------


@dataclass
class _ChainSol:
  chain: Chain
  spans: list
  flat: np.ndarray
  value: dict = field(default_factory=dict)  # node item -> (F, C)
  arg_start: dict = field(default_factory=dict)  # node item -> (F, C) run start item
  arg_in: dict = field(default_factory=dict)  # node item -> (F, C) previous count / fork count
  blocks: dict = field(default_factory=dict)  # block item -> _BlockSol
  exit: np.ndarray | None = None  # (F, C) cost through the move into the join, per join count
  arg_exit: np.ndarray | None = None


def _minplus(v: np.ndarray, m: np.ndarray):
  total = v[:, :, None] + m[None, :, :]
  arg = total.argmin(axis=1)
  return np.take_along_axis(total, arg[:, None, :], axis=1)[:, 0, :], arg


def _flatten_chain(t: _Tables, chain: Chain):
  spans, flat = [], []
  for item in chain.items:
    names = [item] if isinstance(item, str) else list(flat_layers(item))
    spans.append((len(flat), len(flat) + len(names)))
    flat.extend(t.model.row[n] for n in names)
  return spans, np.array(flat, dtype=np.int64)


def _solve_chain(t: _Tables, chain: Chain, enter: np.ndarray) -> _ChainSol:
  """Chain DP; `enter[f, g]` prices reaching the first layer on count g from fork count f."""
  spans, flat = _flatten_chain(t, chain)
  sol = _ChainSol(chain, spans, flat)
  cols = np.arange(len(t.counts))
  band = t.prefix_band[flat]
  bwd = t.bwd[flat]
  zeros = np.zeros((1, len(cols)))
  cum_comp = np.vstack([zeros, np.cumsum(t.compute[flat], axis=0)])
  cum_a = np.vstack([zeros, np.cumsum(band, axis=0)])
  cum_b = np.vstack([zeros, np.cumsum(bwd, axis=0)])
  cum_bad = np.vstack([zeros, np.cumsum(~t.allowed[flat], axis=0)])
  cum_p = np.vstack([zeros, np.cumsum(t.prefix_params[flat], axis=0)])
  reach = cum_a[1:] - cum_b[:-1]  # sent through l minus backward hidden before l
  lat = t.lat[t.link0, cols]
  overlap = t.model.options.overlap_allreduce
  nodes = [k for k, it in enumerate(chain.items) if isinstance(it, str)]
  position = {k: i for i, k in enumerate(nodes)}
  vin = np.empty((len(nodes), enter.shape[0], len(cols)))
  starts = np.array([spans[k][0] for k in nodes], dtype=np.int64)
  no_start = np.array([k > 0 and isinstance(chain.items[k - 1], str)
                       and _elementwise(t, chain.items[k]) for k in nodes], dtype=bool)
  node_ids = np.array(nodes, dtype=np.int64)
  items = chain.items
  for k, item in enumerate(items):
    if isinstance(item, Parallel):
      sol.blocks[k] = _solve_block(t, item)
      continue
    i = position[k]
    if k == 0:
      vin[i], sol.arg_in[k] = enter, np.zeros(enter.shape, dtype=np.int64)
    elif isinstance(items[k - 1], str):
      vin[i], sol.arg_in[k] = _minplus(sol.value[k - 1], t.edge(t.model.row[items[k - 1]]))
    else:
      vin[i], sol.arg_in[k] = _minplus(sol.value[k - 2], sol.blocks[k - 1].cost)
    e, s = spans[k][1], starts[: i + 1]
    if overlap:
      suffix = np.maximum.accumulate(reach[:e][::-1], axis=0)[::-1]
      exposed = suffix[s] - (cum_a[s] - cum_b[s])
    else:
      exposed = cum_a[e] - cum_a[s]
    sync = np.where((cum_p[e] - cum_p[s]) > 0, lat[None, :] + exposed, 0.0)
    run = cum_comp[e] - cum_comp[s] + sync
    run[(cum_bad[e] - cum_bad[s]) > 0] = INF
    run[no_start[: i + 1]] = INF  # an elementwise layer stays on its producer's devices
    total = vin[: i + 1] + run[:, None, :]
    best = total.argmin(axis=0)
    sol.value[k] = np.take_along_axis(total, best[None], axis=0)[0]
    sol.arg_start[k] = node_ids[best]
  return sol


def _close_branch(t: _Tables, sol: _ChainSol) -> None:
  last = len(sol.chain.items) - 1
  sol.exit, sol.arg_exit = _minplus(sol.value[last], t.edge(t.model.row[last_layer(sol.chain)]))


# --- blocks ----------------------------------------------------------------------------------


@dataclass
class _Lane:
  rows: np.ndarray
  names: tuple
  first_bytes: float  # bytes per sample the fork sends into the branch
  last_bytes: float  # bytes per sample the branch's last layer sends to the join
  fwd: np.ndarray  # (K, C): the whole branch as one stage, forward, per link class and count
  bwd: np.ndarray  # (K, C): its backward plus exposed all-reduce, per link class and count


@dataclass
class _BlockSol:
  block: Parallel
  cost: np.ndarray  # (C, C) fork count x join count
  concurrent: np.ndarray  # (C, C) bool: lanes chosen
  branches: list  # _ChainSol per non-identity branch (serialized mode)
  lanes: list


def _lane(t: _Tables, branch: Chain, fork_row: int) -> _Lane:
  names = tuple(flat_layers(branch))
  rows = np.array([t.model.row[n] for n in names], dtype=np.int64)
  bwd = t.bwd_k[:, rows].sum(axis=1)  # (K, C)
  fwd = t.compute_k[:, rows].sum(axis=1) - bwd
  back = np.stack([bwd[kind] + _run_sync(t, rows, kind) for kind in range(len(t.band))])
  bad = ~t.allowed[rows].all(axis=0)
  fwd[:, bad] = INF
  back[:, bad] = INF
  return _Lane(rows, names, float(t.model.out_bytes[fork_row]),
               float(t.model.out_bytes[t.model.row[last_layer(branch)]]), fwd, back)


def _elementwise(t: _Tables, name: str) -> bool:
  return t.model.graph.node(name).kind in ELEMENTWISE_KINDS


def _solve_block(t: _Tables, block: Parallel) -> _BlockSol:
  fork_row = t.model.row[block.fork]
  enter = t.edge(fork_row)
  same = np.where(np.eye(len(t.counts), dtype=bool), enter, INF)
  identities = sum(1 for b in block.branches if not b.items)
  serial = identities * enter
  sols, lanes = [], []
  pinned = False  # a branch opens with an elementwise layer: it stays on the fork's devices
  for branch in block.branches:
    if branch.items:
      first_elementwise = _elementwise(t, first_layer(branch))
      pinned |= first_elementwise
      sol = _solve_chain(t, branch, same if first_elementwise else enter)
      _close_branch(t, sol)
      sols.append(sol)
      serial = serial + sol.exit
      lanes.append(_lane(t, branch, fork_row))
  if len(lanes) >= 2 and not pinned:
    every = np.arange(len(t.counts))
    # lanes only matter where they beat serial (a hair of slack against rounding)
    bound = (serial - identities * enter) * (1 + 1e-9) + 1e-12
    concurrent = _lane_dp(t, lanes, every, every, bound=bound)[0] + identities * enter
  else:
    concurrent = np.full(serial.shape, INF)
  chosen = concurrent < serial
  return _BlockSol(block, np.where(chosen, concurrent, serial), chosen, sols, lanes)


def _lane_dp(t: _Tables, lanes: list, fsel: np.ndarray, jsel: np.ndarray, track: bool = False,
             bound: np.ndarray | None = None):
  """Lane layouts priced as evaluate() prices a block, per (fork count, join count).

  A layout costs (sum of the fork's sends and the join's receives) + max over lanes of
  their forward + max over lanes of their backward (evaluate()'s block). Lanes are placed in
  branch order; the state is the devices used so far, and for each state the partial layout
  with the least partial cost is kept (partial costs only grow as lanes are added; exact for
  two lanes, a heuristic for more). Partial layouts already at or above `bound` are dropped
  (the caller keeps the other mode there). With track (one fork and one join count), also
  returns each lane's (start, count).
  """
  k, budget = t.counts, t.budget
  moves_in, moves_out = t.lane_moves()
  shifts = np.array([0], dtype=np.int64)
  shape = (len(fsel), len(jsel))
  state = [np.zeros((1, *shape)) for _ in range(3)]  # moves, forward max, backward max
  best = np.full(shape, INF)
  best_at, history = (-1, -1), []
  for li, lane in enumerate(lanes):
    last = li == len(lanes) - 1
    later = len(lanes) - 1 - li  # every later lane needs at least one device
    if not last:
      table = [np.full((budget + 1, *shape), INF) for _ in range(4)]  # total, moves, fwd, bwd
      from_s = np.full(budget + 1, -1, dtype=np.int64)
      from_c = np.full(budget + 1, -1, dtype=np.int64)
    for c in range(len(k)):
      if not np.isfinite(lane.fwd[:, c]).any():
        continue
      n = int(np.searchsorted(shifts, budget - k[c] - later, side="right"))
      if not n:
        continue
      s = shifts[:n]  # shifts ascend, so the lanes that fit are a prefix
      into = move_from_parts([x[s, c][:, fsel] for x in moves_in], lane.first_bytes)
      out = move_from_parts([x[s, c][:, jsel] for x in moves_out], lane.last_bytes)
      sends = state[0][:n] + into[:, :, None] + out[:, None, :]
      cls = link_class(t.model.cluster, s, k[c])
      fwd = np.maximum(state[1][:n], lane.fwd[cls, c][:, None, None])
      back = lane.bwd[cls, c][:, None, None]
      bwd = np.maximum(state[2][:n], back)
      cand = sends + fwd + bwd
      if last:
        low = cand.min(axis=0)
        if track and low[0, 0] < best[0, 0]:
          best_at = (int(s[cand[:, 0, 0].argmin()]), c)
        np.minimum(best, low, out=best)
      else:
        target = s + k[c]
        better = cand < table[0][target]
        if track:
          pick = better[:, 0, 0]
          from_s[target[pick]], from_c[target[pick]] = s[pick], c
        for tab, new in zip(table, (cand, sends, fwd, bwd), strict=True):
          tab[target] = np.where(better, new, tab[target])
    if not last:
      if bound is not None:
        table[0][table[0] >= bound] = INF
      shifts = np.flatnonzero(np.isfinite(table[0]).any(axis=(1, 2)))
      state = [tab[shifts] for tab in table[1:]]
      history.append((from_s, from_c))
      if not len(shifts):
        break
  if not track:
    return best, None
  if not np.isfinite(best[0, 0]):
    return best, None
  layout = [best_at]
  at = best_at[0]
  for from_s, from_c in reversed(history):
    layout.append((int(from_s[at]), int(from_c[at])))
    at = layout[-1][0]
  return best, layout[::-1]


# --- reconstruction --------------------------------------------------------------------------


def _place_chain(t: _Tables, sol: _ChainSol, f: int, g: int, out: dict) -> None:
  """Write the placements of the best plan of `sol` for fork count f and last count g."""
  items, k = sol.chain.items, len(sol.chain.items) - 1
  while True:
    i = int(sol.arg_start[k][f, g])
    for r in sol.flat[sol.spans[i][0]: sol.spans[k][1]]:
      out[t.model.names[r]] = (0, int(t.counts[g]))
      t.chained.add(t.model.names[r])
    if i == 0:
      return
    prev = int(sol.arg_in[i][f, g])
    if isinstance(items[i - 1], Parallel):
      _place_block(t, sol.blocks[i - 1], prev, g, out)
      k, g = i - 2, prev
    else:
      k, g = i - 1, prev


def _place_block(t: _Tables, bs: _BlockSol, f: int, j: int, out: dict) -> None:
  if bs.concurrent[f, j]:
    _, layout = _lane_dp(t, bs.lanes, np.array([f]), np.array([j]), track=True)
    for lane, (start, c) in zip(bs.lanes, layout, strict=True):
      for name in lane.names:
        out[name] = (start, int(t.counts[c]))
    return
  for sol in bs.branches:
    _place_chain(t, sol, f, int(sol.arg_exit[f, j]), out)


def search(t: _Tables) -> tuple[dict[str, Placement], float]:
  """The least-cost assignment of the whole graph and its cost (ms per iteration)."""
  top = t.model.graph.decompose()
  sol = _solve_chain(t, top, np.zeros((1, len(t.counts))))
  final = sol.value[len(top.items) - 1][0]
  g = int(final.argmin())
  out: dict[str, Placement] = {}
  t.chained.clear()
  if np.isfinite(final[g]):
    _place_chain(t, sol, 0, g, out)
  return out, float(final[g])

