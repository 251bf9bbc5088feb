"""The calibrated GPU profile: the roofline fitted on published single-GPU training throughput.

    forward(b)  = max(F b / (peak x efficiency x waves), traffic(b) / bandwidth) + k x 5 us
    backward(b) = the same at twice the work and kernels (one forward's work on the first layer)

as dp_jax/layer_times/analytic.py, with two differences, each forced by a published row:

- traffic is what fused GPU kernels read and write (formulas.activation_elems: inputs, output, a
  batch norm's two passes over the convolution's output, a transformer block's q, k, v, scores
  and MLP hidden), not XLA's unfused operation-by-operation count of the traced graph. With
  XLA's count ResNet-50 is memory-bound at 1,283 images/s on an A100 80GB even at 100% of the
  tensor-core peak, half of the 2,470 NVIDIA publishes (DeepLearningExamples, PyTorch, AMP).
- efficiency is per operation class and precision: convolutions and matrix products (linear
  layers, transformer blocks, logits) reach different fractions of the peak. One efficiency
  fitted on ResNet-50 (23.6% of the fp16 peak) priced GPT matrix products at half their
  published speed.

CALIBRATION holds the fit: each efficiency was solved so that the planner's own data-parallel
evaluation on one GPU reproduces its fit row of dp_jax/published/anchors.yaml
(ResNet-50 for convolutions, BERT-Large pre-training phase 1 for matrix products, each in half
precision and TF32); tests/test_published.py refits them from that table. The tile (64) and the
per-kernel cost (5 us) are the A100 tables' fit (analytic.A100_VGG16_FIT). NVIDIA GPUs other than
the A100 (H100, H200) take the A100's fractions of their own datasheet peaks: an assumption,
which the H100 rows of the table judge (scripts/validate_published.py). No JAX.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.devices import DTYPE_BYTES, DeviceSpec, canonical_dtype, get_device
from dp_jax.layer_times import formulas
from dp_jax.layer_times.analytic import (
  AnalyticParams,
  LayerCost,
  layer_cost,
  layer_times_ms,
  times_table,
)
from dp_jax.layer_times.table import ProfileTable

SOURCE = "calibrated"
PRECISIONS = {"float16": "half", "bfloat16": "half", "tf32": "tf32"}
OP_CLASSES = ("conv", "matrix")
DEFAULT_DTYPE = "mixed bf16"


@dataclass(frozen=True)
class Calibration:
  """Efficiencies (fraction of the datasheet peak) per (operation class, precision class), and
  the roofline's shape: output tile of a matrix kernel, per-kernel cost, memory efficiency."""

  efficiency: Mapping[str, float]  # "conv/half", "matrix/tf32", ...
  tile: int = 64
  kernel_overhead_us: float = 5.0
  memory_eff: float = 1.0
  fitted_on: tuple[str, ...] = field(default=())  # anchor ids

  def params(self, precision: str) -> AnalyticParams:
    """The roofline knobs of a layer at `precision`: matrix products and convolutions at their
    fitted efficiencies, elementwise work at the float32 peak (memory-bound in practice)."""
    return AnalyticParams(compute_eff=self.efficiency[f"matrix/{precision}"],
                          conv_eff=self.efficiency[f"conv/{precision}"], vector_eff=1.0,
                          memory_eff=self.memory_eff, tile=self.tile,
                          kernel_overhead_us=self.kernel_overhead_us)

  def to_json(self) -> dict:
    return {**asdict(self), "efficiency": dict(self.efficiency),
            "fitted_on": list(self.fitted_on)}


# Solved on the fit rows of published_anchors.yaml by dp_jax.published.anchors.fit_calibration
# (bisection on each efficiency; the conv rows first, then the matrix rows with the convolution
# efficiencies set): ResNet-50 v1.5 on 1 x A100-SXM4-80GB, 2,470 (AMP) and 938 (TF32) images/s;
# BERT-Large phase 1 on 1 x A100-SXM4-80GB, 580 (FP16) and 317 (TF32) sequences/s, each step
# one LAMB update per 32 (FP16) / 64 (TF32) accumulated micro-batches as DeepLearningExamples
# ran it (run_pretraining.py at a07d20a1; the update once per micro-batch gave 0.4984 / 0.5457).
# Refit on the same rows when layers came to be priced by their traced work (matrix products and
# convolutions at these efficiencies, elementwise work at the vector rate): 0.2359 / 0.1644 /
# 0.4933 / 0.5395 before.
CALIBRATION = Calibration(
    efficiency={"conv/half": 0.2397, "conv/tf32": 0.1660, "matrix/half": 0.4914,
                "matrix/tf32": 0.5376},
    fitted_on=("dle_pyt_rn50_a100_1gpu_amp", "dle_pyt_rn50_a100_1gpu_tf32",
               "dle_pyt_bert_large_p1_a100_1gpu_amp", "dle_pyt_bert_large_p1_a100_1gpu_tf32"))


def precision_class(dtype: str) -> str:
  """'half' or 'tf32'; a one-line error for a precision no published row calibrates."""
  name = canonical_dtype(dtype)
  if name not in PRECISIONS:
    raise UserError(f"the calibrated profile has no fit for {dtype} (published rows calibrate "
                    "half precision and tf32); use profile.dtype='mixed bf16' or tf32, or "
                    "profile=analytic")
  return PRECISIONS[name]


def check_device(device: DeviceSpec) -> DeviceSpec:
  if device.name == "cpu":
    raise UserError("the calibrated profile is of NVIDIA GPUs (fitted on published A100 "
                    "rows); on this machine's CPU use profile=measure")
  return device


def layer_model(graph: LayerGraph, node: LayerNode, dtype: str,
                calibration: Calibration = CALIBRATION,
                accept: frozenset[str] = frozenset()) -> tuple[LayerCost, AnalyticParams]:
  """The roofline cost and knobs of one layer. Its traffic is what fused kernels read and
  write: its inputs and output, refined by its kind where a formula knows more (a batch norm's
  passes, a transformer block's intermediates), never beyond XLA's unfused count of the traced
  layer: a label can refine the price, never multiply it."""
  cost = layer_cost(graph, node, dtype, accept)
  itemsize = DTYPE_BYTES[canonical_dtype(dtype)]
  shapes = formulas.input_shapes(graph, node)
  # any kernels read the inputs, write the output and write what the backward keeps
  generic = formulas.io_elems(node, shapes) * itemsize + saved_bytes(node, itemsize)
  if node.kind in formulas.FUSED_TRAFFIC_KINDS:
    fused = formulas.activation_elems(node, shapes) * itemsize
    traffic = min(fused, max(generic, cost.act_bytes_per_sample))
  else:
    traffic = generic
  return (replace(cost, act_bytes_per_sample=traffic),
          calibration.params(precision_class(dtype)))


def saved_bytes(node: LayerNode, itemsize: int) -> float:
  """The activations the layer keeps for its backward, per sample, in elements of `itemsize`
  (the trace's residual bytes are in the traced dtype)."""
  numel = math.prod(node.out_shape) if node.out_shape else 0
  traced = node.out_bytes_per_sample / numel if numel and node.out_bytes_per_sample else 4
  return node.saved_bytes_per_sample * itemsize / traced


def calibrated_profile(graph: LayerGraph, device: str | DeviceSpec, dtype: str,
                       batches: Iterable[int], calibration: Calibration = CALIBRATION,
                       accept: frozenset[str] = frozenset()) -> ProfileTable:
  """Calibrated roofline timings of every layer of `graph` at each per-device batch (`accept`:
  layers the graph gives no matrix work for, priced at the vector rate on purpose)."""
  dev = check_device(get_device(device) if isinstance(device, str) else device)
  precision_class(dtype)
  models = {n.name: layer_model(graph, n, dtype, calibration, accept) for n in graph.nodes}
  layers = times_table(graph, lambda node, b: layer_times_ms(
      models[node.name][0], dev, dtype, b, models[node.name][1]), batches)
  return ProfileTable(model=graph.model, device=dev.name, dtype=dtype, source=SOURCE,
                      layers=layers, meta={"calibration": calibration.to_json()})
