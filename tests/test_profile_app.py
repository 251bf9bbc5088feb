"""The profile app: imported A100 tables cover the zoo; measured profiles are cached; errors."""

import json

import pytest
from apps import assert_one_line_error, run_app, run_task

from dp_jax.layer_times.table import ProfileTable


@pytest.mark.parametrize("model, batch32_ms", [
    ("vgg16", 53.7), ("resnet50", None),
    pytest.param("wide_resnet101_2", None, marks=pytest.mark.slow),
    pytest.param("inception_v3", None, marks=pytest.mark.slow)])
def test_deeppool_a100_tables_cover_every_layer(tmp_path, model, batch32_ms):
  out = tmp_path / "p.json"
  result = run_app("profile", f"model={model}", "profile=deeppool_a100", "batch_size=32",
                   f"out={out}", "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["missing_layers"] == []
  if model == "resnet50":  # its residual adds are not in the tables: estimated, with a warning
    assert "estimated from the calibrated analytic model" in result.stdout
    assert "WARNING" in result.stdout and "lack 16 layer(s) of resnet50" in result.stdout
  else:
    assert "unmatched: none" in result.stdout
  table = ProfileTable.load(out)
  assert table.source == "imported"
  for b in range(1, 33):  # every per-device batch 1..32 has a timing (some interpolated)
    assert table.iteration_ms(b) > 0
  if batch32_ms is not None:
    assert abs(table.iteration_ms(32) - batch32_ms) <= 0.15 * batch32_ms


def test_measured_profile_is_served_from_cache_the_second_time(tmp_path):
  args = ("model=gpt2", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
          "model.seq_len=8", "model.vocab_size=64", "profile=measure", "batch_size=2",
          "profile.repeats=2", "profile.warmup=1", f"profile.cache_dir={tmp_path}/cache",
          "logger=disabled")
  # the task in this process (its CLI runs in the tests above and below)
  run_task("profile", *args, f"out={tmp_path}/a.json", cwd=tmp_path / "first")
  cached = sorted(p.name for p in (tmp_path / "cache").rglob("*.json"))
  assert cached, "measurements are cached on disk"
  mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*.json")}
  run_task("profile", *args, f"out={tmp_path}/b.json", cwd=tmp_path / "second")
  assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*.json")} == mtimes
  a, b = ProfileTable.load(tmp_path / "a.json"), ProfileTable.load(tmp_path / "b.json")
  assert a.layers == b.layers and a.source == "measured"


@pytest.mark.parametrize("overrides, fragments", [
    (["profile=analytic", "profile.device=TPU-v9"], ["TPU-v9", "A100"]),
    (["profile=analytic", "cluster=dgx_a100", "cluster.inter_node_bandwidth_GBps=-5"],
     ["inter_node_bandwidth_GBps", "-5"]),
])
def test_bad_device_and_cluster_are_one_line(tmp_path, overrides, fragments):
  result = run_app("profile", "model=vgg16", "model.image_size=32", "batch_size=2", *overrides,
                   "logger=disabled", cwd=tmp_path)
  assert_one_line_error(result, *fragments)


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.pop("device"), "missing required field 'device'"),
    (lambda d: d["layers"]["x"]["1"].update(fwd_ms="fast"), "expected a number"),
    (lambda d: d["layers"]["x"]["1"].pop("bwd_ms"), "missing field 'bwd_ms'"),
])
def test_malformed_profile_json_is_one_line(tmp_path, mutate, fragment):
  d = ProfileTable("m", "cpu", "float32", "measured", {"x": {1: (1.0, 2.0)}}).to_json()
  mutate(d)
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(d))
  graph = {"model": "m", "nodes": [{"name": "x", "kind": "linear", "inputs": [],
                                    "param_bytes": 4, "out_bytes_per_sample": 4}]}
  (tmp_path / "graph.json").write_text(json.dumps(graph))
  result = run_app("plan", f"graph={tmp_path}/graph.json", f"profile={path}", "batch_size=1",
                   "cluster.num_devices=1", "logger=disabled", cwd=tmp_path)
  assert_one_line_error(result, fragment)
