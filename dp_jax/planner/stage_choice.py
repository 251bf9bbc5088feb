"""The exact choice of every layer's weight sharding inside a stage (planner.sharding weights).

A stage (a run of layers on the prefix [0, g)) costs, as costs.stage_sync_ms prices it,

    sum of its layers' compute + [some layer sends gradients] x latency + exposed,

exposed = sum of the bandwidth terms without overlap and, with overlap, max over l of
(bandwidth of layers <= l) - (backward of layers < l). Each layer takes one option on g
devices: samples or a weight sharding (m, split), each with its (compute c, backward b,
bandwidth a); a = 0 when the option all-reduces nothing (d = 1, or no parameters).

- No-sync stages: every layer takes an option with a = 0 and the stage pays no latency: the
  cost is a sum of per-layer minima (`Options.free`).
- Sync stages pay the latency once up front and may take any option. Without overlap the cost
  is again a sum of per-layer minima, of c + a (`Options.paid`).
- With overlap, a sync stage in progress is a state (P, Q): P = its cost if it closed here
  (compute + latency + exposed so far), Q = P - (backward still free to hide later sends). A
  layer (c, b, a) takes it to P' = max(P + c, Q + c + a), Q' = Q + c + a - b (`step`). Both are
  non-decreasing in P and Q, so a state with no larger P and no larger Q is never worse and
  the frontier of undominated states (`prune`) keeps the optimum; for the same reason an option
  with no larger c, c + a and c + a - b than another is never worse (`build`).

evaluate() prices a stage whose layers all take a = 0 options as the no-sync stage does, any
other as the sync stage does; the sync stage's price of an all-a = 0 stage is too high by the
latency, which the minimum of the two discards. Pure Python and numpy, no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dp_jax.planner import memory, pricing

INF = np.inf


@dataclass
class Options:
  """Each (layer, count)'s undominated options on the prefix, padded with infinite compute."""

  compute: np.ndarray  # (L, C, O) fwd + bwd ms (infinite: no option)
  bwd: np.ndarray  # (L, C, O)
  band: np.ndarray  # (L, C, O) bandwidth term of the gradient all-reduce (0: no sync)
  shardings: list  # [row][column] -> list of O weight shardings (None: samples)
  free: np.ndarray  # (L, C) least compute of an option with band 0 (infinite if none)
  free_pick: np.ndarray  # (L, C) its option index
  paid: np.ndarray  # (L, C) least compute + band (infinite: no option, the cell is masked)
  paid_pick: np.ndarray  # (L, C) its option index

  def sharding(self, row: int, column: int, option: int):
    """The weight sharding (m, split) of an option, None for samples."""
    return self.shardings[row][column][option]


def undominated(rows: list) -> list:
  """Options (compute, bwd, band, sharding) that no other beats on c, c + a and c + a - b
  (ties: the first stays)."""
  keys = [(c, c + a, c + a - b) for c, b, a, _ in rows]
  keep = []
  for i, ki in enumerate(keys):
    beaten = any(all(x <= y for x, y in zip(kj, ki, strict=True)) and (kj != ki or j < i)
                 for j, kj in enumerate(keys) if j != i)
    if not beaten:
      keep.append(rows[i])
  return keep


def build(model, compute: np.ndarray, bwd: np.ndarray, band: np.ndarray, allowed: np.ndarray,
          offers: dict | None = None, penalty_per_gb: float | None = None) -> Options:
  """Options of every (layer, count) on the prefix: samples (compute, bwd, band given, (L, C))
  where `allowed` (L, C), and the strategies planner.sharding and planner.recompute allow
  there (priced by the cost model) that `offers` ((row, column) -> strategies) lists; offers
  None: every one, where samples is allowed. A cell with no option is infinite.
  `penalty_per_gb` (the memory repair's multiplier, ms per GB): each strategy's compute also
  carries it times the bytes the strategy keeps beyond the layer's whole state (memory.py:
  layer_need - state), as the samples option's compute (given) carries it
  times its activations, so a strategy that saves memory wins where memory binds."""
  k = model.counts
  cells = {}  # (row, column) -> (kept options, free index or None, paid index or None)
  same = {}  # identical layers' cells (pricing.signature) are built once
  for r, name in enumerate(model.names):
    sig = pricing.signature(model, name)
    for c, g in enumerate(k):
      samples = (float(compute[r, c]), float(bwd[r, c]), float(band[r, c]), None) \
          if allowed[r, c] else None
      offered = None if offers is None else tuple(pricing.strategy(x)
                                                  for x in offers.get((r, c), ()))
      key = (sig, c, samples, offered)
      if key not in same:
        same[key] = _cell(model, name, int(g), samples, offered, penalty_per_gb)
      cells[(r, c)] = same[key]
  shape = (len(model.names), len(k), max(1, max(len(v[0]) for v in cells.values())))
  out = Options(np.full(shape, INF), np.zeros(shape), np.zeros(shape),
                [[None] * len(k) for _ in model.names], np.full(shape[:2], INF),
                np.zeros(shape[:2], dtype=np.int64), np.full(shape[:2], INF),
                np.zeros(shape[:2], dtype=np.int64))
  for (r, c), (kept, free, paid) in cells.items():
    for o, (total, back, sent, _) in enumerate(kept):
      out.compute[r, c, o], out.bwd[r, c, o], out.band[r, c, o] = total, back, sent
    out.shardings[r][c] = [o[3] for o in kept]
    if free is not None:
      out.free[r, c], out.free_pick[r, c] = kept[free][0], free
    if paid is not None:
      out.paid[r, c], out.paid_pick[r, c] = kept[paid][0] + kept[paid][2], paid
  return out


def _cell(model, name: str, g: int, samples: tuple | None, offered: tuple | None,
          penalty_per_gb: float | None = None):
  """(kept options, free index or None, paid index or None) of one layer on the prefix [0, g):
  `samples` its samples option (None: not allowed), `offered` the strategies offered there
  (None: every one, where samples is allowed); penalty_per_gb: see build."""
  opts = [samples] if samples is not None else []
  for sh in pricing.shardings(model, name, g)[1:]:
    if (offered is None and samples is None) or (offered is not None and sh not in offered):
      continue
    total, back = pricing.layer_ms(model, name, (0, g), sh)
    sent = pricing.band_ms(model, name, (0, g), sh)
    if penalty_per_gb:
      # what it keeps through the step (its transient need is a peak of one layer at a time,
      # not a sum over layers: memory.device_bytes)
      kept = memory.layer_need(model, name, g, sh) - float(model.state_bytes[model.row[name]])
      total = float(total) + penalty_per_gb * kept / memory.GB
    opts.append((float(total), float(back), float(sent), sh))
  free = min(((o[0], i) for i, o in enumerate(opts) if o[2] <= 0), default=None)
  paid = min(((o[0] + o[2], i) for i, o in enumerate(opts)), default=None)
  kept = undominated(opts)
  for extra in (free, paid):  # the separable stages' picks stay selectable
    if extra is not None and opts[extra[1]] not in kept:
      kept.append(opts[extra[1]])
  return (kept, *(None if x is None else kept.index(opts[x[1]]) for x in (free, paid)))


def step(p: np.ndarray, q: np.ndarray, opts: Options, row: int):
  """Every state (S, F, C) extended by every option of `row` on each count: (S*O, F, C) P
  and Q; candidate n is state n // O with option n % O."""
  c = opts.compute[row].T[None, :, None, :]  # (1, O, 1, C)
  a = opts.band[row].T[None, :, None, :]
  b = opts.bwd[row].T[None, :, None, :]
  sent = q[:, None] + c + a
  p2 = np.maximum(p[:, None] + c, sent)
  q2 = sent - b
  n = p2.shape[0] * p2.shape[1]
  return p2.reshape((n, *p.shape[1:])), q2.reshape((n, *p.shape[1:]))


def prune(p: np.ndarray, q: np.ndarray):
  """The undominated states per cell, least P first: (P, Q, source index), (S', F, C) each;
  padding has P = infinity and source -1."""
  order = np.lexsort((q, p), axis=0)
  _, f, c = np.ogrid[:0, :p.shape[1], :p.shape[2]]  # gathers along axis 0
  ps, qs = p[order, f, c], q[order, f, c]
  low = np.minimum.accumulate(qs, axis=0)
  keep = np.isfinite(ps)
  keep[:1] &= qs[:1] < INF  # a state stays if its Q is below every Q of less P
  keep[1:] &= qs[1:] < low[:-1]
  width = max(int(keep.sum(axis=0).max()), 1)
  pos = np.argsort(~keep, axis=0, kind="stable")[:width]
  kept = keep[pos, f, c]
  src = np.where(kept, order[pos, f, c], -1)
  return np.where(kept, ps[pos, f, c], INF), np.where(kept, qs[pos, f, c], INF), src
