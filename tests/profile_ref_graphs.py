"""Hand-built LayerGraphs (VGG16, ResNet-50/WRN, Inception-v3) with the zoo's attrs contract."""

from __future__ import annotations

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.layer_times.formulas import forward_flops

F32 = 4


class _Builder:
  """Appends LayerNodes, tracking per-sample shapes (HWC) by node name."""

  def __init__(self, model: str, input_shape: tuple[int, ...]):
    self.model, self.input_shape = model, input_shape
    self.nodes: list[LayerNode] = []
    self.shape: dict[str, tuple[int, ...]] = {}

  def _in(self, inputs: tuple[str, ...]) -> list[tuple[int, ...]]:
    return [self.shape[i] for i in inputs] if inputs else [self.input_shape]

  def add(self, name, kind, inputs, out_shape, attrs, params=0) -> str:
    node = LayerNode(name=name, kind=kind, inputs=tuple(inputs), params=params,
                     param_bytes=params * F32, out_shape=tuple(out_shape),
                     out_bytes_per_sample=F32 * _prod(out_shape), attrs=attrs)
    flops = forward_flops(node, self._in(tuple(inputs)))
    node = LayerNode(**{**node.__dict__, "flops_per_sample": flops})
    self.nodes.append(node)
    self.shape[name] = tuple(out_shape)
    return name

  def conv(self, name, x, cout, k, s=1, p=0, bn=True, act="relu") -> str:
    h, w, c = self._in((x,) if x else ())[0]
    kh, kw = (k, k) if isinstance(k, int) else k
    sh, sw = (s, s) if isinstance(s, int) else s
    ph, pw = (p, p) if isinstance(p, int) else p
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    attrs = {"in_channels": c, "out_channels": cout, "kernel_size": [kh, kw],
             "stride": [sh, sw], "padding": [ph, pw], "batch_norm": bn, "activation": act,
             "in_shape": [h, w, c]}
    params = kh * kw * c * cout + (2 * cout if bn else cout)
    return self.add(name, "conv2d", (x,) if x else (), (ho, wo, cout), attrs, params)

  def pool(self, name, x, kind, k, s, p=0) -> str:
    h, w, c = self.shape[x]
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    attrs = {"kernel_size": [k, k], "stride": [s, s], "padding": [p, p], "in_shape": [h, w, c],
             "global": False}
    return self.add(name, kind, (x,), (ho, wo, c), attrs)

  def gap(self, name, x) -> str:
    h, w, c = self.shape[x]
    attrs = {"kernel_size": [h, w], "stride": [h, w], "padding": [0, 0], "in_shape": [h, w, c],
             "global": True}
    return self.add(name, "avgpool", (x,), (1, 1, c), attrs)

  def relu(self, name, x) -> str:
    return self.add(name, "relu", (x,), self.shape[x], {"in_shape": list(self.shape[x])})

  def flatten(self, name, x) -> str:
    n = _prod(self.shape[x])
    return self.add(name, "flatten", (x,), (n,), {"in_shape": list(self.shape[x])})

  def linear(self, name, x, out) -> str:
    (n,) = self.shape[x]
    return self.add(name, "linear", (x,), (out,),
                    {"in_features": n, "out_features": out, "bias": True}, n * out + out)

  def join(self, name, kind, xs) -> str:
    shapes = [self.shape[x] for x in xs]
    if kind == "add":
      out = shapes[0]
    else:
      out = shapes[0][:-1] + (sum(s[-1] for s in shapes),)
    attrs = {"in_shape": list(shapes[0]), "in_shapes": [list(s) for s in shapes]}
    if kind == "add":
      attrs["activation"] = "relu"
    return self.add(name, kind, tuple(xs), out, attrs)

  def graph(self) -> LayerGraph:
    return LayerGraph(self.model, self.input_shape, "float32", tuple(self.nodes))


def _prod(shape) -> int:
  n = 1
  for d in shape:
    n *= int(d)
  return n


def vgg16(image_size: int = 224, num_classes: int = 1000) -> LayerGraph:
  """VGG16: conv, relu (separate), maxpool, flatten, 3 linears with 2 relus."""
  b = _Builder("vgg16", (image_size, image_size, 3))
  cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
  x, i = "", 0
  for v in cfg:
    if v == "M":
      x = b.pool(f"features.{i}", x, "maxpool", 2, 2)
      i += 1
    else:
      x = b.conv(f"features.{i}", x, v, 3, 1, 1, bn=False, act=None)
      x = b.relu(f"features.{i + 1}", x)
      i += 2
  x = b.flatten("flatten", x)
  x = b.linear("classifier.0", x, 4096)
  x = b.relu("classifier.1", x)
  x = b.linear("classifier.3", x, 4096)
  x = b.relu("classifier.4", x)
  b.linear("classifier.6", x, num_classes)
  return b.graph()


def resnet(depths=(3, 4, 6, 3), width_per_group=64, image_size=224, num_classes=1000,
           model="resnet50") -> LayerGraph:
  """Bottleneck ResNet (ResNet-50 by default; width_per_group=128, depths 3,4,23,3: WRN-101-2)."""
  b = _Builder(model, (image_size, image_size, 3))
  x = b.conv("conv1", "", 64, 7, 2, 3)
  x = b.pool("maxpool", x, "maxpool", 3, 2, 1)
  cin = 64
  for li, (n, planes) in enumerate(zip(depths, (64, 128, 256, 512), strict=True)):
    width = planes * width_per_group // 64
    for bi in range(n):
      s = 2 if (bi == 0 and li > 0) else 1
      p = f"layer{li + 1}.{bi}"
      y = b.conv(f"{p}.conv1", x, width, 1)
      y = b.conv(f"{p}.conv2", y, width, 3, s, 1)
      y = b.conv(f"{p}.conv3", y, planes * 4, 1, act=None)
      sc = x
      if bi == 0:
        sc = b.conv(f"{p}.downsample", x, planes * 4, 1, s, act=None)
      x = b.join(f"{p}.add", "add", [y, sc])
      cin = planes * 4
  del cin
  x = b.gap("avgpool", x)
  x = b.flatten("flatten", x)
  b.linear("fc", x, num_classes)
  return b.graph()


def wide_resnet101_2(image_size=224, num_classes=1000) -> LayerGraph:
  return resnet((3, 4, 23, 3), 128, image_size, num_classes, "wide_resnet101_2")


def inception_v3(image_size=299, num_classes=1000) -> LayerGraph:
  """Inception-v3 (torchvision layout, no aux head): BasicConv2d convs, concat joins."""
  b = _Builder("inception_v3", (image_size, image_size, 3))
  x = b.conv("Conv2d_1a_3x3", "", 32, 3, 2)
  x = b.conv("Conv2d_2a_3x3", x, 32, 3)
  x = b.conv("Conv2d_2b_3x3", x, 64, 3, 1, 1)
  x = b.pool("maxpool1", x, "maxpool", 3, 2)
  x = b.conv("Conv2d_3b_1x1", x, 80, 1)
  x = b.conv("Conv2d_4a_3x3", x, 192, 3)
  x = b.pool("maxpool2", x, "maxpool", 3, 2)

  def block_a(p, x, pool_features):
    b1 = b.conv(f"{p}.branch1x1", x, 64, 1)
    b5 = b.conv(f"{p}.branch5x5_1", x, 48, 1)
    b5 = b.conv(f"{p}.branch5x5_2", b5, 64, 5, 1, 2)
    b3 = b.conv(f"{p}.branch3x3dbl_1", x, 64, 1)
    b3 = b.conv(f"{p}.branch3x3dbl_2", b3, 96, 3, 1, 1)
    b3 = b.conv(f"{p}.branch3x3dbl_3", b3, 96, 3, 1, 1)
    bp = b.pool(f"{p}.avgpool", x, "avgpool", 3, 1, 1)
    bp = b.conv(f"{p}.branch_pool", bp, pool_features, 1)
    return b.join(f"{p}.concat", "concat", [b1, b5, b3, bp])

  def block_b(p, x):
    b3 = b.conv(f"{p}.branch3x3", x, 384, 3, 2)
    bd = b.conv(f"{p}.branch3x3dbl_1", x, 64, 1)
    bd = b.conv(f"{p}.branch3x3dbl_2", bd, 96, 3, 1, 1)
    bd = b.conv(f"{p}.branch3x3dbl_3", bd, 96, 3, 2)
    bp = b.pool(f"{p}.maxpool", x, "maxpool", 3, 2)
    return b.join(f"{p}.concat", "concat", [b3, bd, bp])

  def block_c(p, x, c7):
    b1 = b.conv(f"{p}.branch1x1", x, 192, 1)
    b7 = b.conv(f"{p}.branch7x7_1", x, c7, 1)
    b7 = b.conv(f"{p}.branch7x7_2", b7, c7, (1, 7), 1, (0, 3))
    b7 = b.conv(f"{p}.branch7x7_3", b7, 192, (7, 1), 1, (3, 0))
    bd = b.conv(f"{p}.branch7x7dbl_1", x, c7, 1)
    bd = b.conv(f"{p}.branch7x7dbl_2", bd, c7, (7, 1), 1, (3, 0))
    bd = b.conv(f"{p}.branch7x7dbl_3", bd, c7, (1, 7), 1, (0, 3))
    bd = b.conv(f"{p}.branch7x7dbl_4", bd, c7, (7, 1), 1, (3, 0))
    bd = b.conv(f"{p}.branch7x7dbl_5", bd, 192, (1, 7), 1, (0, 3))
    bp = b.pool(f"{p}.avgpool", x, "avgpool", 3, 1, 1)
    bp = b.conv(f"{p}.branch_pool", bp, 192, 1)
    return b.join(f"{p}.concat", "concat", [b1, b7, bd, bp])

  def block_d(p, x):
    b3 = b.conv(f"{p}.branch3x3_1", x, 192, 1)
    b3 = b.conv(f"{p}.branch3x3_2", b3, 320, 3, 2)
    b7 = b.conv(f"{p}.branch7x7x3_1", x, 192, 1)
    b7 = b.conv(f"{p}.branch7x7x3_2", b7, 192, (1, 7), 1, (0, 3))
    b7 = b.conv(f"{p}.branch7x7x3_3", b7, 192, (7, 1), 1, (3, 0))
    b7 = b.conv(f"{p}.branch7x7x3_4", b7, 192, 3, 2)
    bp = b.pool(f"{p}.maxpool", x, "maxpool", 3, 2)
    return b.join(f"{p}.concat", "concat", [b3, b7, bp])

  def block_e(p, x):
    b1 = b.conv(f"{p}.branch1x1", x, 320, 1)
    b3 = b.conv(f"{p}.branch3x3_1", x, 384, 1)
    b3a = b.conv(f"{p}.branch3x3_2a", b3, 384, (1, 3), 1, (0, 1))
    b3b = b.conv(f"{p}.branch3x3_2b", b3, 384, (3, 1), 1, (1, 0))
    b3 = b.join(f"{p}.concat3x3", "concat", [b3a, b3b])
    bd = b.conv(f"{p}.branch3x3dbl_1", x, 448, 1)
    bd = b.conv(f"{p}.branch3x3dbl_2", bd, 384, 3, 1, 1)
    bda = b.conv(f"{p}.branch3x3dbl_3a", bd, 384, (1, 3), 1, (0, 1))
    bdb = b.conv(f"{p}.branch3x3dbl_3b", bd, 384, (3, 1), 1, (1, 0))
    bd = b.join(f"{p}.concat3x3dbl", "concat", [bda, bdb])
    bp = b.pool(f"{p}.avgpool", x, "avgpool", 3, 1, 1)
    bp = b.conv(f"{p}.branch_pool", bp, 192, 1)
    return b.join(f"{p}.concat", "concat", [b1, b3, bd, bp])

  x = block_a("Mixed_5b", x, 32)
  x = block_a("Mixed_5c", x, 64)
  x = block_a("Mixed_5d", x, 64)
  x = block_b("Mixed_6a", x)
  for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
    x = block_c(name, x, c7)
  x = block_d("Mixed_7a", x)
  x = block_e("Mixed_7b", x)
  x = block_e("Mixed_7c", x)
  x = b.gap("avgpool", x)
  x = b.flatten("flatten", x)
  b.linear("fc", x, num_classes)
  return b.graph()
