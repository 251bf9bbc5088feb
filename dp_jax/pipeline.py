"""python -m dp_jax.pipeline: the whole story on one config, end to end.

    ./scripts/run.sh                       # = python -m dp_jax.pipeline (default config)
    ./scripts/run.sh model=resnet50 train.steps=5

Profiles the model on this machine (cached), plans it for the local devices, simulates the plan
with a background job in its idle windows, trains a few steps of the burst plan with that
background job on the local devices, and ends with a summary: the plan, predicted vs measured
step time, cluster throughput, and the paths of its plots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from dp_jax.cli import hydra_app
from dp_jax.config import (
  BackgroundConfig,
  ClusterConfig,
  LoggerConfig,
  ModelConfig,
  PlannerConfig,
  ProfileConfig,
)
from dp_jax.simulate import InterferenceConfig
from dp_jax.tracking import Run


@dataclass
class PipelineTrainConfig:
  """The training part of the pipeline (on the local devices)."""

  steps: int = 3
  learning_rate: float = 0.01
  enabled: bool = True


@dataclass
class PipelineConfig:
  """python -m dp_jax.pipeline: profile -> plan -> simulate -> train, on one config."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  interference: InterferenceConfig = field(default_factory=InterferenceConfig)
  train: PipelineTrainConfig = field(default_factory=PipelineTrainConfig)
  batch_size: int = 32
  iterations: int = 4  # simulated iterations after a warm-up one
  seed: int = 0


def pipeline_task(cfg: Any, run: Run) -> dict[str, Any]:
  """Run every stage in order; each writes its own files into the job's output folder."""
  from hydra.core.hydra_config import HydraConfig

  from dp_jax import workflow
  from dp_jax.plan import layer_rows, plot_devices_per_layer, print_plan

  out_dir = Path(HydraConfig.get().runtime.output_dir)
  cluster = workflow.cluster_spec(cfg.cluster)
  num_devices = workflow.job_devices(cfg.cluster, cluster)
  set_local_devices(cluster, num_devices)
  graph = workflow.load_graph(cfg)
  _step("profile", f"{graph.model}: {len(graph.nodes)} layers, source "
                   f"{workflow.enum_value(cfg.profile.source)}")
  profile = workflow.load_profile_for(cfg, graph, cluster, cfg.batch_size,
                                      cfg.background.batch_per_device)
  profile.save(out_dir / "profile.json")
  _step("plan", f"B={cfg.batch_size} on {num_devices} {cluster.device} devices")
  plan = workflow.make_plan_from_config(cfg.planner, graph, profile, cluster,
                                        num_devices=num_devices, global_batch=cfg.batch_size)
  plan.save(out_dir / "plan.json")
  rows = layer_rows(plan)
  print_plan(plan, rows)
  chart = plot_devices_per_layer(plan, out_dir / "devices_per_layer.png")
  run.log_table("plan_layers", ["layer", "kind", "devices", "first device", "per-device batch",
                                "compute ms", "sync ms", "move-in ms", "amplification", "stage"],
                rows)
  _step("simulate", f"background {cfg.background.name}, slowdown cap "
                    f"{cfg.background.slowdown_cap:.0%}")
  sim = simulate_plan(cfg, graph, profile, cluster, plan, out_dir)
  m = sim["metrics"]
  (out_dir / "simulation.json").write_text(json.dumps(m, indent=1, default=str))
  summary: dict[str, Any] = {
      "model": graph.model, "num_devices": num_devices, "global_batch": cfg.batch_size,
      "plan_stages": len(plan.extra.get("stages", [])) or None,
      "predicted_iteration_ms": plan.predicted["iteration_ms"],
      "predicted_data_parallel_iteration_ms": plan.predicted["data_parallel_iteration_ms"],
      **{f"simulated_{k}": m[k] for k in SIMULATED_KEYS if k in m}}
  plots = {"devices_per_layer": str(chart), "gantt": sim["gantt"]}
  if cfg.train.enabled:
    with_bg = "" if cfg.background.name == "none" else f" with background {cfg.background.name}"
    _step("train", f"{cfg.train.steps} steps of the burst plan on the local devices{with_bg}")
    trained = train_plan(cfg, plan, out_dir, run)
    summary.update(trained["summary"])
    plots.update(trained["plots"])
  for key, path in plots.items():
    run.log_image(key, path)
  print_summary(summary, plots)
  (out_dir / "summary.json").write_text(json.dumps({**summary, "plots": plots}, indent=1))
  return {**summary, "plots": plots}


SIMULATED_KEYS = ("alone_iteration_ms", "iteration_ms", "alone_idle_fraction",
                  "background_samples_per_s", "cluster_throughput_vs_data_parallel")


def set_local_devices(cluster, num_devices: int) -> None:
  """On a CPU cluster spec, ask XLA for num_devices host devices before jax starts."""
  if cluster.device == "cpu":
    from dp_jax.train import set_host_device_count

    set_host_device_count(num_devices)


def simulate_plan(cfg: Any, graph, profile, cluster, plan, out_dir: Path) -> dict[str, Any]:
  """Simulate the plan alone and with the background job; write metrics and the Gantt chart."""
  from dp_jax import simulate as sim_app

  return sim_app.simulate_and_write(cfg, graph, profile, cluster, plan, out_dir)


def train_plan(cfg: Any, plan, out_dir: Path, run: Run) -> dict[str, Any]:
  """Train the plan for a few steps on the local devices (with the background job)."""
  from dp_jax import train as train_app

  return train_app.train_plan_for_pipeline(cfg, plan, out_dir, run)


def print_summary(summary: dict[str, Any], plots: dict[str, str]) -> None:
  from rich.console import Console
  from rich.table import Table

  table = Table(title="dp_jax pipeline summary")
  table.add_column("metric")
  table.add_column("value", justify="right")
  for k, v in summary.items():
    table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
  console = Console(width=110)
  console.print(table)
  for k, v in plots.items():
    console.print(f"{k}: {v}")


def _step(name: str, what: str) -> None:
  from rich.console import Console

  Console(width=110).rule(f"[bold]{name}[/bold]: {what}")


main = hydra_app("pipeline", PipelineConfig)(pipeline_task)

if __name__ == "__main__":
  main()
