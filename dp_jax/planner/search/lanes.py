"""The lane search of a concurrent fork/join block, in its three tiers (exact, groups, packed)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dp_jax.hardware.cluster import link_class, p2p_link
from dp_jax.planner.costs import move_from_parts
from dp_jax.planner.search.layouts import _options
from dp_jax.planner.search.tables import INF, _Tables

# Work caps (array cells a block's lane search touches) that pick its tier (module docstring).
EXACT_CELLS = 5e7  # about 0.2 s of one core for the largest exact block (measured)
GROUP_CELLS = 2e4
SINGLE_CELLS = 2e6  # a lone branch's lane anywhere: (G + 1) C^2 moves (G = B = 16,384 is past)


@dataclass
class _Group:
  """Branches `members` run one after another on one lane at one count."""

  members: tuple
  fwd: np.ndarray  # (K, C) sum of the members' forward per link class and count
  bwd: np.ndarray  # (K, C) sum of their backward plus exposed all-reduce


@dataclass
class _LanePlan:
  """Which (placed, added) branch-set transitions a block's lane search runs, for the exact
  tier the candidate forward and backward maxima, and the lanes' options."""

  steps: dict  # placed mask -> list of added masks
  groups: dict  # added mask -> _Group
  tau_f: np.ndarray | None = None
  tau_b: np.ndarray | None = None
  options: list = field(default_factory=list)  # per lane, its _Option list (the block's space)
  searched: bool = True  # the lane search takes the options (else only the floor reads them)
  heuristic: bool = False  # the search does not cover the block's whole space


def _submasks(mask: int):
  sub = mask
  while sub:
    yield sub
    sub = (sub - 1) & mask


def _group(lanes: list, mask: int) -> _Group:
  members = tuple(i for i in range(len(lanes)) if mask >> i & 1)
  return _Group(members, sum(lanes[i].fwd for i in members), sum(lanes[i].bwd for i in members))


def _lane_plan(t: _Tables, lanes: list) -> _LanePlan | None:
  """The lane search's tier for this block, from the block alone (so that the search over
  every fork and join count and the re-run that tracks one layout agree); None: packed lanes
  (a heuristic: one lane on device 0 onward, or past one lane, packed in branch order)."""
  n, c, e = len(lanes), len(t.counts), t.budget + 1
  full = (1 << n) - 1
  cells = c * e * c * c
  if n > 6 or (n == 1 and e * c * c > SINGLE_CELLS):
    return None
  steps = {s: list(_submasks(full & ~s)) for s in range(full)}
  transitions = sum(len(v) for v in steps.values())
  if n >= 2 and transitions * cells > GROUP_CELLS:
    return None
  groups = {m: _group(lanes, m) for m in range(1, full + 1)}
  options = lane_options(t, lanes)
  if n == 1:  # one lane: the least partial cost is exact, options included
    return _LanePlan(steps, groups, options=options)
  exact = _exact_maxima(t, lanes, groups, transitions * cells, options)
  if exact is not None:
    return _LanePlan(steps, groups, *exact)
  if any(options):  # past the cap with the options: uniform lanes exactly, options unsearched
    exact = _exact_maxima(t, lanes, groups, transitions * cells, [[] for _ in lanes])
    if exact is not None:
      return _LanePlan(steps, groups, exact[0], exact[1], options, searched=False,
                       heuristic=True)
  return _LanePlan(steps, groups, options=options, heuristic=True)


def lane_options(t: _Tables, lanes: list) -> list:
  """Per lane, its plain branch's layouts inside the lane (layouts._options; none for a branch
  holding a block, or past the layouts cap): the block's space, whatever its tier."""
  return [(_options(t, lane) or []) if lane.plain else [] for lane in lanes]


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
  take the least moves + tau_f + tau_b (exact). The groups tier keeps, per state, the partial
  layout with the least partial cost (exact for one lane, a heuristic for more); lp None:
  packed lanes. In both a lane may also hold one plain branch laid out inside it (lp.options,
  where lp.searched).
  Partial layouts that cannot beat `bound` are dropped. With track (one fork and one join
  count), also returns the layout: (layer -> placement, layer -> weight sharding).
  """
  if lp is None:
    return _packed_lane_dp(t, lanes, fsel, jsel, track, bound)
  if len(lanes) == 1:
    if track:
      return _single_lane_dp(t, lanes[0], lp.options[0], fsel, jsel, track)
    lane, opts = lanes[0], lp.options[0]  # shared by equal lanes of one plan (its searches)
    key = ("single", lane.fwd.tobytes(), lane.bwd.tobytes(), lane.first_bytes, lane.last_bytes,
           fsel.tobytes(), jsel.tobytes(),
           tuple((o.fwd, o.bwd, o.into.tobytes(), o.out.tobytes()) for o in opts))
    hit = t.edges.get(key)
    if hit is None:
      hit = t.edges[key] = _single_lane_dp(t, lane, opts, fsel, jsel)
    return hit
  k, budget, cl = t.counts, t.budget, t.model.cluster
  moves_in, moves_out = t.lane_moves()
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
    for i, opts in enumerate(lp.options if lp.searched else ()):
      after = placed | 1 << i
      if placed >> i & 1 or not opts:
        continue
      need = 0 if after == full else 1
      if after not in tables:
        tables[after], backs[after] = empty()
      dest, back = tables[after], backs[after]
      for o_index, o in enumerate(opts):
        if o.hi > budget - need:
          continue
        moves = best[0][o.lo] + o.into[fsel][:, None] + o.out[jsel][None, :]
        if exact:
          ok = (o.fwd <= lp.tau_f)[:, None] & (o.bwd <= lp.tau_b)[None, :]
          key = np.where(ok[..., None, None], moves, INF)
          cand = [key]
        else:
          fwd, bwd = np.maximum(best[1][o.lo], o.fwd), np.maximum(best[2][o.lo], o.bwd)
          key = moves + fwd + bwd
          cand = [key, moves, fwd, bwd]
        better = key < dest[0][o.hi]
        for tab, new in zip(dest, cand, strict=True):
          np.copyto(tab[o.hi], new, where=better)
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
  layout, shards, placed = {}, {}, full
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
      shards.update((n, sh) for n, sh in zip(lanes[i].names, o.shards, strict=False)
                    if sh is not None)
    placed, e = prev, prev_e
  return best_fj, (layout, shards)


def _single_lane_dp(t: _Tables, lane, options: list, fsel: np.ndarray, jsel: np.ndarray,
                    track: bool = False):
  """_lane_dp for one branch: the least (send in + forward + backward + receive out) over its
  lane on every range [s, s + c) and its lane options, per (fork count, join count). Ranges
  whose sends, receives and link class are the same cost the same, so only one of each is
  priced against every (fork, join) pair (at large G most starts move the same samples)."""
  k, cl = t.counts, t.model.cluster
  moves_in, moves_out = t.lane_moves()  # [s, count, fork or join count]
  best = np.full((len(fsel), len(jsel)), INF)
  at = np.full(best.shape, -1, dtype=np.int64)  # per (fork, join): start, or -1 - option
  where = np.full(best.shape, -1, dtype=np.int64)  # its count (-1: an option)
  for c in range(len(k)):
    if not np.isfinite(lane.fwd[:, c]).any():
      continue
    s = np.arange(t.budget - int(k[c]) + 1)
    cls = link_class(cl, s, k[c])
    run = lane.fwd[cls, c] + lane.bwd[cls, c]
    s, run = s[np.isfinite(run)], run[np.isfinite(run)]
    if not len(s):
      continue
    into = move_from_parts([x[s, c][:, fsel] for x in moves_in], lane.first_bytes)
    out = move_from_parts([x[s, c][:, jsel] for x in moves_out], lane.last_bytes)
    first = _distinct_rows(np.concatenate([into, out, run[:, None]], axis=1))
    cost = into[first][:, :, None] + out[first][:, None, :] + run[first][:, None, None]
    pick = cost.argmin(axis=0)
    low = np.take_along_axis(cost, pick[None], axis=0)[0]
    better = low < best
    best = np.where(better, low, best)
    at = np.where(better, s[first][pick], at)
    where = np.where(better, c, where)
  for o_index, o in enumerate(options):
    low = o.into[fsel][:, None] + o.out[jsel][None, :] + o.fwd + o.bwd
    better = low < best
    best = np.where(better, low, best)
    at = np.where(better, -1 - o_index, at)
    where = np.where(better, -1, where)
  if not track or not np.isfinite(best[0, 0]):
    return best, None
  start, c = int(at[0, 0]), int(where[0, 0])
  if c >= 0:
    return best, ({name: (start, int(k[c])) for name in lane.names}, {})
  o = options[-1 - start]
  return best, ({name: (st, int(k[ci])) for name, (st, ci) in zip(lane.names, o.places,
                                                                  strict=True)},
                {n: sh for n, sh in zip(lane.names, o.shards, strict=False) if sh is not None})


def _distinct_rows(rows: np.ndarray) -> np.ndarray:
  """Indices of one row of each distinct value (the first), all rows where a hash would
  confuse two: rows are keyed by their dot product with fixed random weights (np.unique over
  rows sorts far slower), then checked equal to their key's first row."""
  weights = np.random.default_rng(0).uniform(1.0, 2.0, rows.shape[1])
  _, first, inverse = np.unique(rows @ weights, return_index=True, return_inverse=True)
  if not (rows == rows[first[inverse]]).all():
    return np.arange(len(rows))
  return first


def _packed_lane_dp(t: _Tables, lanes: list, fsel: np.ndarray, jsel: np.ndarray,
                    track: bool = False, bound: np.ndarray | None = None):
  """The lane search of blocks past the groups cap: one lane per branch, packed from device 0
  in branch order. A layout costs (sum of the fork's sends and the join's receives) + max over
  lanes of their forward + max over lanes of their backward (evaluate()'s block). The state is
  the devices used so far, and for each state the partial layout with the least partial cost
  is kept (partial costs only grow as lanes are added; exact for two lanes, a heuristic for
  more). Partial layouts already at or above `bound` are dropped (the caller keeps the other
  mode there). With track (one fork and one join count), also returns the layout (as
  _lane_dp: placements, and no weight shardings).
  """
  k, budget = t.counts, t.budget
  shifts = np.array([0], dtype=np.int64)
  shape = (len(fsel), len(jsel))
  state = [np.zeros((1, *shape)) for _ in range(3)]  # moves, forward max, backward max
  best = np.full(shape, INF)
  best_at, history = (-1, -1), []
  for li, lane in enumerate(lanes):
    last = li == len(lanes) - 1
    later = len(lanes) - 1 - li  # every later lane needs at least one device
    if not last:  # the lane ends this one can reach, one table row each
      ends = np.unique(np.concatenate([shifts + int(kc) for kc in k]))
      ends = ends[ends <= budget - later]
      table = [np.full((len(ends), *shape), INF) for _ in range(4)]  # total, moves, fwd, bwd
      from_s = np.full(len(ends), -1, dtype=np.int64)
      from_c = np.full(len(ends), -1, dtype=np.int64)
    for c in range(len(k)):
      if not np.isfinite(lane.fwd[:, c]).any():
        continue
      n = int(np.searchsorted(shifts, budget - k[c] - later, side="right"))
      if not n:
        continue
      s = shifts[:n]  # shifts ascend, so the lanes that fit are a prefix
      moves_in, moves_out = t.lane_moves_at(s, c)
      into = move_from_parts([x[:, fsel] for x in moves_in], lane.first_bytes)
      out = move_from_parts([x[:, jsel] for x in moves_out], lane.last_bytes)
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
        target = np.searchsorted(ends, s + k[c])
        better = cand < table[0][target]
        if track:
          pick = better[:, 0, 0]
          from_s[target[pick]], from_c[target[pick]] = s[pick], c
        for tab, new in zip(table, (cand, sends, fwd, bwd), strict=True):
          tab[target] = np.where(better, new, tab[target])
    if not last:
      if bound is not None:
        table[0][table[0] >= bound] = INF
      reached = np.flatnonzero(np.isfinite(table[0]).any(axis=(1, 2)))
      shifts = ends[reached]
      state = [tab[reached] for tab in table[1:]]
      history.append((ends, from_s, from_c))
      if not len(shifts):
        break
  if not track:
    return best, None
  if not np.isfinite(best[0, 0]):
    return best, None
  layout = [best_at]
  at = best_at[0]
  for ends, from_s, from_c in reversed(history):
    row = int(np.searchsorted(ends, at))
    layout.append((int(from_s[row]), int(from_c[row])))
    at = layout[-1][0]
  return best, ({name: (s, int(k[c])) for lane, (s, c) in zip(lanes, layout[::-1], strict=True)
                 for name in lane.names}, {})


FLOOR_CELLS = 2e6  # most (start, count, count) cells the floor's move minimum reads


def concurrent_floor(t: _Tables, lanes: list, options: list | None = None) -> np.ndarray:
  """(F, J) a lower bound on every concurrent layout's cost (groups on disjoint lanes at one
  count each, and a plain branch alone in its lane on any of its `options`, per lane):
  moves at least every branch's cheapest send in plus its cheapest receive out, each on its
  own best range or option;
  the forward at least the largest branch's least forward and at least the branches' least
  device-time over the G devices (the lanes are disjoint): a forward of T leaves each branch
  the ways (a count, or an option on its lane's width) where it takes <= T, and each needs
  width x its time there; the backward alike. Past FLOOR_CELLS the moves' part is 0."""
  k, budget = t.counts, t.budget
  c = len(k)
  options = options or [[] for _ in lanes]
  into_low, out_low = np.zeros(c), np.zeros(c)
  if (budget + 1) * c * c <= FLOOR_CELLS:
    moves_in, moves_out = t.lane_moves()  # [s, count, fork count], [s, count, join count]
    s = np.arange(budget + 1)
    fits = s[:, None] + k[None, :] <= budget  # (S, C)
    for lane, opts in zip(lanes, options, strict=True):
      usable = np.isfinite(lane.fwd).any(axis=0)
      ok = (fits & usable[None, :])[..., None]
      key = ("floor into", lane.first_bytes, usable.tobytes())
      low = t.edges.get(key)  # branches of one fork share it, and so do the searches
      if low is None:
        low = t.edges[key] = np.where(ok, move_from_parts(moves_in, lane.first_bytes),
                                      INF).min(axis=(0, 1))
      into_low = into_low + np.min([low, *(o.into for o in opts)], axis=0)
      key = ("floor out", lane.last_bytes, usable.tobytes())
      low = t.edges.get(key)
      if low is None:
        low = t.edges[key] = np.where(ok, move_from_parts(moves_out, lane.last_bytes),
                                      INF).min(axis=(0, 1))
      out_low = out_low + np.min([low, *(o.out for o in opts)], axis=0)
  widths = k.astype(float)
  reach = _reachable_classes(t)

  def phase(times, extra):  # times: (K, C) per lane; extra: per lane, (time, width) of options
    ways = []  # per lane: (times, widths) of every way it may run
    for x, ext in zip(times, extra, strict=True):
      ways.append((np.concatenate([np.where(reach, x, INF).min(axis=0), [e[0] for e in ext]]),
                   np.concatenate([widths, [e[1] for e in ext]])))
    longest = max(float(v.min()) for v, _ in ways)
    low = INF
    every = np.unique(np.concatenate([v[np.isfinite(v) & (v >= longest)] for v, _ in ways]))
    for tau in every:
      # every branch on some way where it takes <= tau, for at least its device-time there
      work = sum(float(np.where(v <= tau, v * w, INF).min()) for v, w in ways)
      low = min(low, max(float(tau), work / budget))
    return low

  fwd = phase([lane.fwd for lane in lanes], [[(o.fwd, o.hi - o.lo) for o in x] for x in options])
  bwd = phase([lane.bwd for lane in lanes], [[(o.bwd, o.hi - o.lo) for o in x] for x in options])
  low = into_low[:, None] + out_low[None, :] + fwd + bwd
  if len(lanes) == 1:  # a lone branch: its count ties the moves to its time
    low = np.maximum(low, _lone_floor(t, lanes[0], options[0]))
  return low


def _reachable_classes(t: _Tables) -> np.ndarray:
  """(K, C) whether some range [s, s + counts[c]) inside the job has link class K (the class
  repeats with the start's place in its node, so the first devices_per_node starts tell)."""
  hit = t.edges.get("reachable classes")
  if hit is None:
    k, dpn = t.counts, t.model.cluster.devices_per_node
    hit = np.zeros((t.lat.shape[0], len(k)), dtype=bool)
    for c, count in enumerate(k):
      s = np.arange(min(dpn, t.budget - int(count) + 1))
      hit[link_class(t.model.cluster, s, count), c] = True
    t.edges["reachable classes"] = hit
  return hit


def _lone_floor(t: _Tables, lane, options: list) -> np.ndarray:
  """(F, J) a lower bound on a lone branch's lane: least over its counts c of the least move
  in from the fork's count and out to the join's, plus its time on c (least over link
  classes), and each option's exact cost. A move from a counts to b != a moves at least
  B / max(a, b) samples on some device, whatever the ranges (the larger side has a device
  outside the smaller), and at least |B / a - B / b| (a device of the side holding more per
  device keeps at most what it holds on the other), at the best link's bandwidth and
  latency."""
  k, b = t.counts, t.model.batch
  ends = [0, t.budget - 1] if t.budget > 1 else [0]
  bw, lat = p2p_link(t.model.cluster, np.zeros(len(ends), dtype=np.int64), np.array(ends))
  bw, lat = float(np.max(bw)), float(np.min(lat))
  per = b / k.astype(float)
  samples = np.where(k[:, None] == k[None, :], 0.0,
                     np.maximum(b / np.maximum(k[:, None], k[None, :]),
                                np.abs(per[:, None] - per[None, :])))

  def moved(nbytes):  # (lane count, fork or join count)
    return np.where(samples > 0, 2.0 * (samples * nbytes / bw + lat), 0.0)

  run = np.where(_reachable_classes(t), lane.fwd + lane.bwd, INF).min(axis=0)  # (C,)
  into, out = moved(lane.first_bytes), moved(lane.last_bytes)
  low = (into[:, :, None] + out[:, None, :] + run[:, None, None]).min(axis=0)
  for o in options:
    low = np.minimum(low, o.into[:, None] + o.out[None, :] + o.fwd + o.bwd)
  return low
