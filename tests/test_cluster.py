"""Cluster specs, their YAML configs and the collective cost functions."""

from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from dp_jax.cluster import (
  ClusterSpec,
  allreduce_ms,
  link_for,
  load_cluster,
  ring_allreduce_ms,
  transfer_ms,
)
from dp_jax.errors import UserError

CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster"
FIELDS = {f.name for f in fields(ClusterSpec)}


def spec(**kw) -> ClusterSpec:
  base = dict(name="a100", device="A100-SXM4-40GB", num_nodes=4, devices_per_node=8,
              memory_gb_per_device=40.0, intra_node_bandwidth_GBps=300.0,
              intra_node_latency_us=2.0, inter_node_bandwidth_GBps=25.0,
              inter_node_latency_us=5.0)
  base.update(kw)
  return ClusterSpec(**base)


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_config_loads_and_has_only_the_fields(path):
  raw = yaml.safe_load(path.read_text())
  assert set(raw) == FIELDS
  c = load_cluster(raw)
  assert c.name == path.stem
  assert c.num_devices == c.num_nodes * c.devices_per_node


def test_expected_configs_exist():
  names = {p.stem for p in CONF.glob("*.yaml")}
  assert {"a100_nvlink_8", "dgx_a100", "dgx_h100", "dgx_h200", "a100_ethernet_10g",
          "local_cpu"} <= names


def test_datasheet_numbers():
  a100 = load_cluster(yaml.safe_load((CONF / "dgx_a100.yaml").read_text()))
  assert a100.intra_node_bandwidth_GBps == 300 and a100.inter_node_bandwidth_GBps == 25
  h100 = load_cluster(yaml.safe_load((CONF / "dgx_h100.yaml").read_text()))
  assert h100.intra_node_bandwidth_GBps == 450 and h100.inter_node_bandwidth_GBps == 50
  local = load_cluster(yaml.safe_load((CONF / "local_cpu.yaml").read_text()))
  assert local.num_nodes == 1 and local.devices_per_node == 8


def test_negative_bandwidth_is_one_clear_line():
  with pytest.raises(UserError) as e:
    spec(inter_node_bandwidth_GBps=-5)
  assert str(e.value) == "cluster a100: inter_node_bandwidth_GBps must be > 0, got -5"


@pytest.mark.parametrize("kw,needle", [
    (dict(num_nodes=0), "num_nodes must be a positive integer"),
    (dict(devices_per_node=-1), "devices_per_node must be a positive integer"),
    (dict(intra_node_bandwidth_GBps=0), "intra_node_bandwidth_GBps must be > 0"),
    (dict(intra_node_latency_us=-1), "intra_node_latency_us must be >= 0"),
    (dict(memory_gb_per_device=0), "memory_gb_per_device must be > 0"),
])
def test_validation(kw, needle):
  with pytest.raises(UserError, match=needle):
    spec(**kw)


def test_load_cluster_rejects_unknown_and_missing_fields():
  raw = {f: getattr(spec(), f) for f in FIELDS}
  with pytest.raises(UserError, match="unknown field"):
    load_cluster({**raw, "nvlink": True})
  raw.pop("inter_node_latency_us")
  with pytest.raises(UserError, match="missing field"):
    load_cluster(raw)
  with pytest.raises(UserError, match="must be a mapping"):
    load_cluster(["a"])


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


def test_link_is_the_slowest_one_spanned():
  c = spec()
  assert link_for(c, range(8)) == (300.0, 2.0)
  assert link_for(c, [8, 15]) == (300.0, 2.0)
  assert link_for(c, [7, 8]) == (25.0, 5.0)
  with pytest.raises(UserError, match="at least one device"):
    link_for(c, [])


def test_ring_allreduce():
  c = spec()
  assert allreduce_ms(c, 1e9, [0]) == 0.0
  # 8 GPUs in a node: 2*7/8 * 1 GB / 300 GB/s + 14 * 2 us
  assert allreduce_ms(c, 1e9, range(8)) == pytest.approx(2 * 7 / 8 / 300 * 1e3 + 14 * 2e-3)
  # 16 GPUs over two nodes: the inter-node link
  assert allreduce_ms(c, 1e9, range(16)) == pytest.approx(2 * 15 / 16 / 25 * 1e3 + 30 * 5e-3)
  assert ring_allreduce_ms(0, 4, 10, 0) == 0.0


def test_transfer():
  c = spec()
  assert transfer_ms(c, 0, [0, 9]) == 0.0
  assert transfer_ms(c, 25e6, [0, 9]) == pytest.approx(1.0 + 5e-3)
  assert transfer_ms(c, 300e6, [0, 1]) == pytest.approx(1.0 + 2e-3)
  with pytest.raises(UserError):
    transfer_ms(c, -1, [0])
