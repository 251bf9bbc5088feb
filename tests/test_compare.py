"""Comparisons carry margins; a margin inside the validated error is a tie
(dp_jax/report/compare.py)."""

import csv
import statistics
from pathlib import Path

import pytest
import yaml
from sim_helpers import cluster, graph, plan, profile

from dp_jax.base.errors import UserError
from dp_jax.report.compare import (
  GPU_VALIDATED_TOLERANCE,
  VALIDATED_TOLERANCE,
  ComparisonConfig,
  compare,
  describe,
  gpu_time_change,
  validated_tolerance,
  verdict,
)
from dp_jax.simulator.engine import simulate
from dp_jax.simulator.job import background_job
from dp_jax.simulator.metrics import data_parallel_frontier, matched_data_parallel, metrics

ROOT = Path(__file__).resolve().parents[1]


def test_a_burst_plan_one_percent_faster_is_a_tie_at_five_percent():
  r = compare(99.0, 100.0, 0.05, lower_is_better=True)  # burst 99 ms, data parallelism 100 ms
  assert r["ratio"] == pytest.approx(100 / 99)
  assert r["margin"] == pytest.approx(100 / 99 - 1)
  assert r["verdict"] == "tie"
  assert compare(99.0, 100.0, 0.0, lower_is_better=True)["verdict"] == "ahead"
  assert compare(90.0, 100.0, 0.05, lower_is_better=True)["verdict"] == "ahead"
  assert compare(110.0, 100.0, 0.05, lower_is_better=True)["verdict"] == "behind"


def test_throughputs_compare_the_other_way_round():
  assert compare(120.0, 100.0, 0.05, lower_is_better=False)["verdict"] == "ahead"
  assert compare(97.0, 100.0, 0.05, lower_is_better=False)["verdict"] == "tie"
  assert compare(90.0, 100.0, 0.05, lower_is_better=False)["verdict"] == "behind"


def test_verdict_edges_and_words():
  assert verdict(1.05, 0.05) == "tie" and verdict(0.95, 0.05) == "tie"
  assert describe(1.01, 0.05) == "1.01x (+1%, tie within 5.0%)"
  assert describe(1.23, 0.05) == "1.23x (+23%, ahead)"
  assert describe(None, 0.05) == "-"


@pytest.mark.parametrize("ours, baseline", [(125.4, 10.0), (10.0, 21.0), (99.7, 100.0)])
def test_a_gpu_time_change_is_a_ratio_never_a_percentage_beyond_minus_100(ours, baseline):
  text = gpu_time_change(1 - ours / baseline)  # the fraction saved, as the summaries store it
  assert "%" not in text
  factor = max(ours, baseline) / min(ours, baseline)
  if factor < 1.005:
    assert text == "the same GPU time"
  else:
    number, direction = text.split("x ")[0], "more" if ours > baseline else "less"
    assert abs(float(number) - factor) < 0.06 and text.endswith(f"{direction} GPU time")
  assert gpu_time_change(1 - 125.4 / 10.0) == "12.5x more GPU time"
  assert gpu_time_change(0.52, "") == "2.08x less" and gpu_time_change(None) == "-"


def test_bad_tolerance_is_one_line_naming_the_option():
  for bad in (-0.1, float("nan"), "x"):
    with pytest.raises(UserError, match=r"comparison\.tolerance"):
      ComparisonConfig(tolerance=bad)


def test_default_tolerance_is_the_committed_validation_median_error():
  errors = []
  files = sorted((ROOT / "results" / "validation").glob("*_validation.csv"))
  assert files, "results/validation/*_validation.csv missing"
  for path in files:
    for row in csv.DictReader(path.open()):
      errors.append(abs(float(row["predicted_ms"]) / float(row["measured_ms"]) - 1))
  assert round(statistics.median(errors), 3) == VALIDATED_TOLERANCE
  # the default (null) is the validated tolerance of the cluster's device
  assert ComparisonConfig().tolerance is None
  group = yaml.safe_load((ROOT / "conf" / "comparison" / "validated.yaml").read_text())
  assert not group  # the validated option sets nothing: the default (null) is the dataclass's
  assert validated_tolerance("cpu") == VALIDATED_TOLERANCE
  assert validated_tolerance("A100-SXM4-40GB") == GPU_VALIDATED_TOLERANCE
  assert ComparisonConfig().for_device("cpu") == VALIDATED_TOLERANCE
  assert ComparisonConfig(tolerance=0.0).for_device("H100-SXM5-80GB") == 0.0
  assert ComparisonConfig().for_device("A100-SXM4-40GB") == GPU_VALIDATED_TOLERANCE


def test_simulate_metrics_carry_margins_and_verdicts():
  job = background_job(graph("resnet"), profile("resnet", 64), cluster(), 8)
  s = simulate(graph("resnet"), profile("resnet", 64), cluster(), plan("resnet", 64, 64, 1.0),
               job=job, cap=0.1)
  strict, loose = metrics(s, 0.0), metrics(s, 10.0)
  for name in ("speedup_vs_data_parallel_alone", "speedup_vs_best_data_parallel_alone",
               "speedup_vs_data_parallel", "cluster_throughput_vs_data_parallel",
               "cluster_throughput_vs_best_data_parallel",
               "cluster_throughput_vs_matched_data_parallel"):
    assert strict[f"{name}_margin"] == pytest.approx(strict[name] - 1)
    assert strict[f"{name}_verdict"] == ("ahead" if strict[name] > 1 else "behind")
    assert loose[f"{name}_verdict"] == "tie"
  assert strict["comparison_tolerance"] == 0.0
  # the foreground against the fastest DP first, the cluster against the matched baseline
  # before DP alone, what it rests on last
  said = strict["fair_comparison"]
  assert said.startswith("simulated: the burst foreground is")
  assert said.endswith("A=1; ties within 0.0% (comparison.tolerance)")
  tail = said[said.index("the cluster throughput"):]
  assert tail.index("against the matched DP") < tail.index("against data parallelism on")


def test_a_small_margin_over_data_parallelism_is_not_reported_ahead():
  # a burst foreground ratio r over data parallelism: with a tolerance above |r - 1| the
  # metrics call it a tie, never ahead
  s = simulate(graph("resnet"), profile("resnet", 32), cluster(), plan("resnet", 8, 32))
  r = metrics(s, 0.0)["speedup_vs_data_parallel_alone"]
  m = metrics(s, abs(r - 1) + 0.04)
  assert m["speedup_vs_data_parallel_alone_verdict"] == "tie"
  assert "tie within" in m["fair_comparison"]


def test_matched_baseline_takes_the_best_data_parallelism_within_the_tolerance():
  # DP on 4 devices is 4% slower than the burst foreground (12.5 vs 12 ms): outside a 0%
  # tolerance, inside 5%, where it leaves more devices to the background than DP on 8
  front = data_parallel_frontier({1: 40.0, 2: 20.0, 4: 12.5, 8: 10.0}, 8, 32, 1000.0)
  strict = matched_data_parallel(front, 12.0, 5000.0, 0.0)
  assert strict["matched_data_parallel_devices"] == 8
  tolerant = matched_data_parallel(front, 12.0, 5000.0, 0.05)
  assert tolerant["matched_data_parallel_devices"] == 4
  assert tolerant["matched_data_parallel_cluster_samples_per_s"] == pytest.approx(
      32 / 12.5 * 1e3 + 4 * 1000.0)
  assert tolerant["cluster_throughput_vs_matched_data_parallel_verdict"] == "behind"
