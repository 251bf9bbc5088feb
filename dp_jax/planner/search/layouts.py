"""Layouts of one short branch inside its lane: count changes and weight shardings (exact tier)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from dp_jax.hardware.cluster import link_class
from dp_jax.planner import pricing
from dp_jax.planner.costs import move_from_parts, move_parts
from dp_jax.planner.search.tables import ELEMENTWISE_KINDS, _Lane, _run_sync, _Tables

OPTION_LAYOUTS = 64  # most layouts of one branch the exact tier enumerates
SHARDED_LAYOUTS = 512  # the same with weight shardings (placements and shardings per layer)


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
      memo[key] = (t.compute_k[kind, run, c].sum() - back,
                   back + _run_sync(t, run, kind)[c] + t.stage_terms(run[0], run[-1])[c])
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
  for sh in pricing.shardings(t.model, node.name, int(t.counts[column]))[1:]:
    if (sh in t.offers.get((row, column), ())) if t.offers is not None \
        else t.allowed[row, column]:
      out.append(sh)
  return out


def _layouts(t: _Tables, lane: _Lane):
  """Every (placement, sharding) per layer of the lane's branch: (places, shards) pairs, shards
  () when the search splits samples only; None past OPTION_LAYOUTS (samples) or
  SHARDED_LAYOUTS (with weight shardings). Sizes are counted before anything is built."""
  k = t.counts
  starts = [t.budget - int(x) + 1 for x in k]  # ranges per count

  def places():
    return [(s, c) for c in range(len(k)) for s in range(starts[c])]

  if t.options is not None:
    per_count = [[_lane_shardings(t, r, c) for c in range(len(k))] for r in lane.rows]
    sizes = [sum(n * len(x) for n, x in zip(starts, row, strict=True)) for row in per_count]
    if np.prod(sizes, dtype=float) <= SHARDED_LAYOUTS:
      layer_choices = [[((s, c), sh) for s, c in places() for sh in row[c]] for row in per_count]
      return [(tuple(p for p, _ in combo), tuple(sh for _, sh in combo))
              for combo in itertools.product(*layer_choices)]
  if float(sum(starts)) ** len(lane.rows) > OPTION_LAYOUTS:
    return None
  return [(combo, ()) for combo in itertools.product(places(), repeat=len(lane.rows))
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
    compute, sync = pricing.stage_cost(model, run, placed[i], spec)
    back = sum(pricing.layer_ms(model, n, placed[i], spec.get(n))[1] for n in run)
    terms = t.stage_terms(model.row[run[0]], model.row[run[-1]])[places[i][1]]
    fwd, bwd = fwd + compute - back, bwd + back + sync + terms
    if j + 1 < len(names):
      half = pricing.move_cost(model, names[j], placed[j], placed[j + 1])[0] / 2
      fwd, bwd = fwd + half, bwd + half
    i = j + 1
  return float(fwd), float(bwd)


def _options(t: _Tables, lane: _Lane) -> list | None:
  """Every way to run a short plain branch on ranges that change inside its lane (and, with
  weight sharding, with its layers' weight shardings), less those another way (or a one-range
  samples lane) beats on every term within a hull no wider; None when the branch is too long
  to enumerate (_layouts). An elementwise layer after the branch's first stays on the devices
  of the layer before it (its producer: the branch is a plain chain)."""
  k = t.counts
  layouts = _layouts(t, lane)
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
