"""The grid fit recovers the knobs that generated a synthetic profile."""

from profile_ref_graphs import vgg16

from dp_jax.hardware.devices import get_device
from dp_jax.layer_times import analytic_fit
from dp_jax.layer_times.analytic import AnalyticParams, analytic_profile


def test_fit_recovers_generating_params(monkeypatch):
  monkeypatch.setattr(analytic_fit, "COMPUTE_EFF", (0.1, 0.3, 0.5))
  monkeypatch.setattr(analytic_fit, "MEMORY_EFF", (0.5, 1.0))
  monkeypatch.setattr(analytic_fit, "OVERHEAD_US", (2.0, 10.0))
  monkeypatch.setattr(analytic_fit, "TILES", (0, 64, 128))
  g = vgg16(image_size=64)
  truth = AnalyticParams(compute_eff=0.3, memory_eff=0.5, tile=128, kernel_overhead_us=10.0)
  dev = get_device("A100-SXM4-40GB")
  measured = analytic_profile(g, dev, "float16", [1, 4, 16], truth)
  fit, err = analytic_fit.fit_params(g, measured, dev, "float16", small_batch="tile")
  assert fit == truth and err < 1e-9
