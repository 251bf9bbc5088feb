"""The paper's setting on the calibrated profile (the main job's first part; predicted by the
planner's cost model, simulated by the simulator, no JAX run): a model at one global batch on
each of a few A100 clusters, burst vs data parallelism, GPU time saved, and cluster throughput
with the background job in the idle devices.

PaperConfig is the main job's `paper` group.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked, option
from dp_jax.hardware.cluster import ClusterConfig, named_cluster, to_record
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.models.zoo import MODEL_NAMES, ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.planner import PlanOptions, plan_for
from dp_jax.planner.contract import model_record
from dp_jax.planner.options import PlannerConfig
from dp_jax.report.compare import validated_tolerance
from dp_jax.report.plan_report import comparisons
from dp_jax.simulator.outputs import InterferenceConfig, simulate_and_write

# A setting's row: key -> its label (the summary's JSON and the printed table name them so).
COLUMNS = {
    "cluster": "cluster", "G": "G",
    "plan_data_parallel_devices": "the plan is data parallelism on (devices; predicted)",
    "plan_ms": "plan ms (predicted)",
    "fastest_dp_devices": "fastest DP on <= G: devices (predicted)",
    "fastest_dp_ms": "fastest DP ms (predicted)",
    "speedup_vs_fastest_dp": "plan speed-up vs fastest DP (predicted)",
    "dp_all_ms": "DP on all G ms (predicted)",
    "cheapest_dp_devices": "cheapest DP within tolerance of the fastest: devices (predicted)",
    "saved_vs_cheapest_dp": "GPU time saved vs cheapest DP within tolerance (predicted)",
    "saved_vs_dp_all": "GPU time saved vs DP on all G (predicted)",
    "background_samples_per_s": "background samples/s (simulated)",
    "cluster_vs_dp_all": "cluster throughput / DP on all G alone (simulated)",
    "cluster_vs_matched": "cluster throughput / matched DP + background (simulated)",
    "matched_dp_devices": "matched DP: devices (simulated)",
    "tolerance": "a tie within (the validated tolerance)",
    "basis": "rests on"}
CALIBRATED = ProfileConfig(source="calibrated")


@dataclass(frozen=True)
class PaperSettingConfig(Checked):
  """One cluster of the paper's comparison: a cluster option (conf/cluster/) and G."""

  GROUP = "paper.settings"

  cluster: str = REQUIRED
  num_devices: int = option(REQUIRED, low=1, integer=True)


@dataclass(frozen=True)
class PaperConfig(Checked):
  """The paper group: the paper's setting on the calibrated A100 profile (predicted and
  simulated, no JAX run): a zoo model at one global batch, burst at one amplification limit,
  on each of a few clusters."""

  GROUP = "paper"

  enabled: bool = True
  model: str = option("vgg16", choices=MODEL_NAMES)
  batch_size: int = option(32, low=1, integer=True)
  amplification_limit: float = option(2.0, low=1, inf=True)
  settings: tuple[PaperSettingConfig, ...] = (
      PaperSettingConfig("a100_nvlink_8", 8), PaperSettingConfig("dgx_a100", 16),
      PaperSettingConfig("dgx_a100", 32))


@dataclass(frozen=True)
class PaperSetting:
  """One cluster of the comparison: its config name, the pod, and the planner's options at its
  G (the paper's batch, burst at the paper's amplification limit)."""

  name: str
  cluster: ClusterConfig
  options: PlanOptions

  @property
  def num_devices(self) -> int:
    return self.options.num_devices


def settings(paper: PaperConfig, planner: PlannerConfig) -> tuple[PaperSetting, ...]:
  """The paper's clusters at their G, planned with `planner`'s options as burst at the paper's
  amplification limit (whatever planner.name and its limit); a bad cluster or G fails here."""
  burst = planner.replace(name="burst", amplification_limit=paper.amplification_limit)
  return tuple(PaperSetting(s.cluster, c := named_cluster(s.cluster, num_devices=s.num_devices),
                            PlanOptions.of(burst, c.job_devices, paper.batch_size))
               for s in paper.settings)


def run(paper: PaperConfig, clusters: tuple[PaperSetting, ...], background: BackgroundConfig,
        interference: InterferenceConfig, iterations: int, out_dir: Path,
        seed: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
  """Burst vs data parallelism per setting on the calibrated profile (one row each, keyed as
  COLUMNS), and each setting's simulated fair comparison in words; every setting's plan,
  metrics, timeline and Gantt chart under out_dir/<cluster>_g<G>/."""
  model = ModelConfig.named(paper.model)
  graph = model.graph(seed)
  record = model_record(graph, model.options)
  job_model = background.model if background.active else None  # None: the foreground's
  job_graph = job_model.graph(seed) if job_model is not None else None
  profiles: dict[str, tuple[ProfileTable, ProfileTable | None]] = {}  # by device
  rows, fair = [], []
  for setting in clusters:
    cluster, g = setting.cluster, setting.num_devices
    if cluster.device not in profiles:
      profiles[cluster.device] = (
          CALIBRATED.for_cluster(graph, cluster.device, paper.batch_size,
                                 background.batch_per_device),
          None if job_graph is None else CALIBRATED.for_cluster(
              job_graph, cluster.device, background.batch_per_device))
    profile, job_profile = profiles[cluster.device]
    plan = plan_for(graph, profile, cluster, setting.options, model=record,
                    cluster_record=to_record(cluster, g))
    folder = out_dir / f"{setting.name}_g{g}"
    plan.save(folder / "plan.json")
    tolerance = validated_tolerance(cluster.device, paper.batch_size / g)
    m = simulate_and_write(graph, profile, cluster, plan, folder, background=background,
                           interference=interference, iterations=iterations,
                           tolerance=tolerance, job_graph=job_graph,
                           job_profile=job_profile)["metrics"]
    c = comparisons(graph, profile, cluster, plan, tolerance)
    p = plan.predicted
    rows.append({
        "cluster": setting.name, "G": g,
        "plan_data_parallel_devices": c["plan_data_parallel_devices"],
        "plan_ms": p["iteration_ms"], "fastest_dp_devices": c["best_data_parallel_devices"],
        "fastest_dp_ms": c["best_data_parallel_iteration_ms"],
        "speedup_vs_fastest_dp": c["speedup_vs_best_data_parallel"],
        "dp_all_ms": p["data_parallel_iteration_ms"],
        "cheapest_dp_devices": c["cheapest_data_parallel_devices"],
        "saved_vs_cheapest_dp": c["gpu_time_saving_vs_cheapest_data_parallel"],
        "saved_vs_dp_all": 1 - p["gpu_ms"] / p["data_parallel_gpu_ms"],
        "background_samples_per_s": m.get("background_samples_per_s"),
        "cluster_vs_dp_all": m.get("cluster_throughput_vs_data_parallel"),
        "cluster_vs_matched": m.get("cluster_throughput_vs_matched_data_parallel"),
        "matched_dp_devices": m.get("matched_data_parallel_devices"),
        "basis": plan.basis(), "tolerance": tolerance})
    fair.append(f"{setting.name} G={g}: {m['fair_comparison']}")
  return rows, fair
