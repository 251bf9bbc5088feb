"""Layer modules: torch-compatible pooling/padding semantics and their attrs."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from dp_jax.models.layers import Add, AvgPool2d, Concat, Conv2d, Flatten, Linear, MaxPool2d, ReLU


def test_conv2d_attrs_and_output_shape():
  conv = Conv2d(4, 8, (1, 7), stride=2, padding=(0, 3), batch_norm=True, activation="relu",
                rngs=nnx.Rngs(0))
  assert conv.attrs() == {"in_channels": 4, "out_channels": 8, "kernel_size": [1, 7],
                          "stride": [2, 2], "padding": [0, 3], "batch_norm": True,
                          "activation": "relu"}
  y = conv(jnp.ones((2, 9, 9, 4)))
  assert y.shape == (2, 5, 5, 8) and float(y.min()) >= 0.0
  assert conv.conv.bias is None  # batch norm supplies the shift


def test_conv2d_without_batch_norm_has_bias():
  conv = Conv2d(3, 5, 3, padding=1, rngs=nnx.Rngs(0))
  assert conv.bn is None and conv.conv.bias.shape == (5,)
  assert conv(jnp.ones((1, 4, 4, 3))).shape == (1, 4, 4, 5)


def test_maxpool_pads_with_minus_infinity_like_torch():
  x = -jnp.arange(1.0, 17.0).reshape(1, 4, 4, 1)
  y = MaxPool2d(3, 2, 1)(x)
  assert y.shape == (1, 2, 2, 1)
  assert float(y[0, 0, 0, 0]) == -1.0  # a zero pad would have won


def test_avgpool_counts_padding_like_torch_default():
  y = AvgPool2d(3, 1, 1)(jnp.ones((1, 3, 3, 1)))
  np.testing.assert_allclose(float(y[0, 0, 0, 0]), 4.0 / 9.0, rtol=1e-6)


def test_global_avgpool_keeps_a_1x1_map_then_flatten():
  x = jnp.arange(8.0).reshape(1, 2, 2, 2)
  pool = AvgPool2d(global_pool=True)
  y = pool(x)
  assert y.shape == (1, 1, 1, 2)
  np.testing.assert_allclose(Flatten()(y), [[3.0, 4.0]])
  assert pool.attrs() == {"kernel_size": None, "stride": [1, 1], "padding": [0, 0],
                          "global": True}


def test_joins_and_relu():
  a, b = jnp.full((1, 2, 2, 3), -2.0), jnp.ones((1, 2, 2, 3))
  assert float(Add("relu")(a, b).max()) == 0.0
  assert float(Add()(a, b).min()) == -1.0
  assert Concat()(a, b).shape == (1, 2, 2, 6)
  assert float(ReLU()(a).max()) == 0.0


def test_linear_attrs():
  fc = Linear(6, 4, rngs=nnx.Rngs(0))
  assert fc.attrs() == {"in_features": 6, "out_features": 4, "bias": True}
  assert fc(jnp.ones((2, 6))).shape == (2, 4)
