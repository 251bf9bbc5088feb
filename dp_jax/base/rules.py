"""The range of every numeric and list option, stated once (RULES) and checked by `check`: the
typed option that holds the value calls it when the app decodes its config, before any work,
with the option's own name in the one-line message."""

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
    # the local measurement of validate and the main job (dp_jax/measurement/local.py)
    Rule("local.num_devices", 1, integer=True),
    Rule("local.steps", 1, integer=True),
    Rule("local.warmup", 0, integer=True),
    Rule("local.runs_per_turn", 1, integer=True),
    Rule("local.profile_repeats", 1, integer=True),
    Rule("local.profile_passes", 1, integer=True),
    Rule("local.profile_cuts", 0, integer=True),
    # validate's plan set (dp_jax/validate.py)
    Rule("validate.plans", 0, integer=True),
    Rule("validate.amplification_limits", 1, inf=True, each=True),
    Rule("validate.group", 1, integer=True),
    Rule("validate.max_segments", 1, integer=True),
    Rule("train.alone_steps", 3, integer=True),
    # pipeline's A100 setting (dp_jax/pipeline.py)
    Rule("paper.batch_size", 1, integer=True),
    Rule("paper.amplification_limit", 1, inf=True),
)
BY_KEY = {rule.key: rule for rule in RULES}


def check(key: str, value: Any) -> Any:
  """`value` of option `key` against its rule (a UserError naming the key); None passes (an
  unset optional)."""
  if value is None:
    return value
  rule = BY_KEY[key]
  if rule.each:
    _check_list(rule, value)
  else:
    check_value(rule, value)
  return value


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
