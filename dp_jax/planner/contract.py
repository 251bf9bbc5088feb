"""The plan contract: which devices and samples every layer gets, what it is predicted to cost.

The one plan type of the planner, the simulator and the runtime, in one place: created (by the
planner, or from a layer -> devices layout: `layout_plan`), parsed and checked
(`Plan.from_json`; against a model's graph and the devices: `check_plan`, once per job), saved
and loaded (JSON schema `dp_jax.plan/2`). A Plan carries, typed, the planner options it was
made with (PlannerConfig; at its G and batch: PlanOptions), every layer's sharding
(LayerSharding) and its stages (PlanStage: the planner's, or the stage walk's where a plan
records none, filled in by check_plan); the simulator and the runtime walk those stages
(`Plan.walk`, dp_jax/planner/segments.py). No JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_jax.base.checks import fields_of
from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import read_json, write_json
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import cluster_digest, record_differences
from dp_jax.planner import segments as seg
from dp_jax.planner.options import PlannerConfig, PlanOptions
from dp_jax.planner.sharding import (
  LayerSharding,
  Strategy,
  layer_sharding,
  sample_ranges,
  splits_for,
)

if TYPE_CHECKING:
  from dp_jax.planner.costs import Placement

PLAN_SCHEMA = "dp_jax.plan/2"
SCHEMAS = ("dp_jax.plan/1", PLAN_SCHEMA)  # /1: no sharding entries (every layer samples-split)
PLACEMENT = ("model", "global_batch", "num_devices", "layers")  # what every plan has
PLANNED = ("schema", "cluster", "amplification_limit", "predicted", "planner_seconds")
REQUIRED = PLANNED[:1] + PLACEMENT + PLANNED[1:]  # a planner's plan (the plan app writes them)
TYPED = ("stages", "options")  # optional entries the Plan holds typed (not in `extra`)
REQUIRED_PREDICTED = ("iteration_ms", "gpu_ms", "data_parallel_iteration_ms",
                      "data_parallel_gpu_ms")
_LAYER_FIELDS = ("name", "devices", "samples", "sharding", "recompute")
# planner options as plans before the named options recorded them: old name -> (new, values)
_LEGACY_OPTIONS = {"grad_bytes_per_param": ("gradient_precision", {4: "fp32", 2: "bf16"}),
                   "optimizer_bytes_per_param": ("optimizer", {0: "sgd", 4: "momentum",
                                                               8: "adam"})}


def limit_label(a: float) -> str:
  """An amplification limit as written: 2.0 -> '2', inf -> 'inf'."""
  return "inf" if math.isinf(a) else f"{a:g}"


@dataclass(frozen=True)
class LayerPlan:
  """One layer: devices[i] holds the half-open sample range samples[i] of the global batch, on
  the layer's mesh with its split and state (`sharding`; None given: samples on (g, 1));
  `recompute`: its backward runs its forward again (jax.checkpoint)."""

  name: str
  devices: tuple[int, ...]
  samples: tuple[tuple[int, int], ...]
  sharding: LayerSharding = None  # type: ignore[assignment]  # set in __post_init__
  extra: Mapping[str, Any] = field(default_factory=dict)  # kind, compute_ms, sync_ms, stage, ...
  recompute: bool = False

  def __post_init__(self):
    if self.sharding is None:
      object.__setattr__(self, "sharding", LayerSharding((len(self.devices), 1)))

  @property
  def placement(self) -> Placement:
    return self.devices[0], len(self.devices)

  @property
  def mesh(self) -> tuple[int, int]:
    return self.sharding.mesh

  @property
  def split(self) -> str:
    return self.sharding.split

  @property
  def params(self) -> Mapping[str, tuple[Any, ...]]:
    return self.sharding.params

  @property
  def strategy(self) -> Strategy:
    """The layer's strategy as the planner prices it (dp_jax/planner/sharded.py)."""
    sh = self.sharding
    return Strategy(sh.mesh[1], sh.split, sh.state, self.recompute)

  def to_json(self) -> dict[str, Any]:
    """The layer's plan JSON entry (a "sharding" entry where it splits weights or shards its
    state, "recompute" where it recomputes)."""
    entry = {} if self.sharding.plain else {"sharding": self.sharding.to_json()}
    again = {"recompute": True} if self.recompute else {}
    return {"name": self.name, "devices": list(self.devices),
            "samples": [list(s) for s in self.samples], **entry, **again, **dict(self.extra)}


@dataclass(frozen=True)
class PlanStage:
  """One stage of a plan: consecutive layers on one device range, one program with one combined
  all-reduce (dp_jax/planner/segments.py), and what the planner priced it at (`extra`:
  compute_ms, sync_ms, update_ms, overhead_ms; none in a stage check_plan walked)."""

  placement: Placement
  layers: tuple[str, ...]
  extra: Mapping[str, Any] = field(default_factory=dict)

  def to_json(self) -> dict[str, Any]:
    return {"devices": list(self.placement), "layers": list(self.layers), **dict(self.extra)}


@dataclass(frozen=True)
class Plan:
  """A burst-parallel (or data-parallel) plan, as python -m dp_jax.plan writes it; a runtime
  layout (dp_jax/planner/contract.py) has only the placement: no cluster, predictions or time.

  options: the planner options it was made with (the planner group; None: a layout records
  none), `plan_options` the same at its G and batch; stages: the planner's stages in its order
  (a checked plan always has them: check_plan walks a layout's)."""

  model: str
  global_batch: int
  num_devices: int
  layers: tuple[LayerPlan, ...]
  cluster: str | None = None
  amplification_limit: float = math.inf
  predicted: Mapping[str, float] = field(default_factory=dict)
  planner_seconds: float | None = None
  options: PlannerConfig | None = None
  stages: tuple[PlanStage, ...] = ()
  extra: Mapping[str, Any] = field(default_factory=dict)  # moves, made_for, profile, ...

  def assignment(self) -> dict[str, Placement]:
    """Layer -> (first device, count); devices must be contiguous."""
    out = {}
    for layer in self.layers:
      start, count = layer.placement
      if list(layer.devices) != list(range(start, start + count)):
        raise UserError(f"plan layer '{layer.name}' uses non-contiguous devices "
                        f"{list(layer.devices)[:8]}; a layer runs on a range of devices "
                        "(first, first + 1, ...): the stage walk of planner, simulator and "
                        "runtime needs one")
      out[layer.name] = (start, count)
    return out

  @property
  def placements(self) -> dict[str, LayerPlan]:
    """Layer name -> its LayerPlan, in the plan's order."""
    return {layer.name: layer for layer in self.layers}

  def layer(self, name: str) -> LayerPlan:
    for layer in self.layers:
      if layer.name == name:
        return layer
    raise UserError(f"plan of {self.model} has no layer '{name}'")

  @property
  def plan_options(self) -> PlanOptions:
    """The planner options it was made with (the planner's defaults where it records none)
    for its G devices and global batch: what its cost model is built with."""
    return PlanOptions.of(self.options or PlannerConfig(), self.num_devices, self.global_batch)

  @property
  def stage_layers(self) -> tuple[tuple[str, ...], ...] | None:
    """Each stage's layers, in the planner's order (None: none recorded, an unchecked layout):
    what the stage walk follows (dp_jax/planner/segments.py)."""
    return tuple(s.layers for s in self.stages) or None

  def walk(self, graph: LayerGraph) -> tuple[seg.Segment, ...]:
    """The plan's segments on `graph`: its stages (the walk's own where it records none), the
    moves between them and its fork/join blocks, as planner, simulator and runtime walk it."""
    return seg.segments(graph, self.assignment(), self.stage_layers)

  @property
  def data_parallel_devices(self) -> int | None:
    """d when the plan is data parallelism on d devices (every layer on devices 0..d-1 with its
    samples split, no weight split), else None."""
    counts = {lp.devices[0] == 0 and lp.sharding.split == "samples" and len(lp.devices)
              for lp in self.layers}
    return counts.pop() if len(counts) == 1 and next(iter(counts)) else None

  def basis(self) -> str:
    """What a verdict about this plan rests on: its gradient precision, profile (source, device,
    dtype) and amplification limit, as recorded ('fp32 gradients; calibrated A100-SXM4-40GB
    mixed bf16 profile; A=2')."""
    prof = dict(self.extra.get("profile") or {})
    if prof.get("source") == "imported":  # the one importer: dp_jax/layer_times/deeppool_import.py
      prof["source"] = "DeepPool's measured"
    profile = " ".join(str(prof[k]) for k in ("source", "device", "dtype") if prof.get(k))
    a = self.amplification_limit
    precision = "fp32" if self.options is None else self.options.gradient_precision
    return (f"{precision} gradients; "
            f"{profile or 'unrecorded'} profile; A={limit_label(a)}")

  @property
  def made_for(self) -> dict[str, Any] | None:
    """What the plan was made for (model name, input shape, layers, options), if recorded."""
    made = self.extra.get("made_for")
    return dict(made) if isinstance(made, Mapping) else None

  def in_order(self, names: tuple[str, ...]) -> Plan:
    """The plan with its layers in the order of `names` (the same layers)."""
    by_name = self.placements
    return dataclasses.replace(self, layers=tuple(by_name[n] for n in names))

  # --- JSON ------------------------------------------------------------------------------

  def to_json(self) -> dict[str, Any]:
    limit = None if math.isinf(self.amplification_limit) else self.amplification_limit
    head: dict[str, Any] = {"schema": PLAN_SCHEMA, "model": self.model,
                            "global_batch": self.global_batch, "num_devices": self.num_devices}
    if self.cluster is not None:
      head["cluster"] = self.cluster
    head["amplification_limit"] = limit
    head["layers"] = [lp.to_json() for lp in self.layers]
    head["predicted"] = dict(self.predicted)
    if self.planner_seconds is not None:
      head["planner_seconds"] = self.planner_seconds
    if self.stages:
      head["stages"] = [s.to_json() for s in self.stages]
    if self.options is not None:
      head["options"] = options_json(self.options, self.num_devices, self.global_batch)
    return {**head, **dict(self.extra)}

  @classmethod
  def from_json(cls, d: Any, where: str = "plan", *, planned: bool = True) -> Plan:
    """Parse and check a plan JSON dict (one-line UserErrors naming `where` and the field).

    planned: a planner's plan, as simulate and the plan app need it (schema, cluster,
    amplification limit, predictions and planner time required); False: a placement (what
    the runtime needs; the planner's fields are still checked where present)."""
    if not isinstance(d, dict):
      raise UserError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for key in REQUIRED if planned else PLACEMENT:
      if key not in d:
        raise UserError(f"{where}: missing required field '{key}'")
    schema = d.get("schema", PLAN_SCHEMA)
    if schema not in SCHEMAS:
      raise UserError(f"{where}: schema '{schema}' is not supported "
                      f"(expected one of {', '.join(SCHEMAS)})")
    if not isinstance(d["model"], str):
      raise UserError(f"{where}: field 'model' must be a model name, got {d['model']!r}")
    batch = _int(d["global_batch"], f"{where}: global_batch")
    num_devices = _int(d["num_devices"], f"{where}: num_devices")
    cluster = d.get("cluster")
    if cluster is not None and not isinstance(cluster, str):
      raise UserError(f"{where}: field 'cluster' must be a cluster name, got {cluster!r}")
    limit = d.get("amplification_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or not limit >= 1):
      raise UserError(f"{where}: amplification_limit must be a number >= 1 or null (no "
                      f"limit), got {limit!r}")
    predicted = _predicted(d.get("predicted", {}), planned, where)
    seconds = d.get("planner_seconds")
    if seconds is not None:
      seconds = _non_negative(seconds, f"{where}: planner_seconds")
    layers = d["layers"]
    if not isinstance(layers, list) or not layers:
      raise UserError(f"{where}: 'layers' must be a non-empty list")
    parsed: list[LayerPlan] = []
    first: dict[str, int] = {}
    for i, x in enumerate(layers):
      lp = _layer(x, batch, num_devices, f"{where}: layers[{i}]", schema)
      if lp.name in first:
        raise UserError(f"{where}: layers[{i}] is a second entry for layer '{lp.name}' (first: "
                        f"layers[{first[lp.name]}]); a plan lists every layer once")
      first[lp.name] = i
      parsed.append(lp)
    stages = _stages(d.get("stages"), parsed, f"{where}: stages")
    options = _options(d.get("options"), f"{where}: options")
    extra = {k: v for k, v in d.items() if k not in REQUIRED + TYPED}
    return cls(model=d["model"], global_batch=batch, num_devices=num_devices,
               layers=tuple(parsed), cluster=cluster,
               amplification_limit=math.inf if limit is None else float(limit),
               predicted=predicted, planner_seconds=seconds, options=options, stages=stages,
               extra=extra)

  def save(self, path: str | Path) -> Path:
    return write_json(path, self.to_json())

  @classmethod
  def load(cls, path: str | Path, *, planned: bool = True) -> Plan:
    return cls.from_json(read_json(path, "plan"), where=str(path), planned=planned)


def as_plan(plan: Any, where: str = "plan") -> Plan:
  """`plan` as a Plan: a Plan itself, or a plan JSON dict parsed as a placement."""
  if isinstance(plan, Plan):
    return plan
  if not isinstance(plan, Mapping):
    raise UserError(f"a plan must be a JSON object (schema {PLAN_SCHEMA}), "
                    f"got {type(plan).__name__}")
  return Plan.from_json(dict(plan), where, planned=False)


def _int(value: Any, where: str) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise UserError(f"{where} must be a positive integer, got {value!r}")
  return value


def _non_negative(value: Any, where: str) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
    raise UserError(f"{where} must be a number >= 0, got {value!r}")
  return float(value)


def _predicted(p: Any, planned: bool, where: str) -> dict[str, Any]:
  if not isinstance(p, dict):
    raise UserError(f"{where}: 'predicted' must be an object")
  for key in REQUIRED_PREDICTED:
    if key in p:
      _non_negative(p[key], f"{where}: predicted.{key}")
    elif planned:
      raise UserError(f"{where}: predicted is missing '{key}'")
  return dict(p)


def _layer(x: Any, batch: int, num_devices: int, where: str, schema: str) -> LayerPlan:
  if not isinstance(x, dict):
    raise UserError(f"{where}: a layer must be an object with name, devices, samples")
  for key in ("name", "devices"):
    if key not in x:
      raise UserError(f"{where}: missing field '{key}'")
  name, devices = x["name"], x["devices"]
  if not isinstance(name, str):
    raise UserError(f"{where}: field 'name' must be a layer name, got {name!r}")
  at = f"{where}: layer '{name}'"
  if (not isinstance(devices, list) or not devices
      or any(isinstance(v, bool) or not isinstance(v, int) for v in devices)):
    raise UserError(f"{at}: 'devices' must be a non-empty list of device indices in "
                    f"[0, {num_devices})")
  bad = [v for v in devices if not 0 <= v < num_devices]
  if bad:
    raise UserError(f"{at} uses device {bad[0]}, outside the plan's {num_devices} devices "
                    f"(valid: 0..{num_devices - 1})")
  if len(set(devices)) != len(devices):
    raise UserError(f"{at} lists a device twice: {devices}")
  if "sharding" in x and schema != PLAN_SCHEMA:
    raise UserError(f"{at}: a {schema} plan has no 'sharding'; write schema {PLAN_SCHEMA}")
  sharding = LayerSharding.from_json(x.get("sharding"), len(devices), at)
  recompute = x.get("recompute", False)
  if not isinstance(recompute, bool):
    raise UserError(f"{at}: 'recompute' must be true or false, got {recompute!r}")
  d, m = sharding.mesh
  groups = d * m if sharding.split == "experts" else d  # distinct sample ranges
  if batch % groups:
    raise UserError(f"{at} splits global batch {batch} over {groups} devices; "
                    f"the batch must be divisible by every layer's data-axis size")
  want = sample_ranges(batch, d, m, sharding.split)
  ranges = want if x.get("samples") is None else _ranges(x["samples"], len(devices), at)
  share = m if groups == d else 1  # devices that share one range
  if any(ranges[k] != ranges[k - k % share] for k in range(len(ranges))):
    raise UserError(f"{at}: on mesh {list(sharding.mesh)} the {m} devices of each model group "
                    f"need the same sample range")
  covered = sorted(ranges[::share])
  if covered[0][0] != 0 or covered[-1][1] != batch or any(
      a[1] != b[0] for a, b in zip(covered, covered[1:], strict=False)) or any(
      a >= b for a, b in covered):
    raise UserError(f"{at}: sample ranges must tile [0, {batch}) exactly")
  if ranges != want:
    raise UserError(f"{at}: samples must be equal contiguous ranges in device order, the same "
                    f"within each model group of {m}, e.g. {[list(r) for r in want[:2]]}")
  for key, value in x.items():
    if key.endswith("_ms") and value is not None:
      _non_negative(value, f"{at}: {key}")
  extra = {k: v for k, v in x.items() if k not in _LAYER_FIELDS}
  return LayerPlan(name, tuple(devices), tuple(ranges), sharding, extra, recompute)


def _stages(stages: Any, layers: list[LayerPlan], where: str) -> tuple[PlanStage, ...]:
  """A plan's "stages" entry: each stage's devices [first, count] and layers, every layer in
  one stage on exactly those devices (the walk is checked against the graph by check_plan)."""
  if stages is None:
    return ()
  if not isinstance(stages, list) or not stages:
    raise UserError(f"{where} must be a non-empty list of stages ({{devices: [first, count], "
                    f"layers: [...]}}), or left out")
  devices_of = {lp.name: lp.devices for lp in layers}
  out, seen = [], {}
  for i, st in enumerate(stages):
    at = f"{where}[{i}]"
    if not isinstance(st, dict) or not isinstance(st.get("layers"), (list, tuple)) or not st[
        "layers"]:
      raise UserError(f"{at} must be an object with devices [first, count] and a non-empty "
                      "list of layers")
    dev = st.get("devices")
    if not (isinstance(dev, (list, tuple)) and len(dev) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in dev) and dev[0] >= 0
            and dev[1] >= 1):
      raise UserError(f"{at}: devices must be [first, count], got {dev!r}")
    for name in st["layers"]:
      if name not in devices_of:
        raise UserError(f"{at} lists layer {name!r}, which the plan does not place")
      if name in seen:
        raise UserError(f"{at} lists layer '{name}' again (first: stage {seen[name]})")
      seen[name] = i
      if devices_of[name] != tuple(range(dev[0], dev[0] + dev[1])):
        raise UserError(f"{at} is on devices {dev[0]}..{dev[0] + dev[1] - 1} but its layer "
                        f"'{name}' is on {list(devices_of[name])[:8]}; remove 'stages' to have "
                        "them walked from the layers, or make the plan again")
    out.append(PlanStage((dev[0], dev[1]), tuple(st["layers"]),
                         {k: v for k, v in st.items() if k not in ("devices", "layers")}))
  missing = [lp.name for lp in layers if lp.name not in seen]
  if missing:
    raise UserError(f"{where} leave out layer(s) {', '.join(missing[:3])}; every layer is in "
                    "one stage")
  return tuple(out)


def _options(options: Any, where: str) -> PlannerConfig | None:
  """A plan's "options" entry, typed (None when it records none; its num_devices and
  global_batch are the plan's own); plans written before the named options give them by bytes
  (_LEGACY_OPTIONS), and options no longer known are left out."""
  if options is None:
    return None
  if not isinstance(options, Mapping):
    raise UserError(f"{where} must be an object of planner options")
  names = {f.name for f in dataclasses.fields(PlannerConfig) if f.init}
  kw = {k: v for k, v in options.items() if k in names}
  for old, (new, values) in _LEGACY_OPTIONS.items():
    if old in options and new not in options:
      if options[old] not in values:
        raise UserError(f"{where}: {old}={options[old]!r} has no {new} (valid: "
                        f"{', '.join(str(k) for k in values)}); make the plan again")
      kw[new] = values[options[old]]
  if kw.get("amplification_limit", 0) is None:
    kw["amplification_limit"] = math.inf
  try:
    return PlannerConfig(**kw)
  except UserError as e:
    raise UserError(f"{where}: {e}") from None


def planner_config(options: PlannerConfig) -> PlannerConfig:
  """The planner group of `options` (PlanOptions without its G and batch: a Plan's options)."""
  return PlannerConfig(**fields_of(options, PlannerConfig))


def options_json(options: PlannerConfig, num_devices: int, global_batch: int) -> dict[str, Any]:
  """A plan's "options" entry: every PlanOptions field, the planner group's then G and the
  batch (no limit: null; lists for tuples)."""
  return {**{f.name: _json_value(getattr(options, f.name))
             for f in dataclasses.fields(PlannerConfig) if f.init},
          "num_devices": num_devices, "global_batch": global_batch}


def _json_value(v: Any) -> Any:
  if isinstance(v, float) and math.isinf(v):
    return None
  return list(v) if isinstance(v, tuple) else v


def _ranges(samples: Any, count: int, where: str) -> list[tuple[int, int]]:
  if not isinstance(samples, list) or len(samples) != count:
    raise UserError(f"{where}: samples needs one [start, end] per device")
  out = []
  for s in samples:
    if not (isinstance(s, list) and len(s) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in s)):
      raise UserError(f"{where}: each sample range must be [start, end], two integers >= 0")
    out.append((s[0], s[1]))
  return out


# --- what a plan was made for --------------------------------------------------------------


def recorded(plan: Plan, *, model: Mapping[str, Any] | None, cluster: Mapping[str, Any] | None,
             profile: Mapping[str, Any]) -> Plan:
  """The plan with what it was made for: the model (`made_for`: name, input shape, layers,
  options; ModelConfig.record), the cluster (`cluster_config`: its fields and G) and the profile
  (source, device, precision, extrapolated batches, the calibration it rests on)."""
  return dataclasses.replace(plan, extra={**plan.extra, "made_for": dict(model or {}) or None,
                                          "cluster_config": None if cluster is None else
                                          dict(cluster), "profile": dict(profile)})


def model_record(graph: LayerGraph, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """What a plan was made for: the model's name, per-sample input shape, layer count and size
  options (none known for a graph file)."""
  return {"name": graph.model, "input_shape": list(graph.input_shape),
          "layers": len(graph.nodes), "options": dict(options or {})}


def check_made_for(plan: Plan, record: Mapping[str, Any], where: str,
                   cluster: Mapping[str, Any] | None = None) -> None:
  """Refuse a plan recorded as made for another model config, or (`cluster`: the record of the
  cluster it is used on, hardware.cluster.to_record) for a cluster of other content: the digest
  of every number, not the name (one line naming what differs)."""
  made_cluster = plan.extra.get("cluster_config")
  if cluster is not None and isinstance(made_cluster, Mapping) and (
      cluster_digest(made_cluster) != cluster_digest(cluster)):
    differs = record_differences(made_cluster, cluster)
    more = f" and {len(differs) - 3} more" if len(differs) > 3 else ""
    raise UserError(f"{where} was made for cluster {made_cluster.get('name')} with other numbers "
                    f"than cluster {cluster.get('name')} here: {'; '.join(differs[:3])}{more}; "
                    "use the cluster file it was made for, or make a plan for this cluster")
  made = plan.made_for
  if made is None:
    return  # a plan from before plans recorded it: the layer names are still checked
  keys = ["name", "input_shape", "layers"]
  differs = [k for k in keys if k in made and k in record and made[k] != record[k]]
  ours, theirs = record.get("options", {}), made.get("options") or {}
  differs += [f"options.{k}" for k in ours if k in theirs and ours[k] != theirs[k]]
  if differs:
    raise UserError(f"{where} was made for {describe_record(made)}, not "
                    f"{describe_record(record)}; use the model options it was made with or "
                    "make a plan for this model")


def describe_record(record: Mapping[str, Any]) -> str:
  """'vgg16 (input 32x32x3, 22 layers, image_size=32)'."""
  shape = "x".join(map(str, record.get("input_shape") or [])) or "?"
  opts = "".join(f", {k}={v}" for k, v in sorted((record.get("options") or {}).items()))
  return f"{record.get('name')} (input {shape}, {record.get('layers')} layers{opts})"


# --- checked against a model and its devices ---------------------------------------------


def plan_dict(plan: Any) -> dict[str, Any]:
  """The plan as a JSON dict (accepts a dict or a Plan), for writing and sending."""
  if isinstance(plan, Mapping):
    return dict(plan)
  return as_plan(plan).to_json()


def check_plan(plan: Any, graph: LayerGraph, *, available_devices: int,
               global_batch: int | None = None) -> Plan:
  """`plan` (a Plan or plan JSON) checked for `graph` on `available_devices`, its layers in
  graph order and its stages recorded (the stage walk's where it records none; recorded ones
  must be runs the walk makes: dp_jax/planner/segments.py); raise UserError on the first
  problem. A job does this once, at its edge; what it returns is what the simulator and the
  runtime take."""
  p = as_plan(plan)
  if p.model != graph.model:
    raise UserError(f"plan is for model '{p.model}' but the model is '{graph.model}'; "
                    f"make a plan for {graph.model}")
  batch, g = p.global_batch, p.num_devices
  if global_batch is not None and global_batch != batch:
    raise UserError(f"plan was made for global batch {batch} but the batch size is "
                    f"{global_batch}; set batch_size={batch} or make a plan for {global_batch}")
  if g > available_devices:
    raise UserError(f"plan needs {g} devices but only {available_devices} are available; "
                    f"make a plan for {available_devices} devices or add devices")
  _check_names([lp.name for lp in p.layers], graph)
  for lp in p.layers:
    node = graph.node(lp.name)
    m = lp.mesh[1]
    if lp.split not in splits_for(node, m):
      raise UserError(f"plan layer '{lp.name}' ({node.kind}) cannot use split '{lp.split}' on "
                      f"a model axis of {m}")
  return _walked(p.in_order(graph.names), graph)


def _walked(p: Plan, graph: LayerGraph) -> Plan:
  """`p` with its stages: the recorded ones, checked to be the runs the stage walk makes of
  them (one run each, in the walk's order), or the walk's own."""
  walked = seg.walk_stages(p.walk(graph))  # p.assignment(): contiguous device ranges
  if not p.stages:
    return dataclasses.replace(p, stages=tuple(PlanStage(s.placement, s.layers)
                                               for s in walked))
  for i, (mine, run) in enumerate(zip(p.stages, walked, strict=False)):  # both cover every layer
    if mine.layers != run.layers:
      raise UserError(f"plan stage {i} ({', '.join(mine.layers[:3])}"
                      f"{', ...' if len(mine.layers) > 3 else ''}) is not one run of consecutive "
                      f"layers on its devices in {graph.model} (the walk gives "
                      f"{', '.join(run.layers[:3])}{', ...' if len(run.layers) > 3 else ''}); "
                      "remove 'stages' to have them walked from the layers, or make the plan "
                      "again")
  return p


def _check_names(names: list[str], graph: LayerGraph) -> None:
  seen = set(names)
  missing = [n for n in graph.names if n not in seen]
  unknown = [n for n in names if n not in set(graph.names)]
  if missing or unknown:
    parts = []
    for label, items in (("missing", missing), ("unknown", unknown)):
      if items:
        more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
        parts.append(f"{label}: {', '.join(map(str, items[:3]))}{more}")
    raise UserError(f"plan layers do not match model {graph.model} ({'; '.join(parts)}); "
                    f"make the plan for this model and size")


# --- plans from a layout (tests, benchmarks, baselines) ---------------------------------

Layout = Mapping[str, Sequence[int]] | Callable[[str], Sequence[int]]
# layer -> ((d, m), split[, state[, recompute]]): a layout's per-layer strategy
Shardings = Mapping[str, tuple[Any, ...]]


def layout_plan(graph: LayerGraph, layout: Layout, *, global_batch: int,
                num_devices: int, shardings: Shardings | None = None) -> dict[str, Any]:
  """A plan placing each layer on its listed devices; a layer in `shardings` runs on its
  (d, m) mesh with its split, state and recompute (samples: device k gets range k // m of d
  equal ranges; experts: range k of d m), the others split samples in equal contiguous
  ranges."""
  devices_of = layout if callable(layout) else layout.__getitem__
  shardings = shardings or {}
  layers = []
  for name in graph.names:
    devs = [int(d) for d in devices_of(name)]
    layer: dict[str, Any] = {"name": name, "devices": devs}
    mesh, split, state, recompute = (*shardings.get(name, ((len(devs), 1), "samples")),
                                     "replicated", False)[:4]
    ranges = sample_ranges(global_batch, *mesh, split)
    layer["samples"] = [list(r) for r in ranges]
    if split != "samples" or state != "replicated":
      entry = layer_sharding(graph.node(name), mesh, split, state)
      layer["sharding"] = entry if state != "replicated" else {
          k: v for k, v in entry.items() if k != "state"}
    if recompute:
      layer["recompute"] = True
    layers.append(layer)
  return {"schema": PLAN_SCHEMA, "model": graph.model, "global_batch": global_batch,
          "num_devices": num_devices, "layers": layers, "predicted": {}}


def data_parallel_layout_plan(graph: LayerGraph, *, global_batch: int,
                              num_devices: int) -> dict[str, Any]:
  """Every layer on every device: plain data parallelism (one stage)."""
  return layout_plan(graph, lambda _: range(num_devices), global_batch=global_batch,
                     num_devices=num_devices)


def staged_data_parallel_plan(graph: LayerGraph, stages: int, width: int, *, global_batch: int,
                              alternate: bool = False) -> dict[str, Any]:
  """Data parallelism cut into `stages` runs of consecutive layers (0 or more than the layers:
  one per layer), stage j on plan devices j*width .. j*width + width - 1 (with `alternate`,
  odd stages on j*width only). Run on devices * stages (plan device i is device i mod width),
  every stage uses the same devices, or alternates between all and the first."""
  names = graph.names
  k = len(names) if stages <= 0 else min(stages, len(names))
  stage = {n: i * k // len(names) for i, n in enumerate(names)}
  used = {n: 1 if alternate and stage[n] % 2 else width for n in names}
  return layout_plan(graph, {n: range(stage[n] * width, stage[n] * width + used[n])
                             for n in names},
                     global_batch=global_batch, num_devices=k * width)
