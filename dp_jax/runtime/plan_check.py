"""Check a plan (Plan JSON dict) against a model's graph and the local devices, one-line errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dp_jax.errors import UserError
from dp_jax.graph import LayerGraph, LayerNode
from dp_jax.sharding import check_sharding, sample_ranges, splits_for

PLAN_SCHEMA = "dp_jax.plan/2"
SCHEMAS = ("dp_jax.plan/1", PLAN_SCHEMA)  # /1: every layer samples-split on (g, 1)


@dataclass(frozen=True)
class LayerPlacement:
  """Where and how a layer runs: plan device indices (device k = mesh position (k // m, k % m)),
  its (data, model) mesh, split and parameter specs (path -> PartitionSpec as a JSON list)."""

  name: str
  devices: tuple[int, ...]
  mesh: tuple[int, int] = (0, 0)  # (0, 0): (len(devices), 1)
  split: str = "samples"
  params: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

  def __post_init__(self):
    if self.mesh == (0, 0):
      object.__setattr__(self, "mesh", (len(self.devices), 1))


@dataclass(frozen=True)
class CheckedPlan:
  """A plan known to fit the model and the devices: placements in graph order."""

  model: str
  global_batch: int
  num_devices: int
  placements: Mapping[str, LayerPlacement]


def plan_dict(plan: Any) -> dict[str, Any]:
  """The plan as a JSON dict (accepts a dict or an object with to_json())."""
  if hasattr(plan, "to_json"):
    plan = plan.to_json()
  if not isinstance(plan, Mapping):
    raise UserError(f"a plan must be a JSON object (schema {PLAN_SCHEMA}), "
                    f"got {type(plan).__name__}")
  return dict(plan)


def check_plan(plan: Any, graph: LayerGraph, *, available_devices: int,
               global_batch: int | None = None) -> CheckedPlan:
  """Validate `plan` for `graph` on `available_devices`; raise UserError on the first problem."""
  p = plan_dict(plan)
  schema = p.get("schema", PLAN_SCHEMA)
  if schema not in SCHEMAS:
    raise UserError(f"plan schema '{schema}' is not supported (expected one of "
                    f"{', '.join(SCHEMAS)})")
  for key in ("model", "global_batch", "num_devices", "layers"):
    if key not in p:
      raise UserError(f"plan is missing required field '{key}'")
  if p["model"] != graph.model:
    raise UserError(f"plan is for model '{p['model']}' but the model is '{graph.model}'; "
                    f"make a plan for {graph.model}")
  batch, g = p["global_batch"], p["num_devices"]
  if not _is_pos_int(batch) or not _is_pos_int(g):
    raise UserError(f"plan global_batch ({batch!r}) and num_devices ({g!r}) must be positive "
                    "integers")
  if global_batch is not None and global_batch != batch:
    raise UserError(f"plan was made for global batch {batch} but the batch size is "
                    f"{global_batch}; set batch_size={batch} or make a plan for {global_batch}")
  if g > available_devices:
    raise UserError(f"plan needs {g} devices but only {available_devices} are available; "
                    f"make a plan for {available_devices} devices or add devices")
  layers = p["layers"]
  if not isinstance(layers, list) or not all(isinstance(x, Mapping) for x in layers):
    raise UserError("plan 'layers' must be a list of objects with name, devices and samples")
  _check_names([x.get("name") for x in layers], graph)
  if schema != PLAN_SCHEMA and any("sharding" in x for x in layers):
    raise UserError(f"a {schema} plan has no layer 'sharding'; write schema {PLAN_SCHEMA}")
  placements = {x["name"]: _placement(x, batch, g, graph.node(x["name"])) for x in layers}
  return CheckedPlan(graph.model, batch, g, {n: placements[n] for n in graph.names})


def _is_pos_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _check_names(names: list[Any], graph: LayerGraph) -> None:
  want = set(graph.names)
  seen: set[Any] = set()
  dups = [n for n in names if n in seen or seen.add(n)]
  missing = [n for n in graph.names if n not in seen]
  unknown = [n for n in names if n not in want]
  if dups or missing or unknown:
    parts = []
    for label, items in (("missing", missing), ("unknown", unknown), ("duplicated", dups)):
      if items:
        more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
        parts.append(f"{label}: {', '.join(map(str, items[:3]))}{more}")
    raise UserError(f"plan layers do not match model {graph.model} ({'; '.join(parts)}); "
                    f"make the plan for this model and size")


def _placement(layer: Mapping[str, Any], batch: int, num_devices: int,
               node: LayerNode) -> LayerPlacement:
  name, devices, samples = layer["name"], layer.get("devices"), layer.get("samples")
  if not isinstance(devices, list) or not devices or not all(_is_int(d) for d in devices):
    raise UserError(f"plan layer '{name}': 'devices' must be a non-empty list of device indices")
  if len(set(devices)) != len(devices):
    raise UserError(f"plan layer '{name}' lists a device twice: {devices}")
  bad = [d for d in devices if not 0 <= d < num_devices]
  if bad:
    raise UserError(f"plan layer '{name}' uses device {bad[0]}, outside the plan's "
                    f"{num_devices} devices (valid: 0..{num_devices - 1})")
  sharding = check_sharding(layer.get("sharding"), len(devices), f"plan layer '{name}'")
  (d, m), split = sharding["mesh"], sharding["split"]
  if split not in splits_for(node, m):
    raise UserError(f"plan layer '{name}' ({node.kind}) cannot use split '{split}' on a model "
                    f"axis of {m}")
  if batch % d:
    raise UserError(f"plan layer '{name}' splits global batch {batch} over {d} devices; "
                    f"the batch must be divisible by every layer's data-axis size")
  want = [list(r) for r in sample_ranges(batch, d, m)]
  if samples is not None and not (isinstance(samples, list) and all(
      isinstance(s, (list, tuple)) for s in samples) and [list(s) for s in samples] == want):
    raise UserError(f"plan layer '{name}': samples must be equal contiguous ranges in device "
                    f"order, the same within each model group of {m}, e.g. {want[:2]}, "
                    f"got {str(samples)[:40]}")
  params = {k: tuple(tuple(e) if isinstance(e, list) else e for e in v)
            for k, v in sharding["params"].items()}
  return LayerPlacement(name, tuple(devices), (d, m), split, params)


def _is_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)
