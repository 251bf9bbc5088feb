"""python -m dp_jax.pipeline: the whole story on one config, end to end.

    ./scripts/run.sh                       # = python -m dp_jax.pipeline (default config)
    ./scripts/run.sh train.steps=30 paper.amplification_limit=inf

1. The paper's setting, on the calibrated A100 profile (predicted by the planner's cost
   model, simulated by the simulator): VGG16 at B=32 on one 8-GPU NVLink server and on DGX A100
   nodes (G = 8, 16, 32): burst vs data parallelism, GPU time saved, and cluster throughput with
   a background job in the idle devices.
2. On this machine, the validated way (as dp_jax.validate): one device per core, the local
   links and boundary costs calibrated (dp_jax.profiling.local_links), every layer profiled in
   context (dp_jax.profiling.in_context); a burst plan for these devices; the burst plan and
   data parallelism predicted (dp_jax.config.workflow.predicted_step) and run, interleaved, each
   timed step
   right after one of its own (dp_jax.runtime.plan_timing): measured / predicted for both.
3. The burst plan trained with the background job beside it under the slowdown cap, on one
   pinned process per core (dp_jax.runtime.training.train_pinned: an idle device is an idle core):
   the measured foreground slowdown beside the simulated one, the background's steps.
4. One summary in which every number is labelled predicted, simulated or measured.
"""

from __future__ import annotations

import time
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
  InterferenceConfig,
  LoggerConfig,
  ModelConfig,
  PlannerConfig,
)
from dp_jax.tracking.run import Run


class Statistic(str, Enum):  # noqa: UP042 - the style of dp_jax/config/schema.py
  median = "median"
  min = "min"


@dataclass
class LocalConfig:
  """The local part's devices, calibration, in-context profile and timed steps (validate's)."""

  enabled: bool = True
  num_devices: int | None = None  # None: one per core (more would share cores)
  timed_steps: int = 10  # timed rounds per plan (burst, data parallelism)
  warmup: int = 2  # untimed steps per plan (the first compiles)
  runs_per_turn: int = 2  # a plan's steps in a row, the last timed (as in training)
  statistic: Statistic = Statistic.min  # of a prefix's rounds and of a plan's timed steps
  profile_repeats: int = 3
  profile_passes: int = 2
  profile_cuts: int = 3
  refresh_calibration: bool = False
  cache_dir: str = ".cache/dp_jax/profiles"


@dataclass
class PipelineTrainConfig:
  """The burst plan trained with the background job on pinned processes (one per core)."""

  alone_steps: int = 10  # first: compile, timed step, then the windows' and the noise's steps
  steps: int = 20  # then with the background job
  learning_rate: float = 0.01
  enabled: bool = True


@dataclass
class PaperSetting:
  """One cluster of the paper's comparison: a cluster config (conf/cluster/) and G."""

  cluster: str = MISSING
  num_devices: int = MISSING


@dataclass
class PaperConfig:
  """The paper's setting on the calibrated A100 profile (predicted and simulated, no JAX run)."""

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
  background: BackgroundConfig = field(default_factory=BackgroundConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  interference: InterferenceConfig = field(default_factory=InterferenceConfig)
  local: LocalConfig = field(default_factory=LocalConfig)
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

  from dp_jax.config import workflow
  from dp_jax.runtime import local_devices

  out_dir = Path(HydraConfig.get().runtime.output_dir)
  for setting in cfg.paper.settings:  # a bad cluster name or G fails before any work
    workflow.job_devices({"num_devices": setting.num_devices},
                         workflow.cluster_spec(workflow.cluster_config(setting.cluster)))
  if cfg.local.enabled:
    check_local(cfg)
    # one host device per core (validate's devices), before JAX starts
    local_devices.set_host_device_count(
        local_devices.honest_device_count(cfg.local.num_devices))
  run.begin()
  paper, fair = paper_rows(cfg, out_dir / "a100") if cfg.paper.enabled else ([], [])
  if paper:
    run.log_table("a100_burst_vs_data_parallel", PAPER_COLUMNS, paper)
  local: dict[str, tuple[Any, str]] = {}
  plots: dict[str, str] = {}

  def write_summary() -> dict[str, Any]:
    summary = {"a100": [dict(zip(PAPER_COLUMNS, r, strict=True)) for r in paper],
               "a100_fair_comparison": fair,
               "local": {k: {"value": v, "kind": kind} for k, (v, kind) in local.items()},
               "plots": plots, "story": story(cfg, paper, local)}
    write_json(out_dir / "summary.json", summary)
    return summary

  if cfg.local.enabled:
    try:
      local_run(cfg, out_dir, run, local, plots)
    except UserError:
      write_summary()  # what was done before the failure is kept
      raise
  for key, path in plots.items():
    run.log_image(key, path)
  print_summary(cfg, paper, fair, local, plots)
  write_summary()
  seconds = time.perf_counter() - _STARTED
  print(f"main job done in {seconds:.0f} s (measured); outputs: {out_dir}")
  flat = {"job_seconds": seconds, **{f"local/{k}": v for k, (v, _) in local.items()}}
  for r in paper:
    flat[f"a100/{r[0]}_g{r[1]}/speedup"] = r[4]
    flat[f"a100/{r[0]}_g{r[1]}/cluster_throughput_vs_dp"] = r[7]
  return flat


def check_local(cfg: PipelineConfig) -> None:
  """One-line errors for the local part's options, before any work."""
  lc = cfg.local
  if lc.timed_steps < 1 or lc.warmup < 0 or lc.runs_per_turn < 1:
    raise UserError("local.timed_steps and local.runs_per_turn must be >= 1, local.warmup >= 0")
  if cfg.train.alone_steps < 3:
    raise UserError(f"train.alone_steps={cfg.train.alone_steps} must be >= 3 (compile, the timed "
                    "step, then the steps that predict the idle windows)")
  from dp_jax.runtime import training

  if training.background_active(cfg.background):
    training.check_on_failure(cfg.background)


def paper_rows(cfg: PipelineConfig, out_dir: Path) -> tuple[list[list[Any]], list[str]]:
  """Burst vs data parallelism per paper setting, on the calibrated profile (one row each), and each
  setting's simulated fair comparison in words (the matched baseline first)."""
  from omegaconf import OmegaConf

  from dp_jax.config import workflow
  from dp_jax.models import zoo
  from dp_jax.profiling.sources import load_profile, profile_batches
  from dp_jax.sim.report import simulate_and_write

  paper = cfg.paper
  model_cfg = OmegaConf.create({"name": paper.model})
  graph = zoo.graph_of(model_cfg, seed=cfg.seed)
  b = int(paper.batch_size)
  profile = load_profile({"source": "calibrated"}, graph, "A100-SXM4-40GB",
                         profile_batches(b, cfg.background.batch_per_device))
  planner = OmegaConf.merge(cfg.planner, {"name": "burst",
                                           "amplification_limit": paper.amplification_limit})
  sim_cfg = OmegaConf.merge(cfg, {"batch_size": b, "background": {"model": None}})
  _step("A100", f"{paper.model} B={b} on the calibrated A100 profile, amplification limit "
                f"{paper.amplification_limit} (predicted / simulated)")
  rows, fair = [], []
  for setting in paper.settings:
    cluster_cfg = workflow.cluster_config(setting.cluster)
    cluster = workflow.cluster_spec(cluster_cfg)
    g = int(setting.num_devices)
    plan = workflow.make_plan_from_config(planner, graph, profile, cluster, num_devices=g,
                                          global_batch=b, model_cfg=model_cfg,
                                          cluster_cfg={**cluster_cfg, "num_devices": g})
    folder = out_dir / f"{setting.cluster}_g{g}"
    plan.save(folder / "plan.json")
    m = simulate_and_write(sim_cfg, graph, profile, cluster, plan, folder)["metrics"]
    p = plan.predicted
    rows.append([setting.cluster, g, p["iteration_ms"], p["data_parallel_iteration_ms"],
                 p["data_parallel_iteration_ms"] / p["iteration_ms"],
                 1 - p["gpu_ms"] / p["data_parallel_gpu_ms"],
                 m.get("background_samples_per_s"), m.get("cluster_throughput_vs_data_parallel"),
                 _matched(m)])
    fair.append(f"{setting.cluster} G={g}: {m['fair_comparison']}")
  return rows, fair


def _matched(m: dict[str, Any]) -> str | None:
  """Cluster throughput against the matched baseline (the best data parallelism plus background
  over every d whose foreground is within the tolerance of the burst foreground), naming d."""
  ratio, d = (m.get("cluster_throughput_vs_matched_data_parallel"),
              m.get("matched_data_parallel_devices"))
  if ratio is None:
    return "no DP within tolerance" if "matched_data_parallel_note" in m else None
  return f"{ratio:.2f}x (DP on {d})"


def local_run(cfg: PipelineConfig, out_dir: Path, run: Run, local: dict[str, tuple[Any, str]],
              plots: dict[str, str]) -> None:
  """Calibrate, profile in context, plan, predict and time burst vs data parallelism, simulate,
  then train the burst plan with the background job on pinned processes.

  Fills `local` ({quantity: (value, kind)}) and `plots` as it goes (kept if a later part fails).
  """
  from omegaconf import OmegaConf

  from dp_jax.config import workflow
  from dp_jax.models import zoo
  from dp_jax.planner import candidate_counts, data_parallel_plan
  from dp_jax.planner.options import PlanOptions
  from dp_jax.profiling.in_context import in_context_profile
  from dp_jax.profiling.local_links import load_or_calibrate
  from dp_jax.report.compare import tolerance_of
  from dp_jax.report.plan_report import (
    COLUMNS,
    comparisons,
    layer_rows,
    plot_devices_per_layer,
    print_plan,
  )
  from dp_jax.runtime import local_devices
  from dp_jax.runtime.compile_cache import use_compile_cache

  lc = cfg.local
  use_compile_cache(lc.cache_dir)  # compiling dominates the profile; reruns read it back
  stat = workflow.enum_value(lc.statistic)
  devices = local_devices.timing_devices(lc.num_devices)
  g, b = len(devices), int(cfg.batch_size)
  if g > b:
    raise UserError(f"batch_size={b} is smaller than the {g} local devices; raise it")
  # XLA:CPU runs a stage's gradient all-reduce after its backward, not beside it (as validate)
  cfg = OmegaConf.merge(cfg, {"planner": {"overlap_allreduce": False}})
  _step("calibrate", f"{g} {devices[0].platform} devices, one per core: links, dispatch, update")
  cal, cal_path, fresh = load_or_calibrate(lc.cache_dir, devices, refresh=lc.refresh_calibration)
  print(f"calibration ({'measured now' if fresh else 'cached'}: {cal_path}): all-reduce "
        f"{cal.allreduce_GBps:.2f} GB/s, dispatch {cal.dispatch_us:.0f} us, "
        f"{cal.stage_us:.0f} us per added stage")
  cluster_cfg = {**OmegaConf.to_container(cfg.cluster, resolve=True), "num_devices": g}
  cluster = cal.cluster(workflow.cluster_spec(cfg.cluster))
  graph = zoo.graph_of(cfg.model, seed=cfg.seed)
  model = zoo.build(cfg.model, seed=cfg.seed)
  _step("profile", f"{graph.model}: {len(graph.nodes)} layers in context (the runtime's stage "
                   "programs on every prefix; cached)")
  counts = candidate_counts(PlanOptions(num_devices=g, global_batch=b, device_counts=(
      workflow.enum_value(cfg.planner.device_counts))))
  profile = in_context_profile(model, graph, b, counts, cache_dir=lc.cache_dir,
                               repeats=lc.profile_repeats, passes=lc.profile_passes,
                               cuts=lc.profile_cuts, statistic=stat, devices=devices,
                               runs_per_turn=lc.runs_per_turn, progress=print)
  del model
  profile.save(out_dir / "profile.json")
  _step("plan", f"B={b} on {g} local devices")
  plan = workflow.make_plan_from_config(cfg.planner, graph, profile, cluster, num_devices=g,
                                        global_batch=b, model_cfg=cfg.model,
                                        cluster_cfg=cluster_cfg)
  plan.save(out_dir / "plan.json")
  rows = layer_rows(plan)
  fair = comparisons(graph, profile, cluster, plan, tolerance_of(cfg, cluster.device))
  print_plan(plan, rows, fair)
  run.log_table("plan_layers", COLUMNS, rows)
  plots["devices_per_layer"] = str(plot_devices_per_layer(plan, out_dir / "devices_per_layer.png",
                                                          fair))
  opts = workflow.plan_options(cfg.planner, g, b)
  dp = data_parallel_plan(graph, profile, cluster, **opts).assignment()
  burst = plan.assignment()
  stages = {lp.extra.get("stage") for lp in plan.layers} - {None}
  local.update({
      "model": (f"{graph.model} {'x'.join(map(str, graph.input_shape))}", "config"),
      "devices": (g, "config"), "global_batch": (b, "config"),
      "plan_stages": (len(stages) or None, "predicted"),
      "burst_devices_per_layer": ("/".join(str(c) for c in sorted(
          {c for _, c in burst.values()}, reverse=True)), "predicted"),
      "devices_idle_in_some_layer": (idle_devices(burst, g), "predicted")})
  predicted = {name: workflow.predicted_step(graph, profile, cluster, cfg, a, g)
               for name, a in (("burst", burst), ("data_parallel", dp))}
  _step("measure", f"burst and data parallelism, {lc.warmup} warm-up steps, then "
                   f"{lc.timed_steps} rounds of {lc.runs_per_turn} steps in a row (last timed)")
  measured = time_assignments(cfg, graph, {"burst": burst, "data_parallel": dp}, devices, stat)
  for name in ("burst", "data_parallel"):
    p, m = predicted[name]["predicted_ms"], measured[name]
    local.update({f"{name}_predicted_ms": (p, "predicted"), f"{name}_measured_ms": (m, "measured"),
                  f"{name}_measured_over_predicted": (m / p, "measured")})
  local["burst_vs_data_parallel_measured"] = (
      measured["data_parallel"] / measured["burst"], "measured")
  if not training_enabled(cfg):
    return
  _step("simulate", f"background {cfg.background.name}, slowdown cap "
                    f"{cfg.background.slowdown_cap:.0%}, on the in-context profile")
  sim = simulate_plan(cfg, graph, profile, cluster, plan, out_dir / "simulated")
  m = sim["metrics"]
  write_json(out_dir / "simulation.json", m)
  plots["simulated_gantt"] = sim["gantt"]
  local.update({f"simulated_on_profile_{k}": (m[k], "simulated") for k in SIMULATED_KEYS
                if k in m})
  if m.get("alone_iteration_ms") and m.get("iteration_ms"):
    local["simulated_on_profile_slowdown"] = (m["iteration_ms"] / m["alone_iteration_ms"] - 1,
                                              "simulated")
  tc = cfg.train
  _step("train", f"the burst plan on {g} pinned processes (one core each): {tc.alone_steps} "
                 f"steps alone, then {tc.steps} with background {cfg.background.name} under "
                 f"cap {cfg.background.slowdown_cap:.0%}")
  trained = train_pinned(cfg, plan.to_json(), out_dir / "train", g)
  local.update({f"pinned_{k}" if k in PINNED_KEYS else k: (
      v, "simulated" if k.startswith("simulated") else "measured")
      for k, v in trained.items() if k in TRAINED_KEYS})
  if trained.get("gantt"):
    plots["measured_gantt"] = trained["gantt"]


TRAINED_KEYS = ("final_step", "loss_first", "final_loss", "measured_step_ms",
                "measured_step_ms_with_background", "foreground_slowdown",
                "background_steps", "background_samples_per_s", "background_failures",
                "background_pieces", "background_refused", "simulated_slowdown",
                "simulated_background_samples_per_s")
PINNED_KEYS = ("final_step", "measured_step_ms", "measured_step_ms_with_background")
SIMULATED_KEYS = ("alone_iteration_ms", "iteration_ms", "alone_idle_fraction",
                  "background_samples_per_s", "cluster_throughput_vs_data_parallel")


def idle_devices(assignment: dict[str, tuple[int, int]], g: int) -> int:
  """Devices some layer of the plan leaves idle: where a background job can run (0 when every
  layer uses all g devices, i.e. the plan is data parallelism on all g)."""
  from dp_jax.multiplex.policy import busy_in_every_layer

  return g - len(busy_in_every_layer(
      (range(first, first + count) for first, count in assignment.values()), g))


def training_enabled(cfg: PipelineConfig) -> bool:
  from dp_jax.runtime import training

  return bool(cfg.train.enabled) and training.background_active(cfg.background)


def time_assignments(cfg: PipelineConfig, graph, assignments: dict[str, Any], devices, stat: str
                     ) -> dict[str, float]:
  """Measured ms per step of each layer -> (first device, count) assignment, interleaved as
  validate times its plans (dp_jax.runtime.plan_timing.time_plans)."""
  import warnings

  from dp_jax.models import zoo
  from dp_jax.planner.plan import layout_plan
  from dp_jax.runtime.plan_timing import time_plans
  from dp_jax.runtime.stages import structure_graph

  lc, b, g = cfg.local, int(cfg.batch_size), len(devices)
  warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
  run_graph = structure_graph(zoo.build(cfg.model, seed=cfg.seed, abstract=True), cfg.model.name)
  layouts = [layout_plan(run_graph, {n: range(s, s + c) for n, (s, c) in a.items()},
                         global_batch=b, num_devices=g) for a in assignments.values()]
  timings = time_plans(lambda: zoo.build(cfg.model, seed=cfg.seed), run_graph, layouts, devices,
                       steps=lc.timed_steps, warmup=lc.warmup, group=len(layouts),
                       runs_per_turn=lc.runs_per_turn)
  return {name: t.ms(stat) for name, t in zip(assignments, timings, strict=True)}


def simulate_plan(cfg: PipelineConfig, graph, profile, cluster, plan,
                  out_dir: Path) -> dict[str, Any]:
  """Simulate the plan alone and with the background job; write metrics and the Gantt chart."""
  from dp_jax.sim.report import simulate_and_write

  out_dir.mkdir(parents=True, exist_ok=True)
  return simulate_and_write(cfg, graph, profile, cluster, plan, out_dir)


def train_pinned(cfg: PipelineConfig, plan: dict[str, Any], out_dir: Path,
                 processes: int) -> dict[str, Any]:
  """The burst plan trained on `processes` pinned processes with the background job."""
  import json

  from omegaconf import OmegaConf

  from dp_jax.runtime import training

  def plain(c):
    return json.loads(json.dumps(OmegaConf.to_container(c, resolve=True, enum_to_str=True)))

  tc = cfg.train
  spec = training.TrainSpec(
      model=plain(cfg.model), plan=plan, steps=tc.alone_steps + tc.steps,
      output_dir=str(out_dir), optimizer={"name": "sgd", "lr": tc.learning_rate,
                                          "momentum": 0.9},
      data={"source": "synthetic", "seed": cfg.seed}, background=plain(cfg.background),
      alone_steps=tc.alone_steps, memory_gb_per_device=cfg.cluster.memory_gb_per_device,
      seed=cfg.seed)
  return training.train_pinned(spec, processes)


def print_summary(cfg: PipelineConfig, paper: list[list[Any]], fair: list[str],
                  local: dict[str, tuple[Any, str]], plots: dict[str, str]) -> None:
  from rich.console import Console
  from rich.table import Table

  console = Console(width=150)
  if paper:
    t = Table(title=f"{cfg.paper.model}, B={cfg.paper.batch_size}, on the calibrated A100 profile: "
                    "burst vs data parallelism (DP)",
              caption="P: predicted by the cost model; S: simulated. Matched: the best DP on d "
                      "devices + background on the rest, over every d whose foreground is "
                      "within the comparison tolerance of the burst plan's.")
    for c in ("cluster", "G", "burst ms P", "DP ms P", "speed-up P", "GPU time saved P",
              "background samples/s S", "cluster / DP S", "cluster / matched DP S"):
      t.add_column(c, justify="left" if c == "cluster" else "right")
    for r in paper:
      t.add_row(r[0], str(r[1]), f"{r[2]:.2f}", f"{r[3]:.2f}", f"{r[4]:.2f}x", f"{r[5]:.0%}",
                _fmt(r[6]), _fmt(r[7], "x"), _fmt(r[8]))
    console.print(t)
    for line in fair:  # the fair baseline first (matched DP, fastest DP on <= G), then all G
      console.print(line)
  t = Table(title="on this machine's devices")
  for c in ("quantity", "value", "kind"):
    t.add_column(c, justify="right" if c == "value" else "left")
  for k, (v, kind) in local.items():
    t.add_row(k, _fmt(v), kind)
  console.print(t)
  for k, v in plots.items():
    console.print(f"{k}: {v}")
  print("\nIn plain words:")
  for line in story(cfg, paper, local):
    print(f"- {line}")


AGREE = (0.8, 1.25)  # measured / predicted counted as agreement


def story(cfg: PipelineConfig, paper: list[list[Any]],
          local: dict[str, tuple[Any, str]]) -> list[str]:
  """What was predicted on A100s, what was measured here, and whether they agree."""
  from dp_jax.report.compare import describe, tolerance_of

  out = []
  for r in paper:
    matched = (f"{_fmt(r[8])} the work of the matched data parallelism (with the background "
               "job on the GPUs it leaves)" if r[8] and not str(r[8]).startswith("no DP") else
               "no data parallelism on fewer GPUs is as fast (no matched baseline)")
    out.append(
        f"On A100s ({r[0]}, G={r[1]}; predicted on the calibrated profile): {cfg.paper.model} "
        f"B={cfg.paper.batch_size} takes {r[2]:.1f} ms per iteration as a burst plan and "
        f"{r[3]:.1f} ms as data parallelism on all {r[1]} GPUs ({r[4]:.2f}x), using "
        f"{r[5]:.0%} less GPU time; with a background job in the idle GPUs the cluster does "
        f"{matched} and {_fmt(r[7], 'x')} that of data parallelism alone on all GPUs "
        "(simulated).")
  v = {k: val for k, (val, _) in local.items()}
  if "burst_measured_ms" in v:
    ratios = {n: v[f"{n}_measured_over_predicted"] for n in ("burst", "data_parallel")}
    off = [n.replace("_", " ") for n, x in ratios.items() if not AGREE[0] <= x <= AGREE[1]]
    out.append(
        f"Here ({v['devices']} CPU devices, one per core; {v['model']}, B={v['global_batch']}): "
        f"the burst plan was predicted at {v['burst_predicted_ms']:.1f} ms per step and "
        f"measured at {v['burst_measured_ms']:.1f} ms (measured / predicted "
        f"{ratios['burst']:.2f}); data parallelism {v['data_parallel_predicted_ms']:.1f} ms "
        f"predicted, {v['data_parallel_measured_ms']:.1f} ms measured "
        f"({ratios['data_parallel']:.2f}). Measured, the burst plan against data "
        f"parallelism: {describe(v['burst_vs_data_parallel_measured'], tolerance_of(cfg, "cpu"))}.")
    out.append("Prediction and measurement agree within "
               f"{AGREE[0]:.2f}-{AGREE[1]:.2f}x for both plans." if not off else
               f"Prediction and measurement disagree (outside {AGREE[0]:.2f}-{AGREE[1]:.2f}x) "
               f"for: {', '.join(off)}.")
  if v.get("devices_idle_in_some_layer") == 0:
    out.append(
        f"The planner's plan here uses all {v['devices']} devices in every layer (it is data "
        "parallelism): no device is ever idle, so the background job had nowhere to run "
        "(0 background steps is that, not a failure). The measured profile decides it: a layer "
        "stays on fewer devices only where more would raise its GPU time beyond the "
        f"amplification limit ({cfg.planner.amplification_limit}x), and on a loaded machine the "
        "small layers' costs are noise; run the main job again on a quiet machine.")
  if "background_steps" in v:
    out.append(
        f"The background job {cfg.background.name} (batch {cfg.background.batch_per_device} per "
        f"device) beside the burst plan, on one pinned process per core, under the slowdown cap "
        f"{cfg.background.slowdown_cap:.0%}: measured foreground slowdown "
        f"{_pct(v.get('foreground_slowdown'))}, simulated {_pct(v.get('simulated_slowdown'))} "
        "(the simulator's policy on the measured alone step and pieces; on the in-context "
        f"profile {_pct(v.get('simulated_on_profile_slowdown'))}); "
        f"{v['background_steps']} background steps "
        f"({_fmt(v.get('background_samples_per_s'))} samples/s measured, "
        f"{_fmt(v.get('simulated_background_samples_per_s'))} simulated), "
        f"{v['background_failures']} failures.")
    over = v.get("foreground_slowdown")
    if over is not None and over > cfg.background.slowdown_cap:
      out.append(
          f"The measured slowdown is above the {cfg.background.slowdown_cap:.0%} cap: the policy "
          "tightens only on an excess that the alone steps' own noise cannot explain (a "
          "one-sided t test at 1%, dp_jax/multiplex/policy.py), so on short, noisy pinned steps "
          "the measured mean can pass the cap by that noise; `python -m dp_jax.train` on seconds-"
          "long steps holds it (docs/orchestrator.md).")
    if v.get("pinned_measured_step_ms") and v.get("burst_measured_ms"):
      out.append(
          f"On the pinned processes the burst step alone took "
          f"{v['pinned_measured_step_ms']:.0f} ms (measured; {v['burst_measured_ms']:.0f} ms in "
          f"one process): {_pinned_causes(v)}. The measured Gantt chart shows where; the "
          "slowdown above is against that step, not the one predicted.")
  return out


def _pinned_causes(v: dict[str, Any]) -> str:
  """Why the pinned processes' step differs from the in-process one, for this plan's shape."""
  counts = [int(c) for c in str(v.get("burst_devices_per_layer") or "").split("/") if c]
  causes = []
  if counts and max(counts) > 1 or (v.get("plan_stages") or 1) > 1:
    causes.append("their all-reduces and moves cross processes through gloo on localhost")
  if counts and min(counts) < v["devices"]:
    causes.append("each has one core, while in one process a stage on fewer devices than "
                  "cores also uses the idle cores (docs/validation.md, one device per core)")
  return "; ".join(causes) or "each is one process per core"


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{x:+.1%}"


def _fmt(v: Any, suffix: str = "") -> str:
  if v is None:
    return "-"
  return f"{v:.4g}{suffix}" if isinstance(v, float) else f"{v}{suffix}"


_STARTED = time.perf_counter()


def _step(name: str, what: str) -> None:
  """A header line: the part, what it does, the seconds since the job started."""
  from rich.console import Console

  Console(width=110).rule(f"[bold]{name}[/bold] ({time.perf_counter() - _STARTED:.0f} s): {what}")


main = hydra_app("pipeline", PipelineConfig)(pipeline_task)


if __name__ == "__main__":
  main()
