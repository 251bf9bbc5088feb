"""Simulator metrics follow the definitions in docs/simulator.md."""

import pytest
from sim_helpers import cluster, graph, plan, profile

from dp_jax.sim.background import background_job
from dp_jax.sim.engine import simulate
from dp_jax.sim.metrics import metrics


@pytest.fixture(scope="module")
def sim():
  job = background_job(graph("inception"), profile("inception", 32), cluster(), 8)
  return simulate(graph("inception"), profile("inception", 32), cluster(),
                  plan("inception", 32, 32), job=job, cap=0.1)


def test_definitions(sim):
  m = metrics(sim)
  g, b = 32, 32
  assert m["alone_idle_fraction"] == pytest.approx(1 - m["gpu_ms"] / (g * m["alone_iteration_ms"]))
  assert m["samples_per_s"] == pytest.approx(b / m["iteration_ms"] * 1e3)
  assert m["cluster_samples_per_s"] == pytest.approx(
      m["samples_per_s"] + m["background_samples_per_s"])
  assert m["cluster_throughput_vs_data_parallel"] == pytest.approx(
      m["cluster_samples_per_s"] / m["data_parallel_samples_per_s"])
  assert m["data_parallel_iteration_ms"] == pytest.approx(
      sim.plan.predicted["data_parallel_iteration_ms"])
  assert 0 <= m["idle_fraction"] <= m["alone_idle_fraction"] <= 1
  assert m["max_slowdown"] <= m["slowdown_cap"] + 1e-9
  assert m["timeline_vs_planner"] == pytest.approx(0, abs=0.01)
  assert m["gpu_ms"] <= m["planner_gpu_ms"] * (1 + 1e-9)  # the union never double counts
  assert m["best_data_parallel_iteration_ms"] <= m["data_parallel_iteration_ms"]


def test_background_none_has_no_background_numbers():
  s = simulate(graph("resnet"), profile("resnet", 32), cluster(), plan("resnet", 8, 32))
  m = metrics(s)
  assert m["background_samples_per_s"] == 0
  assert m["iteration_ms"] == m["alone_iteration_ms"]
  assert m["cluster_samples_per_s"] == m["samples_per_s"]
