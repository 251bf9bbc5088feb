"""Local calibration: line fits, the measured quantities, the cache, the calibrated cluster."""

import jax
import pytest

from dp_jax.measurement import local_links
from tests.sim_helpers import cluster


def test_fit_line_recovers_latency_and_bandwidth():
  xs = [1e3, 1e5, 1e6, 1e7]
  slope, icpt = local_links.fit_line(xs, [0.05 + x * 2e-7 for x in xs])
  assert slope == pytest.approx(2e-7, rel=1e-6) and icpt == pytest.approx(0.05, rel=1e-6)


def test_fit_line_never_returns_a_negative_latency():
  xs = [1e3, 1e6, 1e7]
  slope, icpt = local_links.fit_line(xs, [x * 1e-7 - 0.01 + 0.0101 * (x == 1e3) for x in xs])
  assert icpt >= 0 and slope > 0


def test_calibrate_measures_positive_quantities_and_is_cached(tmp_path, monkeypatch):
  monkeypatch.setattr(local_links, "SIZES_BYTES", (4 << 10, 64 << 10, 512 << 10))
  monkeypatch.setattr(local_links, "stage_us", lambda devices, steps: 321.0)  # tested below
  devices = jax.devices()[:2]
  cal, path, fresh = local_links.load_or_calibrate(tmp_path, devices, repeats=2)
  assert fresh and path.is_file()
  assert cal.num_devices == 2 and cal.transfer_GBps > 0 and cal.allreduce_GBps > 0
  assert cal.dispatch_us > 0 and cal.update_ns_per_param > 0
  assert len(cal.points["allreduce_bytes_ms"]) == 3
  again, _, fresh = local_links.load_or_calibrate(tmp_path, devices)
  assert not fresh and again == cal
  spec = cal.cluster(cluster("local_cpu"))  # the local devices, as measurement.local uses it
  assert spec.devices_per_node == 2 and spec.intra_node_bandwidth_GBps == cal.allreduce_GBps
  assert spec.intra_node_latency_us == cal.transfer_latency_us


@pytest.mark.slow
def test_stage_us_compares_one_stage_with_one_per_layer():
  us = local_links.stage_us(jax.devices()[:2], steps=2)
  assert isinstance(us, float) and us >= 0
