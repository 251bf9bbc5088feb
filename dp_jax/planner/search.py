"""Burst-parallel search: dynamic programming over the series-parallel decomposition.

The objective is exactly evaluate() (dp_jax/planner/evaluate.py) over this plan space:
- every chain lives on a prefix [0, count) of the job's devices, one count per layer;
- a fork/join block is either merged into a stage (fork, branches and join on one count),
  serialized (each branch a chain of its own on prefixes, branches one after another), or
  concurrent: the non-identity branches are split into groups, each group on its own
  contiguous lane [s, s + count) with its branches one after another at that count, lanes
  disjoint and anywhere in [0, G) in any order (one group on one lane is allowed too); in
  the exact tier (below) a group of one short branch may also change device count inside its
  lane, its layers on any ranges within the lane [lo, hi) they span, and with weight sharding
  each of its layers may take any sharding offered on its count.

Chain DP. V[k][f, g]: least cost of the chain up to node item k, given the enclosing fork
runs on count f and node k on count g. A stage is a run of items i..k on one count g, so
V[k][:, g] = min over run starts i of Vin[i][:, g] + run(i..k, g), where Vin[i] prices
everything before i (the move into i, or the block that i joins). Runs may be cut where
evaluate() would not cut them; that never helps (latency is paid once, exposure is
sub-additive), so the minimum is evaluate()'s optimum. Cost O(items^2 C + items C^3) per
chain with C candidate counts.

Weight sharding (planner.sharding with weights, rule "exact"): each (layer, count) on the
prefix offers samples and its undominated weight shardings (stage_choice), and a stage takes
the best combination exactly: a run's cost is the least of a no-sync stage (every layer on an
option that all-reduces nothing, no latency: cumulative sums) and a sync stage (latency once;
without overlap cumulative sums of compute + bandwidth; with overlap the open-stage states
(P, Q) of stage_choice, whose Pareto frontier per (fork count, count) is carried from layer to
layer, new stages entering it at every node item). So the chain DP is exact over placements
on prefixes and per-layer shardings jointly (tests/test_planner_sharding_brute.py checks it by
brute force). In a concurrent block, a lane that holds one short branch (at most
SHARDED_LAYOUTS per-layer (range, sharding) combinations) enumerates them exactly (_options),
priced by the cost model's stages as evaluate() prices them; lanes that hold several branches,
and longer branches, split samples. make.plan_for_limit also runs the samples-only search and
keeps the faster plan that fits.

Block DP. A block's cost is a matrix over (fork count, join count): serialized sums the
branch chains (each solved once with its fork context); concurrent runs the lane search
(_lane_dp), whose state is (branches placed, end of the last lane) and whose tier depends on
the block's size alone (n non-identity branches, C counts, G devices; cells = C^3 (G + 1)):
- exact: ((3^n - 2^n) x cells + option steps) x (candidate maxima)^2 <= EXACT_CELLS: for
  every pair of candidate forward / backward maxima the least moves with every lane within
  them; exact over the concurrent space above (every block of <= 3 branches at G = 4 in
  practice).
  Branches that are plain chains with at most OPTION_LAYOUTS layouts (placements^layers)
  also get every count-changing layout inside a lane (with weight sharding: every layout and
  per-layer sharding, at most SHARDED_LAYOUTS, else samples only), less those another layout
  beats on every term (forward, backward, each send and receive) within a hull no wider;
- groups: (3^n - 2^n) x cells <= GROUP_CELLS: the same space less count changes inside
  lanes, keeping per state the partial layout of least partial cost (exact for one lane, a
  heuristic for more);
- packed (larger blocks, e.g. every block at G >= 64): one lane per branch packed from
  device 0 in branch order (the search before groups), exact for two lanes, a heuristic
  beyond. Cost O(branches G C^3).

Outside the space (evaluate() accepts them, the search never returns them): chains, forks and
joins off the prefix [0, count); outside the exact tier, a branch that changes device count
(or takes weight shardings) while another group runs beside it; weight shardings in a lane
holding several branches; a group of several branches on different ranges; lanes that
interleave (one branch's layers on both sides of another's). No bound on what these cost is
proven; tests/test_planner_forkjoin.py (samples) and tests/test_planner_sharding_brute.py
(weights) measure it by brute force over every assignment evaluate() accepts on random
fork/join graphs at G = 4 and assert their margins there.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from dp_jax.cluster import class_bus_GBps, class_latency_ms, link_class, volume_ms
from dp_jax.graph import Chain, Parallel
from dp_jax.planner import stage_choice
from dp_jax.planner.costs import (
  CostModel,
  Placement,
  batch_norm_ms,
  move_from_parts,
  move_parts,
)
from dp_jax.planner.sharded import candidates
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
  options: stage_choice.Options | None = None  # weight shardings on the prefix (rule "exact")
  offers: dict | None = None  # (row, column) -> offered weight shardings (None: where allowed)
  chained: dict = field(default_factory=dict)  # layer -> sharding (None: samples) of the layers
  # the last reconstruction placed on prefixes
  laned: dict = field(default_factory=dict)  # the same for layers it placed in concurrent lanes
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


SHARDING_RULES = ("samples", "exact")  # samples: no weight sharding


def build_tables(model: CostModel, allowed: np.ndarray, penalty_ms: np.ndarray | None = None,
                 rule: str = "samples", offers: dict | None = None):
  """Tables for one search; `penalty_ms` (L, C) is added to compute (memory repair only).

  With planner.sharding including weights and rule "exact", every (layer, count) on the
  prefix [0, count) offers its undominated weight shardings (stage_choice) and the chain DP
  picks them per stage exactly; lanes split samples. `allowed` masks samples; `offers`
  ((row, column) -> weight shardings) limits the shardings (None: every one where samples is
  allowed), and a prefix cell with only shardings is placeable.
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
  if rule not in SHARDING_RULES:
    raise ValueError(f"unknown sharding rule {rule!r}")
  options = None
  if "weights" in model.options.sharding and rule == "exact":
    options = stage_choice.build(model, compute, bwd, prefix_band, allowed, offers)
  if penalty_ms is not None:
    compute_k = compute_k + penalty_ms[None]
    compute = compute + penalty_ms
    if options is not None:
      stage_choice.add_compute(options, penalty_ms)
  return _Tables(model=model, counts=k, budget=model.options.num_devices, allowed=allowed,
                 compute=compute, bwd=bwd, compute_k=compute_k, bwd_k=bwd_k, band=band,
                 lat=lat, link0=link0, has_params=model.grad_bytes > 0, prefix_band=prefix_band,
                 prefix_params=prefix_params, options=options,
                 offers=offers if options is not None else None)


def chain_shardings(t: _Tables, assignment: dict) -> dict:
  """Weight shardings of the layers the last reconstruction placed (layer -> (m, split)): on
  prefixes, or in concurrent lanes; the others split samples."""
  out = {name: sh for name, sh in t.chained.items()
         if sh is not None and assignment[name][0] == 0}
  out.update((name, sh) for name, sh in t.laned.items() if sh is not None)
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
  kind: dict = field(default_factory=dict)  # node item -> (F, C) which stage ends there (RUN_*)
  state: dict = field(default_factory=dict)  # node item -> (F, C) its open-stage state (RUN_OPEN)
  back: dict = field(default_factory=dict)  # flat position -> (sources, start slot)


# How the stage that ends at a node item was priced (weight sharding, stage_choice):
RUN_SAMPLES, RUN_FREE, RUN_PAID, RUN_OPEN = 0, 1, 2, 3


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
  placeable = t.allowed if t.options is None else np.isfinite(t.options.paid)
  cum_bad = np.vstack([zeros, np.cumsum(~placeable[flat], axis=0)])
  cum_p = np.vstack([zeros, np.cumsum(t.prefix_params[flat], axis=0)])
  reach = cum_a[1:] - cum_b[:-1]  # sent through l minus backward hidden before l
  lat = t.lat[t.link0, cols]
  overlap = t.model.options.overlap_allreduce
  opts = t.options
  if opts is not None:  # weight shardings: separable stages by cumulative sums (stage_choice)
    free = opts.free[flat]
    cum_free = np.vstack([zeros, np.cumsum(np.where(np.isfinite(free), free, 0.0), axis=0)])
    cum_none = np.vstack([zeros, np.cumsum(~np.isfinite(free), axis=0)])
    paid = opts.paid[flat]  # infinite where masked (cum_bad)
    cum_paid = np.vstack([zeros, np.cumsum(np.where(np.isfinite(paid), paid, 0.0), axis=0)])
  front = None  # open sync stages with overlap (stage_choice): (P, Q), (S, F, C) each
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
      if front is not None:  # a sync stage runs on through the merged block
        for pos in range(*spans[k]):
          front = _advance(t, sol, front, pos, None)
      continue
    i = position[k]
    if k == 0:
      vin[i], sol.arg_in[k] = enter, np.zeros(enter.shape, dtype=np.int64)
    elif isinstance(items[k - 1], str):
      vin[i], sol.arg_in[k] = _minplus(sol.value[k - 1], t.edge(t.model.row[items[k - 1]]))
    else:
      vin[i], sol.arg_in[k] = _minplus(sol.value[k - 2], sol.blocks[k - 1].cost)
    e, s = spans[k][1], starts[: i + 1]
    if opts is None:
      if overlap:
        suffix = np.maximum.accumulate(reach[:e][::-1], axis=0)[::-1]
        exposed = suffix[s] - (cum_a[s] - cum_b[s])
      else:
        exposed = cum_a[e] - cum_a[s]
      sync = np.where((cum_p[e] - cum_p[s]) > 0, lat[None, :] + exposed, 0.0)
      run = cum_comp[e] - cum_comp[s] + sync
      kind = np.full(run.shape, RUN_SAMPLES)
    else:
      run = np.where(cum_none[e] - cum_none[s] > 0, INF, cum_free[e] - cum_free[s])
      kind = np.full(run.shape, RUN_FREE)
      if not overlap:
        paid = lat[None, :] + cum_paid[e] - cum_paid[s]
        kind[paid < run] = RUN_PAID
        run = np.minimum(run, paid)
    run[(cum_bad[e] - cum_bad[s]) > 0] = INF
    run[no_start[: i + 1]] = INF  # an elementwise layer stays on its producer's devices
    total = vin[: i + 1] + run[:, None, :]
    best = total.argmin(axis=0)
    sol.value[k] = np.take_along_axis(total, best[None], axis=0)[0]
    sol.arg_start[k] = node_ids[best]
    if opts is None:
      continue
    sol.kind[k] = kind[best, cols[None, :]]
    if overlap:
      fresh = None if no_start[i] else vin[i] + lat[None, :]
      front = _advance(t, sol, front, spans[k][0], fresh)
      if front is not None:
        state = front[0].argmin(axis=0)
        value = np.take_along_axis(front[0], state[None], axis=0)[0]
        better = value < sol.value[k]
        sol.value[k] = np.where(better, value, sol.value[k])
        sol.kind[k] = np.where(better, RUN_OPEN, sol.kind[k])
        sol.state[k] = state
  return sol


def _advance(t: _Tables, sol: _ChainSol, front, pos: int, fresh: np.ndarray | None):
  """Open sync stages (stage_choice) extended by the layer at flat position `pos`; `fresh`
  (F, C): the cost before a stage that starts there, its latency included (None: none may)."""
  if front is None and fresh is None:
    return None
  p, q = front if front is not None else (np.empty((0, *fresh.shape)),) * 2
  start = -1
  if fresh is not None:
    start = p.shape[0]
    p, q = np.concatenate([p, fresh[None]]), np.concatenate([q, fresh[None]])
  row = int(sol.flat[pos])
  p, q, src = stage_choice.prune(*stage_choice.step(p, q, t.options, row))
  sol.back[pos] = (src, start)
  return p, q


def _stage_shardings(t: _Tables, sol: _ChainSol, k: int, f: int, g: int):
  """(start item, [sharding per flat position of the stage]) of the stage ending at node
  item k for fork count f and count g (weight sharding)."""
  opts, lo, hi = t.options, None, sol.spans[k][1]
  kind = int(sol.kind[k][f, g])
  if kind != RUN_OPEN:
    i = int(sol.arg_start[k][f, g])
    pick = opts.free_pick if kind == RUN_FREE else opts.paid_pick
    return i, [opts.sharding(int(r), g, int(pick[r, g])) for r in sol.flat[sol.spans[i][0]: hi]]
  width = opts.compute.shape[2]
  state, out, pos = int(sol.state[k][f, g]), [], hi - 1
  while lo is None:
    src, start = sol.back[pos]
    state, option = divmod(int(src[state, f, g]), width)
    out.append(opts.sharding(int(sol.flat[pos]), g, option))
    if state == start:
      lo = pos
    pos -= 1
  i = next(j for j, span in enumerate(sol.spans) if span[0] == lo and isinstance(
      sol.chain.items[j], str))
  return i, out[::-1]


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
  plan: _LanePlan | None = None  # the lane search's tier (None: packed lanes)


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
  if lanes and not pinned:
    every = np.arange(len(t.counts))
    # lanes only matter where they beat serial (a hair of slack against rounding)
    bound = (serial - identities * enter) * (1 + 1e-9) + 1e-12
    plan = _lane_plan(t, lanes)
    concurrent = _lane_dp(t, lanes, plan, every, every, bound=bound)[0] + identities * enter
  else:
    plan, concurrent = None, np.full(serial.shape, INF)
  chosen = concurrent < serial
  return _BlockSol(block, np.where(chosen, concurrent, serial), chosen, sols, lanes, plan)


# Work caps (array cells a block's lane search touches) that pick its tier (module docstring).
EXACT_CELLS = 5e6
GROUP_CELLS = 2e4
OPTION_LAYOUTS = 64  # most layouts of one branch the exact tier enumerates
SHARDED_LAYOUTS = 512  # the same with weight shardings (placements and shardings per layer)


@dataclass
class _Group:
  """Branches `members` run one after another on one lane at one count."""

  members: tuple
  fwd: np.ndarray  # (K, C) sum of the members' forward per link class and count
  bwd: np.ndarray  # (K, C) sum of their backward plus exposed all-reduce


@dataclass
class _LanePlan:
  """Which (placed, added) branch-set transitions a block's lane search runs, and for the
  exact tier the candidate forward and backward maxima."""

  steps: dict  # placed mask -> list of added masks
  groups: dict  # added mask -> _Group
  tau_f: np.ndarray | None = None
  tau_b: np.ndarray | None = None
  options: list = field(default_factory=list)  # per lane, _Option list (exact tier only)


def _submasks(mask: int):
  sub = mask
  while sub:
    yield sub
    sub = (sub - 1) & mask


def _group(lanes: list, mask: int) -> _Group:
  members = tuple(i for i in range(len(lanes)) if mask >> i & 1)
  return _Group(members, sum(lanes[i].fwd for i in members), sum(lanes[i].bwd for i in members))


def _lane_plan(t: _Tables, lanes: list) -> _LanePlan | None:
  """The lane search's tier for this block, from its size alone (so that the search over
  every fork and join count and the re-run that tracks one layout agree)."""
  n, c, e = len(lanes), len(t.counts), t.budget + 1
  full = (1 << n) - 1
  cells = c * e * c * c
  if n <= 6:
    steps = {s: list(_submasks(full & ~s)) for s in range(full)}
    transitions = sum(len(v) for v in steps.values())
    if transitions * cells <= GROUP_CELLS:
      groups = {m: _group(lanes, m) for m in range(1, full + 1)}
      if n >= 2:  # one lane: least partial cost is already exact
        none = [[] for _ in lanes]
        exact = _exact_maxima(t, lanes, groups, transitions * cells, none)
        if exact is not None:  # it fits without count-changing lanes; try with them
          options = [_options(t, lane) or [] for lane in lanes]
          exact = _exact_maxima(t, lanes, groups, transitions * cells, options) or exact
          return _LanePlan(steps, groups, *exact)
      return _LanePlan(steps, groups)
  return None


def _exact_maxima(t: _Tables, lanes: list, groups: dict, cells: int, options: list):
  """(tau_f, tau_b, options) of the exact tier with these count-changing lanes, or None past
  EXACT_CELLS."""
  kinds = np.unique(link_class(t.model.cluster, *_all_ranges(t)))
  fwd = [g.fwd[kinds] for g in groups.values()] + [np.array([o.fwd for o in x]) for x in options]
  bwd = [g.bwd[kinds] for g in groups.values()] + [np.array([o.bwd for o in x]) for x in options]
  low_f = max(min([lane.fwd[kinds].min()] + [o.fwd for o in x])
              for lane, x in zip(lanes, options, strict=True))
  low_b = max(min([lane.bwd[kinds].min()] + [o.bwd for o in x])
              for lane, x in zip(lanes, options, strict=True))
  tau_f, tau_b = _maxima(low_f, fwd), _maxima(low_b, bwd)
  singles = sum(len(x) for x in options) * 2 ** (len(lanes) - 1)  # option transitions
  c = len(t.counts)
  if (cells + singles * c * c) * len(tau_f) * len(tau_b) > EXACT_CELLS:
    return None
  return tau_f, tau_b, options


def _maxima(low: float, groups: list) -> np.ndarray:
  """Candidate maxima over lanes: every finite group value at least `low`, the largest of the
  branches' least values (each branch is in some lane, which costs at least as much)."""
  every = np.unique(np.concatenate([x.ravel() for x in groups]))
  return every[np.isfinite(every) & (every >= low)]


def _all_ranges(t: _Tables):
  """(starts, counts) of every range [s, s + c) inside the job's devices."""
  k = t.counts
  s = np.arange(t.budget + 1)[:, None]
  ok = s + k[None, :] <= t.budget
  return np.broadcast_to(s, ok.shape)[ok], np.broadcast_to(k[None, :], ok.shape)[ok]


@dataclass
class _Option:
  """One branch inside its lane [lo, hi): on several ranges (device count changes inside),
  or with weight-sharded layers."""

  lo: int
  hi: int
  places: tuple  # (start, count index) per layer of the branch
  fwd: float
  bwd: float
  into: np.ndarray  # (C,) the fork's send into the first layer, per fork count
  out: np.ndarray  # (C,) the last layer's send to the join, per join count
  shards: tuple = ()  # (m, split) or None (samples) per layer; () when every layer splits samples


def _branch_cost(t: _Tables, rows: np.ndarray, places: tuple, memo: dict) -> tuple[float, float]:
  """(forward, backward) of a branch chain on `places`, as evaluate() prices a chain."""
  fwd = bwd = 0.0
  i = 0
  while i < len(rows):
    j = i
    while j + 1 < len(rows) and places[j + 1] == places[i]:
      j += 1
    key = (i, j, places[i])
    if key not in memo:
      (s, c), run = places[i], rows[i: j + 1]
      kind = int(link_class(t.model.cluster, s, t.counts[c]))
      back = t.bwd_k[kind, run, c].sum()
      memo[key] = (t.compute_k[kind, run, c].sum() - back, back + _run_sync(t, run, kind)[c])
    fwd, bwd = fwd + memo[key][0], bwd + memo[key][1]
    if j + 1 < len(rows):
      key = (j, places[j], places[j + 1])
      if key not in memo:
        (s, c), (s2, c2) = places[j], places[j + 1]
        parts = move_parts(t.model.cluster, t.model.batch, s, t.counts[c], s2, t.counts[c2])
        memo[key] = float(move_from_parts(parts, t.model.out_bytes[rows[j]])) / 2
      fwd, bwd = fwd + memo[key], bwd + memo[key]
    i = j + 1
  return float(fwd), float(bwd)


def _lane_shardings(t: _Tables, row: int, column: int) -> list:
  """The shardings a lane layer may take on count `column`: samples where allowed (None), and
  the weight shardings offered there (every one where samples is allowed when offers is None;
  none without weight sharding)."""
  out = [None] if t.allowed[row, column] else []
  if t.options is None:
    return out
  node = t.model.graph.node(t.model.names[row])
  for sh in candidates(node, int(t.counts[column]), t.model.options.sharding)[1:]:
    if (sh in t.offers.get((row, column), ())) if t.offers is not None \
        else t.allowed[row, column]:
      out.append(sh)
  return out


def _layouts(t: _Tables, lane: _Lane, places: list):
  """Every (placement, sharding) per layer of the lane's branch: (places, shards) pairs, shards
  () when the search splits samples only; None past OPTION_LAYOUTS (samples) or
  SHARDED_LAYOUTS (with weight shardings)."""
  if t.options is not None:
    layer_choices = [[((s, c), sh) for s, c in places for sh in _lane_shardings(t, r, c)]
                     for r in lane.rows]
    if np.prod([len(x) for x in layer_choices], dtype=float) <= SHARDED_LAYOUTS:
      return [(tuple(p for p, _ in combo), tuple(sh for _, sh in combo))
              for combo in itertools.product(*layer_choices)]
  if len(places) ** len(lane.rows) > OPTION_LAYOUTS:
    return None
  return [(combo, ()) for combo in itertools.product(places, repeat=len(lane.rows))
          if all(t.allowed[r, c] for r, (_, c) in zip(lane.rows, combo, strict=True))]


def _sharded_branch_cost(t: _Tables, names: tuple, places: tuple, shards: tuple,
                         k: np.ndarray) -> tuple[float, float]:
  """(forward, backward) of a branch chain on `places` with weight shardings `shards`, as
  evaluate() prices a chain (runs on one placement are stages; moves half each way)."""
  model, fwd, bwd = t.model, 0.0, 0.0
  spec = {n: sh for n, sh in zip(names, shards, strict=True) if sh is not None}
  placed = [(s, int(k[c])) for s, c in places]
  i = 0
  while i < len(names):
    j = i
    while j + 1 < len(names) and placed[j + 1] == placed[i]:
      j += 1
    run = tuple(names[i: j + 1])
    compute, sync = model.stage(run, placed[i], spec)
    back = sum(model.layer_ms(n, placed[i], spec.get(n))[1] for n in run)
    fwd, bwd = fwd + compute - back, bwd + back + sync
    if j + 1 < len(names):
      half = model.move(names[j], placed[j], placed[j + 1])[0] / 2
      fwd, bwd = fwd + half, bwd + half
    i = j + 1
  return float(fwd), float(bwd)


def _options(t: _Tables, lane: _Lane) -> list | None:
  """Every way to run a short plain branch on ranges that change inside its lane (and, with
  weight sharding, with its layers' weight shardings), less those another way (or a one-range
  samples lane) beats on every term within a hull no wider; None when the branch is too long
  to enumerate (_layouts)."""
  k, g = t.counts, t.budget
  places = [(s, c) for c in range(len(k)) for s in range(g - int(k[c]) + 1)]
  layouts = _layouts(t, lane, places)
  if layouts is None:
    return None
  moves_in, moves_out = t.lane_moves()
  pinned = [t.model.graph.node(n).kind in ELEMENTWISE_KINDS for n in lane.names]
  pool, memo = [], {}
  for combo, shards in layouts:
    if any(pinned[i] and combo[i] != combo[i - 1] for i in range(1, len(combo))):
      continue
    lo = min(s for s, _ in combo)
    hi = max(s + int(k[c]) for s, c in combo)
    (s1, c1), (s2, c2) = combo[0], combo[-1]
    if any(sh is not None for sh in shards):
      fwd, bwd = _sharded_branch_cost(t, lane.names, combo, shards, k)
    else:
      fwd, bwd = _branch_cost(t, lane.rows, combo, memo)
      shards = ()
    if ("in", s1, c1) not in memo:
      memo[("in", s1, c1)] = move_from_parts([x[s1, c1] for x in moves_in], lane.first_bytes)
    if ("out", s2, c2) not in memo:
      memo[("out", s2, c2)] = move_from_parts([x[s2, c2] for x in moves_out], lane.last_bytes)
    into, out = memo[("in", s1, c1)], memo[("out", s2, c2)]
    pool.append(_Option(lo, hi, combo, fwd, bwd, into, out, shards))
  if not pool:
    return []
  lo, hi = np.array([o.lo for o in pool]), np.array([o.hi for o in pool])
  fwd, bwd = np.array([o.fwd for o in pool]), np.array([o.bwd for o in pool])
  into, out = np.stack([o.into for o in pool]), np.stack([o.out for o in pool])
  order = np.arange(len(pool))
  keep = []
  for i, o in enumerate(pool):
    if len(set(o.places)) == 1 and not o.shards:
      continue  # one range, samples: the groups search has it
    no_worse = ((lo >= o.lo) & (hi <= o.hi) & (fwd <= o.fwd) & (bwd <= o.bwd)
                & (into <= o.into).all(axis=1) & (out <= o.out).all(axis=1))
    same = ((lo == o.lo) & (hi == o.hi) & (fwd == o.fwd) & (bwd == o.bwd)
            & (into == o.into).all(axis=1) & (out == o.out).all(axis=1))
    if not (no_worse & (~same | (order < i))).any():  # ties: the first one stays
      keep.append(o)
  return keep


def _prefix_best(key: np.ndarray, *arrays):
  """For every end e, the state with least key among ends <= e: (index, key, arrays...)."""
  run = np.minimum.accumulate(key, axis=0)
  ends = np.arange(len(key)).reshape((-1,) + (1,) * (key.ndim - 1))
  idx = np.maximum.accumulate(np.where(key == run, ends, 0), axis=0)
  return (idx, run, *(np.take_along_axis(a, idx, axis=0) for a in arrays))


def _lane_dp(t: _Tables, lanes: list, lp: _LanePlan | None, fsel: np.ndarray, jsel: np.ndarray,
             track: bool = False, bound: np.ndarray | None = None):
  """Concurrent layouts priced as evaluate() prices a block, per (fork count, join count).

  A layout puts groups of branches on disjoint lanes [s, s + c) anywhere in [0, G), in any
  order of position; a group's branches run one after another on its lane at one count. It
  costs (sum of the fork's sends and the join's receives) + max over lanes of their forward
  + max over lanes of their backward (evaluate()'s block). The state is (branches placed,
  end of the last lane); a lane starts at or after that end. Exact tier: for every pair of
  candidate maxima (tau_f, tau_b) keep the least moves with every lane within them, and
  take the least moves + tau_f + tau_b (exact); a lane may also hold one branch that changes
  count inside it (lp.options). The groups tier keeps, per state, the partial layout with the
  least partial cost (exact for one lane, a heuristic for more); lp None: packed lanes.
  Partial layouts that cannot beat `bound` are dropped. With track (one fork and one join
  count), also returns the layout (layer -> placement).
  """
  k, budget, cl = t.counts, t.budget, t.model.cluster
  moves_in, moves_out = t.lane_moves()
  if lp is None:
    return _packed_lane_dp(t, lanes, fsel, jsel, track, bound)
  exact = lp.tau_f is not None
  nf, nb = (len(lp.tau_f), len(lp.tau_b)) if exact else (1, 1)
  if not nf * nb:
    return np.full((len(fsel), len(jsel)), INF), None
  shape = (budget + 1, nf, nb, len(fsel), len(jsel))
  full = (1 << len(lanes)) - 1
  tau = (lp.tau_f[:, None, None, None] + lp.tau_b[None, :, None, None]) if exact else 0.0
  ends = {}  # cached sends / receives per (lane, count): (starts, F) and (starts, J)

  def sends(i, c):
    hit = ends.get((i, c))
    if hit is None:
      s = np.arange(budget - k[c] + 1)
      hit = ends[(i, c)] = (
          move_from_parts([x[s, c][:, fsel] for x in moves_in], lanes[i].first_bytes),
          move_from_parts([x[s, c][:, jsel] for x in moves_out], lanes[i].last_bytes))
    return hit

  at = {}

  def lane_at(add, c, need):
    """Group `add` on every lane [s, s + count c) that leaves `need` devices after it."""
    key = (add, c, need)
    if key not in at:
      g = lp.groups[add]
      last = budget - int(k[c]) - need
      if last < 0 or not np.isfinite(g.fwd[:, c]).any():
        at[key] = None
      else:
        s = np.arange(last + 1)
        cls = link_class(cl, s, k[c])
        at[key] = (last, s, g.fwd[cls, c], g.bwd[cls, c],
                   sum(sends(i, c)[0][: last + 1] for i in g.members),
                   sum(sends(i, c)[1][: last + 1] for i in g.members))
    return at[key]

  def empty():
    tabs = [np.full(shape, INF)] + ([] if exact else [np.full(shape, INF), np.zeros(shape),
                                                      np.zeros(shape)])  # key, moves, fwd, bwd
    back = np.full((4, *shape[:3]), -1, dtype=np.int64) if track else None
    return tabs, back

  tables, backs = {}, {}
  tables[0], backs[0] = empty()
  for tab in tables[0]:
    tab[0] = 0.0
  for placed in sorted(lp.steps):
    if placed not in tables:
      continue
    tabs = tables[placed]
    if bound is not None:
      total = tabs[0] + tau if exact else tabs[0]
      tabs[0][total >= bound] = INF
    if not np.isfinite(tabs[0]).any():
      continue
    idx, run, *rest = _prefix_best(*tabs)
    best = [run] if exact else rest  # moves (and forward, backward maxima) of the best state
    for add in lp.steps[placed]:
      after = placed | add
      need = 0 if after == full else 1  # every later lane needs a device
      for c in range(len(k)):
        hit = lane_at(add, c, need)
        if hit is None:
          continue
        last, s, gf, gb, into, out = hit
        here = slice(0, last + 1)
        moves = best[0][here] + into[:, None, None, :, None] + out[:, None, None, None, :]
        if exact:
          ok = (gf[:, None] <= lp.tau_f[None, :])[:, :, None] & (
              gb[:, None] <= lp.tau_b[None, :])[:, None, :]
          key = np.where(ok[..., None, None], moves, INF)
          cand = [key]
        else:
          fwd = np.maximum(best[1][here], gf[:, None, None, None, None])
          bwd = np.maximum(best[2][here], gb[:, None, None, None, None])
          key = moves + fwd + bwd
          cand = [key, moves, fwd, bwd]
        if after not in tables:
          tables[after], backs[after] = empty()
        target = slice(int(k[c]), int(k[c]) + last + 1)  # lane ends
        dest = tables[after]
        better = key < dest[0][target]
        for tab, new in zip(dest, cand, strict=True):
          np.copyto(tab[target], new, where=better)
        if track:
          pick = better[..., 0, 0]  # (starts, nf, nb)
          back = backs[after]
          for row, val in enumerate((placed, idx[here][..., 0, 0], s[:, None, None], c)):
            np.copyto(back[row][target], val, where=pick)
    for i, opts in enumerate(lp.options):
      after = placed | 1 << i
      if placed >> i & 1 or not opts:
        continue
      need = 0 if after == full else 1
      if after not in tables:
        tables[after], backs[after] = empty()
      dest, back = tables[after][0], backs[after]
      for o_index, o in enumerate(opts):
        if o.hi > budget - need:
          continue
        moves = best[0][o.lo] + o.into[fsel][:, None] + o.out[jsel][None, :]
        ok = (o.fwd <= lp.tau_f)[:, None] & (o.bwd <= lp.tau_b)[None, :]
        key = np.where(ok[..., None, None], moves, INF)
        better = key < dest[o.hi]
        np.copyto(dest[o.hi], key, where=better)
        if track:
          for row, val in enumerate((placed, idx[o.lo][..., 0, 0], o.lo, -1 - o_index)):
            np.copyto(back[row][o.hi], val, where=better[..., 0, 0])
  if full not in tables:
    return np.full((len(fsel), len(jsel)), INF), None
  total = tables[full][0] + tau if exact else tables[full][0]
  best_fj = total.min(axis=(0, 1, 2))
  if not track or not np.isfinite(best_fj[0, 0]):
    return best_fj, None
  e, tf, tb = np.unravel_index(int(total[..., 0, 0].argmin()), total.shape[:3])
  layout, placed = {}, full
  while placed:
    prev, prev_e, start, c = (int(x) for x in backs[placed][:, e, tf, tb])
    if c >= 0:
      for i in lp.groups[placed ^ prev].members:
        layout.update({name: (start, int(k[c])) for name in lanes[i].names})
    else:
      i = (placed ^ prev).bit_length() - 1
      o = lp.options[i][-1 - c]
      layout.update({name: (s, int(k[ci])) for name, (s, ci) in zip(lanes[i].names, o.places,
                                                                    strict=True)})
      t.laned.update(zip(lanes[i].names, o.shards, strict=False))
    placed, e = prev, prev_e
  return best_fj, layout


def _packed_lane_dp(t: _Tables, lanes: list, fsel: np.ndarray, jsel: np.ndarray,
                    track: bool = False, bound: np.ndarray | None = None):
  """The lane search of blocks past the groups cap: one lane per branch, packed from device 0
  in branch order. A layout costs (sum of the fork's sends and the join's receives) + max over
  lanes of their forward + max over lanes of their backward (evaluate()'s block). The state is
  the devices used so far, and for each state the partial layout with the least partial cost
  is kept (partial costs only grow as lanes are added; exact for two lanes, a heuristic for
  more). Partial layouts already at or above `bound` are dropped (the caller keeps the other
  mode there). With track (one fork and one join count), also returns the layout.
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
  return best, {name: (s, int(k[c])) for lane, (s, c) in zip(lanes, layout[::-1], strict=True)
                for name in lane.names}


# --- reconstruction --------------------------------------------------------------------------


def _place_chain(t: _Tables, sol: _ChainSol, f: int, g: int, out: dict) -> None:
  """Write the placements of the best plan of `sol` for fork count f and last count g."""
  items, k = sol.chain.items, len(sol.chain.items) - 1
  while True:
    if t.options is None:
      i = int(sol.arg_start[k][f, g])
      shards = [None] * (sol.spans[k][1] - sol.spans[i][0])
    else:
      i, shards = _stage_shardings(t, sol, k, f, g)
    for r, sh in zip(sol.flat[sol.spans[i][0]: sol.spans[k][1]], shards, strict=True):
      out[t.model.names[r]] = (0, int(t.counts[g]))
      t.chained[t.model.names[r]] = sh
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
    _, layout = _lane_dp(t, bs.lanes, bs.plan, np.array([f]), np.array([j]), track=True)
    out.update(layout)
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
  t.laned.clear()
  if np.isfinite(final[g]):
    _place_chain(t, sol, 0, g, out)
  return out, float(final[g])

