"""Honest local devices: core count, device threads, concurrency, XLA thread accounting."""

import threading
import time

import jax
import jax.numpy as jnp
import pytest

from dp_jax.base.errors import UserError
from dp_jax.runtime import local_devices as ld


def test_honest_device_count_is_the_cores_and_refuses_more():
  cores = ld.cpu_cores()
  assert ld.honest_device_count() == cores
  assert ld.honest_device_count(1) == 1
  with pytest.raises(UserError, match="one per core"):
    ld.honest_device_count(cores + 1)
  with pytest.raises(UserError, match="positive integer"):
    ld.honest_device_count(0)


def test_set_host_device_count_replaces_the_flag(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--foo=1 --xla_force_host_platform_device_count=8")
  ld.set_host_device_count(2)
  import os

  assert os.environ["XLA_FLAGS"] == "--foo=1 --xla_force_host_platform_device_count=2"


def test_run_concurrently_overlaps_work_that_releases_the_gil():
  results, wall = ld.run_concurrently([lambda i=i: (time.sleep(0.2), i)[1] for i in range(3)])
  assert results == [0, 1, 2]
  assert wall < 0.5  # three 0.2 s sleeps one after the other would take 0.6 s


def test_run_concurrently_reraises():
  with pytest.raises(ValueError, match="boom"):
    ld.run_concurrently([lambda: 1, lambda: (_ for _ in ()).throw(ValueError("boom"))])


def test_device_threads_run_each_device_on_its_own_thread():
  devices = jax.devices()[:2]
  f = jax.jit(lambda x: x * 2 + 1)
  xs = [jax.device_put(jnp.arange(4.0) + i, d) for i, d in enumerate(devices)]
  with ld.DeviceThreads(2) as threads:
    out = threads.run([(i, lambda i=i: (threading.current_thread().name,
                                        f(xs[i]).block_until_ready())) for i in range(2)])
  names = [n for n, _ in out]
  assert names[0].startswith("dp_jax_dev0") and names[1].startswith("dp_jax_dev1")
  assert [float(y[0]) for _, y in out] == [1.0, 3.0]
  assert out[1][1].devices() == {devices[1]}


def test_busy_threads_names_the_threads_that_worked():
  def spin():
    t = time.process_time()
    while time.process_time() - t < 0.05:
      pass

  busy = ld.busy_threads(spin)
  assert len(busy) == 1  # only the calling thread did the work


def test_timing_devices_on_cpu_are_at_most_one_per_core():
  devices = ld.timing_devices(1)
  assert devices == jax.devices()[:1]
  assert len(ld.timing_devices()) == min(ld.cpu_cores(), len(jax.devices()))
