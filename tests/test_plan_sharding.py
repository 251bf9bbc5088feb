"""Plan schema dp_jax.plan/2: per-layer sharding entries checked by the planner's Plan and by the
runtime's check_plan (one-line errors); dp_jax.plan/1 files still load."""

import copy

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.planner.contract import PLAN_SCHEMA, Plan, as_plan, check_plan, layout_plan
from dp_jax.planner.sharding import LayerSharding, Strategy, default_sharding


def mlp() -> LayerGraph:
  """fc1 (16 -> 64) -> relu -> fc2 (64 -> 8)"""
  lin = lambda i, o: {"in_features": i, "out_features": o, "bias": True}  # noqa: E731
  nodes = [LayerNode("fc1", "linear", attrs=lin(16, 64)),
           LayerNode("relu", "relu", ("fc1",)),
           LayerNode("fc2", "linear", ("relu",), attrs=lin(64, 8))]
  return LayerGraph("mlp", (16,), "float32", tuple(nodes))


SHARDED = {"fc1": ((2, 4), "out"), "fc2": ((1, 8), "in")}


def sharded_plan() -> dict:
  p = layout_plan(mlp(), lambda n: range(8), global_batch=8, num_devices=8, shardings=SHARDED)
  p.update(cluster="local", amplification_limit=None, planner_seconds=0.0,
           predicted={k: 1.0 for k in ("iteration_ms", "gpu_ms", "data_parallel_iteration_ms",
                                       "data_parallel_gpu_ms")})
  return p


def test_sharded_plan_round_trips_as_schema_2():
  d = sharded_plan()
  assert d["schema"] == PLAN_SCHEMA == "dp_jax.plan/2"
  fc1 = d["layers"][0]
  assert fc1["samples"] == [[0, 4]] * 4 + [[4, 8]] * 4  # range k // m of d = 2
  plan = Plan.from_json(d)
  assert plan.to_json() == d
  assert plan.layer("fc1").sharding.mesh == (2, 4)
  assert plan.layer("fc1").strategy == Strategy(4, "out")
  assert plan.layer("relu").sharding == LayerSharding((8, 1))
  assert plan.layer("relu").sharding.to_json() == default_sharding(8)
  checked = check_plan(d, mlp(), available_devices=8)
  fc1, relu, fc2 = (checked.placements[n] for n in ("fc1", "relu", "fc2"))
  assert (fc1.mesh, fc1.split, fc1.params) == ((2, 4), "out",
                                                {"kernel": (None, "model"), "bias": ("model",)})
  assert (relu.mesh, relu.split, relu.params) == ((8, 1), "samples", {})
  assert (fc2.mesh, fc2.split) == ((1, 8), "in")


def test_schema_1_plans_still_load_as_samples_splits():
  d = sharded_plan()
  for layer in d["layers"]:
    layer.pop("sharding", None)
    layer["samples"] = [[k, k + 1] for k in range(8)]
  d["schema"] = "dp_jax.plan/1"
  plan = Plan.from_json(d)
  assert all(lp.sharding.split == "samples" for lp in plan.layers)
  assert plan.to_json()["schema"] == PLAN_SCHEMA
  assert check_plan(d, mlp(), available_devices=8).placements["fc1"].mesh == (8, 1)


def _fc1(d):
  return d["layers"][0]


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: _fc1(d)["sharding"].update(mesh=[4, 4]), "has 16 devices but the layer has 8"),
    (lambda d: _fc1(d)["sharding"].update(mesh=[2]), "mesh must be \\[data, model\\]"),
    (lambda d: _fc1(d)["sharding"].update(split="rows"), "split 'rows' is unknown"),
    (lambda d: _fc1(d)["sharding"].update(split="samples"), "needs a model axis of 1"),
    (lambda d: _fc1(d)["sharding"].update(axes=["model", "data"]), "axes must be"),
    (lambda d: _fc1(d)["sharding"].update(output=[None, "model"]), "output must be"),
    (lambda d: _fc1(d)["sharding"]["params"].update(kernel=["rows"]), "a spec is a list"),
    (lambda d: _fc1(d).update(samples=[[0, 4]] * 4 + [[5, 8]] * 4), "tile"),
    (lambda d: _fc1(d).update(samples=[[0, 4]] * 3 + [[4, 8]] * 5), "same sample range"),
    (lambda d: d.update(schema="dp_jax.plan/1"), "has no 'sharding'"),
])
def test_bad_sharding_entries_are_one_line_errors(mutate, needle):
  d = copy.deepcopy(sharded_plan())
  mutate(d)
  with pytest.raises(UserError, match=needle) as planner_err:
    Plan.from_json(d)
  assert "\n" not in str(planner_err.value)
  with pytest.raises(UserError) as runtime_err:
    check_plan(d, mlp(), available_devices=8)
  assert "\n" not in str(runtime_err.value)


def test_runtime_checks_the_split_against_the_layer():
  d = sharded_plan()
  d["layers"][2]["sharding"]["split"] = "heads"  # fc2 is a linear layer
  with pytest.raises(UserError, match="layer 'fc2' \\(linear\\) cannot use split 'heads'"):
    check_plan(d, mlp(), available_devices=8)
  d = sharded_plan()
  d["layers"][0]["samples"] = [[k, k + 1] for k in range(8)]  # not repeated per model group
  with pytest.raises(UserError, match="the 4 devices of each model group need the same"):
    check_plan(d, mlp(), available_devices=8)


def test_local_batch_norm_groups_follow_the_data_axis():
  from types import SimpleNamespace

  from dp_jax.runtime.batch_norm import set_statistics_groups

  convs = {n: SimpleNamespace(stats_groups=1) for n in ("fc1", "fc2")}
  model = SimpleNamespace(layer_specs=lambda: [SimpleNamespace(name=n, module=m)
                                               for n, m in convs.items()])
  plan = {**sharded_plan(), "options": {"batch_norm": "local"}}
  set_statistics_groups(model, as_plan(plan))
  assert convs["fc1"].stats_groups == 2 and convs["fc2"].stats_groups == 1  # d of (d, m)
