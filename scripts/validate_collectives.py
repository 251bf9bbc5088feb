"""The collective model (dp_jax/hardware/cluster.py) against published all-reduce measurements.

    python scripts/validate_collectives.py

For each cited nccl-tests measurement: the bus bandwidth the model (the cluster config of that
hardware: dgx_a100, dgx_h100, dgx_h200) gives the same GPUs, NICs and group, and the time of one
all-reduce of the reported size, each as model / measured; small all-reduces (latency alone) at
2 and 256 ranks; the `flat`
pricing (one ring through one NIC at line rate) beside it. nccl-tests reports
busbw = (bytes / time) x 2(n-1)/n, so the measured time is the one its busbw implies.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dp_jax.hardware.cluster import ClusterConfig, allreduce_ms, bus_bandwidth_GBps, named_cluster  # noqa: E402

TOLERANCE = 0.15


@dataclass(frozen=True)
class Measurement:
  """One published all_reduce_perf result, and the cluster config whose model it checks."""

  source: str
  setup: str
  nodes: int
  gpus_per_node: int
  nics_per_node: int
  size_bytes: float
  busbw_GBps: float
  used_for: str  # which model parameter it set, or "held out"
  cluster: str = "dgx_a100"


MEASUREMENTS = (
    Measurement("NVIDIA/nccl issue 1048", "1 node, 8 A100-SXM4, NVSwitch", 1, 8, 4, 4 * 2**30,
                232.54, "intra_node_bus_efficiency (mean with nccl-tests #149)"),
    Measurement("NVIDIA/nccl-tests issue 149", "1 node, 8 A100-SXM4-80GB, NVSwitch", 1, 8, 0,
                2**30, 200.0, "intra_node_bus_efficiency (mean with nccl #1048)"),
    Measurement("NVIDIA/nccl issue 812 (NCCL team)", "DGX A100 nodes, 8 x HDR 200 Gb/s NICs each",
                2, 8, 8, 8 * 2**30, 192.0, "inter_node_bus_efficiency"),
    Measurement("NVIDIA/nccl issue 1048", "2 nodes x 8 A100, 4 x HDR 200 Gb/s NICs each", 2, 8, 4,
                4 * 2**30, 86.0, "held out"),
    Measurement("NVIDIA/nccl-tests issue 119", "3 nodes x 8 A100-SXM4-40GB, 4 x HDR NICs each "
                "(peak busbw)", 3, 8, 4, 128 * 2**20, 96.0, "held out"),
    Measurement("NVIDIA/nccl-tests issue 290", "1 node, 8 H100 SXM, NVLink 4 (NVLink SHARP)",
                1, 8, 8, 8 * 2**30, 476.0, "intra_node_bus_efficiency (capped at 1)",
                "dgx_h100"),
    Measurement("NVIDIA/nccl-tests issue 272", "1 node, 8 H200, NVLink 4 (peak)", 1, 8, 8,
                4 * 2**30, 475.0, "intra_node_bus_efficiency (capped at 1)", "dgx_h200"),
    Measurement("NVIDIA/nccl-tests issue 290 (NCCL team)", "H100 nodes, 8 x NDR 400 Gb/s NICs "
                "(46-48 GB/s per NIC)", 2, 8, 8, 8 * 2**30, 8 * 47.0,
                "inter_node_bus_efficiency", "dgx_h100"),
)


# Small-message all-reduces: the time is the latency term alone (busbw field: algbw).
LATENCY_MEASUREMENTS = (
    Measurement("NVIDIA/nccl issue 583", "1 node, 2 A100-SXM4-40GB, NVLink (32 B, out-of-place)",
                1, 2, 0, 32, 32 / 10.14e-6 / 1e9, "intra_node_latency_us"),
    Measurement("NVIDIA/nccl-tests issue 150", "2 nodes x 1 A100-80GB, InfiniBand HDR "
                "(8 B, out-of-place)", 2, 1, 1, 8, 8 / 19.90e-6 / 1e9, "inter_node_latency_us"),
    Measurement("NVIDIA/nccl issue 652", "32 nodes x 8 A100-SXM4, 4 x HDR NICs each, 256 ranks "
                "(8 B, out-of-place)", 32, 8, 4, 8, 8 / 62.99e-6 / 1e9,
                "inter_node_latency_per_doubling_us"),
)


def base_cluster(name: str = "dgx_a100") -> ClusterConfig:
  return named_cluster(name)


def compare(m: Measurement, base: ClusterConfig) -> dict[str, float]:
  """Model and flat bus bandwidth and time for one measurement, as ratios to it."""
  spec = replace(base, num_nodes=m.nodes, devices_per_node=m.gpus_per_node,
                 nics_per_node=m.nics_per_node)
  n = m.nodes * m.gpus_per_node
  flat = replace(spec, collectives="flat")
  measured_ms = 2 * (n - 1) / n * m.size_bytes / (m.busbw_GBps * 1e6)
  model_bw = float(bus_bandwidth_GBps(spec, 0, n))
  model_ms = float(allreduce_ms(spec, m.size_bytes, 0, n))
  return {"model_busbw": model_bw, "busbw_ratio": model_bw / m.busbw_GBps,
          "model_ms": model_ms, "measured_ms": measured_ms, "time_ratio": model_ms / measured_ms,
          "flat_busbw": float(bus_bandwidth_GBps(flat, 0, n)),
          "flat_busbw_ratio": float(bus_bandwidth_GBps(flat, 0, n)) / m.busbw_GBps}


def latency_us(m: Measurement, base: ClusterConfig) -> tuple[float, float]:
  """(model, measured) time of one small all-reduce in microseconds (busbw field: algbw)."""
  spec = replace(base, num_nodes=m.nodes, devices_per_node=m.gpus_per_node,
                 nics_per_node=max(m.nics_per_node, 1))
  n = m.nodes * m.gpus_per_node
  return float(allreduce_ms(spec, m.size_bytes, 0, n)) * 1e3, m.size_bytes / m.busbw_GBps / 1e3


def table() -> list[tuple[Measurement, dict[str, float]]]:
  return [(m, compare(m, base_cluster(m.cluster))) for m in MEASUREMENTS]


def latency_table() -> list[tuple[Measurement, float, float]]:
  return [(m, *latency_us(m, base_cluster(m.cluster))) for m in LATENCY_MEASUREMENTS]


def main() -> int:
  rows = table()
  print("| source | setup | cluster | size | measured busbw GB/s | model busbw GB/s | "
        "model / measured (busbw) | model / measured (time) | flat busbw / measured | "
        "parameter it set |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for m, r in rows:
    print(f"| {m.source} | {m.setup} | {m.cluster} | {m.size_bytes / 2**20:g} MiB | "
          f"{m.busbw_GBps:g} | "
          f"{r['model_busbw']:.1f} | {r['busbw_ratio']:.3f} | {r['time_ratio']:.3f} | "
          f"{r['flat_busbw_ratio']:.3f} | {m.used_for} |")
  print("\n| source | setup | measured us | model us | model / measured | parameter it set |")
  print("| --- | --- | --- | --- | --- | --- |")
  lat = latency_table()
  for m, model_us, measured_us in lat:
    print(f"| {m.source} | {m.setup} | {measured_us:.2f} | {model_us:.2f} | "
          f"{model_us / measured_us:.3f} | {m.used_for} |")
  worst = max([abs(r["time_ratio"] - 1) for _, r in rows]
              + [abs(model / measured - 1) for _, model, measured in lat])
  print(f"\nworst time error {worst:.1%} (tolerance {TOLERANCE:.0%})")
  return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
  sys.exit(main())
