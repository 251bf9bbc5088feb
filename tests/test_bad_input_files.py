"""Plan, graph and profile files with duplicate layers, NaN or negative numbers or zero times:
refused with one `error:` line naming the file and the field (through the apps where cheap)."""

import json
import math

import pytest
from apps import assert_one_line_error, run_app
from test_plan_app import write_graph_and_profile

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import named_cluster
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import Plan, make_plan

COMMON = ["cluster=a100_nvlink_8", "cluster.num_devices=4", "batch_size=8", "logger=disabled"]


def toy_plan(tmp_path) -> tuple[dict, list[str]]:
  """A planner's plan of the toy graph (as JSON) and the simulate arguments for its files."""
  gpath, ppath = write_graph_and_profile(tmp_path)
  plan = make_plan(LayerGraph.load(gpath), ProfileTable.load(ppath),
                   named_cluster("a100_nvlink_8"),
                   num_devices=4, global_batch=8, amplification_limit=math.inf)
  return plan.to_json(), [f"graph={gpath}", f"profile={ppath}", *COMMON, "background=none"]


def edit_json(path, edit) -> None:
  d = json.loads(path.read_text())
  edit(d)
  path.write_text(json.dumps(d))


def test_a_plan_with_two_entries_for_one_layer_is_refused_by_simulate(tmp_path):
  d, args = toy_plan(tmp_path)
  second = dict(d["layers"][1], devices=[0], samples=[[0, 8]])  # 'b' again, elsewhere
  d["layers"].insert(2, second)
  path = tmp_path / "dup.json"
  path.write_text(json.dumps(d))
  result = run_app("simulate", f"plan={path}", *args, cwd=tmp_path)
  assert_one_line_error(result, str(path), "layers[2]", "second entry for layer 'b'")


def test_a_plan_with_nan_is_refused_by_simulate(tmp_path):
  d, args = toy_plan(tmp_path)
  text = json.dumps(d).replace(f'"iteration_ms": {json.dumps(d["predicted"]["iteration_ms"])}',
                               '"iteration_ms": NaN', 1)
  assert "NaN" in text
  path = tmp_path / "nan.json"
  path.write_text(text)
  result = run_app("simulate", f"plan={path}", *args, cwd=tmp_path)
  assert_one_line_error(result, str(path), "field 'predicted.iteration_ms' is nan")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["predicted"].update(gpu_ms=-1.0), "predicted.gpu_ms must be a number >= 0"),
    (lambda d: d.update(planner_seconds=-0.5), "planner_seconds must be a number >= 0"),
    (lambda d: d["layers"][0].update(compute_ms=-2.0), "layer 'a': compute_ms must be"),
    (lambda d: d["layers"][0]["samples"][0].__setitem__(0, -4), "two integers >= 0"),
])
def test_a_plan_with_a_negative_number_is_refused(tmp_path, edit, field):
  d, _ = toy_plan(tmp_path)
  path = tmp_path / "neg.json"
  path.write_text(json.dumps(d))
  Plan.load(path)  # the unedited plan loads
  edit_json(path, edit)
  with pytest.raises(UserError, match="^" + str(path)) as err:
    Plan.load(path)
  assert field in str(err.value) and "\n" not in str(err.value)


def test_a_graph_with_nan_flops_is_refused_by_plan(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path)
  text = gpath.read_text().replace('"flops_per_sample": 0.0', '"flops_per_sample": NaN', 2)
  gpath.write_text(text)
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", *COMMON, cwd=tmp_path)
  assert_one_line_error(result, str(gpath), "field 'nodes[0].flops_per_sample' is nan")


def test_a_graph_with_negative_parameters_is_refused_by_plan(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path)
  edit_json(gpath, lambda d: d["nodes"][1].update(params=-10))
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", *COMMON, cwd=tmp_path)
  assert_one_line_error(result, str(gpath), "nodes[1]", "node 'b' field 'params' is -10")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["nodes"][0].update(param_bytes=-1), "field 'param_bytes' is -1"),
    (lambda d: d["nodes"][0].update(out_shape=[8, 0]), "field 'out_shape' is [8, 0]"),
    (lambda d: d.update(input_shape=[-3]), "field 'input_shape' is [-3]"),
    (lambda d: d["nodes"].append(dict(d["nodes"][3], inputs=["d"])), "duplicate layer name 'd'"),
])
def test_a_graph_with_a_negative_size_or_a_duplicate_layer_is_refused(tmp_path, edit, field):
  gpath, _ = write_graph_and_profile(tmp_path)
  LayerGraph.load(gpath)
  edit_json(gpath, edit)
  with pytest.raises(UserError, match="^" + str(gpath)) as err:
    LayerGraph.load(gpath)
  assert field in str(err.value), err.value


def test_a_profile_with_a_zero_time_is_refused_by_plan(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path)
  edit_json(ppath, lambda d: d["layers"]["b"]["2"].update(fwd_ms=0))
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", *COMMON, cwd=tmp_path)
  assert_one_line_error(result, str(ppath), "layer 'b' batch 2 field 'fwd_ms' is 0",
                        "must be finite and > 0")


def test_an_all_zero_profile_is_refused_by_plan_not_divided_by(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path)

  def zero(d):
    for rows in d["layers"].values():
      for t in rows.values():
        t.update(fwd_ms=0.0, bwd_ms=0.0)

  edit_json(ppath, zero)
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", *COMMON, cwd=tmp_path)
  line = assert_one_line_error(result, str(ppath), "field 'fwd_ms' is 0.0")
  assert "division" not in line


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["layers"]["a"]["1"].update(bwd_ms=-0.1), "batch 1 field 'bwd_ms' is -0.1"),
    (lambda d: d["layers"]["a"].update({"01": d["layers"]["a"]["1"]}), "two timings for batch 1"),
    (lambda d: d["layers"]["a"].update({"0": d["layers"]["a"]["1"]}), "batch key '0'"),
])
def test_a_profile_with_a_negative_time_or_a_batch_twice_is_refused(tmp_path, edit, field):
  _, ppath = write_graph_and_profile(tmp_path)
  edit_json(ppath, edit)
  with pytest.raises(UserError, match="^" + str(ppath)) as err:
    ProfileTable.load(ppath)
  assert field in str(err.value), err.value


def test_a_profile_with_a_layer_twice_is_refused_naming_it(tmp_path):
  _, ppath = write_graph_and_profile(tmp_path)
  text = ppath.read_text()
  rows = json.dumps(json.loads(text)["layers"]["b"])
  ppath.write_text(text.replace('"layers": {', '"layers": {"b": ' + rows + ", ", 1))
  assert text != ppath.read_text()
  with pytest.raises(UserError, match="^profile file " + str(ppath)) as err:
    ProfileTable.load(ppath)
  assert "key 'b' appears twice" in str(err.value)


def test_a_profile_with_nan_is_refused_naming_the_field(tmp_path):
  _, ppath = write_graph_and_profile(tmp_path)
  edit_json(ppath, lambda d: d["layers"]["c"]["4"].update(bwd_ms=float("nan")))
  with pytest.raises(UserError, match="^profile file " + str(ppath)) as err:
    ProfileTable.load(ppath)
  assert "field 'layers.c.4.bwd_ms' is nan" in str(err.value)
  with pytest.raises(UserError, match="layer 'c' batch 4 field 'bwd_ms' is nan"):
    ProfileTable.from_json(json.loads(ppath.read_text()), str(ppath))  # parsed in memory
