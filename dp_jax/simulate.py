"""python -m dp_jax.simulate: a plan's iteration per device, background fill, cluster throughput.

    python -m dp_jax.simulate plan=plan.json
    python -m dp_jax.simulate model=vgg16 cluster=a100_nvlink_8 cluster.num_devices=8 \
        batch_size=32 profile=deeppool_a100 planner.amplification_limit=2 background=same_family
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from dp_jax.config.hydra_app import hydra_app
from dp_jax.config.schema import (
  BackgroundConfig,
  ClusterConfig,
  InterferenceConfig,
  LoggerConfig,
  ModelConfig,
  PlannerConfig,
  ProfileConfig,
)
from dp_jax.report.compare import ComparisonConfig
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
  from rich.console import Console
  from rich.table import Table

  rows = [[k, round(v, 4) if isinstance(v, float) else v] for k, v in metrics.items()
          if k != "fair_comparison"]
  table = Table(title=f"simulation of {metrics['model']} on {metrics['num_devices']} devices "
                      "(simulated)")
  table.add_column("metric")
  table.add_column("value", justify="right")
  for k, v in rows:
    table.add_row(k, str(v))
  console = Console(width=100)
  console.print(table)
  console.print(metrics["fair_comparison"])
  return rows


def simulate_task(cfg: SimulateConfig, run: Run) -> dict[str, Any]:
  """Plan (or load) a plan, simulate it, write plan/metrics/timeline JSON and the Gantt PNG."""
  from hydra.core.hydra_config import HydraConfig

  from dp_jax.config import workflow
  from dp_jax.planner import Plan
  from dp_jax.report.compare import tolerance_of
  from dp_jax.sim.report import interference, simulate_and_write

  interference(cfg)  # bad cap or policy: fail before any planning
  out_dir = Path(HydraConfig.get().runtime.output_dir)
  cluster = workflow.cluster_spec(cfg.cluster)
  tolerance_of(cfg, cluster.device)
  loaded = Plan.load(cfg.plan) if cfg.plan else None
  batch = loaded.global_batch if loaded else cfg.batch_size
  graph = workflow.load_graph(cfg)
  model_cfg = None if cfg.get("graph") else cfg.model
  if loaded is not None:
    workflow.check_made_for(loaded, workflow.model_record(graph, model_cfg), f"plan {cfg.plan}")
  profile = workflow.load_profile_for(cfg, graph, cluster, batch, cfg.background.batch_per_device)
  t0 = time.perf_counter()
  plan = loaded or workflow.make_plan_from_config(
      cfg.planner, graph, profile, cluster,
      num_devices=workflow.job_devices(cfg.cluster, cluster), global_batch=batch,
      model_cfg=model_cfg, cluster_cfg=cfg.cluster)
  planning_s = time.perf_counter() - t0
  run.begin()
  plan.save(out_dir / "plan.json")
  result = simulate_and_write(cfg, graph, profile, cluster, plan, out_dir)
  m = {**result["metrics"], "planning_s": planning_s}
  rows = print_metrics(m)
  run.log_table("simulation", ["metric", "value"], [[k, str(v)] for k, v in rows])
  run.log_image("gantt", result["gantt"])
  print(f"outputs: {out_dir}")
  return {k: v for k, v in m.items() if isinstance(v, (int, float, str)) or v is None}


main = hydra_app("simulate", SimulateConfig)(simulate_task)


if __name__ == "__main__":
  main()
