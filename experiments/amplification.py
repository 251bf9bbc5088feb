"""Amplification: foreground speed against GPU-time as the amplification limit A varies.

    scripts/reproduce.sh amplification      # sweep + aggregation into results/amplification/
    # which runs, in .venv (S: a timestamped sweep folder):
    python -m dp_jax.plan -m +experiment=amplification hydra.sweep.dir=multirun/amplification/S
    python -m experiments.amplification multirun/amplification/S --out results/amplification

Plan app, the calibrated GPU profile (mixed bf16; scripts/validate_published.py), dgx_a100
(8 A100 per NVLink node, one 25 GB/s
InfiniBand NIC per GPU): the five models at G=8 B=32 (one node), G=32 B=32 (four nodes) and
G=256 B=256, with A in {1, 1.5, 2, 2.5, 5, inf}. A bounds how much more GPU-time a layer may
use on more devices (DeepPool's amplification limit: A = 1 takes extra devices only when they
cost no GPU-time, inf gives the fastest plan). `on_front` marks the plans of a (model, G, B)
group that no other A beats on both iteration time and GPU-time (the Pareto front); data
parallelism is drawn for reference. GPU-ms are the planner's (busy device-ms per iteration).

It shows how lowering A trades foreground speed for GPU-time (A = 1 keeps almost every layer
on one device) and where data parallelism lies against the front. The planner picks the fastest
plan under A, not the cheapest, so a plan at some A can be dominated by the plan at a larger A.
All numbers are predicted by the cost model (docs/cost_model.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from experiments import plots
from experiments.aggregate import Row, Study, main
from experiments.fields import PLAN_IDENTITY, judge, limit_label, number, pivot, tally
from experiments.pareto import on_front
from experiments.strong_scaling import (
  COMPARED,
  DERIVED,
  RESULTS,
  SAVING_CAPTION,
  VERDICTS,
  comparison_cell,
)
from experiments.strong_scaling import derive as plan_derive

GROUP = ("model", "cluster", "num_devices", "global_batch")


def derive(row: Row) -> Row:
  """The strong_scaling columns of a plan cell (on_front is added per group afterwards)."""
  return {**plan_derive(row), "on_front": None}


def mark_front(rows: list[Row]) -> list[Row]:
  """Rows with on_front set within each (model, cluster, G, B) group of finished cells."""
  out = [dict(r) for r in rows]
  groups: dict[tuple, list[Row]] = {}
  for r in out:
    if number(r["iteration_ms"]) is not None and number(r["gpu_ms"]) is not None:
      groups.setdefault(tuple(r[k] for k in GROUP), []).append(r)
  for members in groups.values():
    flags = on_front([(r["iteration_ms"], r["gpu_ms"]) for r in members])
    for r, f in zip(members, flags, strict=True):
      r["on_front"] = f
  return [{**r, **judge(r, COMPARED)} for r in out]


def figures(rows: list[Row], out: Path) -> list[Path]:
  """Per (G, B) and model: GPU-ms against iteration ms, A labelled, front and DP marked."""
  plt = plots.pyplot()
  shapes = sorted({(r["num_devices"], r["global_batch"]) for r in rows})
  models = list(dict.fromkeys(r["model"] for r in rows))
  fig, axes = plt.subplots(len(shapes), len(models), squeeze=False, layout="constrained",
                           figsize=(3.3 * len(models), 2.8 * len(shapes) + 0.9))
  for i, (g, b) in enumerate(shapes):
    for j, m in enumerate(models):
      ax = axes[i][j]
      sub = sorted((r for r in rows if (r["num_devices"], r["global_batch"], r["model"]) ==
                    (g, b, m)), key=lambda r: r["iteration_ms"])
      front = [r for r in sub if r["on_front"]]
      ax.plot([r["iteration_ms"] for r in front], [r["gpu_ms"] for r in front], "-",
              color="tab:blue", lw=1, label="Pareto front")
      ax.scatter([r["iteration_ms"] for r in sub], [r["gpu_ms"] for r in sub], s=14,
                 color="tab:blue", label="burst plan (A)")
      for r in sub:
        ax.annotate(limit_label(r["amplification_limit"]), (r["iteration_ms"], r["gpu_ms"]),
                    fontsize=plots.FONT, xytext=(3, 3), textcoords="offset points")
      if sub:
        ax.scatter([sub[0]["data_parallel_iteration_ms"]], [sub[0]["data_parallel_gpu_ms"]],
                   marker="x", color="tab:red", label="data parallel")
      ax.set_title(f"{m} | G={g} B={b}", fontsize=plots.LABEL)
      plots.log_axes(ax)
      ax.tick_params(labelsize=plots.FONT, which="both")
      ax.grid(alpha=0.3)
      ax.set_xlabel("iteration time (ms), log scale", fontsize=plots.LABEL)
      ax.set_ylabel(plots.wrap("GPU time per iteration (GPU-ms), log scale", 2.4, plots.LABEL),
                    fontsize=plots.LABEL)
  handles, labels = plots.legend_entries(axes.flat)
  fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=plots.FONT)
  fig.suptitle("predicted: foreground iteration time vs GPU time as the amplification limit A "
               "varies (log-log)", fontsize=plots.TITLE)
  return [plots.save(fig, out / "amplification_front.png")]


def headline(rows: list[Row]) -> str:
  """Per (G, B): speed-up over data parallelism and GPU-time saving for each A."""
  limits = sorted({r["amplification_limit"] for r in rows})
  parts = []
  for g, b in sorted({(r["num_devices"], r["global_batch"]) for r in rows}):
    sub = [r for r in rows if (r["num_devices"], r["global_batch"]) == (g, b)]
    cols = [(f"A={limit_label(a)}", lambda r, a=a: r["amplification_limit"] == a)
            for a in limits]
    parts.append(f"### G={g}, B={b} ({sub[0]['cluster']}): speed-up over the fastest data "
                 f"parallelism on <= G devices / over data parallelism on all G ({SAVING_CAPTION}"
                 "; DP on d: the plan is data parallelism); * = on the Pareto front "
                 "(predicted)\n\n" + pivot(
                     sub, row_key="model", cols=cols, row_header="model",
                     value=lambda r: f"{comparison_cell(r)}{'*' if r['on_front'] else ''}")
                 + "\nAgainst the fastest data parallelism on <= G: "
                   f"{tally(sub, 'speedup_vs_best_data_parallel')}.\n")
  return "\n".join(parts)


STUDY = Study(name="amplification", app="plan", doc=__doc__,
              columns=(*PLAN_IDENTITY, *RESULTS, *DERIVED, "on_front", *VERDICTS),
              timing=("planner_seconds",), derive=derive, figures=figures, headline=headline,
              finish=mark_front,
              kind="predicted", fits=("iteration_ms", "data_parallel_iteration_ms"))

if __name__ == "__main__":
  sys.exit(main(STUDY))
