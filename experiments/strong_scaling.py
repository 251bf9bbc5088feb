"""Strong scaling: iteration time and GPU-time of burst plans against data parallelism.

    scripts/reproduce.sh strong_scaling      # sweep + aggregation into results/strong_scaling/
    # which runs, in .venv (S: a timestamped sweep folder):
    python -m dp_jax.plan -m +experiment=strong_scaling hydra.sweep.dir=multirun/strong_scaling/S
    python -m experiments.strong_scaling multirun/strong_scaling/S --out results/strong_scaling

Plan app, the calibrated GPU profile of each cluster's device (mixed bf16, fitted on published
single-GPU rows, judged on held-out ones: scripts/validate_published.py): vgg16, resnet50,
inception_v3, wide_resnet101_2 and gpt2 (GPT-2 small, B sequences of 1024 tokens: B = 32 is
32,768 tokens; on one 40 GB A100 that needs more than the device holds in the memory model,
which counts the attention probabilities XLA saves for backward, so the two G=1, B=32 gpt2 cells
on dgx_a100 fail with that one-line error; "Failed cells" below says how much they need) on
dgx_a100, dgx_h100 and dgx_h200 (8 GPUs per NVLink node, one InfiniBand NIC per GPU),
amplification limit 2 (DeepPool's setting) and inf (the fastest plan), every (G, B) of
conf/experiment/shape/ in the grid: B = 16 with G = 1..16, B = 32 with G = 1..32 (strong
scaling: with sample splitting G > B leaves a device without a sample, so G stops at B), and
B = G for G = 64..1024 (one sample per device under data parallelism: the large-scale view). Each
cell's summary holds both plans: the burst plan and the data-parallel baseline priced by the
same cost model. A cell whose plan is plain data parallelism on d devices shows "DP on d"
instead of a ratio (there is no burst plan to judge) and is counted as "is DP".

It shows, per model and cluster, how the iteration time and GPU-time of data parallelism and of
burst plans (A = 2 and inf) change with G at fixed B, and the GPU time a burst plan saves: first
against the cheapest data parallelism whose time is within the tolerance of the fastest one's (the
fair baseline), then against data parallelism on all G. All numbers are predicted by the cost
model (docs/cost_model.md), collectives at measured bus bandwidths.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from experiments import plots
from experiments.aggregate import Row, Study, main
from experiments.fields import (
  PLAN_BASIS,
  PLAN_IDENTITY,
  data_parallel_label,
  gpu_change,
  judge,
  judged,
  limit_label,
  median_gpu_change,
  number,
  pick,
  pivot,
  plan_identity,
  ratio,
  ratio_verdict,
  tally,
  tolerance,
  verdict_columns,
)

RESULTS = (*PLAN_BASIS, "iteration_ms", "gpu_ms", "data_parallel_iteration_ms",
           "data_parallel_gpu_ms", "speedup", "gpu_time_saving", "best_data_parallel_devices",
           "best_data_parallel_iteration_ms", "speedup_vs_best_data_parallel",
           "cheapest_data_parallel_devices", "cheapest_data_parallel_iteration_ms",
           "cheapest_data_parallel_gpu_ms", "gpu_time_saving_vs_cheapest_data_parallel")
DERIVED = ("samples_per_s", "data_parallel_samples_per_s", "idle_fraction")
# The burst plan against the fastest data parallelism on d <= G (fair) and on all G.
COMPARED = ("speedup_vs_best_data_parallel", "speedup")
VERDICTS = ("comparison_tolerance", *verdict_columns(COMPARED))
HEADLINE_SHAPES = ((8, 32), (32, 32), (1024, 1024))
ALL_SHAPES_UP_TO = 4  # a sweep of this many (G, B) or fewer shows every one in its tables


def derive(row: Row) -> Row:
  """Identity from the config, the plan app's summary, samples/s and the burst idle fraction."""
  out = {**plan_identity(row["config"]), **pick(row, RESULTS)}
  b, g = out["global_batch"], out["num_devices"]
  it, dp = number(out["iteration_ms"]), number(out["data_parallel_iteration_ms"])
  out["samples_per_s"] = None if it is None else b / it * 1e3
  out["data_parallel_samples_per_s"] = None if dp is None else b / dp * 1e3
  busy = ratio(out["gpu_ms"], None if it is None else g * it)
  out["idle_fraction"] = None if busy is None else 1 - busy
  out["comparison_tolerance"] = tolerance(row)
  return out


def finish(rows: list[Row]) -> list[Row]:
  """The fastest data parallelism on d <= G from the sweep itself where a cell's summary lacks
  it (the sweep's cells of the same model, cluster, A and B at G' <= G; left empty when the
  sweep has no smaller G at that B), then the verdicts."""
  out = [dict(r) for r in rows]
  for r in out:
    if number(r.get("speedup_vs_best_data_parallel")) is not None or number(
        r.get("iteration_ms")) is None:
      continue
    same = [q for q in out if number(q.get("data_parallel_iteration_ms")) is not None and
            (q["model"], q["cluster"], q["amplification_limit"], q["global_batch"]) ==
            (r["model"], r["cluster"], r["amplification_limit"], r["global_batch"]) and
            q["num_devices"] <= r["num_devices"]]
    if len(same) < 2:  # no smaller G at this B in the sweep: unknown, not DP on all G
      continue
    best = min(same, key=lambda q: (q["data_parallel_iteration_ms"], q["num_devices"]))
    r.update(best_data_parallel_devices=best["num_devices"],
             best_data_parallel_iteration_ms=best["data_parallel_iteration_ms"],
             speedup_vs_best_data_parallel=ratio(best["data_parallel_iteration_ms"],
                                                 r["iteration_ms"]))
  return [{**r, **judge(r, COMPARED)} for r in out]


def figures(rows: list[Row], out: Path) -> list[Path]:
  """Iteration time and GPU time against G, burst (solid) vs data parallelism (dashed), one
  colour per scaling regime (a fixed B, or B = G), per A."""
  regimes = plots.scaling_regimes(rows)
  names = dict.fromkeys(n for r in rows for n in regimes(r) if n != plots.WEAK)
  palette = {n: ("tab:blue", "tab:orange", "tab:brown")[k % 3] for k, n in enumerate(names)}
  palette[plots.WEAK] = "tab:green"

  def style(label: str) -> dict:
    """Colour by regime, dashed for data parallelism."""
    kind, _, regime = label.partition(", ")
    return {"color": palette.get(regime, "black"), "ls": "--" if kind == "DP" else "-",
            "marker": "s" if regime == plots.WEAK else "o"}

  paths = []
  for a in sorted({r["amplification_limit"] for r in rows}):
    sub = [r for r in rows if r["amplification_limit"] == a]
    for y, dp_y, what in (("iteration_ms", "data_parallel_iteration_ms", "iteration time (ms)"),
                          ("gpu_ms", "data_parallel_gpu_ms", "GPU time per iteration (GPU-ms)")):
      def points(r, y=y, dp_y=dp_y):
        """Burst and data-parallel values of the cell, once per scaling regime it is in."""
        return [(f"{s}, {regime}", r[k]) for regime in regimes(r)
                for s, k in (("burst", y), ("DP", dp_y))]

      paths.append(plots.grid(
          sub, out / f"strong_scaling_{y}_A{limit_label(a)}.png", panel_row="cluster",
          panel_col="model", x="num_devices", points=points, xlabel="devices G", ylabel=what,
          title=f"predicted scaling: {what}, burst (A={limit_label(a)}, solid) vs data "
                "parallelism (DP, dashed); strong scaling at a fixed B and weak scaling at B = G "
                "drawn as separate lines", style=style,
          caption="a line ends where the sweep has no cell: G > B leaves a device without a "
                  "sample; a cell that fails the memory model is listed in the README"))
  return paths


def best_over_g(rows: list[Row]) -> list[Row]:
  """Per (model, cluster, A, fixed B): the fastest G of data parallelism and of the burst plan
  (the burst row kept: its plan may be data parallelism, its tolerance judges the pair)."""
  out = []
  for key in dict.fromkeys((r["model"], r["cluster"], r["amplification_limit"], r["global_batch"])
                           for r in rows if r["global_batch"] in (16, 32)):
    sub = [r for r in rows if (r["model"], r["cluster"], r["amplification_limit"],
                               r["global_batch"]) == key]
    dp = min(sub, key=lambda r: (r["data_parallel_iteration_ms"], r["num_devices"]))
    burst = min(sub, key=lambda r: (r["iteration_ms"], r["num_devices"]))
    out.append(dict(zip(("model", "cluster", "amplification_limit", "global_batch"), key,
                        strict=True), dp_ms=dp["data_parallel_iteration_ms"],
                    dp_g=dp["num_devices"], burst_ms=burst["iteration_ms"],
                    burst_g=burst["num_devices"], burst=burst))
  return out


def best_pair(r: Row) -> str:
  """'9.26 ms @G=32 -> 6.08 ms @G=32 (1.52x ahead)'; '(DP on 8)' when the fastest plan is data
  parallelism."""
  judged_pair = (data_parallel_label(r["burst"])
                 or ratio_verdict(r["dp_ms"] / r["burst_ms"], tolerance(r["burst"])))
  return (f"{r['dp_ms']:.2f} ms @G={r['dp_g']} -> {r['burst_ms']:.2f} ms @G={r['burst_g']} "
          f"({judged_pair})")


def best_table(rows: list[Row], a: float) -> str:
  """Markdown: per model and cluster, each strategy's fastest iteration over G at B = 32."""
  best = [r for r in best_over_g(rows) if r["amplification_limit"] == a and
          r["global_batch"] == 32]
  clusters = list(dict.fromkeys(r["cluster"] for r in best))
  return (f"### B=32, each at its fastest G <= 32: data parallelism -> burst (A={limit_label(a)})"
          " (predicted; the verdict judges the margin against the tolerance; DP on d: the "
          "fastest plan is data parallelism)\n\n" + pivot(
              best, row_key="model", row_header="model",
              cols=[(c, lambda r, c=c: r["cluster"] == c) for c in clusters], value=best_pair))


SAVING_CAPTION = ("GPU time as a ratio, Nx less or Nx more: against the cheapest data parallelism "
                  "within the tolerance of the fastest one's time (the fair baseline, first) / "
                  "against data parallelism on all G")


def comparison_cell(r: Row) -> str:
  """'1.22x ahead / 1.22x ahead (2.56x less / 3.33x less)': speed-up over the fastest data
  parallelism on <= G / over all G, then the plan's GPU time against the cheapest DP within
  tolerance / DP on all G; 'DP on d (...)' when the plan is data parallelism."""
  saving = (f"({gpu_change(r.get('gpu_time_saving_vs_cheapest_data_parallel'))} / "
            f"{gpu_change(r.get('gpu_time_saving'))})")
  speed = (data_parallel_label(r) or
           f"{judged(r, 'speedup_vs_best_data_parallel')} / {judged(r, 'speedup')}")
  return f"{speed} {saving}"


def table_shapes(rows: list[Row]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
  """(shown, others): the (G, B) columns of the tables and the ones only the CSV holds. Every
  shape the sweep ran when it ran a few (a quick sweep's G is never hidden), else the
  HEADLINE_SHAPES it has; never a column without a cell."""
  have = sorted({(r["num_devices"], r["global_batch"]) for r in rows})
  shown = have if len(have) <= ALL_SHAPES_UP_TO else [s for s in HEADLINE_SHAPES if s in have]
  shown = shown or have
  return shown, [s for s in have if s not in shown]


def headline(rows: list[Row]) -> str:
  """Speed-up and GPU time against data parallelism at a few (G, B) (every one a small sweep
  ran; the others named), per cluster and A."""
  clusters = list(dict.fromkeys(r["cluster"] for r in rows))
  shapes, others = table_shapes(rows)
  rest = ("" if not others else " Also in strong_scaling.csv, not in this table: "
          + ", ".join(f"G={g} B={b}" for g, b in others) + ".")
  parts = [best_table(rows, a) for a in sorted({r["amplification_limit"] for r in rows})
           if math.isinf(a)]
  for a in sorted({r["amplification_limit"] for r in rows}):
    sub = [r for r in rows if r["amplification_limit"] == a]
    cols = [(f"{c} G={g} B={b}", lambda r, c=c, g=g, b=b: (r["cluster"], r["num_devices"],
                                                         r["global_batch"]) == (c, g, b))
            for c in clusters for g, b in shapes]
    parts.append(f"### Amplification limit {limit_label(a)}: burst speed-up over the fastest "
                 "data parallelism on <= G devices / over data parallelism on all G "
                 f"({SAVING_CAPTION}; DP on d: the plan is data parallelism) (predicted)\n\n"
                 + pivot(sub, row_key="model", cols=cols, row_header="model",
                         value=comparison_cell)
                 + f"\nOver every cell at A={limit_label(a)}, against the fastest data "
                   f"parallelism on <= G: {tally(sub, 'speedup_vs_best_data_parallel')}; against "
                   f"data parallelism on all G: {tally(sub, 'speedup')}. GPU time against the "
                   "cheapest data parallelism within the tolerance of the fastest (the fair "
                   "baseline): "
                   f"{median_gpu_change(sub, 'gpu_time_saving_vs_cheapest_data_parallel')}; "
                   "against data parallelism on all G: "
                   f"{median_gpu_change(sub, 'gpu_time_saving')}.{rest}\n")
  return "\n".join(parts)


STUDY = Study(name="strong_scaling", app="plan", doc=__doc__,
              columns=(*PLAN_IDENTITY, *RESULTS, *DERIVED, *VERDICTS),
              timing=("planner_seconds",), derive=derive, figures=figures, headline=headline,
              finish=finish,
              kind="predicted", fits=("iteration_ms", "data_parallel_iteration_ms"))

if __name__ == "__main__":
  sys.exit(main(STUDY))
