"""Per-layer sharding (v1): a layer's 2-D mesh (data, model), its split and its PartitionSpecs.

A layer on g devices runs on a mesh (d, m), d * m = g: device (i, j) is device start + i*m + j
of its range and holds sample range i of d. The split says what the "model" axis divides:
  samples  m = 1; parameters replicated (today's only choice)
  out      linear / conv2d / lm_head: output features / output channels / vocabulary
  in       linear: input features
  heads    transformer_block: attention heads and the MLP hidden dimension (Megatron pairing
           inside the block; layer norms replicated)
Specs are PartitionSpecs as JSON lists (entry: null | axis name | list of axis names); a
parameter not listed is replicated. At layer boundaries activations are sharded over "data"
on the batch dimension and replicated over "model" (input and output spec ["data"]).
Pure Python (no JAX), shared by the planner and the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerNode

SPLITS = ("samples", "out", "in", "heads")
AXES = ("data", "model")
DATA, MODEL = AXES
BOUNDARY_SPEC: list[Any] = [DATA]  # activations between layers: batch over "data"

Spec = list[Any]


def splits_for(node: LayerNode, m: int) -> tuple[str, ...]:
  """The splits `node` allows on a model axis of m devices (("samples",) when m == 1)."""
  if m < 1:
    raise UserError(f"layer '{node.name}': model axis size {m} must be at least 1")
  if m == 1:
    return ("samples",)
  a = node.attrs
  out: list[str] = []
  if node.kind == "linear":
    if _divides(m, a.get("out_features")):
      out.append("out")
    if _divides(m, a.get("in_features")):
      out.append("in")
  elif node.kind == "conv2d" and _divides(m, a.get("out_channels")):
    out.append("out")
  elif node.kind == "lm_head" and _divides(m, a.get("vocab_size")):
    out.append("out")
  elif node.kind == "transformer_block" and _divides(m, a.get("n_head")):
    out.append("heads")
  return tuple(out)


def layer_sharding(node: LayerNode, mesh: tuple[int, int], split: str) -> dict[str, Any]:
  """The plan JSON's "sharding" entry of `node` on mesh (d, m) with `split`."""
  d, m = (int(v) for v in mesh)
  if d < 1 or m < 1:
    raise UserError(f"layer '{node.name}': mesh {[d, m]} needs two positive sizes")
  if split not in SPLITS:
    raise UserError(f"layer '{node.name}': split '{split}' is unknown (valid: {', '.join(SPLITS)})")
  allowed = splits_for(node, m)
  if split not in allowed:
    raise UserError(f"layer '{node.name}' ({node.kind}) cannot use split '{split}' on a model "
                    f"axis of {m} (allowed: {', '.join(allowed) or 'none'})")
  return {"mesh": [d, m], "axes": list(AXES), "split": split,
          "params": param_specs(node.kind, node.attrs, split),
          "input": list(BOUNDARY_SPEC), "output": list(BOUNDARY_SPEC)}


def param_specs(kind: str, attrs: Mapping[str, Any], split: str) -> dict[str, Spec]:
  """Spec of each split parameter (and statistic) path of a layer; unlisted = replicated."""
  if split == "samples":
    return {}
  if kind == "linear" and split == "out":
    return {"kernel": [None, MODEL], **({"bias": [MODEL]} if attrs.get("bias", True) else {})}
  if kind == "linear" and split == "in":
    return {"kernel": [MODEL, None]}
  if kind == "conv2d" and split == "out":
    if attrs.get("batch_norm"):
      return {"conv/kernel": [None, None, None, MODEL], "bn/scale": [MODEL],
              "bn/bias": [MODEL], "bn/mean": [MODEL], "bn/var": [MODEL]}
    return {"conv/kernel": [None, None, None, MODEL], "conv/bias": [MODEL]}
  if kind == "lm_head" and split == "out":
    return {"wte": [MODEL, None]}
  if kind == "transformer_block" and split == "heads":
    return {"attn/c_attn/kernel": [None, MODEL], "attn/c_attn/bias": [MODEL],
            "attn/c_proj/kernel": [MODEL, None],
            "mlp/c_fc/kernel": [None, MODEL], "mlp/c_fc/bias": [MODEL],
            "mlp/c_proj/kernel": [MODEL, None]}
  raise UserError(f"a {kind} layer has no split '{split}'")


def default_sharding(num_devices: int) -> dict[str, Any]:
  """The entry of a layer without one: samples on (g, 1), every parameter replicated."""
  return {"mesh": [num_devices, 1], "axes": list(AXES), "split": "samples", "params": {},
          "input": list(BOUNDARY_SPEC), "output": list(BOUNDARY_SPEC)}


def sample_ranges(batch: int, d: int, m: int) -> list[tuple[int, int]]:
  """Sample range of each device k of a (d, m) mesh: range k // m of d equal ranges."""
  per = batch // d
  return [((k // m) * per, (k // m + 1) * per) for k in range(d * m)]


def check_sharding(entry: Any, count: int, where: str) -> dict[str, Any]:
  """A layer's "sharding" entry checked for a layer on `count` devices (one-line UserErrors);
  None is samples on (count, 1). Returns the entry with its defaults filled in."""
  if entry is None:
    return default_sharding(count)
  if not isinstance(entry, Mapping):
    raise UserError(f"{where}: 'sharding' must be an object with mesh, split and params")
  mesh = entry.get("mesh")
  if not (isinstance(mesh, list) and len(mesh) == 2 and all(_pos_int(v) for v in mesh)):
    raise UserError(f"{where}: sharding mesh must be [data, model], two positive integers, "
                    f"got {mesh!r}")
  d, m = mesh
  if d * m != count:
    raise UserError(f"{where}: sharding mesh {mesh} has {d * m} devices but the layer has "
                    f"{count}")
  if list(entry.get("axes", AXES)) != list(AXES):
    raise UserError(f"{where}: sharding axes must be {list(AXES)}, got {entry.get('axes')!r}")
  split = entry.get("split")
  if split not in SPLITS:
    raise UserError(f"{where}: sharding split {split!r} is unknown (valid: {', '.join(SPLITS)})")
  if (split == "samples") != (m == 1):
    raise UserError(f"{where}: split '{split}' needs a model axis "
                    f"{'of 1' if split == 'samples' else 'above 1'}, got mesh {mesh}")
  params = entry.get("params", {})
  if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
    raise UserError(f"{where}: sharding params must map parameter paths to specs")
  for key, spec in params.items():
    _check_spec(spec, f"{where}: sharding params '{key}'")
  for key in ("input", "output"):
    if list(entry.get(key, BOUNDARY_SPEC)) != BOUNDARY_SPEC:
      raise UserError(f"{where}: sharding {key} must be {BOUNDARY_SPEC} (activations between "
                      f"layers are split by samples only), got {entry.get(key)!r}")
  return {"mesh": [d, m], "axes": list(AXES), "split": split,
          "params": {k: list(v) for k, v in params.items()},
          "input": list(BOUNDARY_SPEC), "output": list(BOUNDARY_SPEC)}


@dataclass(frozen=True)
class LayerSharding:
  """A layer's plan entry, typed: its (data, model) mesh, split and parameter specs (path ->
  PartitionSpec entries: None | axis | tuple of axes); the one sharding type of planner,
  simulator and runtime."""

  mesh: tuple[int, int]
  split: str = "samples"
  params: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

  @property
  def weights(self) -> tuple[int, str] | None:
    """(m, split) of a weight sharding, as the planner prices it; None when samples."""
    return None if self.split == "samples" else (self.mesh[1], self.split)

  def to_json(self) -> dict[str, Any]:
    """The plan JSON's "sharding" entry."""
    return {"mesh": list(self.mesh), "axes": list(AXES), "split": self.split,
            "params": {k: [list(e) if isinstance(e, tuple) else e for e in v]
                       for k, v in self.params.items()},
            "input": list(BOUNDARY_SPEC), "output": list(BOUNDARY_SPEC)}

  @classmethod
  def from_json(cls, entry: Any, count: int, where: str) -> LayerSharding:
    """The entry checked for a layer on `count` devices (None: samples on (count, 1))."""
    e = check_sharding(entry, count, where)
    params = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
              for k, v in e["params"].items()}
    return cls((e["mesh"][0], e["mesh"][1]), e["split"], params)


def _check_spec(spec: Any, where: str) -> None:
  def ok(entry):
    if entry is None or entry in AXES:
      return True
    return isinstance(entry, list) and all(e in AXES for e in entry)
  if not isinstance(spec, list) or not all(ok(e) for e in spec):
    raise UserError(f"{where}: a spec is a list of null, axis names {list(AXES)} or lists of "
                    f"them, got {spec!r}")


def _pos_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _divides(m: int, size: Any) -> bool:
  return isinstance(size, int) and size > 0 and size % m == 0
