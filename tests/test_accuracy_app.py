"""dp_jax/accuracy.py: the accuracy app's sweep settings, its planner call and its errors."""

import pytest
from apps import REPO, assert_one_line_error, run_app
from omegaconf import OmegaConf

from dp_jax.accuracy import AccuracySettings, sweep_of
from dp_jax.base.errors import UserError


def settings(**kw):
  return OmegaConf.merge(OmegaConf.structured(AccuracySettings), kw)


def test_the_lr_grid_follows_sqrt_b_and_the_budget_is_whole_evaluations():
  cfg = OmegaConf.create({"batch_size": 128, "accuracy": settings(lrs=[0.1, 0.2],
                                                                    max_epochs=1.0)})
  sweep = sweep_of(cfg, num_train=1000)
  assert sweep.lrs == pytest.approx((0.2, 0.4))  # sqrt(128 / 32) = 2
  assert sweep.eval_every == 1 and sweep.max_steps == 8  # ceil(1000 / 128)
  small = sweep_of(OmegaConf.create({"batch_size": 8, "accuracy": settings(max_epochs=1.0)}),
                   num_train=1000)
  assert small.eval_every == 16 and small.max_steps == 128  # 125 rounded up to 16s


@pytest.mark.parametrize("b,kw,match", [
    (0, {}, "batch_size must be >= 1"),
    (8, {"max_epochs": 0}, "must be positive"),
    (8, {"eval_every_samples": 0}, "must be positive"),
])
def test_bad_settings_are_user_errors(b, kw, match):
  with pytest.raises(UserError, match=match):
    sweep_of(OmegaConf.create({"batch_size": b, "accuracy": settings(**kw)}), num_train=100)


def test_the_app_rejects_a_model_that_is_not_a_digits_model(tmp_path):
  result = run_app("accuracy", "model=vgg16", "logger=disabled", cwd=tmp_path)
  assert_one_line_error(result, "model 'vgg16' is not a digits model")


@pytest.mark.parametrize("model", ["digits_cnn", "digits_mlp"])
def test_the_planner_prices_the_digits_models_like_any_zoo_model(model):
  from omegaconf import OmegaConf

  from dp_jax.accuracy import predicted_steps_ms

  conf = REPO / "conf"
  cfg = OmegaConf.create({
      "model": OmegaConf.load(conf / "model" / f"{model}.yaml"),
      "cluster": OmegaConf.load(conf / "cluster" / "dgx_a100.yaml"),
      "planner": OmegaConf.load(conf / "planner" / "burst.yaml"),
      "profile": OmegaConf.load(conf / "profile" / "analytic.yaml"),
      "batch_size": 16, "accuracy": {"devices": [1, 4, 16, 32]}})
  cfg.planner.amplification_limit = float("inf")
  rows = predicted_steps_ms(cfg)
  assert [r["num_devices"] for r in rows] == [1, 4, 16]  # G <= B
  assert rows[0]["data_parallel_ms"] == pytest.approx(rows[0]["burst_ms"])
  assert all(0 < r["burst_ms"] <= r["data_parallel_ms"] * (1 + 1e-9) for r in rows)
  assert rows[-1]["data_parallel_ms"] > rows[0]["data_parallel_ms"]  # all-reduce across nodes


def test_a_device_count_without_a_plan_is_recorded_not_raised():
  from dp_jax.accuracy import predicted_steps_ms

  conf = REPO / "conf"
  cfg = OmegaConf.create({
      "model": {"name": "vgg16"}, "cluster": OmegaConf.load(conf / "cluster" / "dgx_a100.yaml"),
      "planner": OmegaConf.load(conf / "planner" / "burst.yaml"),
      "profile": OmegaConf.load(conf / "profile" / "analytic.yaml"),
      "batch_size": 2048, "accuracy": {"devices": [1, 64]}})
  first, last = predicted_steps_ms(cfg)
  assert first["burst_ms"] is None and "40 GB" in first["infeasible"]  # 2048 images on one A100
  assert last["burst_ms"] > 0


def test_what_if_step_times_price_the_named_zoo_model_not_the_trained_one():
  from dp_jax.accuracy import predicted_steps_ms, zoo_model

  conf = REPO / "conf"
  cfg = OmegaConf.create({
      "model": OmegaConf.load(conf / "model" / "digits_mlp.yaml"),
      "cluster": OmegaConf.load(conf / "cluster" / "dgx_a100.yaml"),
      "planner": OmegaConf.load(conf / "planner" / "burst.yaml"),
      "profile": OmegaConf.load(conf / "profile" / "analytic.yaml"),
      "batch_size": 32, "accuracy": {"devices": [1, 8]}})
  digits = predicted_steps_ms(cfg)
  vgg = predicted_steps_ms(cfg, zoo_model("vgg16"))
  assert [r["num_devices"] for r in vgg] == [1, 8] and all(r["burst_ms"] > 0 for r in vgg)
  assert vgg[0]["data_parallel_ms"] > 100 * digits[0]["data_parallel_ms"]  # VGG16 at 224x224
  with pytest.raises(UserError, match="unknown model 'nope'"):
    zoo_model("nope")
