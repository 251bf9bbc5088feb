"""experiments/cluster_throughput.py: a cluster-throughput gain is stated with its foreground."""

from experiments import aggregate as report
from experiments.cluster_throughput import STUDY

BASIS = "bf16 gradients; calibrated A100-SXM4-40GB mixed bf16 profile; A=2"


def cell(g, **values):
  return {"status": "ok", "model": "vgg16", "cluster": "dgx_a100", "device": "A100-SXM4-40GB",
          "num_devices": g, "global_batch": 32, "amplification_limit": 2.0, "basis": BASIS,
          "plan_data_parallel_devices": None, "best_data_parallel_devices": 8,
          "matched_data_parallel_devices": 8, "cluster_throughput_vs_matched_data_parallel": 1.38,
          "cluster_throughput_vs_best_data_parallel": 1.5,
          "cluster_throughput_vs_data_parallel": 2.0, "speedup_vs_best_data_parallel": 0.82,
          "speedup_vs_data_parallel": 0.9, "git_sha": "0" * 40, **values}


ROWS = STUDY.finish([
    cell(8), cell(16, cluster_throughput_vs_matched_data_parallel=0.96),
    cell(32, plan_data_parallel_devices=4, cluster_throughput_vs_matched_data_parallel=3.0)])


def readme(rows):
  prov = {"cells": len(rows), "ok": len(rows), "failed": 0, "git_shas": ["0" * 40],
          "git_dirty": False}
  return report.markdown(STUDY, rows, prov)


def test_each_cluster_gain_comes_with_the_foreground_against_the_fastest_dp():
  md = readme(ROWS)
  assert "| vgg16 | 1.38x ahead @8; 1.50x ahead; 2.00x ahead; foreground 0.82x behind |" in md
  assert ("Largest gain against the matched baseline: vgg16 G=8 B=32, cluster throughput 1.38x "
          "ahead against matched DP on 8 + background, foreground 0.82x behind against the "
          "fastest DP on <= G (DP on 8).") in md
  assert "while the foreground against the fastest data parallelism on <= G is 0 ahead" in md


def test_a_data_parallel_plan_is_named_and_counted_not_judged():
  md = readme(ROWS)
  assert "| DP on 4 |" in md and "3.00x" not in md
  assert "Against the matched baseline: 1 ahead, 1 tie, 0 behind, 1 is DP, 0 with no" in md


def test_the_readme_says_what_the_verdicts_rest_on():
  assert f"Verdicts rest on: `{BASIS}`." in readme(ROWS)
  old = [{k: v for k, v in r.items() if k != "basis"} for r in ROWS]
  assert "Verdicts rest on: not recorded" in readme(old)
