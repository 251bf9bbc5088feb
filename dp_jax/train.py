"""python -m dp_jax.train model=vgg16 plan=burst batch_size=32 runtime.num_devices=8 steps=20

Trains a zoo model under a plan: `burst` (planned now for the local devices with the profile
and cluster configs), `data_parallel` (the baseline: every layer on every device) or a plan
JSON made elsewhere (it must fit the local device count). Writes plan.json, metrics.jsonl,
timeline.json (+ gantt.png) and orbax checkpoints under the run's output folder, and resumes
from the newest checkpoint there (rerun with the same hydra.run.dir).

On a CPU backend runtime.num_devices also sets the number of XLA host devices; this module
imports nothing from JAX until the task has set XLA_FLAGS.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from enum import Enum
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
from dp_jax.errors import UserError
from dp_jax.jsonfile import write_json
from dp_jax.runtime.distributed import DistributedConfig
from dp_jax.tracking import Run

log = logging.getLogger("dp_jax.train")
HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"
PLAN_MODES = ("burst", "data_parallel")


class OptimizerName(str, Enum):
  sgd = "sgd"
  adam = "adam"
  adamw = "adamw"


class DataSourceName(str, Enum):
  synthetic = "synthetic"
  npz = "npz"
  folder = "folder"


@dataclass
class OptimizerConfig:
  """An element-wise optax optimizer (applied per stage, so no global-norm transforms)."""

  name: OptimizerName = OptimizerName.sgd
  lr: float = 0.01
  momentum: float = 0.9  # sgd momentum; adam/adamw b1
  weight_decay: float = 0.0  # adamw only


@dataclass
class DataConfig:
  """Training data: synthetic (seeded), an .npz with x and y, or a class-per-folder tree."""

  source: DataSourceName = DataSourceName.synthetic
  path: str | None = None
  seed: int = 0


@dataclass
class RuntimeConfig:
  """Devices, checkpoints and progress display of the runtime."""

  num_devices: int | None = None  # None: every device; on CPU also the host device count
  checkpoint_every: int = 50  # steps between checkpoints (0: only at the end)
  progress: bool = True
  distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass
class TrainConfig:
  """python -m dp_jax.train: train a zoo model under a burst, data-parallel or given plan."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING  # burst planning: the local devices' cost model
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
  optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
  data: DataConfig = field(default_factory=DataConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)  # none: alone
  plan: str = "data_parallel"  # burst | data_parallel | path to a plan JSON
  batch_size: int | None = None  # None: a plan file's global batch, else 32
  steps: int = 10
  seed: int = 0


def set_host_device_count(n: int | None) -> None:
  """Ask XLA's CPU backend for `n` host devices (effective only before JAX initialises)."""
  if n is None:
    return
  if isinstance(n, bool) or n < 1:
    raise UserError(f"runtime.num_devices={n} must be a positive integer")
  flags = re.sub(rf"{HOST_DEVICES_FLAG}=\d+", "", os.environ.get("XLA_FLAGS", "")).strip()
  os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES_FLAG}={n}".strip()


def make_optimizer(cfg: Any):
  import optax

  name = str(getattr(cfg.name, "value", cfg.name))
  if not math.isfinite(cfg.lr) or cfg.lr <= 0:
    raise UserError(f"optimizer.lr={cfg.lr} must be a finite number > 0")
  if name == "sgd":
    return optax.sgd(cfg.lr, momentum=cfg.momentum or None)
  if name == "adam":
    return optax.adam(cfg.lr, b1=cfg.momentum)
  return optax.adamw(cfg.lr, b1=cfg.momentum, weight_decay=cfg.weight_decay)


def load_plan_file(path: str) -> dict[str, Any]:
  p = Path(path)
  if not p.is_file():
    raise UserError(f"plan '{path}' is neither {' nor '.join(PLAN_MODES)} nor an existing plan "
                    "JSON file")
  try:
    return json.loads(p.read_text())
  except json.JSONDecodeError as e:
    raise UserError(f"plan file {p} is not valid JSON: {e.msg} at line {e.lineno}") from None


def burst_plan(cfg: Any, model, num_devices: int, batch: int) -> dict[str, Any]:
  """A burst plan for the local devices (traced graph, configured profile and cluster)."""
  from dp_jax import workflow
  from dp_jax.trace import trace_graph

  cluster = workflow.cluster_spec(cfg.cluster)
  graph = trace_graph(model, cfg.model.name)
  profile = workflow.load_profile_for(cfg, graph, cluster, batch)
  plan = workflow.make_plan_from_config(cfg.planner, graph, profile, cluster,
                                        num_devices=num_devices, global_batch=batch,
                                        model_cfg=cfg.model, cluster_cfg=cfg.cluster)
  return plan.to_json()


def model_record(cfg: Any, model) -> dict[str, Any]:
  """The plan's made_for record of the model this job trains (see workflow.model_record)."""
  from dp_jax import zoo

  options = zoo.model_kwargs(cfg.model)
  options.pop("dtype", None)
  return {"name": cfg.model.name, "input_shape": list(model.input_spec(1).shape[1:]),
          "layers": len(model.layer_specs()), "options": options}


def job_devices(requested: int | None):
  """The job's devices: the first runtime.num_devices of jax.devices() (all if None)."""
  import jax

  available = jax.devices()
  g = requested or len(available)
  if g > len(available):
    raise UserError(f"runtime.num_devices={g} but only {len(available)} "
                    f"{jax.default_backend()} device(s) exist; lower runtime.num_devices")
  return available[:g]


def resolve_plan(cfg: Any, model, graph, g: int) -> tuple[dict[str, Any], int]:
  """(plan dict, global batch) for plan=burst | data_parallel | <file>, checked for this job."""
  from dp_jax.runtime.plan_check import check_plan
  from dp_jax.runtime.plans import data_parallel_layout_plan

  file_plan = cfg.plan not in PLAN_MODES
  plan = load_plan_file(cfg.plan) if file_plan else None
  batch = cfg.batch_size
  if batch is None:
    batch = (plan.get("global_batch") if isinstance(plan, dict) else None) or 32
  if not file_plan and g > batch:
    raise UserError(f"batch_size={batch} is smaller than runtime.num_devices={g}; every device "
                    "needs a sample")
  if cfg.plan == "data_parallel":
    plan = {**data_parallel_layout_plan(graph, global_batch=batch, num_devices=g),
            "made_for": model_record(cfg, model)}
  elif cfg.plan == "burst":
    plan = burst_plan(cfg, model, g, batch)
  need = plan.get("num_devices") if isinstance(plan, dict) else None
  if isinstance(need, int) and not isinstance(need, bool) and need > g:
    raise UserError(f"plan needs {need} devices but only {g} are available "
                    f"(runtime.num_devices={g}); make a plan for {g} devices")
  check_plan(plan, graph, available_devices=g, global_batch=batch)
  return plan, batch


def same_plan_everywhere(plan: dict[str, Any], batch: int) -> tuple[dict[str, Any], int]:
  """Process 0's (plan, batch) on every process of a multi-process job (unchanged in one).

  Each process plans for itself; a measured profile or a plan file that differs between hosts
  could give another plan, so process 0's is the one every process runs. A process whose own
  plan differed (beyond planner_seconds, the planner's wall time) says so in its log.
  """
  from dp_jax.runtime import distributed

  mine = json.loads(json.dumps({"plan": plan, "batch": batch}))
  agreed = distributed.from_process_0(mine)
  if agreed == mine:
    return plan, batch

  def what_runs(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p["plan"].items() if k != "planner_seconds"} | {"b": p["batch"]}

  if what_runs(agreed) != what_runs(mine):
    log.warning("process %d planned differently from process 0 (a measured profile, or another "
                "plan file?); it runs process 0's plan", distributed.process_index())
  return agreed["plan"], agreed["batch"]


def train_task(cfg: TrainConfig, run: Run) -> dict[str, Any]:
  """Plan (or load) a plan, train under it, write metrics, timeline and checkpoints."""
  set_host_device_count(cfg.runtime.num_devices)
  from dp_jax.runtime import distributed

  distributed.initialize(cfg.runtime.distributed)
  from dp_jax import orchestrator, workflow, zoo
  from dp_jax.runtime import data as datalib
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.runtime.train_loop import check_same_job, train

  out_dir = run.output_dir  # one folder per job, also with several processes (cli.py)
  devices = job_devices(cfg.runtime.num_devices)
  if cfg.plan not in PLAN_MODES:  # a plan for another model config: refuse before building
    workflow.check_made_for(load_plan_file(cfg.plan),
                            model_record(cfg, zoo.build(cfg.model, abstract=True)),
                            f"plan {cfg.plan}")
  model = zoo.build(cfg.model, seed=cfg.seed)
  graph = structure_graph(model, cfg.model.name)
  plan, batch = resolve_plan(cfg, model, graph, len(devices))  # before any checkpoint
  plan, batch = same_plan_everywhere(plan, batch)
  check_same_job(out_dir, cfg, plan, cfg.steps)  # a resume is the same job (reads only)

  def start_writing() -> None:  # the checkpoint folder fits this job: files may be written now
    run.begin()
    if run.writes:  # process 0 of a multi-process job
      write_json(out_dir / "plan.json", plan)

  data = datalib.make_source(workflow.enum_value(cfg.data.source), model, path=cfg.data.path,
                             seed=cfg.data.seed)
  hook = orchestrator.start_background(
      cfg.background, cfg.model, plan, devices,
      memory_gb_per_device=cfg.cluster.memory_gb_per_device, learning_rate=cfg.optimizer.lr,
      seed=cfg.seed, start_after=orchestrator.alone_steps(cfg.steps),
      checkpoint_dir=out_dir / "background_checkpoint",
      checkpoint_every=cfg.runtime.checkpoint_every)
  result = train(model, graph, plan, steps=cfg.steps, optimizer=make_optimizer(cfg.optimizer),
                 data=data, checkpoint_dir=out_dir / "checkpoints",
                 checkpoint_every=cfg.runtime.checkpoint_every, log_fn=_with_background(run, hook),
                 output_dir=out_dir, devices=devices, progress=cfg.runtime.progress,
                 on_stage=hook, on_start=start_writing)
  measured = orchestrator.measure(result.step_ms, hook) if hook is not None else {}
  png = _gantt(result.timeline_path) if result.timeline_path is not None else None
  if png is not None:
    run.log_image("gantt", png)
  summary = {"model": cfg.model.name, "plan": cfg.plan, "num_devices": len(devices),
             "global_batch": batch, "stages": len(result.program.stages),
             "resumed_from_step": result.start_step, "final_step": result.final_step,
             "final_loss": result.losses[-1] if result.losses else None,
             "median_step_ms": result.median_step_ms}
  if result.median_step_ms:
    summary["samples_per_s"] = batch / result.median_step_ms * 1e3
  if hook is not None:
    summary.update(background=cfg.background.name, **measured)
    run.summary({k: v for k, v in measured.items() if v is not None})
  print(f"trained {cfg.model.name} to step {result.final_step} in {summary['stages']} stage(s); "
        f"outputs: {out_dir}")
  return summary


def pipeline_alone_steps(cfg: Any) -> int:
  """Steps the pipeline trains alone before its background job starts (0 without one)."""
  bg = cfg.background
  return 0 if bg is None or bg.name == "none" else 2 + max(1, cfg.train.steps)


def train_plan_for_pipeline(cfg: Any, plan: Any, out_dir: Path, run: Run) -> dict[str, Any]:
  """Train `plan` on the local devices for dp_jax.pipeline (no checkpoints), with the background.

  With a background job, alone_steps(...) steps run alone first (compile, timed step, the
  baseline), then cfg.train.steps with the job; alone, just cfg.train.steps.
  """
  import optax

  from dp_jax import orchestrator, zoo
  from dp_jax.runtime import data as datalib
  from dp_jax.runtime.plan_check import plan_dict
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.runtime.train_loop import train

  plan = plan_dict(plan)
  devices = job_devices(plan["num_devices"])
  model = zoo.build(cfg.model, seed=cfg.seed)
  graph = structure_graph(model, cfg.model.name)
  bg = cfg.background
  alone = pipeline_alone_steps(cfg)
  hook = orchestrator.start_background(
      bg, cfg.model, plan, devices, memory_gb_per_device=cfg.cluster.memory_gb_per_device,
      learning_rate=cfg.train.learning_rate, seed=cfg.seed, start_after=alone)
  result = train(model, graph, plan, steps=alone + cfg.train.steps,
                 optimizer=optax.sgd(cfg.train.learning_rate, momentum=0.9),
                 data=datalib.synthetic(model, seed=cfg.seed), log_fn=_with_background(run, hook),
                 output_dir=out_dir / "train", devices=devices, progress=True, on_stage=hook)
  png = _gantt(result.timeline_path) if result.timeline_path is not None else None
  plots = {"measured_gantt": str(png)} if png is not None else {}
  losses = result.losses
  summary = {"train_stages": len(result.program.stages), "train_steps": result.final_step,
             "loss_first": losses[0] if losses else None,
             "loss_last": losses[-1] if losses else None,
             **orchestrator.measure(result.step_ms, hook)}
  return {"summary": summary, "plots": plots}


def _with_background(run: Run, hook):
  """run.log, plus the background job's counters under background/ (same W&B run)."""
  if hook is None:
    return run.log

  def log_fn(metrics: dict[str, Any], step: int) -> None:
    bg = {f"background/{k}": v for k, v in hook.stats.metrics().items() if v is not None}
    run.log({**metrics, **bg}, step)

  return log_fn


def _gantt(timeline_path: Path) -> Path | None:
  """gantt.png of the measured step, drawn by the simulator's plotter (None if absent)."""
  try:
    from dp_jax.sim.gantt import plot_gantt
    from dp_jax.sim.timeline import Event
  except ImportError:
    return None
  t = json.loads(timeline_path.read_text())
  events = [Event(**{**e, "devices": tuple(e["devices"])}) for e in t["alone"]["events"]]
  png = plot_gantt(events, t["num_devices"], timeline_path.with_name("gantt.png"),
                   title=f"{t['model']} B={t['global_batch']}: measured step {t['step']}")
  return png


main = hydra_app("train", TrainConfig)(train_task)

if __name__ == "__main__":
  main()
