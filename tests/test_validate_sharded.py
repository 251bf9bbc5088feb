"""validate with planner.sharding=[samples,weights]: the burst plans are predicted and timed with
their weight shardings (the random plans split samples only)."""

import json
import math
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from test_validate_predict import calibration

from dp_jax import validate
from dp_jax.base.checks import build
from dp_jax.hardware.cluster import named_cluster
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.layer_times.sources import profile_batches
from dp_jax.measurement import local, plan_timing
from dp_jax.measurement.local import LocalConfig
from dp_jax.measurement.plan_timing import PlanTiming
from dp_jax.models.zoo import ModelConfig
from dp_jax.planner import PlanOptions


def test_validate_predicts_and_times_sharded_burst_plans(tmp_path, monkeypatch):
  """VGG-16 at 32x32 on two A100s (analytic profile), the measurement faked (the setup given,
  the timing recorded): the burst plan splits weights, and what is timed and predicted is it."""
  model = build(ModelConfig, OmegaConf.create({"name": "vgg16", "image_size": 32}))
  graph, cluster = model.graph(), named_cluster("a100_nvlink_8")
  profile = analytic_profile(graph, "A100-SXM4-40GB", "float32", profile_batches(32))
  planner = validate.PlannerConfig(sharding=("samples", "weights"), overlap_allreduce=False)
  plans = validate.PlanSet(plans=2, amplification_limits=(math.inf,))
  cfg = validate.ValidateConfig(model=model, cluster=cluster, planner=planner, validate=plans,
                                local=LocalConfig(statistic="median"), batch_size=32)
  setup = local.LocalSetup(devices=[SimpleNamespace(platform="cpu")] * 2,
                           calibration=calibration(2), cluster=cluster, graph=graph,
                           profile=profile, options=PlanOptions.of(planner, 2, 32))
  monkeypatch.setattr(local, "start_host_devices", lambda count: None)
  monkeypatch.setattr(local, "prepare", lambda *a, **k: setup)
  timed = []

  def fake_time_plans(build_model, run_graph, plans, devices, **kw):
    timed.extend(plans)
    return [PlanTiming((10.0 + i, 11.0 + i), len(p.stages), 1.0) for i, p in enumerate(plans)]

  monkeypatch.setattr(plan_timing, "time_plans", fake_time_plans)
  run = SimpleNamespace(output_dir=tmp_path, begin=lambda: None, log=lambda *a: None,
                        log_table=lambda *a: None, log_image=lambda *a: None)
  validate.validate_task(cfg, run)

  rows = json.loads((tmp_path / "metrics.json").read_text())["plans_detail"]
  assert [r["kind"] for r in rows] == ["data_parallel", "burst", "random", "random"]
  burst = timed[1]
  split = [lp.name for lp in burst.layers if lp.split != "samples"]
  assert split and rows[1]["weight_sharded_layers"] == len(split)
  assert rows[1]["predicted_ms"] == pytest.approx(burst.predicted["iteration_ms"], rel=1e-9)
  assert all(lp.split == "samples" for p in timed[2:] for lp in p.layers)  # random: samples
  assert [r["stages"] for r in rows] == [len(p.stages) for p in timed]
