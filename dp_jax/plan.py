"""python -m dp_jax.plan: a burst-parallel plan (and the data-parallel baseline) as JSON.

    python -m dp_jax.plan model=vgg16 cluster=a100_nvlink_8 cluster.num_devices=8 batch_size=32 \
        profile=deeppool_a100 planner.amplification_limit=2 out=plan.json
    python -m dp_jax.plan graph=graph.json profile=profile.json cluster=dgx_a100 \
        cluster.num_devices=64 batch_size=64
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked, ConfigError, option
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig, to_record
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.measurement import profiles
from dp_jax.models.zoo import ModelConfig
from dp_jax.planner import Plan, PlanOptions, plan_for
from dp_jax.planner.contract import model_record
from dp_jax.planner.options import PlannerConfig
from dp_jax.report.compare import ComparisonConfig
from dp_jax.report.plan_report import (
  COLUMNS,
  comparisons,
  layer_rows,
  plan_summary,
  plot_devices_per_layer,
  print_plan,
)
from dp_jax.tracking.run import LoggerConfig, Run


@dataclass(frozen=True)
class PlanConfig(Checked):
  """python -m dp_jax.plan: plan a model (or a graph file) on a cluster.

  graph: a graph JSON to plan instead of the model; out: the plan JSON (default
  <output dir>/plan.json); chart: also draw devices_per_layer.png; chart_pdf: and
  devices_per_layer.pdf beside it (vector, for a paper; matplotlib's PDF backend adds about a
  fifth of the app's start-up, so it is off unless asked).
  """

  model: ModelConfig = REQUIRED
  cluster: ClusterConfig = REQUIRED
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  comparison: ComparisonConfig = field(default_factory=ComparisonConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  batch_size: int = option(32, low=1, integer=True)
  graph: str | None = None
  out: str | None = None
  chart: bool = True
  chart_pdf: bool = False
  seed: int = 0

  def check(self) -> None:
    if self.chart_pdf and not self.chart:
      raise ConfigError("chart_pdf", "=true needs chart=true (the PDF is the chart's, written "
                        "beside devices_per_layer.png)")


@dataclass(frozen=True)
class Planned:
  """What the plan app computes: the model's graph, the profile that priced it, the plan (with
  the best uniform strategy in extra["uniform"] where it was searched) and its fair comparison
  (report.plan_report.comparisons)."""

  graph: LayerGraph
  profile: ProfileTable
  plan: Plan
  fair: dict[str, Any]


def make(cfg: PlanConfig) -> Planned:
  """The plan `cfg` describes, with its fair comparison (no files written)."""
  cluster, g, b = cfg.cluster, cfg.cluster.job_devices, cfg.batch_size
  model = None if cfg.graph else cfg.model
  graph = LayerGraph.load(cfg.graph) if cfg.graph else model.graph(cfg.seed)
  profile = profiles.for_cluster(cfg.profile, graph, cluster.device, b, model=model)
  plan = plan_for(graph, profile, cluster, PlanOptions.of(cfg.planner, g, b),
                  model=model_record(graph, model and model.options),
                  cluster_record=to_record(cluster, g))
  fair = comparisons(graph, profile, cluster, plan,
                     cfg.comparison.for_device(cluster.device, b / g))
  if fair.get("uniform") is not None:  # the plan JSON keeps the best uniform strategy
    plan = dataclasses.replace(plan, extra={**plan.extra, "uniform": fair["uniform"]})
  return Planned(graph, profile, plan, fair)


def plan_task(cfg: PlanConfig, run: Run) -> dict[str, Any]:
  """Plan, print the per-layer table, write plan JSON and the devices-per-layer chart."""
  out_dir = run.output_dir
  out = Path(cfg.out) if cfg.out else out_dir / "plan.json"
  made = make(cfg)
  plan, fair = made.plan, made.fair
  run.begin()
  plan.save(out)
  rows = layer_rows(plan)
  print_plan(plan, rows, fair)
  run.log_table("plan_layers", COLUMNS, rows)
  print(f"plan: {out}")
  if cfg.chart:
    chart = plot_devices_per_layer(plan, out_dir / "devices_per_layer.png", fair,
                                   pdf=cfg.chart_pdf)
    run.log_image("devices_per_layer", chart)
    print(f"chart: {chart}")
  return plan_summary(plan, fair, out)


main = hydra_app("plan", PlanConfig)(plan_task)


if __name__ == "__main__":
  run_app_module("dp_jax.plan")
