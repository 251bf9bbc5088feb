"""Gantt PNGs: one row per device up to 64, representatives beyond."""

from sim_helpers import cluster, graph, plan, profile

from dp_jax.simulator.engine import simulate
from dp_jax.simulator.gantt import plot_gantt, rows_for
from dp_jax.simulator.job import background_job


def _sim(g, b):
  job = background_job(graph("inception"), profile("inception", b), cluster(), 8)
  return simulate(graph("inception"), profile("inception", b), cluster(), plan("inception", g, b),
                  job=job)


def test_png_written_with_a_row_per_device(tmp_path):
  s = _sim(16, 32)
  out = plot_gantt(s.fill.events, 16, tmp_path / "g.png", title="inception G=16",
                   classes=s.classes, marks=[("alone", s.timeline.iteration_ms)])
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert rows_for(16, s.classes)[0] == list(range(16))


def test_large_clusters_draw_representatives(tmp_path):
  s = _sim(1024, 1024)
  devices, labels = rows_for(1024, s.classes)
  assert len(devices) <= 64 and devices[0] == 0
  assert all(s.classes.of_device(d) == k for k, d in enumerate(devices)) or len(s.classes) > 64
  out = plot_gantt(s.fill.events, 1024, tmp_path / "big.png", title="G=1024", classes=s.classes)
  assert out.stat().st_size > 1000
