"""Stages from plans, and plan checks against the model and the devices (one-line errors)."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.models.zoo import build_model
from dp_jax.planner.contract import (
  check_plan,
  data_parallel_layout_plan,
  layout_plan,
  staged_data_parallel_plan,
)
from dp_jax.runtime.stages import INPUT, group_stages, series_parallel_order, structure_graph


def diamond() -> LayerGraph:
  """a -> (b1 -> b2 | c) -> d -> e"""
  nodes = [LayerNode("a", "conv2d"), LayerNode("b1", "conv2d", ("a",)),
           LayerNode("c", "conv2d", ("a",)), LayerNode("b2", "conv2d", ("b1",)),
           LayerNode("d", "add", ("b2", "c")), LayerNode("e", "linear", ("d",))]
  return LayerGraph("diamond", (4,), "float32", tuple(nodes))


@pytest.fixture(scope="module")
def resnet_graph():
  return structure_graph(build_model("resnet50", image_size=32, num_classes=10, abstract=True),
                         "resnet50")


def test_series_parallel_order_runs_each_branch_in_full():
  assert series_parallel_order(diamond()) == ["a", "b1", "b2", "c", "d", "e"]


def test_same_devices_fuse_and_branches_on_other_devices_split():
  devs = {"a": [0, 1], "b1": [0, 1], "b2": [0, 1], "c": [2, 3], "d": [0, 1], "e": [0]}
  stages = group_stages(diamond(), devs)
  assert [(s.layers, s.devices) for s in stages] == [
      (("a", "b1", "b2"), (0, 1)), (("c",), (2, 3)), (("d",), (0, 1)), (("e",), (0,))]
  assert stages[0].inputs == (INPUT,) and stages[0].exports == ("a", "b2")
  assert stages[1].inputs == ("a",) and stages[1].exports == ("c",)
  assert stages[2].inputs == ("b2", "c") and stages[2].exports == ("d",)
  assert stages[3].exports == ("e",)  # the model output


def test_data_parallel_plan_is_one_stage(resnet_graph):
  plan = data_parallel_layout_plan(resnet_graph, global_batch=32, num_devices=8)
  checked = check_plan(plan, resnet_graph, available_devices=8)
  stages = group_stages(resnet_graph, {n: p.devices for n, p in checked.placements.items()})
  assert len(stages) == 1 and stages[0].devices == tuple(range(8))
  assert stages[0].layers[0] == "conv1" and stages[0].exports == ("fc",)


def test_staged_data_parallel_plan_cuts_the_chain_into_stages_on_the_same_devices():
  chain = LayerGraph("chain", (4,), "float32", tuple(
      LayerNode(n, "linear", (p,) if p else ()) for n, p in
      [("a", ""), ("b", "a"), ("c", "b"), ("d", "c"), ("e", "d")]))
  plan = staged_data_parallel_plan(chain, 2, 2, global_batch=4)
  checked = check_plan(plan, chain, available_devices=4)
  stages = group_stages(chain, {n: p.devices for n, p in checked.placements.items()})
  assert [(s.layers, s.devices) for s in stages] == [(("a", "b", "c"), (0, 1)),
                                                     (("d", "e"), (2, 3))]
  every = staged_data_parallel_plan(chain, 0, 2, global_batch=4, alternate=True)
  assert every["num_devices"] == 10
  assert [layer["devices"] for layer in every["layers"]] == [[0, 1], [2], [4, 5], [6], [8, 9]]


def test_residual_shortcut_on_other_devices_is_its_own_stage(resnet_graph):
  def devices(name):
    return [2, 3] if name == "layer1.0.downsample" else [0, 1]

  stages = group_stages(resnet_graph, devices_map(resnet_graph, devices))
  short = [s for s in stages if "layer1.0.downsample" in s.layers]
  assert len(stages) == 3 and short[0].layers == ("layer1.0.downsample",)
  assert stages[0].exports == ("maxpool", "layer1.0.conv3")
  assert stages[2].inputs == ("layer1.0.conv3", "layer1.0.downsample")


def devices_map(graph, fn):
  return {n: fn(n) for n in graph.names}


def test_plan_layers_must_match_the_model(resnet_graph):
  plan = data_parallel_layout_plan(resnet_graph, global_batch=8, num_devices=8)
  plan["layers"] = plan["layers"][:-1] + [dict(plan["layers"][-1], name="head")]
  with pytest.raises(UserError, match=r"plan layers do not match model resnet50 \(missing: fc; "
                                      r"unknown: head\)"):
    check_plan(plan, resnet_graph, available_devices=8)


def test_plan_for_another_model_is_rejected(resnet_graph):
  plan = data_parallel_layout_plan(resnet_graph, global_batch=8, num_devices=8)
  plan["model"] = "vgg16"
  with pytest.raises(UserError, match="plan is for model 'vgg16' but the model is 'resnet50'"):
    check_plan(plan, resnet_graph, available_devices=8)


def test_plan_needing_more_devices_than_exist_is_rejected():
  plan = data_parallel_layout_plan(diamond(), global_batch=16, num_devices=16)
  with pytest.raises(UserError, match="plan needs 16 devices but only 8 are available"):
    check_plan(plan, diamond(), available_devices=8)


def test_batch_must_divide_by_every_device_count():
  plan = layout_plan(diamond(), lambda n: [0, 1, 2] if n == "c" else [0], global_batch=8,
                     num_devices=4)
  with pytest.raises(UserError, match="layer 'c' splits global batch 8 over 3 devices"):
    check_plan(plan, diamond(), available_devices=8)


@pytest.mark.parametrize("edit, message", [
    (lambda L: L.update(samples=[[0, 3], [3, 8]]), "equal contiguous ranges"),
    (lambda L: L.update(devices=[0, 0]), "lists a device twice"),
    (lambda L: L.update(devices=[0, 9]), "uses device 9, outside the plan's 4 devices"),
    (lambda L: L.update(devices=[]), "must be a non-empty list"),
])
def test_malformed_layer_placements_are_rejected(edit, message):
  plan = layout_plan(diamond(), lambda n: [0, 1], global_batch=8, num_devices=4)
  edit(plan["layers"][2])
  with pytest.raises(UserError, match=message):
    check_plan(plan, diamond(), available_devices=8)


def test_batch_size_must_match_the_plan():
  plan = layout_plan(diamond(), lambda n: [0], global_batch=8, num_devices=1)
  with pytest.raises(UserError, match="plan was made for global batch 8 but the batch size is 16"):
    check_plan(plan, diamond(), available_devices=1, global_batch=16)
  assert check_plan(plan, diamond(), available_devices=1, global_batch=8).global_batch == 8


def test_schema_and_shape_errors():
  with pytest.raises(UserError, match="a plan must be a JSON object"):
    check_plan([1], diamond(), available_devices=1)
  with pytest.raises(UserError, match="missing required field 'layers'"):
    check_plan({"model": "diamond", "global_batch": 1, "num_devices": 1}, diamond(),
               available_devices=1)
