"""Closed-form forward FLOPs, activation bytes and kernel counts per layer kind (from attrs)."""

from __future__ import annotations

import math

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode

# Kinds whose fused kernels' traffic a formula states (activation_elems): a batch norm's two
# passes over a convolution's output, a transformer block's intermediates, a gather's rows.
FUSED_TRAFFIC_KINDS = ("conv2d", "transformer_block", "embed", "flatten")
KNOWN_KINDS = ("conv2d", "linear", "relu", "maxpool", "avgpool", "flatten", "add", "concat",
               "transformer_block", "embed", "lm_head", "class_token")


def input_shapes(graph: LayerGraph, node: LayerNode) -> list[tuple[int, ...]]:
  """Per-sample shapes of the tensors a node reads (the model input for the source node)."""
  if not node.inputs:
    return [tuple(graph.input_shape)]
  return [tuple(graph.node(p).out_shape) for p in node.inputs]


def _pair(v) -> tuple[int, int]:
  if isinstance(v, (list, tuple)):
    return (int(v[0]), int(v[-1]))
  return (int(v), int(v))


def _numel(shape) -> int:
  return math.prod(int(d) for d in shape) if shape else 1


def forward_flops(node: LayerNode, in_shapes: list[tuple[int, ...]]) -> float:
  """Forward FLOPs per sample (a multiply-add counts 2), as XLA's cost analysis counts them."""
  a, out = node.attrs, _numel(node.out_shape)
  k = node.kind
  if k == "conv2d":
    kh, kw = _pair(a["kernel_size"])
    f = 2.0 * kh * kw * int(a["in_channels"]) * out
    if a.get("batch_norm"):
      f += 4.0 * out  # mean, variance, normalize, scale+shift
    if a.get("activation"):
      f += out
    return f
  if k == "linear":
    return 2.0 * int(a["in_features"]) * int(a["out_features"]) * _lead(node.out_shape)
  if k in ("relu", "add"):
    return float(out) * max(1, len(in_shapes) - (k == "relu"))
  if k in ("maxpool", "avgpool"):
    if a.get("global"):
      return float(_numel(in_shapes[0]))
    kh, kw = _pair(a["kernel_size"])
    return float(kh * kw * out)
  if k in ("flatten", "concat", "class_token"):  # class_token: a slice (dp_jax/models/vit.py)
    return 0.0
  if k == "transformer_block":
    d, s = int(a["d_model"]), int(a["seq_len"])
    return s * (24.0 * d * d + 4.0 * s * d)  # QKV+proj 8d^2, MLP 16d^2, scores and mix 4sd
  if k == "embed":
    return 0.0
  if k == "lm_head":
    return 2.0 * int(a.get("d_model", 0)) * int(a.get("vocab_size", 0)) * int(a.get("seq_len", 1))
  raise UserError(f"layer '{node.name}' has kind '{k}', which has no cost formula (known: "
                  f"{', '.join(KNOWN_KINDS)}); trace it with dp_jax.models.trace to get XLA's "
                  "costs")


def _lead(shape) -> int:
  """Rows of a linear layer per sample (tokens for sequence inputs, else 1)."""
  return _numel(shape[:-1]) if len(shape) > 1 else 1


def io_elems(node: LayerNode, in_shapes: list[tuple[int, ...]]) -> float:
  """Elements a forward pass must read and write whatever its kernels: its inputs and output
  (a reshape moves nothing; a gather reads its rows, which are its output)."""
  if node.kind == "flatten":
    return 0.0
  out = _numel(node.out_shape)
  if node.kind == "embed":
    return float(out)
  return float(sum(_numel(s) for s in in_shapes) + out)


def activation_elems(node: LayerNode, in_shapes: list[tuple[int, ...]]) -> float:
  """Activation elements a forward pass reads and writes per sample (inputs + output)."""
  out = _numel(node.out_shape)
  if node.kind == "flatten":
    return 0.0  # a reshape: no data movement in XLA
  if node.kind == "embed":
    return float(out)  # gather rows of the table: the output is written, ids are tiny
  extra = 0
  if node.kind == "conv2d" and node.attrs.get("batch_norm"):
    extra = 2 * out  # batch statistics read the conv output, normalize reads it again
  if node.kind == "transformer_block":
    s, d = int(node.attrs["seq_len"]), int(node.attrs["d_model"])
    n_head = int(node.attrs.get("n_head", 1))
    extra = 10 * s * d + 2 * n_head * s * s  # q, k, v, attn out, 4d MLP hidden; score matrix
  return float(sum(_numel(s) for s in in_shapes) + out + extra)


def forward_kernels(node: LayerNode) -> int:
  """Kernels a forward pass of the layer launches (at least 1: nothing is free)."""
  if node.kind == "conv2d":
    return 1 + (2 if node.attrs.get("batch_norm") else 0)
  if node.kind == "transformer_block":
    return 12  # 2 layer norms, QKV, scores, softmax, mix, proj, 2 adds, 2 MLP matmuls, gelu
  return 1


def gemm_shape(node: LayerNode) -> tuple[int, int] | None:
  """(output rows per sample, output columns) of the layer's matrix product, None if it has none.

  A convolution runs as an implicit GEMM whose output is (batch x Ho x Wo) x C_out; a linear
  layer's is (batch x tokens) x out_features; a transformer block's largest is (batch x seq) x
  4 d_model (its MLP).
  """
  a, k = node.attrs, node.kind
  if k == "conv2d":
    return _numel(node.out_shape[:-1]), int(a["out_channels"])
  if k == "linear":
    return _lead(node.out_shape), int(a["out_features"])
  if k == "transformer_block":
    return int(a["seq_len"]), 4 * int(a["d_model"])
  if k == "lm_head":
    return int(a.get("seq_len", 1)), int(a.get("vocab_size", 1))
  return None
