"""Time to accuracy: measured steps to a target on real data x predicted time per step.

    scripts/reproduce.sh time_to_accuracy   # sweep + aggregation into results/time_to_accuracy/
    # which runs, in .venv (S: a timestamped sweep folder, M: multirun/time_to_accuracy/S):
    python -m dp_jax.accuracy -m +experiment=time_to_accuracy hydra.sweep.dir=M
    python -m experiments.time_to_accuracy M --out results/time_to_accuracy

Accuracy app (measured, CPU): scikit-learn's 8x8 handwritten digits (1,437 train / 360 test
images, stratified split, seed 0), digits_mlp (digits_cnn is in the zoo but too slow to train
on this CPU for the sweep: docs/studies.md), global batch B = 8 .. 512; per B a grid of 10
learning rates (a factor sqrt(2) apart, centred on sqrt(B) scaling) x 5 seeds of momentum SGD
on i.i.d. minibatches, trained until test accuracy 0.97; the best learning rate per B is the
one with the fewest median steps over the seeds (Shallue et al. 2019). Per model, McCandlish
et al.'s S(B) = S_min (1 + B_noise / B) is fitted to the median steps in log space; the simple
noise scale B_simple = tr(Sigma) / |G|^2 is measured directly from per-example gradients over
the training set where the best runs reached the target. Predicted (planner, calibrated A100
profile, dgx_a100): ms per step of data parallelism and of the fastest burst plan (A = inf) at
each (B, G <= B), G = 1 .. 64; time to accuracy = measured median steps x predicted ms per step,
and the best B for each G. Hypothetical, and labelled so: the same steps x the predicted step of
vgg16 and resnet50 at 224x224 (accuracy.step_time_models). Weight sharding is not a strategy
here yet.

It should show: steps fall about as 1/B while B << B_noise and flatten beyond it; the fitted
B_noise and the measured B_simple agree within a factor of 3 (or the report says why not); that
the digits MLP's steps are so short on an A100 that fixed costs (kernel launches, all-reduce
latency) dominate, so devices do not shorten a step and the best B for every G is the one with
the fewest steps; and, with VGG16's compute-bound step, that burst plans keep B near B_noise as
G grows while data parallelism must raise B past it (more samples) once it leaves the node.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import write_json
from dp_jax.convergence.steps_fit import best_batch, fit_steps, leave_one_out, time_to_accuracy_s
from dp_jax.tracking import run as tracking
from dp_jax.tracking import sweep_rows as aggregate
from experiments import aggregate as report
from experiments import plots
from experiments.aggregate import Row, Study
from experiments.fields import number

IDENTITY = ("model", "global_batch", "target", "cluster", "device")
RESULTS = ("best_lr", "best_lr_at_grid_edge", "steps", "samples", "seeds_reached", "seeds",
           "steps_per_seed", "steps_run", "max_steps", "eval_every", "noise_scale_init",
           "noise_scale_at_target")
FIT = ("fit_s_min", "fit_b_noise", "fit_e_min", "fit_log_rms", "fitted_steps")
STRATEGIES = (("data_parallel", "data_parallel_ms"), ("burst", "burst_ms"))
BY_DEVICES = ("model", "step_time_model", "strategy", "num_devices", "global_batch", "steps",
              "iteration_ms", "seconds_to_target", "best_for_devices")


def derive(row: Row) -> Row:
  """Identity from the config, the accuracy app's summary (per-seed steps as 'a;b;c')."""
  cfg = row["config"]
  cluster = cfg.get("cluster") or {}
  out = {"model": (cfg.get("model") or {}).get("name"), "global_batch": cfg.get("batch_size"),
         "target": (cfg.get("accuracy") or {}).get("target"), "cluster": cluster.get("name"),
         "device": cluster.get("device"), **{k: row.get(k) for k in RESULTS},
         "predicted": row.get("predicted") or [], "what_if": row.get("what_if") or {}}
  if isinstance(out["steps_per_seed"], list):
    out["steps_per_seed"] = ";".join(str(v) for v in out["steps_per_seed"])
  return out


def points(rows: Sequence[Row], model: str) -> tuple[list[int], list[float]]:
  """(B, median steps) of a model's finished cells, by B."""
  sub = sorted((r for r in report.ok(rows) if r["model"] == model and number(r["steps"])),
               key=lambda r: r["global_batch"])
  return [r["global_batch"] for r in sub], [float(r["steps"]) for r in sub]


def fits(rows: Sequence[Row]) -> dict[str, dict]:
  """Per model: McCandlish's fit, its leave-one-B-out range and the measured B_simple."""
  out = {}
  for model in dict.fromkeys(r["model"] for r in report.ok(rows)):
    bs, steps = points(rows, model)
    try:
      fit = fit_steps(bs, steps)
    except UserError:
      continue
    loo = [f.b_noise for f in leave_one_out(bs, steps)]
    measured = sorted(float(r["noise_scale_at_target"]) for r in report.ok(rows)
                      if r["model"] == model and number(r["noise_scale_at_target"]))
    median = measured[len(measured) // 2] if measured else None
    out[model] = {"s_min": fit.s_min, "b_noise": fit.b_noise, "e_min": fit.e_min,
                  "log_rms": fit.log_rms, "points": fit.points, "fit": fit,
                  "b_noise_loo_min": min(loo) if loo else None,
                  "b_noise_loo_max": max(loo) if loo else None,
                  "b_simple_median": median,
                  "b_simple_min": measured[0] if measured else None,
                  "b_simple_max": measured[-1] if measured else None,
                  "b_noise_over_b_simple": fit.b_noise / median if median else None}
  return out


def add_fit(rows: list[Row]) -> list[Row]:
  """Every row gets its model's fit (S_min, B_noise, E_min, residual) and fitted steps."""
  f = fits(rows)
  out = []
  for r in rows:
    m = f.get(r.get("model"))
    b = number(r.get("global_batch"))
    out.append({**r, "fit_s_min": m and m["s_min"], "fit_b_noise": m and m["b_noise"],
                "fit_e_min": m and m["e_min"], "fit_log_rms": m and m["log_rms"],
                "fitted_steps": m["fit"].steps(b) if m and b else None})
  return out


def by_devices(rows: Sequence[Row]) -> list[Row]:
  """Time to the target per (model, step-time model, strategy, G, B): measured steps x
  predicted ms per step (step_time_model = model; else a hypothetical combination)."""
  out = []
  for r in report.ok(rows):
    steps = number(r["steps"])
    sources = {r["model"]: r["predicted"], **(r.get("what_if") or {})}
    for step_model, predicted in sources.items():
      for p in predicted:
        for strategy, key in STRATEGIES:
          ms = number(p.get(key))
          secs = None if steps is None or ms is None else time_to_accuracy_s(steps, ms)
          out.append({"model": r["model"], "step_time_model": step_model, "strategy": strategy,
                      "num_devices": p["num_devices"], "global_batch": r["global_batch"],
                      "steps": steps, "iteration_ms": ms, "seconds_to_target": secs,
                      "best_for_devices": False})
  group_of = lambda q: (q["model"], q["step_time_model"], q["strategy"], q["num_devices"])  # noqa: E731
  for key in dict.fromkeys(group_of(q) for q in out):
    group = [q for q in out if group_of(q) == key]
    best = best_batch({q["global_batch"]: q["seconds_to_target"] if q["seconds_to_target"]
                       is not None else math.inf for q in group})
    for q in group:
      q["best_for_devices"] = best is not None and q["global_batch"] == best[0]
  return sorted(out, key=lambda q: (q["model"], q["step_time_model"] != q["model"],
                                    q["step_time_model"], q["strategy"], q["num_devices"],
                                    q["global_batch"]))


def best_per_devices(rows: Sequence[Row]) -> list[Row]:
  """The best-B rows of by_devices."""
  return [q for q in by_devices(rows) if q["best_for_devices"]]


def steps_figure(rows: list[Row], out: Path) -> Path:
  """Per model: steps and samples to the target vs B, measured and fitted."""
  plt = plots.pyplot()
  f = fits(rows)
  models = list(dict.fromkeys(r["model"] for r in rows))
  fig, axes = plt.subplots(len(models), 2, squeeze=False, figsize=(8.4, 3.4 * len(models) + 0.5),
                           layout="constrained")
  for (ax_s, ax_e), model in zip(axes, models, strict=True):
    bs, steps = points(rows, model)
    m = f.get(model)
    grid = [bs[0] * (bs[-1] / bs[0]) ** (i / 100) for i in range(101)] if bs else []
    for ax, scale, what in ((ax_s, lambda b: 1, "steps"), (ax_e, lambda b: b, "samples")):
      ax.plot(bs, [s * scale(b) for b, s in zip(bs, steps, strict=True)], "o",
              color="tab:blue", label="measured (median over seeds)")
      if m:
        ax.plot(grid, [m["fit"].steps(b) * scale(b) for b in grid], "-", color="tab:orange",
                label=f"fit: S_min={m['s_min']:.0f}, B_noise={m['b_noise']:.0f}")
        ax.axvline(m["b_noise"], color="tab:orange", ls=":", lw=1)
        if m["b_simple_median"]:
          ax.axvline(m["b_simple_median"], color="tab:green", ls="--", lw=1,
                     label=f"measured B_simple={m['b_simple_median']:.0f}")
      plots.log_axes(ax, x=2, y=10)
      ax.set_title(f"{model}: {what} to the target", fontsize=plots.LABEL)
      ax.set_xlabel("global batch B (samples), log scale", fontsize=plots.LABEL)
      ax.set_ylabel(f"{what} to the target (count), log scale", fontsize=plots.LABEL)
      ax.tick_params(labelsize=plots.FONT, which="both")
      ax.grid(alpha=0.3)
    ax_s.legend(fontsize=plots.FONT)
  target = next((r["target"] for r in rows), None)
  fig.suptitle(f"measured: digits, steps to test accuracy {target}, with McCandlish's fit",
               fontsize=plots.TITLE)
  return plots.save(fig, out / "time_to_accuracy_steps.png")


def devices_figure(rows: list[Row], out: Path) -> Path:
  """Per model: seconds to the target vs G per strategy, best B (bold) and each B (thin)."""
  plt = plots.pyplot()
  table = by_devices(rows)
  panels = list(dict.fromkeys((q["model"], q["step_time_model"]) for q in table))
  fig, axes = plt.subplots(1, max(1, len(panels)), squeeze=False, layout="constrained",
                           figsize=(6.4 * max(1, len(panels)), 4.4))
  colors = {"data_parallel": "tab:orange", "burst": "tab:blue"}
  for ax, (model, step_model) in zip(axes[0], panels, strict=False):
    for strategy, color in colors.items():
      sub = [q for q in table if (q["model"], q["step_time_model"]) == (model, step_model) and
             q["strategy"] == strategy and q["seconds_to_target"] is not None]
      for b in sorted({q["global_batch"] for q in sub}):
        pts = sorted((q["num_devices"], q["seconds_to_target"]) for q in sub
                     if q["global_batch"] == b)
        ax.plot(*zip(*pts, strict=True), color=color, lw=0.6, alpha=0.5,
                ls="--" if strategy == "data_parallel" else "-")
      best = sorted((q["num_devices"], q["seconds_to_target"]) for q in sub
                    if q["best_for_devices"])
      if best:
        ax.plot(*zip(*best, strict=True), color=color, lw=2, marker="o", ms=4,
                label=f"{strategy}, best B per G")
    plots.log_axes(ax, x=2, y=10)
    ax.set_title(f"{model} steps x {model} step time" if step_model == model else
                 f"hypothetical: {model} steps x {step_model} step time", fontsize=plots.LABEL)
    ax.set_xlabel("devices G, log scale", fontsize=plots.LABEL)
    ax.set_ylabel("time to the target (s), log scale", fontsize=plots.LABEL)
    ax.tick_params(labelsize=plots.FONT, which="both")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=plots.FONT)
  fig.suptitle("measured steps x predicted ms per step (dgx_a100): time to accuracy; thin "
               "lines: one per B", fontsize=plots.TITLE)
  return plots.save(fig, out / "time_to_accuracy_vs_devices.png")


def figures(rows: list[Row], out: Path) -> list[Path]:
  """Steps vs B with the fit; time to accuracy vs G per strategy."""
  return [steps_figure(rows, out), devices_figure(rows, out)]


def fit_table(rows: Sequence[Row]) -> str:
  """Markdown: per model, the fit, its leave-one-out range and the measured noise scale."""
  lines = ["| model | S_min | B_noise (fit) | leave-one-B-out range | E_min (samples) | "
           "log rms | B_simple at target (median, range) | B_noise / B_simple |",
           "|---|---|---|---|---|---|---|---|"]
  for model, m in fits(rows).items():
    rng = ("-" if m["b_noise_loo_min"] is None else
           f"{m['b_noise_loo_min']:.0f} - {m['b_noise_loo_max']:.0f}")
    simple = ("-" if m["b_simple_median"] is None else
              f"{m['b_simple_median']:.0f} ({m['b_simple_min']:.0f} - {m['b_simple_max']:.0f})")
    ratio = "-" if m["b_noise_over_b_simple"] is None else f"{m['b_noise_over_b_simple']:.2f}"
    lines.append(f"| {model} | {m['s_min']:.1f} | {m['b_noise']:.1f} | {rng} | "
                 f"{m['e_min']:.0f} | {m['log_rms']:.3f} | {simple} | {ratio} |")
  return "\n".join(lines) + "\n"


def headline(rows: list[Row]) -> str:
  """Steps per B, the fit against the measured noise scale, and the best B per G."""
  steps = aggregate.markdown_table(
      rows, ["model", "global_batch", "best_lr", "best_lr_at_grid_edge", "steps", "samples",
             "seeds_reached", "steps_per_seed", "fitted_steps", "noise_scale_at_target"],
      ["model", "B", "best lr", "lr at grid edge", "median steps", "samples", "seeds reached",
       "steps per seed (-1: not reached when training stopped)", "fitted steps",
       "B_simple at target"])
  best = best_per_devices(rows)
  real = [q for q in best if q["step_time_model"] == q["model"]]
  what_if = [q for q in best if q["step_time_model"] != q["model"]]
  text = ("### Steps to the target per B (measured)\n\n" + steps +
          "\n### McCandlish fit vs the measured simple noise scale\n\n" + fit_table(rows) +
          "\n### Time to the target at each G, best B (measured steps x predicted ms/step)\n\n" +
          best_table(real))
  if what_if:
    text += ("\n### Hypothetical: these steps x another model's predicted ms/step, best B per G"
             "\n\n" + best_table(what_if))
  return text


def best_table(best: Sequence[Row]) -> str:
  """Markdown: seconds (ms) to the target at the best B, per (model, step model, strategy) x G."""
  gs = sorted({q["num_devices"] for q in best})
  lines = ["| steps of | step time of | strategy | " + " | ".join(f"G={g}" for g in gs) + " |",
           "|---|---|---|" + "---|" * len(gs)]
  for key in dict.fromkeys((q["model"], q["step_time_model"], q["strategy"]) for q in best):
    cells = []
    for g in gs:
      q = next((q for q in best if (q["model"], q["step_time_model"], q["strategy"],
                                    q["num_devices"]) == (*key, g)), None)
      cells.append("-" if q is None else
                   f"{q['seconds_to_target'] * 1e3:.1f} ms @B={q['global_batch']}")
    lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


STUDY = Study(name="time_to_accuracy", app="accuracy", doc=__doc__,
              columns=(*IDENTITY, *RESULTS, *FIT), timing=(), derive=derive,
              figures=figures, headline=headline, finish=add_fit,
              kind="measured steps (times predicted ms per step where labelled)",
              fits=("best_lr",))


def track_fit(sweep_dir: Path, rows: Sequence[Row]) -> None:
  """One W&B run in the study's group (<sweep>/fit) whose summary is the fit per model."""
  cfg = next((r["config"] for r in rows if r.get("config")), {})
  logger = dict(cfg.get("logger") or {})
  logger["job_type"] = "fit"
  run = tracking.start(OmegaConf.create({"logger": logger, "study": STUDY.name,
                                         "sweep_dir": str(sweep_dir)}),
                       app="time_to_accuracy_fit", output_dir=sweep_dir / "fit")
  summary = {f"{model}/{k}": v for model, m in fits(rows).items() for k, v in m.items()
             if k != "fit"}
  run.summary(summary)
  run.finish()


def main(argv: Sequence[str] | None = None) -> int:
  """CLI: python -m experiments.time_to_accuracy SWEEP_DIR [--out DIR]."""
  ap = argparse.ArgumentParser(prog="python -m experiments.time_to_accuracy",
                               description=STUDY.doc.strip().splitlines()[0])
  ap.add_argument("sweep_dir", help="the Hydra multirun folder (hydra.sweep.dir)")
  ap.add_argument("--out", default="results/local/time_to_accuracy",
                  help="output folder (default: %(default)s)")
  args = ap.parse_args(argv)
  try:
    raw = report.cells(args.sweep_dir)
    rows, prov = report.load(STUDY, args.sweep_dir)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  paths = report.write(STUDY, rows, prov, args.out)
  paths["devices csv"] = aggregate.write_csv(
      by_devices(rows), Path(args.out) / "time_to_accuracy_by_devices.csv", BY_DEVICES)
  fit_path = Path(args.out) / "time_to_accuracy_fit.json"
  write_json(fit_path, {m: {k: v for k, v in f.items() if k != "fit"}
                        for m, f in fits(rows).items()})
  paths["fit"] = fit_path
  track_fit(Path(args.sweep_dir), raw)
  report.print_written(STUDY, rows, prov, args.sweep_dir, paths)
  return 0


if __name__ == "__main__":
  sys.exit(main())
