"""Planner-visible layer modules of the image models (one module = one graph node)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dp_jax.models import init, ops


def pair(v: int | Sequence[int]) -> tuple[int, int]:
  """(v, v) for an int, else the two ints of v."""
  if isinstance(v, int):
    return (v, v)
  a, b = v
  return (int(a), int(b))


class Conv2d(nnx.Module):
  """Convolution, optionally with batch norm and ReLU fused into the same planner layer."""

  kind = "conv2d"

  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], *,
               stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
               batch_norm: bool = False, activation: str | None = None,
               bn_eps: float = 1e-5, dtype: Any = jnp.float32, rngs: nnx.Rngs):
    if activation not in (None, "relu"):
      raise ValueError(f"activation must be None or 'relu', got {activation!r}")
    self.in_channels, self.out_channels = in_channels, out_channels
    self.kernel_size, self.stride, self.padding = pair(kernel_size), pair(stride), pair(padding)
    self.batch_norm, self.activation = batch_norm, activation
    ph, pw = self.padding
    self.conv = nnx.Conv(in_channels, out_channels, self.kernel_size, self.stride,
                         padding=((ph, ph), (pw, pw)), use_bias=not batch_norm,
                         kernel_init=init.kaiming_normal_fan_out(), dtype=dtype,
                         param_dtype=dtype, rngs=rngs)
    # torch momentum 0.1 == flax momentum 0.9; train mode (batch statistics) by default
    self.bn = (nnx.BatchNorm(out_channels, momentum=0.9, epsilon=bn_eps, dtype=dtype,
                             param_dtype=dtype, rngs=rngs) if batch_norm else None)
    # Batch-norm statistics over the whole batch (1) or over each of G equal contiguous slices
    # of it: per-device statistics when the layer's batch is split over G devices (the runtime
    # sets it for batch_norm=local; dp_jax/runtime/batch_norm.py).
    self.stats_groups = 1

  def __call__(self, x_BxHxWxC):
    y = self.conv(x_BxHxWxC)
    if self.bn is not None:
      if self.stats_groups > 1 and not self.bn.use_running_average:
        y = grouped_batch_norm(self.bn, y, self.stats_groups)
      else:
        y = self.bn(y)
    return ops.relu(y) if self.activation == "relu" else y

  def attrs(self) -> dict[str, Any]:
    return {"in_channels": self.in_channels, "out_channels": self.out_channels,
            "kernel_size": list(self.kernel_size), "stride": list(self.stride),
            "padding": list(self.padding), "batch_norm": self.batch_norm,
            "activation": self.activation}


def grouped_batch_norm(bn: nnx.BatchNorm, y_BxHxWxC, groups: int):
  """Training-mode batch norm with statistics per contiguous slice of B / groups samples
  (flax's formulas: biased variance E[x^2] - E[x]^2); running statistics move toward the mean
  of the slices' statistics."""
  b = y_BxHxWxC.shape[0]
  y_GxSxHxWxC = y_BxHxWxC.reshape(groups, b // groups, *y_BxHxWxC.shape[1:])
  axes = tuple(range(1, y_GxSxHxWxC.ndim - 1))
  mean_Gx1x1x1xC = y_GxSxHxWxC.mean(axis=axes, keepdims=True)
  var_Gx1x1x1xC = jnp.maximum(
      0.0, jnp.square(y_GxSxHxWxC).mean(axis=axes, keepdims=True) - jnp.square(mean_Gx1x1x1xC))
  m = bn.momentum
  bn.mean[...] = jax.lax.stop_gradient(m * bn.mean[...] + (1 - m) * mean_Gx1x1x1xC.mean(
      axis=0).reshape(-1))
  bn.var[...] = jax.lax.stop_gradient(m * bn.var[...] + (1 - m) * var_Gx1x1x1xC.mean(
      axis=0).reshape(-1))
  out = (y_GxSxHxWxC - mean_Gx1x1x1xC) * jax.lax.rsqrt(var_Gx1x1x1xC + bn.epsilon)
  if bn.scale is not None:
    out = out * bn.scale[...]
  if bn.bias is not None:
    out = out + bn.bias[...]
  return out.reshape(y_BxHxWxC.shape)


class Linear(nnx.Linear):
  """Fully connected layer over the last axis (LeCun-normal kernel, zero bias)."""

  kind = "linear"

  def __init__(self, in_features: int, out_features: int, *, dtype: Any = jnp.float32,
               rngs: nnx.Rngs, **kw):
    kw.setdefault("kernel_init", init.lecun_normal())
    super().__init__(in_features, out_features, dtype=dtype, param_dtype=dtype, rngs=rngs, **kw)

  def attrs(self) -> dict[str, Any]:
    return {"in_features": self.in_features, "out_features": self.out_features,
            "bias": self.use_bias}


class ReLU(nnx.Module):
  """Elementwise max(x, 0) as its own planner layer."""

  kind = "relu"

  def __call__(self, x):
    return ops.relu(x)

  def attrs(self) -> dict[str, Any]:
    return {}


class _Pool2d(nnx.Module):
  """Shared set-up of the 2-D pooling layers (global = pool the whole spatial extent)."""

  kind = ""

  def __init__(self, kernel_size: int | Sequence[int] | None = None,
               stride: int | Sequence[int] | None = None, padding: int | Sequence[int] = 0, *,
               global_pool: bool = False):
    if not global_pool and kernel_size is None:
      raise ValueError("a non-global pool needs a kernel_size")
    self.global_pool = global_pool
    self.kernel_size = None if global_pool else pair(kernel_size)
    self.stride = (1, 1) if global_pool else pair(stride if stride is not None else kernel_size)
    self.padding = (0, 0) if global_pool else pair(padding)

  def _window(self):
    ph, pw = self.padding
    return dict(window_shape=self.kernel_size, strides=self.stride,
                padding=((ph, ph), (pw, pw)))

  def attrs(self) -> dict[str, Any]:
    return {"kernel_size": None if self.kernel_size is None else list(self.kernel_size),
            "stride": list(self.stride), "padding": list(self.padding),
            "global": self.global_pool}


class MaxPool2d(_Pool2d):
  """Max pooling over H, W (padding counts as -inf, as in torch)."""

  kind = "maxpool"

  def __call__(self, x_BxHxWxC):
    if self.global_pool:
      return jnp.max(x_BxHxWxC, axis=(1, 2), keepdims=True)
    return nnx.max_pool(x_BxHxWxC, **self._window())


class AvgPool2d(_Pool2d):
  """Average pooling over H, W (zero padding counted in the mean, as torch's default)."""

  kind = "avgpool"

  def __call__(self, x_BxHxWxC):
    if self.global_pool:
      return jnp.mean(x_BxHxWxC, axis=(1, 2), keepdims=True)
    return nnx.avg_pool(x_BxHxWxC, count_include_pad=True, **self._window())


class Flatten(nnx.Module):
  """Reshape (B, ...) to (B, features)."""

  kind = "flatten"

  def __call__(self, x):
    return x.reshape(x.shape[0], -1)

  def attrs(self) -> dict[str, Any]:
    return {}


class Add(nnx.Module):
  """Join of a residual block: sum of its inputs, then an optional ReLU."""

  kind = "add"

  def __init__(self, activation: str | None = None):
    if activation not in (None, "relu"):
      raise ValueError(f"activation must be None or 'relu', got {activation!r}")
    self.activation = activation

  def __call__(self, *xs):
    y = xs[0]
    for x in xs[1:]:
      y = y + x
    return ops.relu(y) if self.activation == "relu" else y

  def attrs(self) -> dict[str, Any]:
    return {"activation": self.activation}


class Concat(nnx.Module):
  """Join of parallel branches: concatenation along the channel (last) axis."""

  kind = "concat"

  def __call__(self, *xs):
    return jnp.concatenate(xs, axis=-1)

  def attrs(self) -> dict[str, Any]:
    return {}
