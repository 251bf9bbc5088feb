"""python -m dp_jax.train model=vgg16 plan=burst batch_size=32 runtime.num_devices=8 steps=20

Trains a zoo model under a plan: `burst` (planned now for the local devices with the profile
and cluster configs), `data_parallel` (the baseline: every layer on every device) or a plan
JSON made elsewhere (it must fit the local device count). Writes plan.json, metrics.jsonl,
timeline.json (+ gantt.png) and orbax checkpoints under the run's output folder, and resumes
from the newest checkpoint there (rerun with the same hydra.run.dir).

On a CPU backend runtime.num_devices also sets the number of XLA host devices; this module
imports nothing from JAX until the task has set XLA_FLAGS. With a background job on a CPU
cluster the job honours its slowdown cap: it trains on one pinned process per device (one core
each; default: one per core, dp_jax.runtime.training.train_pinned), and refuses more devices than
cores unless runtime.share_cores=true (one process, exact, the cap not honoured).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import write_json
from dp_jax.config.hydra_app import hydra_app
from dp_jax.config.schema import (
  BackgroundConfig,
  ClusterConfig,
  LoggerConfig,
  ModelConfig,
  PlannerConfig,
  ProfileConfig,
)
from dp_jax.runtime.distributed import DistributedConfig
from dp_jax.tracking.run import Run

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

  # None: every device (with a background job on CPU: one per core); on CPU also the host
  # device count
  num_devices: int | None = None
  checkpoint_every: int = 50  # steps between checkpoints (0: only at the end)
  progress: bool = True
  # With a background job on CPU the job runs as one pinned process per device (an idle
  # device is then an idle core and the slowdown cap holds); true: one process whose devices
  # share the cores (exact, but the cap does not hold: for exactness tests)
  share_cores: bool = False
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


def load_plan_file(path: str) -> dict[str, Any]:
  p = Path(path)
  if not p.is_file():
    raise UserError(f"plan '{path}' is neither {' nor '.join(PLAN_MODES)} nor an existing plan "
                    "JSON file")
  try:
    return json.loads(p.read_text())
  except json.JSONDecodeError as e:
    raise UserError(f"plan file {p} is not valid JSON: {e.msg} at line {e.lineno}") from None


def burst_plan(cfg: TrainConfig, model, num_devices: int, batch: int) -> dict[str, Any]:
  """A burst plan for the local devices (traced graph, configured profile and cluster)."""
  from dp_jax.config import workflow
  from dp_jax.graph.trace import trace_graph

  cluster = workflow.cluster_spec(cfg.cluster)
  graph = trace_graph(model, cfg.model.name)
  profile = workflow.load_profile_for(cfg, graph, cluster, batch)
  plan = workflow.make_plan_from_config(cfg.planner, graph, profile, cluster,
                                        num_devices=num_devices, global_batch=batch,
                                        model_cfg=cfg.model, cluster_cfg=cfg.cluster)
  return plan.to_json()


def model_record(cfg: TrainConfig, model) -> dict[str, Any]:
  """The plan's made_for record of the model this job trains (see workflow.model_record)."""
  from dp_jax.models import zoo

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


def resolve_plan(cfg: TrainConfig, model, graph, g: int) -> tuple[dict[str, Any], int]:
  """(plan dict, global batch) for plan=burst | data_parallel | <file>, checked for this job."""
  from dp_jax.planner.plan import check_plan, data_parallel_layout_plan

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
  from dp_jax.runtime import training

  processes = pinned_processes(cfg)
  if processes is None:
    set_host_device_count(cfg.runtime.num_devices)
  from dp_jax.runtime import distributed

  distributed.initialize(cfg.runtime.distributed)
  from dp_jax.config import workflow
  from dp_jax.models import zoo
  from dp_jax.planner.plan import as_plan
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.runtime.train_loop import check_same_job

  out_dir = run.output_dir  # one folder per job, also with several processes (cli.py)
  g = processes or len(job_devices(cfg.runtime.num_devices))
  if cfg.plan not in PLAN_MODES:  # a plan for another model config: refuse before building
    workflow.check_made_for(as_plan(load_plan_file(cfg.plan), f"plan {cfg.plan}"),
                            model_record(cfg, zoo.build(cfg.model, abstract=True)),
                            f"plan {cfg.plan}")
  model = zoo.build(cfg.model, seed=cfg.seed)
  graph = structure_graph(model, cfg.model.name)
  plan, batch = resolve_plan(cfg, model, graph, g)  # before any checkpoint
  plan, batch = same_plan_everywhere(plan, batch)
  del model
  check_same_job(out_dir, cfg, plan, cfg.steps)  # a resume is the same job (reads only)

  def start_writing() -> None:  # the checkpoint folder fits this job: files may be written now
    run.begin()
    if run.writes:  # process 0 of a multi-process job
      write_json(out_dir / "plan.json", plan)

  spec = training.TrainSpec(
      model=_plain(cfg.model), plan=plan, steps=cfg.steps, output_dir=str(out_dir),
      optimizer=_plain(cfg.optimizer), data=_plain(cfg.data), background=_plain(cfg.background),
      memory_gb_per_device=cfg.cluster.memory_gb_per_device,
      checkpoint_dir=str(out_dir / "checkpoints"), checkpoint_every=cfg.runtime.checkpoint_every,
      background_checkpoint_dir=str(out_dir / "background_checkpoint"),
      progress=cfg.runtime.progress, seed=cfg.seed)
  if processes is None:
    summary = training.check_background(training.train_spec(
        spec, job_devices(cfg.runtime.num_devices), log_fn=run.log, on_start=start_writing))
  else:
    start_writing()
    print(f"training on {processes} pinned processes, one core and one CPU device each "
          f"(background {cfg.background.name}, slowdown cap {cfg.background.slowdown_cap})")
    summary = training.train_pinned(spec, processes)
    replay_metrics(run, out_dir)
  png = summary.pop("gantt", None)
  if png:
    run.log_image("gantt", png)
  if not summary.get("background_failures"):
    summary.pop("background_errors", None)
  summary = {"model": cfg.model.name, "plan": cfg.plan, "num_devices": g,
             "processes": processes or 1, "cpu_cores": host_cores(processes, cfg),
             "global_batch": batch, **summary}
  run.summary({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
  print(f"trained {cfg.model.name} to step {summary['final_step']} in {summary['stages']} "
        f"stage(s); outputs: {out_dir}")
  return summary


def host_cores(processes: int | None, cfg: TrainConfig) -> int | None:
  """The cores the job's CPU devices ran on (None on accelerators): with more devices than
  cores in one process the devices share cores and step times are not a device's."""
  from dp_jax.runtime.local_devices import cpu_cores

  on_cpu = processes is not None or job_devices(cfg.runtime.num_devices)[0].platform == "cpu"
  return cpu_cores() if on_cpu else None


def pinned_processes(cfg: TrainConfig) -> int | None:
  """Pinned processes for this job (one device each), or None to train in this process.

  Pinned: a background job on a CPU cluster, unless runtime.share_cores or a multi-process
  job configured by the user; more devices than cores is refused (training.honest_processes).
  """
  from dp_jax.config import workflow
  from dp_jax.runtime import distributed, training

  if not training.background_active(cfg.background):
    return None
  training.check_on_failure(cfg.background)
  if cfg.runtime.share_cores:
    return None
  if distributed.configured(cfg.runtime.distributed):
    return None
  if workflow.cluster_spec(cfg.cluster).device != "cpu":
    return None
  return training.honest_processes(cfg.runtime.num_devices, cfg.background.name)


def replay_metrics(run: Run, out_dir: Path) -> None:
  """metrics.jsonl of a pinned run (written by its process 0) into this run's W&B steps."""
  from dp_jax.runtime.train_loop import METRICS_FILE

  path = Path(out_dir) / METRICS_FILE
  if not path.is_file():
    return
  for line in path.read_text().splitlines():
    m = json.loads(line)
    run.log({f"train/{k}": v for k, v in m.items() if k != "step"}, m["step"])


def _plain(node: Any) -> Any:
  """A config node as plain JSON values (None stays None)."""
  from omegaconf import OmegaConf

  if node is None:
    return None
  return json.loads(json.dumps(OmegaConf.to_container(node, resolve=True, enum_to_str=True)))


main = hydra_app("train", TrainConfig)(train_task)


if __name__ == "__main__":
  main()
