"""The GPU model against published measurements: fitted on some rows, judged on the rest.

    python scripts/validate_published.py [--markdown]

Runs the model (the calibrated profile, the cluster files' links, the planner's evaluation;
dp_jax/published/anchors.py) on every row of dp_jax/published/anchors.yaml and
prints one line per row: predicted, published, predicted / published. Fit rows come first (their
error is zero by construction: they show the fit holds), then the held-out rows, then the rows
the model cannot represent and why. The last lines: the held-out error over the training rows
(step throughput, what every burst-vs-data-parallelism verdict compares: the GPU comparison
tolerance, dp_jax/report/compare.py), then over every held-out row. Why each miss misses:
docs/validation.md, "GPU: published measurements".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dp_jax.published.anchors import held_out, results  # noqa: E402
from dp_jax.report.compare import GPU_VALIDATED_TOLERANCE  # noqa: E402

TARGET_MEDIAN, TARGET_WORST = 0.15, 0.30


def figure(x: float | None) -> str:
  """1,234 / 123.4 / 1.234: four significant digits, thousands grouped."""
  if x is None:
    return "-"
  return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def line(r, markdown: bool) -> str:
  a = r.anchor
  figures = (figure(a.measured), figure(r.predicted),
             "-" if r.ratio is None else f"{r.ratio:.3f}")
  if markdown:
    return f"| {a.id} | {a.hardware} | {a.unit} | " + " | ".join(figures) + " |"
  ratio = "" if r.ratio is None else f"  ratio {figures[2]}"
  return (f"{a.id:44s} {a.unit:17s} predicted {figures[1]:>9s}  published "
          f"{figures[0]:>9s}{ratio}")


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--markdown", action="store_true", help="the rows as a markdown table")
  args = ap.parse_args(argv)
  rows = results()
  for role, title in (("fit", "fit rows (calibrated on these)"),
                      ("held_out", "held-out rows (judged without refitting)"),
                      ("not_modelled", "rows the model cannot represent")):
    print(f"\n{title}:")
    if args.markdown:
      print("| row | hardware | unit | published | predicted | predicted / published |")
      print("| --- | --- | --- | --- | --- | --- |")
    for r in (r for r in rows if r.anchor.role == role):
      print(line(r, args.markdown) + ("" if role != "not_modelled" or args.markdown
                                      else f"  ({r.anchor.why})"))
  h = held_out(rows)
  print(f"\nGPU comparison tolerance (dp_jax.report.compare.GPU_VALIDATED_TOLERANCE "
        f"{GPU_VALIDATED_TOLERANCE:.1%}): held-out median |error| over the training rows "
        f"{h.training_median:.1%} ({h.training_rows} rows)")
  print(f"held-out median |error| {h.median:.1%} ({h.rows} rows), worst {h.worst:.1%}")
  return 0 if h.median <= TARGET_MEDIAN and h.worst <= TARGET_WORST else 1


if __name__ == "__main__":
  sys.exit(main())
