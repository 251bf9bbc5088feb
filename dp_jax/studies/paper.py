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

from dp_jax.config.files import cluster_file
from dp_jax.config.rules import check
from dp_jax.hardware.cluster import ClusterSpec, job_from_config, to_record
from dp_jax.models.zoo import ModelSpec
from dp_jax.multiplex.background import BackgroundSpec
from dp_jax.planner import PlanOptions, plan_for
from dp_jax.planner.plan import model_record
from dp_jax.profiling.sources import ProfileOptions
from dp_jax.profiling.table import ProfileTable
from dp_jax.report.compare import validated_tolerance
from dp_jax.sim.report import SimulationOptions, simulate_and_write

COLUMNS = ["cluster", "G", "burst ms (predicted)", "data-parallel ms (predicted)",
           "speed-up (predicted)", "GPU time saved (predicted)",
           "background samples/s (simulated)", "cluster throughput / DP (simulated)",
           "cluster throughput / matched-speed DP + background (simulated)"]
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
        out_dir: Path, seed: int = 0) -> tuple[list[list[Any]], list[str]]:
  """Burst vs data parallelism per setting on the calibrated profile (one row each, COLUMNS),
  and each setting's simulated fair comparison in words (the matched baseline first); every
  setting's plan, metrics, timeline and Gantt chart under out_dir/<cluster>_g<G>/."""
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
              job_graph, cluster.device, background.batch_per_device, model=job_model))
    profile, job_profile = profiles[cluster.device]
    plan = plan_for(graph, profile, cluster, setting.options, model=record,
                    cluster_record=to_record(cluster, g))
    folder = out_dir / f"{setting.name}_g{g}"
    plan.save(folder / "plan.json")
    m = simulate_and_write(graph, profile, cluster, plan, folder, background=background,
                           options=simulation, tolerance=validated_tolerance(cluster.device),
                           job_graph=job_graph, job_profile=job_profile)["metrics"]
    p = plan.predicted
    rows.append([setting.name, g, p["iteration_ms"], p["data_parallel_iteration_ms"],
                 p["data_parallel_iteration_ms"] / p["iteration_ms"],
                 1 - p["gpu_ms"] / p["data_parallel_gpu_ms"],
                 m.get("background_samples_per_s"), m.get("cluster_throughput_vs_data_parallel"),
                 matched(m)])
    fair.append(f"{setting.name} G={g}: {m['fair_comparison']}")
  return rows, fair


def matched(m: dict[str, Any]) -> str | None:
  """Cluster throughput against the matched baseline (the best data parallelism plus background
  over every d whose foreground is within the tolerance of the burst foreground), naming d."""
  ratio, d = (m.get("cluster_throughput_vs_matched_data_parallel"),
              m.get("matched_data_parallel_devices"))
  if ratio is None:
    return "no DP within tolerance" if "matched_data_parallel_note" in m else None
  return f"{ratio:.2f}x (DP on {d})"
