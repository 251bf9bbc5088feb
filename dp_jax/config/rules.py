"""Numeric and list options checked where they enter: every app's composed config, before any
work, with the option's own name in the one-line message."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dp_jax.base.errors import UserError


@dataclass(frozen=True)
class Rule:
  """`key` (a dotted path) lies in [low, high]; open ends exclude the bound; inf: may be +inf.

  A list rule (each=True) applies to every item, and the list must not be empty.
  """

  key: str
  low: float = -math.inf
  low_open: bool = False
  high: float = math.inf
  high_open: bool = False
  inf: bool = False
  integer: bool = False
  each: bool = False


RULES: tuple[Rule, ...] = (
    Rule("batch_size", 1, integer=True),
    Rule("steps", 0, integer=True),
    Rule("iterations", 1, integer=True),
    Rule("train.steps", 0, integer=True),
    Rule("train.learning_rate", 0, low_open=True),
    Rule("optimizer.lr", 0, low_open=True),
    Rule("optimizer.momentum", 0, high=1, high_open=True),
    Rule("optimizer.weight_decay", 0),
    Rule("cluster.num_devices", 1, integer=True),
    Rule("cluster.num_nodes", 1, integer=True),
    Rule("cluster.devices_per_node", 1, integer=True),
    Rule("cluster.memory_gb_per_device", 0, low_open=True),
    Rule("planner.amplification_limit", 1, inf=True),
    Rule("planner.amplification_floor_ms", 0),
    Rule("profile.repeats", 1, integer=True),
    Rule("profile.warmup", 0, integer=True),
    Rule("profile.max_batch", 1, integer=True),
    Rule("profile.batches", 1, integer=True, each=True),
    Rule("background.batch_per_device", 1, integer=True),
    Rule("background.slowdown_cap", 0, inf=True),
    Rule("runtime.num_devices", 1, integer=True),
    Rule("runtime.checkpoint_every", 0, integer=True),
    Rule("interference.piece_ms", 0, low_open=True),
    Rule("interference.switch_us", 0),
    # accuracy (dp_jax/accuracy.py)
    Rule("accuracy.target", 0, low_open=True, high=1),
    Rule("accuracy.lrs", 0, low_open=True, each=True),
    Rule("accuracy.lr_reference_batch", 1, integer=True),
    Rule("accuracy.lr_batch_power"),
    Rule("accuracy.seeds", 0, integer=True, each=True),
    Rule("accuracy.momentum", 0, high=1, high_open=True),
    Rule("accuracy.max_epochs", 0, low_open=True),
    Rule("accuracy.eval_every_samples", 1, integer=True),
    Rule("accuracy.devices", 1, integer=True, each=True),
    # validate (dp_jax/validate.py)
    Rule("validate.plans", 0, integer=True),
    Rule("validate.amplification_limits", 1, inf=True, each=True),
    Rule("validate.num_devices", 1, integer=True),
    Rule("validate.steps", 1, integer=True),
    Rule("validate.warmup", 0, integer=True),
    Rule("validate.group", 1, integer=True),
    Rule("validate.runs_per_turn", 1, integer=True),
    Rule("validate.max_segments", 1, integer=True),
    Rule("validate.profile_repeats", 1, integer=True),
    Rule("validate.profile_passes", 1, integer=True),
    Rule("validate.profile_cuts", 0, integer=True),
    # pipeline's A100 setting (dp_jax/pipeline.py)
    Rule("paper.batch_size", 1, integer=True),
    Rule("paper.amplification_limit", 1, inf=True),
)
MODEL_SIZES = ("image_size", "num_classes", "seq_len", "n_layer", "d_model", "n_head",
               "vocab_size")


def check_options(cfg: Any) -> None:
  """Raise a one-line UserError naming the first option out of its range (or not finite)."""
  from omegaconf import OmegaConf

  rules = list(RULES)
  for prefix in ("model", "background.model"):
    rules += [Rule(f"{prefix}.{k}", 1, integer=True) for k in MODEL_SIZES]
  for rule in rules:
    value = OmegaConf.select(cfg, rule.key, default=None, throw_on_missing=False)
    if value is None:
      continue
    if rule.each:
      _check_list(rule, value)
    elif _is_number(value):
      check_value(rule, value)
  for key, value in _cluster_link_values(cfg):
    check_value(Rule(key, 0, low_open="bandwidth" in key), value)
  sharding = OmegaConf.select(cfg, "planner.sharding", default=None)
  if sharding is not None:
    from dp_jax.planner.options import check_sharding_choices

    check_sharding_choices(sharding if isinstance(sharding, str) else [str(v) for v in sharding])


def check_value(rule: Rule, value: float, key: str | None = None) -> None:
  """Raise a UserError if `value` breaks `rule` (key: the name in the message)."""
  key = key or rule.key
  if not _is_number(value):
    raise UserError(f"{key}={value!r} must be a number")
  if math.isnan(value) or (math.isinf(value) and not (rule.inf and value > 0)):
    raise UserError(f"{key}={value} must be a finite number{' (or inf)' if rule.inf else ''}")
  if rule.integer and not isinstance(value, int):
    raise UserError(f"{key}={value} must be an integer")
  low = value < rule.low or (rule.low_open and value == rule.low)
  high = value > rule.high or (rule.high_open and value == rule.high)
  if low or high:
    raise UserError(f"{key}={value} must be {_range(rule)}")


def _check_list(rule: Rule, value: Any) -> None:
  try:
    items = list(value)
  except TypeError:
    items = None
  if items is None or isinstance(value, str):
    raise UserError(f"{rule.key}={value!r} must be a list of numbers {_range(rule)}")
  if not items:
    raise UserError(f"{rule.key}=[] is empty; give at least one value {_range(rule)}")
  for i, item in enumerate(items):
    check_value(rule, item, key=f"{rule.key}[{i}]")


def _range(rule: Rule) -> str:
  parts = []
  if rule.low > -math.inf:
    parts.append(f"{'>' if rule.low_open else '>='} {rule.low:g}")
  if rule.high < math.inf:
    parts.append(f"{'<' if rule.high_open else '<='} {rule.high:g}")
  text = " and ".join(parts) or "finite"
  return f"{text} (or inf)" if rule.inf else text


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cluster_link_values(cfg: Any) -> list[tuple[str, float]]:
  """The cluster's bandwidth (> 0) and latency (>= 0) options, whatever their names."""
  cluster = cfg.get("cluster") if hasattr(cfg, "get") else None
  if cluster is None or not hasattr(cluster, "items"):
    return []
  out = []
  for k in cluster:
    v = cluster.get(k)
    if ("bandwidth" in k or "latency" in k) and _is_number(v):
      out.append((f"cluster.{k}", v))
  return out
