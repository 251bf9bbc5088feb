"""Planner options: what the user chooses, validated once, and the candidate device counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dp_jax.base.errors import UserError

DEVICE_COUNT_MODES = ("divisors", "powers_of_two")
BATCH_NORM_MODES = ("sync", "local")  # statistics over a stage's whole batch / per device
MODES = ("fastest", "frontier")
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

  def __post_init__(self):
    for key in ("num_devices", "global_batch"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{key} must be a positive integer, got {value!r}")
    if self.num_devices > self.global_batch:
      raise UserError(f"num_devices ({self.num_devices}) is larger than global_batch "
                      f"({self.global_batch}): every device needs at least one sample; "
                      "use num_devices <= global_batch")
    a = self.amplification_limit
    if isinstance(a, bool) or not isinstance(a, (int, float)) or math.isnan(a) or a < 1:
      raise UserError(f"amplification_limit must be a number >= 1 (1: no layer may use more "
                      f"device-time than on one device; inf: fastest plan), got {a!r}")
    if self.batch_norm not in BATCH_NORM_MODES:
      raise UserError(f"batch_norm '{self.batch_norm}' is unknown "
                      f"(valid: {', '.join(BATCH_NORM_MODES)})")
    object.__setattr__(self, "sharding", check_sharding_choices(self.sharding))
    if self.device_counts not in DEVICE_COUNT_MODES:
      raise UserError(f"device_counts '{self.device_counts}' is unknown "
                      f"(valid: {', '.join(DEVICE_COUNT_MODES)})")
    f = self.amplification_floor_ms
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not f >= 0:
      raise UserError(f"amplification_floor_ms must be a number >= 0, got {f!r}")
    if self.gradient_precision not in GRADIENT_BYTES:
      raise UserError(f"gradient_precision '{self.gradient_precision}' is unknown "
                      f"(valid: {', '.join(GRADIENT_BYTES)})")
    if self.optimizer not in OPTIMIZER_STATE_BYTES:
      raise UserError(f"optimizer '{self.optimizer}' is unknown "
                      f"(valid: {', '.join(OPTIMIZER_STATE_BYTES)})")
    value = self.param_bytes_per_param
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
      raise UserError(f"param_bytes_per_param must be > 0, got {value!r}")

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
