"""GraphModel: a Flax NNX model with a natural forward and a planner-visible layer graph.

Layer names are the dotted attribute paths of the layer modules inside the model
(`layer1.0.conv1` is `model.layer1[0].conv1`), so a layer's parameters sit under that path
in `nnx.state(model)`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


@dataclass(frozen=True)
class LayerSpec:
  """One planner layer: `module(*outputs of inputs)` computes it; () inputs = model input."""

  name: str
  module: nnx.Module
  inputs: tuple[str, ...]
  kind: str
  attrs: dict[str, Any] = field(default_factory=dict)


def spec(name: str, module: nnx.Module, inputs: Sequence[str] = ()) -> LayerSpec:
  """A LayerSpec whose kind and attrs come from the layer module itself (see describe)."""
  kind, attrs = describe(module)
  return LayerSpec(name, module, tuple(inputs), kind, attrs)


def describe(module: nnx.Module) -> tuple[str, dict[str, Any]]:
  """(kind, attrs) of a layer module: its own `kind` and `attrs()` when it has them; flax's
  nnx.Linear is `linear` and nnx.LayerNorm `layernorm`; any other module is its class name in
  snake_case (priced from XLA's costs of its trace; docs/extending.md, "Layer kinds")."""
  kind = getattr(module, "kind", None)
  if isinstance(kind, str) and kind:
    attrs = module.attrs() if callable(getattr(module, "attrs", None)) else {}
    return kind, dict(attrs)
  if isinstance(module, nnx.Linear):
    return "linear", {"in_features": module.in_features, "out_features": module.out_features,
                      "bias": module.use_bias}
  if isinstance(module, nnx.LayerNorm):
    return "layernorm", {"d_model": module.num_features}
  return re.sub(r"(?<!^)(?=[A-Z])", "_", type(module).__name__).lower(), {}


def chain(items: Sequence[tuple[str, nnx.Module]], inputs: Sequence[str] = ()) -> list[LayerSpec]:
  """Specs of layers run one after another; the first reads `inputs` (() = model input)."""
  specs: list[LayerSpec] = []
  prev = tuple(inputs)
  for name, module in items:
    specs.append(spec(name, module, prev))
    prev = (name,)
  return specs


class GraphModel(nnx.Module):
  """Base of every model: natural `__call__` plus `layer_specs` for the planner.

  A model whose layers run one after another can just hold them in `self.layers` (an
  nnx.List): its layer specs (`layers.0`, `layers.1`, ...) and its `__call__` come from there.
  """

  config: dict[str, Any]

  def __call__(self, x):
    return run_layers(self, x)

  def layer_specs(self) -> list[LayerSpec]:
    """Every planner layer in topological order; the last one outputs the logits."""
    layers = getattr(self, "layers", None)
    if layers is None:
      raise NotImplementedError(f"{type(self).__name__} has no `layers` sequence: define "
                                "layer_specs() (docs/extending.md)")
    return chain([(f"layers.{i}", m) for i, m in enumerate(layers)])

  def input_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    raise NotImplementedError

  def label_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    raise NotImplementedError


class ImageModel(GraphModel):
  """A classifier of NHWC float32 images of size image_size x image_size x 3."""

  image_size: int
  num_classes: int

  def input_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.image_size, self.image_size, 3), jnp.float32)

  def label_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch,), jnp.int32)


def run_layers(model: GraphModel, x):
  """Run the model layer by layer through its graph wiring (frees outputs after last use)."""
  specs = model.layer_specs()
  last_use = {p: i for i, s in enumerate(specs) for p in s.inputs}
  outs: dict[str, Any] = {}
  for i, s in enumerate(specs):
    args = [outs[p] for p in s.inputs] if s.inputs else [x]
    outs[s.name] = s.module(*args)
    for p in set(s.inputs):
      if last_use[p] == i:
        del outs[p]
  return outs[specs[-1].name]
