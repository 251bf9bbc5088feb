"""One plan type and parser for the planner, the simulator and the runtime."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import named_cluster
from dp_jax.planner import make_plan
from dp_jax.planner.contract import (
  PLAN_SCHEMA,
  Plan,
  as_plan,
  check_made_for,
  check_plan,
  layout_plan,
)
from dp_jax.planner.options import PlannerConfig
from dp_jax.planner.sharding import LayerSharding
from dp_jax.planner.synthetic import analytic_profile, resnet_like
from dp_jax.runtime.batch_norm import batch_norm_mode

PACKAGE = Path(__file__).resolve().parents[1] / "dp_jax"


def chain() -> LayerGraph:
  return LayerGraph("chain", (4,), "float32", tuple(
      LayerNode(n, "linear", (p,) if p else ()) for n, p in [("a", ""), ("b", "a"), ("c", "b")]))


def test_the_plan_schema_string_is_defined_in_one_module():
  holders = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if "dp_jax.plan/" in p.read_text())
  assert holders == ["planner/contract.py"]
  assert PLAN_SCHEMA == "dp_jax.plan/2"


def test_the_plan_type_does_not_import_jax():
  code = ("import sys, dp_jax.planner.contract, dp_jax.planner.memory, dp_jax.planner.sharded; "
          "assert 'jax' not in sys.modules, 'jax imported'")
  subprocess.run([sys.executable, "-c", code], check=True)


def test_the_runtime_check_returns_the_planner_type_in_graph_order():
  layout = layout_plan(chain(), lambda n: [0, 1], global_batch=4, num_devices=2)
  layout["layers"].reverse()
  checked = check_plan(layout, chain(), available_devices=2)
  assert isinstance(checked, Plan)
  assert [lp.name for lp in checked.layers] == ["a", "b", "c"]
  assert checked.placements["b"].mesh == (2, 1) and checked.placements["b"].split == "samples"
  assert checked.cluster is None and checked.predicted == {}  # a layout: a placement only
  with pytest.raises(UserError, match="missing required field 'cluster'"):
    Plan.from_json(layout)  # a planner's plan needs what simulate needs


def test_a_planner_plan_goes_to_the_runtime_as_it_is():
  graph = resnet_like(blocks=(1,), width=8)
  plan = make_plan(graph, analytic_profile(graph, (1, 2, 4, 8)),
                   named_cluster("a100_nvlink_8"), num_devices=4, global_batch=8,
                   amplification_limit=math.inf)
  checked = check_plan(plan, graph, available_devices=4, global_batch=8)
  assert [lp.devices for lp in checked.layers] == [plan.layer(n).devices for n in graph.names]
  again = check_plan(json.loads(json.dumps(plan.to_json())), graph, available_devices=4)
  assert again.to_json() == checked.to_json()


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["layers"].append(dict(d["layers"][0], devices=[1], samples=[[0, 4]])),
     "layers[3] is a second entry for layer 'a' (first: layers[0])"),
    (lambda d: d["layers"][1].update(devices=[0, 0]), "lists a device twice"),
    (lambda d: d.update(global_batch=0), "global_batch must be a positive integer"),
])
def test_planner_and_runtime_refuse_alike(edit, needle):
  d = layout_plan(chain(), lambda n: [0, 1], global_batch=4, num_devices=2)
  edit(d)
  with pytest.raises(UserError) as parsed:
    as_plan(d)
  with pytest.raises(UserError) as checked:
    check_plan(d, chain(), available_devices=2)
  assert needle in str(parsed.value) and str(parsed.value) == str(checked.value)


def test_batch_norm_and_made_for_read_the_plan_type():
  d = layout_plan(chain(), lambda n: [0], global_batch=4, num_devices=1)
  assert batch_norm_mode(as_plan(d)) == "sync"
  d["options"] = {"batch_norm": "local"}
  assert batch_norm_mode(as_plan(d)) == "local"
  d["options"] = {"batch_norm": "nope"}  # options are typed: refused when the plan is read
  with pytest.raises(UserError, match="options: planner.batch_norm='nope' is unknown"):
    as_plan(d)
  del d["options"]
  made = {"name": "chain", "input_shape": [4], "layers": 3, "options": {}}
  d["made_for"] = made
  check_made_for(as_plan(d), made, "plan p.json")
  with pytest.raises(UserError, match="plan p.json was made for chain"):
    check_made_for(as_plan(d), {**made, "input_shape": [8]}, "plan p.json")


def test_the_plan_carries_typed_options_shardings_and_stages_through_json():
  graph = resnet_like(blocks=(1,), width=8)
  plan = make_plan(graph, analytic_profile(graph, (1, 2, 4, 8)),
                   named_cluster("a100_nvlink_8"), num_devices=4, global_batch=8,
                   amplification_limit=math.inf, batch_norm="local", gradient_precision="bf16")
  assert isinstance(plan.options, PlannerConfig) and plan.options.batch_norm == "local"
  assert plan.plan_options.num_devices == 4 and plan.plan_options.global_batch == 8
  assert all(isinstance(lp.sharding, LayerSharding) for lp in plan.layers)
  assert plan.stages and {n for s in plan.stages for n in s.layers} == set(graph.names)
  again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
  assert (again.options, again.stages, again.layers) == (plan.options, plan.stages, plan.layers)
  assert "options" not in again.extra and "stages" not in again.extra  # held typed, once
  assert batch_norm_mode(again) == "local" and again.basis().startswith("bf16 gradients")


def test_options_written_before_the_named_options_still_load():
  d = layout_plan(chain(), lambda n: [0], global_batch=4, num_devices=1)
  d["options"] = {"grad_bytes_per_param": 2, "optimizer_bytes_per_param": 8,
                  "amplification_limit": None, "retired_option": 3}
  p = as_plan(d)
  assert (p.options.gradient_precision, p.options.optimizer) == ("bf16", "adam")
  assert p.options.amplification_limit == math.inf
  assert p.to_json()["options"]["gradient_precision"] == "bf16"
  d["options"] = {"grad_bytes_per_param": 3}
  with pytest.raises(UserError, match="grad_bytes_per_param=3 has no gradient_precision"):
    as_plan(d)


def test_a_layer_on_devices_out_of_range_order_is_refused_once_checked():
  d = layout_plan(chain(), lambda n: [0, 2] if n == "b" else [0], global_batch=4, num_devices=3)
  as_plan(d)  # a placement: parsed
  with pytest.raises(UserError, match="plan layer 'b' uses non-contiguous devices \\[0, 2\\]"):
    check_plan(d, chain(), available_devices=3)


def test_a_layout_on_more_devices_than_samples_keeps_its_options():
  d = layout_plan(chain(), lambda n: [0, 1], global_batch=2, num_devices=4)
  d["options"] = {"batch_norm": "local"}
  p = check_plan(d, chain(), available_devices=4)
  assert batch_norm_mode(p) == "local"
  assert as_plan(p.to_json()).options == p.options  # written and read back (pinned processes)
