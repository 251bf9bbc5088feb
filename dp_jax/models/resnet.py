"""ResNet-50 and Wide-ResNet-50-2 / 101-2 (torchvision v1.5 bottlenecks), NHWC."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import ImageModel, LayerSpec, chain, spec
from dp_jax.models.layers import Add, AvgPool2d, Conv2d, Flatten, Linear, MaxPool2d

MIN_IMAGE_SIZE = 32  # total stride of the network
EXPANSION = 4


class Bottleneck(nnx.Module):
  """Residual block: relu(conv3(conv2(conv1(x))) + shortcut(x)); a fork/join in the graph."""

  def __init__(self, inplanes: int, planes: int, width: int, stride: int, downsample: bool, *,
               dtype: Any, rngs: nnx.Rngs):
    conv = dict(batch_norm=True, dtype=dtype, rngs=rngs)
    out = planes * EXPANSION
    self.conv1 = Conv2d(inplanes, width, 1, activation="relu", **conv)
    self.conv2 = Conv2d(width, width, 3, stride=stride, padding=1, activation="relu", **conv)
    self.conv3 = Conv2d(width, out, 1, **conv)
    self.downsample = Conv2d(inplanes, out, 1, stride=stride, **conv) if downsample else None
    self.add = Add(activation="relu")

  def __call__(self, x_BxHxWxC):
    y = self.conv3(self.conv2(self.conv1(x_BxHxWxC)))
    shortcut = x_BxHxWxC if self.downsample is None else self.downsample(x_BxHxWxC)
    return self.add(y, shortcut)

  def layer_specs(self, prefix: str, fork: str) -> list[LayerSpec]:
    """Main branch, optional downsample branch, then the add join (the block's output)."""
    specs = chain([(f"{prefix}.conv{i}", getattr(self, f"conv{i}")) for i in (1, 2, 3)], (fork,))
    shortcut = fork
    if self.downsample is not None:
      shortcut = f"{prefix}.downsample"
      specs.append(spec(shortcut, self.downsample, (fork,)))
    specs.append(spec(f"{prefix}.add", self.add, (f"{prefix}.conv3", shortcut)))
    return specs


class ResNet(ImageModel):
  """Bottleneck ResNet; width_per_group=128 gives the wide variants."""

  def __init__(self, blocks: Sequence[int], *, width_per_group: int = 64, image_size: int = 224,
               num_classes: int = 1000, dtype: Any = jnp.float32, rngs: nnx.Rngs):
    self.image_size, self.num_classes = image_size, num_classes
    self.config = {"image_size": image_size, "num_classes": num_classes,
                   "blocks": list(blocks), "width_per_group": width_per_group}
    self.stage_sizes = tuple(blocks)
    self.conv1 = Conv2d(3, 64, 7, stride=2, padding=3, batch_norm=True, activation="relu",
                        dtype=dtype, rngs=rngs)
    self.maxpool = MaxPool2d(3, 2, 1)
    inplanes = 64
    stages = zip((64, 128, 256, 512), blocks, (1, 2, 2, 2), strict=True)
    for stage, (planes, n, stride) in enumerate(stages):
      layer = []
      for j in range(n):
        s = stride if j == 0 else 1
        downsample = j == 0 and (s != 1 or inplanes != planes * EXPANSION)
        width = planes * width_per_group // 64
        layer.append(Bottleneck(inplanes, planes, width, s, downsample, dtype=dtype, rngs=rngs))
        inplanes = planes * EXPANSION
      setattr(self, f"layer{stage + 1}", nnx.List(layer))
    self.avgpool = AvgPool2d(global_pool=True)
    self.flatten = Flatten()
    self.fc = Linear(inplanes, num_classes, dtype=dtype, rngs=rngs)

  def _stages(self):
    return [(f"layer{i + 1}", getattr(self, f"layer{i + 1}")) for i in range(len(self.stage_sizes))]

  def __call__(self, x_BxHxWxC):
    x = self.maxpool(self.conv1(x_BxHxWxC))
    for _, layer in self._stages():
      for block in layer:
        x = block(x)
    return self.fc(self.flatten(self.avgpool(x)))

  def layer_specs(self) -> list[LayerSpec]:
    specs = chain([("conv1", self.conv1), ("maxpool", self.maxpool)])
    for stage, layer in self._stages():
      for j, block in enumerate(layer):
        specs += block.layer_specs(f"{stage}.{j}", specs[-1].name)
    specs += chain([("avgpool", self.avgpool), ("flatten", self.flatten), ("fc", self.fc)],
                   (specs[-1].name,))
    return specs


def _with_blocks(blocks: tuple[int, ...], width_per_group: int, doc: str):
  def make(*, image_size: int = 224, num_classes: int = 1000, dtype: Any = jnp.float32,
           rngs: nnx.Rngs) -> ResNet:
    return ResNet(blocks, width_per_group=width_per_group, image_size=image_size,
                  num_classes=num_classes, dtype=dtype, rngs=rngs)

  make.__doc__ = doc
  make.min_image_size = MIN_IMAGE_SIZE
  return make


resnet50 = _with_blocks((3, 4, 6, 3), 64, "ResNet-50 (blocks 3, 4, 6, 3).")
wide_resnet50_2 = _with_blocks((3, 4, 6, 3), 128, "Wide-ResNet-50-2 (width per group 128).")
wide_resnet101_2 = _with_blocks((3, 4, 23, 3), 128, "Wide-ResNet-101-2 (blocks 3, 4, 23, 3).")
