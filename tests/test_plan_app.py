"""The plan app: plan JSON + table + chart; graph/profile files in place of a zoo model; errors."""

import json

import pytest
from apps import assert_one_line_error, run_app

from dp_jax.graph.layer_graph import LayerNode
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import Plan
from dp_jax.report.compare import GPU_VALIDATED_TOLERANCE


def write_graph_and_profile(tmp_path, cycle=False, drop=None):
  """A 4-layer chain with a residual block, and a profile that scales linearly with batch."""
  nodes = [LayerNode("a", "conv2d", ("d",) if cycle else (), 10, 40, (8,), 32),
           LayerNode("b", "conv2d", ("a",), 10, 40, (8,), 32),
           LayerNode("c", "add", ("b", "a"), 0, 0, (8,), 32),
           LayerNode("d", "linear", ("c",), 1000, 4000, (4,), 16)]
  graph = {"schema": "dp_jax.graph/1", "model": "toy", "nodes": [n.to_json() for n in nodes]}
  gpath = tmp_path / "graph.json"
  gpath.write_text(json.dumps(graph))
  layers = {n.name: {b: (0.1 + 0.05 * b, 0.2 + 0.1 * b) for b in (1, 2, 4, 8)}
            for n in nodes if n.name != drop}
  ppath = ProfileTable("toy", "A100-SXM4-40GB", "bfloat16", "analytic", layers).save(
      tmp_path / "profile.json")
  return gpath, ppath


def test_plans_a_graph_and_profile_file(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path)
  out = tmp_path / "plan.json"
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", "cluster=a100_nvlink_8",
                   "cluster.num_devices=4", "batch_size=8", "planner.amplification_limit=inf",
                   f"out={out}", "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  plan = Plan.load(out)
  assert [lp.name for lp in plan.layers] == ["a", "b", "c", "d"]
  assert plan.predicted["iteration_ms"] <= plan.predicted["data_parallel_iteration_ms"] + 1e-9
  assert (tmp_path / "run" / "devices_per_layer.png").stat().st_size > 0
  assert not (tmp_path / "run" / "devices_per_layer.pdf").exists()  # chart_pdf=true asks for it
  assert (tmp_path / "run" / "plan_layers.csv").read_text().startswith("layer,kind,devices")


def test_vgg16_on_the_a100_tables(tmp_path):
  result = run_app("plan", "model=vgg16", "cluster=a100_nvlink_8", "batch_size=32",
                   "profile=deeppool_a100", "planner.amplification_limit=inf", "logger=disabled",
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  plan = Plan.load(tmp_path / "run" / "plan.json")
  assert [lp.name for lp in plan.layers][:2] == ["features.0", "features.1"]
  assert plan.predicted["iteration_ms"] <= plan.predicted["data_parallel_iteration_ms"] + 1e-9


@pytest.mark.parametrize("overrides, fragments", [
    (["cluster.num_devices=0"], ["num_devices"]),
    (["batch_size=0"], ["batch_size=0 must be >= 1"]),
    (["cluster.num_devices=8", "batch_size=4", "planner.amplification_limit=inf"], ["8"]),
    (["planner.amplification_limit=0.5"], ["amplification"]),
    (["cluster.num_devices=64"], ["at most 8 devices"]),
    (["chart=false", "chart_pdf=true"], ["chart_pdf", "needs chart=true"]),
])
def test_bad_plan_input_is_one_line(tmp_path, overrides, fragments):
  gpath, ppath = write_graph_and_profile(tmp_path)
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", *overrides, "logger=disabled",
                   cwd=tmp_path)
  assert_one_line_error(result, *fragments)


def test_cyclic_graph_and_missing_profile_row_are_one_line(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path, cycle=True)
  assert_one_line_error(run_app("plan", f"graph={gpath}", f"profile={ppath}", "logger=disabled",
                                cwd=tmp_path), "cycle")
  gpath, ppath = write_graph_and_profile(tmp_path, drop="b")
  assert_one_line_error(run_app("plan", f"graph={gpath}", f"profile={ppath}", "logger=disabled",
                                cwd=tmp_path), "'b'")


def test_a_profile_extrapolated_beyond_its_batches_is_warned_and_recorded(tmp_path):
  gpath, _ = write_graph_and_profile(tmp_path)
  layers = {n: {1: (0.1, 0.2)} for n in "abcd"}
  ppath = ProfileTable("toy", "A100-SXM4-40GB", "bfloat16", "analytic", layers).save(
      tmp_path / "batch1.json")
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", "cluster=a100_nvlink_8",
                   "cluster.num_devices=4", "batch_size=8", "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert "WARNING" in result.stdout and "extrapolated" in result.stdout
  plan = json.loads((tmp_path / "run" / "plan.json").read_text())
  assert plan["profile"]["extrapolated_batches"] == [2, 4, 8]
  assert plan["made_for"] == {"name": "toy", "input_shape": [], "layers": 4, "options": {}}
  assert plan["cluster_config"]["name"] == "a100_nvlink_8"


def test_batches_only_more_devices_would_use_are_not_called_extrapolated(tmp_path):
  # B=8 on G=2: the search prices per-device batches 8 and 4, both measured; 1 and 2 (G >= 4)
  # are outside the profile but no plan on 2 devices uses them
  gpath, _ = write_graph_and_profile(tmp_path)
  layers = {n: {4: (0.4, 0.8), 8: (0.8, 1.6)} for n in "abcd"}
  ppath = ProfileTable("toy", "A100-SXM4-40GB", "bfloat16", "analytic", layers).save(
      tmp_path / "batch48.json")
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", "cluster=a100_nvlink_8",
                   "cluster.num_devices=2", "batch_size=8", "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert "extrapolated" not in result.stdout + result.stderr
  plan = json.loads((tmp_path / "run" / "plan.json").read_text())
  assert plan["profile"]["extrapolated_batches"] == [] and plan["num_devices"] == 2


def test_a_known_graph_plans_without_jax_matplotlib_or_wandb(tmp_path):
  """With the graph given as JSON, chart=false and W&B off the app imports none of JAX,
  matplotlib and wandb (it still writes the plan and its table)."""
  import os
  import subprocess
  import sys

  from apps import REPO

  gpath, ppath = write_graph_and_profile(tmp_path)
  out = tmp_path / "plan.json"
  env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
  result = subprocess.run(
      [sys.executable, "-X", "importtime", "-m", "dp_jax.plan", f"graph={gpath}",
       f"profile={ppath}", "cluster=a100_nvlink_8", "cluster.num_devices=4", "batch_size=8",
       f"out={out}", "logger=disabled", "chart=false", f"hydra.run.dir={tmp_path}/run"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
              if line.startswith("import time:")}
  assert "dp_jax.planner.search" in imported  # the report is complete
  assert not imported & {"jax", "matplotlib", "wandb", "flax"}, imported & {"jax", "matplotlib"}
  assert [lp.name for lp in Plan.load(out).layers] == ["a", "b", "c", "d"]
  assert not (tmp_path / "run" / "devices_per_layer.png").exists()


def test_a_plan_that_is_data_parallelism_on_fewer_devices_is_called_that(tmp_path):
  # VGG16 on 32 GPUs with 0.5 GB/s links: the fastest plan is data parallelism on 8 (one node),
  # tens of times faster than data parallelism on all 32: the summary names it data
  # parallelism on 8, leaves the ratio against itself out, and says what DP on all 32 takes
  result = run_app("plan", "model=vgg16", "cluster=dgx_a100", "cluster.num_devices=32",
                   "cluster.inter_node_bandwidth_GBps=0.5", "batch_size=32",
                   "profile=deeppool_a100", "planner.amplification_limit=inf", "logger=disabled",
                   "chart_pdf=true", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  out = " ".join(result.stdout.split())
  named = out.index("predicted: the plan is data parallelism on 8 devices (")
  assert named < out.index("data parallelism on all 32: ")
  assert "1.00x" not in out and "tie within" not in out and "burst" not in out
  s = json.loads((tmp_path / "run" / "status.json").read_text())
  assert s["plan_data_parallel_devices"] == 8 and s["best_data_parallel_devices"] == 8
  assert s["speedup"] > 10 and s["speedup_verdict"] == "ahead"  # recorded, not printed
  assert s["comparison_tolerance"] == GPU_VALIDATED_TOLERANCE
  assert s.get("dominated_by_data_parallel_devices") is None and "note: data" not in out
  assert (tmp_path / "run" / "devices_per_layer.pdf").stat().st_size > 0


def test_a_plan_data_parallelism_beats_in_time_and_gpu_time_is_named(tmp_path):
  # GPT-2 at one sample per GPU on 256: data parallelism has a layer amplifying beyond 2, so the
  # A=2 plan keeps layers on fewer GPUs and pays moves: slower and more GPU time than DP
  result = run_app("plan", "model=gpt2", "profile=analytic", "cluster=dgx_a100",
                   "cluster.num_devices=256", "batch_size=256", "planner.amplification_limit=2",
                   "logger=disabled", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  s = json.loads((tmp_path / "run" / "status.json").read_text())
  d = s["dominated_by_data_parallel_devices"]
  assert d is not None and s["speedup_vs_best_data_parallel_verdict"] == "behind"
  assert s["dominated_by_data_parallel_iteration_ms"] * 1.083 < s["iteration_ms"]
  assert s["dominated_by_data_parallel_gpu_ms"] * 1.083 < s["gpu_ms"]
  out = " ".join(result.stdout.split())
  assert f"note: data parallelism on {d} devices is faster" in out
  assert "amplification limit (2.0) is per layer" in out


def test_comparison_strict_judges_every_margin(tmp_path):
  result = run_app("plan", "model=vgg16", "cluster=a100_nvlink_8", "batch_size=32",
                   "planner.amplification_limit=2", "comparison=strict", "logger=disabled",
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  s = json.loads((tmp_path / "run" / "status.json").read_text())
  assert s["comparison_tolerance"] == 0.0 and s["speedup"] < 1 and s["speedup_verdict"] == "behind"


def test_a_negative_tolerance_is_one_line(tmp_path):
  result = run_app("plan", "model=vgg16", "comparison.tolerance=-1", "logger=disabled",
                   cwd=tmp_path)
  assert_one_line_error(result, "comparison.tolerance=-1")
