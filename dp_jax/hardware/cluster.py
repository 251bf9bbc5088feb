"""Cluster: devices, nodes, links, and what collectives and point-to-point moves cost on them.

Units: bandwidth in GB/s (1e9 bytes per second, per device and per direction), latency in
microseconds, memory in GB (1e9 bytes), times in milliseconds. Device i lives on node
i // devices_per_node. The default numbers and their sources are in conf/cluster/*.yaml.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from dp_jax.base.checks import REQUIRED, Checked, ConfigError, build, option
from dp_jax.base.errors import UserError
from dp_jax.base.yamlfile import group_file
from dp_jax.hardware.devices import get_device

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
  reaches `bus efficiency x line rate` of bus bandwidth (what nccl-tests reports as busbw) at
  GiB sizes. The latencies are measured small-message times (and a point-to-point move's); a
  collective that spans n > 2 nodes adds inter_node_latency_per_doubling_us per doubling of n
  beyond 2. collectives="rail" prices collectives as NCCL runs them: one ring per NIC rail, and
  at every size the algorithm and protocol NCCL's own cost model picks (nccl_allreduce_ms; the
  measured latencies its floor); "flat" is the old single ring through one link at line rate
  with the measured latencies alone, kept for comparison only.
  Host and program costs of running a plan's stages (docs/cost_model.md, "Stage terms"):
  launching one stage's program, the extra host work of one stage boundary, and the memory
  bandwidth the optimizer update reaches (0: the device's datasheet bandwidth).

  Every physical number is required: a cluster file states each with its source, and each is
  checked against the datasheet range of its device and links (check_plausible) unless
  `what_if` says the numbers are invented on purpose (a counterfactual cluster; recorded in
  every plan made on it). The three defaults are definitions, not measurements: one node;
  nics_per_node 0 meaning one NIC per device (the DGX A100 / H100 datasheets' layout);
  collectives `rail`.
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
  what_if: bool = False

  def required_hint(self) -> str:
    return (f" for cluster {self.name} (a cluster file states every number with its source; "
            "see conf/cluster/ and docs/extending.md)")

  def check(self) -> None:
    for key in _FLOATS:
      object.__setattr__(self, key, float(getattr(self, key)))
    # host devices' links are measured here (dp_jax/measurement); a what-if is invented
    if self.device != "cpu" and not self.what_if:
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


# What a cluster's numbers can be, to catch a unit slip: per GPU and per direction, NVLink
# carries at most its datasheet's rate (DeviceSpec.nvlink_GBps: A100 300, H100/H200 450 GB/s;
# the datasheets give the bidirectional total, twice that) and at least a PCIe Gen3 x16 link
# (about 16 GB/s: no multi-GPU node is slower); a NIC carries at most 100 GB/s (NVIDIA
# ConnectX-8 SuperNIC, 800 Gb/s; NDR InfiniBand 400 Gb/s is 50 GB/s, HDR 200 Gb/s 25 GB/s) and
# at least 0.125 GB/s (1 Gb/s Ethernet); a collective's latency is microseconds: NCCL's
# smallest all-reduce inside a node is about 10 us, across nodes about 20 us (NVIDIA/nccl-tests
# issue 150), never below 0.5 us nor above 10,000 us (a value in seconds, milliseconds or
# nanoseconds lands outside); a device holds at most its datasheet's memory.
PCIE_GEN3_X16_GBPS = 16.0
FASTEST_NIC_GBPS = 100.0
SLOWEST_NIC_GBPS = 0.125
LATENCY_US = (0.5, 1e4)


def check_plausible(spec: ClusterConfig) -> None:
  """Refuse numbers outside the datasheet range of the named device and its links, naming the
  likely slip. A link between nodes faster than any NIC is an NVLink-class fabric that spans
  nodes (a what-if, e.g. the network study's 300 GB/s on DGX A100): accepted only at the node's
  own NVLink rate."""
  try:
    device = get_device(spec.device)
  except UserError as e:
    raise ConfigError("device", f"='{spec.device}' is unknown: {e}") from None
  nvlink = device.nvlink_GBps
  intra, inter = spec.intra_node_bandwidth_GBps, spec.inter_node_bandwidth_GBps
  if nvlink is not None and spec.devices_per_node > 1:
    if intra > nvlink:
      raise ConfigError("intra_node_bandwidth_GBps", f"={intra:g} is above the {device.name}'s "
                        f"NVLink, {nvlink:g} GB/s per direction (its datasheet's {2 * nvlink:g} "
                        f"GB/s is both directions together{_slip(intra, nvlink)})")
    if intra < PCIE_GEN3_X16_GBPS:
      raise ConfigError("intra_node_bandwidth_GBps", f"={intra:g} is below a PCIe Gen3 x16 link "
                        f"({PCIE_GEN3_X16_GBPS:g} GB/s per direction), slower than any "
                        "multi-GPU node; the unit is GB/s (1e9 bytes) per device per direction")
  if inter > FASTEST_NIC_GBPS and inter != intra:
    raise ConfigError("inter_node_bandwidth_GBps", f"={inter:g} is above {FASTEST_NIC_GBPS:g} "
                      "GB/s per NIC (the fastest NIC, 800 Gb/s) and is not the node's own NVLink "
                      f"({intra:g} GB/s, an NVLink fabric spanning nodes){_slip(inter, None)}")
  if inter < SLOWEST_NIC_GBPS:
    raise ConfigError("inter_node_bandwidth_GBps", f"={inter:g} is below 1 Gb/s Ethernet "
                      f"({SLOWEST_NIC_GBPS:g} GB/s); the unit is GB/s per NIC per direction")
  for key in ("intra_node_latency_us", "inter_node_latency_us"):
    value = getattr(spec, key)
    if not LATENCY_US[0] <= value <= LATENCY_US[1]:
      raise ConfigError(key, f"={value:g} is outside {LATENCY_US[0]:g}-{LATENCY_US[1]:g} us, "
                        f"where every collective's latency lies{_latency_slip(value)}")
  if spec.memory_gb_per_device > device.memory_gb:
    raise ConfigError("memory_gb_per_device", f"={spec.memory_gb_per_device:g} is more than the "
                      f"{device.memory_gb:g} GB a {device.name} has (the unit is GB, 1e9 bytes, "
                      "per device; MB typed as GB? or another device)")
  if spec.update_memory_GBps * 1e9 > device.mem_bandwidth:
    raise ConfigError("update_memory_GBps", f"={spec.update_memory_GBps:g} is above the "
                      f"{device.name}'s memory bandwidth ({device.mem_bandwidth / 1e9:g} GB/s); "
                      "0 takes the datasheet's")
  if spec.num_nodes > 2 and spec.inter_node_latency_per_doubling_us <= 0:
    raise ConfigError("inter_node_latency_per_doubling_us", "=0 for a pod of more than two "
                      "nodes: a collective's latency grows with the nodes it spans (10.75 us per "
                      "doubling measured on DGX A100, NVIDIA/nccl issue 652); 0 favours plans "
                      "that keep layers on fewer devices")
  if device.name != "cpu" and spec.program_launch_us <= 0:
    raise ConfigError("program_launch_us", "=0: launching a program costs microseconds (5 us, "
                      "the per-kernel floor of DeepPool's A100 tables); 0 favours plans with "
                      "more stages")


def _slip(value: float, line: float | None) -> str:
  """The likely unit slip of a bandwidth above its line rate."""
  if line is not None and abs(value - 2 * line) < 1e-6 * line:
    return f": halve a bidirectional total ({line:g})"
  if value / 8 <= FASTEST_NIC_GBPS:
    return (f"; Gb/s typed as GB/s? {value:g} Gb/s is {value / 8:g} GB/s (NDR 400 Gb/s is 50 "
            "GB/s per NIC)")
  return "; the unit is GB/s (1e9 bytes) per device per direction"


def _latency_slip(value: float) -> str:
  if value < LATENCY_US[0]:
    return (f"; the unit is microseconds: a value in seconds or milliseconds? ({value:g} s is "
            f"{value * 1e6:g} us, {value:g} ms is {value * 1e3:g} us)")
  return f"; in nanoseconds? {value:g} ns is {value / 1e3:g} us; the unit is microseconds"


def cluster_file(name: str) -> dict:
  """The cluster config conf/cluster/<name>.yaml, or the YAML file `name` names, as a dict."""
  return group_file("cluster", name)


def named_cluster(name: str, **changes: Any) -> ClusterConfig:
  """The cluster conf/cluster/<name>.yaml (or the YAML file `name` names), with `changes`."""
  return build(ClusterConfig, {**cluster_file(name), **changes})


def to_record(spec: ClusterConfig, num_devices: int) -> dict[str, Any]:
  """What a plan records of the cluster it was made for: every field, G, and the digest of
  its content (cluster_digest), which a plan is checked against, not the cluster's name."""
  fields = {**asdict(spec), "num_devices": num_devices}
  return {**fields, "digest": cluster_digest(fields)}


# not content: the label, the job's size and the pod's (a plan on G devices uses G of them)
NOT_CONTENT = ("name", "num_devices", "num_nodes", "digest")


def cluster_digest(fields: Mapping[str, Any]) -> str:
  """A short sha256 of every number and choice of a cluster record (its NOT_CONTENT left
  out), numbers as floats: two files with the same numbers agree whatever their names."""
  content = {k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
             for k, v in fields.items() if k not in NOT_CONTENT}
  return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def record_differences(made: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
  """'inter_node_bandwidth_GBps (3.125 recorded, 50 now)' for each content field that differs."""
  keys = sorted((set(made) | set(now)) - set(NOT_CONTENT))
  return [f"{k} ({made.get(k)!r} recorded, {now.get(k)!r} now)" for k in keys
          if cluster_digest({k: made.get(k)}) != cluster_digest({k: now.get(k)})]


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
  """(devices_per_node + 1, *count.shape) latency of one all-reduce per link class and size
  (0 on one device). `flat`: the measured small-message latency (measured_latency_ms). `rail`:
  the latency NCCL's own cost model gives the protocol it picks for a REFERENCE_BYTES
  all-reduce (nccl_allreduce_candidates), never below the measured small-message latency."""
  count = np.asarray(count, dtype=float)
  floor = measured_latency_ms(cluster, count)
  if cluster.collectives != "rail":
    return floor
  lat_us, bus = nccl_allreduce_candidates(cluster, count)
  n = np.broadcast_to(count, lat_us.shape[1:])
  pick = np.argmin(_candidate_ms(lat_us, bus, n, REFERENCE_BYTES), axis=0)
  nccl = np.take_along_axis(lat_us, pick[None], axis=0)[0] / 1000.0 * (count > 1)
  return np.maximum(nccl, floor)


def measured_latency_ms(cluster: ClusterConfig, count) -> np.ndarray:
  """(devices_per_node + 1, *count.shape) the measured time of a small-message all-reduce per
  link class: the class's latency once per collective (0 on one device); across nodes plus
  inter_node_latency_per_doubling_us x log2(nodes / 2), nodes = max(2, ceil(count /
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
  """All-reduce of nbytes over devices [start, start + count). `rail`: the fastest of NCCL's
  algorithms and protocols by NCCL's own cost model (nccl_allreduce_ms); `flat`: 2(n-1)/n
  bytes / busbw + latency."""
  if cluster.collectives == "rail":
    return nccl_allreduce_ms(cluster, nbytes, start, count)
  return (volume_ms(nbytes, count, bus_bandwidth_GBps(cluster, start, count))
          + collective_latency_ms(cluster, start, count))


def allgather_ms(cluster: ClusterConfig, nbytes, start, count):
  """All-gather of nbytes (the gathered size) over the range: (n-1)/n bytes/busbw + latency."""
  return (volume_ms(nbytes, count, bus_bandwidth_GBps(cluster, start, count), 1.0)
          + collective_latency_ms(cluster, start, count))


reduce_scatter_ms = allgather_ms  # same volume and latency as an all-gather of the same size


def alltoall_ms(cluster: ClusterConfig, nbytes, start: int, count: int) -> float:
  """All-to-all over devices [start, start + count): each device holds nbytes and sends 1/n of
  them to each other device, all at once (NCCL's all-to-all: grouped point-to-point sends;
  nccl-tests counts its bus bandwidth as (n-1)/n x bytes / time, as an all-gather's). Inside
  a node the (n-1)/n leave over NVLink at the bus bandwidth; a range across nodes sends the
  share bound for other nodes through the device's NIC (p2p_link's rate across nodes: its
  share of the node's NICs at the inter-node efficiency) while the share for its own node's
  devices moves over NVLink beside it, so the slower of the two counts, for the device whose
  node holds the fewest of the range (link_class). Plus the range's small-message latency
  (measured_latency_ms). 0 on one device."""
  if count <= 1:
    return 0.0
  k = int(link_class(cluster, start, count))
  local = count if k == 0 else k  # devices of the range in the worst-placed device's node
  inter_bw, _ = p2p_link(cluster, 0, cluster.devices_per_node)  # a link across nodes
  intra = float(nbytes) * (local - 1) / count / (cluster.intra_bus_GBps * BYTES_PER_MS_PER_GBPS)
  inter = float(nbytes) * (count - local) / count / float(inter_bw)
  latency = float(measured_latency_ms(cluster, count)[k])
  return latency + max(intra, inter)


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


# --- NCCL's cost model of an all-reduce (what NCCL itself runs) --------------------------------
#
# NCCL picks, for every all-reduce, the algorithm (ring, tree; NVLink SHARP on Hopper NVSwitch
# nodes) and protocol (LL, LL128, Simple) its own cost model prices fastest: time = latency +
# bytes / bandwidth per (algorithm, protocol). The constants below are that model's, NVIDIA/nccl
# v2.18.5-1, src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime): base latencies, the
# per-step hardware latencies of NVLink and the network, the protocols' share of the bus
# bandwidth, the ring's plateau factor and the tree's size correction. The bus bandwidth they
# scale is the cluster's measured one (class_bus_GBps: what nccl-tests reaches at GiB sizes).
# Simplifications: an x86 Intel host (NCCL's network overhead 1 us, LL's cap across nodes of
# the Intel rows); no per-channel caps (nChannels x per-channel maxima, above the measured bus
# bandwidth on DGX/HGX nodes); the tree's bandwidth is the class's, as the ring's.

REFERENCE_BYTES = 8 * 2**20  # whose protocol sets class_latency_ms: the middle of 1-64 MiB
_LL, _LL128, _SIMPLE = 0, 1, 2
_RING_BASE_US = (6.6, 14.0, 8.4)
_TREE_BASE_US = (6.8, 14.0, 0.0)
_RING_NVLINK_US = (0.6, 1.9, 3.4)  # hwLat[NVLINK][ring], per step
_TREE_NVLINK_US = (0.6, 1.25, 4.0)
_RING_NET_US = (2.7, 4.0, 14.0)  # hwLat[NET][ring]
_TREE_NET_US = (5.0, 8.5, 14.0)
_NVLS_BASE_US, _NVLS_TREE_NET_US = 23.0, 19.0
_NET_OVERHEAD_US = 1.0  # getNetOverhead, x86 Intel (x3 under Simple)
_LL_MAX_BUS_GBPS = (87.7, 39.0, 20.4)  # llMaxBws: one node (Ampere, Hopper); 2 nodes; more (Intel)
_RING_PLATEAU = 1.4  # Ampere and later: ring Simple across nodes
_TREE_CORRECTION = (  # treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B .. 256 MiB
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0,
     1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
     1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9))
# On Hopper NVSwitch nodes NCCL all-reduces by NVLink SHARP (NVLS): the measured bus bandwidth of
# the cluster files (476-482 GB/s) is NVLS's; a ring reaches ~370 GB/s of the ~480 (the NCCL
# team, NVIDIA/nccl-tests issue 212).
NVLS_DEVICES = ("H100-SXM", "H200-SXM")
_NVLS_RING_SHARE = 370.0 / 480.0
_TREE = ("tree",)


def nvls_node(cluster: ClusterConfig) -> bool:
  """Whether the nodes all-reduce by NVLink SHARP (Hopper SXM boards on NVSwitch)."""
  return cluster.device.startswith(NVLS_DEVICES) and cluster.devices_per_node > 2


def nccl_allreduce_candidates(cluster: ClusterConfig, count) -> tuple[np.ndarray, np.ndarray]:
  """(latency us, bus bandwidth GB/s), each (candidates, devices_per_node + 1, *count.shape):
  NCCL's cost model of every (algorithm, protocol) for an all-reduce over `count` devices of
  each link class (0: one node; k >= 1: across nodes, max(2, ceil(count / devices_per_node))
  of them). Candidates: ring LL, LL128, Simple; tree LL, LL128, Simple (across nodes); NVLS (one
  Hopper node) or NVLS tree (across Hopper nodes); one that does not apply has infinite
  latency. The tree's size correction is applied by _candidate_ms."""
  count = np.asarray(count, dtype=float)
  dpn = cluster.devices_per_node
  shape = (dpn + 1,) + count.shape
  k = np.arange(dpn + 1).reshape((-1,) + (1,) * count.ndim)
  n = np.broadcast_to(np.maximum(count, 1.0), shape)
  nodes = np.where(k == 0, 1.0, np.maximum(2.0, np.ceil(n / dpn)))
  multi = nodes > 1
  ppn = n / nodes
  bus = np.broadcast_to(class_bus_GBps(cluster).reshape((-1,) + (1,) * count.ndim), shape)
  nvls = nvls_node(cluster)
  ring_bus = bus * (_NVLS_RING_SHARE if nvls else 1.0)
  ll_max = np.where(~multi, _LL_MAX_BUS_GBPS[0], np.where(nodes <= 2, _LL_MAX_BUS_GBPS[1],
                                                            _LL_MAX_BUS_GBPS[2]))
  nsteps, ninter = 2 * (n - 1), np.where(multi, 2 * nodes, 0.0)
  log_nodes = np.floor(np.log2(nodes))
  inf = np.full(shape, np.inf)
  lats, buses = [], []
  for p in (_LL, _LL128, _SIMPLE):
    overhead = _NET_OVERHEAD_US * (3 if p == _SIMPLE else 1)
    intra = np.where(multi, max(_RING_NVLINK_US[p], overhead), _RING_NVLINK_US[p])
    lat = _RING_BASE_US[p] + (nsteps - ninter) * intra + ninter * _RING_NET_US[p]
    if p == _SIMPLE:
      lat = np.where(multi, lat * _RING_PLATEAU, lat)
    lats.append(lat)
    buses.append((np.minimum(ll_max, ring_bus / 4), ring_bus * np.where(ppn < 2, 0.7, 0.92),
                  ring_bus)[p])
  for p in (_LL, _LL128, _SIMPLE):
    lat = _TREE_BASE_US[p] + 2 * ((ppn - 1) * _TREE_NVLINK_US[p] + log_nodes * _TREE_NET_US[p])
    lats.append(np.where(multi, lat, inf))
    tree = bus * 0.92
    buses.append((np.minimum(tree / 3.8, ll_max), tree * 120 / 128, tree)[p])
  if nvls:
    lats.append(np.where(multi, _NVLS_BASE_US + 2 * (nodes - 1) * _NVLS_TREE_NET_US,
                         _NVLS_BASE_US))
  else:
    lats.append(inf)
  buses.append(bus)
  return np.stack(lats), np.stack(buses)


def _tree_factor(nbytes: np.ndarray) -> np.ndarray:
  """(candidates, *nbytes.shape) bandwidth factor: NCCL's tree correction by size on the tree
  candidates, 1 on the others."""
  log = np.floor(np.log2(np.maximum(nbytes / 64.0, 1.0))).astype(np.int64)
  table = np.asarray(_TREE_CORRECTION)
  inside = log < table.shape[1]
  rows = [np.ones(nbytes.shape)] * 3 + [np.where(inside, table[p][np.minimum(log, table.shape[1]
                                                                             - 1)], 1.0)
                                        for p in (_LL, _LL128, _SIMPLE)]
  return np.stack(rows + [np.ones(nbytes.shape)])


def _candidate_ms(lat_us: np.ndarray, bus: np.ndarray, count, nbytes) -> np.ndarray:
  """Each candidate's time (ms) for an all-reduce of nbytes: latency + 2(n-1)/n bytes / bus
  bandwidth (the tree's scaled by its size correction); lat_us and bus (candidates, *shape),
  count and nbytes broadcast to shape."""
  shape = lat_us.shape[1:]
  nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), shape)
  count = np.broadcast_to(np.asarray(count, dtype=float), shape)
  return lat_us / 1000.0 + volume_ms(nbytes, count, bus * _tree_factor(nbytes))


def nccl_allreduce_ms(cluster: ClusterConfig, nbytes, start, count):
  """All-reduce of nbytes over devices [start, start + count) as NCCL runs it: the fastest
  candidate of its cost model (nccl_allreduce_candidates) for the range's link class, never
  below the measured small-message latency (measured_latency_ms: NCCL's model leaves out the
  launch, 2-5 us under the measurements of the cluster files); 0 on one device."""
  cls = np.asarray(link_class(cluster, start, count))
  shape = np.broadcast_shapes(np.shape(nbytes), np.shape(count), cls.shape)
  count_a = np.broadcast_to(np.asarray(count, dtype=float), shape)
  lat_us, bus = nccl_allreduce_candidates(cluster, count_a)  # (C, dpn + 1, *shape)
  pick = np.broadcast_to(cls, shape)[None, None]
  lat_us = np.take_along_axis(lat_us, np.broadcast_to(pick, (lat_us.shape[0], 1) + shape),
                              axis=1)[:, 0]
  bus = np.take_along_axis(bus, np.broadcast_to(pick, (bus.shape[0], 1) + shape), axis=1)[:, 0]
  floor = np.take_along_axis(measured_latency_ms(cluster, count_a), pick[0], axis=0)[0]
  out = np.maximum(np.min(_candidate_ms(lat_us, bus, count_a, nbytes), axis=0), floor)
  out = out * (count_a > 1)
  return float(out) if out.ndim == 0 else out


def class_allreduce_ms(cluster: ClusterConfig, nbytes, count) -> np.ndarray:
  """(devices_per_node + 1, *shape) allreduce_ms of nbytes over `count` devices of each link
  class (nbytes and count broadcast to shape): the per-class form the search's tables read,
  equal to allreduce_ms at a range of that class."""
  count = np.asarray(count, dtype=float)
  shape = np.broadcast_shapes(np.shape(nbytes), count.shape)
  count = np.broadcast_to(count, shape)
  if cluster.collectives != "rail":
    bus = class_bus_GBps(cluster).reshape((-1,) + (1,) * len(shape))
    return volume_ms(nbytes, count, bus) + class_latency_ms(cluster, count)
  lat_us, bus = nccl_allreduce_candidates(cluster, count)  # (candidates, classes, *shape)
  nb = np.broadcast_to(np.asarray(nbytes, dtype=float), lat_us.shape[1:])
  out = np.maximum(np.min(_candidate_ms(lat_us, bus, count, nb), axis=0),
                   measured_latency_ms(cluster, count))
  return out * (count > 1)


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
