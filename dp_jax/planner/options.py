"""The planner group (PlannerConfig: every option's default and range, stated once) and a
planning run's options (PlanOptions: the group for G devices and a global batch B)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dp_jax.base.checks import Checked, ConfigError, fields_of, option
from dp_jax.base.errors import UserError

# What a layer may split or shard beyond its samples (docs/cost_model.md, "Per-layer
# strategies"): weights (out, in, heads over a model axis), state (its parameters, gradients and
# optimizer state over its data axis, ZeRO-1 or FSDP), experts (an MoE layer's experts).
SHARDING_CHOICES = ("samples", "weights", "state", "experts")
RECOMPUTE_CHOICES = ("none", "choose", "all")
# Gradient precision of the all-reduce: bytes per parameter sent (docs/cost_model.md,
# "Gradient precision").
GRADIENT_BYTES = {"fp32": 4, "bf16": 2}
# Optimizer state per parameter, float32 (docs/cost_model.md, "Optimizer update"): plain SGD
# none, SGD with momentum one buffer, Adam / AdamW two moments.
OPTIMIZER_STATE_BYTES = {"sgd": 0, "momentum": 4, "adam": 8, "adamw": 8}


@dataclass(frozen=True)
class PlannerConfig(Checked):
  """The planner group (conf/planner/): how the burst planner searches and what it prices.

  name: burst (the fastest plan under the limit) or data_parallel (the baseline); mode:
  fastest, or also the Pareto frontier over amplification limits; amplification_limit: how
  much more device-time a layer may use than on one device (1 or more; inf: the fastest plan);
  layers under amplification_floor_ms are exempt (DeepPool's 300 us); device_counts: a layer's
  candidate counts, divisors of B or powers of two; overlap_allreduce: gradients all-reduced
  beside the backward pass; gradient_precision: the all-reduce's bytes per parameter (fp32 or
  bf16, docs/cost_model.md "Gradient precision"); optimizer: whose state the memory model holds
  and whose update every step pays; batch_norm: sync (statistics over a layer's devices,
  priced) or local (per device); sharding: what a layer may split or shard beyond its samples:
  any of weights, state, experts beside samples (docs/cost_model.md, "Per-layer strategies");
  recompute: none (no layer recomputes its activations), choose (the planner recomputes a
  layer where the memory it saves pays for its extra forward) or all (every layer);
  check_memory: refuse plans that do not fit; param_bytes_per_param: counts parameters where a
  graph gives bytes alone.
  """

  GROUP = "planner"

  name: str = option("burst", choices=("burst", "data_parallel"))
  mode: str = option("fastest", choices=("fastest", "frontier"))
  amplification_limit: float = option(
      2.0, low=1, inf=True, hint="1: no layer may use more device-time than on one device; "
      "inf: the fastest plan")
  amplification_floor_ms: float = option(0.3, low=0)
  device_counts: str = option("divisors", choices=("divisors", "powers_of_two"))
  overlap_allreduce: bool = True
  gradient_precision: str = option("fp32", choices=tuple(GRADIENT_BYTES))
  optimizer: str = option("momentum", choices=tuple(OPTIMIZER_STATE_BYTES))
  batch_norm: str = option("sync", choices=("sync", "local"))
  sharding: tuple[str, ...] = option(default_factory=lambda: ("samples",), each=True,
                                     choices=SHARDING_CHOICES)
  recompute: str = option("none", choices=RECOMPUTE_CHOICES)
  check_memory: bool = True
  param_bytes_per_param: float = option(4, low=0, low_open=True)

  def check(self) -> None:
    if "samples" not in self.sharding:
      raise ConfigError("sharding", f"={list(self.sharding)} must include samples (layers that "
                        "cannot split weights split their samples), e.g. [samples,weights]")
    object.__setattr__(self, "sharding", tuple(n for n in SHARDING_CHOICES if n in self.sharding))

  @property
  def chooses_strategies(self) -> bool:
    """Whether a layer may take more than the samples split (the search's exact rule then
    chooses every layer's strategy: dp_jax/planner/stage_choice.py)."""
    return len(self.sharding) > 1 or self.recompute != "none"

  @property
  def grad_bytes_per_param(self) -> int:
    """Bytes per parameter of the gradient all-reduce (gradient_precision)."""
    return GRADIENT_BYTES[self.gradient_precision]

  @property
  def optimizer_bytes_per_param(self) -> int:
    """Optimizer state bytes per parameter (optimizer)."""
    return OPTIMIZER_STATE_BYTES[self.optimizer]


@dataclass(frozen=True)
class PlanOptions(PlannerConfig):
  """The planner group for one planning run: G devices (cluster.num_devices) and a global
  batch B (batch_size), every device at least one sample."""

  num_devices: int = field(default=1, kw_only=True)
  global_batch: int = field(default=1, kw_only=True)

  def check(self) -> None:
    super().check()
    for name, value in (("num_devices", self.num_devices), ("global_batch", self.global_batch)):
      if isinstance(value, np.integer):
        object.__setattr__(self, name, value := int(value))
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        key = "cluster.num_devices" if name == "num_devices" else "batch_size"
        raise UserError(f"{key}={value!r} must be an integer >= 1")
    if self.num_devices > self.global_batch:
      raise UserError(f"{self.num_devices} devices (cluster.num_devices) for a global batch of "
                      f"{self.global_batch} (batch_size): every device needs at least one "
                      "sample; use cluster.num_devices <= batch_size")

  @classmethod
  def of(cls, planner: PlannerConfig, num_devices: int, global_batch: int) -> PlanOptions:
    """`planner`'s options for G = num_devices devices and global batch B."""
    return cls(**fields_of(planner, PlannerConfig), num_devices=num_devices,
               global_batch=global_batch)


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
