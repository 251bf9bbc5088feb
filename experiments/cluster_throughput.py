"""Cluster throughput: foreground + background samples/s against data parallelism alone.

    scripts/reproduce.sh cluster_throughput   # sweep + aggregation into results/cluster_throughput/
    # which runs, in .venv (S: a timestamped sweep folder):
    python -m dp_jax.simulate -m +experiment=cluster_throughput \\
        hydra.sweep.dir=multirun/cluster_throughput/S
    python -m experiments.cluster_throughput multirun/cluster_throughput/S \\
        --out results/cluster_throughput

Simulate app, the calibrated GPU profile (mixed bf16; scripts/validate_published.py): the five
models on dgx_a100 and dgx_h100
at G = 8, 16, 32 with B = 32 and G = B = 64..1024; burst planner with amplification limit 2 (the
headline) and inf; background `same_family` (the foreground's model at batch 8 per device, one
copy per device) in the idle windows under a 10% foreground slowdown cap, policy `fit`
(docs/simulator.md). All numbers are simulated from the cost model (docs/cost_model.md).
The fair comparison comes first: "matched DP + BG @d" is (foreground + background samples/s)
over the best cluster throughput of data parallelism on any d <= G devices whose foreground is
within the comparison tolerance of the burst foreground, with the background job on the other
G - d ("none within tolerance": no data parallelism on d <= G is that fast); then "fastest DP +
BG" (data parallelism on its fastest d <= G plus the background job on the G - d it leaves
free) and "DP alone" (data parallelism running the foreground alone on all G); beside them, in the
same cell and sentence, the foreground against data parallelism on its fastest d <= G, so a
cluster gain is read with what it costs the foreground job. A cell whose plan is plain data
parallelism on d devices shows "DP on d" and is counted as "is DP". Each ratio comes with its
verdict: a margin within +-tolerance (`comparison.tolerance`, default the validated
median error, dp_jax/report/compare.py) is a tie. The frontier figures draw, per cell, data
parallelism on every d <= G with the background job on the rest, beside the burst plans over A,
and shade the tolerance band of the headline burst plan's foreground.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from experiments import plots, simulated
from experiments.aggregate import Row, Study, main
from experiments.fields import (
  data_parallel_label,
  judged,
  limit_label,
  number,
  pivot,
  tally,
  tolerance,
)

HEADLINE_LIMIT = 2.0
FRONTIER_SHAPES = ((8, 32), (32, 32), (128, 128), (1024, 1024))  # columns of the frontier figure


def figures(rows: list[Row], out: Path) -> list[Path]:
  """The fair comparison first (cluster throughput against the matched baseline, with the
  foreground against the fastest data parallelism), the other baselines in a secondary figure,
  the samples/s they come from, and the frontiers."""
  def rates(r: Row) -> list[tuple[str, float | None]]:
    """Samples/s of the burst cell and of the data-parallel baselines."""
    return [("burst foreground", r["samples_per_s"]),
            ("background", r["background_samples_per_s"]),
            ("burst + background (cluster)", r["cluster_samples_per_s"]),
            ("matched DP + BG", r.get("matched_data_parallel_cluster_samples_per_s")),
            ("fastest DP + BG", r["best_data_parallel_cluster_samples_per_s"]),
            ("DP alone on all G", r["data_parallel_samples_per_s"])]

  def no_matched(r: Row) -> list[tuple[str, str]]:
    """A missing matched baseline, with why (the plan is DP: its own baseline, drawn)."""
    return [("matched DP + BG", why) for _, why in simulated.ratio_gaps(r)
            if r.get("matched_data_parallel_cluster_samples_per_s") is None]

  headline_rows = [r for r in rows if _limit(r) == HEADLINE_LIMIT] or rows
  a = limit_label(_limit(headline_rows[0]))
  tol = tolerance(headline_rows[0])
  shapes = "B=32 up to G=32, then B=G"
  common = dict(panel_row="cluster", panel_col="model", x="num_devices", xlabel="devices G",
                absent="no cell: it failed (README.md, Failed cells)",
                segments=plots.scaling_regimes(headline_rows),
                segment_style=plots.regime_styles(headline_rows))
  return [plots.grid(headline_rows, out / "cluster_throughput_ratios.png",
                     points=simulated.fair_points, ylabel=simulated.RATIO_AXIS,
                     style=simulated.ratio_style, reference=1.0, band=tol, logy=False,
                     sharey=True, gaps=simulated.ratio_gaps, **common,
                     title=f"simulated, the fair comparison: burst (A={a}) + background against "
                           f"the matched data parallelism + background ({shapes})",
                     caption="matched: the best DP + background over every d <= G whose "
                             "foreground is within the tolerance of the burst foreground; "
                             "the other baselines: cluster_throughput_ratios_secondary"),
          plots.grid(headline_rows, out / "cluster_throughput_ratios_secondary.png",
                     points=simulated.secondary_points, ylabel=simulated.RATIO_AXIS,
                     style=simulated.ratio_style, reference=1.0, band=tol, sharey=True,
                     gaps=simulated.plan_is_data_parallel, **common,
                     title=f"simulated, secondary baselines (not the fair comparison: "
                           f"cluster_throughput_ratios): burst (A={a}) + background against "
                           f"data parallelism on its fastest d + background and alone on all G "
                           f"({shapes})"),
          plots.grid(headline_rows, out / "cluster_throughput_samples.png", points=rates,
                     ylabel="samples/s", gaps=no_matched, **common,
                     title=f"simulated samples/s: burst (A={a}) foreground, background, "
                           f"cluster; data-parallel baselines ({shapes})"),
          *[frontier_figure(rows, c, out / f"cluster_throughput_frontier_{c}.png")
            for c in dict.fromkeys(r["cluster"] for r in rows)
            if any(r.get("data_parallel_frontier") for r in rows)]]  # needs metrics.json


def frontier_shapes(rows: list[Row]) -> list[tuple[int, int]]:
  """The (G, B) columns of the frontier figure: FRONTIER_SHAPES present, else the first four."""
  have = sorted({(r["num_devices"], r["global_batch"]) for r in rows})
  return [s for s in FRONTIER_SHAPES if s in have] or have[:4]


def frontier_figure(rows: list[Row], cluster: str, path: Path) -> Path:
  """Per model (rows) and a few shapes (columns): cluster samples/s against foreground time
  (log) of data parallelism on every d <= G with the background job on the rest (a line over
  d, d annotated) and of the burst plans with background fill (a line over A); shaded: the d
  whose foreground is within the tolerance of the headline burst plan's (the matched band);
  star: the matched baseline."""
  plt = plots.pyplot()
  sub = [r for r in rows if r["cluster"] == cluster]
  models = plots.ordered({r["model"] for r in sub})
  shapes = frontier_shapes(sub)
  fig, axes = plt.subplots(len(models), len(shapes), squeeze=False, layout="constrained",
                           figsize=(3.6 * len(shapes), 2.9 * len(models) + 1.0))
  for i, model in enumerate(models):
    for j, (g, b) in enumerate(shapes):
      ax = axes[i][j]
      cell = sorted((r for r in sub if r["model"] == model
                     and (r["num_devices"], r["global_batch"]) == (g, b)), key=_limit)
      _frontier_panel(ax, cell)
      ax.set_title(f"{model}, G={g}, B={b}", fontsize=plots.LABEL)
      if i == len(models) - 1:
        ax.set_xlabel("foreground time per iteration (ms), log scale", fontsize=plots.LABEL)
      if j == 0:
        ax.set_ylabel("cluster samples/s", fontsize=plots.LABEL)
  handles, labels = plots.legend_entries(ax for row in axes for ax in row)
  fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=plots.FONT)
  fig.suptitle(f"simulated, {cluster}: cluster throughput vs foreground time "
               "(up and left is better)", fontsize=plots.TITLE)
  return plots.save(fig, path)


def _frontier_panel(ax, cell: list[Row]) -> None:
  """One frontier panel (see frontier_figure)."""
  from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator  # matplotlib: drawing

  head = next((r for r in cell if _limit(r) == HEADLINE_LIMIT), cell[0] if cell else None)
  front = next((r["data_parallel_frontier"] for r in cell if r.get("data_parallel_frontier")),
               None)
  if head is not None and number(head.get("iteration_ms")):
    tol = tolerance(head)
    ax.axvspan(0, head["iteration_ms"] * (1 + tol), color="0.9", zorder=0,
               label=f"DP foreground within {tol:.1%} of burst A={limit_label(HEADLINE_LIMIT)}")
  if front:
    xs = [p["iteration_ms"] for p in front]
    ds = sorted(p["devices"] for p in front)  # d labelled: the ends and every fourfold step
    labelled = {d for k, d in enumerate(ds) if k % 2 == 0 or d == ds[-1]}
    ax.plot(xs, [p["cluster_samples_per_s"] for p in front], "o-", ms=3, color="tab:gray",
            label="DP on d <= G + background on G - d")
    for p in front:
      if p["devices"] in labelled:
        ax.annotate(f"d={p['devices']}", (p["iteration_ms"], p["cluster_samples_per_s"]),
                    fontsize=plots.FONT, xytext=(2, -9), textcoords="offset points",
                    color="tab:gray")
  burst = [(r["iteration_ms"], r["cluster_samples_per_s"], _limit(r)) for r in cell
           if r.get("iteration_ms") and r.get("cluster_samples_per_s")]
  if burst:
    ax.plot([x for x, _, _ in burst], [y for _, y, _ in burst], "s-", ms=4, color="tab:red",
            label="burst + background, over A")
    for x, y, a in burst:
      ax.annotate(f"A={limit_label(a)}", (x, y), fontsize=plots.FONT, xytext=(3, 3),
                  textcoords="offset points", color="tab:red")
  if head is not None and head.get("matched_data_parallel_devices") is not None:
    ax.plot([head["matched_data_parallel_iteration_ms"]],
            [head["matched_data_parallel_cluster_samples_per_s"]], "*", ms=10,
            color="tab:blue", label="matched DP + background (the fair baseline)")
  ax.set_xscale("log")
  plain = FuncFormatter(lambda v, _: f"{v:g}")
  ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=6))
  ax.xaxis.set_major_formatter(plain)
  ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
  ax.yaxis.set_major_locator(MaxNLocator(5))
  ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
  ax.tick_params(labelsize=plots.FONT, which="both")
  ax.grid(alpha=0.3, which="both")
  if head is not None:
    ax.text(0.98, 0.04, f"vs matched: {simulated.matched_label(head)}", fontsize=plots.FONT,
            ha="right", transform=ax.transAxes)


def _limit(r: Row) -> float:
  a = number(r.get("amplification_limit"))
  return math.inf if a is None else a


def throughput_cell(r: Row) -> str:
  """Cluster throughput / matched DP + BG (its d); / fastest DP + BG; / DP alone; then the
  foreground against the fastest DP on <= G, each with its verdict ('DP on d' for a plan that is
  data parallelism)."""
  return data_parallel_label(r) or (
      f"{simulated.matched_label(r)}; {judged(r, 'cluster_throughput_vs_best_data_parallel')}; "
      f"{judged(r, 'cluster_throughput_vs_data_parallel')}; foreground "
      f"{judged(r, 'speedup_vs_best_data_parallel')}")


def largest_gain(rows: list[Row]) -> str:
  """The cell with the largest cluster throughput against the matched baseline, in one sentence
  with its foreground against the fastest data parallelism ('' when no cell has both)."""
  judged_cells = [r for r in rows if not data_parallel_label(r)
                  and number(r.get("cluster_throughput_vs_matched_data_parallel")) is not None
                  and number(r.get("speedup_vs_best_data_parallel")) is not None]
  if not judged_cells:
    return ""
  r = max(judged_cells, key=lambda q: q["cluster_throughput_vs_matched_data_parallel"])
  return (f" Largest gain against the matched baseline: {r['model']} G={r['num_devices']} "
          f"B={r['global_batch']}, cluster throughput "
          f"{judged(r, 'cluster_throughput_vs_matched_data_parallel')} against matched DP on "
          f"{r['matched_data_parallel_devices']} + background, foreground "
          f"{judged(r, 'speedup_vs_best_data_parallel')} against the fastest DP on <= G (DP on "
          f"{r['best_data_parallel_devices']}).")


def headline(rows: list[Row]) -> str:
  """Per cluster at A=2: cluster / matched DP + BG (its d) first, then / fastest DP + BG and /
  DP alone, and the foreground / fastest DP, each with its verdict; the verdicts counted and the
  largest gain with its foreground."""
  parts = []
  rows = [r for r in rows if _limit(r) == HEADLINE_LIMIT] or rows
  for c in dict.fromkeys(r["cluster"] for r in rows):
    sub = [r for r in rows if r["cluster"] == c]
    cols = [(f"G={g} B={b}", lambda r, g=g, b=b: (r["num_devices"], r["global_batch"]) == (g, b))
            for g, b in sorted({(r["num_devices"], r["global_batch"]) for r in sub})]
    none = sum(r.get("matched_data_parallel_devices") is None and not data_parallel_label(r)
               for r in sub)
    parts.append(
        f"### {c}, A={limit_label(_limit(sub[0]))}: cluster throughput / matched DP + "
        "background @ its devices; / fastest DP + background; / DP alone on all G; foreground / "
        "fastest DP on <= G (simulated; DP on d: the plan is data parallelism)\n\n"
        + pivot(sub, row_key="model", cols=cols, row_header="model", value=throughput_cell)
        + "\nAgainst the matched baseline: "
        f"{tally(sub, 'cluster_throughput_vs_matched_data_parallel')}, {none} with no data "
        f"parallelism within the tolerance ({len(sub)} cells), while the foreground against the "
        f"fastest data parallelism on <= G is {tally(sub, 'speedup_vs_best_data_parallel')}. "
        "Against data parallelism alone on all G: "
        f"{tally(sub, 'cluster_throughput_vs_data_parallel')}.{largest_gain(sub)}\n")
  return "\n".join(parts)


STUDY = Study(name="cluster_throughput", app="simulate", doc=__doc__,
              columns=(*simulated.IDENTITY, *simulated.RESULTS, *simulated.DERIVED,
                       *simulated.VERDICTS),
              timing=simulated.TIMING, finish=simulated.finish, derive=simulated.derive,
              figures=figures, headline=headline,
              kind="simulated", fits=("cluster_samples_per_s",))

if __name__ == "__main__":
  sys.exit(main(STUDY))
