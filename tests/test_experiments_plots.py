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


def test_a_missing_value_inside_a_series_is_a_gap_not_a_segment():
  rows = [{"g": 1, "y": 1.0}, {"g": 2, "y": None}, {"g": 4, "y": 3.0}]
  pts = plots.series_points(rows, "g", lambda r: [("y", r["y"])])["y"]
  assert [p[0] for p in pts] == [1, 2, 4] and pts[1][1] != pts[1][1]  # NaN at G=2


def test_grid_writes_a_pdf_beside_the_png_with_a_reference_line(tmp_path):
  path = plots.grid(ROWS, tmp_path / "r.png", panel_row="cluster", panel_col="model", x="g",
                    points=lambda r: [("y", r["y"])], xlabel="G", ylabel="ratio (x)",
                    title="simulated: t", reference=1.0, band=0.05)
  assert path.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
