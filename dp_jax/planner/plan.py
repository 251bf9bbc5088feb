"""Plan: which devices and samples every layer gets, what it is predicted to cost; JSON in/out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_jax.errors import UserError
from dp_jax.jsonfile import read_json, write_json
from dp_jax.planner.costs import Placement
from dp_jax.sharding import check_sharding, default_sharding

PLAN_SCHEMA = "dp_jax.plan/2"
SCHEMAS = ("dp_jax.plan/1", PLAN_SCHEMA)  # /1: no sharding entries (every layer samples-split)
REQUIRED = ("schema", "model", "global_batch", "num_devices", "cluster", "amplification_limit",
            "layers", "predicted", "planner_seconds")
REQUIRED_PREDICTED = ("iteration_ms", "gpu_ms", "data_parallel_iteration_ms",
                      "data_parallel_gpu_ms")


@dataclass(frozen=True)
class LayerPlan:
  """One layer: devices[i] holds the half-open sample range samples[i] of the global batch."""

  name: str
  devices: tuple[int, ...]
  samples: tuple[tuple[int, int], ...]
  extra: Mapping[str, Any] = field(default_factory=dict)  # compute_ms, sync_ms, sharding, ...

  @property
  def placement(self) -> Placement:
    return self.devices[0], len(self.devices)

  @property
  def sharding(self) -> dict[str, Any]:
    """The layer's "sharding" entry (dp_jax/sharding.py); samples on (g, 1) when it has none."""
    return dict(self.extra.get("sharding") or default_sharding(len(self.devices)))


@dataclass(frozen=True)
class Plan:
  """A burst-parallel (or data-parallel) plan, as python -m dp_jax.plan writes it."""

  model: str
  global_batch: int
  num_devices: int
  cluster: str
  amplification_limit: float
  layers: tuple[LayerPlan, ...]
  predicted: Mapping[str, float]
  planner_seconds: float
  extra: Mapping[str, Any] = field(default_factory=dict)  # stages, moves, options, frontier

  def assignment(self) -> dict[str, Placement]:
    """Layer -> (first device, count); devices must be contiguous."""
    out = {}
    for layer in self.layers:
      start, count = layer.placement
      if list(layer.devices) != list(range(start, start + count)):
        raise UserError(f"plan layer '{layer.name}' uses non-contiguous devices "
                        f"{list(layer.devices)[:8]}; the planner's cost model needs a range")
      out[layer.name] = (start, count)
    return out

  def layer(self, name: str) -> LayerPlan:
    for layer in self.layers:
      if layer.name == name:
        return layer
    raise UserError(f"plan of {self.model} has no layer '{name}'")

  # --- JSON ------------------------------------------------------------------------------

  def to_json(self) -> dict[str, Any]:
    limit = None if math.isinf(self.amplification_limit) else self.amplification_limit
    return {
        "schema": PLAN_SCHEMA, "model": self.model, "global_batch": self.global_batch,
        "num_devices": self.num_devices, "cluster": self.cluster, "amplification_limit": limit,
        "layers": [{"name": lp.name, "devices": list(lp.devices),
                    "samples": [list(s) for s in lp.samples], **dict(lp.extra)}
                   for lp in self.layers],
        "predicted": dict(self.predicted), "planner_seconds": self.planner_seconds,
        **dict(self.extra),
    }

  @classmethod
  def from_json(cls, d: Any, where: str = "plan") -> Plan:
    if not isinstance(d, dict):
      raise UserError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for key in REQUIRED:
      if key not in d:
        raise UserError(f"{where}: missing required field '{key}'")
    if d["schema"] not in SCHEMAS:
      raise UserError(f"{where}: schema '{d['schema']}' is not supported "
                      f"(expected one of {', '.join(SCHEMAS)})")
    batch = _int(d["global_batch"], f"{where}: global_batch")
    num_devices = _int(d["num_devices"], f"{where}: num_devices")
    if not isinstance(d["layers"], list) or not d["layers"]:
      raise UserError(f"{where}: 'layers' must be a non-empty list")
    if not isinstance(d["predicted"], dict):
      raise UserError(f"{where}: 'predicted' must be an object")
    for key in REQUIRED_PREDICTED:
      if key not in d["predicted"]:
        raise UserError(f"{where}: predicted is missing '{key}'")
    limit = d["amplification_limit"]
    limit = math.inf if limit is None else float(limit)
    layers = tuple(_layer(x, batch, num_devices, f"{where}: layers[{i}]", d["schema"])
                   for i, x in enumerate(d["layers"]))
    extra = {k: v for k, v in d.items() if k not in REQUIRED}
    return cls(model=str(d["model"]), global_batch=batch, num_devices=num_devices,
               cluster=str(d["cluster"]), amplification_limit=limit, layers=layers,
               predicted=dict(d["predicted"]), planner_seconds=float(d["planner_seconds"]),
               extra=extra)

  def save(self, path: str | Path) -> Path:
    return write_json(path, self.to_json())

  @classmethod
  def load(cls, path: str | Path) -> Plan:
    return cls.from_json(read_json(path, "plan"), where=str(path))


def _int(value: Any, where: str) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise UserError(f"{where} must be a positive integer, got {value!r}")
  return value


def _layer(x: Any, batch: int, num_devices: int, where: str,
           schema: str = PLAN_SCHEMA) -> LayerPlan:
  if not isinstance(x, dict):
    raise UserError(f"{where}: a layer must be an object with name, devices, samples")
  for key in ("name", "devices", "samples"):
    if key not in x:
      raise UserError(f"{where}: missing field '{key}'")
  devices, samples = x["devices"], x["samples"]
  if (not isinstance(devices, list) or not devices
      or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < num_devices
             for v in devices)):
    raise UserError(f"{where} ('{x['name']}'): devices must be a non-empty list of indices in "
                    f"[0, {num_devices})")
  if not isinstance(samples, list) or len(samples) != len(devices):
    raise UserError(f"{where} ('{x['name']}'): samples needs one [start, end] per device")
  ranges = []
  for s in samples:
    if not (isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) for v in s)):
      raise UserError(f"{where} ('{x['name']}'): each sample range must be [start, end]")
    ranges.append((s[0], s[1]))
  if "sharding" in x and schema != PLAN_SCHEMA:
    raise UserError(f"{where} ('{x['name']}'): a {schema} plan has no 'sharding'; write "
                    f"schema {PLAN_SCHEMA}")
  sharding = check_sharding(x.get("sharding"), len(devices), f"{where} ('{x['name']}')")
  m = sharding["mesh"][1]
  if any(ranges[k] != ranges[k - k % m] for k in range(len(ranges))):
    raise UserError(f"{where} ('{x['name']}'): on mesh {sharding['mesh']} the {m} devices of "
                    f"each model group need the same sample range")
  covered = sorted(ranges[::m])
  if covered[0][0] != 0 or covered[-1][1] != batch or any(
      a[1] != b[0] for a, b in zip(covered, covered[1:], strict=False)) or any(
      a >= b for a, b in covered):
    raise UserError(f"{where} ('{x['name']}'): sample ranges must tile [0, {batch}) exactly")
  extra = {k: v for k, v in x.items() if k not in ("name", "devices", "samples")}
  if "sharding" in extra:
    extra["sharding"] = sharding
  return LayerPlan(str(x["name"]), tuple(devices), tuple(ranges), extra)
