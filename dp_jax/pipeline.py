"""python -m dp_jax.pipeline: the whole story on one config, end to end.

    ./scripts/run.sh                       # = python -m dp_jax.pipeline (default config)
    ./scripts/run.sh train.steps=30 paper.amplification_limit=inf

1. The paper's setting, on the calibrated A100 profile (predicted by the planner's cost
   model, simulated by the simulator; dp_jax.main_job.paper_setting): VGG16 at B=32 on one
   8-GPU NVLink server and on DGX A100 nodes (G = 8, 16, 32): burst vs data parallelism, GPU
   time saved, and cluster throughput with a background job in the idle devices.
2. On this machine, the validated way (dp_jax.measurement.local, as dp_jax.validate): one device
   per core, the local links and boundary costs calibrated, every layer profiled in context; a
   burst plan for these devices; the burst plan and data parallelism predicted (the planner's
   own evaluation) and run, interleaved, each timed step right after one of its own:
   measured / predicted for both.
3. The burst plan trained with the background job beside it under the slowdown cap, on one
   pinned process per core (dp_jax.orchestrator.jobs.train_pinned: an idle device is an idle
   core), on and off in alternating windows of steps so that other processes' load cancels:
   the measured foreground slowdown beside the simulated one, the background's steps, the
   host's load.
   Where the measured profile makes the plan data parallelism (no device idles), the job says
   so and runs the fastest plan with an idle device instead (planner.idle_device_limit); it
   fails, after writing what it did, when the background job ran no step or the measured
   slowdown broke the cap by more than the alone steps' own noise.
4. One summary in which every number is labelled predicted, simulated or measured
   (dp_jax.main_job.summary).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked, option
from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import write_json
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.hardware.cluster import ClusterConfig, to_record
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.main_job import paper_setting as paper
from dp_jax.main_job import summary as main_job
from dp_jax.main_job.paper_setting import PaperConfig, PaperSetting
from dp_jax.measurement import local
from dp_jax.measurement.local import LocalConfig
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.orchestrator.jobs import TrainSpec, train_pinned
from dp_jax.planner import PlanOptions, plan_for, plan_with, plan_with_idle_device
from dp_jax.planner.contract import check_plan, limit_label, model_record
from dp_jax.planner.options import PlannerConfig
from dp_jax.report.compare import validated_tolerance
from dp_jax.report.plan_report import (
  COLUMNS,
  comparisons,
  layer_rows,
  plot_devices_per_layer,
  print_plan,
)
from dp_jax.runtime.options import DataConfig, OptimizerConfig
from dp_jax.simulator.outputs import InterferenceConfig, simulate_and_write
from dp_jax.tracking.run import LoggerConfig, Run


@dataclass(frozen=True)
class MainJobLocalConfig(LocalConfig):
  """The local part: the local measurement validate makes (LocalConfig), and whether it runs."""

  enabled: bool = True


@dataclass(frozen=True)
class PipelineTrainConfig(Checked):
  """The train group: the burst plan trained with the background job on pinned processes (one
  per core): alone_steps first (compile, the timed step, then the windows' and the noise's
  steps), then `steps` in which the background job is on for window_steps steps, off for as
  many, and so on: the slowdown compares steps side by side in time, so a change in the
  machine's load from other processes cancels (orchestrator/scheduler.py, window_steps)."""

  GROUP = "train"

  alone_steps: int = option(10, low=3, integer=True)
  steps: int = option(24, low=0, integer=True)
  window_steps: int = option(4, low=1, integer=True)
  learning_rate: float = option(0.01, low=0, low_open=True)
  enabled: bool = True


@dataclass(frozen=True)
class PipelineConfig(Checked):
  """python -m dp_jax.pipeline: the paper's A100 setting, then profile -> plan -> simulate ->
  train on the local devices (cluster: this machine's base spec; the calibration replaces its
  links; iterations: simulated after a warm-up one)."""

  model: ModelConfig = REQUIRED
  cluster: ClusterConfig = REQUIRED
  planner: PlannerConfig = field(default_factory=PlannerConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  interference: InterferenceConfig = field(default_factory=InterferenceConfig)
  local: MainJobLocalConfig = field(default_factory=MainJobLocalConfig)
  train: PipelineTrainConfig = field(default_factory=PipelineTrainConfig)
  paper: PaperConfig = field(default_factory=PaperConfig)
  batch_size: int = option(32, low=1, integer=True)
  iterations: int = option(4, low=1, integer=True)
  seed: int = 0


@dataclass(frozen=True)
class PipelineInputs:
  """What the typed config describes for the main job's parts: the paper's clusters, the local
  plan's options, whether each part runs, and what the summary's words name."""

  cfg: PipelineConfig
  paper: tuple[PaperSetting, ...] | None  # None: paper.enabled=false
  options: PlanOptions  # the local plan's (G: the local devices', set once they are known)
  training: PipelineTrainConfig | None  # None: train.enabled=false or no background job
  facts: main_job.MainJobFacts

  @classmethod
  def of(cls, cfg: PipelineConfig) -> PipelineInputs:
    clusters = paper.settings(cfg.paper, cfg.planner)  # a bad cluster or G fails here
    # XLA:CPU runs a stage's gradient all-reduce after its backward, not beside it (as validate)
    options = PlanOptions.of(cfg.planner.replace(overlap_allreduce=False), 1, cfg.batch_size)
    training = cfg.train if cfg.train.enabled and cfg.background.active else None
    return cls(cfg, clusters if cfg.paper.enabled else None, options, training,
               main_job.MainJobFacts(cfg.paper.model, cfg.paper.batch_size,
                                     options.amplification_limit, cfg.background))


def pipeline_task(cfg: PipelineConfig, run: Run) -> dict[str, Any]:
  """The paper's A100 setting, then the local run; writes summary.json and the plots."""
  started = time.perf_counter()
  inputs = PipelineInputs.of(cfg)
  out_dir = run.output_dir
  if cfg.local.enabled:
    local.start_host_devices(cfg.local.host_devices())  # before JAX starts
  run.begin()
  facts = inputs.facts

  def header(name: str, what: str) -> None:
    main_job.header(name, what, time.perf_counter() - started)

  rows, fair = [], []
  if inputs.paper is not None:
    study = cfg.paper
    header("A100", f"{study.model} B={study.batch_size} on the calibrated A100 profile, "
                   f"amplification limit {study.amplification_limit} (predicted / simulated)")
    rows, fair = paper.run(study, inputs.paper, cfg.background, cfg.interference,
                           cfg.iterations, out_dir / "a100", cfg.seed)
    run.log_table("a100_burst_vs_data_parallel", list(paper.COLUMNS.values()),
                  [[r[k] for k in paper.COLUMNS] for r in rows])
  measured: main_job.Measured = {}
  plots: dict[str, str] = {}
  if cfg.local.enabled:
    try:
      local_part(inputs, out_dir, run, header, measured, plots)
    except UserError as e:  # what was done before the failure is kept
      write_json(out_dir / "summary.json", main_job.summary(facts, rows, fair, measured, plots))
      raise UserError(f"{e} (what was done: {out_dir / 'summary.json'})") from None
  for key, path in plots.items():
    run.log_image(key, path)
  main_job.print_summary(facts, rows, fair, measured, plots)
  write_json(out_dir / "summary.json", main_job.summary(facts, rows, fair, measured, plots))
  seconds = time.perf_counter() - started
  print(f"main job done in {seconds:.0f} s (measured); outputs: {out_dir}")
  return main_job.flat(rows, measured, seconds)


def local_part(inputs: PipelineInputs, out_dir: Path, run: Run, header: local.Announce,
               measured: main_job.Measured, plots: dict[str, str]) -> None:
  """Calibrate, profile in context, plan, predict and time burst vs data parallelism, simulate,
  then train the burst plan with the background job on pinned processes.

  Fills `measured` ({quantity: (value, kind)}) and `plots` as it goes (kept if a later part
  fails).
  """
  cfg = inputs.cfg
  model, options = cfg.model, cfg.local
  setup = local.prepare(options, model, cfg.cluster, inputs.options, seed=cfg.seed,
                        announce=header)
  graph, profile, cluster, g = setup.graph, setup.profile, setup.cluster, setup.num_devices
  b = setup.options.global_batch
  setup.profile.save(out_dir / "profile.json")
  header("plan", f"B={b} on {g} local devices")
  record = {"model": model_record(graph, model.options), "cluster_record": to_record(cluster, g)}
  limit = None
  if inputs.training is None:
    plan = plan_for(graph, profile, cluster, setup.options, **record)
  else:  # the background job needs an idle device
    plan, limit = plan_with_idle_device(graph, profile, cluster, setup.options, **record)
  planned_dp = limit is not None
  if planned_dp:
    print(f"At amplification limit {limit_label(setup.options.amplification_limit)} the plan "
          f"is data parallelism on all {g} devices (no device idles): running the fastest plan "
          f"with an idle device instead, at limit {limit_label(limit)}.")
  plan_options = (replace(setup.options, amplification_limit=limit) if planned_dp else
                  setup.options)
  plan = check_plan(plan, graph, available_devices=g, global_batch=b)  # once: timed, trained
  plan.save(out_dir / "plan.json")
  rows = layer_rows(plan)
  fair = comparisons(graph, profile, cluster, plan, validated_tolerance(cluster.device))
  print_plan(plan, rows, fair)
  run.log_table("plan_layers", COLUMNS, rows)
  plots["devices_per_layer"] = str(plot_devices_per_layer(plan, out_dir / "devices_per_layer.png",
                                                          fair))
  # the plans as they are (devices, weight shardings, stages), predicted and timed alike
  plans = {"burst": plan, "data_parallel": check_plan(plan_with(
      graph, profile, cluster, replace(plan_options, name="data_parallel")), graph,
      available_devices=g, global_batch=b)}
  measured.update(main_job.plan_quantities(graph, plan, g, b,
                                           limit=plan_options.amplification_limit,
                                           planned_data_parallel=planned_dp))
  predicted = {name: local.predicted_step(graph, profile, cluster, plan_options,
                                           p)["predicted_ms"] for name, p in plans.items()}
  header("measure", f"burst and data parallelism, {options.warmup} warm-up steps, then "
                    f"{options.steps} rounds of {options.runs_per_turn} steps in a row (last "
                    "timed)")
  timings = local.time_plans(model, list(plans.values()), setup.devices, options,
                             group=len(plans), seed=cfg.seed)
  measured.update(main_job.timed_quantities(predicted, {
      name: t.ms(options.statistic) for name, t in zip(plans, timings, strict=True)}))
  if inputs.training is None:
    return
  bg = cfg.background
  header("simulate", f"background {bg.name}, slowdown cap {bg.cap:.0%}, on the in-context "
                     "profile")
  m = simulate_local(inputs, setup, plan, out_dir / "simulated", plots)
  write_json(out_dir / "simulation.json", m)
  measured.update(main_job.simulated_quantities(m))
  tr = inputs.training
  name = "the fastest plan with an idle device" if planned_dp else "the burst plan"
  header("train", f"{name} on {g} pinned processes (one core each): {tr.alone_steps} "
                  f"steps alone, then {tr.steps} with background {bg.name} on and off in "
                  f"windows of {tr.window_steps} under cap {bg.cap:.0%}")
  trained = train_pinned(TrainSpec(
      model=model, plan=plan, steps=tr.alone_steps + tr.steps, output_dir=str(out_dir / "train"),
      optimizer=OptimizerConfig("sgd", tr.learning_rate, 0.9),
      data=DataConfig("synthetic", seed=cfg.seed), background=bg, alone_steps=tr.alone_steps,
      window_steps=tr.window_steps,
      memory_gb_per_device=cfg.cluster.memory_gb_per_device, seed=cfg.seed), g)
  if trained.get("gantt"):
    plots["measured_gantt"] = trained["gantt"]
  measured.update(main_job.trained_quantities(trained, bg.cap))
  failure = main_job.background_failure(bg, measured)
  if failure is not None:
    raise UserError(failure)


def simulate_local(inputs: PipelineInputs, setup: local.LocalSetup, plan, out_dir: Path,
                   plots: dict[str, str]) -> dict[str, Any]:
  """The burst plan simulated alone and with the background job on the in-context profile (a
  job of another model: on its analytic profile of this device, the roofline of
  dp_jax/hardware/devices.py; the calibrated profile is of GPUs); its metrics."""
  cfg = inputs.cfg
  bg, cluster = cfg.background, setup.cluster
  job_graph = job_profile = None
  if bg.model is not None:  # another model than the foreground's
    job_graph = bg.model.graph(cfg.seed)
    job_profile = ProfileConfig(source="analytic", dtype=bg.model.dtype).for_cluster(
        job_graph, cluster.device, bg.batch_per_device)
  sim = simulate_and_write(setup.graph, setup.profile, cluster, plan, out_dir, background=bg,
                           interference=cfg.interference, iterations=cfg.iterations,
                           tolerance=validated_tolerance(cluster.device), job_graph=job_graph,
                           job_profile=job_profile)
  plots["simulated_gantt"] = sim["gantt"]
  return sim["metrics"]


main = hydra_app("pipeline", PipelineConfig)(pipeline_task)


if __name__ == "__main__":
  run_app_module("dp_jax.pipeline")
