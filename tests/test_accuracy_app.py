"""dp_jax/accuracy.py: the accuracy app's sweep settings, its planner call and its errors."""

import pytest
from apps import REPO, assert_one_line_error, run_app
from omegaconf import OmegaConf

from dp_jax.accuracy import (
  AccuracySettings,
  plan_options,
  predicted_steps_ms,
  sweep_of,
)
from dp_jax.base.checks import build
from dp_jax.base.errors import UserError
from dp_jax.hardware.cluster import named_cluster
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.models.zoo import ModelConfig
from dp_jax.planner.options import PlannerConfig


def settings(**kw):
  return AccuracySettings(**kw)


def test_the_lr_grid_follows_sqrt_b_and_the_budget_is_whole_evaluations():
  sweep = sweep_of(settings(lrs=[0.1, 0.2], max_epochs=1.0), 128, num_train=1000)
  assert sweep.lrs == pytest.approx((0.2, 0.4))  # sqrt(128 / 32) = 2
  assert sweep.eval_every == 1 and sweep.max_steps == 8  # ceil(1000 / 128)
  small = sweep_of(settings(max_epochs=1.0), 8, num_train=1000)
  assert small.eval_every == 16 and small.max_steps == 128  # 125 rounded up to 16s


@pytest.mark.parametrize("kw,match", [
    ({"max_epochs": 0}, "accuracy.max_epochs=0 must be > 0"),
    ({"eval_every_samples": 0}, "accuracy.eval_every_samples=0 must be >= 1"),
])
def test_bad_settings_are_user_errors(kw, match):
  with pytest.raises(UserError, match=match):
    settings(**kw)


def test_the_app_rejects_a_model_that_is_not_a_digits_model(tmp_path):
  result = run_app("accuracy", "model=vgg16", "logger=disabled", cwd=tmp_path)
  assert_one_line_error(result, "model 'vgg16' is not a digits model")


def inputs(model):
  """(model, cluster, profile options, planner group) as the app decodes them."""
  conf = REPO / "conf"
  spec = ModelConfig.named(model) if isinstance(model, str) else build(
      ModelConfig, OmegaConf.load(conf / "model" / f"{model[0]}.yaml"))
  cluster = named_cluster("dgx_a100")
  planner = PlannerConfig(amplification_limit=float("inf"))
  return spec, cluster, ProfileConfig(source="analytic"), planner


@pytest.mark.parametrize("model", ["digits_cnn", "digits_mlp"])
def test_the_planner_prices_the_digits_models_like_any_zoo_model(model):
  spec, cluster, profile, planner = inputs((model,))
  rows = predicted_steps_ms(spec, cluster, profile, plan_options(planner, 16, [1, 4, 16, 32]))
  assert [r["num_devices"] for r in rows] == [1, 4, 16]  # G <= B
  assert rows[0]["data_parallel_ms"] == pytest.approx(rows[0]["burst_ms"])
  assert all(0 < r["burst_ms"] <= r["data_parallel_ms"] * (1 + 1e-9) for r in rows)
  assert rows[-1]["data_parallel_ms"] > rows[0]["data_parallel_ms"]  # all-reduce across nodes


def test_a_device_count_without_a_plan_is_recorded_not_raised():
  spec, cluster, profile, planner = inputs("vgg16")
  first, last = predicted_steps_ms(spec, cluster, profile, plan_options(planner, 2048, [1, 64]))
  assert first["burst_ms"] is None and "40 GB" in first["infeasible"]  # 2048 images on one A100
  assert last["burst_ms"] > 0


def test_what_if_step_times_price_the_named_zoo_model_not_the_trained_one():
  spec, cluster, profile, planner = inputs(("digits_mlp",))
  options = plan_options(planner, 32, [1, 8])
  digits = predicted_steps_ms(spec, cluster, profile, options)
  vgg = predicted_steps_ms(ModelConfig.named("vgg16"), cluster, profile, options)
  assert [r["num_devices"] for r in vgg] == [1, 8] and all(r["burst_ms"] > 0 for r in vgg)
  assert vgg[0]["data_parallel_ms"] > 100 * digits[0]["data_parallel_ms"]  # VGG16 at 224x224
  with pytest.raises(UserError, match="accuracy.step_time_models: unknown model 'nope'"):
    AccuracySettings(step_time_models=("nope",))
