"""Probe rows of issue 41 on what a plan was made for: a plan made on a user's cluster file
named like a shipped one is refused on the shipped one (its record's digest compares every
number, not the name); the same numbers under another name are the same cluster."""

import dataclasses
import json

import pytest
from apps import assert_one_line_error, run_app
from test_plan_app import write_graph_and_profile

from dp_jax.base.errors import UserError
from dp_jax.hardware.cluster import cluster_digest, named_cluster, to_record
from dp_jax.planner.contract import Plan, check_made_for


def plan_made_on(cluster, g=8):
  return Plan(model="m", global_batch=8, num_devices=g, layers=(),
              extra={"cluster_config": to_record(cluster, g)})


def test_a_plan_is_checked_against_the_clusters_numbers_not_its_name():
  shipped = named_cluster("dgx_h100")
  slow = dataclasses.replace(shipped, inter_node_bandwidth_GBps=3.125)  # a user file, same name
  with pytest.raises(UserError) as e:
    check_made_for(plan_made_on(slow), {}, "plan p.json", to_record(shipped, 8))
  assert str(e.value).startswith("plan p.json was made for cluster dgx_h100 with other numbers "
                                 "than cluster dgx_h100 here: inter_node_bandwidth_GBps (3.125 "
                                 "recorded, 50.0 now)")
  renamed = dataclasses.replace(shipped, name="my_h100", num_nodes=2)  # a label, the pod's size
  check_made_for(plan_made_on(renamed), {}, "plan p.json", to_record(shipped, 8))


def test_a_record_from_before_digests_is_compared_by_its_fields():
  shipped = named_cluster("dgx_h100")
  record = to_record(dataclasses.replace(shipped, intra_node_latency_us=99.0), 8)
  record.pop("digest")
  old = Plan(model="m", global_batch=8, num_devices=8, layers=(),
             extra={"cluster_config": record})
  with pytest.raises(UserError, match="intra_node_latency_us"):
    check_made_for(old, {}, "plan p.json", to_record(shipped, 8))
  assert cluster_digest(record) != to_record(shipped, 8)["digest"]


def test_simulate_refuses_a_plan_made_on_a_cluster_file_of_other_numbers(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path)
  shipped = named_cluster("a100_nvlink_8")
  mine = tmp_path / "a100_nvlink_8.yaml"
  mine.write_text(json.dumps({**dataclasses.asdict(shipped), "intra_node_bandwidth_GBps": 30.0,
                              "num_devices": None}))
  common = [f"graph={gpath}", f"profile={ppath}", "batch_size=8", "logger=disabled"]
  made = run_app("plan", *common, f"cluster={mine}", "cluster.num_devices=4",
                 f"out={tmp_path / 'plan.json'}", cwd=tmp_path)
  assert made.returncode == 0, made.stderr
  refused = run_app("simulate", *common, "cluster=a100_nvlink_8", f"plan={tmp_path / 'plan.json'}",
                    cwd=tmp_path)
  assert_one_line_error(refused, "made for cluster a100_nvlink_8 with other numbers",
                        "intra_node_bandwidth_GBps (30.0 recorded")
  same = run_app("simulate", *common, f"cluster={mine}", f"plan={tmp_path / 'plan.json'}",
                 cwd=tmp_path)
  assert same.returncode == 0, same.stderr
