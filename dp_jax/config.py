"""Structured configs (typed schemas) of the config groups every app shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING, OmegaConf


class WandbMode(str, Enum):
  online = "online"
  offline = "offline"
  disabled = "disabled"


def _model_name(target: str) -> str:
  """The default model name: the last component of its _target_ ('pkg.vit.ViT' -> 'ViT')."""
  return str(target).rsplit(".", 1)[-1]


OmegaConf.register_new_resolver("dp_jax.model_name", _model_name, replace=True)


@dataclass
class ModelConfig:
  """A model: an importable GraphModel subclass or factory (`_target_`) and its arguments.

  The typed size options (None: the target's own default) and `kwargs` are passed to the
  target as keyword arguments, with dtype and rngs (docs/extending.md). `name` labels the
  model in graphs, plans and runs (default: the last component of `_target_`).
  """

  _target_: str = MISSING
  name: str = "${dp_jax.model_name:${._target_}}"
  image_size: int | None = None
  num_classes: int | None = None
  seq_len: int | None = None
  n_layer: int | None = None
  d_model: int | None = None
  n_head: int | None = None
  vocab_size: int | None = None
  dtype: str = "float32"
  kwargs: dict[str, Any] = field(default_factory=dict)  # the target's other arguments


@dataclass
class ClusterConfig:
  """A cluster: devices per node, nodes, device model, memory and links (see conf/cluster/)."""

  name: str = MISSING
  device: str = MISSING
  num_nodes: int = 1
  devices_per_node: int = 8
  memory_gb_per_device: float = 40.0
  intra_node_bandwidth_GBps: float = MISSING
  intra_node_latency_us: float = MISSING
  inter_node_bandwidth_GBps: float = MISSING
  inter_node_latency_us: float = MISSING
  nics_per_node: int = 0  # 0: one NIC per device
  intra_node_bus_efficiency: float = 1.0
  inter_node_bus_efficiency: float = 1.0
  collectives: str = "rail"  # rail (NCCL's rail-aligned rings) or flat (old single ring)
  inter_node_latency_per_doubling_us: float = 0.0  # per doubling of the nodes spanned beyond 2
  program_launch_us: float = 0.0  # one stage's program per step
  stage_boundary_us: float = 0.0  # host work of one stage boundary beyond its launch
  update_memory_GBps: float = 0.0  # optimizer update bandwidth; 0: the device datasheet's
  num_devices: int | None = None  # G of the job; None: every device of the cluster


class DeviceCounts(str, Enum):
  divisors = "divisors"
  powers_of_two = "powers_of_two"


class PlannerMode(str, Enum):
  fastest = "fastest"
  frontier = "frontier"


@dataclass
class PlannerConfig:
  """Burst-parallel planner options (see dp_jax/planner)."""

  name: str = "burst"
  amplification_limit: float = 2.0
  amplification_floor_ms: float = 0.3
  device_counts: DeviceCounts = DeviceCounts.divisors
  overlap_allreduce: bool = True
  mode: PlannerMode = PlannerMode.fastest
  gradient_precision: str = "fp32"  # the gradient all-reduce: fp32 or bf16 (docs/cost_model.md)
  optimizer: str = "momentum"  # sgd, momentum, adam, adamw: its state and its update are priced
  batch_norm: str = "sync"  # sync: statistics over a stage's batch (priced); local: per device
  # what a layer may split: [samples] (data parallel per layer) or [samples,weights] (also a
  # linear/conv/attention layer's weights, on a 2-D (data, model) mesh); docs/cost_model.md
  sharding: list[str] = field(default_factory=lambda: ["samples"])


class ProfileSource(str, Enum):
  measure = "measure"
  analytic = "analytic"
  deeppool_a100 = "deeppool_a100"
  file = "file"


@dataclass
class ProfileConfig:
  """Where per-layer costs come from (see dp_jax/profile)."""

  source: ProfileSource = ProfileSource.analytic
  path: str | None = None  # for source=file
  device: str | None = None  # analytic: device model; None -> the cluster's device
  dtype: str = "bfloat16"
  batches: list[int] | None = None  # None: 1, 2, 4, ... up to the global batch
  max_batch: int | None = None
  repeats: int = 5
  warmup: int = 2
  cache_dir: str = ".cache/dp_jax/profiles"
  data_dir: str | None = None  # deeppool_a100: None -> the tables shipped in dp_jax


@dataclass
class BackgroundConfig:
  """A background job packed into the devices a plan leaves idle."""

  name: str = "none"
  model: ModelConfig | None = None
  batch_per_device: int = 8
  slowdown_cap: float = 0.1
  on_failure: str = "fail"  # fail: a job that fails to start or dies fails the run; continue


@dataclass
class LoggerConfig:
  """W&B tracking: offline by default (no server here); 'disabled' turns it off."""

  mode: WandbMode = WandbMode.offline
  project: str = "dp_jax"
  entity: str | None = None
  group: str | None = None  # None: a multirun's sweep name, else no group
  job_type: str | None = None  # None: the app's name
  tags: list[str] = field(default_factory=list)
