"""The paper's setting on the calibrated profile (the main job's first part; predicted by the
planner's cost model, simulated by the simulator, no JAX run): a model at one global batch on
each of a few A100 clusters, burst vs data parallelism, GPU time saved, and cluster throughput
with the background job in the idle devices.

PaperConfig is the schema of the main job's `paper` group, PaperStudy its typed form.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from dp_jax.base.rules import check
from dp_jax.hardware.cluster import ClusterSpec, cluster_file, job_from_config, to_record
from dp_jax.layer_times.sources import ProfileOptions
from dp_jax.layer_times.table import ProfileTable
from dp_jax.models.zoo import ModelSpec
from dp_jax.multiplex.background import BackgroundSpec
from dp_jax.planner import PlanOptions, plan_for
from dp_jax.planner.contract import model_record
from dp_jax.report.compare import validated_tolerance
from dp_jax.report.plan_report import comparisons
from dp_jax.simulator.outputs import SimulationOptions, simulate_and_write

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
CALIBRATED = ProfileOptions(source="calibrated")


@dataclass
class PaperSettingConfig:
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
  settings: list[PaperSettingConfig] = field(default_factory=lambda: [
      PaperSettingConfig("a100_nvlink_8", 8), PaperSettingConfig("dgx_a100", 16),
      PaperSettingConfig("dgx_a100", 32)])


@dataclass(frozen=True)
class PaperSetting:
  """One cluster of the comparison: its config name, the pod, and the planner's options at its
  G (the paper's batch, burst at the paper's amplification limit)."""

  name: str
  cluster: ClusterSpec
  options: PlanOptions

  @property
  def num_devices(self) -> int:
    return self.options.num_devices


@dataclass(frozen=True)
class PaperStudy:
  """The paper group, typed and checked: the model (a zoo name), B, the amplification limit and
  the settings."""

  model: ModelSpec
  batch_size: int
  amplification_limit: float
  settings: tuple[PaperSetting, ...]

  @classmethod
  def from_config(cls, paper: Any, planner: Any) -> PaperStudy:
    """The paper group (a DictConfig or a mapping); `planner`: the planner group its plans
    share (burst at paper.amplification_limit whatever planner.name and its limit)."""
    b = check("paper.batch_size", paper.get("batch_size"))
    limit = check("paper.amplification_limit", float(paper.get("amplification_limit")))
    settings = []
    for s in paper.get("settings"):
      cluster, g = job_from_config({**cluster_file(s.get("cluster")),
                                    "num_devices": s.get("num_devices")})
      options = replace(PlanOptions.from_config(planner, g, b), strategy="burst",
                        amplification_limit=limit)
      settings.append(PaperSetting(str(s.get("cluster")), cluster, options))
    return cls(ModelSpec.from_config(str(paper.get("model"))), b, limit, tuple(settings))


def run(study: PaperStudy, background: BackgroundSpec, simulation: SimulationOptions,
        out_dir: Path, seed: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
  """Burst vs data parallelism per setting on the calibrated profile (one row each, keyed as
  COLUMNS), and each setting's simulated fair comparison in words; every setting's plan,
  metrics, timeline and Gantt chart under out_dir/<cluster>_g<G>/."""
  graph = study.model.graph(seed)
  record = model_record(graph, study.model.options)
  job_model = background.model if background.active else None  # None: the foreground's
  job_graph = job_model.graph(seed) if job_model is not None else None
  profiles: dict[str, tuple[ProfileTable, ProfileTable | None]] = {}  # by device
  rows, fair = [], []
  for setting in study.settings:
    cluster, g = setting.cluster, setting.num_devices
    if cluster.device not in profiles:
      profiles[cluster.device] = (
          CALIBRATED.for_cluster(graph, cluster.device, study.batch_size,
                                 background.batch_per_device),
          None if job_graph is None else CALIBRATED.for_cluster(
              job_graph, cluster.device, background.batch_per_device))
    profile, job_profile = profiles[cluster.device]
    plan = plan_for(graph, profile, cluster, setting.options, model=record,
                    cluster_record=to_record(cluster, g))
    folder = out_dir / f"{setting.name}_g{g}"
    plan.save(folder / "plan.json")
    tolerance = validated_tolerance(cluster.device)
    m = simulate_and_write(graph, profile, cluster, plan, folder, background=background,
                           options=simulation, tolerance=tolerance, job_graph=job_graph,
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
