"""Cluster: devices, nodes, links, and what collectives and point-to-point moves cost on them.

Units: bandwidth in GB/s (1e9 bytes per second, per device and per direction), latency in
microseconds, memory in GB (1e9 bytes), times in milliseconds. Device i lives on node
i // devices_per_node. The default numbers and their sources are in conf/cluster/*.yaml.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from dp_jax.base.checks import REQUIRED, Checked, ConfigError, build, option
from dp_jax.base.errors import UserError
from dp_jax.base.yamlfile import group_file

BYTES_PER_MS_PER_GBPS = 1e6  # 1 GB/s moves 1e6 bytes per millisecond


COLLECTIVE_MODELS = ("rail", "flat")
_POSITIVE = dict(low=0, low_open=True)
_EFFICIENCY = dict(low=0, low_open=True, high=1)
_NON_NEGATIVE = dict(low=0)


@dataclass(frozen=True)
class ClusterConfig(Checked):
  """The cluster group (conf/cluster/): a pod of identical nodes, each with identical devices;
  num_nodes is the pod's maximum, num_devices the job's G (None: every device of the pod).

  Links: inside a node every device has intra_node_bandwidth_GBps (line rate, per direction);
  nodes connect through nics_per_node NICs of inter_node_bandwidth_GBps each. A collective
  reaches `bus efficiency x line rate` of bus bandwidth (what nccl-tests reports as busbw);
  latencies are per collective (or per point-to-point move); a collective that spans n > 2
  nodes adds inter_node_latency_per_doubling_us per doubling of n beyond 2 (NCCL's tree and
  ring latencies grow with the nodes they cross). collectives="rail" prices collectives as NCCL
  runs them (one ring per NIC rail); "flat" is the old single ring through one link at line
  rate (same latencies), kept for comparison only. Host and program costs of running a plan's
  stages (docs/cost_model.md, "Stage terms"): launching one stage's program, the extra host
  work of one stage boundary, and the memory bandwidth the optimizer update reaches (0: the
  device's datasheet bandwidth).

  Every physical number is required: a cluster file states each with its source. The three
  defaults are definitions, not measurements: one node; nics_per_node 0 meaning one NIC per
  device (the DGX A100 / H100 datasheets' layout); collectives `rail`.
  """

  GROUP = "cluster"

  name: str = REQUIRED
  device: str = REQUIRED  # device model, e.g. "A100-SXM4-40GB", "H100-SXM5-80GB", "cpu"
  num_nodes: int = option(1, low=1, integer=True)
  devices_per_node: int = option(REQUIRED, low=1, integer=True)
  memory_gb_per_device: float = option(REQUIRED, **_POSITIVE)
  intra_node_bandwidth_GBps: float = option(REQUIRED, **_POSITIVE)
  intra_node_latency_us: float = option(REQUIRED, **_NON_NEGATIVE)
  inter_node_bandwidth_GBps: float = option(REQUIRED, **_POSITIVE)  # per NIC
  inter_node_latency_us: float = option(REQUIRED, **_NON_NEGATIVE)
  nics_per_node: int = option(0, low=0, integer=True, hint="0: one NIC per device")
  intra_node_bus_efficiency: float = option(REQUIRED, **_EFFICIENCY)
  inter_node_bus_efficiency: float = option(REQUIRED, **_EFFICIENCY)
  collectives: str = option("rail", choices=COLLECTIVE_MODELS)
  inter_node_latency_per_doubling_us: float = option(REQUIRED, **_NON_NEGATIVE)
  program_launch_us: float = option(REQUIRED, **_NON_NEGATIVE)
  stage_boundary_us: float = option(REQUIRED, **_NON_NEGATIVE)
  update_memory_GBps: float = option(REQUIRED, **_NON_NEGATIVE)
  num_devices: int | None = option(None, low=1, integer=True)

  def required_hint(self) -> str:
    return (f" for cluster {self.name} (a cluster file states every number with its source; "
            "see conf/cluster/ and docs/extending.md)")

  def check(self) -> None:
    for key in _FLOATS:
      object.__setattr__(self, key, float(getattr(self, key)))
    if self.device != "cpu":  # host devices' links are measured here (dp_jax/measurement)
      check_plausible(self)
    g = self.num_devices
    if g is not None and g > self.pod_devices:
      raise ConfigError("num_devices", f"={g}: cluster {self.name} has at most "
                        f"{self.pod_devices} devices ({self.num_nodes} nodes x "
                        f"{self.devices_per_node}); use fewer devices or a larger cluster")

  @property
  def nics(self) -> int:
    """NICs per node (nics_per_node, or one per device when 0)."""
    return self.nics_per_node or self.devices_per_node

  @property
  def intra_bus_GBps(self) -> float:
    """Bus bandwidth of a collective inside one node."""
    if self.collectives == "flat":
      return self.intra_node_bandwidth_GBps
    return self.intra_node_bandwidth_GBps * self.intra_node_bus_efficiency

  @property
  def pod_devices(self) -> int:
    """Every device of the pod."""
    return self.num_nodes * self.devices_per_node

  @property
  def job_devices(self) -> int:
    """The job's G: num_devices, or every device of the pod."""
    return self.pod_devices if self.num_devices is None else self.num_devices

  def with_num_devices(self, num_devices: int) -> ClusterConfig:
    """The cluster of a job on `num_devices` devices: as many nodes as it fills, filled in
    order."""
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
      raise UserError(f"num_devices must be a positive integer, got {num_devices!r}")
    if num_devices > self.pod_devices:
      raise UserError(
          f"cluster {self.name} has at most {self.pod_devices} devices ({self.num_nodes} nodes "
          f"x {self.devices_per_node}), got num_devices={num_devices}; use fewer devices or a "
          "larger cluster")
    return replace(self, num_nodes=-(-num_devices // self.devices_per_node),
                   num_devices=num_devices)

  def node_of(self, device: int) -> int:
    return device // self.devices_per_node


_FLOATS = ("memory_gb_per_device", "intra_node_bandwidth_GBps", "intra_node_latency_us",
           "inter_node_bandwidth_GBps", "inter_node_latency_us", "intra_node_bus_efficiency",
           "inter_node_bus_efficiency", "inter_node_latency_per_doubling_us",
           "program_launch_us", "stage_boundary_us", "update_memory_GBps")


# The largest values a real cluster has (per device, per direction), to catch a unit mix-up:
# NVLink 5 (NVIDIA B200 datasheet: 1.8 TB/s total per GPU) is 900 GB/s per direction, also the
# most an NVLink fabric between nodes carries; the fastest NIC (NVIDIA ConnectX-8 SuperNIC:
# 800 Gb/s) is 100 GB/s; the largest accelerator memory (AMD MI355X / NVIDIA B300: 288 GB) is
# far below 4096 GB (a host "device" may hold more); a collective's latency is microseconds,
# not the 0.1 s a unit slip (ms or ns) would give.
PLAUSIBLE_MAX = {
    "intra_node_bandwidth_GBps": (900, "GB/s per device per direction (NVLink 5 carries 900; "
                                  "halve a bidirectional total, divide Gb/s by 8)"),
    "inter_node_bandwidth_GBps": (900, "GB/s per NIC per direction (an 800 Gb/s NIC is 100 "
                                  "GB/s; divide Gb/s by 8: 400 Gb/s is 50 GB/s)"),
    "memory_gb_per_device": (4096, "GB (1e9 bytes) per device, not MB"),
    "intra_node_latency_us": (1e5, "microseconds per collective (10 us is typical inside a "
                              "node), not nanoseconds"),
    "inter_node_latency_us": (1e5, "microseconds per collective (20 us is typical across "
                              "InfiniBand), not nanoseconds"),
}
FASTEST_NIC_GBPS = 100  # ConnectX-8: 800 Gb/s


def check_plausible(spec: ClusterConfig) -> None:
  """Refuse values no real cluster has (a unit mix-up), with a hint about the unit.

  Between nodes more than a NIC carries (100 GB/s) is an NVLink-class fabric; it is accepted up
  to the NVLink inside the node (an NVLink-class what-if, e.g. the network study's 300 GB/s on
  DGX A100), not beyond: a link out of a node faster than any NIC and than the node's own links
  is a unit slip.
  """
  for key, (limit, unit) in PLAUSIBLE_MAX.items():
    value = getattr(spec, key)
    if value > limit:
      raise ConfigError(key, f"={value:g} is above {limit:g}, more than any real cluster; "
                        f"the unit is {unit}")
  inter, intra = spec.inter_node_bandwidth_GBps, spec.intra_node_bandwidth_GBps
  if inter > FASTEST_NIC_GBPS and inter > intra:
    raise ConfigError("inter_node_bandwidth_GBps", f"={inter:g} is above {FASTEST_NIC_GBPS} "
                      f"GB/s (the fastest NIC, 800 Gb/s) and above the node's own links "
                      f"({intra:g} GB/s); the unit is "
                      f"{PLAUSIBLE_MAX['inter_node_bandwidth_GBps'][1]}")


def cluster_file(name: str) -> dict:
  """The cluster config conf/cluster/<name>.yaml, or the YAML file `name` names, as a dict."""
  return group_file("cluster", name)


def named_cluster(name: str, **changes: Any) -> ClusterConfig:
  """The cluster conf/cluster/<name>.yaml (or the YAML file `name` names), with `changes`."""
  return build(ClusterConfig, {**cluster_file(name), **changes})


def to_record(spec: ClusterConfig, num_devices: int) -> dict[str, Any]:
  """What a plan records of the cluster it was made for: every field and G."""
  return {**asdict(spec), "num_devices": num_devices}


# --- collective and move costs (pure, numpy-vectorised over device ranges) ---------------------
#
# A device range is (start, count): devices [start, start + count) of the job, device i on node
# i // devices_per_node. Its link class is 0 inside one node, else the number of its devices on
# its least-populated node (1..devices_per_node): NCCL builds one ring per NIC rail, so a ring
# that spans nodes runs at most at (rails the sparsest node can feed) x NIC bandwidth.


def link_class(cluster: ClusterConfig, start, count):
  """0 for a range inside one node, else the devices of its least-populated node."""
  dpn = cluster.devices_per_node
  start, count = np.asarray(start), np.asarray(count)
  last = start + count - 1
  spans = start // dpn != last // dpn
  least = np.minimum(dpn - start % dpn, last % dpn + 1)
  return np.where(spans, least, 0).astype(np.int64)


@cache
def class_bus_GBps(cluster: ClusterConfig) -> np.ndarray:
  """(devices_per_node + 1,) bus bandwidth of a collective per link class (read-only: cached)."""
  out = _class_bus_GBps(cluster)
  out.setflags(write=False)
  return out


def _class_bus_GBps(cluster: ClusterConfig) -> np.ndarray:
  k = np.arange(cluster.devices_per_node + 1)
  if cluster.collectives == "flat":
    return np.where(k == 0, cluster.intra_node_bandwidth_GBps, cluster.inter_node_bandwidth_GBps)
  rails = np.minimum(k, cluster.nics) * cluster.inter_node_bandwidth_GBps
  inter = np.minimum(cluster.intra_bus_GBps, rails * cluster.inter_node_bus_efficiency)
  return np.where(k == 0, cluster.intra_bus_GBps, inter)


def class_latency_ms(cluster: ClusterConfig, count) -> np.ndarray:
  """(devices_per_node + 1, *count.shape) latency of one collective per link class and size:
  the class's latency once per collective (0 on one device), in both pricings; across nodes
  plus inter_node_latency_per_doubling_us x log2(nodes / 2), nodes = max(2, ceil(count /
  devices_per_node)) (the nodes a group of `count` devices spans at least)."""
  count = np.asarray(count, dtype=float)
  k = np.arange(cluster.devices_per_node + 1).reshape((-1,) + (1,) * count.ndim)
  nodes = np.maximum(2.0, np.ceil(count / cluster.devices_per_node))
  inter = cluster.inter_node_latency_us + cluster.inter_node_latency_per_doubling_us * np.log2(
      nodes / 2.0)
  lat = np.where(k == 0, cluster.intra_node_latency_us, inter) / 1000.0
  return lat * (count > 1)


def bus_bandwidth_GBps(cluster: ClusterConfig, start, count):
  """Bus bandwidth of a collective over devices [start, start + count)."""
  if isinstance(start, int) and isinstance(count, int):  # one range: cached
    return _range_link(cluster, start, count)[0]
  return class_bus_GBps(cluster)[link_class(cluster, start, count)]


def collective_latency_ms(cluster: ClusterConfig, start, count):
  """Latency of one collective over devices [start, start + count) (0 on one device)."""
  if isinstance(start, int) and isinstance(count, int):  # one range: cached
    return _range_link(cluster, start, count)[1]
  return _latency_ms(cluster, start, count)


@cache
def _range_link(cluster: ClusterConfig, start: int, count: int) -> tuple[float, float]:
  """(bus bandwidth, latency) of one range, as the array versions price it."""
  return (float(class_bus_GBps(cluster)[link_class(cluster, start, count)]),
          float(_latency_ms(cluster, start, count)))


def _latency_ms(cluster: ClusterConfig, start, count):
  cls = link_class(cluster, start, count)
  table = class_latency_ms(cluster, count)
  return np.take_along_axis(table, np.asarray(cls)[None, ...], axis=0)[0] if np.ndim(cls) else (
      table[int(cls)])


def volume_ms(nbytes, count, bus_GBps, factor: float = 2.0):
  """Bandwidth part of a collective: factor (n-1)/n x bytes / bus bandwidth (0 on one device).

  factor 2 for all-reduce, 1 for all-gather and reduce-scatter.
  """
  count = np.asarray(count, dtype=float)
  return factor * (count - 1) / count * np.asarray(nbytes) / (
      np.asarray(bus_GBps) * BYTES_PER_MS_PER_GBPS)


def allreduce_ms(cluster: ClusterConfig, nbytes, start, count):
  """All-reduce of nbytes over devices [start, start + count): 2(n-1)/n bytes/busbw + latency."""
  return (volume_ms(nbytes, count, bus_bandwidth_GBps(cluster, start, count))
          + collective_latency_ms(cluster, start, count))


def allgather_ms(cluster: ClusterConfig, nbytes, start, count):
  """All-gather of nbytes (the gathered size) over the range: (n-1)/n bytes/busbw + latency."""
  return (volume_ms(nbytes, count, bus_bandwidth_GBps(cluster, start, count), 1.0)
          + collective_latency_ms(cluster, start, count))


reduce_scatter_ms = allgather_ms  # same volume and latency as an all-gather of the same size


def p2p_link(cluster: ClusterConfig, first, last):
  """(bytes per ms, latency ms) of one device's point-to-point link for devices [first, last].

  Inside a node: the bus bandwidth of NVLink-class links; across nodes: the device's share of
  its node's NICs at the inter-node efficiency (flat: the line rates).
  """
  dpn = cluster.devices_per_node
  intra = np.asarray(first) // dpn == np.asarray(last) // dpn
  if cluster.collectives == "flat":
    inter_bw = cluster.inter_node_bandwidth_GBps
  else:
    inter_bw = (cluster.inter_node_bandwidth_GBps * cluster.inter_node_bus_efficiency
                * min(1.0, cluster.nics / dpn))
  bw = np.where(intra, cluster.intra_bus_GBps, inter_bw) * BYTES_PER_MS_PER_GBPS
  lat = np.where(intra, cluster.intra_node_latency_us, cluster.inter_node_latency_us) / 1000.0
  return bw, lat


# --- strided groups (a 2-D mesh's data axis: devices first, first + stride, ...) ---------------


@cache
def strided_link_class(cluster: ClusterConfig, first: int, count: int, stride: int) -> int:
  """link_class of the devices first + i stride, i < count: 0 inside one node, else the devices
  of its least-populated node (stride 1 is link_class of the range)."""
  return int(strided_link_classes(cluster, [first], count, stride)[0])


def strided_link_classes(cluster: ClusterConfig, firsts, count: int, stride: int) -> np.ndarray:
  """strided_link_class of the group starting at each of `firsts` (one array pass)."""
  firsts = np.asarray(firsts, dtype=np.int64).reshape(-1, 1)
  nodes = (firsts + stride * np.arange(count)) // cluster.devices_per_node  # ascending per row
  run = np.concatenate([np.zeros((len(firsts), 1), dtype=np.int64),
                        np.cumsum(np.diff(nodes, axis=1) != 0, axis=1)], axis=1)
  per_node = np.bincount((run + count * np.arange(len(firsts))[:, None]).ravel(),
                         minlength=len(firsts) * count).reshape(len(firsts), count)
  least = np.where(per_node > 0, per_node, count + 1).min(axis=1)
  return np.where(run[:, -1] > 0, least, 0).astype(np.int64)


def strided_volume_ms(cluster: ClusterConfig, nbytes, first: int, count: int, stride: int,
                      factor: float = 2.0) -> float:
  """Bandwidth part of a collective over a strided group (all-reduce: factor 2)."""
  bw = class_bus_GBps(cluster)[strided_link_class(cluster, first, count, stride)]
  return float(volume_ms(nbytes, count, bw, factor))


def group_collective_ms(cluster: ClusterConfig, nbytes, first: int, count: int, stride: int,
                        factor: float = 2.0) -> float:
  """All-reduce (factor 2; all-gather: 1) over a strided group, with its latency."""
  if count <= 1:
    return 0.0
  cls = strided_link_class(cluster, first, count, stride)
  return (strided_volume_ms(cluster, nbytes, first, count, stride, factor)
          + float(class_latency_ms(cluster, count)[cls]))
