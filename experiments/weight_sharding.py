"""Weight sharding: strong scaling with planner.sharding=[samples,weights] vs [samples].

    scripts/reproduce.sh weight_sharding      # sweep + aggregation into results/weight_sharding/
    # which runs, in .venv (S: a timestamped sweep folder):
    python -m dp_jax.plan -m +experiment=weight_sharding hydra.sweep.dir=multirun/weight_sharding/S
    python -m experiments.weight_sharding multirun/weight_sharding/S --out results/weight_sharding

Plan app, the calibrated GPU profile (mixed bf16, A100) as every planned study: vgg16, gpt2 (GPT-2
small, B sequences of 1024 tokens) and gpt2_medium on a100_nvlink_8 (G = 2..8, one NVLink node)
and dgx_a100 (G = 2..32, 8 GPUs per node, one InfiniBand NIC per GPU), B = 32, fastest plan
(A = inf; G = 1 has no model axis). gpt2_medium at G = 2 fits 40 GB in neither plan: those
cells fail with the memory model's reason. Each (model, cluster, G) is planned twice: layers
split their samples only, and layers may also split their weights (out / in features, heads)
on a 2-D (data, model) mesh (docs/cost_model.md, "Weight sharding"). All numbers are predicted
by the cost model.

It shows where splitting weights per layer beats splitting samples per layer: its best speed-up
over samples only (computed from the cells, with where it is), the iteration time of both plans
against G, the speed-up of weights over samples only, how many layers the plan shards and the
per-device memory peak.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from dp_jax.report.compare import VERDICTS
from experiments import plots
from experiments.aggregate import Row, Study, main
from experiments.fields import (
  PLAN_BASIS,
  PLAN_IDENTITY,
  judge,
  judged,
  number,
  pick,
  pivot,
  plan_identity,
  ratio,
  tolerance,
  verdict_columns,
)

RESULTS = (*PLAN_BASIS, "iteration_ms", "gpu_ms", "data_parallel_iteration_ms",
           "weight_sharded_layers", "memory_peak_gb")
SAMPLES, WEIGHTS = "samples", "samples+weights"


def sharding_label(cfg: Row) -> str:
  """planner.sharding of the cell as one word: samples / samples+weights."""
  value = (cfg.get("planner") or {}).get("sharding") or ["samples"]
  return "+".join(value) if isinstance(value, list) else str(value)


def derive(row: Row) -> Row:
  """Identity from the config, the sharding choice and the plan app's summary."""
  out = {**plan_identity(row["config"]), "sharding": sharding_label(row["config"]),
         **pick(row, RESULTS)}
  it = number(out["iteration_ms"])
  out["samples_per_s"] = None if it is None else out["global_batch"] / it * 1e3
  out["comparison_tolerance"] = tolerance(row)
  return out


def _key(r: Row) -> tuple:
  return r["model"], r["cluster"], r["num_devices"], r["global_batch"]


def finish(rows: list[Row]) -> list[Row]:
  """speedup_vs_samples: the samples-only plan's iteration time / this plan's, same cell."""
  base = {_key(r): r["iteration_ms"] for r in rows if r["sharding"] == SAMPLES}
  out = [{**r, "speedup_vs_samples": ratio(base.get(_key(r)), r["iteration_ms"])} for r in rows]
  return [{**r, **judge(r, ("speedup_vs_samples",))} for r in out]


def style(label: str) -> dict:
  return {"color": "tab:orange" if label == WEIGHTS else "tab:blue",
          "ls": "-" if label == WEIGHTS else "--"}


def figures(rows: list[Row], out: Path) -> list[Path]:
  """Iteration time against G: samples only (dashed) vs samples + weights (solid)."""
  return [plots.grid(
      rows, out / "weight_sharding_iteration_ms.png", panel_row="cluster", panel_col="model",
      x="num_devices", points=lambda r: [(r["sharding"], r["iteration_ms"])],
      xlabel="devices G", ylabel="iteration time (ms), B=32",
      title="predicted: samples only (dashed) vs samples + weights (solid)", style=style)]


def gain_line(rows: list[Row]) -> str:
  """The best speed-up of samples + weights over samples only, where, and how the cells are
  judged, computed from the rows."""
  judged_cells = [r for r in rows if r["sharding"] == WEIGHTS
                  and number(r.get("speedup_vs_samples")) is not None]
  if not judged_cells:
    return "No cell has both plans: no speed-up of weight sharding over samples only.\n"
  best = max(judged_cells, key=lambda r: r["speedup_vs_samples"])
  counts = Counter(r["speedup_vs_samples_verdict"] for r in judged_cells)
  return (f"Splitting weights as well as samples is up to {judged(best, 'speedup_vs_samples')} "
          f"against samples only ({best['model']} on {best['cluster']}, G={best['num_devices']}"
          f", B={best['global_batch']}; predicted); over the {len(judged_cells)} cells with both "
          f"plans: {', '.join(f'{counts[v]} {v}' for v in VERDICTS)}.\n")


def headline(rows: list[Row]) -> str:
  """The best gain of weight sharding, then per model and cluster, each G: samples-only ms ->
  with weights ms (speed-up, layers)."""
  parts = [gain_line(rows)]
  for cluster in dict.fromkeys(r["cluster"] for r in rows):
    sub = [r for r in rows if r["cluster"] == cluster and r["sharding"] == WEIGHTS]
    base = {_key(r): r for r in rows if r["cluster"] == cluster and r["sharding"] == SAMPLES}
    gs = sorted({r["num_devices"] for r in sub})

    def cell(r, base=base):
      b = base.get(_key(r))
      if b is None or number(r["iteration_ms"]) is None:
        return "-"
      return (f"{b['iteration_ms']:.2f} -> {r['iteration_ms']:.2f} "
              f"({judged(r, 'speedup_vs_samples')}, {r['weight_sharded_layers']} sharded)")

    parts.append(f"### {cluster}, B=32: iteration ms, samples only -> samples + weights "
                 "(speed-up with its verdict, weight-sharded layers; predicted)\n\n" + pivot(
                     sub, row_key="model", row_header="model",
                     cols=[(f"G={g}", lambda r, g=g: r["num_devices"] == g) for g in gs],
                     value=cell))
  return "\n".join(parts)


STUDY = Study(name="weight_sharding", app="plan", doc=__doc__,
              columns=(*PLAN_IDENTITY, "sharding", *RESULTS, "samples_per_s",
                       "speedup_vs_samples", "comparison_tolerance",
                       *verdict_columns(("speedup_vs_samples",))),
              timing=("planner_seconds",), derive=derive, figures=figures, headline=headline,
              finish=finish,
              kind="predicted", fits=("iteration_ms",))

if __name__ == "__main__":
  sys.exit(main(STUDY))
