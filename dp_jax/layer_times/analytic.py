"""Roofline cost model per layer: time = max(compute, memory) + kernels x per-kernel overhead.

Forward time at per-device batch b:

    t_fwd(b) = max(F*b / (peak*compute_eff), (P + A*b) / (bw*memory_eff)) + k * overhead

F: forward FLOPs per sample (the node's XLA cost analysis, else formulas.forward_flops);
A: activation bytes per sample, P: parameter bytes (both in the profiled dtype); k: kernels.
Backward: twice the forward FLOPs, bytes and kernels (input gradient + weight gradient, each
about one forward's work: the usual 1:2 forward:backward convention of Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", sec. 2.1, and Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters", sec. 5.1). The layer that reads the model
input needs no input gradient: its backward is one forward's work.
See docs/cost_model.md for where compute_eff, memory_eff and small_batch_flops come from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.devices import DTYPE_BYTES, DeviceSpec, canonical_dtype, get_device, is_mixed
from dp_jax.layer_times import formulas
from dp_jax.layer_times.table import ProfileTable

# Weight traffic per parameter per forward under mixed precision (PyTorch AMP, DeepPool's
# tables): read the float32 master copy (4 B), write the half copy (2 B), read it in the layer
# (2 B). Pure dtypes read the weights once in their own size.
MIXED_PARAM_BYTES = 8

# A graph without traced work (a graph file from elsewhere): the kinds whose work runs on the
# matrix units (tensor cores); the other known kinds are elementwise / reductions, on the vector
# units at the float32 rate at best. A traced graph says which FLOPs are which (flops_by_unit),
# so a layer's label never sets its price there.
MATRIX_KINDS = ("conv2d", "linear", "transformer_block", "lm_head", "patch_embed",
                "self_attention", "mlp_block")


@dataclass(frozen=True)
class AnalyticParams:
  """Knobs of the roofline: 1.0 / 0 / 0 is the plain roofline (a lower bound on time)."""

  compute_eff: float = 1.0  # fraction of peak FLOP/s large matrix kernels reach
  memory_eff: float = 1.0  # fraction of peak bandwidth streaming kernels reach
  small_batch_flops: float = 0.0  # matrix work (FLOPs) below which a kernel cannot fill the chip
  tile: int = 0  # output tile (tile x tile) per compute unit of a matrix kernel; 0: no wave term
  kernel_overhead_us: float | None = None  # None: the device's
  conv_eff: float | None = None  # convolutions' fraction of the peak; None: compute_eff
  vector_eff: float | None = None  # elementwise work: fraction of the fp32 peak; None: compute_eff

  def __post_init__(self):
    for k in ("compute_eff", "memory_eff", "conv_eff", "vector_eff"):
      v = getattr(self, k)
      if v is not None and not (0 < v <= 1):
        raise UserError(f"analytic {k} must be in (0, 1], got {v}")
    if self.small_batch_flops < 0 or (self.kernel_overhead_us or 0) < 0 or self.tile < 0:
      raise UserError("analytic small_batch_flops, tile and kernel_overhead_us must be >= 0, got "
                      f"{self.small_batch_flops}, {self.tile}, {self.kernel_overhead_us}")


PLAIN = AnalyticParams()
# Fitted on ONE table, DeepPool's A100 VGG16 (A100_vgg.prof, per-device batches 1-32, "mixed
# fp16"), by analytic_fit.fit_params(..., small_batch="tile") on mean |log error|; reproduced and
# checked against WRN-101-2, Inception-v3 and ResNet-50 by scripts/validate_cost_model.py (errors
# in docs/cost_model.md). Used for every GPU: no other GPU's tables are at hand.
A100_VGG16_FIT = AnalyticParams(compute_eff=0.2, memory_eff=1.0, tile=64, kernel_overhead_us=5.0)


def default_params(device: DeviceSpec) -> AnalyticParams:
  """The A100 fit for GPUs; the plain roofline for the CPU (see docs/cost_model.md)."""
  return PLAIN if device.name == "cpu" else A100_VGG16_FIT


class UnpricedLayer(UserError):
  """A layer whose matrix work the graph does not say and whose kind no formula knows."""


@dataclass(frozen=True)
class LayerCost:
  """What the roofline needs to know about one layer, in the profiled dtype: its forward FLOPs
  per sample split by the units that run them (matrix products and convolutions on the matrix
  units, the rest on the vector units), the activation bytes a fused kernel reads and writes
  per sample, the parameter bytes a step reads whole, and the bytes of the tables it only
  gathers rows of (an embedding: the forward reads the gathered rows, which are activation
  bytes; the backward writes the table's dense gradient, as JAX's scatter-add does)."""

  matmul_flops_per_sample: float
  conv_flops_per_sample: float
  vector_flops_per_sample: float
  act_bytes_per_sample: float
  param_bytes: float
  kernels: int
  reads_model_input: bool
  gemm: tuple[int, int] | None = None  # (output rows per sample, output columns)
  gathered_bytes: float = 0.0

  @property
  def flops_per_sample(self) -> float:
    return self.matmul_flops_per_sample + self.conv_flops_per_sample + self.vector_flops_per_sample

  @property
  def matrix(self) -> bool:
    return self.matmul_flops_per_sample + self.conv_flops_per_sample > 0

  def scaled(self, share: float, **changes) -> LayerCost:
    """Its FLOPs times `share` (a split layer's part), with other fields changed."""
    return replace(self, matmul_flops_per_sample=self.matmul_flops_per_sample * share,
                   conv_flops_per_sample=self.conv_flops_per_sample * share,
                   vector_flops_per_sample=self.vector_flops_per_sample * share, **changes)


def traced_work(graph: LayerGraph) -> bool:
  """Whether the graph's nodes record their matrix work (traced by dp_jax.models.trace)."""
  return bool(graph.meta.get("work_source"))


def flops_by_unit(graph: LayerGraph, node: LayerNode, flops: float,
                  accept: frozenset[str] = frozenset()) -> tuple[float, float, float]:
  """(matrix-product, convolution, elementwise) FLOPs per sample of `flops`: what the layer's
  jaxpr runs on the matrix units (scaled to XLA's count, which excludes a convolution's
  padding, when it counts fewer), the rest elementwise. A graph without traced work: by the
  layer's kind where a formula knows it; else an UnpricedLayer error unless `accept` names the
  layer (then elementwise: the vector rate)."""
  if traced_work(graph):
    tensor = node.matmul_flops_per_sample + node.conv_flops_per_sample
    if tensor <= 0:
      return 0.0, 0.0, flops
    scale = min(1.0, flops / tensor) if flops > 0 else 1.0
    mm, conv = node.matmul_flops_per_sample * scale, node.conv_flops_per_sample * scale
    return mm, conv, max(0.0, flops - mm - conv)
  if node.kind == "conv2d":
    return 0.0, flops, 0.0
  if node.kind in MATRIX_KINDS:
    return flops, 0.0, 0.0
  if node.kind in formulas.KNOWN_KINDS or node.name in accept:
    return 0.0, 0.0, flops
  raise UnpricedLayer(
      f"layer '{node.name}' (kind '{node.kind}') of {graph.model}: the graph does not say how "
      "much of its work is matrix products, and no formula knows its kind; trace the model with "
      "dp_jax (python -m dp_jax.inspect) or accept it priced at the vector rate with "
      f"profile.accept_vector_rate=[{node.name}]")


def layer_cost(graph: LayerGraph, node: LayerNode, dtype: str,
               accept: frozenset[str] = frozenset()) -> LayerCost:
  """FLOPs and bytes of one layer: XLA's cost analysis when the graph has it, else formulas;
  split by unit from its traced work (flops_by_unit).

  dp_jax.models.trace records per-sample marginals (cost at batch 2 minus batch 1), so XLA's
  bytes_accessed_per_sample excludes the weights, which are read once per step (param_bytes).
  XLA's bytes are in the traced dtype (out_bytes_per_sample / elements); rescaled to `dtype`.
  """
  itemsize = DTYPE_BYTES[canonical_dtype(dtype)]
  numel = math.prod(node.out_shape) if node.out_shape else 0
  traced = node.out_bytes_per_sample / numel if numel and node.out_bytes_per_sample else 4
  scale = itemsize / traced
  in_shapes = formulas.input_shapes(graph, node)
  if node.flops_per_sample > 0:
    flops = node.flops_per_sample
  else:
    flops = formulas.forward_flops(node, in_shapes) if node.kind in formulas.KNOWN_KINDS or (
        node.name not in accept) else 0.0
  if node.bytes_accessed_per_sample > 0:
    act = node.bytes_accessed_per_sample * scale
  else:
    act = formulas.activation_elems(node, in_shapes) * itemsize
  nparams = node.params or node.param_bytes / traced
  per_param = MIXED_PARAM_BYTES if is_mixed(dtype) else itemsize
  gathered = node.gathered_param_bytes / traced if traced_work(graph) else 0.0
  mm, conv, vector = flops_by_unit(graph, node, flops, accept)
  gemm = node.gemm if traced_work(graph) and node.gemm else formulas.gemm_shape(node)
  return LayerCost(mm, conv, vector, act, max(0.0, nparams - gathered) * per_param,
                   formulas.forward_kernels(node), not node.inputs, gemm,
                   gathered * per_param)


def wave_utilization(gemm: tuple[int, int] | None, batch: int, tile: int, units: int) -> float:
  """Fraction of the compute units a matrix kernel keeps busy, over all its waves of tiles.

  Its (batch*rows) x cols output splits into tile x tile blocks, one per unit at a time; the
  last wave is partly empty, and a kernel with fewer blocks than units leaves units idle.
  """
  if gemm is None or tile <= 0:
    return 1.0
  rows, cols = gemm
  tiles = math.ceil(batch * rows / tile) * math.ceil(cols / tile)
  return tiles / (units * math.ceil(tiles / units))


def layer_times_ms(cost: LayerCost, device: DeviceSpec, dtype: str, batch: int,
                   params: AnalyticParams = PLAIN) -> tuple[float, float]:
  """(forward ms, backward ms) of one layer at per-device batch `batch` (dtype: compute dtype):
  the slowest of its matrix-unit work, its elementwise work and its memory traffic, plus its
  kernels' fixed cost."""
  if batch < 1:
    raise UserError(f"per-device batch must be >= 1, got {batch}")
  dtype = canonical_dtype(dtype)
  peak, vector_peak = device.peak(dtype), device.peak("float32")
  conv_eff = params.compute_eff if params.conv_eff is None else params.conv_eff
  vector_eff = params.compute_eff if params.vector_eff is None else params.vector_eff
  bw = device.mem_bandwidth * params.memory_eff
  overhead = device.kernel_overhead_us if params.kernel_overhead_us is None \
      else params.kernel_overhead_us
  util = wave_utilization(cost.gemm, batch, params.tile, device.compute_units) \
      if cost.matrix else 1.0

  def one(work_factor: float, kernels: int, table_bytes: float) -> float:
    mm = cost.matmul_flops_per_sample * batch * work_factor
    conv = cost.conv_flops_per_sample * batch * work_factor
    if params.small_batch_flops > 0 and mm + conv > 0:
      # below small_batch_flops per kernel the chip is not full: time stops shrinking
      floor = params.small_batch_flops * kernels
      if mm + conv < floor:
        mm, conv = mm * floor / (mm + conv), conv * floor / (mm + conv)
    matrix = (mm / params.compute_eff + conv / conv_eff) / (peak * util)
    vector = cost.vector_flops_per_sample * batch * work_factor / (vector_peak * vector_eff)
    memory = (work_factor * (cost.param_bytes + cost.act_bytes_per_sample * batch)
              + table_bytes) / bw
    return 1e3 * max(matrix, vector, memory) + kernels * overhead / 1e3

  bwd_factor = 1.0 if cost.reads_model_input else 2.0
  return (one(1.0, cost.kernels, 0.0),
          one(bwd_factor, 2 * cost.kernels, cost.gathered_bytes))


def times_table(graph: LayerGraph, times, batches: Iterable[int]
                ) -> dict[str, dict[int, tuple[float, float]]]:
  """layer -> batch -> (forward ms, backward ms) from `times(node, batch)`, checked finite."""
  batches = sorted(set(int(b) for b in batches))
  if not batches or batches[0] < 1:
    raise UserError(f"batches must be a non-empty list of integers >= 1, got {batches}")
  layers = {}
  for node in graph.nodes:
    rows = {b: times(node, b) for b in batches}
    for b, (f, w) in rows.items():
      if not (math.isfinite(f) and math.isfinite(w)):
        raise UserError(f"analytic time of layer '{node.name}' at batch {b} is not finite; "
                        "check its flops and bytes in the graph")
    layers[node.name] = rows
  return layers


def analytic_profile(graph: LayerGraph, device: str | DeviceSpec, dtype: str,
                     batches: Iterable[int], params: AnalyticParams | None = None,
                     accept: frozenset[str] = frozenset()) -> ProfileTable:
  """Roofline timings of every layer of `graph` at each per-device batch (params: see above;
  `accept`: layers the graph gives no matrix work for, priced at the vector rate on purpose)."""
  dev = get_device(device) if isinstance(device, str) else device
  params = default_params(dev) if params is None else params
  dev.peak(dtype)  # unknown or unsupported dtype -> UserError before any work
  costs = {n.name: layer_cost(graph, n, dtype, accept) for n in graph.nodes}
  layers = times_table(graph, lambda node, b: layer_times_ms(costs[node.name], dev, dtype, b,
                                                              params), batches)
  return ProfileTable(model=graph.model, device=dev.name, dtype=dtype, source="analytic",
                      layers=layers, meta={"params": asdict(params)})
