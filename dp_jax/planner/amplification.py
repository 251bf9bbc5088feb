"""Amplification limit: how much more device-time a layer may use than on one device."""

from __future__ import annotations

import math

import numpy as np

from dp_jax.planner.costs import CostModel, allreduce_volume_ms


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
