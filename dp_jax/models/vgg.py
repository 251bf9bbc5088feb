"""VGG-16 (torchvision layout without dropout or adaptive pooling), NHWC."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import ImageModel, LayerSpec, chain
from dp_jax.models.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU

# conv widths; "M" is a 2x2 max pool
VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
             512, 512, 512, "M")
MIN_IMAGE_SIZE = 32  # five 2x2 pools


class VGG16(ImageModel):
  """VGG-16: conv/relu/maxpool features, flatten, then linear/relu/linear/relu/linear."""

  min_image_size = MIN_IMAGE_SIZE

  def __init__(self, *, image_size: int = 224, num_classes: int = 1000, dtype: Any = jnp.float32,
               rngs: nnx.Rngs):
    self.image_size, self.num_classes = image_size, num_classes
    self.config = {"image_size": image_size, "num_classes": num_classes}
    features: list[nnx.Module] = []
    c = 3
    for v in VGG16_CFG:
      if v == "M":
        features.append(MaxPool2d(2, 2))
      else:
        features += [Conv2d(c, v, 3, padding=1, dtype=dtype, rngs=rngs), ReLU()]
        c = v
    self.features = nnx.List(features)
    self.flatten = Flatten()
    side = image_size // 32
    lin = dict(dtype=dtype, rngs=rngs)
    self.classifier = nnx.List([
        Linear(512 * side * side, 4096, **lin), ReLU(),
        Linear(4096, 4096, **lin), ReLU(),
        Linear(4096, num_classes, **lin)])

  def __call__(self, x_BxHxWxC):
    x = x_BxHxWxC
    for layer in self.features:
      x = layer(x)
    x = self.flatten(x)
    for layer in self.classifier:
      x = layer(x)
    return x

  def layer_specs(self) -> list[LayerSpec]:
    items = [(f"features.{i}", m) for i, m in enumerate(self.features)]
    items.append(("flatten", self.flatten))
    items += [(f"classifier.{i}", m) for i, m in enumerate(self.classifier)]
    return chain(items)
