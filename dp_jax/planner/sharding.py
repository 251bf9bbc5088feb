"""Per-layer sharding: a layer's 2-D mesh (data, model), its split, its PartitionSpecs, and
how its training state is sharded over the data axis.

A layer on g devices runs on a mesh (d, m), d * m = g: device (i, j) is device start + i*m + j
of its range. The split says what the "model" axis divides:
  samples  m = 1; parameters replicated
  out      linear / conv2d / lm_head: output features / output channels / vocabulary
  in       linear: input features
  heads    transformer_block: attention heads and the MLP hidden dimension (Megatron pairing
           inside the block; layer norms replicated); gqa_attention: query and key/value heads
           (m divides the key/value heads), the output projection's input; swiglu_mlp: the
           hidden dimension (gate and up projections' outputs, the down projection's input)
  experts  moe_experts: the routed experts (m divides their number); the shared experts and
           the router are replicated
Specs are PartitionSpecs as JSON lists (entry: null | axis name | list of axis names); a
parameter not listed is replicated. At layer boundaries activations are sharded on the batch
dimension: over "data" and replicated over "model" (device (i, j) holds sample range i of d:
input and output spec ["data"]), but under experts over both axes (device (i, j) holds range
i*m + j of g, as a samples layout of the same devices: spec [["data", "model"]]).
state (the layer's parameters, gradients and optimizer state over the data axis, as ZeRO and
FSDP shard them): replicated, optimizer (optimizer state in d shards) or full (all three):
`state_spec` adds "data" to one dimension of each array the data axis divides.
Pure Python (no JAX), shared by the planner and the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerNode

SPLITS = ("samples", "out", "in", "heads", "experts")
STATES = ("replicated", "optimizer", "full")
AXES = ("data", "model")
DATA, MODEL = AXES
BOUNDARY_SPEC: list[Any] = [DATA]  # activations between layers: batch over "data"
EXPERTS_SPEC: list[Any] = [[DATA, MODEL]]  # under experts: batch over both axes


class Strategy(NamedTuple):
  """A layer's strategy on its g devices (docs/cost_model.md, "Per-layer strategies").

  m, split: a (d, m) mesh, d = g / m, whose model axis divides what `split` names
  (dp_jax/planner/sharding.py; samples: m = 1). state: the layer's training state over its
  data axis of d devices, as ZeRO and FSDP shard it (replicated: every device holds it whole;
  optimizer: the optimizer state in d shards, the gradients reduce-scattered and the updated
  parameters all-gathered, ZeRO-1; full: parameters, gradients and optimizer state in d shards,
  the parameters all-gathered before the forward and again before the backward, the gradients
  reduce-scattered, FSDP / ZeRO-3). recompute: the backward runs the layer's forward again
  (jax.checkpoint), so the layer keeps only its input for the backward."""

  m: int = 1
  split: str = "samples"
  state: str = "replicated"
  recompute: bool = False

  @property
  def plain(self) -> bool:
    """Samples split, state replicated, nothing recomputed: the cost model's own tables."""
    return self == PLAIN

  def sample_groups(self, count: int) -> int:
    """Distinct sample ranges on `count` devices: one per device, but one per model group
    under a weight split (experts split tokens over every device: dp_jax/planner/sharding.py)."""
    return count if self.split in ("samples", "experts") else count // self.m

  def data_devices(self, count: int) -> int:
    """Devices of the layer's data axis, over which `state` is sharded: count / m."""
    return count // self.m


PLAIN = Strategy()
SAMPLES = PLAIN  # a layer that splits its samples and nothing else


def strategy(x: Strategy | tuple | None) -> Strategy:
  """A Strategy from itself, None (PLAIN) or a tuple (m, split[, state[, recompute]])."""
  if x is None:
    return PLAIN
  return x if isinstance(x, Strategy) else Strategy(*x)


def is_samples(s: Strategy | tuple | None) -> bool:
  """No weight split: the cost model's samples tables price the layer's compute."""
  return s is None or s[1] == "samples"


def boundary_spec(split: str) -> list[Any]:
  """The spec of a layer's input and output activations under `split`."""
  return list(EXPERTS_SPEC) if split == "experts" else list(BOUNDARY_SPEC)

Spec = list[Any]


# Per layer kind, the splits it allows and the attribute the model axis must divide
SPLIT_DIMENSIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "linear": (("out_features", "out"), ("in_features", "in")),
    "conv2d": (("out_channels", "out"),),
    "lm_head": (("vocab_size", "out"),),
    "transformer_block": (("n_head", "heads"),),
    "gqa_attention": (("n_kv_head", "heads"),),
    "swiglu_mlp": (("ffn_dim", "heads"),),
    "moe_experts": (("n_expert", "experts"),),
}


def splits_for(node: LayerNode, m: int) -> tuple[str, ...]:
  """The splits `node` allows on a model axis of m devices (("samples",) when m == 1)."""
  if m < 1:
    raise UserError(f"layer '{node.name}': model axis size {m} must be at least 1")
  if m == 1:
    return ("samples",)
  return tuple(split for attr, split in SPLIT_DIMENSIONS.get(node.kind, ())
               if _divides(m, node.attrs.get(attr)))


def layer_sharding(node: LayerNode, mesh: tuple[int, int], split: str,
                   state: str = "replicated") -> dict[str, Any]:
  """The plan JSON's "sharding" entry of `node` on mesh (d, m) with `split` and `state`."""
  d, m = (int(v) for v in mesh)
  if d < 1 or m < 1:
    raise UserError(f"layer '{node.name}': mesh {[d, m]} needs two positive sizes")
  if split not in SPLITS:
    raise UserError(f"layer '{node.name}': split '{split}' is unknown (valid: {', '.join(SPLITS)})")
  allowed = splits_for(node, m)
  if split not in allowed:
    raise UserError(f"layer '{node.name}' ({node.kind}) cannot use split '{split}' on a model "
                    f"axis of {m} (allowed: {', '.join(allowed) or 'none'})")
  if state not in STATES:
    raise UserError(f"layer '{node.name}': state '{state}' is unknown (valid: "
                    f"{', '.join(STATES)})")
  entry = {"mesh": [d, m], "axes": list(AXES), "split": split,
           "params": param_specs(node.kind, node.attrs, split)}
  if state != "replicated":  # as LayerSharding.to_json writes it
    entry["state"] = state
  return {**entry, "input": boundary_spec(split), "output": boundary_spec(split)}


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
  if kind == "gqa_attention" and split == "heads":
    return {"q_proj/kernel": [None, MODEL], "k_proj/kernel": [None, MODEL],
            "v_proj/kernel": [None, MODEL], "o_proj/kernel": [MODEL, None]}
  if kind == "swiglu_mlp" and split == "heads":
    return {"ffn/gate_proj/kernel": [None, MODEL], "ffn/up_proj/kernel": [None, MODEL],
            "ffn/down_proj/kernel": [MODEL, None]}
  if kind == "moe_experts" and split == "experts":
    return {"w_gate": [MODEL, None, None], "w_up": [MODEL, None, None],
            "w_down": [MODEL, None, None]}
  raise UserError(f"a {kind} layer has no split '{split}'")


def default_sharding(num_devices: int) -> dict[str, Any]:
  """The entry of a layer without one: samples on (g, 1), every parameter replicated."""
  return {"mesh": [num_devices, 1], "axes": list(AXES), "split": "samples", "params": {},
          "input": list(BOUNDARY_SPEC), "output": list(BOUNDARY_SPEC)}


def sample_ranges(batch: int, d: int, m: int, split: str = "samples") -> list[tuple[int, int]]:
  """Sample range of each device k of a (d, m) mesh: range k // m of d equal ranges (one per
  device under experts: range k of d m)."""
  groups = d * m if split == "experts" else d
  per = batch // groups
  return [((k if split == "experts" else k // m) * per,
           ((k if split == "experts" else k // m) + 1) * per) for k in range(d * m)]


def state_spec(shape: tuple[int, ...], spec: tuple[Any, ...] | list[Any], d: int, m: int
               ) -> tuple[Any, ...] | None:
  """The spec of an array of `shape`, split by `spec` over a model axis of m devices, with its
  state sharded over a data axis of d devices: "data" joins the largest dimension whose share
  "data" divides (a model-split dimension: after its 1/m); None when d = 1 or no dimension
  divides (the array then stays whole on the data axis: dp_jax/planner/memory.py counts a
  layer's state as 1/d, which such small arrays, norm scales and biases, leave out)."""
  if d <= 1:
    return None
  entries = list(spec) + [None] * (len(shape) - len(spec))
  for i in sorted(range(len(shape)), key=lambda i: -shape[i]):
    e = entries[i]
    axes = [] if e is None else [e] if isinstance(e, str) else list(e)
    local = shape[i] // m if MODEL in axes else shape[i]
    if local % d == 0 and local >= d:
      entries[i] = DATA if not axes else [*axes, DATA]
      return tuple(entries)
  return None


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
  boundary = boundary_spec(split)
  for key in ("input", "output"):
    if list(entry.get(key, boundary)) != boundary:
      raise UserError(f"{where}: sharding {key} must be {boundary} under split '{split}' "
                      f"(activations between layers are split by samples), got "
                      f"{entry.get(key)!r}")
  state = entry.get("state", "replicated")
  if state not in STATES:
    raise UserError(f"{where}: sharding state {state!r} is unknown (valid: {', '.join(STATES)})")
  if state != "replicated" and d < 2:
    raise UserError(f"{where}: state '{state}' shards over the data axis, which has {d} device "
                    f"on mesh {mesh}; use state replicated or a data axis of 2 or more")
  return {"mesh": [d, m], "axes": list(AXES), "split": split,
          "params": {k: list(v) for k, v in params.items()}, "state": state,
          "input": boundary, "output": boundary}


@dataclass(frozen=True)
class LayerSharding:
  """A layer's plan entry, typed: its (data, model) mesh, split, parameter specs over the model
  axis (path -> PartitionSpec entries: None | axis | tuple of axes) and its state over the
  data axis (state_spec); the one sharding type of planner, simulator and runtime."""

  mesh: tuple[int, int]
  split: str = "samples"
  params: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
  state: str = "replicated"

  @property
  def plain(self) -> bool:
    """Samples split, state replicated: a plan writes no entry for it."""
    return self.split == "samples" and self.state == "replicated"

  @property
  def boundary(self) -> list[Any]:
    """The spec of the layer's input and output activations (boundary_spec)."""
    return boundary_spec(self.split)

  def to_json(self) -> dict[str, Any]:
    """The plan JSON's "sharding" entry ("state" only where not replicated)."""
    state = {} if self.state == "replicated" else {"state": self.state}
    return {"mesh": list(self.mesh), "axes": list(AXES), "split": self.split,
            "params": {k: [list(e) if isinstance(e, tuple) else e for e in v]
                       for k, v in self.params.items()}, **state,
            "input": self.boundary, "output": self.boundary}

  @classmethod
  def from_json(cls, entry: Any, count: int, where: str) -> LayerSharding:
    """The entry checked for a layer on `count` devices (None: samples on (count, 1))."""
    e = check_sharding(entry, count, where)
    params = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
              for k, v in e["params"].items()}
    return cls((e["mesh"][0], e["mesh"][1]), e["split"], params, e.get("state", "replicated"))


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
