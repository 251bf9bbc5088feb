"""Cluster specs, their YAML configs and the collective cost functions."""

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import yaml

from dp_jax.base.checks import build
from dp_jax.base.errors import UserError
from dp_jax.hardware.cluster import (
  ClusterConfig,
  allgather_ms,
  allreduce_ms,
  bus_bandwidth_GBps,
  collective_latency_ms,
  link_class,
  named_cluster,
  p2p_link,
)
from dp_jax.planner.synthetic import cluster as synthetic_cluster

CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster"
FIELDS = {f.name for f in fields(ClusterConfig)}


def spec(**kw) -> ClusterConfig:
  base = dict(name="a100", device="A100-SXM4-40GB", num_nodes=4, devices_per_node=8,
              memory_gb_per_device=40.0, intra_node_bandwidth_GBps=300.0,
              intra_node_latency_us=2.0, inter_node_bandwidth_GBps=25.0,
              inter_node_latency_us=5.0, nics_per_node=8, intra_node_bus_efficiency=0.72,
              inter_node_bus_efficiency=0.86)
  base.update(kw)
  return synthetic_cluster(**base)


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_config_loads_and_has_only_the_fields(path):
  raw = yaml.safe_load(path.read_text())
  assert set(raw) == FIELDS - {"num_devices", "what_if"}  # the job's G; a what-if: choices
  c = build(ClusterConfig, raw)
  assert c.name == path.stem
  assert c.pod_devices == c.num_nodes * c.devices_per_node


def test_expected_configs_exist():
  names = {p.stem for p in CONF.glob("*.yaml")}
  assert {"a100_nvlink_8", "dgx_a100", "dgx_h100", "dgx_h200", "a100_ethernet_10g",
          "local_cpu"} <= names


def test_datasheet_numbers():
  a100 = named_cluster("dgx_a100")
  assert a100.intra_node_bandwidth_GBps == 300 and a100.inter_node_bandwidth_GBps == 25
  h100 = named_cluster("dgx_h100")
  assert h100.intra_node_bandwidth_GBps == 450 and h100.inter_node_bandwidth_GBps == 50
  local = named_cluster("local_cpu")
  assert local.num_nodes == 1 and local.devices_per_node == 8


def test_negative_bandwidth_is_one_clear_line():
  with pytest.raises(UserError) as e:
    spec(inter_node_bandwidth_GBps=-5)
  assert str(e.value) == "cluster.inter_node_bandwidth_GBps=-5 must be > 0"


@pytest.mark.parametrize("kw,needle", [
    (dict(num_nodes=0), "cluster.num_nodes=0 must be >= 1"),
    (dict(devices_per_node=-1), "cluster.devices_per_node=-1 must be >= 1"),
    (dict(intra_node_bandwidth_GBps=0), "cluster.intra_node_bandwidth_GBps=0 must be > 0"),
    (dict(intra_node_latency_us=-1), "cluster.intra_node_latency_us=-1 must be >= 0"),
    (dict(memory_gb_per_device=0), "cluster.memory_gb_per_device=0 must be > 0"),
])
def test_validation(kw, needle):
  with pytest.raises(UserError, match=needle):
    spec(**kw)


def test_load_cluster_rejects_unknown_and_missing_fields():
  raw = {f: getattr(spec(), f) for f in FIELDS}
  with pytest.raises(UserError, match=r"cluster.nvlink is not an option \(valid: name, device"):
    build(ClusterConfig, {**raw, "nvlink": True})
  raw.pop("inter_node_latency_us")
  with pytest.raises(UserError, match="cluster.inter_node_latency_us is required for cluster a100"):
    build(ClusterConfig, raw)
  with pytest.raises(UserError, match="must be a mapping"):
    build(ClusterConfig, ["a"])


def test_with_num_devices_fills_nodes():
  c = spec(num_nodes=128)
  assert c.with_num_devices(12).num_nodes == 2
  assert c.with_num_devices(8).num_nodes == 1
  assert c.with_num_devices(4).num_nodes == 1
  assert c.with_num_devices(1024).num_devices == 1024
  with pytest.raises(UserError, match="at most 1024 devices"):
    c.with_num_devices(1025)
  with pytest.raises(UserError, match="positive integer"):
    c.with_num_devices(0)


def test_link_class_is_the_least_populated_node():
  c = spec()
  assert link_class(c, 0, 8) == 0 and link_class(c, 8, 8) == 0
  assert link_class(c, 0, 16) == 8
  assert link_class(c, 0, 12) == 4  # 8 + 4
  assert link_class(c, 6, 4) == 2  # 2 + 2
  assert list(link_class(c, 0, np.array([1, 9, 24]))) == [0, 1, 8]


def test_bus_bandwidth_is_rail_aligned():
  c = spec()
  assert bus_bandwidth_GBps(c, 0, 8) == pytest.approx(300 * 0.72)
  # 8 rails x 25 GB/s x 0.86 = 172 < 216 inside the node
  assert bus_bandwidth_GBps(c, 0, 32) == pytest.approx(8 * 25 * 0.86)
  assert bus_bandwidth_GBps(c, 0, 12) == pytest.approx(4 * 25 * 0.86)
  # fewer NICs than devices: the node's NICs bound the rails
  assert bus_bandwidth_GBps(spec(nics_per_node=4), 0, 32) == pytest.approx(4 * 25 * 0.86)
  # rails never beat the node's own links
  fat = spec(inter_node_bandwidth_GBps=100.0)
  assert bus_bandwidth_GBps(fat, 0, 32) == pytest.approx(216)
  # flat: one ring through one NIC at line rate
  flat = spec(collectives="flat")
  assert bus_bandwidth_GBps(flat, 0, 32) == 25.0 and bus_bandwidth_GBps(flat, 0, 8) == 300.0


def test_allreduce_and_allgather():
  c = spec()
  assert allreduce_ms(c, 1e9, 0, 1) == 0.0
  # rail: NCCL's own cost model picks the protocol (NVIDIA/nccl v2.18.5 src/graph/tuning.cc);
  # 1 GB inside a node: ring Simple, 8.4 us + 14 steps x 3.4 us, at the bus bandwidth
  assert allreduce_ms(c, 1e9, 0, 8) == pytest.approx(2 * 7 / 8 / 216 * 1e3 + 56e-3)
  # across 2 nodes: ring Simple, (8.4 + 26 x 3.4 + 4 x 14) us x 1.4 (the ring's plateau)
  ring = (8.4 + 26 * 3.4 + 4 * 14) * 1.4e-3
  assert allreduce_ms(c, 1e9, 0, 16) == pytest.approx(2 * 15 / 16 / 172 * 1e3 + ring)
  # small messages take the low-latency protocol: LL's 6.6 + 14 x 0.6 us at a quarter of the bus
  assert allreduce_ms(c, 1024, 0, 8) == pytest.approx(15e-3 + 2 * 7 / 8 * 1024 / 54e6)
  # what the planner adds per stage: the latency of NCCL's choice at REFERENCE_BYTES (8 MiB),
  # the tree's LL128 across 2 nodes: 14 + 2 (7 x 1.25 + 8.5) us
  assert collective_latency_ms(c, 0, 16) == pytest.approx(48.5e-3)
  assert allgather_ms(c, 1e9, 0, 16) == pytest.approx(15 / 16 / 172 * 1e3 + 48.5e-3)
  flat = spec(collectives="flat")
  assert allreduce_ms(flat, 1e9, 0, 16) == pytest.approx(2 * 15 / 16 / 25 * 1e3 + 5e-3)
  # vectorised over ranges as the planner calls it
  many = allreduce_ms(c, np.array([1024.0, 1e9]), np.array([0, 0]), np.array([8, 16]))
  assert many == pytest.approx([allreduce_ms(c, 1024, 0, 8), allreduce_ms(c, 1e9, 0, 16)])


def test_the_nccl_model_against_a_published_curve_shape():
  """Mid-size all-reduces pay a latency that the peak bus bandwidth hides at GiB sizes: the
  bus bandwidth rises with the message size and meets the measured peak."""
  c = spec()
  sizes = 2.0 ** np.arange(20, 34)
  busbw = 2 * 7 / 8 * sizes / (allreduce_ms(c, sizes, 0, 8) * 1e6)
  assert np.all(np.diff(busbw) > 0) and busbw[0] < 0.25 * 216 and busbw[-1] > 0.97 * 216


def test_p2p_link():
  c = spec()
  bw, lat = p2p_link(c, 0, 7)
  assert bw == pytest.approx(216e6) and lat == pytest.approx(2e-3)
  bw, lat = p2p_link(c, 0, 9)
  assert bw == pytest.approx(25 * 0.86 * 1e6) and lat == pytest.approx(5e-3)
  bw, _ = p2p_link(spec(nics_per_node=2), 0, 9)  # 8 devices share 2 NICs
  assert bw == pytest.approx(25 * 0.86 * 2 / 8 * 1e6)


@pytest.mark.parametrize("kw,needle", [
    (dict(nics_per_node=-1), r"cluster.nics_per_node=-1 must be >= 0 \(0: one NIC per device\)"),
    (dict(intra_node_bus_efficiency=1.5), "intra_node_bus_efficiency=1.5 must be > 0 and <= 1"),
    (dict(collectives="tree"), "cluster.collectives='tree' is unknown"),
])
def test_new_fields_are_validated(kw, needle):
  with pytest.raises(UserError, match=needle):
    spec(**kw)


def test_latency_grows_per_doubling_of_the_nodes_spanned():
  c = spec(num_nodes=128, inter_node_latency_per_doubling_us=10.0, collectives="flat")
  us = lambda start, count: float(collective_latency_ms(c, start, count)) * 1e3  # noqa: E731
  assert us(0, 8) == pytest.approx(2.0)  # inside a node: the intra latency, whatever the size
  assert us(0, 16) == pytest.approx(5.0)  # 2 nodes: the inter latency
  assert us(4, 8) == pytest.approx(5.0)  # 8 devices across a node boundary span 2 nodes
  assert us(0, 64) == pytest.approx(5.0 + 10.0 * 2)  # 8 nodes: two doublings beyond 2
  assert us(0, 1024) == pytest.approx(5.0 + 10.0 * 6)
  assert float(collective_latency_ms(c, 0, 1)) == 0.0
  flat = spec(num_nodes=128, collectives="flat")  # no growth configured: one figure for all
  assert float(collective_latency_ms(flat, 0, 1024)) * 1e3 == pytest.approx(5.0)
  # rail: NCCL's tree latency grows by 2 x 8.5 us per doubling of the nodes (LL128)
  rail = spec(num_nodes=128)
  lat = [float(collective_latency_ms(rail, 0, 8 * n)) * 1e3 for n in (2, 4, 8)]
  assert np.diff(lat) == pytest.approx([17.0, 17.0])
