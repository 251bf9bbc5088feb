"""python -m dp_jax.plan: a burst-parallel plan (and the data-parallel baseline) as JSON.

    python -m dp_jax.plan model=vgg16 cluster=a100_nvlink_8 cluster.num_devices=8 batch_size=32 \
        profile=deeppool_a100 planner.amplification_limit=2 out=plan.json
    python -m dp_jax.plan graph=graph.json profile=profile.json cluster=dgx_a100 \
        cluster.num_devices=64 batch_size=64
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from dp_jax.config.hydra_app import hydra_app
from dp_jax.config.schema import (
  ClusterConfig,
  LoggerConfig,
  ModelConfig,
  PlannerConfig,
  ProfileConfig,
)
from dp_jax.report.compare import ComparisonConfig
from dp_jax.report.plan_report import (
  COLUMNS,
  comparisons,
  fair_comparison,
  layer_rows,
  plot_devices_per_layer,
  print_plan,
)
from dp_jax.tracking.run import Run


@dataclass
class PlanConfig:
  """python -m dp_jax.plan: plan a model (or a graph + profile file) on a cluster."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  comparison: ComparisonConfig = field(default_factory=ComparisonConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  batch_size: int = 32
  graph: str | None = None  # a graph JSON to plan instead of the zoo model
  out: str | None = None  # plan JSON path; default <output dir>/plan.json
  chart: bool = True  # also draw devices_per_layer.png (imports matplotlib)
  seed: int = 0


def plan_task(cfg: PlanConfig, run: Run) -> dict[str, Any]:
  """Plan, print the per-layer table, write plan JSON and the devices-per-layer chart."""
  from hydra.core.hydra_config import HydraConfig

  from dp_jax.config import workflow
  from dp_jax.report.compare import tolerance_of

  out_dir = Path(HydraConfig.get().runtime.output_dir)
  cluster = workflow.cluster_spec(cfg.cluster)
  tolerance = tolerance_of(cfg, cluster.device)
  num_devices = workflow.job_devices(cfg.cluster, cluster)
  graph = workflow.load_graph(cfg)
  profile = workflow.load_profile_for(cfg, graph, cluster, cfg.batch_size)
  plan = workflow.make_plan_from_config(
      cfg.planner, graph, profile, cluster, num_devices=num_devices, global_batch=cfg.batch_size,
      model_cfg=None if cfg.graph else cfg.model, cluster_cfg=cfg.cluster)
  out = Path(cfg.out) if cfg.out else out_dir / "plan.json"
  run.begin()
  plan.save(out)
  rows = layer_rows(plan)
  fair = comparisons(graph, profile, cluster, plan, tolerance)
  print_plan(plan, rows, fair)
  run.log_table("plan_layers", COLUMNS, rows)
  print(f"plan: {out}")
  if cfg.chart:
    chart = plot_devices_per_layer(plan, out_dir / "devices_per_layer.png", fair)
    run.log_image("devices_per_layer", chart)
    print(f"chart: {chart}")
  p = plan.predicted
  return {"model": plan.model, "num_devices": plan.num_devices, "global_batch": plan.global_batch,
          "cluster": plan.cluster, "amplification_limit": plan.amplification_limit,
          "iteration_ms": p["iteration_ms"], "gpu_ms": p["gpu_ms"],
          "data_parallel_iteration_ms": p["data_parallel_iteration_ms"],
          "data_parallel_gpu_ms": p["data_parallel_gpu_ms"],
          **fair, "fair_comparison": fair_comparison(plan, fair),
          "gpu_time_saving": 1 - p["gpu_ms"] / p["data_parallel_gpu_ms"],
          "weight_sharded_layers": sum(lp.sharding.split != "samples" for lp in plan.layers),
          "memory_peak_gb": p.get("memory_peak_gb"),
          "lower_bound_ms": plan.extra.get("optimality", {}).get("lower_bound_ms"),
          "optimality_gap": plan.extra.get("optimality", {}).get("gap"),
          "planner_seconds": plan.planner_seconds, "plan": str(out)}


main = hydra_app("plan", PlanConfig)(plan_task)


if __name__ == "__main__":
  main()
