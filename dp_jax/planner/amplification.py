"""Amplification limit: how much more device-time a layer may use than on one device."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dp_jax.hardware.cluster import link_class
from dp_jax.planner import pricing
from dp_jax.planner.costs import CostModel, allreduce_volume_ms, batch_norm_ms
from dp_jax.planner.layer_time import LayerTime, compose
from dp_jax.planner.sharded import Strategy


def prefix_times(model: CostModel) -> LayerTime:
  """(L, C) every layer's time on devices [0, count) of each candidate count, split by samples:
  the cost model's profile and update with each prefix's batch-norm syncs (pricing.layer_time
  at once for every layer and count)."""
  cols = np.arange(len(model.counts))
  link0 = link_class(model.cluster, 0, model.counts)
  sync = batch_norm_ms(model)[link0, :, cols].T
  upd = np.zeros(len(model.names)) if model.update_ms is None else model.update_ms
  return compose(model.fwd_ms, model.bwd_ms, upd[:, None], sync=sync)


def amplification(model: CostModel) -> np.ndarray:
  """(L, C): g x (compute at B/g + own all-reduce bandwidth term) / compute on one device at B.

  The layer's time is its whole time on devices [0, g) (pricing.layer_time: compute, update,
  its batch-norm syncs), as under a weight sharding (sharded_amplification). The stage's
  latency is left out (a stage pays it once, shared by its layers) and so are activation moves
  between layers (they depend on the neighbours). The all-reduce is priced on devices [0, g).
  Layers that take no time, or less than amplification_floor_ms on one device, are exempt (1).
  """
  g = model.counts.astype(float)
  total = prefix_times(model).total
  own = total + allreduce_volume_ms(model.cluster, model.grad_bytes[:, None], 0,
                                    model.counts[None, :])
  single = model.compute_ms[:, :1]
  with np.errstate(divide="ignore", invalid="ignore"):
    amp = g[None, :] * own / single
  exempt = (single <= 0) | (single < model.options.amplification_floor_ms)
  return np.where(exempt, 1.0, amp)


def sharded_amplification(model: CostModel, name: str, count: int, sharding: Strategy) -> float:
  """The same ratio for the layer under a weight sharding on devices [0, count): count x (its
  time there as the search prices it — compute at the sharded shape, its own activation
  collectives, its batch-norm syncs — + its own gradient all-reduce bandwidth over the data
  groups) / compute on one device at B; exempt layers 1."""
  single = float(model.compute_ms[model.row[name], 0])
  if single <= 0 or single < model.options.amplification_floor_ms:
    return 1.0
  total, _ = pricing.layer_ms(model, name, (0, count), sharding)
  return count * (total + pricing.band_ms(model, name, (0, count), sharding)) / single


def allowed_counts(model: CostModel, limit: float, fits: np.ndarray) -> np.ndarray:
  """(L, C) bool: counts within the limit that fit in memory; else the least-amplifying fit."""
  if math.isinf(limit):
    return fits.copy()
  amp = np.where(fits, amplification(model), np.inf)
  ok = amp <= limit * (1 + 1e-12)
  none = ~ok.any(axis=1)
  least = amp == amp.min(axis=1, keepdims=True)
  ok[none] = least[none] & fits[none]
  return ok


@dataclass(frozen=True)
class Offers:
  """What the search may give each layer: samples on a count, or a weight sharding there."""

  samples: np.ndarray  # (L, C) bool
  weights: dict[tuple[int, int], tuple[Strategy, ...]]  # (row, column) -> weight shardings


def offers(model: CostModel, limit: float, fits: np.ndarray,
           weight_fits: dict[tuple[int, int], tuple[Strategy, ...]]) -> Offers:
  """Every (count, sharding) of a layer that fits alone (fits: samples; weight_fits: weight
  shardings, memory.weight_fits) with amplification within the limit; a layer with none keeps
  its least-amplifying options that fit (as allowed_counts, over both kinds together)."""
  if math.isinf(limit):
    return Offers(fits.copy(), dict(weight_fits))
  tol = limit * (1 + 1e-12)
  amp = np.where(fits, amplification(model), np.inf)
  w_amp = {(r, c): np.array([sharded_amplification(model, model.names[r], int(model.counts[c]),
                                                   sh) for sh in shs])
           for (r, c), shs in weight_fits.items()}
  least = amp.min(axis=1)
  for (r, _), a in w_amp.items():
    least[r] = min(least[r], float(a.min()))
  within = least <= tol  # the layer has some option inside the limit
  ok = np.where(within[:, None], amp <= tol, (amp == least[:, None]) & fits)
  weights = {}
  for (r, c), shs in weight_fits.items():
    keep = w_amp[(r, c)] <= tol if within[r] else w_amp[(r, c)] == least[r]
    picked = tuple(sh for sh, k in zip(shs, keep, strict=True) if k)
    if picked:
      weights[(r, c)] = picked
  return Offers(ok, weights)
