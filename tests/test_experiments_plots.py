"""experiments/plots.py: series from rows and a grid of panels saved as PNG."""

from experiments import plots

ROWS = [{"model": m, "cluster": "c", "g": g, "y": g * k, "z": None}
        for m, k in (("a", 1.0), ("b", 2.0)) for g in (4, 1, 2)]


def test_series_points_are_sorted_and_skip_missing():
  pts = plots.series_points(ROWS[:3], "g", lambda r: [("y", r["y"]), ("z", r["z"])])
  assert pts == {"y": [(1, 1.0), (2, 2.0), (4, 4.0)]}


def test_grid_writes_a_png(tmp_path):
  path = plots.grid(ROWS, tmp_path / "f.png", panel_row="cluster", panel_col="model", x="g",
                    points=lambda r: [("y", r["y"])], xlabel="G", ylabel="y", title="t")
  assert path.read_bytes()[:4] == b"\x89PNG"
