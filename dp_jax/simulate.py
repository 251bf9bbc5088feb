"""python -m dp_jax.simulate: a plan's iteration per device, background fill, cluster throughput.

    python -m dp_jax.simulate plan=plan.json
    python -m dp_jax.simulate model=vgg16 cluster=a100_nvlink_8 cluster.num_devices=8 \
        batch_size=32 profile=deeppool_a100 planner.amplification_limit=2 background=same_family
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.cli.schema import (
  BackgroundConfig,
  ClusterConfig,
  InterferenceConfig,
  LoggerConfig,
  ModelConfig,
  PlannerConfig,
  ProfileConfig,
)
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterSpec, job_from_config, to_record
from dp_jax.layer_times.sources import ProfileOptions
from dp_jax.measurement import profiles
from dp_jax.models.zoo import ModelSpec
from dp_jax.multiplex.background import BackgroundSpec
from dp_jax.planner import Plan, PlanOptions, plan_for
from dp_jax.planner.contract import check_made_for, model_record
from dp_jax.report.compare import ComparisonConfig, tolerance_from_config
from dp_jax.report.tables import table
from dp_jax.simulator.outputs import SimulationOptions, simulate_and_write
from dp_jax.tracking.run import Run


@dataclass
class SimulateConfig:
  """python -m dp_jax.simulate: plan (or load a plan), simulate it alone and with background."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)
  interference: InterferenceConfig = field(default_factory=InterferenceConfig)
  comparison: ComparisonConfig = field(default_factory=ComparisonConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  plan: str | None = None  # a plan JSON to simulate instead of planning
  graph: str | None = None  # a graph JSON to use instead of tracing the zoo model
  batch_size: int = 32
  iterations: int = 4
  seed: int = 0


def print_metrics(metrics: dict[str, Any]) -> list[list[Any]]:
  """The metrics as a table of full names and rounded values, the data-parallel frontier as a
  small table of its own, then the verdicts in words; the rows of the first table."""
  from rich.console import Console  # rich: only to print (its import is not free)

  skip = ("fair_comparison", "data_parallel_frontier")
  rows = [[k, _rounded(v)] for k, v in metrics.items() if k not in skip]
  console = Console(width=110)
  console.print(table(f"simulation of {metrics['model']} on {metrics['num_devices']} devices "
                      "(simulated)", ["metric", "value"], rows))
  frontier = metrics.get("data_parallel_frontier")
  if frontier:
    console.print(table(
        "data parallelism on d devices, the background job alone on the other G - d "
        "(simulated)", ["d", "iteration ms", "cluster samples/s"],
        [(p["devices"], f"{p['iteration_ms']:.2f}", f"{p['cluster_samples_per_s']:.0f}")
         for p in frontier]))
  console.print(metrics["fair_comparison"], markup=False)
  return rows


def _rounded(v: Any) -> Any:
  """4 significant digits for a float (rounding a small float to places loses it)."""
  return float(f"{v:.4g}") if isinstance(v, float) else v


@dataclass(frozen=True)
class SimulateInputs:
  """The simulate app's config, typed and checked (decode)."""

  plan: Plan | None  # a plan file to simulate, or None: plan now
  cluster: ClusterSpec
  num_devices: int
  model: ModelSpec | None  # None: a graph file
  graph_file: str | None
  options: PlanOptions
  profile: ProfileOptions
  background: BackgroundSpec
  simulation: SimulationOptions
  tolerance: float
  seed: int


def decode(cfg: SimulateConfig) -> SimulateInputs:
  """The config's groups as typed options, every value checked, before any work."""
  loaded = Plan.load(cfg.plan) if cfg.plan else None
  cluster, g = job_from_config(cfg.cluster)
  batch = loaded.global_batch if loaded else cfg.batch_size
  return SimulateInputs(
      plan=loaded, cluster=cluster, num_devices=g,
      model=None if cfg.graph else ModelSpec.from_config(cfg.model), graph_file=cfg.graph,
      options=PlanOptions.from_config(cfg.planner, loaded.num_devices if loaded else g, batch),
      profile=ProfileOptions.from_config(cfg.profile),
      background=BackgroundSpec.from_config(cfg.background),
      simulation=SimulationOptions.from_config(cfg.interference, cfg.iterations),
      tolerance=tolerance_from_config(cfg.comparison, cluster.device), seed=cfg.seed)


def simulate_task(cfg: SimulateConfig, run: Run) -> dict[str, Any]:
  """Plan (or load) a plan, simulate it, write plan/metrics/timeline JSON and the Gantt PNG."""
  inputs = decode(cfg)
  cluster, model, background = inputs.cluster, inputs.model, inputs.background
  profile_options, batch = inputs.profile, inputs.options.global_batch
  out_dir = run.output_dir
  graph = LayerGraph.load(inputs.graph_file) if inputs.graph_file else model.graph(inputs.seed)
  record = model_record(graph, model and model.options)
  if inputs.plan is not None:
    check_made_for(inputs.plan, record, f"plan {cfg.plan}")
  profile = profiles.for_cluster(profile_options, graph, cluster.device, batch,
                                 background.batch_per_device, model=model)
  job_graph = job_profile = None
  if background.active and background.model is not None:  # another model than the foreground's
    job_graph = background.model.graph(inputs.seed)
    job_profile = profile_options.check_device(profiles.load(
        profile_options, job_graph, cluster.device, [background.batch_per_device],
        background.model), cluster.device)
  t0 = time.perf_counter()
  plan = inputs.plan or plan_for(graph, profile, cluster, inputs.options, model=record,
                                 cluster_record=to_record(cluster, inputs.num_devices))
  planning_s = time.perf_counter() - t0
  run.begin()
  plan.save(out_dir / "plan.json")
  result = simulate_and_write(graph, profile, cluster, plan, out_dir, background=background,
                              options=inputs.simulation, tolerance=inputs.tolerance,
                              job_graph=job_graph, job_profile=job_profile)
  m = {**result["metrics"], "planning_s": planning_s}
  rows = print_metrics(m)
  run.log_table("simulation", ["metric", "value"], [[k, str(v)] for k, v in rows])
  run.log_image("gantt", result["gantt"])
  print(f"outputs: {out_dir}")
  return {k: v for k, v in m.items() if isinstance(v, (int, float, str)) or v is None}


main = hydra_app("simulate", SimulateConfig)(simulate_task)


if __name__ == "__main__":
  run_app_module("dp_jax.simulate")
