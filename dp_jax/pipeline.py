"""python -m dp_jax.pipeline: the whole story on one config, end to end.

    ./scripts/run.sh                       # = python -m dp_jax.pipeline (default config)
    ./scripts/run.sh train.steps=5 paper.amplification_limit=inf

1. The paper's setting, on DeepPool's measured A100 tables (predicted by the planner's cost
   model, simulated by the simulator): VGG16 at B=32 on one 8-GPU NVLink server and on DGX A100
   nodes (G = 8, 16, 32): burst vs data parallelism, GPU time saved, and cluster throughput with
   a background job in the idle devices.
2. On this machine: the model's layers measured here (cached), a burst plan for the local
   devices, simulated, then trained for a few steps with the background job beside it
   (measured).
3. One summary in which every number is labelled predicted, simulated or measured.
"""

from __future__ import annotations

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
from dp_jax.jsonfile import write_json
from dp_jax.simulate import InterferenceConfig
from dp_jax.tracking import Run


@dataclass
class PipelineTrainConfig:
  """The training part of the pipeline (on the local devices)."""

  steps: int = 3
  learning_rate: float = 0.01
  enabled: bool = True


@dataclass
class PaperSetting:
  """One cluster of the paper's comparison: a cluster config (conf/cluster/) and G."""

  cluster: str = MISSING
  num_devices: int = MISSING


@dataclass
class PaperConfig:
  """The paper's setting on DeepPool's A100 tables (predicted and simulated, no JAX run)."""

  enabled: bool = True
  model: str = "vgg16"
  batch_size: int = 32
  amplification_limit: float = 2.0
  settings: list[PaperSetting] = field(default_factory=lambda: [
      PaperSetting("a100_nvlink_8", 8), PaperSetting("dgx_a100", 16),
      PaperSetting("dgx_a100", 32)])


@dataclass
class PipelineConfig:
  """python -m dp_jax.pipeline: the paper's A100 setting, then profile -> plan -> simulate ->
  train on the local devices."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  interference: InterferenceConfig = field(default_factory=InterferenceConfig)
  train: PipelineTrainConfig = field(default_factory=PipelineTrainConfig)
  paper: PaperConfig = field(default_factory=PaperConfig)
  batch_size: int = 32
  iterations: int = 4  # simulated iterations after a warm-up one
  seed: int = 0


PAPER_COLUMNS = ["cluster", "G", "burst ms (predicted)", "data-parallel ms (predicted)",
                 "speed-up (predicted)", "GPU time saved (predicted)",
                 "background samples/s (simulated)", "cluster throughput / DP (simulated)",
                 "cluster throughput / matched-speed DP + background (simulated)"]


def pipeline_task(cfg: PipelineConfig, run: Run) -> dict[str, Any]:
  """The paper's A100 setting, then the local run; writes summary.json and the plots."""
  from hydra.core.hydra_config import HydraConfig

  from dp_jax import workflow

  out_dir = Path(HydraConfig.get().runtime.output_dir)
  cluster = workflow.cluster_spec(cfg.cluster)
  num_devices = workflow.job_devices(cfg.cluster, cluster)
  for setting in cfg.paper.settings:  # a bad cluster name or G fails before any work
    workflow.job_devices({"num_devices": setting.num_devices},
                         workflow.cluster_spec(workflow.cluster_config(setting.cluster)))
  set_local_devices(cluster, num_devices)
  run.begin()
  paper = paper_rows(cfg, out_dir / "a100") if cfg.paper.enabled else []
  local, plots, plan_rows = local_run(cfg, cluster, num_devices, out_dir, run)
  if paper:  # tables and images after training: W&B steps only grow
    run.log_table("a100_burst_vs_data_parallel", PAPER_COLUMNS, paper)
  from dp_jax.plan import COLUMNS

  run.log_table("plan_layers", COLUMNS, plan_rows)
  for key, path in plots.items():
    run.log_image(key, path)
  print_summary(cfg, paper, local, plots)
  summary = {"a100": [dict(zip(PAPER_COLUMNS, r, strict=True)) for r in paper],
             "local": {k: {"value": v, "kind": kind} for k, (v, kind) in local.items()},
             "plots": plots}
  write_json(out_dir / "summary.json", summary)
  flat = {f"local/{k}": v for k, (v, _) in local.items()}
  for r in paper:
    flat[f"a100/{r[0]}_g{r[1]}/speedup"] = r[4]
    flat[f"a100/{r[0]}_g{r[1]}/cluster_throughput_vs_dp"] = r[7]
  return flat


def paper_rows(cfg: Any, out_dir: Path) -> list[list[Any]]:
  """Burst vs data parallelism per paper setting, on the A100 tables (one row each)."""
  from omegaconf import OmegaConf

  from dp_jax import simulate as sim_app
  from dp_jax import workflow, zoo
  from dp_jax.profile.sources import load_profile, profile_batches

  paper = cfg.paper
  model_cfg = OmegaConf.create({"name": paper.model})
  graph = zoo.graph_of(model_cfg, seed=cfg.seed)
  b = int(paper.batch_size)
  profile = load_profile({"source": "deeppool_a100"}, graph, "A100-SXM4-40GB",
                         profile_batches(b, cfg.background.batch_per_device))
  planner = OmegaConf.merge(cfg.planner, {"name": "burst",
                                           "amplification_limit": paper.amplification_limit})
  sim_cfg = OmegaConf.merge(cfg, {"batch_size": b, "background": {"model": None}})
  _step("A100", f"{paper.model} B={b} on DeepPool's A100 tables, amplification limit "
                f"{paper.amplification_limit} (predicted / simulated)")
  rows = []
  for setting in paper.settings:
    cluster_cfg = workflow.cluster_config(setting.cluster)
    cluster = workflow.cluster_spec(cluster_cfg)
    g = int(setting.num_devices)
    plan = workflow.make_plan_from_config(planner, graph, profile, cluster, num_devices=g,
                                          global_batch=b, model_cfg=model_cfg,
                                          cluster_cfg={**cluster_cfg, "num_devices": g})
    folder = out_dir / f"{setting.cluster}_g{g}"
    plan.save(folder / "plan.json")
    m = sim_app.simulate_and_write(sim_cfg, graph, profile, cluster, plan, folder)["metrics"]
    p = plan.predicted
    rows.append([setting.cluster, g, p["iteration_ms"], p["data_parallel_iteration_ms"],
                 p["data_parallel_iteration_ms"] / p["iteration_ms"],
                 1 - p["gpu_ms"] / p["data_parallel_gpu_ms"],
                 m.get("background_samples_per_s"), m.get("cluster_throughput_vs_data_parallel"),
                 _matched(m)])
  return rows


def _matched(m: dict[str, Any]) -> str | None:
  """Cluster throughput against data parallelism on the fewest devices as fast as the burst
  plan with the background job on the rest, naming that device count."""
  ratio, d = (m.get("cluster_throughput_vs_matched_data_parallel"),
              m.get("matched_data_parallel_devices"))
  if ratio is None:
    return "no DP as fast" if "matched_data_parallel_note" in m else None
  return f"{ratio:.2f}x (DP on {d})"


def local_run(cfg: Any, cluster, num_devices: int, out_dir: Path, run: Run
              ) -> tuple[dict[str, tuple[Any, str]], dict[str, str], list[list[Any]]]:
  """Profile, plan, simulate and train on the local devices.

  Returns {quantity: (value, kind)}, the plots, and the plan's per-layer rows.
  """
  from dp_jax import workflow
  from dp_jax.plan import layer_rows, plot_devices_per_layer, print_plan

  graph = workflow.load_graph(cfg)
  _step("profile", f"{graph.model}: {len(graph.nodes)} layers on this machine, source "
                   f"{workflow.enum_value(cfg.profile.source)}")
  profile = workflow.load_profile_for(cfg, graph, cluster, cfg.batch_size,
                                      cfg.background.batch_per_device)
  profile.save(out_dir / "profile.json")
  _step("plan", f"B={cfg.batch_size} on {num_devices} local {cluster.device} devices")
  plan = workflow.make_plan_from_config(cfg.planner, graph, profile, cluster,
                                        num_devices=num_devices, global_batch=cfg.batch_size,
                                        model_cfg=cfg.model, cluster_cfg=cfg.cluster)
  plan.save(out_dir / "plan.json")
  rows = layer_rows(plan)
  print_plan(plan, rows)
  chart = plot_devices_per_layer(plan, out_dir / "devices_per_layer.png")
  _step("simulate", f"background {cfg.background.name}, slowdown cap "
                    f"{cfg.background.slowdown_cap:.0%}")
  sim = simulate_plan(cfg, graph, profile, cluster, plan, out_dir)
  m = sim["metrics"]
  write_json(out_dir / "simulation.json", m)
  stages = {lp.extra.get("stage") for lp in plan.layers} - {None}
  local: dict[str, tuple[Any, str]] = {
      "model": (f"{graph.model} {'x'.join(map(str, graph.input_shape))}", "config"),
      "devices": (num_devices, "config"), "global_batch": (cfg.batch_size, "config"),
      "plan_stages": (len(stages) or None, "predicted"),
      "burst_iteration_ms": (plan.predicted["iteration_ms"], "predicted"),
      "data_parallel_iteration_ms": (plan.predicted["data_parallel_iteration_ms"], "predicted"),
      **{f"simulated_{k}": (m[k], "simulated") for k in SIMULATED_KEYS if k in m}}
  plots = {"devices_per_layer": str(chart), "gantt": sim["gantt"]}
  if cfg.train.enabled:
    from dp_jax.train import pipeline_alone_steps

    alone = pipeline_alone_steps(cfg)
    what = (f"{cfg.train.steps} steps" if not alone else f"{alone} steps alone (compile, "
            f"baseline), then {cfg.train.steps} with background {cfg.background.name}")
    _step("train", f"{alone + cfg.train.steps} steps of the burst plan: {what}")
    trained = train_plan(cfg, plan, out_dir, run)
    local.update({k: (v, "measured") for k, v in trained["summary"].items()})
    plots.update(trained["plots"])
  return local, plots, rows


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


def print_summary(cfg: Any, paper: list[list[Any]], local: dict[str, tuple[Any, str]],
                  plots: dict[str, str]) -> None:
  from rich.console import Console
  from rich.table import Table

  console = Console(width=150)
  if paper:
    t = Table(title=f"{cfg.paper.model}, B={cfg.paper.batch_size}, on DeepPool's A100 tables: "
                    "burst vs data parallelism (DP)",
              caption="P: predicted by the cost model; S: simulated. Matched: DP on the fewest "
                      "devices as fast as the burst plan, the background job on the rest.")
    for c in ("cluster", "G", "burst ms P", "DP ms P", "speed-up P", "GPU time saved P",
              "background samples/s S", "cluster / DP S", "cluster / matched DP S"):
      t.add_column(c, justify="left" if c == "cluster" else "right")
    for r in paper:
      t.add_row(r[0], str(r[1]), f"{r[2]:.2f}", f"{r[3]:.2f}", f"{r[4]:.2f}x", f"{r[5]:.0%}",
                _fmt(r[6]), _fmt(r[7], "x"), _fmt(r[8]))
    console.print(t)
  t = Table(title="on this machine's devices")
  for c in ("quantity", "value", "kind"):
    t.add_column(c, justify="right" if c == "value" else "left")
  for k, (v, kind) in local.items():
    t.add_row(k, _fmt(v), kind)
  console.print(t)
  for k, v in plots.items():
    console.print(f"{k}: {v}")


def _fmt(v: Any, suffix: str = "") -> str:
  if v is None:
    return "-"
  return f"{v:.4g}{suffix}" if isinstance(v, float) else f"{v}{suffix}"


def _step(name: str, what: str) -> None:
  from rich.console import Console

  Console(width=110).rule(f"[bold]{name}[/bold]: {what}")


main = hydra_app("pipeline", PipelineConfig)(pipeline_task)

if __name__ == "__main__":
  main()
