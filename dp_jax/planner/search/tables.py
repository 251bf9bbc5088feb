"""The arrays one search reads (per layer and candidate count), built once per search."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dp_jax.hardware.cluster import class_bus_GBps, class_latency_ms, link_class, volume_ms
from dp_jax.planner import pricing, stage_choice
from dp_jax.planner.costs import CostModel, batch_norm_ms, move_from_parts, move_parts
from dp_jax.planner.layer_time import compose

# Single-input elementwise layers: XLA fuses them into their producer (DeepPool's ReLUs run in
# place), so the search never changes device count (or devices) into one that follows a layer of
# its chain. One that opens a branch may run anywhere the branch does (the fork's output moves
# into it as into any branch).
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
  stage_ms: np.ndarray | None = None  # (C,) per-stage terms (CostModel; zeros when it has none)
  enter_ms: np.ndarray | None = None  # (L, C)
  leave_ms: np.ndarray | None = None  # (L, C)
  edges: dict = field(default_factory=dict)  # moves (model-level: shared by every search)
  solved: dict = field(default_factory=dict)  # Parallel block -> its solution on these tables
  penalized: bool = False  # compute carries the memory repair's penalty (not the model's own)

  def stage_terms(self, first_row: int, last_row: int) -> np.ndarray:
    """(C,) the per-stage terms of a stage from row `first_row` to row `last_row`."""
    return self.stage_ms + self.enter_ms[first_row] + self.leave_ms[last_row]

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

  def lane_moves_at(self, starts: np.ndarray, column: int):
    """Move parts into and out of the lanes [s, s + counts[column]) for s in `starts`:
    (starts, fork count) and (starts, join count), as lane_moves()[.][starts, column]."""
    starts = np.asarray(starts, dtype=np.int64)
    key = ("lane", column, starts.tobytes())
    hit = self.edges.get(key)
    if hit is None:
      k, b, cl = self.counts, self.model.batch, self.model.cluster
      s, c = starts[:, None], int(k[column])
      hit = self.edges[key] = (move_parts(cl, b, 0, k[None, :], s, c),
                               move_parts(cl, b, s, c, 0, k[None, :]))
    return hit

  def lane_moves(self):
    """Move parts into and out of every lane [s, s + count): [s, c, fork or join count]."""
    hit = self.edges.get("lanes")
    if hit is None:
      k, b, cl = self.counts, self.model.batch, self.model.cluster
      s = np.arange(self.budget + 1)[:, None, None]
      hit = self.edges["lanes"] = (move_parts(cl, b, 0, k[None, None, :], s, k[None, :, None]),
                                   move_parts(cl, b, s, k[None, :, None], 0, k[None, None, :]))
    return hit


SHARDING_RULES = ("samples", "exact")  # samples: no weight sharding


def build_tables(model: CostModel, allowed: np.ndarray, penalty_ms: np.ndarray | None = None,
                 rule: str = "samples", offers: dict | None = None,
                 penalty_per_gb: float | None = None):
  """Tables for one search; `penalty_ms` (L, C) is added to the samples split's compute and
  `penalty_per_gb` prices the other strategies' memory alike (memory repair only:
  stage_choice.build).

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
  upd = np.zeros(len(model.names)) if model.update_ms is None else model.update_ms
  times = compose(model.fwd_ms[None], model.bwd_ms[None], upd[None, :, None],
                  sync=batch_norm_ms(model))  # per link class, layer and count
  compute_k, bwd_k = times.total, times.backward_total
  link0 = link_class(cl, 0, k)
  cols = np.arange(len(k))
  compute, bwd = compute_k[link0, :, cols].T, bwd_k[link0, :, cols].T
  prefix_band = band[link0, :, cols].T
  prefix_params = np.repeat((model.grad_bytes > 0)[:, None], len(k), axis=1)
  if rule not in SHARDING_RULES:
    raise ValueError(f"unknown sharding rule {rule!r}")
  if penalty_ms is not None:
    compute_k = compute_k + penalty_ms[None]
    compute = compute + penalty_ms
  options = None
  if model.options.chooses_strategies and rule == "exact":
    options = stage_choice.build(model, compute, bwd, prefix_band, allowed, offers,
                                 penalty_per_gb)
  return _Tables(model=model, counts=k, budget=model.options.num_devices, allowed=allowed,
                 compute=compute, bwd=bwd, compute_k=compute_k, bwd_k=bwd_k, band=band,
                 lat=lat, link0=link0, has_params=model.grad_bytes > 0, prefix_band=prefix_band,
                 prefix_params=prefix_params, options=options,
                 offers=offers if options is not None else None,
                 edges=pricing.memo(model).setdefault("search moves", {}),
                 penalized=penalty_ms is not None, **stage_terms(model))


def stage_terms(model: CostModel) -> dict:
  """The cost model's per-stage terms as arrays (zeros where it has none)."""
  shape = (len(model.names), len(model.counts))
  for name in ("stage_ms", "enter_ms", "leave_ms"):
    value = getattr(model, name)
    if value is not None and not (np.asarray(value) >= 0).all():
      raise ValueError(f"CostModel.{name} has negative or NaN entries; the search needs them >= 0")
  return {"stage_ms": np.zeros(shape[1]) if model.stage_ms is None else np.asarray(model.stage_ms),
          "enter_ms": np.zeros(shape) if model.enter_ms is None else np.asarray(model.enter_ms),
          "leave_ms": np.zeros(shape) if model.leave_ms is None else np.asarray(model.leave_ms)}


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



def _elementwise(t: _Tables, name: str) -> bool:
  return t.model.graph.node(name).kind in ELEMENTWISE_KINDS


@dataclass
class _Lane:
  rows: np.ndarray
  names: tuple
  first_bytes: float  # bytes per sample the fork sends into the branch
  last_bytes: float  # bytes per sample the branch's last layer sends to the join
  fwd: np.ndarray  # (K, C): the whole branch as one stage, forward, per link class and count
  bwd: np.ndarray  # (K, C): its backward plus exposed all-reduce, per link class and count
  plain: bool = True  # a plain chain (no block nested in it): lane options may lay it out
