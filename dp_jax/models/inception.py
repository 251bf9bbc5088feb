"""Inception-v3 (torchvision structure, no aux head, no dropout), NHWC."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from flax import nnx

from dp_jax.models.base import ImageModel, LayerSpec, chain, spec
from dp_jax.models.layers import AvgPool2d, Concat, Conv2d, Flatten, Linear, MaxPool2d

MIN_IMAGE_SIZE = 75  # smallest size whose feature map survives Mixed_7a


class _Module(nnx.Module):
  """An Inception module: named branches (chains of layers) joined by a concat."""

  def _branches(self) -> list[list[str]]:
    raise NotImplementedError

  def __call__(self, x_BxHxWxC):
    return self.concat(*[self._run(b, x_BxHxWxC) for b in self._branches()])

  def _run(self, names: Sequence[str], x):
    for name in names:
      x = getattr(self, name)(x)
    return x

  def layer_specs(self, prefix: str, fork: str) -> list[LayerSpec]:
    """Every branch as a chain from `fork`, then the concat join (the module's output)."""
    specs: list[LayerSpec] = []
    ends = []
    for names in self._branches():
      specs += chain([(f"{prefix}.{n}", getattr(self, n)) for n in names], (fork,))
      ends.append(specs[-1].name)
    specs.append(spec(f"{prefix}.concat", self.concat, ends))
    return specs


def _conv(dtype, rngs):
  """BasicConv2d factory: conv (no bias) + batch norm (eps 1e-3) + ReLU as one layer."""

  def make(cin: int, cout: int, kernel, stride=1, padding=0) -> Conv2d:
    return Conv2d(cin, cout, kernel, stride=stride, padding=padding, batch_norm=True,
                  activation="relu", bn_eps=1e-3, dtype=dtype, rngs=rngs)

  return make


class InceptionA(_Module):
  """35x35 module: 1x1, 5x5, double 3x3 and avg-pool branches."""

  def __init__(self, cin: int, pool_features: int, *, dtype: Any, rngs: nnx.Rngs):
    c = _conv(dtype, rngs)
    self.branch1x1 = c(cin, 64, 1)
    self.branch5x5_1, self.branch5x5_2 = c(cin, 48, 1), c(48, 64, 5, padding=2)
    self.branch3x3dbl_1 = c(cin, 64, 1)
    self.branch3x3dbl_2 = c(64, 96, 3, padding=1)
    self.branch3x3dbl_3 = c(96, 96, 3, padding=1)
    self.pool = AvgPool2d(3, 1, 1)
    self.branch_pool = c(cin, pool_features, 1)
    self.concat = Concat()

  def _branches(self):
    return [["branch1x1"], ["branch5x5_1", "branch5x5_2"],
            ["branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"], ["pool", "branch_pool"]]


class InceptionB(_Module):
  """35x35 -> 17x17 reduction: strided 3x3, double 3x3 and max-pool branches."""

  def __init__(self, cin: int, *, dtype: Any, rngs: nnx.Rngs):
    c = _conv(dtype, rngs)
    self.branch3x3 = c(cin, 384, 3, stride=2)
    self.branch3x3dbl_1 = c(cin, 64, 1)
    self.branch3x3dbl_2 = c(64, 96, 3, padding=1)
    self.branch3x3dbl_3 = c(96, 96, 3, stride=2)
    self.pool = MaxPool2d(3, 2)
    self.concat = Concat()

  def _branches(self):
    return [["branch3x3"], ["branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"], ["pool"]]


class InceptionC(_Module):
  """17x17 module with factorized 7x7 convolutions."""

  def __init__(self, cin: int, channels_7x7: int, *, dtype: Any, rngs: nnx.Rngs):
    c, c7 = _conv(dtype, rngs), channels_7x7
    self.branch1x1 = c(cin, 192, 1)
    self.branch7x7_1 = c(cin, c7, 1)
    self.branch7x7_2 = c(c7, c7, (1, 7), padding=(0, 3))
    self.branch7x7_3 = c(c7, 192, (7, 1), padding=(3, 0))
    self.branch7x7dbl_1 = c(cin, c7, 1)
    self.branch7x7dbl_2 = c(c7, c7, (7, 1), padding=(3, 0))
    self.branch7x7dbl_3 = c(c7, c7, (1, 7), padding=(0, 3))
    self.branch7x7dbl_4 = c(c7, c7, (7, 1), padding=(3, 0))
    self.branch7x7dbl_5 = c(c7, 192, (1, 7), padding=(0, 3))
    self.pool = AvgPool2d(3, 1, 1)
    self.branch_pool = c(cin, 192, 1)
    self.concat = Concat()

  def _branches(self):
    return [["branch1x1"], ["branch7x7_1", "branch7x7_2", "branch7x7_3"],
            [f"branch7x7dbl_{i}" for i in range(1, 6)], ["pool", "branch_pool"]]


class InceptionD(_Module):
  """17x17 -> 8x8 reduction: 3x3, 7x7x3 and max-pool branches."""

  def __init__(self, cin: int, *, dtype: Any, rngs: nnx.Rngs):
    c = _conv(dtype, rngs)
    self.branch3x3_1, self.branch3x3_2 = c(cin, 192, 1), c(192, 320, 3, stride=2)
    self.branch7x7x3_1 = c(cin, 192, 1)
    self.branch7x7x3_2 = c(192, 192, (1, 7), padding=(0, 3))
    self.branch7x7x3_3 = c(192, 192, (7, 1), padding=(3, 0))
    self.branch7x7x3_4 = c(192, 192, 3, stride=2)
    self.pool = MaxPool2d(3, 2)
    self.concat = Concat()

  def _branches(self):
    return [["branch3x3_1", "branch3x3_2"], [f"branch7x7x3_{i}" for i in range(1, 5)], ["pool"]]


class InceptionE(_Module):
  """8x8 module whose 3x3 branches split into parallel 1x3 / 3x1 convs (nested fork/joins)."""

  def __init__(self, cin: int, *, dtype: Any, rngs: nnx.Rngs):
    c = _conv(dtype, rngs)
    self.branch1x1 = c(cin, 320, 1)
    self.branch3x3_1 = c(cin, 384, 1)
    self.branch3x3_2a = c(384, 384, (1, 3), padding=(0, 1))
    self.branch3x3_2b = c(384, 384, (3, 1), padding=(1, 0))
    self.branch3x3_concat = Concat()
    self.branch3x3dbl_1 = c(cin, 448, 1)
    self.branch3x3dbl_2 = c(448, 384, 3, padding=1)
    self.branch3x3dbl_3a = c(384, 384, (1, 3), padding=(0, 1))
    self.branch3x3dbl_3b = c(384, 384, (3, 1), padding=(1, 0))
    self.branch3x3dbl_concat = Concat()
    self.pool = AvgPool2d(3, 1, 1)
    self.branch_pool = c(cin, 192, 1)
    self.concat = Concat()

  def __call__(self, x_BxHxWxC):
    b1 = self.branch1x1(x_BxHxWxC)
    t = self.branch3x3_1(x_BxHxWxC)
    b3 = self.branch3x3_concat(self.branch3x3_2a(t), self.branch3x3_2b(t))
    t = self.branch3x3dbl_2(self.branch3x3dbl_1(x_BxHxWxC))
    bd = self.branch3x3dbl_concat(self.branch3x3dbl_3a(t), self.branch3x3dbl_3b(t))
    bp = self.branch_pool(self.pool(x_BxHxWxC))
    return self.concat(b1, b3, bd, bp)

  def layer_specs(self, prefix: str, fork: str) -> list[LayerSpec]:
    p = prefix
    specs = [spec(f"{p}.branch1x1", self.branch1x1, (fork,))]
    specs += self._split(p, "branch3x3", ["branch3x3_1"], ("branch3x3_2a", "branch3x3_2b"), fork)
    specs += self._split(p, "branch3x3dbl", ["branch3x3dbl_1", "branch3x3dbl_2"],
                         ("branch3x3dbl_3a", "branch3x3dbl_3b"), fork)
    specs += chain([(f"{p}.pool", self.pool), (f"{p}.branch_pool", self.branch_pool)], (fork,))
    ends = [f"{p}.branch1x1", f"{p}.branch3x3_concat", f"{p}.branch3x3dbl_concat",
            f"{p}.branch_pool"]
    specs.append(spec(f"{p}.concat", self.concat, ends))
    return specs

  def _split(self, p: str, branch: str, stem: list[str], pair: tuple[str, str],
             fork: str) -> list[LayerSpec]:
    """A branch: stem chain from `fork`, two parallel convs, then its own inner concat."""
    specs = chain([(f"{p}.{n}", getattr(self, n)) for n in stem], (fork,))
    inner = specs[-1].name
    specs += [spec(f"{p}.{n}", getattr(self, n), (inner,)) for n in pair]
    join = f"{branch}_concat"
    specs.append(spec(f"{p}.{join}", getattr(self, join), [f"{p}.{n}" for n in pair]))
    return specs


MIXED = ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
         "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c")


class InceptionV3(ImageModel):
  """Inception-v3: BasicConv2d stem, 11 Inception modules, global avg pool, fc."""

  min_image_size = MIN_IMAGE_SIZE

  def __init__(self, *, image_size: int = 299, num_classes: int = 1000,
               dtype: Any = jnp.float32, rngs: nnx.Rngs):
    self.image_size, self.num_classes = image_size, num_classes
    self.config = {"image_size": image_size, "num_classes": num_classes}
    c = _conv(dtype, rngs)
    kw = dict(dtype=dtype, rngs=rngs)
    self.Conv2d_1a_3x3 = c(3, 32, 3, stride=2)
    self.Conv2d_2a_3x3 = c(32, 32, 3)
    self.Conv2d_2b_3x3 = c(32, 64, 3, padding=1)
    self.maxpool1 = MaxPool2d(3, 2)
    self.Conv2d_3b_1x1 = c(64, 80, 1)
    self.Conv2d_4a_3x3 = c(80, 192, 3)
    self.maxpool2 = MaxPool2d(3, 2)
    self.Mixed_5b = InceptionA(192, 32, **kw)
    self.Mixed_5c = InceptionA(256, 64, **kw)
    self.Mixed_5d = InceptionA(288, 64, **kw)
    self.Mixed_6a = InceptionB(288, **kw)
    self.Mixed_6b = InceptionC(768, 128, **kw)
    self.Mixed_6c = InceptionC(768, 160, **kw)
    self.Mixed_6d = InceptionC(768, 160, **kw)
    self.Mixed_6e = InceptionC(768, 192, **kw)
    self.Mixed_7a = InceptionD(768, **kw)
    self.Mixed_7b = InceptionE(1280, **kw)
    self.Mixed_7c = InceptionE(2048, **kw)
    self.avgpool = AvgPool2d(global_pool=True)
    self.flatten = Flatten()
    self.fc = Linear(2048, num_classes, dtype=dtype, rngs=rngs)

  _STEM = ("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "maxpool1", "Conv2d_3b_1x1",
           "Conv2d_4a_3x3", "maxpool2")

  def __call__(self, x_BxHxWxC):
    x = x_BxHxWxC
    for name in self._STEM + MIXED:
      x = getattr(self, name)(x)
    return self.fc(self.flatten(self.avgpool(x)))

  def layer_specs(self) -> list[LayerSpec]:
    specs = chain([(n, getattr(self, n)) for n in self._STEM])
    for name in MIXED:
      specs += getattr(self, name).layer_specs(name, specs[-1].name)
    specs += chain([("avgpool", self.avgpool), ("flatten", self.flatten), ("fc", self.fc)],
                   (specs[-1].name,))
    return specs
