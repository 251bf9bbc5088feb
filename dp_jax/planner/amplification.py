"""Amplification limit: how much more device-time a layer may use than on one device."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dp_jax.planner import pricing
from dp_jax.planner.costs import CostModel, allreduce_volume_ms
from dp_jax.planner.sharded import Sharding


def amplification(model: CostModel) -> np.ndarray:
  """(L, C): g x (compute at B/g + own all-reduce bandwidth term) / compute on one device at B.

  Latency is left out (a stage pays it once, shared by its layers) and so are activation
  moves (they depend on the neighbours). The all-reduce is priced on devices [0, g).
  Layers that take no time, or less than amplification_floor_ms on one device, are exempt (1).
  """
  g = model.counts.astype(float)
  own = model.compute_ms + allreduce_volume_ms(model.cluster, model.grad_bytes[:, None], 0,
                                              model.counts[None, :])
  single = model.compute_ms[:, :1]
  with np.errstate(divide="ignore", invalid="ignore"):
    amp = g[None, :] * own / single
  exempt = (single <= 0) | (single < model.options.amplification_floor_ms)
  return np.where(exempt, 1.0, amp)


def sharded_amplification(model: CostModel, name: str, count: int, sharding: Sharding) -> float:
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
  weights: dict[tuple[int, int], tuple[Sharding, ...]]  # (row, column) -> weight shardings


def offers(model: CostModel, limit: float, fits: np.ndarray,
           weight_fits: dict[tuple[int, int], tuple[Sharding, ...]]) -> Offers:
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
