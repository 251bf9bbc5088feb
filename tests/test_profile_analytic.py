"""Roofline model: regimes, FLOP convention, wave utilization, errors, ProfileTable output."""

import pytest
from profile_ref_graphs import vgg16

from dp_jax.base.errors import UserError
from dp_jax.hardware.devices import get_device
from dp_jax.layer_times import analytic
from dp_jax.layer_times.analytic import (
  PLAIN,
  AnalyticParams,
  LayerCost,
  analytic_profile,
  layer_times_ms,
  wave_utilization,
)

A100 = get_device("A100-SXM4-40GB")


def _cost(flops, act, params=0.0, source=False, matrix=True):
  """A layer of `flops` on the matrix units (matrix) or the vector units."""
  mm, vector = (flops, 0.0) if matrix else (0.0, flops)
  return LayerCost(mm, 0.0, vector, act, params, 1, source, (64, 64) if matrix else None)


def test_compute_bound_time_is_flops_over_peak():
  f, w = layer_times_ms(_cost(312e9, 1.0), A100, "float16", 1, PLAIN)
  assert f == pytest.approx(1.0 + 0.005)  # 312 GFLOP at 312 TFLOP/s, plus one 5 us kernel
  assert w == pytest.approx(2.0 + 0.010)  # backward: twice the work, twice the kernels


def test_memory_bound_time_is_bytes_over_bandwidth():
  f, _ = layer_times_ms(_cost(1.0, 1555e6, matrix=False), A100, "float16", 1, PLAIN)
  assert f == pytest.approx(1.0 + 0.005)


def test_source_layer_backward_is_one_forward():
  f, w = layer_times_ms(_cost(312e9, 1.0, source=True), A100, "float16", 1, PLAIN)
  assert w == pytest.approx(f + 0.005)


def test_wave_utilization():
  assert wave_utilization(None, 1, 64, 108) == 1.0
  assert wave_utilization((64, 64), 1, 64, 108) == pytest.approx(1 / 108)
  assert wave_utilization((64, 64 * 108), 1, 64, 108) == 1.0
  assert wave_utilization((64, 64 * 109), 1, 64, 108) == pytest.approx(109 / 216)


def test_time_grows_with_batch_and_per_sample_cost_falls():
  g = vgg16()
  t = analytic_profile(g, "A100-SXM4-40GB", "mixed fp16", [1, 8, 32])
  assert t.source == "analytic" and t.dtype == "mixed fp16"
  it = {b: t.iteration_ms(b) for b in (1, 8, 32)}
  assert it[1] < it[8] < it[32]
  assert it[1] / 1 > it[32] / 32


def test_default_params_per_device():
  assert analytic.default_params(A100) == analytic.A100_VGG16_FIT
  assert analytic.default_params(get_device("cpu")) == PLAIN


@pytest.mark.parametrize("kw, words", [({"compute_eff": 0.0}, "compute_eff"),
                                       ({"memory_eff": 1.5}, "memory_eff"),
                                       ({"tile": -1}, ">= 0")])
def test_bad_params(kw, words):
  with pytest.raises(UserError, match=words):
    AnalyticParams(**kw)


def test_bad_inputs():
  g = vgg16()
  with pytest.raises(UserError, match="no bfloat16 peak"):
    analytic_profile(g, "V100-SXM2-32GB", "bfloat16", [1])
  with pytest.raises(UserError, match="batches"):
    analytic_profile(g, "cpu", "float32", [])
  with pytest.raises(UserError, match="device 'Z80' is unknown"):
    analytic_profile(g, "Z80", "float32", [1])
