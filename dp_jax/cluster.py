"""Cluster: devices, nodes, links, and what collectives and point-to-point moves cost on them.

Units: bandwidth in GB/s (1e9 bytes per second, per device and per direction), latency in
microseconds, memory in GB (1e9 bytes), times in milliseconds. Device i lives on node
i // devices_per_node. The default numbers and their sources are in conf/cluster/*.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from dp_jax.errors import UserError

BYTES_PER_MS_PER_GBPS = 1e6  # 1 GB/s moves 1e6 bytes per millisecond


@dataclass(frozen=True)
class ClusterSpec:
  """A pod of identical nodes, each with identical devices; num_nodes is the pod's maximum."""

  name: str
  device: str  # device model, e.g. "A100-SXM4-40GB", "H100-SXM5-80GB", "cpu"
  num_nodes: int
  devices_per_node: int
  memory_gb_per_device: float
  intra_node_bandwidth_GBps: float
  intra_node_latency_us: float
  inter_node_bandwidth_GBps: float
  inter_node_latency_us: float

  def __post_init__(self):
    for key in ("num_nodes", "devices_per_node"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"cluster {self.name}: {key} must be a positive integer, got {value!r}")
    for key in ("memory_gb_per_device", "intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps"):
      value = getattr(self, key)
      if not _is_number(value) or not value > 0 or not math.isfinite(value):
        raise UserError(f"cluster {self.name}: {key} must be > 0, got {value!r}")
    for key in ("intra_node_latency_us", "inter_node_latency_us"):
      value = getattr(self, key)
      if not _is_number(value) or value < 0 or not math.isfinite(value):
        raise UserError(f"cluster {self.name}: {key} must be >= 0, got {value!r}")

  @property
  def num_devices(self) -> int:
    return self.num_nodes * self.devices_per_node

  def with_num_devices(self, num_devices: int) -> ClusterSpec:
    """The spec of a job on `num_devices` devices: as many nodes as it fills, filled in order."""
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
      raise UserError(f"num_devices must be a positive integer, got {num_devices!r}")
    if num_devices > self.num_devices:
      raise UserError(
          f"cluster {self.name} has at most {self.num_devices} devices ({self.num_nodes} nodes x "
          f"{self.devices_per_node}), got num_devices={num_devices}; use fewer devices or a "
          "larger cluster")
    return replace(self, num_nodes=-(-num_devices // self.devices_per_node))

  def node_of(self, device: int) -> int:
    return device // self.devices_per_node


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


_FIELDS = tuple(f.name for f in fields(ClusterSpec))


def load_cluster(config: Mapping[str, Any]) -> ClusterSpec:
  """A ClusterSpec from a config mapping (a conf/cluster/*.yaml file or its Hydra node)."""
  if not isinstance(config, Mapping):
    raise UserError(f"cluster config must be a mapping of fields, got {type(config).__name__}")
  name = str(config.get("name", "cluster"))
  unknown = sorted(set(config) - set(_FIELDS))
  if unknown:
    raise UserError(f"cluster {name}: unknown field(s) {', '.join(unknown)} "
                    f"(valid: {', '.join(_FIELDS)})")
  missing = [k for k in _FIELDS if k not in config]
  if missing:
    raise UserError(f"cluster {name}: missing field(s) {', '.join(missing)}")
  values = dict(config)
  for key in ("memory_gb_per_device", "intra_node_bandwidth_GBps", "intra_node_latency_us",
              "inter_node_bandwidth_GBps", "inter_node_latency_us"):
    if not _is_number(values[key]):
      raise UserError(f"cluster {name}: {key} must be a number, got {values[key]!r}")
    values[key] = float(values[key])
  values["name"], values["device"] = name, str(values["device"])
  return ClusterSpec(**values)


# --- collective costs (pure) ------------------------------------------------------------------


def _device_list(cluster: ClusterSpec, devices: Iterable[int]) -> list[int]:
  devs = list(devices)
  if not devs:
    raise UserError("a collective needs at least one device, got an empty device list")
  for d in devs:
    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
      raise UserError(f"device indices must be integers >= 0, got {d!r}")
  return devs


def link_for(cluster: ClusterSpec, devices: Iterable[int]) -> tuple[float, float]:
  """(bandwidth GB/s, latency us) of the slowest link the device group spans."""
  devs = _device_list(cluster, devices)
  nodes = {cluster.node_of(d) for d in devs}
  if len(nodes) == 1:
    return cluster.intra_node_bandwidth_GBps, cluster.intra_node_latency_us
  return cluster.inter_node_bandwidth_GBps, cluster.inter_node_latency_us


def ring_allreduce_ms(nbytes: float, g: int, bandwidth_GBps: float, latency_us: float) -> float:
  """Ring all-reduce time: 2(g-1)/g x bytes / bandwidth + 2(g-1) x latency; 0 on one device."""
  if g <= 1:
    return 0.0
  return (2.0 * (g - 1) / g * nbytes / (bandwidth_GBps * BYTES_PER_MS_PER_GBPS)
          + 2.0 * (g - 1) * latency_us / 1000.0)


def allreduce_ms(cluster: ClusterSpec, nbytes: float, devices: Iterable[int]) -> float:
  """Ring all-reduce of `nbytes` over `devices`, on the slowest link they span."""
  devs = _device_list(cluster, devices)
  if nbytes < 0:
    raise UserError(f"all-reduce size must be >= 0 bytes, got {nbytes}")
  bw, lat = link_for(cluster, devs)
  return ring_allreduce_ms(nbytes, len(set(devs)), bw, lat)


def transfer_ms(cluster: ClusterSpec, busiest_bytes: float,
                devices_involved: Iterable[int]) -> float:
  """Point-to-point move of sample ranges: busiest device's bytes in or out / bw + latency."""
  if busiest_bytes < 0:
    raise UserError(f"transfer size must be >= 0 bytes, got {busiest_bytes}")
  if busiest_bytes == 0:
    return 0.0
  bw, lat = link_for(cluster, devices_involved)
  return busiest_bytes / (bw * BYTES_PER_MS_PER_GBPS) + lat / 1000.0
