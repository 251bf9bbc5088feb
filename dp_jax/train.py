"""python -m dp_jax.train model=vgg16 plan=burst batch_size=32 steps=20

Trains a zoo model under a plan: `burst` (planned now for the local devices with the profile
and cluster configs), `data_parallel` (the baseline: every layer on every device) or a plan
JSON made elsewhere (it must fit the local device count). Writes plan.json, metrics.jsonl,
timeline.json (+ gantt.png) and orbax checkpoints under the run's output folder, and resumes
from the newest checkpoint there (rerun with the same hydra.run.dir).

On a CPU backend runtime.num_devices (default: the cluster's G, local_cpu's 8) sets the number
of XLA host devices; this module
imports nothing from JAX until the task has set XLA_FLAGS. With a background job on a CPU
cluster the job honours its slowdown cap: it trains on one pinned process per device (one core
each; default: one per core, dp_jax.orchestrator.jobs.train_pinned), and refuses more devices than
cores unless runtime.share_cores=true (one process, exact, the cap not honoured).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked, ConfigError, option
from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import read_json
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig, to_record
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.measurement import profiles
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.orchestrator import jobs as training
from dp_jax.orchestrator.jobs import TrainSpec
from dp_jax.planner import PlanOptions, plan_for
from dp_jax.planner.contract import (
  PLAN_SCHEMA,
  Plan,
  check_made_for,
  check_plan,
  data_parallel_layout_plan,
  model_record,
)
from dp_jax.planner.options import PlannerConfig
from dp_jax.runtime import distributed
from dp_jax.runtime.local_devices import cpu_cores, set_host_device_count
from dp_jax.runtime.options import DataConfig, OptimizerConfig, RuntimeConfig
from dp_jax.tracking.run import LoggerConfig, Run

log = logging.getLogger("dp_jax.train")
PLAN_MODES = ("burst", "data_parallel")
DEFAULT_BATCH = 32  # without batch_size and a plan file


@dataclass(frozen=True)
class TrainConfig(Checked):
  """python -m dp_jax.train: train a zoo model under a burst, data-parallel or given plan.

  cluster: a burst plan's cost model of the local devices; background: none trains alone;
  plan: burst | data_parallel | the path of a plan JSON; batch_size: None: a plan file's
  global batch, else 32; steps: in all.
  """

  model: ModelConfig = REQUIRED
  cluster: ClusterConfig = REQUIRED
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
  optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
  data: DataConfig = field(default_factory=DataConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)
  plan: str = "data_parallel"
  batch_size: int | None = option(None, low=1, integer=True)
  steps: int = option(10, low=0, integer=True)
  seed: int = 0

  def check(self) -> None:
    if self.plan not in PLAN_MODES and not Path(self.plan).is_file():
      raise ConfigError("plan", f"='{self.plan}' is neither {' nor '.join(PLAN_MODES)} nor an "
                        "existing plan JSON file")


@dataclass(frozen=True)
class TrainJob:
  """What the typed config describes beyond itself: the plan file read and the global batch
  it sets (before any work)."""

  cfg: TrainConfig
  plan_file: Plan | None
  global_batch: int

  @classmethod
  def of(cls, cfg: TrainConfig) -> TrainJob:
    plan_file = None if cfg.plan in PLAN_MODES else load_plan_file(cfg.plan)
    batch = cfg.batch_size if cfg.batch_size is not None else (
        plan_file.global_batch if plan_file is not None else DEFAULT_BATCH)
    return cls(cfg, plan_file, batch)


def load_plan_file(path: str) -> Plan:
  """The plan JSON `path` names, parsed (a placement: the planner's fields are optional)."""
  if not Path(path).is_file():
    raise UserError(f"plan '{path}' is neither {' nor '.join(PLAN_MODES)} nor an existing plan "
                    "JSON file")
  d = read_json(path, "plan")
  if isinstance(d, dict) and "schema" not in d:  # a file states its format, or is no plan
    raise UserError(f"plan file {path}: missing required field 'schema' (a plan file states its "
                    f"format, \"schema\": \"{PLAN_SCHEMA}\"); is it a dp_jax plan?")
  return Plan.from_json(d, where=str(path), planned=False)


def job_devices(requested: int | None):
  """The job's devices: the first runtime.num_devices of jax.devices() (all if None: on CPU
  the host devices host_device_count asked for)."""
  import jax  # JAX: only once the host device count is set (set_host_device_count)

  available = jax.devices()
  g = requested or len(available)
  if g > len(available):
    raise UserError(f"runtime.num_devices={g} but only {len(available)} "
                    f"{jax.default_backend()} device(s) exist; lower runtime.num_devices")
  return available[:g]


def host_device_count(runtime: RuntimeConfig, cluster: ClusterConfig) -> int | None:
  """The XLA host devices to ask for on a CPU cluster: runtime.num_devices, else the cluster's
  G (cluster.num_devices, or every device of the pod: local_cpu's 8); None elsewhere (an
  accelerator's devices are what they are)."""
  if runtime.num_devices is not None:
    return runtime.num_devices
  return cluster.job_devices if cluster.device == "cpu" else None


def one_stage_note(mode: str, plan: Plan) -> str | None:
  """A line when plan=burst made one stage: it then trains as data parallelism does."""
  if mode != "burst" or len(plan.stages) != 1:
    return None
  g = plan.num_devices
  if g == 1:
    return ("the burst plan is one stage on 1 device: nothing to give each layer; set "
            "runtime.num_devices (or cluster.num_devices) above 1")
  return (f"the burst plan is one stage on all {g} devices, i.e. data parallelism: under this "
          "cluster and profile no layer is faster on fewer devices")


def resolve_plan(job: TrainJob, graph: LayerGraph, g: int) -> Plan:
  """The plan of plan=burst | data_parallel | <file> for the model's `graph` on `g` devices,
  checked once (planner.contract.check_plan: layers, devices, batch, stages) and in graph
  order: what the job trains, and writes as plan.json."""
  cfg = job.cfg
  record = model_record(graph, cfg.model.options)
  b = job.global_batch
  if job.plan_file is not None:
    check_made_for(job.plan_file, record, f"plan {cfg.plan}")
    plan: Plan | dict[str, Any] = job.plan_file
  else:
    if g > b:
      raise UserError(f"batch_size={b} is smaller than runtime.num_devices={g}; every device "
                      "needs a sample")
    if cfg.plan == "data_parallel":
      plan = {**data_parallel_layout_plan(graph, global_batch=b, num_devices=g),
              "made_for": record}
    else:
      plan = burst_plan(job, graph, record, g)
  return check_plan(plan, graph, available_devices=g, global_batch=b)


def burst_plan(job: TrainJob, graph: LayerGraph, record: dict[str, Any], g: int) -> Plan:
  """A burst plan for the job's `g` devices (the configured profile and cluster)."""
  cfg = job.cfg
  profile = profiles.for_cluster(cfg.profile, graph, cfg.cluster.device, job.global_batch,
                                 model=cfg.model)
  return plan_for(graph, profile, cfg.cluster, PlanOptions.of(cfg.planner, g, job.global_batch),
                  model=record, cluster_record=to_record(cfg.cluster, g))


def same_plan_everywhere(plan: Plan) -> Plan:
  """Process 0's plan on every process of a multi-process job (unchanged in one).

  Each process plans for itself; a measured profile or a plan file that differs between hosts
  could give another plan, so process 0's is the one every process runs. A process whose own
  plan differed (beyond planner_seconds, the planner's wall time) says so in its log.
  """
  mine = json.loads(json.dumps(plan.to_json()))
  agreed = distributed.from_process_0(mine)
  if agreed == mine:
    return plan

  def what_runs(p: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in p.items() if k != "planner_seconds"}

  if what_runs(agreed) != what_runs(mine):
    log.warning("process %d planned differently from process 0 (a measured profile, or another "
                "plan file?); it runs process 0's plan", distributed.process_index())
  return Plan.from_json(agreed, "process 0's plan", planned=False)


def train_task(cfg: TrainConfig, run: Run) -> dict[str, Any]:
  """Plan (or load) a plan, train under it, write metrics, timeline and checkpoints."""
  job = TrainJob.of(cfg)
  model, background, runtime = cfg.model, cfg.background, cfg.runtime
  processes = pinned_processes(background, runtime, cfg.cluster.device)
  host_devices = host_device_count(runtime, cfg.cluster)
  if processes is None and host_devices is not None:
    set_host_device_count(host_devices)
  distributed.initialize(runtime.distributed)
  devices = None if processes else job_devices(runtime.num_devices)
  g = processes or len(devices)
  out_dir = run.output_dir  # one folder per job, also with several processes (cli.py)
  plan = same_plan_everywhere(resolve_plan(job, model.graph(cfg.seed), g))
  note = one_stage_note(cfg.plan, plan)
  if note:
    print(note)
  from dp_jax.runtime.train_loop import check_same_job  # JAX: once the device count is set

  check_same_job(out_dir, run.config, plan.to_json(), cfg.steps)  # a resume: the same job

  def start_writing() -> None:  # the checkpoint folder fits this job: files may be written now
    run.begin()
    if run.writes:  # process 0 of a multi-process job
      plan.save(out_dir / "plan.json")

  spec = TrainSpec(
      model=model, plan=plan, steps=cfg.steps, output_dir=str(out_dir),
      optimizer=cfg.optimizer, data=cfg.data, background=background,
      memory_gb_per_device=cfg.cluster.memory_gb_per_device,
      checkpoint_dir=str(out_dir / "checkpoints"), checkpoint_every=runtime.checkpoint_every,
      background_checkpoint_dir=str(out_dir / "background_checkpoint"),
      progress=runtime.progress, seed=cfg.seed)
  if processes is None:
    summary = training.check_background(training.train_spec(
        spec, devices, log_fn=run.log, on_start=start_writing))
  else:
    start_writing()
    print(f"training on {processes} pinned processes, one core and one CPU device each "
          f"(background {background.name}, slowdown cap {background.slowdown_cap})")
    summary = training.train_pinned(spec, processes)
    replay_metrics(run, out_dir)
  png = summary.pop("gantt", None)
  if png:
    run.log_image("gantt", png)
  if not summary.get("background_failures"):
    summary.pop("background_errors", None)
  summary = {"model": model.name, "plan": cfg.plan, "num_devices": g,
             "processes": processes or 1, "cpu_cores": host_cores(processes, devices),
             "global_batch": plan.global_batch, **summary}
  run.summary({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
  print(f"trained {model.name} to step {summary['final_step']} in {summary['stages']} "
        f"stage(s); outputs: {out_dir}")
  return summary


def host_cores(processes: int | None, devices) -> int | None:
  """The cores the job's CPU devices ran on (None on accelerators): with more devices than
  cores in one process the devices share cores and step times are not a device's."""
  on_cpu = processes is not None or devices[0].platform == "cpu"
  return cpu_cores() if on_cpu else None


def pinned_processes(background: BackgroundConfig, runtime: RuntimeConfig,
                     device: str) -> int | None:
  """Pinned processes for this job (one device each), or None to train in this process.

  Pinned: a background job on a CPU cluster, unless runtime.share_cores or a multi-process
  job configured by the user; more devices than cores is refused (training.honest_processes).
  """
  if (not background.active or runtime.share_cores or distributed.configured(runtime.distributed)
      or device != "cpu"):
    return None
  return training.honest_processes(runtime.num_devices, background.name)


def replay_metrics(run: Run, out_dir: Path) -> None:
  """metrics.jsonl of a pinned run (written by its process 0) into this run's W&B steps."""
  # JAX: train_loop imports it (its file name only)
  from dp_jax.runtime.train_loop import METRICS_FILE

  path = Path(out_dir) / METRICS_FILE
  if not path.is_file():
    return
  for line in path.read_text().splitlines():
    m = json.loads(line)
    run.log({f"train/{k}": v for k, v in m.items() if k != "step"}, m["step"])


main = hydra_app("train", TrainConfig)(train_task)


if __name__ == "__main__":
  run_app_module("dp_jax.train")
