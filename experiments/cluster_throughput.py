"""Cluster throughput: foreground + background samples/s against data parallelism alone.

    scripts/reproduce.sh cluster_throughput   # sweep + aggregation into results/cluster_throughput/
    # which runs (S: a timestamped sweep folder):
    python -m dp_jax.simulate -m +experiment=cluster_throughput \\
        hydra.sweep.dir=multirun/cluster_throughput/S
    python -m experiments.cluster_throughput multirun/cluster_throughput/S \\
        --out results/cluster_throughput

Simulate app, analytic roofline profiles (bfloat16): the five models on dgx_a100 and dgx_h100
at G = 8, 16, 32 with B = 32 and G = B = 64..1024; burst planner with amplification limit 2 (the
headline) and inf; background `same_family` (the foreground's model at batch 8 per device, one
copy per device) in the idle windows under a 10% foreground slowdown cap, policy `fit`
(docs/simulator.md). All numbers are simulated from the cost model (docs/cost_model.md).
"cluster / DP" is (foreground + background samples/s) over data parallelism running the
foreground alone on the same G devices; "/ (fastest DP + BG)" over data parallelism on its
fastest device count d <= G plus the background job alone on the G - d devices it leaves free;
"/ (matched DP + BG) @d" over data parallelism on the fewest devices d that are at least as fast
as the burst foreground plus the background job on the other G - d ("none as fast": no data
parallelism on d <= G matches the burst foreground). The frontier figures draw, per cell, data
parallelism on every d <= G with the background job on the rest, beside the burst plans over A.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from experiments import plots, simulated
from experiments.fields import limit_label, number, pivot, times
from experiments.report import Row, Study, main

HEADLINE_LIMIT = 2.0


def figures(rows: list[Row], out: Path) -> list[Path]:
  """Ratios to data parallelism against G, the samples/s they come from, and the frontiers."""
  def rates(r: Row) -> list[tuple[str, float | None]]:
    """Samples/s of the burst cell and of the data-parallel baselines."""
    return [("foreground", r["samples_per_s"]), ("background", r["background_samples_per_s"]),
            ("cluster", r["cluster_samples_per_s"]),
            ("DP alone", r["data_parallel_samples_per_s"]),
            ("fastest DP + BG", r["best_data_parallel_cluster_samples_per_s"]),
            ("matched DP + BG", r.get("matched_data_parallel_cluster_samples_per_s"))]

  headline_rows = [r for r in rows if _limit(r) == HEADLINE_LIMIT] or rows
  return [plots.grid(headline_rows, out / "cluster_throughput_ratios.png", panel_row="cluster",
                     panel_col="model", x="num_devices", points=simulated.ratio_points,
                     xlabel="devices G", ylabel="ratio", style=simulated.ratio_style,
                     title="burst (A=2) + background vs data parallelism (B=32 up to G=32, "
                           "then B=G)"),
          plots.grid(headline_rows, out / "cluster_throughput_samples.png", panel_row="cluster",
                     panel_col="model", x="num_devices", points=rates, xlabel="devices G",
                     ylabel="samples/s", title="samples/s: burst (A=2) foreground, background, "
                                               "cluster; data-parallel baselines"),
          *[frontier_figure(rows, c, out / f"cluster_throughput_frontier_{c}.png")
            for c in dict.fromkeys(r["cluster"] for r in rows)]]


def frontier_figure(rows: list[Row], cluster: str, path: Path) -> Path:
  """Per model and shape: iteration time vs cluster samples/s of data parallelism on every
  d <= G with the background job on the rest (a line over d), and of the burst plans with
  background fill (a line over the amplification limit A)."""
  plt = plots.pyplot()
  sub = [r for r in rows if r["cluster"] == cluster]
  models = plots.ordered({r["model"] for r in sub})
  shapes = sorted({(r["num_devices"], r["global_batch"]) for r in sub})
  fig, axes = plt.subplots(len(models), len(shapes), squeeze=False,
                           figsize=(2.6 * len(shapes), 2.3 * len(models)))
  for i, model in enumerate(models):
    for j, (g, b) in enumerate(shapes):
      ax = axes[i][j]
      cell = sorted((r for r in sub if r["model"] == model
                     and (r["num_devices"], r["global_batch"]) == (g, b)), key=_limit)
      front = next((r["data_parallel_frontier"] for r in cell if r.get("data_parallel_frontier")),
                   None)
      if front:
        ax.plot([p["iteration_ms"] for p in front], [p["cluster_samples_per_s"] for p in front],
                "o-", ms=2, color="tab:gray", label="DP on d <= G + BG on the rest")
      burst = [(r["iteration_ms"], r["cluster_samples_per_s"], _limit(r)) for r in cell
               if r.get("iteration_ms") and r.get("cluster_samples_per_s")]
      if burst:
        ax.plot([x for x, _, _ in burst], [y for _, y, _ in burst], "s-", ms=4,
                color="tab:red", label="burst + BG over A")
        for x, y, a in burst:
          ax.annotate(limit_label(a), (x, y), fontsize=6)
      ax.set_xscale("log")
      ax.set_yscale("log")
      ax.tick_params(labelsize=6)
      ax.set_title(f"{model} G={g} B={b}", fontsize=7)
      if i == len(models) - 1:
        ax.set_xlabel("ms / iteration", fontsize=7)
      if j == 0:
        ax.set_ylabel("cluster samples/s", fontsize=7)
  handles, labels = plots.legend_entries(ax for row in axes for ax in row)
  fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=8)
  fig.suptitle(f"{cluster}: simulated frontiers (up and left is better)", y=0.995, fontsize=9)
  fig.tight_layout(rect=(0, 0, 1, 0.97))
  return plots.save(fig, path)


def _limit(r: Row) -> float:
  a = number(r.get("amplification_limit"))
  return math.inf if a is None else a


def headline(rows: list[Row]) -> str:
  """Per cluster at A=2: cluster / DP alone, / fastest DP + BG, / matched DP + BG (its d)."""
  parts = []
  rows = [r for r in rows if _limit(r) == HEADLINE_LIMIT] or rows
  for c in dict.fromkeys(r["cluster"] for r in rows):
    sub = [r for r in rows if r["cluster"] == c]
    cols = [(f"G={g} B={b}", lambda r, g=g, b=b: (r["num_devices"], r["global_batch"]) == (g, b))
            for g, b in sorted({(r["num_devices"], r["global_batch"]) for r in sub})]
    parts.append(f"### {c}, A=2: cluster throughput / data parallelism alone; / (fastest DP + "
                 "background); / (matched DP + background) @ its devices\n\n" + pivot(
                     sub, row_key="model", cols=cols, row_header="model",
                     value=lambda r: f"{times(r['cluster_throughput_vs_data_parallel'])}; "
                                     f"{times(r['cluster_throughput_vs_best_data_parallel'])}; "
                                     f"{simulated.matched_label(r)}"))
  return "\n".join(parts)


STUDY = Study(name="cluster_throughput", app="simulate", doc=__doc__,
              columns=(*simulated.IDENTITY, *simulated.RESULTS, *simulated.DERIVED),
              timing=simulated.TIMING, derive=simulated.derive, figures=figures, headline=headline)

if __name__ == "__main__":
  sys.exit(main(STUDY))
