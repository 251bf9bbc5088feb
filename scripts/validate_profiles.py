"""Whole-model training throughput from each profile source against published measurements.

    python scripts/validate_profiles.py

For each cited measurement, the planner's own data-parallel evaluation (compute from the
profile, the optimizer update, the gradient all-reduce, the stage terms; dp_jax/planner) of the
same model, GPUs, per-GPU batch, precision and optimizer, as images/s, beside the published
images/s and their ratio (predicted / measured), for every profile source that covers the
setup: DeepPool's A100 tables (imported, A100-SXM4-40GB, mixed fp16) and the analytic roofline
of the measured GPU's datasheet (analytic.A100_VGG16_FIT, fitted on DeepPool's VGG16 table
only). Nothing here is fitted to these measurements; docs/cost_model.md states the deviations.
Per-GPU batches beyond a profile's rows are extrapolated (log-log), and say so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dp_jax.cluster import load_cluster  # noqa: E402
from dp_jax.planner import data_parallel_plan  # noqa: E402
from dp_jax.workflow import cluster_config  # noqa: E402

DLE_RN50 = ("NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, training performance, "
            "pytorch-21.03 NGC container")


@dataclass(frozen=True)
class Published:
  """One published whole-model training throughput."""

  source: str
  setup: str
  model: str
  device: str  # the measured GPU (a dp_jax.profile.devices name)
  gpus: int
  batch_per_gpu: int
  precision: str  # "mixed fp16" (AMP) or "tf32"
  images_per_s: float
  optimizer: str = "momentum"


PUBLISHED = (
    Published(DLE_RN50, "DGX A100, 1 x A100 80GB, AMP, batch 256", "resnet50", "A100-SXM4-80GB",
              1, 256, "mixed fp16", 2470.0),
    Published(DLE_RN50, "DGX A100, 8 x A100 80GB, AMP, batch 256 per GPU", "resnet50",
              "A100-SXM4-80GB", 8, 256, "mixed fp16", 16621.0),
    Published(DLE_RN50, "DGX A100, 1 x A100 80GB, TF32, batch 256", "resnet50", "A100-SXM4-80GB",
              1, 256, "tf32", 938.0),
    Published(DLE_RN50, "DGX A100, 8 x A100 80GB, TF32, batch 256 per GPU", "resnet50",
              "A100-SXM4-80GB", 8, 256, "tf32", 7248.0),
    Published(DLE_RN50, "DGX-1, 1 x V100 16GB, AMP, batch 256", "resnet50", "V100-SXM2-32GB",
              1, 256, "mixed fp16", 1200.0),
    Published(DLE_RN50, "DGX-1, 8 x V100 16GB, AMP, batch 256 per GPU", "resnet50",
              "V100-SXM2-32GB", 8, 256, "mixed fp16", 8322.0),
)


@cache
def graph_of(model: str):
  from dp_jax.models.registry import build_model
  from dp_jax.trace import trace_graph

  return trace_graph(build_model(model, abstract=True), model)


def profiles(p: Published):
  """(source label, ProfileTable) of every source that covers the measurement's setup."""
  from dp_jax.profile.analytic import analytic_profile
  from dp_jax.profile.deeppool_import import import_deeppool_a100

  graph = graph_of(p.model)
  out = []
  if p.device.startswith("A100") and p.precision == "mixed fp16":
    out.append(("A100 tables (imported, A100 40GB)", import_deeppool_a100(graph)[0]))
  out.append((f"analytic {p.device} {p.precision}",
              analytic_profile(graph, p.device, p.precision, [p.batch_per_gpu])))
  return out


def cluster_for(p: Published, device: str):
  """One NVLink node of `device` GPUs (a100_nvlink_8's links; V100: DGX-1's NVLink is slower,
  which the 8-GPU V100 row shows as a lower measured scaling)."""
  base = load_cluster(cluster_config("a100_nvlink_8"))
  from dp_jax.profile.devices import get_device

  return replace(base, name=f"{base.name}_{device}", device=device,
                 memory_gb_per_device=get_device(device).memory_gb)


def predicted_images_per_s(p: Published, profile) -> tuple[float, dict]:
  """Data parallelism's images/s under the planner's evaluation, and the plan's parts."""
  device = profile.device if profile.source == "imported" else p.device
  cluster = cluster_for(p, device)
  plan = data_parallel_plan(graph_of(p.model), profile, cluster, num_devices=p.gpus,
                            global_batch=p.gpus * p.batch_per_gpu, gradient_precision="fp32",
                            optimizer=p.optimizer, batch_norm="local", check_memory=False)
  ms = plan.predicted["iteration_ms"]
  return p.gpus * p.batch_per_gpu / ms * 1e3, plan.predicted


def table() -> list[tuple[Published, str, float, float, bool]]:
  """(measurement, profile source, predicted images/s, predicted / measured, extrapolated)."""
  rows = []
  for p in PUBLISHED:
    for label, prof in profiles(p):
      ips, _ = predicted_images_per_s(p, prof)
      top = min(max(prof.batches(n)) for n in graph_of(p.model).names)
      rows.append((p, label, ips, ips / p.images_per_s, p.batch_per_gpu > top))
  return rows


def main() -> int:
  rows = table()
  print("| published | model | profile source | measured images/s | predicted images/s | "
        "predicted / measured | per-GPU batch extrapolated |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  for p, label, ips, ratio, extrapolated in rows:
    print(f"| {p.setup} | {p.model} | {label} | {p.images_per_s:,.0f} | {ips:,.0f} | "
          f"{ratio:.2f} | {'yes' if extrapolated else 'no'} |")
  print(f"\nsource of every measurement: {DLE_RN50}")
  ratios = [r for _, _, _, r, _ in rows]
  print(f"{len(rows)} ratios against {len(PUBLISHED)} published measurements; predicted / "
        f"measured {min(ratios):.2f} .. {max(ratios):.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
