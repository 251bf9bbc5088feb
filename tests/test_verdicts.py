"""Every printed verdict says what it rests on (gradient precision, profile, amplification
limit), a plan that is data parallelism is called that, GPU time saved is also stated against
the cheapest data parallelism as fast as the fastest, and a data-parallel baseline on fewer
devices than G says so."""

import json

from apps import run_app
from test_idle_device_limit import CLUSTER, chain

from dp_jax.main_job.summary import MainJobFacts, story
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.planner import PlanOptions, plan_with
from dp_jax.planner.baseline import cheapest_within, data_parallel_evaluations
from dp_jax.planner.costs import build_cost_model
from dp_jax.report.compare import data_parallel_on_all
from dp_jax.report.plan_report import comparisons, fair_comparison, gpu_time_line

VGG16_32_BF16 = ["model=vgg16", "cluster=dgx_a100", "cluster.num_devices=32",
                 "planner.gradient_precision=bf16", "planner.amplification_limit=inf",
                 "profile=deeppool_a100", "logger=disabled"]
BASIS = ("bf16 gradients; DeepPool's measured A100-SXM4-40GB mixed fp16 profile; A=inf; "
         "ties within 10.9% (the GPU tolerance of per-GPU batch <= 8)")


def paragraphs(stdout: str, *starts: str) -> list[str]:
  """The printed lines that start with one of `starts`, with the lines rich wrapped them onto
  joined back."""
  out: list[str] = []
  for line in stdout.splitlines():
    if line.startswith(starts):
      out.append(line)
    elif out and line and not line.startswith(("plan:", "chart:", "planned in", "outputs:")):
      out[-1] += " " + line
    else:
      out.append("")
  return [" ".join(p.split()) for p in out if p.startswith(starts)]


def test_the_plan_app_calls_data_parallelism_by_its_name_and_says_what_it_rests_on(tmp_path):
  # DeepPool's A100 tables: VGG16 at B=32 on 32 DGX A100 GPUs with bf16 gradients is fastest as
  # data parallelism on all 32 (the calibrated profile finds a 1.14x burst plan instead)
  result = run_app("plan", *VGG16_32_BF16, "chart=false", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  verdicts = paragraphs(result.stdout, "predicted:", "predicted GPU time:")
  assert len(verdicts) == 2 and all(v.endswith(BASIS) for v in verdicts), verdicts
  assert verdicts[0].startswith("predicted: the plan is data parallelism on 32 devices")
  assert "burst" not in verdicts[0] and "1.00x" not in verdicts[0]
  assert "(the plan is data parallelism on 32)" in verdicts[1]
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["plan_data_parallel_devices"] == 32 and status["basis"] == BASIS


def test_the_simulate_app_says_it_too(tmp_path):
  result = run_app("simulate", *VGG16_32_BF16, "background=same_family", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  (verdict,) = paragraphs(result.stdout, "simulated:")
  assert verdict.startswith("simulated: the plan is data parallelism on 32 devices")
  assert verdict.endswith(BASIS) and "burst" not in verdict


def test_gpu_time_is_saved_against_the_cheapest_data_parallelism_as_fast_as_the_fastest():
  graph, profile = chain(0.52)  # two devices: 1.04x the GPU time for 1.92x the speed
  options = PlanOptions(num_devices=2, global_batch=8, amplification_limit=2.0)
  plan = plan_with(graph, profile, CLUSTER, options)
  model = build_cost_model(graph, profile, CLUSTER, options)
  evaluations = data_parallel_evaluations(model)
  assert cheapest_within(model, evaluations, 0.01)[0] == 2  # only the fastest is that fast
  assert cheapest_within(model, evaluations, 1.5)[0] == 1  # both are: one device is cheaper
  c = comparisons(graph, profile, CLUSTER, plan, 1.5)
  assert c["plan_data_parallel_devices"] == 2 and c["cheapest_data_parallel_devices"] == 1
  assert c["gpu_time_saving_vs_cheapest_data_parallel"] < 0
  line = gpu_time_line(plan, c)
  assert "(the plan is data parallelism on 2)" in line
  assert "the cheapest data parallelism within 150.0% of the fastest one's time (on 1" in line
  assert "the plan uses 1.04x more GPU time" in line and line.endswith(
      "A=2; ties within 150.0% (comparison.tolerance)")
  assert fair_comparison(plan, c).startswith("predicted: the plan is data parallelism on 2")


def test_a_data_parallel_baseline_on_fewer_devices_than_g_says_so():
  assert data_parallel_on_all(32, 32, 64) == "data parallelism on all 32"
  assert data_parallel_on_all(24, 16, 32) == (
      "data parallelism on 16 of the 24 devices (24 does not divide B=32; 16 is the largest "
      "count that does)")


def row(**changed):
  base = {"cluster": "dgx_a100", "G": 32, "plan_data_parallel_devices": None, "plan_ms": 9.0,
          "fastest_dp_devices": 16, "fastest_dp_ms": 6.8, "speedup_vs_fastest_dp": 0.76,
          "dp_all_ms": 7.0, "cheapest_dp_devices": 16, "saved_vs_cheapest_dp": -0.07,
          "saved_vs_dp_all": 0.48, "background_samples_per_s": 900.0, "cluster_vs_dp_all": 2.1,
          "cluster_vs_matched": None, "matched_dp_devices": None,
          "basis": "bf16 gradients; calibrated A100-SXM4-40GB mixed bf16 profile; A=2",
          "tolerance": 0.076}
  return {**base, **changed}


def test_the_main_jobs_a100_lines_state_the_foreground_deficit_beside_the_throughput_gain():
  facts = MainJobFacts("vgg16", 32, 1.5, BackgroundConfig("same_family", None, 8, 0.1))
  (line,) = story(facts, [row()], {})
  assert "A=2" in line and "bf16 gradients" in line and "calibrated" in line
  sentence = line[line.index("with a background job"):]
  assert "2.10x the work of data parallelism alone" in sentence
  assert "foreground runs 0.76x (behind) the fastest data parallelism's speed" in sentence
  assert "1.07x more GPU time than the cheapest data parallelism within 7.6%" in line
  assert "1.92x less than data parallelism on all 32" in line  # saved 48%: 0.52 of its time
  (line,) = story(facts, [row(plan_data_parallel_devices=32, plan_ms=7.0)], {})
  assert "the plan for vgg16 B=32 is data parallelism on 32 GPUs" in line
  assert "burst" not in line and "x the work" not in line
