"""python -m dp_jax.plan: a burst-parallel plan (and the data-parallel baseline) as JSON.

    python -m dp_jax.plan model=vgg16 cluster=a100_nvlink_8 cluster.num_devices=8 batch_size=32 \
        profile=deeppool_a100 planner.amplification_limit=2 out=plan.json
    python -m dp_jax.plan graph=graph.json profile=profile.json cluster=dgx_a100 \
        cluster.num_devices=64 batch_size=64
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from dp_jax.cli import hydra_app
from dp_jax.config import ClusterConfig, LoggerConfig, ModelConfig, PlannerConfig, ProfileConfig
from dp_jax.tracking import Run

COLUMNS = ["layer", "kind", "devices", "first device", "per-device batch", "compute ms",
           "sync ms", "move-in ms", "amplification", "stage", "split"]


@dataclass
class PlanConfig:
  """python -m dp_jax.plan: plan a model (or a graph + profile file) on a cluster."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  batch_size: int = 32
  graph: str | None = None  # a graph JSON to plan instead of the zoo model
  out: str | None = None  # plan JSON path; default <output dir>/plan.json
  seed: int = 0


def layer_rows(plan) -> list[list[Any]]:
  """One row per layer of the plan."""
  rows = []
  for lp in plan.layers:
    x = dict(lp.extra)
    rows.append([lp.name, x.get("kind", ""), len(lp.devices), lp.devices[0],
                 x.get("per_device_batch", ""), _r(x.get("compute_ms")), _r(x.get("sync_ms")),
                 _r(x.get("move_in_ms")), _r(x.get("amplification")), x.get("stage", ""),
                 _split(lp.sharding)])
  return rows


def _split(sharding: dict) -> str:
  """'samples', or a weight split with its mesh: 'out 2x4' (d x m)."""
  if sharding["split"] == "samples":
    return "samples"
  d, m = sharding["mesh"]
  return f"{sharding['split']} {d}x{m}"


def _r(v: Any) -> Any:
  return round(v, 4) if isinstance(v, float) and math.isfinite(v) else v


def print_plan(plan, rows: list[list[Any]]) -> None:
  from rich.console import Console
  from rich.table import Table

  p = plan.predicted
  table = Table(title=f"{plan.model}: B={plan.global_batch} on {plan.num_devices} devices "
                      f"({plan.cluster}), amplification limit {plan.amplification_limit}")
  for c in COLUMNS:
    table.add_column(c, justify="left" if c in ("layer", "kind") else "right")
  for row in rows:
    table.add_row(*[str(v) for v in row])
  console = Console(width=140)
  console.print(table)
  console.print(
      f"burst: {p['iteration_ms']:.3f} ms/iter, {p['gpu_ms']:.3f} GPU-ms | data parallel: "
      f"{p['data_parallel_iteration_ms']:.3f} ms/iter, {p['data_parallel_gpu_ms']:.3f} GPU-ms | "
      f"speed-up {p['data_parallel_iteration_ms'] / p['iteration_ms']:.3f}x, GPU-time saving "
      f"{1 - p['gpu_ms'] / p['data_parallel_gpu_ms']:.1%} | "
      f"planned in {plan.planner_seconds:.3f} s")


def plot_devices_per_layer(plan, path: Path) -> Path:
  """Bar chart of each layer's device count (PNG)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  counts = [len(lp.devices) for lp in plan.layers]
  fig, ax = plt.subplots(figsize=(max(6, 0.12 * len(counts) + 2), 3.5))
  ax.bar(range(len(counts)), counts, color="tab:blue", width=0.8)
  ax.axhline(plan.num_devices, color="tab:red", lw=1, ls="--", label=f"G = {plan.num_devices}")
  ax.set_xlabel("layer (topological order)")
  ax.set_ylabel("devices")
  step = max(1, len(counts) // 40)
  ax.set_xticks(range(0, len(counts), step))
  ax.set_xticklabels([plan.layers[i].name for i in range(0, len(counts), step)], rotation=90,
                     fontsize=6)
  p = plan.predicted
  ax.set_title(f"{plan.model}, B={plan.global_batch}, G={plan.num_devices} ({plan.cluster}): "
               f"{p['iteration_ms']:.2f} ms vs data parallel {p['data_parallel_iteration_ms']:.2f}"
               " ms", fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def plan_task(cfg: PlanConfig, run: Run) -> dict[str, Any]:
  """Plan, print the per-layer table, write plan JSON and the devices-per-layer chart."""
  from hydra.core.hydra_config import HydraConfig

  from dp_jax import workflow

  out_dir = Path(HydraConfig.get().runtime.output_dir)
  cluster = workflow.cluster_spec(cfg.cluster)
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
  print_plan(plan, rows)
  chart = plot_devices_per_layer(plan, out_dir / "devices_per_layer.png")
  run.log_table("plan_layers", COLUMNS, rows)
  run.log_image("devices_per_layer", chart)
  p = plan.predicted
  print(f"plan: {out}\nchart: {chart}")
  return {"model": plan.model, "num_devices": plan.num_devices, "global_batch": plan.global_batch,
          "cluster": plan.cluster, "amplification_limit": plan.amplification_limit,
          "iteration_ms": p["iteration_ms"], "gpu_ms": p["gpu_ms"],
          "data_parallel_iteration_ms": p["data_parallel_iteration_ms"],
          "data_parallel_gpu_ms": p["data_parallel_gpu_ms"],
          "speedup": p["data_parallel_iteration_ms"] / p["iteration_ms"],
          "gpu_time_saving": 1 - p["gpu_ms"] / p["data_parallel_gpu_ms"],
          "weight_sharded_layers": sum(lp.sharding["split"] != "samples" for lp in plan.layers),
          "memory_peak_gb": p.get("memory_peak_gb"),
          "planner_seconds": plan.planner_seconds, "plan": str(out)}


main = hydra_app("plan", PlanConfig)(plan_task)

if __name__ == "__main__":
  main()
