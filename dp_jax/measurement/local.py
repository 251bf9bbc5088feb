"""The local measurement the validate app and the main job share, in one place: one device per
core, the local links calibrated, every layer profiled in context, plans (checked Plans: their
devices, shardings and stages) predicted by the planner's own evaluation and timed
interleaved, each timed step right after one of its own.

LocalConfig is the `local` group of both apps (one schema), LocalConfig its typed form, and
Statistic the one summary of repeated timings (min: contention only adds time; median).
Measuring imports JAX; naming the options does not (the apps import this module for its
schema before they set the host devices).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dp_jax.base.checks import Checked, option
from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.models.zoo import ModelConfig
from dp_jax.planner.contract import Plan, check_plan, layout_plan
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions, candidate_counts
from dp_jax.planner.sharded import plan_shardings
from dp_jax.runtime import local_devices
from dp_jax.runtime.stages import structure_graph

PROFILE_METHODS = ("in_context", "loaded")
Assignment = Mapping[str, tuple[int, int]]  # layer -> (first device, count)
Announce = Callable[[str, str], None]  # (part, what it does): a header before each part


@dataclass(frozen=True)
class LocalConfig(Checked):
  """The local group: the local devices, their calibration, the profile and the timed steps
  (the measurement of validate and the main job).

  num_devices: None: one per core (more would share cores); steps: timed rounds per plan;
  warmup: untimed steps per plan (the first compiles); runs_per_turn: a plan's (and a profiled
  program's) steps in a row, the last timed; statistic: of a prefix's rounds and of a plan's
  timed steps (min or median); profile: how layer times are measured (in_context: every
  prefix's fused stage program, dp_jax.measurement.in_context; loaded: every layer alone
  under its stage's load, dp_jax.measurement.loaded); profile_repeats: timed rounds per layer
  (prefix), count and pass; profile_passes: passes over all layers (prefixes), spreading
  samples over time; profile_cuts: stage boundaries measured as two-stage cuts (the rest
  interpolated).
  """

  GROUP = "local"

  num_devices: int | None = option(None, low=1, integer=True)
  steps: int = option(3, low=1, integer=True)
  warmup: int = option(1, low=0, integer=True)
  runs_per_turn: int = option(2, low=1, integer=True)
  statistic: str = option("min", choices=("min", "median"))
  profile: str = option("in_context", choices=PROFILE_METHODS)
  profile_repeats: int = option(2, low=1, integer=True)
  profile_passes: int = option(1, low=1, integer=True)
  profile_cuts: int = option(4, low=0, integer=True)
  refresh_calibration: bool = False
  cache_dir: str = ProfileConfig.cache_dir

  def host_devices(self) -> int:
    """Host devices to start: one per core, or local.num_devices (at most the cores: a
    one-line error, since devices sharing a core time nothing physical)."""
    return local_devices.honest_device_count(self.num_devices)


@dataclass(frozen=True)
class LocalSetup:
  """What the measurement runs on: the devices, the cluster with the calibrated links, the
  model's graph and its measured profile, and the planner's options at these devices."""

  devices: list
  calibration: Any  # dp_jax.measurement.local_links.LocalCalibration
  cluster: ClusterConfig
  graph: LayerGraph
  profile: ProfileTable
  options: PlanOptions  # num_devices: the devices'

  @property
  def num_devices(self) -> int:
    return len(self.devices)


def start_host_devices(count: int) -> None:
  """Ask for `count` host devices (LocalConfig.host_devices), before JAX starts; no effect
  once it has, or on an accelerator."""
  local_devices.set_host_device_count(count)


def timing_devices(options: LocalConfig) -> list:
  """The devices to time on (one per core on the CPU, else the first local.num_devices), with
  XLA's compile cache in local.cache_dir (the plans and the profile share programs)."""
  # JAX: measuring starts it, after start_host_devices
  from dp_jax.runtime.compile_cache import use_compile_cache

  use_compile_cache(options.cache_dir)
  # the runtime donates buffers a stage cannot always reuse on CPU; harmless, and noisy
  warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
  return local_devices.timing_devices(options.num_devices)


def at_devices(options: PlanOptions, devices: Sequence) -> PlanOptions:
  """`options` for the devices (G = their count), G checked against the batch (one line)."""
  g, b = len(devices), options.global_batch
  if g > b:
    raise UserError(f"batch_size={b} is smaller than the {g} local devices; raise it")
  return replace(options, num_devices=g)


def prepare(options: LocalConfig, model: ModelConfig, base: ClusterConfig,
            plan_options: PlanOptions, *, seed: int = 0,
            announce: Announce | None = None) -> LocalSetup:
  """The devices, the calibrated cluster (`base` with the measured links) and the model's
  profile measured on them (in context, or loaded)."""
  announce = announce or (lambda part, what: None)
  devices = timing_devices(options)
  plan_options = at_devices(plan_options, devices)
  g = len(devices)
  announce("calibrate", f"{g} {devices[0].platform} devices, one per core: links, dispatch, "
                        "update")
  calibration, cluster = calibrated_cluster(options, devices, base)
  graph = model.graph(seed)
  how = ("in context (the runtime's stage programs on every prefix; cached)"
         if options.profile == "in_context" else "each under its stage's load (cached)")
  announce("profile", f"{graph.model}: {len(graph.nodes)} layers {how}")
  profile = measured_profile(options, model, graph, plan_options, devices, seed)
  return LocalSetup(devices, calibration, cluster, graph, profile, plan_options)


def calibrated_cluster(options: LocalConfig, devices: Sequence,
                       base: ClusterConfig) -> tuple[Any, ClusterConfig]:
  """(the calibration, `base` with its links and stage terms): read from local.cache_dir, or
  measured now (local.refresh_calibration: always)."""
  # JAX: the calibration measures the devices
  from dp_jax.measurement.local_links import load_or_calibrate

  cal, path, fresh = load_or_calibrate(options.cache_dir, devices,
                                       refresh=options.refresh_calibration)
  print(f"calibration ({'measured now' if fresh else 'cached'}: {path}): all-reduce "
        f"{cal.allreduce_GBps:.2f} GB/s, transfer latency {cal.transfer_latency_us:.0f} us, "
        f"dispatch {cal.dispatch_us:.0f} us, {cal.stage_us:.0f} us per added stage, "
        f"update {cal.update_ns_per_param:.2f} ns/param")
  return cal, cal.cluster(base)


def measured_profile(options: LocalConfig, model: ModelConfig, graph: LayerGraph,
                     plan_options: PlanOptions, devices: Sequence, seed: int = 0
                     ) -> ProfileTable:
  """Every layer's times at each per-device batch a plan on these devices can use: in context
  (every prefix's stage program, and the boundaries at local.profile_cuts cuts) or loaded
  (each layer alone under its stage's load); cached under local.cache_dir."""
  counts = candidate_counts(plan_options)
  b, built = plan_options.global_batch, model.build(seed)
  common = dict(cache_dir=options.cache_dir, repeats=options.profile_repeats,
                passes=options.profile_passes, statistic=options.statistic,
                devices=list(devices), runs_per_turn=options.runs_per_turn)
  if options.profile == "in_context":
    # JAX: profiling measures the devices
    from dp_jax.measurement.in_context import in_context_profile

    return in_context_profile(built, graph, b, counts, cuts=options.profile_cuts, progress=print,
                              **common)
  # JAX: profiling measures the devices
  from dp_jax.measurement.loaded import loaded_profile

  return loaded_profile(built, graph, b, counts, **common)


def layout_plans(graph: LayerGraph, assignments: Sequence[Assignment], *, global_batch: int,
                 num_devices: int) -> list[Plan]:
  """Checked plans of layer -> (first device, count) assignments (every layer split by
  samples; validate's random plans)."""
  return [check_plan(layout_plan(graph, {n: range(s, s + c) for n, (s, c) in a.items()},
                                 global_batch=global_batch, num_devices=num_devices),
                     graph, available_devices=num_devices) for a in assignments]


def predicted_step(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                   options: PlanOptions, plan: Plan) -> dict[str, Any]:
  """A plan's predicted step (its devices, weight shardings and stages), in ms with its parts:
  the planner's own evaluation on the (calibrated) cluster and the profile under `options`
  (dp_jax.planner.evaluate: compute with the update unless profiled, all-reduce unless
  profiled, moves, per-stage launches and boundaries)."""
  ev = evaluate(build_cost_model(graph, profile, cluster, options), plan.assignment(),
                plan_shardings(plan), plan.stage_layers)
  n = len(ev.stages)
  host = n * cluster.program_launch_us / 1e3 + (n - 1) * cluster.stage_boundary_us / 1e3
  return {"predicted_ms": ev.iteration_ms, "stages": n,
          "compute_ms": sum(s.compute_ms for s in ev.stages),
          "sync_ms": sum(s.sync_ms for s in ev.stages),
          "move_ms": sum(m.ms for m in ev.moves), "overhead_ms": ev.overhead_ms,
          "boundary_ms": ev.overhead_ms - host, "update_ms": ev.update_ms}


def time_plans(model: ModelConfig, plans: Sequence[Plan], devices: Sequence,
               options: LocalConfig, *, group: int, seed: int = 0,
               progress: Callable[[str], None] | None = None) -> list:
  """The runtime's timed steps of each checked plan, as it is (its devices, weight shardings
  and stages; dp_jax.measurement.plan_timing.PlanTiming), `group` plans interleaved at a time:
  local.warmup untimed steps each, then local.steps rounds in which each plan runs
  local.runs_per_turn steps in a row, the last timed."""
  # JAX: timing runs the plans
  from dp_jax.measurement import plan_timing

  run_graph = structure_graph(model.build(seed, abstract=True), model.name)
  return plan_timing.time_plans(lambda: model.build(seed), run_graph, list(plans), list(devices),
                                steps=options.steps, warmup=options.warmup, group=group,
                                runs_per_turn=options.runs_per_turn, progress=progress)

