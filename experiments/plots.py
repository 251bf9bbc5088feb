"""Matplotlib helpers the studies share: a grid of panels with one line per series and regime,
saved as PNG and PDF with nothing clipped (constrained layout, tight bounding box).

Every figure is readable at its saved size: no text under FONT points, log axes say so in their
label, device axes have integer ticks, a line never joins two regimes (strong scaling at a fixed
B, weak scaling at B = G), and a point a series lacks is marked with why.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Points = Callable[[Row], Iterable[tuple[str, float | None]]]  # row -> (series, y) pairs
Gaps = Callable[[Row], Iterable[tuple[str, str]]]  # row -> (series, why it has no value)

FONT = 8  # pt at the saved size: ticks, legends, annotations (the smallest text of a figure)
LABEL = 9  # pt: axis labels and panel titles
TITLE = 10  # pt: the figure's title
GAP_MARKERS = ("v", "D", "X", "P")  # one per reason a point is missing, in order of appearance


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend."""
  import matplotlib  # matplotlib: only to draw (tables and CSVs need none)

  matplotlib.use("Agg")
  # pyplot once the file-only backend is chosen (matplotlib: only to draw)
  import matplotlib.pyplot as plt

  return plt


def wrap(text: str, width_in: float, fontsize: float = TITLE) -> str:
  """`text` wrapped to lines that fit `width_in` inches at `fontsize` (each of its own lines
  wrapped alone; an average glyph is about 0.55 em wide)."""
  chars = max(20, int(width_in * 72 / (0.55 * fontsize)))
  return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def series_points(rows: Sequence[Row], x: str, points: Points) -> dict[str, list[tuple]]:
  """{series: [(x, y), ...] sorted by x}: a missing y inside a series is NaN (a gap in its line,
  not a segment across it); series with no value at all are left out."""
  out: dict[str, list[tuple]] = defaultdict(list)
  for r in rows:
    for label, y in points(r):
      if r.get(x) is not None:
        out[label].append((r[x], math.nan if y is None else y))
  return {k: sorted(v) for k, v in out.items() if any(not math.isnan(p[1]) for p in v)}


def segmented(points: Points, segments: Callable[[Row], Sequence[str]] | None) -> Points:
  """`points` with each series split by the segments (regimes) a row belongs to: 'series |
  segment' (one line each, never one line across two regimes); unchanged without segments."""
  if segments is None:
    return points
  return lambda r: [(f"{label} | {s}", y) for s in segments(r) for label, y in points(r)]


def grid(rows: Sequence[Row], path: Path, *, panel_row: str, panel_col: str, x: str,
         points: Points, xlabel: str, ylabel: str, title: str, logx: int | None = 2,
         logy: bool = True, style: Callable[[str], dict] | None = None,
         reference: float | None = None, band: float | None = None,
         segments: Callable[[Row], Sequence[str]] | None = None,
         segment_style: dict[str, dict] | None = None, gaps: Gaps | None = None,
         sharey: bool = False, integer_x: bool | None = None, caption: str = "",
         absent: str | None = None) -> Path:
  """One panel per (panel_row, panel_col) value pair, one line per series; saved as PNG + PDF.

  `title` must say whether the numbers are predicted, simulated or measured; a log axis gets
  ', log scale' after its label. `reference`: a horizontal line (1 on ratio plots: "as fast as
  the baseline"); `band`: a shaded +-band around it (the comparison tolerance: a ratio inside it
  is a tie). `segments`: row -> the regimes it belongs to (e.g. 'B=32 (strong scaling)'), one
  line per series and regime, styled by `segment_style`. `gaps`: row -> (series, why) for a
  value the row lacks, drawn as a marker on the panel's floor and named in the legend.
  `sharey`: one y range for every panel. `integer_x`: integer ticks (default: x is a device
  count). `caption`: lines under the title (what the figure leaves out and why). `absent`: why a
  panel can lack an x the others have (a failed cell), marked on its floor. The panels share
  their x range.
  """
  from matplotlib.lines import Line2D  # matplotlib: only to draw

  plt = pyplot()
  integer_x = x == "num_devices" if integer_x is None else integer_x
  prow, pcol = ordered({r[panel_row] for r in rows}), ordered({r[panel_col] for r in rows})
  nrow, ncol = max(1, len(prow)), max(1, len(pcol))
  width = 3.4 * ncol
  every_x = ordered({r[x] for r in rows if r.get(x) is not None})
  fig, axes = plt.subplots(nrow, ncol, squeeze=False, sharex=True, sharey=sharey,
                           layout="constrained",
                           figsize=(width, 2.9 * nrow + 1.2))
  split = segmented(points, segments)
  reasons: dict[str, str] = {}  # why -> marker
  colors: dict[str, str] = {}  # series -> its colour in every panel and regime
  for i, a in enumerate(prow):
    for j, b in enumerate(pcol):
      ax = axes[i][j]
      sub = [r for r in rows if r[panel_row] == a and r[panel_col] == b]
      for label, pts in series_points(sub, x, split).items():
        series, _, segment = label.partition(" | ")
        color = colors.setdefault(series, f"C{len(colors) % 10}")
        look = {"marker": "o", "ms": 4, "lw": 1.4, "color": color,
                **(style(series) if style else {}),
                **((segment_style or {}).get(segment, {}))}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **look)
      if reference is not None:
        if band:
          ax.axhspan(reference * (1 - band), reference * (1 + band), color="0.85", zorder=0,
                     label=f"tie band (+-{band:.1%}: within the cost model's validated error)")
        ax.axhline(reference, color="black", lw=0.8, ls="--", zorder=1,
                   label=f"y = {reference:g} (as the baseline)")
      for r in sub if gaps else ():
        for series, why in gaps(r):
          marker = reasons.setdefault(why, GAP_MARKERS[len(reasons) % len(GAP_MARKERS)])
          color = (style(series) if style else {}).get("color", colors.get(series, "black"))
          ax.plot([r[x]], [0.03], marker=marker, ms=6, ls="none", mfc="none", mec=color,
                  transform=ax.get_xaxis_transform(), clip_on=False, zorder=3)
      have = {r[x] for r in sub}
      for v in every_x if absent and sub else ():
        if v not in have:
          marker = reasons.setdefault(absent, GAP_MARKERS[len(reasons) % len(GAP_MARKERS)])
          ax.plot([v], [0.03], marker=marker, ms=6, ls="none", mfc="none", mec="black",
                  transform=ax.get_xaxis_transform(), clip_on=False, zorder=3)
      ax.set_title(f"{b} | {panel_row}={a}", fontsize=LABEL)
      log_axes(ax, x=logx, y=10 if logy else None)
      if integer_x and not logx:
        integer_ticks(ax.xaxis)
      ax.tick_params(labelsize=FONT, which="both")
      ax.grid(alpha=0.3)
      if i == nrow - 1:
        ax.set_xlabel(xlabel + (", log scale" if logx else ""), fontsize=LABEL)
      if j == 0:
        ax.set_ylabel(wrap(ylabel + (", log scale" if logy else ""), 2.4, LABEL), fontsize=LABEL)
  handles, labels = legend_entries(axes.flat)
  handles, labels = _legend_by_parts(handles, labels, segment_style)
  for why, marker in reasons.items():
    handles.append(Line2D([], [], marker=marker, ms=6, ls="none", mfc="none", mec="black"))
    labels.append(f"no point: {why}")
  fig.legend(handles, labels, loc="outside lower center", ncol=min(3, max(1, len(labels))),
             fontsize=FONT)
  fig.suptitle(wrap(title + (f"\n{caption}" if caption else ""), width), fontsize=TITLE)
  return save(fig, path)


def _legend_by_parts(handles: list, labels: list[str],
                     segment_style: dict[str, dict] | None) -> tuple[list, list[str]]:
  """'series | segment' entries as one entry per series (its colour) and one per segment (its
  line style), so a legend does not list every pair."""
  from matplotlib.lines import Line2D  # matplotlib: only to draw

  if not any(" | " in label for label in labels):
    return handles, labels
  out_h, out_l, seen = [], [], set()
  for h, label in zip(handles, labels, strict=True):
    series, sep, segment = label.partition(" | ")
    if not sep:
      out_h.append(h)
      out_l.append(label)
    elif series not in seen:
      seen.add(series)
      out_h.append(Line2D([], [], color=h.get_color(), lw=h.get_linewidth(), marker="o", ms=4))
      out_l.append(series)
  for segment, look in (segment_style or {}).items():
    if any(label.endswith(f" | {segment}") for label in labels):
      out_h.append(Line2D([], [], color="black", **{"marker": "o", "ms": 4, "lw": 1.2, **look}))
      out_l.append(segment)
  return out_h, out_l


WEAK = "B=G (weak scaling)"


def strong(b: int) -> str:
  return f"B={b} fixed (strong scaling)"


def scaling_regimes(rows: Sequence[Row]) -> Callable[[Row], list[str]]:
  """row -> the scaling regimes it belongs to: strong(B) when the rows hold its B at several G,
  WEAK when B = G and the rows hold several such G (G = B = 32 can be both: the end of one
  line and the start of the other, each drawn on its own)."""
  gs: dict[int, set] = defaultdict(set)
  for r in rows:
    gs[r["global_batch"]].add(r["num_devices"])
  weak = len({r["num_devices"] for r in rows if r["global_batch"] == r["num_devices"]}) > 1

  def regimes(r: Row) -> list[str]:
    b, g = r["global_batch"], r["num_devices"]
    out = [strong(b)] if len(gs[b]) > 1 else []
    out += [WEAK] if weak and b == g else []
    return out or [f"B={b}, G={g}"]  # a lone shape: its own point

  return regimes


def regime_styles(rows: Sequence[Row]) -> dict[str, dict]:
  """A line style per scaling regime of `rows`: solid circles for each fixed B, dotted squares
  for B = G (the colour stays the series')."""
  names = dict.fromkeys(n for r in rows for n in scaling_regimes(rows)(r))
  solid = ("-", "-.", (0, (5, 1)))
  out, k = {}, 0
  for n in names:
    if n == WEAK:
      out[n] = {"ls": ":", "marker": "s"}
    else:
      out[n] = {"ls": solid[k % len(solid)], "marker": "o"}
      k += 1
  return out


def ordered(values: Iterable[Any]) -> list[Any]:
  """Numbers in numeric order, anything else by its text."""
  values = list(values)
  if all(isinstance(v, (int, float)) for v in values):
    return sorted(values)
  return sorted(values, key=str)


def integer_ticks(axis) -> None:
  """Whole-number ticks only (a count of devices or layers has no 2.5)."""
  from matplotlib.ticker import FuncFormatter, MaxNLocator  # matplotlib: only to draw

  axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=2))
  axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}"))


def log_axes(ax, x: int | None = 10, y: int | None = 10) -> None:
  """Log-scaled axes with plain tick labels (1, 2, 5 x 10^k; powers of 2 for base 2)."""
  from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # matplotlib: drawing

  plain = FuncFormatter(lambda v, _: plain_number(v))
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


def plain_number(v: float) -> str:
  """A tick label without exponents: 0.5, 20, 5000, 200k, 1.5M."""
  if abs(v) >= 1e6:
    return f"{v / 1e6:g}M"
  if abs(v) >= 1e4:
    return f"{v / 1e3:g}k"
  return f"{v:g}"


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
