"""Closed-form FLOPs per kind agree with textbook counts and with XLA's (via the ref graphs)."""

import pytest
from profile_ref_graphs import inception_v3, resnet, vgg16

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerNode
from dp_jax.layer_times.formulas import activation_elems, forward_flops, gemm_shape


def test_model_totals_match_published_counts():
  # multiply-adds: VGG16 15.5 G, ResNet-50 4.1 G, Inception-v3 5.7 G (x2 for FLOPs)
  assert vgg16().total_flops_per_sample == pytest.approx(31.0e9, rel=0.01)
  assert resnet().total_flops_per_sample == pytest.approx(8.2e9, rel=0.02)
  assert inception_v3().total_flops_per_sample == pytest.approx(11.5e9, rel=0.02)


def test_conv_flops_and_gemm_shape():
  node = LayerNode("c", "conv2d", out_shape=(8, 8, 16),
                   attrs={"in_channels": 4, "out_channels": 16, "kernel_size": [3, 3]})
  assert forward_flops(node, [(8, 8, 4)]) == 2 * 9 * 4 * 8 * 8 * 16
  assert gemm_shape(node) == (64, 16)
  assert activation_elems(node, [(8, 8, 4)]) == 8 * 8 * 4 + 8 * 8 * 16


def test_flatten_moves_no_data():
  node = LayerNode("f", "flatten", out_shape=(32,))
  assert forward_flops(node, [(2, 2, 8)]) == 0 and activation_elems(node, [(2, 2, 8)]) == 0


def test_unknown_kind_without_costs_is_an_error():
  with pytest.raises(UserError, match="kind 'lstm'"):
    forward_flops(LayerNode("x", "lstm"), [(4,)])
