"""python -m dp_jax.simulate: a plan's iteration per device, background fill, cluster throughput.

    python -m dp_jax.simulate plan=plan.json
    python -m dp_jax.simulate model=vgg16 cluster=a100_nvlink_8 cluster.num_devices=8 \
        batch_size=32 profile=deeppool_a100 planner.amplification_limit=2 background=same_family
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked, option
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig, to_record
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.measurement import profiles
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.planner import Plan, PlanOptions, plan_for
from dp_jax.planner.contract import check_made_for, model_record
from dp_jax.planner.options import PlannerConfig
from dp_jax.report.compare import ComparisonConfig
from dp_jax.report.tables import table
from dp_jax.simulator.outputs import InterferenceConfig, simulate_with, write
from dp_jax.tracking.run import LoggerConfig, Run


@dataclass(frozen=True)
class SimulateConfig(Checked):
  """python -m dp_jax.simulate: plan (or load a plan), simulate it alone and with background.

  plan: a plan JSON to simulate instead of planning (its G and batch are the job's); graph: a
  graph JSON to use instead of tracing the model; iterations: simulated after a warm-up one.
  """

  model: ModelConfig = REQUIRED
  cluster: ClusterConfig = REQUIRED
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)
  interference: InterferenceConfig = field(default_factory=InterferenceConfig)
  comparison: ComparisonConfig = field(default_factory=ComparisonConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  plan: str | None = None
  graph: str | None = None
  batch_size: int = option(32, low=1, integer=True)
  iterations: int = option(4, low=1, integer=True)
  seed: int = 0


def print_metrics(metrics: dict[str, Any]) -> list[list[Any]]:
  """The metrics as a table of full names and rounded values, the data-parallel and uniform
  frontiers as small tables of their own, then the verdicts in words; the rows of the first
  table."""
  from rich.console import Console  # rich: only to print (its import is not free)

  skip = ("fair_comparison", "data_parallel_frontier", "uniform_frontier")
  rows = [[k, _rounded(v)] for k, v in metrics.items() if k not in skip]
  console = Console(width=110)
  console.print(table(f"simulation of {metrics['model']} on {metrics['num_devices']} devices "
                      "(simulated)", ["metric", "value"], rows))
  for key, what in (("data_parallel_frontier", "data parallelism"),
                    ("uniform_frontier", "the best uniform strategy")):
    frontier = metrics.get(key)
    if frontier:
      console.print(table(
          f"{what} on d devices, the background job alone on the other G - d (simulated)",
          ["d", "iteration ms", "cluster samples/s"],
          [(p["devices"], f"{p['iteration_ms']:.2f}", f"{p['cluster_samples_per_s']:.0f}")
           for p in frontier]))
  console.print(metrics["fair_comparison"], markup=False)
  return rows


def _rounded(v: Any) -> Any:
  """4 significant digits for a float (rounding a small float to places loses it)."""
  return float(f"{v:.4g}") if isinstance(v, float) else v


@dataclass(frozen=True)
class Simulated:
  """What the simulate app computes: the plan (loaded or made now, and how long planning
  took), the simulation and its metrics."""

  plan: Plan
  planning_s: float
  simulation: Any
  metrics: dict[str, Any]


def simulated(cfg: SimulateConfig) -> Simulated:
  """The plan `cfg` names or describes, simulated alone and with its background (no files)."""
  loaded = Plan.load(cfg.plan) if cfg.plan else None
  cluster, background, profile_options = cfg.cluster, cfg.background, cfg.profile
  g = cluster.job_devices
  batch = loaded.global_batch if loaded else cfg.batch_size
  options = PlanOptions.of(cfg.planner, loaded.num_devices if loaded else g, batch)
  model = None if cfg.graph else cfg.model
  graph = LayerGraph.load(cfg.graph) if cfg.graph else model.graph(cfg.seed)
  record = model_record(graph, model and model.options)
  if loaded is not None:
    check_made_for(loaded, record, f"plan {cfg.plan}", to_record(cluster, loaded.num_devices))
  profile = profiles.for_cluster(profile_options, graph, cluster.device, batch,
                                 background.batch_per_device, model=model)
  job_graph = job_profile = None
  if background.active and background.model is not None:  # another model than the foreground's
    job_graph = background.model.graph(cfg.seed)
    job_profile = profile_options.check_device(profiles.load(
        profile_options, job_graph, cluster.device, [background.batch_per_device],
        background.model), cluster.device)
  t0 = time.perf_counter()
  plan = loaded or plan_for(graph, profile, cluster, options, model=record,
                            cluster_record=to_record(cluster, g))
  planning_s = time.perf_counter() - t0
  sim, m = simulate_with(graph, profile, cluster, plan, background=background,
                         interference=cfg.interference, iterations=cfg.iterations,
                         tolerance=cfg.comparison.for_device(
                             cluster.device, plan.global_batch / plan.num_devices),
                         job_graph=job_graph, job_profile=job_profile)
  return Simulated(plan, planning_s, sim, {**m, "planning_s": planning_s})


def simulate_task(cfg: SimulateConfig, run: Run) -> dict[str, Any]:
  """Plan (or load) a plan, simulate it, write plan/metrics/timeline JSON and the Gantt PNG."""
  out_dir = run.output_dir
  result = simulated(cfg)
  run.begin()
  result.plan.save(out_dir / "plan.json")
  m = result.metrics
  gantt = write(result.simulation, m, out_dir)
  rows = print_metrics(m)
  run.log_table("simulation", ["metric", "value"], [[k, str(v)] for k, v in rows])
  run.log_image("gantt", gantt)
  print(f"outputs: {out_dir}")
  return {k: v for k, v in m.items() if isinstance(v, (int, float, str)) or v is None}


main = hydra_app("simulate", SimulateConfig)(simulate_task)


if __name__ == "__main__":
  run_app_module("dp_jax.simulate")
