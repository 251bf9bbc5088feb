"""A zoo model as pure per-layer functions: split once, apply inside jit, write results back.

Each layer's nnx state is flattened to a dict key -> array ("conv/kernel", "bn/mean").
Roles: PARAM (trained, owned by this layer), STAT (carried non-trainable state such as batch
norm running statistics) and TIED (a Param owned by an earlier layer, e.g. GPT-2's lm_head
reading the embed layer's wte; its value and gradient belong to the owner).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
from flax import nnx

from dp_jax.base.errors import UserError

PARAM, STAT, TIED = "param", "stat", "tied"
Arrays = dict[str, jax.Array]


@dataclass(frozen=True, eq=False)
class LayerDef:
  """How to rebuild and run one layer from arrays (static; hashable by identity)."""

  name: str
  inputs: tuple[str, ...]
  graphdef: Any
  treedef: Any
  keys: tuple[str, ...]
  roles: tuple[str, ...]
  tied: Mapping[str, tuple[str, str]]  # key -> (owner layer, owner key)
  shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # key -> array shape


def split_layers(model) -> tuple[dict[str, LayerDef], dict[str, Arrays], dict[str, Arrays]]:
  """Layer defs, params and stats of every planner layer of `model`, in layer order."""
  owners: dict[int, tuple[str, str]] = {}
  defs: dict[str, LayerDef] = {}
  params: dict[str, Arrays] = {}
  stats: dict[str, Arrays] = {}
  for spec in model.layer_specs():
    graphdef, state = nnx.split(spec.module)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_var)
    keys, roles, tied, shapes = [], [], {}, {}
    params[spec.name], stats[spec.name] = {}, {}
    for path, var in flat:
      key = _key(path)
      keys.append(key)
      shapes[key] = tuple(var.get_value().shape)
      if id(var) in owners:
        if not isinstance(var, nnx.Param):
          raise UserError(f"layer '{spec.name}' shares non-parameter state '{key}' with layer "
                          f"'{owners[id(var)][0]}'; only parameters may be shared")
        roles.append(TIED)
        tied[key] = owners[id(var)]
      elif isinstance(var, nnx.Param):
        roles.append(PARAM)
        owners[id(var)] = (spec.name, key)
        params[spec.name][key] = var.get_value()
      else:
        roles.append(STAT)
        stats[spec.name][key] = var.get_value()
    defs[spec.name] = LayerDef(spec.name, tuple(spec.inputs), graphdef, treedef, tuple(keys),
                               tuple(roles), tied, shapes)
  return defs, params, stats


def merge_layer(d: LayerDef, params: Arrays, stats: Arrays):
  """Layer `d` as its nnx module holding these arrays (params include its TIED keys)."""
  leaves = [stats[k] if r == STAT else params[k] for k, r in zip(d.keys, d.roles, strict=True)]
  return nnx.merge(d.graphdef, jax.tree.unflatten(d.treedef, leaves))


def apply_layer(d: LayerDef, params: Arrays, stats: Arrays, args: Sequence[Any]):
  """Run layer `d` (params include its TIED keys); returns (output, new stats)."""
  module = merge_layer(d, params, stats)
  return module(*args), layer_stats(d, module)


def layer_stats(d: LayerDef, module) -> Arrays:
  """The STAT arrays of `d`'s module (after it ran: batch norm's new running statistics)."""
  new_leaves = jax.tree.leaves(nnx.state(module))
  if len(new_leaves) != len(d.keys):
    raise RuntimeError(f"layer '{d.name}' changed its state structure while running")
  return {k: v for k, r, v in zip(d.keys, d.roles, new_leaves, strict=True) if r == STAT}


def layer_params(d: LayerDef, params: Mapping[str, Arrays]) -> Arrays:
  """The params `d` runs with: its own, plus its TIED keys read from their owners."""
  out = dict(params[d.name])
  for key, (owner, owner_key) in d.tied.items():
    out[key] = params[owner][owner_key]
  return out


def write_back(model, defs: Mapping[str, LayerDef], params: Mapping[str, Arrays],
               stats: Mapping[str, Arrays]) -> None:
  """Store trained params and stats into `model`'s layers (in place)."""
  for spec in model.layer_specs():
    d = defs[spec.name]
    p = layer_params(d, params)
    leaves = [stats[d.name][k] if r == STAT else p[k] for k, r in zip(d.keys, d.roles, strict=True)]
    nnx.update(spec.module, jax.tree.unflatten(d.treedef, leaves))


def _is_var(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def _key(path) -> str:
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
  return "/".join(parts)
