"""Signatures that pair a LayerGraph layer with a DeepPool row: kind, parameters, input dims."""

from __future__ import annotations

from typing import Any

from dp_jax.graph.layer_graph import ForkJoinBlock, LayerGraph, LayerNode
from dp_jax.layer_times.deeppool_rows import Row

Signature = tuple[str, tuple, tuple[int, ...]]  # (kind, parameters, per-sample dims)

_ROW_KIND = {"conv2d": "conv2d", "ReLU2d": "relu", "ReLU1d": "relu", "maxPool2d": "maxpool",
             "avgPool2d": "avgpool", "adAvgPool2d": "gap", "flatten": "flatten",
             "linear": "linear", "concat": "concat", "ResnetBottleneck": "bottleneck",
             # the ViT's pieces (dp_jax/models/vit.py follows DeepPool's examples/vit.py)
             "prep": "patch_embed", "TransBlockA": "self_attention", "TransBlockB": "mlp_block",
             "prepOut": "class_token"}


def _pair(v: Any) -> tuple[int, int]:
  if isinstance(v, (list, tuple)):
    return (int(v[0]), int(v[-1]))
  return (int(v), int(v))


def chw(shape) -> tuple[int, ...]:
  """Our per-sample HWC shape as DeepPool's CHW dims (1-d shapes unchanged)."""
  shape = tuple(int(d) for d in shape)
  return (shape[2], shape[0], shape[1]) if len(shape) == 3 else shape


def row_signature(row: Row) -> Signature | None:
  """The signature of a DeepPool row (None for kinds we never match)."""
  kind = _ROW_KIND.get(row.kind)
  p = row.params
  if kind == "conv2d":
    sig = (int(p["in_channels"]), int(p["out_channels"]), _pair(p["kernel_size"]),
           _pair(p.get("stride", 1)), _pair(p.get("padding", 0)))
  elif kind in ("maxpool", "avgpool"):
    sig = (_pair(p["kernel_size"]), _pair(p.get("stride", p["kernel_size"])),
           _pair(p.get("padding", 0)))
  elif kind == "linear":
    sig = (int(p["in_features"]), int(p["out_features"]))
  elif kind == "bottleneck":
    ds = p.get("downsampleParams")
    sig = (int(p["inplanes"]), int(p["planes"]), int(p.get("base_width", 64)),
           int(p.get("stride", 1)), ds is not None)
  elif kind == "patch_embed":
    sig = (int(p["dim"]), int(p["img_dim"]), int(p["in_channels"]), int(p["patch_dim"]),
           float(p.get("dropout", 0.0)))
  elif kind == "self_attention":
    sig = (int(p["dim"]), int(p["heads"]), int(p["dim_head"]))
  elif kind == "mlp_block":
    sig = (int(p["dim"]), int(p["dim_linear_block"]))
  elif kind in ("relu", "gap", "flatten", "concat", "class_token"):
    sig = ()
  else:
    return None
  return (kind, sig, tuple(row.dims))


def node_signature(graph: LayerGraph, node: LayerNode) -> Signature | None:
  """The signature a DeepPool row for this layer would have (None: DeepPool has no such row)."""
  a, k = node.attrs, node.kind
  in_shape = tuple(a.get("in_shape") or (graph.node(node.inputs[0]).out_shape if node.inputs
                                         else graph.input_shape))
  if k == "conv2d":
    return ("conv2d", (int(a["in_channels"]), int(a["out_channels"]), _pair(a["kernel_size"]),
                       _pair(a.get("stride", 1)), _pair(a.get("padding", 0))), chw(in_shape))
  if k == "relu":
    return ("relu", (), chw(in_shape))
  if k in ("maxpool", "avgpool"):
    if a.get("global"):
      return ("gap", (), chw(in_shape)) if k == "avgpool" else None
    return (k, (_pair(a["kernel_size"]), _pair(a.get("stride", a["kernel_size"])),
                _pair(a.get("padding", 0))), chw(in_shape))
  if k == "flatten":
    return ("flatten", (), chw(in_shape))
  if k == "linear":
    return ("linear", (int(a["in_features"]), int(a["out_features"])), (int(a["in_features"]),))
  if k == "concat":
    return ("concat", (), chw(node.out_shape))
  if k == "patch_embed":  # DeepPool's dropout 0.0: none, as ours
    return ("patch_embed", (int(a["dim"]), int(a["image_size"]), int(a["in_channels"]),
                            int(a["patch_size"]), 0.0), chw(in_shape))
  if k == "self_attention":
    return ("self_attention", (int(a["dim"]), int(a["heads"]), int(a["dim_head"])),
            tuple(in_shape))
  if k == "mlp_block":
    return ("mlp_block", (int(a["dim"]), int(a["hidden"])), tuple(in_shape))
  if k == "class_token":
    return ("class_token", (), tuple(in_shape))
  return None


def bottleneck_blocks(graph: LayerGraph) -> list[tuple[ForkJoinBlock, Signature, list[str]]]:
  """ResNet bottleneck blocks: (block, DeepPool ResnetBottleneck signature, its layers).

  A bottleneck is a fork/join block joined by 'add' whose longest branch is three conv2d
  layers (1x1, 3x3, 1x1) and whose other branch is empty or one conv2d (the downsample).
  """
  out = []
  for blk in graph.fork_join_blocks():
    if graph.node(blk.join).kind != "add" or len(blk.branches) != 2:
      continue
    main, short = sorted(blk.branches, key=len, reverse=True)
    nodes = [graph.node(n) for n in main]
    if len(nodes) != 3 or any(n.kind != "conv2d" for n in nodes) or len(short) > 1:
      continue
    if short and graph.node(short[0]).kind != "conv2d":
      continue
    c1, c2, c3 = (n.attrs for n in nodes)
    planes = int(c3["out_channels"]) // 4
    width = int(c1["out_channels"])
    stride = _pair(c2.get("stride", 1))[0]
    base_width = width * 64 // planes if planes else 64
    sig = ("bottleneck", (int(c1["in_channels"]), planes, base_width, stride, bool(short)),
           chw(graph.node(blk.fork).out_shape))
    out.append((blk, sig, [*main, *short, blk.join]))
  return out
