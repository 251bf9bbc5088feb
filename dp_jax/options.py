"""Numeric options checked where they enter: every app's composed config, before any work."""

from __future__ import annotations

import math
from typing import Any

from dp_jax.errors import UserError

# (option, lowest allowed value, whether the lowest is excluded, may be infinite)
RULES: tuple[tuple[str, float, bool, bool], ...] = (
    ("batch_size", 1, False, False),
    ("steps", 0, False, False),
    ("iterations", 1, False, False),
    ("train.steps", 0, False, False),
    ("train.learning_rate", 0, True, False),
    ("optimizer.lr", 0, True, False),
    ("optimizer.momentum", 0, False, False),
    ("optimizer.weight_decay", 0, False, False),
    ("cluster.num_devices", 1, False, False),
    ("cluster.num_nodes", 1, False, False),
    ("cluster.devices_per_node", 1, False, False),
    ("cluster.memory_gb_per_device", 0, True, False),
    ("planner.amplification_limit", 1, False, True),
    ("planner.amplification_floor_ms", 0, False, False),
    ("profile.repeats", 1, False, False),
    ("profile.warmup", 0, False, False),
    ("profile.max_batch", 1, False, False),
    ("background.batch_per_device", 1, False, False),
    ("background.slowdown_cap", 0, False, True),
    ("runtime.num_devices", 1, False, False),
    ("runtime.checkpoint_every", 0, False, False),
    ("interference.piece_ms", 0, True, False),
    ("interference.switch_us", 0, False, False),
)
MODEL_SIZES = ("image_size", "num_classes", "seq_len", "n_layer", "d_model", "n_head",
               "vocab_size")


def check_options(cfg: Any) -> None:
  """Raise a one-line UserError naming the first option out of its range (or not finite)."""
  from omegaconf import OmegaConf

  rules = list(RULES)
  for prefix in ("model", "background.model"):
    rules += [(f"{prefix}.{k}", 1, False, False) for k in MODEL_SIZES]
  for key, lowest, strict, may_be_inf in rules:
    value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    _check(key, value, lowest, strict, may_be_inf)
  for key, value in _cluster_link_values(cfg):
    _check(key, value, 0, "bandwidth" in key, False)
  sharding = OmegaConf.select(cfg, "planner.sharding", default=None)
  if sharding is not None:
    from dp_jax.workflow import sharding_option

    sharding_option(sharding)
  batches = OmegaConf.select(cfg, "profile.batches", default=None)
  for b in batches or []:
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
      raise UserError(f"profile.batches holds {b!r}; per-device batches must be integers >= 1")


def _check(key: str, value: float, lowest: float, strict: bool, may_be_inf: bool) -> None:
  if math.isnan(value) or (math.isinf(value) and not (may_be_inf and value > 0)):
    raise UserError(f"{key}={value} must be a finite number")
  if value < lowest or (strict and value == lowest):
    bound = f"> {lowest:g}" if strict else f">= {lowest:g}"
    raise UserError(f"{key}={value} must be {bound}")


def _cluster_link_values(cfg: Any) -> list[tuple[str, float]]:
  """The cluster's bandwidth (> 0) and latency (>= 0) options, whatever their names."""
  cluster = cfg.get("cluster") if hasattr(cfg, "get") else None
  if cluster is None:
    return []
  out = []
  for k in cluster:
    v = cluster.get(k)
    if ("bandwidth" in k or "latency" in k) and isinstance(v, (int, float)) \
        and not isinstance(v, bool):
      out.append((f"cluster.{k}", v))
  return out
