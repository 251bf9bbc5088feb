"""Validation: every prediction of the cost model compared with a measured run of the same plan.

    scripts/reproduce.sh validation   # sweep + aggregation into results/validation/
    # which runs, in .venv (S: a timestamped sweep folder):
    python -m dp_jax.validate -m +experiment=validation hydra.sweep.dir=multirun/validation/S
    python -m experiments.validation multirun/validation/S --out results/validation

Validate app on this machine's JAX backend with one device per core (docs/validation.md):
vgg16 at 32x32 and the tiny GPT-2, B = 32, data parallelism, the planner's burst plans at
A = 1.5, 2, inf (duplicates dropped) and 10 random valid plans each; layers profiled in
context (every prefix as the runtime's stage program); a plan's measured time is the min of
its timed steps, the steps of all its plans interleaved. Columns: the error
summary of each model (median and max absolute % error, Spearman rank correlation over plans,
median predicted / measured); per-plan rows are in <model>_validation.csv, and scatter.png
draws them all.

It should show: whether the planner's cost model, fed with the local profile and the measured
local links, ranks and prices plans as the runtime runs them (targets: median error <= 20%,
Spearman >= 0.8).
"""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

from experiments import plots
from experiments.aggregate import Row, Study, main
from experiments.fields import number, pick

IDENTITY = ("model", "global_batch", "num_devices")
RESULTS = ("plans", "median_abs_pct_error", "max_abs_pct_error", "spearman", "median_ratio")


def derive(row: Row) -> Row:
  """Identity from the config, the error summary from the cell's status."""
  cfg = row["config"]
  return {"model": (cfg.get("model") or {}).get("name"), "global_batch": cfg.get("batch_size"),
          "num_devices": row.get("num_devices"), **pick(row, RESULTS), "_dir": row.get("dir")}


def plan_rows(r: Row, out: Path) -> list[dict]:
  """The per-plan rows of a cell's validation.csv (re-rendered from a results folder: the
  <model>_validation.csv copied there)."""
  path = (Path(r["_dir"]) / "validation.csv" if r.get("_dir") else
          out / f"{r['model']}_validation.csv")
  return list(csv.DictReader(path.open())) if path.is_file() else []


def figures(rows: list[Row], out: Path) -> list[Path]:
  """One scatter of predicted vs measured over every model's plans; per-model CSVs copied."""
  plt = plots.pyplot()
  fig, ax = plt.subplots(figsize=(6, 5.5), layout="constrained")
  values = []
  for r in rows:
    plans = plan_rows(r, out)
    if r.get("_dir"):
      shutil.copy(Path(r["_dir"]) / "validation.csv", out / f"{r['model']}_validation.csv")
    for kind, marker in (("data_parallel", "s"), ("burst", "D"), ("random", "o")):
      pts = [(float(p["measured_ms"]), float(p["predicted_ms"])) for p in plans
             if p["kind"] == kind]
      values += [v for pt in pts for v in pt]
      if pts:
        ax.scatter(*zip(*pts, strict=True), marker=marker, alpha=0.8,
                   label=f"{r['model']} {kind}")
  if not values:
    plt.close(fig)
    return []
  lo, hi = min(values) * 0.8, max(values) * 1.25
  ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="predicted = measured")
  ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="grey",
                  alpha=0.15, label="+-20%")
  ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
         xlabel="measured step time (ms), log scale",
         ylabel="predicted step time (ms), log scale")
  ax.set_title("predicted vs measured step time, local devices", fontsize=plots.TITLE)
  ax.xaxis.label.set_size(plots.LABEL)
  ax.yaxis.label.set_size(plots.LABEL)
  ax.tick_params(labelsize=plots.FONT, which="both")
  ax.legend(fontsize=plots.FONT)
  return [plots.save(fig, out / "scatter.png")]


def headline(rows: list[Row]) -> str:
  """Per model: plans, median/max |error|, Spearman, median predicted/measured."""
  lines = ["| model | devices | plans | median abs error | max abs error | Spearman | "
           "median predicted / measured |", "| --- | --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    sp = number(r["spearman"])
    lines.append(f"| {r['model']} | {r['num_devices']} | {r['plans']} | "
                 f"{number(r['median_abs_pct_error']):.1f}% | "
                 f"{number(r['max_abs_pct_error']):.1f}% | "
                 f"{'-' if sp is None else f'{sp:.2f}'} | {number(r['median_ratio']):.2f} |")
  return "### Error summary (predicted vs measured)\n\n" + "\n".join(lines) + "\n"


STUDY = Study(name="validation", app="validate", doc=__doc__,
              columns=(*IDENTITY, *RESULTS), timing=(), derive=derive, figures=figures,
              headline=headline,
              kind="measured (with the cost model's predictions beside)",
              fits=("median_abs_pct_error",))

if __name__ == "__main__":
  sys.exit(main(STUDY))
