"""Matplotlib helpers the studies share: a grid of panels with one line per series, saved as
PNG and PDF with nothing clipped (constrained layout, tight bounding box)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Points = Callable[[Row], Iterable[tuple[str, float | None]]]  # row -> (series, y) pairs


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend."""
  import matplotlib  # matplotlib: only to draw (tables and CSVs need none)

  matplotlib.use("Agg")
  # pyplot once the file-only backend is chosen (matplotlib: only to draw)
  import matplotlib.pyplot as plt

  return plt


def series_points(rows: Sequence[Row], x: str, points: Points) -> dict[str, list[tuple]]:
  """{series: [(x, y), ...] sorted by x}: a missing y inside a series is NaN (a gap in its line,
  not a segment across it); series with no value at all are left out."""
  out: dict[str, list[tuple]] = defaultdict(list)
  for r in rows:
    for label, y in points(r):
      if r.get(x) is not None:
        out[label].append((r[x], math.nan if y is None else y))
  return {k: sorted(v) for k, v in out.items() if any(not math.isnan(p[1]) for p in v)}


def grid(rows: Sequence[Row], path: Path, *, panel_row: str, panel_col: str, x: str,
         points: Points, xlabel: str, ylabel: str, title: str, logx: int | None = 2,
         logy: bool = True, style: Callable[[str], dict] | None = None,
         reference: float | None = None, band: float | None = None) -> Path:
  """One panel per (panel_row, panel_col) value pair, one line per series; saved as PNG + PDF.

  `title` should say whether the numbers are predicted, simulated or measured. `reference`: a
  horizontal line (1 on ratio plots: "as fast as the baseline"); `band`: a shaded +-band around
  it (the comparison tolerance: a ratio inside it is a tie).
  """
  plt = pyplot()
  prow, pcol = ordered({r[panel_row] for r in rows}), ordered({r[panel_col] for r in rows})
  fig, axes = plt.subplots(max(1, len(prow)), max(1, len(pcol)), squeeze=False,
                           figsize=(3.4 * max(1, len(pcol)), 2.8 * max(1, len(prow)) + 0.9),
                           layout="constrained")
  for i, a in enumerate(prow):
    for j, b in enumerate(pcol):
      ax = axes[i][j]
      sub = [r for r in rows if r[panel_row] == a and r[panel_col] == b]
      for label, pts in series_points(sub, x, points).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                **{"marker": "o", "ms": 3, "lw": 1.2, **(style(label) if style else {})})
      if reference is not None:
        if band:
          ax.axhspan(reference * (1 - band), reference * (1 + band), color="0.85", zorder=0,
                     label=f"tie band (+-{band:.1%})")
        ax.axhline(reference, color="black", lw=0.8, ls="--", zorder=1,
                   label=f"y = {reference:g} (as the baseline)")
      ax.set_title(f"{b} | {panel_row}={a}", fontsize=8)
      log_axes(ax, x=logx, y=10 if logy else None)
      ax.tick_params(labelsize=7, which="both")
      ax.grid(alpha=0.3)
      if i == len(prow) - 1:
        ax.set_xlabel(xlabel, fontsize=8)
      if j == 0:
        ax.set_ylabel(ylabel, fontsize=8)
  handles, labels = legend_entries(axes.flat)
  fig.legend(handles, labels, loc="outside lower center", ncol=min(4, max(1, len(labels))),
             fontsize=7)
  fig.suptitle(title, fontsize=10)
  return save(fig, path)


def ordered(values: Iterable[Any]) -> list[Any]:
  """Numbers in numeric order, anything else by its text."""
  values = list(values)
  if all(isinstance(v, (int, float)) for v in values):
    return sorted(values)
  return sorted(values, key=str)


def log_axes(ax, x: int | None = 10, y: int | None = 10) -> None:
  """Log-scaled axes with plain tick labels (1, 2, 5 x 10^k; powers of 2 for base 2)."""
  from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # matplotlib: drawing

  plain = FuncFormatter(lambda v, _: f"{v:g}")
  for axis, base, scale, lim in ((ax.xaxis, x, ax.set_xscale, ax.get_xlim),
                                 (ax.yaxis, y, ax.set_yscale, ax.get_ylim)):
    if base is None:
      continue
    scale("log", base=base)
    axis.set_major_locator(LogLocator(base=base, subs=(1.0,) if base == 2 else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(plain)
    lo, hi = lim()
    narrow = base != 2 and lo > 0 and hi / lo < 3  # too few major ticks: label the minor ones
    axis.set_minor_formatter(plain if narrow else NullFormatter())


def legend_entries(axes: Iterable[Any]) -> tuple[list, list[str]]:
  """Every series label across the panels once, with its line."""
  seen: dict[str, Any] = {}
  for ax in axes:
    for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
      seen.setdefault(label, h)
  return list(seen.values()), list(seen)


def save(fig, path: Path) -> Path:
  """Write the figure as PNG (returned) and as PDF beside it, nothing clipped; close it."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  fig.savefig(path.with_suffix(".pdf"), bbox_inches="tight", metadata={"CreationDate": None})
  pyplot().close(fig)
  return path
