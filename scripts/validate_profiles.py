"""Whole-model training throughput from each profile source against published measurements.

    python scripts/validate_profiles.py

For every convolutional-network row of dp_jax/published/anchors.yaml on A100 GPUs
(ResNet-50 in NVIDIA's DeepLearningExamples, VGG16 in DeepPool's README), the planner's own
data-parallel evaluation of the same model, GPUs, batch, precision and setup under each profile
source: `calibrated` (the default on GPU clusters, fitted on the table's fit rows: their ratio
is 1 by construction), `analytic` (the plain roofline with analytic.A100_VGG16_FIT, fitted on
DeepPool's VGG16 table only) and `deeppool_a100` (DeepPool's A100-SXM4-40GB tables, measured
per layer, mixed fp16; half-precision rows only). One line per row and source: predicted,
published, predicted / published; last, each source's median ratio. Per-device batches beyond
DeepPool's tables (256, 512) are extrapolated on a log-log line.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dp_jax.layer_times.calibrated import precision_class  # noqa: E402
from dp_jax.published.anchors import PROFILE_SOURCES, load_anchors, predict  # noqa: E402

MODELS = ("resnet50", "vgg16")


def covers(source: str, anchor) -> bool:
  """Whether `source` has times for the row (DeepPool's tables: half-precision A100 only)."""
  return source != "deeppool_a100" or precision_class(anchor.precision) == "half"


def table() -> list[tuple[object, str, float, float]]:
  """(anchor, profile source, predicted, predicted / published) per row and source."""
  rows = []
  for a in load_anchors():
    name = (a.model or {}).get("name")
    if a.kind != "training" or name not in MODELS or not str(a.device).startswith("A100"):
      continue
    for source in PROFILE_SOURCES:
      if covers(source, a):
        value = predict(a, source=source)
        rows.append((a, source, value, value / a.measured))
  return rows


def main() -> int:
  rows = table()
  print("| published row | role | profile source | unit | published | predicted | "
        "predicted / published |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  for a, source, value, ratio in rows:
    print(f"| {a.id} | {a.role} | {source} | {a.unit} | {a.measured:,.6g} | {value:,.4g} | "
          f"{ratio:.2f} |")
  print()
  for source in PROFILE_SOURCES:
    ratios = [r for _, s, _, r in rows if s == source]
    print(f"{source}: median predicted / published {statistics.median(ratios):.2f} over "
          f"{len(ratios)} rows ({min(ratios):.2f} .. {max(ratios):.2f})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
