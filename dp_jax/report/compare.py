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
from dp_jax.base.errors import UserError

# The committed validation's median |predicted / measured - 1| over all its plans
# (results/validation/vgg16_validation.csv and gpt2_small_validation.csv: 25 plans, 4.3%;
# per model 4.2% and 6.0%, docs/validation.md): the tolerance of verdicts on this machine's CPU.
# tests/test_compare.py recomputes it from those files, so a regenerated validation that moves it
# fails until this and conf/comparison/validated.yaml follow.
VALIDATED_TOLERANCE = 0.043
# The GPU tolerance of each regime of per-GPU batch (scripts/validate_published.py's last lines,
# dp_jax/published/anchors.py): the median, over independent groups (model, hardware, source
# table), of each group's median |predicted / published - 1| in three relative checks of
# dp_jax/published/anchors.yaml: (a) per-GPU scaling efficiency between two scales
# of one published table, (b) step time at a small per-GPU batch over a large one,
# leave-one-model-out over DeepPool's A100 per-layer tables, (c) all-reduce bus bandwidth from
# 1 MiB up against nccl-tests curves (in both regimes). tests/test_published.py recomputes both
# from the table, so a change of the table or the model that moves them fails until they follow.
GPU_SMALL_BATCH_MAX = 8  # per-GPU batch of the small regime: <= 8
GPU_TOLERANCE_SMALL_BATCH = 0.109  # 15 groups: (a) 2, (b) 5, (c) 8
GPU_TOLERANCE_LARGE_BATCH = 0.063  # 22 groups: (a) 9, (b) 5, (c) 8
# The GPU default where a caller names no per-GPU batch: the small-batch regime's (burst plans'
# verdicts sit at per-GPU batches of 1-4). Every verdict should name its regime (gpu_tolerance).
GPU_VALIDATED_TOLERANCE = GPU_TOLERANCE_SMALL_BATCH
VERDICTS = ("ahead", "tie", "behind")


@dataclass(frozen=True)
class Tolerance:
  """The validated tolerance of a verdict: its value, the regime it belongs to, its basis."""

  value: float
  regime: str
  basis: str


def gpu_regime(per_device_batch: float) -> str:
  """'per-GPU batch <= 8' or 'per-GPU batch > 8' (a one-line error for a batch that is not
  positive)."""
  try:
    b = float(per_device_batch)
  except (TypeError, ValueError):
    b = math.nan
  if not (math.isfinite(b) and b > 0):
    raise UserError(f"per-GPU batch {per_device_batch!r} must be a positive number (samples each "
                    "GPU computes per step)")
  return (f"per-GPU batch <= {GPU_SMALL_BATCH_MAX}" if b <= GPU_SMALL_BATCH_MAX
          else f"per-GPU batch > {GPU_SMALL_BATCH_MAX}")


def gpu_tolerance(per_device_batch: float) -> Tolerance:
  """The GPU tolerance of a verdict whose plans run `per_device_batch` samples per GPU (for a
  comparison of plans at several batches, the smallest: the regime the verdict rests on)."""
  regime = gpu_regime(per_device_batch)
  small = regime.endswith(f"<= {GPU_SMALL_BATCH_MAX}")
  value = GPU_TOLERANCE_SMALL_BATCH if small else GPU_TOLERANCE_LARGE_BATCH
  return Tolerance(value, regime, "the median group error of the relative checks against "
                   f"published GPU measurements ({regime}; scripts/validate_published.py)")


def validated_tolerance(device: str, per_device_batch: float | None = None) -> float:
  """The validated tolerance of verdicts about `device`: the local validation's on the CPU; on a
  GPU, the regime's of `per_device_batch` (gpu_tolerance), the small-batch regime's when none
  is given."""
  if device == "cpu":
    return VALIDATED_TOLERANCE
  if per_device_batch is None:
    return GPU_VALIDATED_TOLERANCE
  return gpu_tolerance(per_device_batch).value


def tolerance_basis(device: str, per_device_batch: float | None = None) -> str:
  """Where validated_tolerance(device, per_device_batch) comes from, in a few words."""
  if device == "cpu":
    return "the local validation's median error"
  return gpu_tolerance(per_device_batch if per_device_batch is not None else 1).basis


def ties_note(device: str, per_device_batch: float, tolerance: float) -> str:
  """How a verdict's ties are judged, in words: the tolerance and what it is (the validated
  tolerance of the device and, on a GPU, of the regime of the per-GPU batch; else the
  comparison.tolerance set)."""
  if device == "cpu":
    what = "the local validation's" if tolerance == VALIDATED_TOLERANCE else None
  else:
    regime = gpu_tolerance(per_device_batch)
    what = f"the GPU tolerance of {regime.regime}" if tolerance == regime.value else None
  return f"ties within {tolerance:.1%} ({what or 'comparison.tolerance'})"


@dataclass(frozen=True)
class ComparisonConfig(Checked):
  """How comparisons are judged (the comparison group, composed by plan and simulate).

  tolerance: a margin within +-tolerance is a tie. Default (null): the validated tolerance of
  the cluster's device (validated_tolerance: 4.3% on this machine's CPU; on NVIDIA GPUs the
  regime's of the per-GPU batch, gpu_tolerance: 10.9% at 8 or fewer samples per GPU, 6.3%
  above); `comparison=strict` (0) judges every margin.
  """

  GROUP = "comparison"

  tolerance: float | None = option(None, low=0, hint="a margin within +-tolerance is a tie; "
                                   "default null: the validated median error of the cluster's "
                                   "device")

  def for_device(self, device: str, per_device_batch: float | None = None) -> float:
    """The tolerance, or the validated tolerance of `device` (and of the regime of its per-GPU
    batch) when it is unset."""
    if self.tolerance is not None:
      return float(self.tolerance)
    return validated_tolerance(device, per_device_batch)


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
  """'1.23x (+23%, ahead)' / '1.01x (+1%, tie within 10.9%)'; '-' for a missing ratio."""
  if ratio is None or not math.isfinite(ratio):
    return "-"
  v = verdict_text or verdict(ratio, tolerance)
  within = f" within {tolerance:.1%}" if v == "tie" else ""
  return f"{ratio:.2f}x ({ratio - 1:+.0%}, {v}{within})"


def gpu_time_change(saving: float | None, noun: str = "GPU time") -> str:
  """A change of GPU time as a ratio, from the fraction saved (1 - ours / baseline; below 0:
  ours uses more): 0.52 -> '2.08x less GPU time', -11.5 -> '12.5x more GPU time', within
  0.5% -> 'the same GPU time'; '-' when missing. Never a percentage: one beyond -100% reads as
  nothing ('saved -1154%')."""
  if saving is None or not math.isfinite(saving) or saving >= 1:
    return "-"
  used = 1.0 - saving  # ours / baseline
  factor = used if used >= 1 else 1 / used
  tail = f" {noun}" if noun else ""
  if factor < 1.005:
    return f"the same{tail}"
  text = f"{factor:.2f}x" if factor < 10 else f"{factor:.1f}x"
  return f"{text} {'more' if used > 1 else 'less'}{tail}"


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
