"""Runtime: measured training step times on the local devices, data parallelism vs burst plans.

    scripts/reproduce.sh runtime      # sweep + aggregation into results/runtime/
    # which runs, in .venv (S: a timestamped sweep folder):
    python -m dp_jax.train -m +experiment=runtime hydra.sweep.dir=multirun/runtime/S
    python -m experiments.runtime multirun/runtime/S --out results/runtime

Train app on this machine's JAX backend (here: 8 XLA host devices on a 2-core CPU, cluster
`local_cpu`, burst plans priced with the analytic `cpu` profile): resnet50 at 32x32 and a tiny
GPT-2 (2 layers, d_model 64, 32 tokens, vocabulary 512), B = 32, G = 8, 4, 2, plan
data_parallel and burst (amplification limit 2), 10 steps each; the step time is the median
over the steps after the first (compilation). `speedup_vs_data_parallel` divides the
data-parallel cell's median step by the burst cell's of the same (model, G, B); `predicted_*`
are the planner's numbers for the burst plan on the local_cpu cost model with the analytic
`cpu` profile, which is not calibrated to this machine (at G=2 it put resnet50's step at 324 ms
against 1,273 ms measured, and tiny GPT-2's at 41 ms against 21 ms); the calibrated,
validated predictions are `python -m dp_jax.validate`'s. Devices are listed
largest G first because the first cell of the process fixes the number of XLA host devices
(later cells use a prefix of them).

It should show: that burst plans run (several jitted stages with transfers between them) and
what they cost here. Only where each device has a core of its own (G <= the cores, here G=2)
is a step time a device's, and only there is a burst/data-parallel ratio given: with G=8 or 4
host devices on 2 cores the devices time-share the cores (the table marks those cells "shared
cores"), and a plan on fewer devices than G runs with fewer programs fighting for the cores,
so its ratio to data parallelism would measure oversubscription, not burst parallelism. Even
at G=2 in one process a one-device stage's program also uses the idle core (XLA:CPU's thread
pool; docs/validation.md), which no GPU can do for another: the G=2 burst time is a lower
bound of a one-core-per-device one. `python -m dp_jax.validate` (predicted vs measured, one
device per core) and the main job's pinned processes are the honest local comparisons. With
`background=same_family` appended to the command (the committed results/runtime/ ran
without it) the orchestrator runs one copy of the model at batch 8 on every device the
current stage leaves idle: `foreground_slowdown` compares the foreground's mean step time
with the job against the same run's steps alone, and `background_samples_per_s` is what the
job completed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments import plots
from experiments.aggregate import Row, Study, main
from experiments.fields import judge, judged, number, pick, pivot, ratio, verdict_columns

IDENTITY = ("model", "plan", "background", "num_devices", "global_batch", "steps", "cluster")
RESULTS = ("processes", "cpu_cores", "stages", "final_step", "final_loss", "median_step_ms",
           "samples_per_s",
           "measured_step_ms", "measured_step_ms_with_background", "foreground_slowdown",
           "background_samples_per_s", "background_failures")
PREDICTED = ("predicted_iteration_ms", "predicted_data_parallel_iteration_ms")
GROUP = ("model", "background", "num_devices", "global_batch")


def predicted(job_dir: Path | None) -> Row:
  """The planner's predicted iteration times from the cell's plan.json (None if absent)."""
  path = None if job_dir is None else Path(job_dir) / "plan.json"
  p = json.loads(path.read_text()).get("predicted", {}) if path and path.is_file() else {}
  return {"predicted_iteration_ms": p.get("iteration_ms"),
          "predicted_data_parallel_iteration_ms": p.get("data_parallel_iteration_ms")}


def derive(row: Row) -> Row:
  """Identity from the config, the train summary, the plan's prediction."""
  cfg = row["config"]
  return {"model": (cfg.get("model") or {}).get("name"), "plan": cfg.get("plan"),
          "background": (cfg.get("background") or {}).get("name", "none"),
          "num_devices": (cfg.get("runtime") or {}).get("num_devices"),
          "global_batch": cfg.get("batch_size"), "steps": cfg.get("steps"),
          "cluster": (cfg.get("cluster") or {}).get("name"), **pick(row, RESULTS),
          **predicted(row.get("dir")), "speedup_vs_data_parallel": None}


def shares_cores(row: Row) -> bool:
  """More host devices than cores in one process: the devices time-share the cores, so a
  step time measures oversubscription, not a device's work (unknown cores: not shared)."""
  g, cores, procs = (number(row.get(k)) for k in ("num_devices", "cpu_cores", "processes"))
  return bool(g and cores and (procs or 1) == 1 and g > cores)


def add_speedup(rows: list[Row]) -> list[Row]:
  """speedup_vs_data_parallel: the group's data-parallel median step over this cell's; none
  where the cells' devices share cores (a ratio of oversubscribed steps is no speed-up)."""
  out = [dict(r) for r in rows]
  for r in out:
    dp = next((q for q in out if q["plan"] == "data_parallel" and q["status"] == "ok" and
               all(q[k] == r[k] for k in GROUP)), None)
    r["speedup_vs_data_parallel"] = None if dp is None or shares_cores(r) else ratio(
        dp["median_step_ms"], r["median_step_ms"])
    r.update(judge(r, ("speedup_vs_data_parallel",)))
  return out


def figures(rows: list[Row], out: Path) -> list[Path]:
  """Measured median step time against G, per model, data parallel vs burst."""
  def points(r: Row) -> list[tuple[str, float | None]]:
    """Measured and (burst only) predicted step time."""
    return [(f"{r['plan']} measured", r["median_step_ms"]),
            (f"{r['plan']} predicted", r["predicted_iteration_ms"])]

  cores = sorted({int(c) for c in (number(r.get("cpu_cores")) for r in rows) if c})
  shared = (f"\nG > {cores[0]} cores: the devices share the cores (oversubscribed)"
            if len(cores) == 1 and any(shares_cores(r) for r in rows) else "")
  return [plots.grid(rows, out / "runtime_step_ms.png", panel_row="global_batch",
                     panel_col="model", x="num_devices", points=points, xlabel="devices G",
                     ylabel="step time (ms)", title="measured median step time on the local "
                     f"devices (predicted: the planner's){shared}")]


def ms(x) -> str:
  """A step time as text ('-' when missing)."""
  v = number(x)
  return "-" if v is None else f"{v:.1f}"


def headline(rows: list[Row]) -> str:
  """Per model: median step ms of each plan and G, with the burst speed-up over DP."""
  gs = sorted({r["num_devices"] for r in rows}, reverse=True)
  cols = [(f"{p} G={g}", lambda r, p=p, g=g: (r["plan"], r["num_devices"]) == (p, g))
          for g in gs for p in ("data_parallel", "burst")]
  def value(r: Row) -> str:
    if shares_cores(r):
      return f"{ms(r['median_step_ms'])} (shared cores)"
    return ms(r["median_step_ms"]) + (
        f" ({judged(r, 'speedup_vs_data_parallel')})" if r["plan"] == "burst" else "")

  return ("### Median step ms (measured; burst: speed-up over data parallelism and its verdict "
          "at the validated tolerance, where each device has a core of its own)\n\n" + pivot(
              rows, row_key="model", cols=cols, row_header="model", value=value))


STUDY = Study(name="runtime", app="train", doc=__doc__,
              columns=(*IDENTITY, *RESULTS, *PREDICTED, "speedup_vs_data_parallel",
                       *verdict_columns(("speedup_vs_data_parallel",))),
              timing=(), derive=derive, figures=figures, headline=headline,
              finish=add_speedup,
              kind="measured", fits=("median_step_ms",))

if __name__ == "__main__":
  sys.exit(main(STUDY))
