"""The inspect app: layer table, graph JSON, offline W&B runs in a multirun, one-line errors."""

import json

import pytest
from apps import assert_one_line_error, run_app

from dp_jax.graph.layer_graph import LayerGraph


def test_multirun_writes_graphs_and_offline_wandb_runs(tmp_path):
  result = run_app("inspect", "-m", "model=vgg16,resnet50", "model.image_size=32", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  for job, model in (("0", "vgg16"), ("1", "resnet50")):
    cell = tmp_path / "sweep" / job
    graph = LayerGraph.load(cell / "graph.json")
    assert graph.model == model
    assert json.loads((cell / "status.json").read_text())["status"] == "ok"
    runs = list((cell / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "one offline W&B run per cell"
    files = runs[0] / "files"
    config = json.loads((files / "dp_jax_config.json").read_text())
    assert config["model"]["name"] == model
    assert config["provenance"]["git_sha"]
    tables = list((files / "media" / "table").glob("layers_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["name", "kind", "params", "output shape", "GFLOPs/sample"]
    assert [row[0] for row in table["data"]] == list(graph.names)
    assert sum(row[2] for row in table["data"]) == graph.total_params


def test_out_writes_the_graph_where_asked(tmp_path):
  out = tmp_path / "vgg.json"
  result = run_app("inspect", "model=vgg16", "model.image_size=32", f"out={out}",
                   "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert "total" in result.stdout
  assert LayerGraph.load(out).total_params > 0


@pytest.mark.parametrize("overrides, fragments", [
    (["model=nope"], ["unknown model 'nope'", "resnet50", "vgg16"]),
    (["model.image_size=-3"], ["image_size"]),
    (["model.image_size=abc"], ["model.image_size", "Integer"]),
    (["model.foo=1"], ["foo", "valid keys"]),
    (["model=["], ["malformed override"]),
])
def test_bad_input_is_one_line(tmp_path, overrides, fragments):
  result = run_app("inspect", *overrides, "logger=disabled", cwd=tmp_path)
  assert_one_line_error(result, *fragments)
