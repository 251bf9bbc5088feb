"""python -m dp_jax.pipeline: the A100 comparison, then the local run, every number labelled."""

import json

from apps import assert_one_line_error, run_app

TINY = ["model=gpt2", "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.seq_len=16",
        "model.vocab_size=64", "cluster.num_devices=2", "batch_size=4", "profile=analytic",
        "logger=disabled", "paper.settings=[{cluster: a100_nvlink_8, num_devices: 8}]"]


def test_the_main_job_reports_the_a100_setting_and_a_measured_local_run(tmp_path):
  result = run_app("pipeline", *TINY, "background=none", "train.steps=2", cwd=tmp_path,
                   timeout=600)
  assert result.returncode == 0, result.stderr
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  (row,) = summary["a100"]
  assert row["cluster"] == "a100_nvlink_8" and row["G"] == 8
  assert row["burst ms (predicted)"] > 0 and row["data-parallel ms (predicted)"] > 0
  local = summary["local"]
  assert local["burst_iteration_ms"]["kind"] == "predicted"
  assert local["simulated_alone_iteration_ms"]["kind"] == "simulated"
  assert local["train_steps"] == {"value": 2, "kind": "measured"}
  assert {v["kind"] for v in local.values()} <= {"config", "predicted", "simulated", "measured"}
  assert "burst vs data parallelism" in result.stdout and "measured" in result.stdout
  assert "2 steps of the burst plan" in result.stdout  # the header and the bar agree


def test_negative_train_steps_is_one_line_and_names_the_option(tmp_path):
  assert_one_line_error(run_app("pipeline", *TINY, "train.steps=-1", cwd=tmp_path),
                        "train.steps=-1 must be >= 0")


def test_an_unknown_paper_cluster_is_one_line(tmp_path):
  result = run_app("pipeline", *TINY[:-1], "paper.settings=[{cluster: nope, num_devices: 8}]",
                   cwd=tmp_path)
  assert_one_line_error(result, "unknown cluster 'nope'", "dgx_a100")
