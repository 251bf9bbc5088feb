"""Where a stage's parameters, statistics and optimizer state live on its (data, model) mesh.

The plan gives each weight-sharded layer a PartitionSpec per parameter path
(dp_jax/planner/sharding.py);
every other array is replicated. Optimizer state follows its parameter: a leaf of a layer's
optimizer state whose path ends in a parameter's key and has that parameter's shape gets the
parameter's sharding (momentum, Adam moments); scalars (step counts) are replicated.

A layer's `state` (LayerSharding.state) shards its training state over the data axis as
`state_spec` says (a parameter no dimension of which the data axis divides stays whole there):
optimizer (ZeRO-1): the optimizer state; full (FSDP): the parameters too, which the forward
reads gathered (`LayerLayout.compute`). `layer_layout` returns all three shardings of a layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from dp_jax.base.errors import UserError
from dp_jax.planner.sharding import LayerSharding, state_spec
from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime.functional import PARAM, LayerDef

Shardings = dict[str, NamedSharding]  # key of a layer's array -> its sharding


def layer_shardings(mesh: Mesh, d: LayerDef, specs: Mapping[str, Sequence]) -> Shardings:
  """The sharding of every key of layer `d` (params, stats, tied) on `mesh`."""
  unknown = sorted(set(specs) - set(d.keys))
  if unknown:
    raise UserError(f"plan layer '{d.name}' shards '{unknown[0]}', which the layer does not "
                    f"have (its arrays: {', '.join(d.keys)})")
  rep = meshlib.replicated(mesh)
  return {k: meshlib.spec_sharding(mesh, specs[k]) if k in specs else rep for k in d.keys}


@dataclass(frozen=True)
class LayerLayout:
  """A layer's shardings on its stage mesh, key -> NamedSharding. stored: where its params and
  stats live between steps (state full: params split over "data" too); compute: what its
  forward reads (params whole on the data axis, split over "model" as the plan says); opt:
  per parameter key, its optimizer state and the gradient the update reads (state optimizer
  or full: split over "data")."""

  stored: Shardings
  compute: Shardings
  opt: Shardings

  @property
  def gathers(self) -> bool:
    """Whether the forward must gather parameters stored split (state full)."""
    return self.stored != self.compute


def layer_layout(mesh: Mesh, d: LayerDef, sharding: LayerSharding | None) -> LayerLayout:
  """Layer `d`'s LayerLayout on `mesh` under its plan entry (None: samples, replicated); a
  sharded state that shards no parameter is a one-line UserError (the option would do
  nothing)."""
  specs = sharding.params if sharding is not None else {}
  state = sharding.state if sharding is not None else "replicated"
  compute = layer_shardings(mesh, d, specs)
  if state == "replicated":
    return LayerLayout(compute, compute, compute)
  dd, mm = mesh.devices.shape
  split = {}
  for k, r in zip(d.keys, d.roles, strict=True):
    if r != PARAM:
      continue
    spec = state_spec(tuple(d.shapes[k]), specs.get(k, ()), dd, mm)
    if spec is not None:
      split[k] = meshlib.spec_sharding(mesh, list(spec))
  if not split:
    shapes = ", ".join(f"{k} {tuple(d.shapes[k])}" for k, r in zip(d.keys, d.roles,
                                                                     strict=True) if r == PARAM)
    raise UserError(f"plan layer '{d.name}': state '{state}' shards its training state over a "
                    f"data axis of {dd} devices, but no dimension of its parameters "
                    f"({shapes or 'none'}) divides by {dd}; use state replicated for it")
  opt = {**compute, **split}
  return LayerLayout(opt if state == "full" else compute, compute, opt)


def place(arrays: Mapping[str, Any], shardings: Shardings) -> dict[str, jax.Array]:
  """Copies of a layer's arrays (key -> array) on their shardings; onto devices of other
  processes from host values (jax.device_put of a committed array there gave an array without
  valid shards with one device per process, jax 0.12).

  Always copies: the stage programs donate the state's buffers, and jax.device_put onto the
  sharding an array already has returns that array, so without a copy the first step would
  delete the model's own arrays (and those of every other state built from it, e.g. a
  background job's copy on the same device: "Array has been deleted")."""
  return {k: jax.device_put(a if shardings[k].is_fully_addressable else np.asarray(a),
                            shardings[k], may_alias=False) for k, a in arrays.items()}


def constrain(arrays: Mapping[str, Any], shardings: Shardings, strict: bool = False
              ) -> dict[str, Any]:
  """Inside jit: a layer's split arrays pinned to their shardings (replicated ones are left
  to GSPMD, so a samples-only stage compiles as it did before sharding existed; with
  `strict` they are pinned too, e.g. parameters gathered from data-axis shards)."""
  return {k: _pin(a, shardings[k], strict) for k, a in arrays.items()}


def opt_shardings(opt_state: Any, params: Mapping[str, Any], shardings: Shardings,
                  replicated: NamedSharding) -> Any:
  """A pytree of shardings for a layer's optimizer state (leaves with .shape: arrays,
  tracers or ShapeDtypeStructs): each parameter-shaped leaf under the parameter's key
  follows it, everything else is replicated."""
  def one(path, leaf):
    for entry in reversed(path):
      key = getattr(entry, "key", None)
      if isinstance(key, str) and key in params:
        if tuple(leaf.shape) == tuple(params[key].shape):
          return shardings[key]
        break
    return replicated
  return jax.tree_util.tree_map_with_path(one, opt_state)


def constrain_opt(opt_state: Any, params: Mapping[str, Any], shardings: Shardings,
                  replicated: NamedSharding) -> Any:
  """Inside jit: a layer's optimizer state pinned to opt_shardings."""
  sh = opt_shardings(opt_state, params, shardings, replicated)
  return jax.tree.map(_pin, opt_state, sh)


def _pin(a: Any, sharding: NamedSharding, strict: bool = False) -> Any:
  if sharding.is_fully_replicated and not strict:
    return a
  return jax.lax.with_sharding_constraint(a, sharding)


def is_sharded(shardings: Mapping[str, Shardings]) -> bool:
  """Whether any array of these layers is split (not replicated)."""
  return any(not s.is_fully_replicated for per in shardings.values() for s in per.values())
