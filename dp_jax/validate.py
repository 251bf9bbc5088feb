"""python -m dp_jax.validate model=vgg16 model.image_size=32: predicted vs measured step times.

For one model on the local devices (one per core; the local measurement,
dp_jax.measurement.local, shared with the main job): calibrate the local cluster (transfers,
all-reduce, dispatch, update; dp_jax.measurement.local_links), measure every layer in context and
what a stage boundary costs (dp_jax.measurement.in_context, dp_jax.measurement.boundary; or each
layer alone under its stage's load, dp_jax.measurement.loaded), take a set of plans - data
parallelism, the planner's burst plans at each validate.amplification_limits (with their
weight shardings under planner.sharding=[samples,weights]) and validate.plans random valid
plans (seeded; samples split only) - predict each one's step time with the planner's own
evaluation on the calibrated cluster and the profile (dp_jax.planner.evaluate, its stage
terms from dp_jax.planner.stage_terms), run each with the runtime (dp_jax.measurement.plan_timing:
interleaved between plans, each timed step right after a step of the same plan, as in
training; the profile times its programs the same way), and write validation.csv,
metrics.json, calibration.json and scatter.png into the run folder (and W&B). Details:
docs/validation.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked, option
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.measurement import local
from dp_jax.measurement.local import LocalConfig
from dp_jax.models.zoo import ModelConfig
from dp_jax.planner import PlanOptions, candidate_counts, plan_with
from dp_jax.planner.contract import Plan, check_plan
from dp_jax.planner.options import PlannerConfig
from dp_jax.planner.random_plans import random_assignments
from dp_jax.report import agreement
from dp_jax.tracking.run import LoggerConfig, Run

COLUMNS = ("plan", "kind", "predicted_ms", "measured_ms", "error_pct", "stages", "devices_used",
           "device_counts", "compute_ms", "sync_ms", "move_ms", "overhead_ms", "boundary_ms",
           "update_ms", "measured_min_ms", "measured_max_ms")


@dataclass(frozen=True)
class PlanSet(Checked):
  """The validate group: which plans are compared (the local group says how each is
  measured): `plans` random valid plans from the planner's space, the burst plans at each of
  `amplification_limits`, `group` plans held and interleaved at once, and a random plan's most
  runs of layers (`max_segments`)."""

  GROUP = "validate"

  plans: int = option(10, low=0, integer=True)
  amplification_limits: tuple[float, ...] = option(
      default_factory=lambda: (1.5, 2.0, math.inf), low=1, inf=True, each=True)
  group: int = option(14, low=1, integer=True)
  max_segments: int = option(6, low=1, integer=True)


@dataclass(frozen=True)
class ValidateConfig(Checked):
  """python -m dp_jax.validate: every prediction compared with a measured run (cluster: the
  base spec; its links are replaced by measured ones)."""

  model: ModelConfig = REQUIRED
  cluster: ClusterConfig = REQUIRED
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  local: LocalConfig = field(default_factory=LocalConfig)
  validate: PlanSet = field(default_factory=PlanSet)
  batch_size: int = option(32, low=1, integer=True)
  seed: int = 0


def plan_set(graph: LayerGraph, profile, cluster: ClusterConfig, options: PlanOptions,
             plans: PlanSet, seed: int = 0) -> list[tuple[str, str, Plan]]:
  """(name, kind, checked plan): data parallelism, burst at each limit (with its weight
  shardings, if planner.sharding allows them), random plans (samples split); distinct."""
  g, b = options.num_devices, options.global_batch

  def checked(plan: Plan) -> Plan:
    return check_plan(plan, graph, available_devices=g, global_batch=b)

  def same(p: Plan, q: Plan) -> bool:
    return [(lp.devices, lp.sharding) for lp in p.layers] == [
        (lp.devices, lp.sharding) for lp in q.layers]

  out = [("data_parallel", "data_parallel", checked(plan_with(
      graph, profile, cluster, replace(options, name="data_parallel"))))]
  for a in plans.amplification_limits:
    plan = checked(plan_with(graph, profile, cluster, replace(
        options, name="burst", mode="fastest", amplification_limit=a)))
    if not any(same(plan, x) for _, _, x in out):
      out.append((f"burst_A{a:g}", "burst", plan))
  rand = random_assignments(graph, candidate_counts(options), g, plans.plans, seed,
                            exclude=[x.assignment() for _, _, x in out
                                     if all(lp.split == "samples" for lp in x.layers)],
                            max_segments=plans.max_segments)
  randoms = local.layout_plans(graph, rand, global_batch=b, num_devices=g)
  return out + [(f"random_{i}", "random", p) for i, p in enumerate(randoms)]


def scatter_plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
  """Predicted vs measured step time per plan, with y = x and a +-20% band."""
  # matplotlib: only to draw
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # matplotlib: after choosing its backend

  fig, ax = plt.subplots(figsize=(5.5, 5))
  for kind, marker in (("data_parallel", "s"), ("burst", "D"), ("random", "o")):
    pts = [(r["measured_ms"], r["predicted_ms"]) for r in rows if r["kind"] == kind]
    if pts:
      ax.scatter(*zip(*pts, strict=True), marker=marker, label=kind, alpha=0.8)
  values = [v for r in rows for v in (r["measured_ms"], r["predicted_ms"])]
  lo, hi = min(values) * 0.8, max(values) * 1.25
  ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="predicted = measured")
  ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="grey",
                  alpha=0.15, label="+-20%")
  ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms / step",
         ylabel="predicted ms / step", title=title)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def validate_task(cfg: ValidateConfig, run: Run) -> dict[str, Any]:
  """Calibrate, profile, plan, predict, run and compare; see the module docstring."""
  lo, model, b = cfg.local, cfg.model, cfg.batch_size
  # G: the local devices', set once they are known (local.prepare)
  local.start_host_devices(lo.host_devices())  # before JAX starts
  setup = local.prepare(lo, model, cfg.cluster, PlanOptions.of(cfg.planner, 1, b), seed=cfg.seed)
  graph, profile, cluster, g = setup.graph, setup.profile, setup.cluster, setup.num_devices
  out_dir = run.output_dir
  run.begin()
  profile.save(out_dir / "profile.json")
  plans = plan_set(graph, profile, cluster, setup.options, cfg.validate, cfg.seed)
  rows = []
  for name, kind, plan in plans:
    a = plan.assignment()
    rows.append({"plan": name, "kind": kind,
                 **local.predicted_step(graph, profile, cluster, setup.options, plan),
                 "devices_used": len({d for s, c in a.values() for d in range(s, s + c)}),
                 "device_counts": "/".join(str(c) for c in sorted({c for _, c in a.values()},
                                                                  reverse=True)),
                 "weight_sharded_layers": sum(lp.split != "samples" for lp in plan.layers)})
  print(f"{len(plans)} plans on {g} devices; running each for {lo.warmup} steps, then "
        f"{lo.steps} rounds of {lo.runs_per_turn} steps in a row (the last timed)")
  timings = local.time_plans(model, [p for _, _, p in plans], setup.devices, lo,
                             group=cfg.validate.group, seed=cfg.seed, progress=print)
  stat = lo.statistic
  for r, t in zip(rows, timings, strict=True):
    r.update(measured_ms=t.ms(stat), measured_min_ms=min(t.step_ms),
             measured_max_ms=max(t.step_ms), runtime_stages=t.stages)
    r["error_pct"] = (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] * 100
  predicted = [r["predicted_ms"] for r in rows]
  summary = agreement.summary(predicted, [r["measured_ms"] for r in rows])
  other = "min" if stat == "median" else "median"
  other_summary = agreement.summary(predicted, [t.ms(other) for t in timings])
  run.log_table("validation", list(COLUMNS), [[r[c] for c in COLUMNS] for r in rows])
  png = scatter_plot(rows, out_dir / "scatter.png",
                     f"{model.name}, B={b}, {g} {setup.devices[0].platform} devices: "
                     f"median |err| {summary['median_abs_pct_error']:.0f}%, "
                     f"Spearman {summary['spearman'] or float('nan'):.2f}")
  run.log_image("scatter", png)
  cal = setup.calibration
  (out_dir / "calibration.json").write_text(json.dumps(asdict(cal), indent=1))
  metrics = {"model": model.name, "global_batch": b, "num_devices": g, "statistic": stat,
             **summary, f"with_{other}_steps": other_summary,
             "calibration": {k: v for k, v in asdict(cal).items() if k != "points"},
             "plans_detail": rows}
  (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
  run.log({k: v for k, v in summary.items() if v is not None})
  print(f"{summary['plans']} plans: median |error| {summary['median_abs_pct_error']:.1f}%, "
        f"max {summary['max_abs_pct_error']:.1f}%, Spearman {summary['spearman']}; "
        f"outputs: {out_dir}")
  return {"model": model.name, "num_devices": g, "global_batch": b, **summary}


main = hydra_app("validate", ValidateConfig)(validate_task)


if __name__ == "__main__":
  run_app_module("dp_jax.validate")
