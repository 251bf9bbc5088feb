"""The main job's local measurement times and predicts the plan it prints and trains: a plan made
with planner.sharding=[samples,weights] that splits weights is timed and predicted with its
shardings, not as its layer -> devices assignment (every layer split by samples)."""

import json
import math
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from dp_jax import pipeline
from dp_jax.base.checks import build
from dp_jax.hardware.cluster import named_cluster
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.layer_times.sources import profile_batches
from dp_jax.main_job.summary import MainJobFacts
from dp_jax.measurement import local, plan_timing
from dp_jax.measurement.plan_timing import PlanTiming
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.planner import PlanOptions
from dp_jax.planner.contract import as_plan


def test_the_local_part_times_and_predicts_the_sharded_plan_it_prints(tmp_path, monkeypatch):
  """VGG-16 at 32x32 on two A100s (analytic profile): the planner splits the classifier's
  weights. The local part is run with its measurement faked (the setup given, the timing
  recorded): the plan it times must be the plan it saved, its prediction the plan's own."""
  model = build(ModelConfig, OmegaConf.create({"name": "vgg16", "image_size": 32}))
  graph = model.graph()
  cluster = named_cluster("a100_nvlink_8")
  profile = analytic_profile(graph, "A100-SXM4-40GB", "float32", profile_batches(32))
  planner = pipeline.PlannerConfig(sharding=("samples", "weights"), amplification_limit=math.inf)
  cfg = pipeline.PipelineConfig(model=model, cluster=cluster, planner=planner, batch_size=32)
  options = PlanOptions.of(planner.replace(overlap_allreduce=False), 2, 32)
  setup = local.LocalSetup(devices=[object(), object()], calibration=None, cluster=cluster,
                           graph=graph, profile=profile, options=options)
  monkeypatch.setattr(local, "prepare", lambda *a, **k: setup)
  timed = []

  def fake_time_plans(build_model, run_graph, plans, devices, **kw):
    timed.extend(plans)
    return [PlanTiming((10.0,), 1, 1.0) for _ in plans]

  monkeypatch.setattr(plan_timing, "time_plans", fake_time_plans)
  inputs = pipeline.PipelineInputs(cfg, None, options, None, MainJobFacts(
      "vgg16", 32, math.inf, BackgroundConfig()))
  measured = {}
  pipeline.local_part(inputs, tmp_path, SimpleNamespace(log_table=lambda *a: None),
                      lambda *a: None, measured, {})

  plan = as_plan(json.loads((tmp_path / "plan.json").read_text()))
  split = {lp.name: lp.sharding for lp in plan.layers if lp.split != "samples"}
  assert split, "the planner splits some layer's weights here (else this test shows nothing)"
  burst = as_plan(timed[0])
  assert {n: burst.layer(n).sharding for n in split} == split  # timed with its shardings
  assert [(lp.devices, lp.sharding) for lp in burst.layers] == [
      (lp.devices, lp.sharding) for lp in plan.layers]
  assert burst.stages == plan.stages and timed[1].data_parallel_devices == 2
  # predicted as the planner priced it (the measurement's options are the plan's)
  assert measured["burst_predicted_ms"][0] == pytest.approx(plan.predicted["iteration_ms"],
                                                            rel=1e-9)
