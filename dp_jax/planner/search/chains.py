"""Chain and block recursion of the search: the chain DP, the block DP and the plan they pick."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dp_jax.graph.layer_graph import Chain, Parallel
from dp_jax.planner import stage_choice
from dp_jax.planner.search.lanes import (
  _lane_dp,
  _lane_plan,
  _LanePlan,
  concurrent_floor,
  lane_options,
)
from dp_jax.planner.search.tables import INF, _elementwise, _Lane, _run_sync, _Tables
from dp_jax.planner.structure import flat_layers, last_layer

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


def _solve_chain(t: _Tables, chain: Chain, enter: np.ndarray, floor: bool = False) -> _ChainSol:
  """Chain DP; `enter[f, g]` prices reaching the first layer on count g from fork count f.
  `floor`: blocks whose lane search is a heuristic take a lower bound of their concurrent cost
  (lanes.concurrent_floor), so the value is a lower bound on the space's optimum."""
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
  stage_in = t.stage_ms[None, :] + t.enter_ms[flat[starts]]  # (nodes, C) a stage's own terms
  items = chain.items
  for k, item in enumerate(items):
    if isinstance(item, Parallel):
      sol.blocks[k] = _solve_block(t, item, floor)
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
    leave = t.leave_ms[flat[e - 1]][None, :]
    run = run + stage_in[: i + 1] + leave
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
      fresh = None if no_start[i] else vin[i] + lat[None, :] + stage_in[i][None, :]
      front = _advance(t, sol, front, spans[k][0], fresh)
      if front is not None:
        state = front[0].argmin(axis=0)
        value = np.take_along_axis(front[0], state[None], axis=0)[0] + leave
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
class _BlockSol:
  block: Parallel
  cost: np.ndarray  # (C, C) fork count x join count
  concurrent: np.ndarray  # (C, C) bool: lanes chosen
  branches: list  # _ChainSol per non-identity branch (serialized mode)
  lanes: list
  plan: _LanePlan | None = None  # the lane search's tier (None: packed lanes)
  heuristic: bool = False  # its lane search did not cover the block's whole space (_lane_plan)


def _lane(t: _Tables, branch: Chain, fork_row: int) -> _Lane:
  """The branch as one stage on a lane; without a penalty it reads only the model and the
  samples mask, so the searches of one plan share it (t.edges)."""
  names = tuple(flat_layers(branch))
  rows = np.array([t.model.row[n] for n in names], dtype=np.int64)
  key = None if t.penalized else ("lane", rows.tobytes(), fork_row, t.allowed[rows].tobytes())
  hit = t.edges.get(key) if key else None
  if hit is None:
    hit = _new_lane(t, names, rows, fork_row, branch)
    if key:
      t.edges[key] = hit
  return hit


def _new_lane(t: _Tables, names: tuple, rows: np.ndarray, fork_row: int, branch: Chain) -> _Lane:
  bwd = t.bwd_k[:, rows].sum(axis=1)  # (K, C)
  fwd = t.compute_k[:, rows].sum(axis=1) - bwd
  back = np.stack([bwd[kind] + _run_sync(t, rows, kind) for kind in range(len(t.band))])
  back = back + t.stage_terms(rows[0], rows[-1])[None, :]  # the branch is one stage
  bad = ~t.allowed[rows].all(axis=0)
  fwd[:, bad] = INF
  back[:, bad] = INF
  return _Lane(rows, names, float(t.model.out_bytes[fork_row]),
               float(t.model.out_bytes[t.model.row[last_layer(branch)]]), fwd, back,
               all(isinstance(item, str) for item in branch.items))



def _solve_block(t: _Tables, block: Parallel, floor: bool = False) -> _BlockSol:
  """A block's cost over (fork count, join count); solved once per tables (t.solved). With
  `floor` (lower_bound), a heuristic block's concurrent cost is concurrent_floor's: only that
  is recomputed when no block nested in it is heuristic (the rest is the same DP)."""
  base = t.solved.get(block)
  if base is None:
    base = t.solved[block] = _solve_block_once(t, block)
  if not floor:
    return base
  if any(heuristic_blocks(sol) for sol in base.branches):
    return _solve_block_once(t, block, floor=True)
  if not base.heuristic:
    return base
  enter = t.edge(t.model.row[block.fork])
  identities = sum(1 for b in block.branches if not b.items)
  serial = identities * enter
  for sol in base.branches:  # summed in _solve_block_once's order
    serial = serial + sol.exit
  concurrent = _floor(t, base.lanes, base.plan) + identities * enter
  chosen = concurrent < serial
  return _BlockSol(block, np.where(chosen, concurrent, serial), chosen, base.branches,
                   base.lanes, base.plan, True)


def _solve_block_once(t: _Tables, block: Parallel, floor: bool = False) -> _BlockSol:
  fork_row = t.model.row[block.fork]
  enter = t.edge(fork_row)
  identities = sum(1 for b in block.branches if not b.items)
  serial = identities * enter
  sols, lanes = [], []
  for branch in block.branches:
    if branch.items:
      sol = _solve_chain(t, branch, enter, floor)
      _close_branch(t, sol)
      sols.append(sol)
      serial = serial + sol.exit
      lanes.append(_lane(t, branch, fork_row))
  if lanes:
    every = np.arange(len(t.counts))
    # lanes only matter where they beat serial (a hair of slack against rounding)
    bound = (serial - identities * enter) * (1 + 1e-9) + 1e-12
    plan = _lane_plan(t, lanes)
    heuristic = plan is None or plan.heuristic  # packed lanes: a heuristic
    if floor and heuristic:
      concurrent = _floor(t, lanes, plan) + identities * enter
    elif plan is None:
      concurrent = _packed(t, lanes) + identities * enter
    else:
      concurrent = _lane_dp(t, lanes, plan, every, every, bound=bound)[0] + identities * enter
  else:
    plan, concurrent, heuristic = None, np.full(serial.shape, INF), False
  chosen = concurrent < serial
  return _BlockSol(block, np.where(chosen, concurrent, serial), chosen, sols, lanes, plan,
                   heuristic)


def _lanes_key(lanes: list) -> tuple:
  """The lanes' content: the packed lane search and the floor read nothing else of a block
  (beyond the model-level moves), so the searches of one plan share them by it (t.edges)."""
  return tuple((lane.rows.tobytes(), lane.fwd.tobytes(), lane.bwd.tobytes(), lane.first_bytes,
                lane.last_bytes) for lane in lanes)


def _floor(t: _Tables, lanes: list, plan: _LanePlan | None) -> np.ndarray:
  """concurrent_floor, shared by the searches of one plan (its value is the lanes' and their
  lane options')."""
  options = plan.options if plan is not None else lane_options(t, lanes)
  key = ("floor", _lanes_key(lanes),
         tuple((o.lo, o.hi, o.fwd, o.bwd, o.into.tobytes(), o.out.tobytes()) for x in options
               for o in x))
  hit = t.edges.get(key)
  if hit is None:
    hit = t.edges[key] = concurrent_floor(t, lanes, options)
  return hit


def _packed(t: _Tables, lanes: list) -> np.ndarray:
  """The packed lane search over every (fork, join) count without a bound, shared by the
  searches of one plan. The block keeps lanes only where they beat serial: where the bounded
  search's value v is below the bound (serial's) it is the unbounded value, elsewhere both are
  at least the bound (partial layouts only grow, the cells are independent), so the block's
  cost and choice are the same; measured no slower than one bounded run on the zoo."""
  key = ("packed", _lanes_key(lanes))
  hit = t.edges.get(key)
  if hit is None:
    every = np.arange(len(t.counts))
    hit = t.edges[key] = _lane_dp(t, lanes, None, every, every)[0]
  return hit


def heuristic_blocks(sol: _ChainSol) -> int:
  """Blocks of a solved chain (nested ones included) whose lane search was a heuristic."""
  return sum(int(bs.heuristic) + sum(heuristic_blocks(b) for b in bs.branches)
             for bs in sol.blocks.values())


# --- reconstruction --------------------------------------------------------------------------


def _place_chain(t: _Tables, sol: _ChainSol, f: int, g: int, out: dict, shards_out: dict) -> None:
  """Write the placements (into `out`) and weight shardings (into `shards_out`) of the best plan
  of `sol` for fork count f and last count g."""
  items, k = sol.chain.items, len(sol.chain.items) - 1
  while True:
    if t.options is None:
      i = int(sol.arg_start[k][f, g])
      shards = [None] * (sol.spans[k][1] - sol.spans[i][0])
    else:
      i, shards = _stage_shardings(t, sol, k, f, g)
    for r, sh in zip(sol.flat[sol.spans[i][0]: sol.spans[k][1]], shards, strict=True):
      out[t.model.names[r]] = (0, int(t.counts[g]))
      if sh is not None:
        shards_out[t.model.names[r]] = sh
    if i == 0:
      return
    prev = int(sol.arg_in[i][f, g])
    if isinstance(items[i - 1], Parallel):
      _place_block(t, sol.blocks[i - 1], prev, g, out, shards_out)
      k, g = i - 2, prev
    else:
      k, g = i - 1, prev


def _place_block(t: _Tables, bs: _BlockSol, f: int, j: int, out: dict, shards_out: dict) -> None:
  if bs.concurrent[f, j]:
    key = ("packed layout", _lanes_key(bs.lanes), f, j) if bs.plan is None else None
    hit = t.edges.get(key) if key else None  # packed lanes: shared as _packed
    if hit is None:
      hit = _lane_dp(t, bs.lanes, bs.plan, np.array([f]), np.array([j]), track=True)[1]
      if key:
        t.edges[key] = hit
    layout, shards = hit
    out.update(layout)
    shards_out.update(shards)
    return
  for sol in bs.branches:
    _place_chain(t, sol, f, int(sol.arg_exit[f, j]), out, shards_out)

