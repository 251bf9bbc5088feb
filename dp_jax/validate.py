"""python -m dp_jax.validate model=vgg16 model.image_size=32: predicted vs measured step times.

For one model on the local devices (one per core, dp_jax.runtime.local_devices): calibrate the
local cluster (transfers, all-reduce, dispatch, update; dp_jax.profiling.local_links), measure
every layer in context and what a stage boundary costs (dp_jax.profiling.in_context,
dp_jax.profiling.boundary; or each layer alone under its stage's load, dp_jax.profiling.loaded),
take a set of plans - data parallelism, the planner's burst plans at each
validate.amplification_limits and validate.plans random valid plans (seeded) - predict each
one's step time with the planner's own evaluation on the calibrated cluster and the profile
(dp_jax.planner.evaluate, its stage terms from dp_jax.planner.stage_terms), run each with
the runtime (dp_jax.runtime.plan_timing: interleaved between plans, each timed step right
after a step of the same plan, as in training; the profile times its programs the same way),
and write validation.csv,
metrics.json, calibration.json and scatter.png into the run folder (and W&B). Details:
docs/validation.md.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from dp_jax.base.errors import UserError
from dp_jax.config.hydra_app import hydra_app
from dp_jax.config.schema import ClusterConfig, LoggerConfig, ModelConfig, PlannerConfig
from dp_jax.tracking.run import Run

log = logging.getLogger("dp_jax.validate")
COLUMNS = ("plan", "kind", "predicted_ms", "measured_ms", "error_pct", "stages", "devices_used",
           "device_counts", "compute_ms", "sync_ms", "move_ms", "overhead_ms", "boundary_ms",
           "update_ms", "measured_min_ms", "measured_max_ms")


class Statistic(str, Enum):
  median = "median"
  min = "min"


class ProfileMethod(str, Enum):
  in_context = "in_context"  # every prefix's fused stage program (dp_jax.profiling.in_context)
  loaded = "loaded"  # every layer alone under its stage's load (dp_jax.profiling.loaded)


@dataclass
class ValidationConfig:
  """Which plans, how long each runs, and how times are summarised."""

  plans: int = 11  # random valid plans from the planner's space
  amplification_limits: list[float] = field(default_factory=lambda: [1.5, 2.0, math.inf])
  num_devices: int | None = None  # None: one device per core
  steps: int = 5  # timed steps per plan
  warmup: int = 2  # untimed steps per plan (the first compiles)
  group: int = 4  # plans held and interleaved at once
  runs_per_turn: int = 2  # a plan's (and profiled program's) steps in a row, the last timed
  statistic: Statistic = Statistic.min  # of a prefix's rounds and of a plan's timed steps
  max_segments: int = 6  # a random plan cuts the layers into at most this many runs
  profile: ProfileMethod = ProfileMethod.in_context  # how layer times are measured
  profile_repeats: int = 3  # timed rounds per layer (prefix), count and pass
  profile_passes: int = 2  # passes over all layers (prefixes), spreading samples over time
  profile_cuts: int = 4  # stage boundaries measured as two-stage cuts (the rest interpolated)
  refresh_calibration: bool = False
  cache_dir: str = ".cache/dp_jax/profiles"


@dataclass
class ValidateConfig:
  """python -m dp_jax.validate: every prediction compared with a measured run."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING  # the base spec; its links are replaced by measured ones
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  validate: ValidationConfig = field(default_factory=ValidationConfig)
  batch_size: int = 32
  seed: int = 0


def plan_set(graph, profile, cluster, cfg: ValidateConfig, g: int) -> list[tuple[str, str, dict]]:
  """(name, kind, assignment): data parallelism, burst at each limit, random plans; distinct."""
  from dp_jax.config import workflow
  from dp_jax.planner import candidate_counts, data_parallel_plan, make_plan
  from dp_jax.planner.options import PlanOptions
  from dp_jax.planner.random_plans import random_assignments

  b = cfg.batch_size
  common = workflow.plan_options(cfg.planner, g, b)
  if "weights" in common["sharding"]:
    raise UserError("validate times plans as layer -> devices (samples split only); "
                    "planner.sharding=[samples,weights] is not validated here, use [samples]")
  out = [("data_parallel", "data_parallel",
          data_parallel_plan(graph, profile, cluster, **common).assignment())]
  for a in cfg.validate.amplification_limits:
    a = float(a)
    if not a >= 1:
      raise UserError(f"validate.amplification_limits must be >= 1 (or inf), got {a}")
    assignment = make_plan(graph, profile, cluster, amplification_limit=a, **common).assignment()
    if all(assignment != x for _, _, x in out):
      out.append((f"burst_A{a:g}", "burst", assignment))
  counts = candidate_counts(PlanOptions(num_devices=g, global_batch=b,
                                        device_counts=common["device_counts"]))
  rand = random_assignments(graph, counts, g, cfg.validate.plans, cfg.seed,
                            exclude=[x for _, _, x in out],
                            max_segments=cfg.validate.max_segments)
  out += [(f"random_{i}", "random", a) for i, a in enumerate(rand)]
  return out


def scatter_plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
  """Predicted vs measured step time per plan, with y = x and a +-20% band."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

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
  import warnings

  from hydra.core.hydra_config import HydraConfig

  from dp_jax.runtime import local_devices

  # the runtime donates buffers a stage cannot always reuse on CPU; harmless, and noisy
  warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
  vc = cfg.validate
  if vc.steps < 1 or vc.warmup < 0 or vc.plans < 0 or vc.group < 1 or vc.runs_per_turn < 1:
    raise UserError("validate.steps, validate.group and validate.runs_per_turn must be >= 1, "
                    "validate.warmup and validate.plans >= 0")
  # one host device per core (no effect once JAX has started, or on an accelerator)
  local_devices.set_host_device_count(local_devices.honest_device_count(vc.num_devices))
  from dp_jax.config import workflow
  from dp_jax.models import zoo
  from dp_jax.planner import candidate_counts
  from dp_jax.planner.options import PlanOptions
  from dp_jax.planner.plan import layout_plan
  from dp_jax.profiling.in_context import in_context_profile
  from dp_jax.profiling.loaded import loaded_profile
  from dp_jax.profiling.local_links import load_or_calibrate
  from dp_jax.runtime.compile_cache import use_compile_cache
  from dp_jax.runtime.plan_timing import time_plans
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.validation import agreement

  use_compile_cache(vc.cache_dir)  # plans share stages: compile each one once
  devices = local_devices.timing_devices(vc.num_devices)
  g = len(devices)
  if g > cfg.batch_size:
    raise UserError(f"batch_size={cfg.batch_size} is smaller than the {g} devices; raise it")
  out_dir = Path(HydraConfig.get().runtime.output_dir)
  stat = workflow.enum_value(vc.statistic)
  cal, cal_path, fresh = load_or_calibrate(vc.cache_dir, devices, refresh=vc.refresh_calibration)
  print(f"calibration ({'measured now' if fresh else 'cached'}: {cal_path}): all-reduce "
        f"{cal.allreduce_GBps:.2f} GB/s, transfer latency {cal.transfer_latency_us:.0f} us, "
        f"dispatch {cal.dispatch_us:.0f} us, {cal.stage_us:.0f} us per added stage, "
        f"update {cal.update_ns_per_param:.2f} ns/param")
  cluster = cal.cluster(workflow.cluster_spec(cfg.cluster))
  graph = zoo.graph_of(cfg.model, seed=cfg.seed)
  model = zoo.build(cfg.model, seed=cfg.seed)
  counts = candidate_counts(PlanOptions(num_devices=g, global_batch=cfg.batch_size,
                                        device_counts=workflow.enum_value(
                                            cfg.planner.device_counts)))
  if workflow.enum_value(vc.profile) == "in_context":
    profile = in_context_profile(model, graph, cfg.batch_size, counts, cache_dir=vc.cache_dir,
                                 repeats=vc.profile_repeats, passes=vc.profile_passes,
                                 cuts=vc.profile_cuts, statistic=stat, devices=devices,
                                 runs_per_turn=vc.runs_per_turn, progress=print)
  else:
    profile = loaded_profile(model, graph, cfg.batch_size, counts, cache_dir=vc.cache_dir,
                             repeats=vc.profile_repeats, passes=vc.profile_passes,
                             statistic=stat, devices=devices, runs_per_turn=vc.runs_per_turn)
  profile.save(out_dir / "profile.json")
  plans = plan_set(graph, profile, cluster, cfg, g)
  rows = []
  for name, kind, a in plans:
    predicted = workflow.predicted_step(graph, profile, cluster, cfg, a, g)
    rows.append({"plan": name, "kind": kind, **predicted,
                 "devices_used": len({d for s, c in a.values() for d in range(s, s + c)}),
                 "device_counts": "/".join(str(c) for c in sorted({c for _, c in a.values()},
                                                                  reverse=True))})
  print(f"{len(plans)} plans on {g} devices; running each for {vc.warmup} steps, then "
        f"{vc.steps} rounds of {vc.runs_per_turn} steps in a row (the last timed)")
  run_graph = structure_graph(model, cfg.model.name)
  layouts = [layout_plan(run_graph, {n: range(s, s + c) for n, (s, c) in a.items()},
                         global_batch=cfg.batch_size, num_devices=g) for _, _, a in plans]
  timings = time_plans(lambda: zoo.build(cfg.model, seed=cfg.seed), run_graph, layouts, devices,
                       steps=vc.steps, warmup=vc.warmup, group=vc.group,
                       runs_per_turn=vc.runs_per_turn, progress=print)
  for r, t in zip(rows, timings, strict=True):
    r.update(measured_ms=t.ms(stat), measured_min_ms=min(t.step_ms),
             measured_max_ms=max(t.step_ms), runtime_stages=t.stages)
    r["error_pct"] = (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] * 100
  summary = agreement.summary([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows])
  other = "min" if stat == "median" else "median"
  other_summary = agreement.summary(
      [r["predicted_ms"] for r in rows],
      [r["measured_min_ms"] if other == "min" else t.ms("median")
       for r, t in zip(rows, timings, strict=True)])
  run.log_table("validation", list(COLUMNS), [[r[c] for c in COLUMNS] for r in rows])
  png = scatter_plot(rows, out_dir / "scatter.png",
                     f"{cfg.model.name}, B={cfg.batch_size}, {g} {devices[0].platform} devices: "
                     f"median |err| {summary['median_abs_pct_error']:.0f}%, "
                     f"Spearman {summary['spearman'] or float('nan'):.2f}")
  run.log_image("scatter", png)
  (out_dir / "calibration.json").write_text(json.dumps(asdict(cal), indent=1))
  metrics = {"model": cfg.model.name, "global_batch": cfg.batch_size, "num_devices": g,
             "statistic": stat, **summary, f"with_{other}_steps": other_summary,
             "calibration": {k: v for k, v in asdict(cal).items() if k != "points"},
             "plans_detail": rows}
  (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
  run.log({k: v for k, v in summary.items() if v is not None})
  print(f"{summary['plans']} plans: median |error| {summary['median_abs_pct_error']:.1f}%, "
        f"max {summary['max_abs_pct_error']:.1f}%, Spearman {summary['spearman']}; "
        f"outputs: {out_dir}")
  return {"model": cfg.model.name, "num_devices": g, "global_batch": cfg.batch_size,
          **summary}


main = hydra_app("validate", ValidateConfig)(validate_task)


if __name__ == "__main__":
  main()
