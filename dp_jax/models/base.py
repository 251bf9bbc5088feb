"""GraphModel: a Flax NNX model with a natural forward and a planner-visible layer graph.

Layer names are the dotted attribute paths of the layer modules inside the model
(`layer1.0.conv1` is `model.layer1[0].conv1`), so a layer's parameters sit under that path
in `nnx.state(model)`.
"""

from __future__ import annotations

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
  """A LayerSpec whose kind and attrs come from the layer module itself."""
  return LayerSpec(name, module, tuple(inputs), module.kind, module.attrs())


def chain(items: Sequence[tuple[str, nnx.Module]], inputs: Sequence[str] = ()) -> list[LayerSpec]:
  """Specs of layers run one after another; the first reads `inputs` (() = model input)."""
  specs: list[LayerSpec] = []
  prev = tuple(inputs)
  for name, module in items:
    specs.append(spec(name, module, prev))
    prev = (name,)
  return specs


class GraphModel(nnx.Module):
  """Base of every zoo model: natural `__call__` plus `layer_specs` for the planner."""

  config: dict[str, Any]

  def __call__(self, x):
    raise NotImplementedError

  def layer_specs(self) -> list[LayerSpec]:
    """Every planner layer in topological order; the last one outputs the logits."""
    raise NotImplementedError

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
