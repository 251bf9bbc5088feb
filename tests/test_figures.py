"""What the figures say, read from their matplotlib objects (never their pixels): every text at
>= 8 pt at the saved size, integer device ticks, axes labelled (log scale said), what the numbers
are (predicted / simulated / measured) in the title, the fair comparison first, strong and weak
scaling never one line, a missing point marked with why; and the quick strong_scaling table
shows the G it ran."""

import math
import struct

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text
from sim_helpers import cluster as named
from sim_helpers import graph, plan, profile

from dp_jax.report.plan_report import (
  CHART_DPI,
  CHART_WIDTH_IN,
  comparisons,
  devices_per_layer_figure,
  plot_devices_per_layer,
)
from dp_jax.simulator.engine import simulate
from dp_jax.simulator.gantt import gantt_figure
from dp_jax.simulator.job import background_job
from experiments import cluster_throughput, plots, strong_scaling

KINDS = ("predicted", "simulated", "measured")


def drawn(fig):
  """`fig` laid out by the Agg renderer (what savefig draws); returns the renderer."""
  canvas = FigureCanvasAgg(fig)
  canvas.draw()
  return canvas.get_renderer()


def texts(fig) -> list[Text]:
  """Every text the figure draws: visible, not empty, and no label of a tick outside its axis's
  view (matplotlib keeps those but does not draw them)."""
  hidden = set()
  for ax in fig.axes:
    for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
      lo, hi = sorted(lim)
      for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        if not lo - 1e-9 <= tick.get_loc() <= hi + 1e-9:
          hidden |= {id(tick.label1), id(tick.label2)}
  return [t for t in fig.findobj(Text)
          if t.get_visible() and t.get_text().strip() and id(t) not in hidden]


def assert_readable(fig, minimum: float = 8.0) -> None:
  drawn(fig)
  small = [(t.get_text(), t.get_fontsize()) for t in texts(fig) if t.get_fontsize() < minimum]
  assert not small, small


def ticks_in_view(axis, lim) -> list[float]:
  lo, hi = sorted(lim)
  return [v for v in axis.get_majorticklocs() if lo - 1e-9 <= v <= hi + 1e-9]


def title_of(fig) -> str:
  return fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()


@pytest.fixture
def saved(monkeypatch):
  """The figures experiments.plots.save writes, kept (still whole after pyplot closes them)."""
  figures = {}
  real = plots.save

  def keep(fig, path):
    figures[path.stem] = fig
    return real(fig, path)

  monkeypatch.setattr(plots, "save", keep)
  return figures


# ---- devices per layer (the plan app's chart) ----

@pytest.mark.parametrize("g, b", [(2, 8), (8, 32)])
def test_devices_per_layer_has_integer_device_ticks_and_paper_sized_text(tmp_path, g, b):
  p = plan("resnet", g, b, size=1)
  fig = devices_per_layer_figure(p)
  renderer = drawn(fig)
  ax = fig.axes[0]
  yticks = ticks_in_view(ax.yaxis, ax.get_ylim())
  assert len(yticks) >= 2 and all(v == int(v) for v in yticks), yticks  # never 0.25 devices
  assert all(v == int(v) for v in ticks_in_view(ax.xaxis, ax.get_xlim()))
  assert ax.get_ylim()[1] > g  # G drawn inside the axes, and named
  assert any(t.get_text() == f"G = {g}" for t in texts(fig))
  assert "devices" in ax.get_ylabel() and "layer" in ax.get_xlabel()
  assert title_of(fig).startswith("predicted:")
  assert_readable(fig)
  box = fig.bbox  # a fixed layout: every text inside the saved page, none clipped
  for t in texts(fig):
    e = t.get_window_extent(renderer)
    assert e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1 and \
        e.y1 <= box.y1 + 1, t.get_text()
  path = plot_devices_per_layer(p, tmp_path / "d.png", pdf=False)
  width, _ = struct.unpack(">II", path.read_bytes()[16:24])  # the PNG header's size
  assert width == round(CHART_WIDTH_IN * CHART_DPI)  # saved at the size its fonts are set for
  assert not path.with_suffix(".pdf").exists()


def test_devices_per_layer_title_carries_the_fair_comparison_wrapped_to_the_width():
  p = plan("resnet", 8, 32, size=1)  # a burst plan
  fair = comparisons(graph("resnet", 1), profile("resnet", 32, 1), named(), p, 0.05)
  fig = devices_per_layer_figure(p, fair)
  title = title_of(fig)
  assert "fastest DP on <= 8" in title
  longest = max(len(line) for line in title.split("\n"))
  assert longest * 0.55 * 9 / 72 <= CHART_WIDTH_IN  # wrapped, not wider than the page


# ---- the studies' grid ----

def regime_rows():
  """B=32 at G=8, 16, 32 (strong scaling) and B=G at G=32..128 (weak scaling)."""
  shapes = [(8, 32), (16, 32), (32, 32), (64, 64), (128, 128)]
  return [{"cluster": "c", "model": "m", "num_devices": g, "global_batch": b, "y": g / b}
          for g, b in shapes]


def test_strong_and_weak_scaling_are_never_one_line(tmp_path, saved):
  rows = regime_rows()
  plots.grid(rows, tmp_path / "r.png", panel_row="cluster", panel_col="model", x="num_devices",
             points=lambda r: [("y", r["y"])], xlabel="devices G", ylabel="y (x)",
             title="predicted: y", segments=plots.scaling_regimes(rows),
             segment_style=plots.regime_styles(rows))
  fig = saved["r"]
  lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) > 1]
  spans = sorted(tuple(ln.get_xdata()) for ln in lines)
  assert spans == [(8, 16, 32), (32, 64, 128)], spans  # G=32 B=32 ends one, starts the other
  assert lines[0].get_linestyle() != lines[1].get_linestyle()
  legend = [t.get_text() for t in fig.legends[0].get_texts()]
  assert plots.strong(32) in legend and plots.WEAK in legend
  assert fig.axes[0].get_xlabel() == "devices G, log scale"
  assert_readable(fig)


def test_a_missing_point_is_marked_and_named_in_the_legend(tmp_path, saved):
  rows = [{**r, "y": None if r["num_devices"] == 16 else r["y"]} for r in regime_rows()]
  rows = [r for r in rows if r["num_devices"] != 64]  # a failed cell: no row at all
  plots.grid(rows + [{**regime_rows()[3], "model": "other"}], tmp_path / "g.png",
             panel_row="cluster", panel_col="model", x="num_devices",
             points=lambda r: [("y", r["y"])], xlabel="devices G", ylabel="y (x)",
             title="simulated: y", gaps=lambda r: [("y", "why")] if r["y"] is None else [],
             absent="no cell")
  fig = saved["g"]
  legend = [t.get_text() for t in fig.legends[0].get_texts()]
  assert "no point: why" in legend and "no point: no cell" in legend
  panel = fig.axes[0]
  marked = sorted(float(ln.get_xdata()[0]) for ln in panel.get_lines()
                  if ln.get_linestyle() == "None" and ln.get_marker() in plots.GAP_MARKERS)
  assert marked == [16.0, 64.0]


def simulated_row(g, b, matched=1.02, dp_plan=None, model="vgg16"):
  return {"cluster": "dgx_a100", "model": model, "num_devices": g, "global_batch": b,
          "amplification_limit": 2.0, "comparison_tolerance": 0.05,
          "plan_data_parallel_devices": dp_plan, "samples_per_s": 100.0 * g,
          "background_samples_per_s": 50.0 * g, "cluster_samples_per_s": 150.0 * g,
          "matched_data_parallel_cluster_samples_per_s": None if matched is None else 140.0 * g,
          "best_data_parallel_cluster_samples_per_s": 120.0 * g,
          "data_parallel_samples_per_s": 10.0 * g,
          "cluster_throughput_vs_matched_data_parallel": matched,
          "speedup_vs_best_data_parallel": 0.9, "cluster_throughput_vs_best_data_parallel": 1.2,
          "speedup_vs_data_parallel": 1.1, "cluster_throughput_vs_data_parallel": 15.0}


def test_cluster_throughput_leads_with_the_fair_comparison(tmp_path, saved):
  rows = [simulated_row(8, 32), simulated_row(16, 32, matched=None), simulated_row(32, 32),
          simulated_row(64, 64, dp_plan=16), simulated_row(128, 128)]
  paths = cluster_throughput.figures(rows, tmp_path)
  assert [p.stem for p in paths][:2] == ["cluster_throughput_ratios",
                                         "cluster_throughput_ratios_secondary"]
  fair, secondary = saved["cluster_throughput_ratios"], saved["cluster_throughput_ratios_secondary"]
  legend = [t.get_text() for t in fair.legends[0].get_texts()]
  assert legend[0] == "cluster / (matched DP + BG)"
  assert not any("all G" in text for text in legend)  # DP alone: the secondary figure only
  assert fair.axes[0].get_yscale() == "linear"  # the matched ratio not squeezed near 1
  assert any(text.startswith("no point: no DP on d <= G within the tolerance") for text in legend)
  assert any(text.startswith("no point: the plan is data parallelism") for text in legend)
  assert "cluster / DP alone on all G" in [t.get_text() for t in secondary.legends[0].get_texts()]
  assert "secondary" in title_of(secondary) and secondary.axes[0].get_yscale() == "log"
  assert "log scale" in secondary.axes[0].get_ylabel()
  for fig in saved.values():
    assert title_of(fig).startswith("simulated"), title_of(fig)
    assert_readable(fig)
    for ax in fig.axes:
      if ax.get_xlabel():
        assert ax.get_xlabel().startswith("devices G")
      assert all(v == int(v) for v in ticks_in_view(ax.xaxis, ax.get_xlim()))


def test_strong_scaling_figures_say_predicted_and_draw_each_regime_alone(tmp_path, saved):
  rows = [{"cluster": "dgx_a100", "model": "vgg16", "amplification_limit": 2.0,
           "num_devices": g, "global_batch": b, "iteration_ms": 10.0 / g + 1,
           "data_parallel_iteration_ms": 12.0 / g + 1, "gpu_ms": 10.0 + g,
           "data_parallel_gpu_ms": 12.0 + g} for g, b in
          [(1, 16), (2, 16), (4, 16), (1, 32), (8, 32), (32, 32), (64, 64), (128, 128)]]
  strong_scaling.figures(rows, tmp_path)
  assert set(saved) == {"strong_scaling_iteration_ms_A2", "strong_scaling_gpu_ms_A2"}
  for fig in saved.values():
    assert title_of(fig).startswith("predicted")
    ax = fig.axes[0]
    assert "(ms)" in ax.get_ylabel() or "(GPU-ms)" in ax.get_ylabel()
    shapes = {(r["num_devices"], r["global_batch"]) for r in rows}
    for ln in ax.get_lines():
      label = ln.get_label()
      if label.startswith("_"):
        continue
      xs = [x for x, y in zip(ln.get_xdata(), ln.get_ydata(), strict=True) if not math.isnan(y)]
      if label.endswith(plots.WEAK):  # every point at B = G
        assert all((x, x) in shapes for x in xs), label
      else:  # every point at the line's one fixed B
        b = int(label.split("B=")[1].split()[0])
        assert all((x, b) in shapes for x in xs), label
    assert_readable(fig)


def test_a_quick_strong_scaling_table_shows_every_g_it_ran():
  rows = [{"model": "vgg16", "cluster": "dgx_a100", "amplification_limit": math.inf,
           "num_devices": g, "global_batch": b, "plan_data_parallel_devices": None,
           "speedup_vs_best_data_parallel": 1.2, "speedup": 1.3, "gpu_time_saving": -11.54,
           "gpu_time_saving_vs_cheapest_data_parallel": 0.5, "comparison_tolerance": 0.05,
           "iteration_ms": 5.0, "data_parallel_iteration_ms": 6.0}
          for g, b in [(8, 32), (64, 64)]]
  rows = strong_scaling.finish(rows)
  md = strong_scaling.headline(rows)
  header = next(line for line in md.splitlines() if line.startswith("| model |") and "G=" in line)
  assert "G=8 B=32" in header and "G=64 B=64" in header and "G=1024" not in header
  assert "12.5x more" in md and "2.00x less" in md and "-1154%" not in md
  shown, others = strong_scaling.table_shapes(
      [{"num_devices": g, "global_batch": b} for g, b in
       [(1, 16), (2, 16), (8, 32), (16, 32), (32, 32), (1024, 1024)]])
  assert shown == [(8, 32), (32, 32), (1024, 1024)] and (2, 16) in others


# ---- the simulator's Gantt chart ----

def test_gantt_text_is_readable_and_axes_carry_units():
  g, b = 16, 32
  job = background_job(graph("inception"), profile("inception", b), named(), 8)
  s = simulate(graph("inception"), profile("inception", b), named(), plan("inception", g, b),
               job=job)
  fig = gantt_figure(s.fill.events, g, title="simulated: inception G=16", classes=s.classes)
  ax = fig.axes[0]
  assert ax.get_xlabel() == "time in the iteration (ms)" and "device" in ax.get_ylabel()
  assert_readable(fig)
