"""Planner options: what the user chooses, validated once, and the candidate device counts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.base.rules import check

DEVICE_COUNT_MODES = ("divisors", "powers_of_two")
BATCH_NORM_MODES = ("sync", "local")  # statistics over a stage's whole batch / per device
MODES = ("fastest", "frontier")
STRATEGIES = ("burst", "data_parallel")  # the planner group's name
SHARDING_CHOICES = ("samples", "weights")  # split samples / also weights (out, in, heads)
# Gradient precision of the all-reduce: bytes per parameter sent (docs/cost_model.md,
# "Gradient precision").
GRADIENT_BYTES = {"fp32": 4, "bf16": 2}
# Optimizer state per parameter, float32 (docs/cost_model.md, "Optimizer update"): plain SGD
# none, SGD with momentum one buffer, Adam / AdamW two moments.
OPTIMIZER_STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8, "adamw": 8}


@dataclass(frozen=True)
class PlanOptions:
  """The knobs of one planning run (validated here, once)."""

  num_devices: int
  global_batch: int
  amplification_limit: float = math.inf
  device_counts: str = "divisors"
  overlap_allreduce: bool = True
  amplification_floor_ms: float = 0.3  # the original DeepPool exempts layers under 300 us
  gradient_precision: str = "fp32"  # fp32 or bf16 all-reduce (GRADIENT_BYTES)
  optimizer: str = "momentum"  # sgd, momentum, adam, adamw (OPTIMIZER_STATE_BYTES)
  param_bytes_per_param: int = 4  # only used to count params when a node gives param_bytes alone
  check_memory: bool = True
  batch_norm: str = "sync"  # sync: statistics all-reduced over a layer's devices (priced)
  sharding: tuple[str, ...] = ("samples",)  # what a layer may split (planner.sharding)
  strategy: str = "burst"  # burst: the fastest plan under the limit; data_parallel: the baseline
  mode: str = "fastest"  # fastest plan, or also the Pareto frontier over amplification limits

  def __post_init__(self):
    for field_name, key in (("num_devices", "cluster.num_devices"),
                            ("global_batch", "batch_size")):
      value = getattr(self, field_name)
      if isinstance(value, np.integer):
        object.__setattr__(self, field_name, value := int(value))
      check(key, value)
    if self.num_devices > self.global_batch:
      raise UserError(f"{self.num_devices} devices (cluster.num_devices) for a global batch of "
                      f"{self.global_batch} (batch_size): every device needs at least one "
                      "sample; use cluster.num_devices <= batch_size")
    a = self.amplification_limit
    if isinstance(a, bool) or not isinstance(a, (int, float)):
      raise UserError(f"planner.amplification_limit={a!r} must be a number >= 1 (1: no layer "
                      "may use more device-time than on one device; inf: fastest plan)")
    check("planner.amplification_limit", a)
    check("planner.amplification_floor_ms", self.amplification_floor_ms)
    if self.strategy not in STRATEGIES:
      raise UserError(f"planner '{self.strategy}' is unknown (valid: {', '.join(STRATEGIES)})")
    if self.mode not in MODES:
      raise UserError(f"planner mode '{self.mode}' is unknown (valid: {', '.join(MODES)})")
    if self.batch_norm not in BATCH_NORM_MODES:
      raise UserError(f"batch_norm '{self.batch_norm}' is unknown "
                      f"(valid: {', '.join(BATCH_NORM_MODES)})")
    object.__setattr__(self, "sharding", check_sharding_choices(self.sharding))
    if self.device_counts not in DEVICE_COUNT_MODES:
      raise UserError(f"device_counts '{self.device_counts}' is unknown "
                      f"(valid: {', '.join(DEVICE_COUNT_MODES)})")
    if self.gradient_precision not in GRADIENT_BYTES:
      raise UserError(f"gradient_precision '{self.gradient_precision}' is unknown "
                      f"(valid: {', '.join(GRADIENT_BYTES)})")
    if self.optimizer not in OPTIMIZER_STATE_BYTES:
      raise UserError(f"optimizer '{self.optimizer}' is unknown "
                      f"(valid: {', '.join(OPTIMIZER_STATE_BYTES)})")
    value = self.param_bytes_per_param
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
      raise UserError(f"param_bytes_per_param must be > 0, got {value!r}")

  @classmethod
  def from_config(cls, planner: Any, num_devices: int, global_batch: int) -> PlanOptions:
    """The planner group of a config (a DictConfig or a mapping) for G devices and batch B."""
    get = planner.get

    def plain(key: str, default: Any) -> Any:
      value = get(key, default)
      return getattr(value, "value", value)  # a config enum's value

    sharding = get("sharding", ["samples"])
    return cls(num_devices=num_devices, global_batch=global_batch,
               amplification_limit=float(get("amplification_limit", math.inf)),
               device_counts=plain("device_counts", "divisors"),
               overlap_allreduce=bool(get("overlap_allreduce", True)),
               amplification_floor_ms=float(get("amplification_floor_ms", 0.3)),
               gradient_precision=str(get("gradient_precision", "fp32")),
               optimizer=str(get("optimizer", "momentum")),
               batch_norm=str(get("batch_norm", "sync")),
               sharding=sharding if isinstance(sharding, str) else tuple(map(str, sharding)),
               strategy=str(get("name", "burst")), mode=plain("mode", "fastest"))

  @property
  def grad_bytes_per_param(self) -> int:
    """Bytes per parameter of the gradient all-reduce (gradient_precision)."""
    return GRADIENT_BYTES[self.gradient_precision]

  @property
  def optimizer_bytes_per_param(self) -> int:
    """Optimizer state bytes per parameter (optimizer)."""
    return OPTIMIZER_STATE_BYTES[self.optimizer]


def check_sharding_choices(value) -> tuple[str, ...]:
  """planner.sharding as a tuple of known names that includes samples (one-line errors)."""
  names = [value] if isinstance(value, str) else list(value) if isinstance(
      value, (list, tuple)) else None
  if names is None or not names or not all(isinstance(n, str) for n in names):
    raise UserError(f"planner.sharding must be a list of names from "
                    f"{', '.join(SHARDING_CHOICES)}, got {value!r}")
  unknown = sorted(set(names) - set(SHARDING_CHOICES))
  if unknown:
    raise UserError(f"planner.sharding '{unknown[0]}' is unknown "
                    f"(valid: {', '.join(SHARDING_CHOICES)})")
  if "samples" not in names:
    raise UserError("planner.sharding must include samples (layers that cannot split weights "
                    "split their samples), e.g. [samples,weights]")
  return tuple(n for n in SHARDING_CHOICES if n in names)


def candidate_counts(options: PlanOptions) -> np.ndarray:
  """Device counts a layer may use: divisors of B (or powers of two) up to G, always 1 and G|B."""
  b, g = options.global_batch, options.num_devices
  if options.device_counts == "divisors":
    counts = {d for d in range(1, g + 1) if b % d == 0}
  else:
    counts = {1 << k for k in range(g.bit_length()) if (1 << k) <= g and b % (1 << k) == 0}
    if b % g == 0:
      counts.add(g)
  return np.array(sorted(counts), dtype=np.int64)


def data_parallel_count(options: PlanOptions) -> int:
  """Devices data parallelism uses: G when G divides B, else the largest divisor of B below G."""
  b, g = options.global_batch, options.num_devices
  return max(d for d in range(1, g + 1) if b % d == 0)
