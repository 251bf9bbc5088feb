"""python -m dp_jax.simulate: outputs, plan files, offline W&B, one-line errors."""

import json

import pytest
from apps import assert_one_line_error, run_app
from sim_helpers import graph, profile

from dp_jax.planner import Plan
from dp_jax.report.compare import GPU_VALIDATED_TOLERANCE


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("inputs")
  return {"graph": str(graph("inception", 1).save(d / "graph.json")),
          "profile": str(profile("inception", 32, 1).save(d / "profile.json"))}


def _args(files, *more):
  # the synthetic profile's device is "synthetic": priced for the A100 cluster on purpose
  return ["model.name=inception_like", f"graph={files['graph']}", "profile.source=file",
          f"profile.path={files['profile']}", "profile.allow_other_device=true",
          "cluster=dgx_a100", "cluster.num_devices=16", "batch_size=32", *more]


def test_plans_simulates_and_writes_everything(tmp_path, files):
  result = run_app("simulate", *_args(files), cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  run = tmp_path / "run"
  m = json.loads((run / "metrics.json").read_text())
  assert m["model"] == "inception_like" and m["num_devices"] == 16
  assert m["max_slowdown"] <= 0.1 + 1e-9
  assert m["cluster_samples_per_s"] >= m["samples_per_s"]
  tl = json.loads((run / "timeline.json").read_text())
  assert tl["schema"] == "dp_jax.timeline/1"
  assert {e["kind"] for e in tl["with_background"]["events"]} >= {"fwd", "bwd", "bg"}
  assert (run / "gantt.png").read_bytes()[:4] == b"\x89PNG"
  assert (run / "gantt.pdf").read_bytes()[:4] == b"%PDF"
  assert Plan.load(run / "plan.json").num_devices == 16
  assert m["matched_data_parallel_devices"] is None or m[
      "cluster_throughput_vs_matched_data_parallel_verdict"] in ("ahead", "tie", "behind")
  assert m["comparison_tolerance"] == GPU_VALIDATED_TOLERANCE  # an A100 cluster
  printed = " ".join(result.stdout.split())
  # one sentence: the foreground against the fastest DP first, then the cluster throughput
  # against the matched baseline before DP alone on all 16, then what it rests on
  fair = printed[printed.index("simulated: "):]
  assert fair.startswith(("simulated: the burst foreground is", "simulated: the plan is data"))
  throughput = fair.index("the cluster throughput is")
  if m["matched_data_parallel_devices"] is not None:
    assert throughput < fair.index("against the matched DP on") < fair.index(
        "against data parallelism on all 16 alone")
  assert fair.index("alone") < fair.index(" — fp32 gradients; analytic synthetic")
  files_dir = next((run / "wandb").glob("offline-run-*")) / "files"
  assert list((files_dir / "media" / "table").glob("simulation_*.table.json"))
  assert list((files_dir / "media" / "images").glob("gantt_*.png"))


def test_simulates_a_plan_file_without_background(tmp_path, files):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  first = run_app("simulate", *_args(files, "logger=disabled"), cwd=tmp_path / "a")
  assert first.returncode == 0, first.stderr
  plan = tmp_path / "a" / "run" / "plan.json"
  result = run_app("simulate", *_args(files, f"plan={plan}", "background=none",
                                      "logger=disabled"), cwd=tmp_path / "b")
  assert result.returncode == 0, result.stderr
  m = json.loads((tmp_path / "b" / "run" / "metrics.json").read_text())
  assert m["background_samples_per_s"] == 0
  assert m["alone_iteration_ms"] == pytest.approx(Plan.load(plan).predicted["iteration_ms"],
                                                  rel=0.01)


@pytest.mark.parametrize("more, fragments", [
    (["background.slowdown_cap=-0.5"], ["background.slowdown_cap=-0.5 must be >= 0"]),
    (["background.batch_per_device=4000000"], ["needs", "GB per device", "background=none"]),
    (["interference.policy=nope"], ["interference.policy"]),
    (["background=nope"], ["unknown background 'nope'", "same_family"]),
])
def test_bad_input_is_one_line(tmp_path, files, more, fragments):
  result = run_app("simulate", *_args(files, "logger=disabled", *more), cwd=tmp_path)
  assert_one_line_error(result, *fragments)


def test_a_plan_made_for_another_model_config_is_refused(tmp_path):
  from test_plan_app import write_graph_and_profile

  gpath, ppath = write_graph_and_profile(tmp_path)
  for size, name in ((32, "small.json"), (224, "big.json")):
    g = json.loads(gpath.read_text())
    (tmp_path / name).write_text(json.dumps({**g, "input_shape": [size, size, 3]}))
  common = [f"profile={ppath}", "cluster=a100_nvlink_8", "cluster.num_devices=4", "batch_size=8",
            "logger=disabled", "background=none"]
  made = run_app("plan", f"graph={tmp_path / 'small.json'}", *common[:-1],
                 f"out={tmp_path / 'p.json'}", cwd=tmp_path)
  assert made.returncode == 0, made.stderr
  result = run_app("simulate", f"graph={tmp_path / 'big.json'}", f"plan={tmp_path / 'p.json'}",
                   *common, cwd=tmp_path)
  assert_one_line_error(result, "was made for toy (input 32x32x3, 4 layers)",
                        "not toy (input 224x224x3, 4 layers)")
