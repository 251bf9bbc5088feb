"""DeviceSpec: peak dense FLOP/s per dtype, memory bandwidth and size, per-kernel overhead."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from dp_jax.base.errors import UserError

DTYPES = ("float32", "tf32", "bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2}
# Per-kernel fixed cost of an NVIDIA GPU, not given by any datasheet: we take the timing floor of
# the A100 tables shipped in dp_jax/layer_times/data/deeppool_a100 (A100_vgg.prof: flatten, forward
# 5 us, a layer of at most one trivial kernel; maxPool2d on 512x14x14 at batch 2, forward 8 us).
# Used for every NVIDIA device below; the analytic model counts kernels per layer (see analytic.py).
GPU_KERNEL_OVERHEAD_US = 5.0


@dataclass(frozen=True)
class DeviceSpec:
  """One accelerator: peak dense FLOP/s per dtype, memory bandwidth (bytes/s) and size."""

  name: str
  peak_flops: Mapping[str, float]  # dtype -> dense FLOP/s (no structured sparsity)
  mem_bandwidth: float  # bytes/s
  memory_gb: float
  kernel_overhead_us: float
  compute_units: int = 1  # SMs of a GPU, cores of a CPU: how many tiles of work run at once
  notes: str = ""
  nvlink_GBps: float | None = None  # NVLink bandwidth per direction per GPU (None: none)
  meta: Mapping[str, object] = field(default_factory=dict)

  def __post_init__(self):
    for key, val in (("memory bandwidth", self.mem_bandwidth), ("memory size", self.memory_gb)):
      if not (isinstance(val, (int, float)) and math.isfinite(val) and val > 0):
        raise UserError(f"device {self.name}: {key} must be a positive number, got {val}")
    if isinstance(self.compute_units, bool) or not isinstance(self.compute_units, int) \
        or self.compute_units < 1:
      raise UserError(f"device {self.name}: compute_units must be an integer >= 1, "
                      f"got {self.compute_units}")
    if not (math.isfinite(self.kernel_overhead_us) and self.kernel_overhead_us >= 0):
      raise UserError(f"device {self.name}: kernel overhead must be >= 0 us, "
                      f"got {self.kernel_overhead_us}")
    for dt, f in self.peak_flops.items():
      if dt not in DTYPES:
        raise UserError(f"device {self.name}: dtype '{dt}' is unknown (valid: {', '.join(DTYPES)})")
      if not (math.isfinite(f) and f > 0):
        raise UserError(f"device {self.name}: peak FLOP/s for {dt} must be positive, got {f}")

  def peak(self, dtype: str) -> float:
    """Peak dense FLOP/s for `dtype`; an unsupported dtype is a UserError."""
    dtype = canonical_dtype(dtype)
    if dtype not in self.peak_flops:
      raise UserError(f"device {self.name} has no {dtype} peak (it supports "
                      f"{', '.join(self.peak_flops)}); pick one of those dtypes")
    return self.peak_flops[dtype]


_T = 1e12
_G = 1e9

DEVICES: dict[str, DeviceSpec] = {
    # "NVIDIA Tesla V100 GPU Accelerator" datasheet (V100 SXM2): single precision 15.7, tensor
    # performance 125 TFLOPS; HBM2 32 GB at 900 GB/s. 80 SMs: "NVIDIA Tesla V100 GPU
    # Architecture" whitepaper (Tesla V100 column). No TF32 or BF16 on Volta.
    # NVLink 2: 300 GB/s total per GPU (the same datasheet), 150 per direction.
    "V100-SXM2-32GB": DeviceSpec(
        "V100-SXM2-32GB", {"float32": 15.7 * _T, "float16": 125 * _T}, 900 * _G, 32,
        GPU_KERNEL_OVERHEAD_US, 80, "float16 is the tensor-core rate; no tf32/bfloat16 on Volta",
        nvlink_GBps=150),
    # "NVIDIA A100 Tensor Core GPU" datasheet (A100 40GB SXM): FP32 19.5, TF32 156, BF16 312,
    # FP16 312 TFLOPS (dense; the datasheet's starred numbers double these with sparsity);
    # HBM2 40 GB at 1,555 GB/s. 108 SMs: "NVIDIA A100 Tensor Core GPU Architecture" whitepaper.
    # NVLink 3: 600 GB/s total per GPU (datasheet), 300 per direction.
    "A100-SXM4-40GB": DeviceSpec(
        "A100-SXM4-40GB", {"float32": 19.5 * _T, "tf32": 156 * _T, "bfloat16": 312 * _T,
                           "float16": 312 * _T}, 1555 * _G, 40, GPU_KERNEL_OVERHEAD_US, 108,
        nvlink_GBps=300),
    # Same datasheet, A100 80GB SXM: same FLOP/s and SMs; HBM2e 80 GB at 2,039 GB/s.
    "A100-SXM4-80GB": DeviceSpec(
        "A100-SXM4-80GB", {"float32": 19.5 * _T, "tf32": 156 * _T, "bfloat16": 312 * _T,
                           "float16": 312 * _T}, 2039 * _G, 80, GPU_KERNEL_OVERHEAD_US, 108,
        nvlink_GBps=300),
    # "NVIDIA H100 Tensor Core GPU" datasheet (H100 SXM): FP32 67 TFLOPS; TF32 989, BF16 1,979,
    # FP16 1,979 TFLOPS with sparsity, so 494.5 / 989.5 / 989.5 dense; HBM3 80 GB at 3.35 TB/s.
    # 132 SMs (H100 SXM5): "NVIDIA H100 Tensor Core GPU Architecture" whitepaper. NVLink 4:
    # 900 GB/s total per GPU (datasheet), 450 per direction.
    "H100-SXM5-80GB": DeviceSpec(
        "H100-SXM5-80GB", {"float32": 67 * _T, "tf32": 494.5 * _T, "bfloat16": 989.5 * _T,
                           "float16": 989.5 * _T}, 3350 * _G, 80, GPU_KERNEL_OVERHEAD_US, 132,
        nvlink_GBps=450),
    # "NVIDIA H200 Tensor Core GPU" datasheet (H200 SXM): the H100's compute (FP32 67; TF32 989,
    # BF16/FP16 1,979 TFLOPS with sparsity, half that dense); HBM3e 141 GB at 4.8 TB/s. Same
    # GH100 chip as the H100 SXM5, so 132 SMs. NVLink 4: 900 GB/s total (datasheet), 450 per
    # direction.
    "H200-SXM-141GB": DeviceSpec(
        "H200-SXM-141GB", {"float32": 67 * _T, "tf32": 494.5 * _T, "bfloat16": 989.5 * _T,
                           "float16": 989.5 * _T}, 4800 * _G, 141, GPU_KERNEL_OVERHEAD_US, 132,
        nvlink_GBps=450),
    # This machine's CPU (2 vCPUs of an AMD EPYC, family 25 model 1, AVX2+FMA, 24 GB RAM, KVM),
    # measured 2026-11-29 with `python scripts/bench_device.py --repeats 30` (jax 0.12 CPU):
    # median of 30 jitted 2048x2048 matmuls: float32 135.9, bfloat16 116.9, float16 112.6 GFLOP/s
    # (no TF32 on a CPU: tf32 runs as float32); memory: jitted a + 2*b over 256 MiB float32
    # arrays, 5.96 GB/s (XLA allocates the output each call; numpy's in-place add reaches
    # 19.1 GB/s on the same arrays, recorded as meta only); per-kernel cost: a jitted 1-element
    # add, 27.6 us (dispatch + block_until_ready). 2 cores (lscpu).
    "cpu": DeviceSpec(
        "cpu", {"float32": 135.9 * _G, "tf32": 135.9 * _G, "bfloat16": 116.9 * _G,
                "float16": 112.6 * _G}, 5.96 * _G, 24, 27.6, 2,
        "measured on the development machine, 2026-11-29 (scripts/bench_device.py)",
        {"numpy_add_bytes_per_s": 19.1 * _G}),
}

_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16",
            "f16": "float16", "half": "float16", "mixed fp16": "float16", "mixed_fp16": "float16",
            "mixed bf16": "bfloat16", "mixed_bf16": "bfloat16"}


def canonical_dtype(dtype: str) -> str:
  """'bf16', 'mixed fp16', ... -> one of DTYPES; unknown names are a UserError."""
  d = _ALIASES.get(str(dtype).lower(), str(dtype).lower())
  if d not in DTYPES:
    raise UserError(f"dtype '{dtype}' is unknown (valid: {', '.join(DTYPES)} or "
                    f"{', '.join(sorted(_ALIASES))})")
  return d


def is_mixed(dtype: str) -> bool:
  """True for 'mixed fp16' / 'mixed bf16': float32 master weights, half-precision compute."""
  return str(dtype).lower().startswith("mixed")


def get_device(name: str) -> DeviceSpec:
  """The DeviceSpec called `name`; an unknown name is a UserError listing the valid ones."""
  try:
    return DEVICES[name]
  except KeyError:
    raise UserError(f"device '{name}' is unknown (valid: {', '.join(DEVICES)})") from None


def device_names() -> list[str]:
  return list(DEVICES)
