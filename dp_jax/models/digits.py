"""Two small classifiers of the 8x8 grayscale digits: a conv net and an MLP (NHWC, 1 channel)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import ImageModel, LayerSpec, chain, run_layers
from dp_jax.models.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU

MIN_IMAGE_SIZE = 4  # the conv net's two 2x2 pools


class DigitsModel(ImageModel):
  """A classifier of single-channel image_size x image_size images (the digits are 8x8)."""

  def input_spec(self, batch: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, self.image_size, self.image_size, 1), jnp.float32)

  LAYERS: tuple[str, ...] = ()  # attribute names of the layers, in order (a chain)

  def _sizes(self, image_size: int, num_classes: int) -> None:
    self.image_size, self.num_classes = image_size, num_classes
    self.config = {"image_size": image_size, "num_classes": num_classes}

  def __call__(self, x_BxHxWx1):
    return run_layers(self, x_BxHxWx1)

  def layer_specs(self) -> list[LayerSpec]:
    return chain([(n, getattr(self, n)) for n in self.LAYERS])


class DigitsCNN(DigitsModel):
  """conv 3x3 16 -> pool -> conv 3x3 32 -> pool -> flatten -> linear 64 -> relu -> linear."""

  LAYERS = ("conv1", "pool1", "conv2", "pool2", "flatten", "fc1", "relu", "fc2")
  min_image_size = MIN_IMAGE_SIZE

  def __init__(self, *, image_size: int = 8, num_classes: int = 10, dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    self._sizes(image_size, num_classes)
    kw = dict(dtype=dtype, rngs=rngs)
    side = image_size // 4
    self.conv1 = Conv2d(1, 16, 3, padding=1, activation="relu", **kw)
    self.pool1 = MaxPool2d(2, 2)
    self.conv2 = Conv2d(16, 32, 3, padding=1, activation="relu", **kw)
    self.pool2 = MaxPool2d(2, 2)
    self.flatten = Flatten()
    self.fc1 = Linear(32 * side * side, 64, **kw)
    self.relu = ReLU()
    self.fc2 = Linear(64, num_classes, **kw)


class DigitsMLP(DigitsModel):
  """flatten -> linear 128 -> relu -> linear 128 -> relu -> linear."""

  LAYERS = ("flatten", "fc1", "relu1", "fc2", "relu2", "fc3")

  def __init__(self, *, image_size: int = 8, num_classes: int = 10, dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    self._sizes(image_size, num_classes)
    kw = dict(dtype=dtype, rngs=rngs)
    self.flatten = Flatten()
    self.fc1 = Linear(image_size * image_size, 128, **kw)
    self.relu1 = ReLU()
    self.fc2 = Linear(128, 128, **kw)
    self.relu2 = ReLU()
    self.fc3 = Linear(128, num_classes, **kw)
