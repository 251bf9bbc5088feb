"""Measured profiles: every layer timed at every batch, and a second run served from cache."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.measurement import alone as measure
from dp_jax.models.base import ImageModel, LayerSpec, chain
from dp_jax.models.layers import Conv2d, Flatten, Linear, ReLU
from dp_jax.models.trace import trace_graph


class Tiny(ImageModel):
  """conv(bn, relu) -> relu -> flatten -> linear on 8x8 images."""

  def __init__(self, out_features: int = 3):
    rngs = nnx.Rngs(0)
    self.image_size, self.num_classes = 8, out_features
    self.config = {"image_size": 8}
    self.conv = Conv2d(3, 4, 3, padding=1, batch_norm=True, activation="relu", rngs=rngs)
    self.relu = ReLU()
    self.flatten = Flatten()
    self.fc = Linear(256, out_features, rngs=rngs)

  def __call__(self, x):
    return self.fc(self.flatten(self.relu(self.conv(x))))

  def layer_specs(self) -> list[LayerSpec]:
    return chain([("conv", self.conv), ("relu", self.relu), ("flatten", self.flatten),
                  ("fc", self.fc)])


@pytest.fixture
def counted(monkeypatch):
  calls = []
  real = measure.time_layer

  def spy(module, ins, batch, **kw):
    calls.append((type(module).__name__, batch))
    return real(module, ins, batch, **kw)

  monkeypatch.setattr(measure, "time_layer", spy)
  return calls


def test_measure_then_cache(tmp_path, counted):
  model = Tiny()
  g = trace_graph(model, "tiny")
  kw = dict(cache_dir=tmp_path, repeats=2, warmup=1, progress=False)
  first = measure.measure_profile(model, g, [1, 2], **kw)
  assert first.source == "measured" and first.device == jax.devices()[0].device_kind
  assert len(counted) == 8
  for name in g.names:
    assert first.batches(name) == [1, 2]
    t = first.lookup(name, 2)
    assert t.fwd_ms > 0 and t.bwd_ms >= 0
  second = measure.measure_profile(model, g, [1, 2], **kw)
  assert len(counted) == 8  # nothing re-measured
  assert second.layers == first.layers
  assert second.meta["counts"] == {"measured": 0, "cached": 8, "shared": 0}


def test_changed_layer_is_remeasured(tmp_path, counted):
  kw = dict(cache_dir=tmp_path, repeats=1, warmup=0, progress=False)
  model = Tiny(3)
  measure.measure_profile(model, trace_graph(model, "tiny"), [1], **kw)
  other = Tiny(5)  # fc's attrs change: only fc is timed again
  measure.measure_profile(other, trace_graph(other, "tiny"), [1], **kw)
  assert counted[4:] == [("Linear", 1)]


def test_a_timing_made_under_other_xla_flags_is_measured_again(tmp_path, counted, monkeypatch):
  # the flags (an optimisation level, say) are part of what a timing is; the host device count
  # is not (the key holds the devices)
  kw = dict(cache_dir=tmp_path, repeats=1, warmup=0, progress=False)
  model = Tiny()
  g = trace_graph(model, "tiny")
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  measure.measure_profile(model, g, [1], **kw)
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  again = measure.measure_profile(model, g, [1], **kw)
  assert again.meta["counts"]["cached"] == len(g.names)
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=1")
  other = measure.measure_profile(model, g, [1], **kw)
  assert other.meta["counts"]["cached"] == 0 and len(counted) == 2 * len(g.names)


def test_time_layer_backward_of_bn_conv():
  conv = Conv2d(3, 4, 3, padding=1, batch_norm=True, activation="relu", rngs=nnx.Rngs(0))
  f, w = measure.time_layer(conv, [jax.ShapeDtypeStruct((1, 8, 8, 3), jnp.float32)], 2,
                            source=False, repeats=1, warmup=0)
  assert f > 0 and w > 0


def test_pow2_batches():
  assert measure.pow2_batches(16) == [1, 2, 4, 8, 16]
  assert measure.pow2_batches(12) == [1, 2, 4, 8, 12]
  with pytest.raises(UserError, match="max per-device batch"):
    measure.pow2_batches(0)


def test_bad_batches(tmp_path):
  model = Tiny()
  with pytest.raises(UserError, match="batches must be integers"):
    measure.measure_profile(model, trace_graph(model, "tiny"), [0], cache_dir=tmp_path,
                            progress=False)
