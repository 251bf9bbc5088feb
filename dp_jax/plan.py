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

from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.cli.schema import (
  ClusterConfig,
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
from dp_jax.planner import PlanOptions, plan_for
from dp_jax.planner.contract import model_record
from dp_jax.report.compare import ComparisonConfig, tolerance_from_config
from dp_jax.report.plan_report import (
  COLUMNS,
  comparisons,
  layer_rows,
  plan_summary,
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


@dataclass(frozen=True)
class PlanInputs:
  """The plan app's config, typed and checked (decode)."""

  cluster: ClusterSpec
  num_devices: int
  model: ModelSpec | None  # None: a graph file
  graph_file: str | None
  options: PlanOptions
  profile: ProfileOptions
  tolerance: float
  out: Path | None
  chart: bool
  seed: int


def decode(cfg: PlanConfig) -> PlanInputs:
  """The config's groups as typed options, every value checked, before any work."""
  cluster, g = job_from_config(cfg.cluster)
  return PlanInputs(cluster=cluster, num_devices=g,
                    model=None if cfg.graph else ModelSpec.from_config(cfg.model),
                    graph_file=cfg.graph,
                    options=PlanOptions.from_config(cfg.planner, g, cfg.batch_size),
                    profile=ProfileOptions.from_config(cfg.profile),
                    tolerance=tolerance_from_config(cfg.comparison, cluster.device),
                    out=Path(cfg.out) if cfg.out else None, chart=cfg.chart, seed=cfg.seed)


def plan_task(cfg: PlanConfig, run: Run) -> dict[str, Any]:
  """Plan, print the per-layer table, write plan JSON and the devices-per-layer chart."""
  inputs = decode(cfg)
  cluster, model, b = inputs.cluster, inputs.model, inputs.options.global_batch
  out_dir = run.output_dir
  out = inputs.out or out_dir / "plan.json"
  graph = LayerGraph.load(inputs.graph_file) if inputs.graph_file else model.graph(inputs.seed)
  profile = profiles.for_cluster(inputs.profile, graph, cluster.device, b, model=model)
  plan = plan_for(graph, profile, cluster, inputs.options,
                  model=model_record(graph, model and model.options),
                  cluster_record=to_record(cluster, inputs.num_devices))
  run.begin()
  plan.save(out)
  rows = layer_rows(plan)
  fair = comparisons(graph, profile, cluster, plan, inputs.tolerance)
  print_plan(plan, rows, fair)
  run.log_table("plan_layers", COLUMNS, rows)
  print(f"plan: {out}")
  if inputs.chart:
    chart = plot_devices_per_layer(plan, out_dir / "devices_per_layer.png", fair)
    run.log_image("devices_per_layer", chart)
    print(f"chart: {chart}")
  return plan_summary(plan, fair, out)


main = hydra_app("plan", PlanConfig)(plan_task)


if __name__ == "__main__":
  run_app_module("dp_jax.plan")
