"""python -m dp_jax.validate model=vgg16 model.image_size=32: predicted vs measured step times.

For one model on the local devices (one per core; the local measurement,
dp_jax.measurement.local, shared with the main job): calibrate the local cluster (transfers,
all-reduce, dispatch, update; dp_jax.measurement.local_links), measure every layer in context and
what a stage boundary costs (dp_jax.measurement.in_context, dp_jax.measurement.boundary; or each
layer alone under its stage's load, dp_jax.measurement.loaded), take a set of plans - data
parallelism, the planner's burst plans at each validate.amplification_limits and
validate.plans random valid plans (seeded) - predict each one's step time with the planner's
own evaluation on the calibrated cluster and the profile (dp_jax.planner.evaluate, its stage
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

from omegaconf import MISSING

from dp_jax.base.errors import UserError
from dp_jax.base.rules import check
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.cli.schema import ClusterConfig, LoggerConfig, ModelConfig, PlannerConfig
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterSpec, job_from_config
from dp_jax.measurement import local
from dp_jax.measurement.local import LocalConfig, LocalOptions
from dp_jax.models.zoo import ModelSpec
from dp_jax.planner import PlanOptions, candidate_counts, plan_with
from dp_jax.planner.random_plans import random_assignments
from dp_jax.report import agreement
from dp_jax.tracking.run import Run

COLUMNS = ("plan", "kind", "predicted_ms", "measured_ms", "error_pct", "stages", "devices_used",
           "device_counts", "compute_ms", "sync_ms", "move_ms", "overhead_ms", "boundary_ms",
           "update_ms", "measured_min_ms", "measured_max_ms")


@dataclass
class ValidationConfig:
  """Which plans are compared (the local group says how each is measured)."""

  plans: int = 11  # random valid plans from the planner's space
  amplification_limits: list[float] = field(default_factory=lambda: [1.5, 2.0, math.inf])
  group: int = 4  # plans held and interleaved at once
  max_segments: int = 6  # a random plan cuts the layers into at most this many runs


@dataclass
class ValidateConfig:
  """python -m dp_jax.validate: every prediction compared with a measured run."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING  # the base spec; its links are replaced by measured ones
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  local: LocalConfig = field(default_factory=LocalConfig)
  validate: ValidationConfig = field(default_factory=ValidationConfig)
  batch_size: int = 32
  seed: int = 0


@dataclass(frozen=True)
class PlanSet:
  """The validate group, typed and checked: random plans, the burst plans' limits, the plans
  interleaved at once and a random plan's most runs of layers."""

  plans: int = 11
  amplification_limits: tuple[float, ...] = (1.5, 2.0, math.inf)
  group: int = 4
  max_segments: int = 6

  def __post_init__(self):
    for key in ("plans", "amplification_limits", "group", "max_segments"):
      check(f"validate.{key}", getattr(self, key))
    object.__setattr__(self, "amplification_limits",
                       tuple(float(a) for a in self.amplification_limits))


@dataclass(frozen=True)
class ValidateInputs:
  """The validate app's config, typed and checked (decode)."""

  model: ModelSpec
  cluster: ClusterSpec  # the base spec; the calibration replaces its links
  options: PlanOptions  # G: the local devices', set once they are known
  local: LocalOptions
  host_devices: int
  plan_set: PlanSet
  seed: int


def decode(cfg: ValidateConfig) -> ValidateInputs:
  """The config's groups as typed options, every value checked, before any work."""
  options = PlanOptions.from_config(cfg.planner, 1, cfg.batch_size)
  if "weights" in options.sharding:
    raise UserError("validate times plans as layer -> devices (samples split only); "
                    "planner.sharding=[samples,weights] is not validated here, use [samples]")
  vc, lo = cfg.validate, LocalOptions.from_config(cfg.local)
  return ValidateInputs(
      model=ModelSpec.from_config(cfg.model), cluster=job_from_config(cfg.cluster)[0],
      options=options, local=lo, host_devices=lo.host_devices(),
      plan_set=PlanSet(vc.plans, tuple(vc.amplification_limits), vc.group, vc.max_segments),
      seed=cfg.seed)


def plan_set(graph: LayerGraph, profile, cluster: ClusterSpec, options: PlanOptions,
             plans: PlanSet, seed: int = 0) -> list[tuple[str, str, dict]]:
  """(name, kind, assignment): data parallelism, burst at each limit, random plans; distinct."""
  out = [("data_parallel", "data_parallel", plan_with(
      graph, profile, cluster, replace(options, strategy="data_parallel")).assignment())]
  for a in plans.amplification_limits:
    assignment = plan_with(graph, profile, cluster, replace(
        options, strategy="burst", mode="fastest", amplification_limit=a)).assignment()
    if all(assignment != x for _, _, x in out):
      out.append((f"burst_A{a:g}", "burst", assignment))
  rand = random_assignments(graph, candidate_counts(options), options.num_devices, plans.plans,
                            seed, exclude=[x for _, _, x in out],
                            max_segments=plans.max_segments)
  return out + [(f"random_{i}", "random", a) for i, a in enumerate(rand)]


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
  inputs = decode(cfg)
  lo, model, b = inputs.local, inputs.model, inputs.options.global_batch
  local.start_host_devices(inputs.host_devices)  # before JAX starts
  setup = local.prepare(lo, model, inputs.cluster, inputs.options, seed=inputs.seed)
  graph, profile, cluster, g = setup.graph, setup.profile, setup.cluster, setup.num_devices
  out_dir = run.output_dir
  run.begin()
  profile.save(out_dir / "profile.json")
  plans = plan_set(graph, profile, cluster, setup.options, inputs.plan_set, inputs.seed)
  rows = []
  for name, kind, a in plans:
    rows.append({"plan": name, "kind": kind,
                 **local.predicted_step(graph, profile, cluster, setup.options, a),
                 "devices_used": len({d for s, c in a.values() for d in range(s, s + c)}),
                 "device_counts": "/".join(str(c) for c in sorted({c for _, c in a.values()},
                                                                  reverse=True))})
  print(f"{len(plans)} plans on {g} devices; running each for {lo.warmup} steps, then "
        f"{lo.steps} rounds of {lo.runs_per_turn} steps in a row (the last timed)")
  timings = local.time_assignments(model, [a for _, _, a in plans], setup.devices, lo,
                                   global_batch=b, group=inputs.plan_set.group, seed=inputs.seed,
                                   progress=print)
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
