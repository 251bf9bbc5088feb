"""Structured configs (typed schemas) of the config groups every app shares."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from dp_jax.base.errors import UserError


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
  """A cluster: devices per node, nodes, device model, memory and links (see conf/cluster/).

  Every physical number is required: each cluster file states it with its source. The three
  defaults are definitions, not measurements: one node; nics_per_node 0 meaning one NIC per
  device (the DGX A100 / H100 datasheets' layout: one InfiniBand port per GPU); collectives
  `rail`, the rings NCCL builds on such nodes (docs/cost_model.md, "Collectives and moves").
  dp_jax.hardware.cluster.load_cluster refuses physically implausible values (a unit mix-up).
  """

  name: str = MISSING
  device: str = MISSING
  num_nodes: int = 1
  devices_per_node: int = MISSING
  memory_gb_per_device: float = MISSING
  intra_node_bandwidth_GBps: float = MISSING
  intra_node_latency_us: float = MISSING
  inter_node_bandwidth_GBps: float = MISSING
  inter_node_latency_us: float = MISSING
  nics_per_node: int = 0  # 0: one NIC per device
  intra_node_bus_efficiency: float = MISSING
  inter_node_bus_efficiency: float = MISSING
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
  calibrated = "calibrated"
  measure = "measure"
  analytic = "analytic"
  deeppool_a100 = "deeppool_a100"
  file = "file"


@dataclass
class ProfileConfig:
  """Where per-layer costs come from (see dp_jax/layer_times)."""

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
  # a profile of another device than the cluster's is refused; true: accepted on purpose (the
  # plan's `profile.other_device` records it)
  allow_other_device: bool = False


@dataclass
class BackgroundConfig:
  """A background job packed into the devices a plan leaves idle."""

  name: str = "none"
  model: ModelConfig | None = None
  batch_per_device: int = 8
  slowdown_cap: float = 0.1
  on_failure: str = "fail"  # fail: a job that fails to start or dies fails the run; continue


class FillPolicy(str, Enum):
  fit = "fit"  # the multiplexing policy of dp_jax/multiplex/policy.py (the runtime's)


@dataclass
class InterferenceConfig:
  """How background pieces interact with the foreground (docs/simulator.md)."""

  policy: FillPolicy = FillPolicy.fit
  piece_ms: float = 0.5  # DeepPool's be_graph_split_ms
  switch_us: float | None = None  # None: the device's per-kernel overhead (profile/devices.py)


@dataclass
class LoggerConfig:
  """W&B tracking: offline by default (no server here); 'disabled' turns it off."""

  mode: WandbMode = WandbMode.offline
  project: str = "dp_jax"
  entity: str | None = None
  group: str | None = None  # None: a multirun's sweep name, else no group
  job_type: str | None = None  # None: the app's name
  tags: list[str] = field(default_factory=list)


# --- every key of a composed config known to its schema ---------------------------------------


def check_known_keys(cfg: Any, schema: type, where: str = "") -> None:
  """Raise a one-line UserError for the first key of `cfg` that `schema` does not declare.

  Walks the composed config beside the dataclass: `+key=...` additions and keys a group file
  adds are checked the same way. Only fields typed as a mapping (dict) are open.
  """
  kind = _unwrap(schema)
  if kind is None:
    return
  if isinstance(cfg, DictConfig) and dataclasses.is_dataclass(kind):
    hints = typing.get_type_hints(kind)
    valid = [f.name for f in dataclasses.fields(kind)]
    for key in cfg.keys():
      name = f"{where}{key}"
      if key not in hints:
        raise UserError(_unknown_key_message(str(key), name, valid, where))
      check_known_keys(cfg._get_node(key), hints[key], f"{name}.")
  elif isinstance(cfg, ListConfig) and typing.get_origin(kind) is list:
    (item,) = typing.get_args(kind) or (Any,)
    for i in range(len(cfg)):
      check_known_keys(cfg._get_node(i), item, f"{where.rstrip('.')}[{i}].")


def _unwrap(t: Any) -> Any:
  """The type a field holds (X of `X | None`); None for open types (Any, dict)."""
  if t is Any or t is dict or typing.get_origin(t) is dict:
    return None
  if typing.get_origin(t) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return _unwrap(args[0]) if len(args) == 1 else None
  return t


def _unknown_key_message(key: str, name: str, valid: list[str], where: str) -> str:
  near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
  if near:
    hint = f"did you mean {where}{near[0]}?"
  else:
    hint = f"valid keys{' under ' + where.rstrip('.') if where else ''}: {', '.join(valid)}"
  return f"unknown option {name} ({hint})"


def check_required(cfg: Any) -> None:
  """Raise a one-line UserError naming the first required option the composed config lacks."""
  missing = sorted(OmegaConf.missing_keys(cfg))
  if not missing:
    return
  key = missing[0]
  group = key.split(".")[0]
  name = OmegaConf.select(cfg, f"{group}.name", default=None, throw_on_missing=False)
  if group == "cluster":
    raise UserError(f"cluster {name}: {key.split('.', 1)[1]} is required (a cluster file states "
                    "every number with its source; see conf/cluster/ and docs/cost_model.md)")
  raise UserError(f"{key} is required: set {key}=...")
