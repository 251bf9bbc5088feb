"""Comparisons with margins: a gain inside the cost model's validated error is a tie, not a win.

Every comparison the apps and studies report (burst vs data parallelism; burst plus background
vs matched data parallelism plus background) goes through `compare`: the ratio (above 1: burst
is better), its margin (ratio - 1) and a verdict, `ahead` / `tie` / `behind`, where a margin
within +-tolerance is a tie. Pure functions, no JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dp_jax.base.checks import Checked, option

# The committed validation's median |predicted / measured - 1| over all its plans
# (results/validation/vgg16_validation.csv and gpt2_small_validation.csv: 25 plans, 4.3%;
# per model 4.2% and 6.0%, docs/validation.md): the tolerance of verdicts on this machine's CPU.
# tests/test_compare.py recomputes it from those files, so a regenerated validation that moves it
# fails until this and conf/comparison/validated.yaml follow.
VALIDATED_TOLERANCE = 0.043
# The held-out median |predicted / published - 1| over the training rows of
# dp_jax/published/anchors.yaml (scripts/validate_published.py: step throughput on
# A100 and H100 clusters, what a verdict compares): the tolerance of verdicts on NVIDIA GPUs.
# tests/test_published.py recomputes it from the table.
GPU_VALIDATED_TOLERANCE = 0.076
VERDICTS = ("ahead", "tie", "behind")


def validated_tolerance(device: str) -> float:
  """The validated tolerance of verdicts about `device`: the local validation's on the CPU,
  the published held-out rows' on a GPU."""
  return VALIDATED_TOLERANCE if device == "cpu" else GPU_VALIDATED_TOLERANCE


def tolerance_basis(device: str) -> str:
  """Where validated_tolerance(device) comes from, in a few words."""
  return ("the local validation's median error" if device == "cpu" else
          "the held-out median error against published GPU measurements")


@dataclass(frozen=True)
class ComparisonConfig(Checked):
  """How comparisons are judged (the comparison group, composed by plan and simulate).

  tolerance: a margin within +-tolerance is a tie. Default (null): the validated tolerance of
  the cluster's device (validated_tolerance: 4.3% on this machine's CPU, 7.6% on NVIDIA GPUs);
  `comparison=strict` (0) judges every margin.
  """

  GROUP = "comparison"

  tolerance: float | None = option(None, low=0, hint="a margin within +-tolerance is a tie; "
                                   "default null: the validated median error of the cluster's "
                                   "device")

  def for_device(self, device: str) -> float:
    """The tolerance, or the validated tolerance of `device` when it is unset."""
    return validated_tolerance(device) if self.tolerance is None else float(self.tolerance)


def verdict(ratio: float, tolerance: float) -> str:
  """'ahead' when ratio - 1 > tolerance, 'behind' when < -tolerance, else 'tie'."""
  margin, edge = ratio - 1.0, tolerance + 1e-12  # a margin of exactly the tolerance is a tie
  if margin > edge:
    return "ahead"
  if margin < -edge:
    return "behind"
  return "tie"


def compare(ours: float, baseline: float, tolerance: float, *,
            lower_is_better: bool) -> dict[str, Any]:
  """Ratio (above 1: ours is better), margin (ratio - 1) and verdict of ours against baseline.

  Times (ms per iteration) pass lower_is_better=True: ratio = baseline / ours (a speed-up);
  throughputs pass False: ratio = ours / baseline.
  """
  if not (ours > 0 and baseline > 0):
    raise ValueError(f"compare needs positive values, got {ours} and {baseline}")
  ratio = baseline / ours if lower_is_better else ours / baseline
  return {"ratio": ratio, "margin": ratio - 1.0, "verdict": verdict(ratio, tolerance)}


def fields(name: str, result: dict[str, Any]) -> dict[str, Any]:
  """A comparison as flat keys: name (the ratio), name_margin, name_verdict."""
  return {name: result["ratio"], f"{name}_margin": result["margin"],
          f"{name}_verdict": result["verdict"]}


def none_fields(name: str) -> dict[str, Any]:
  """The keys of `fields` for a comparison that has no baseline."""
  return {name: None, f"{name}_margin": None, f"{name}_verdict": None}


def describe(ratio: float | None, tolerance: float, verdict_text: str | None = None) -> str:
  """'1.23x (+23%, ahead)' / '1.01x (+1%, tie within 7.6%)'; '-' for a missing ratio."""
  if ratio is None or not math.isfinite(ratio):
    return "-"
  v = verdict_text or verdict(ratio, tolerance)
  within = f" within {tolerance:.1%}" if v == "tie" else ""
  return f"{ratio:.2f}x ({ratio - 1:+.0%}, {v}{within})"


def devices(n: int) -> str:
  """'1 device', '8 devices'."""
  return f"{n} device" if n == 1 else f"{n} devices"


def data_parallel_on_all(g: int, d: int, global_batch: int) -> str:
  """The data-parallel baseline on the job's devices, named as it runs: 'data parallelism on
  all 32', or on d < G devices when G does not divide the batch ('data parallelism on 24 of
  the 32 devices (32 does not divide B=48)')."""
  if d == g:
    return f"data parallelism on all {g}"
  return (f"data parallelism on {d} of the {g} devices ({g} does not divide B={global_batch}; "
          f"{d} is the largest count that does)")
