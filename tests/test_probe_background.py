"""Probe rows of issue 41 on background jobs that do nothing (in process, fast): refused up
front beside a plan with no idle device; a run whose job ran no piece fails saying why (the
train app and the main job alike)."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.main_job.summary import background_failure, trained_quantities
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.orchestrator.jobs import BackgroundFailed, TrainSpec, check_background
from dp_jax.planner.contract import Plan

BG = BackgroundConfig(name="same_family", batch_per_device=2)


def plan_on(layout):
  from dp_jax.graph.layer_graph import LayerGraph, LayerNode
  from dp_jax.planner.contract import layout_plan

  graph = LayerGraph("m", (4,), "float32", tuple(
      LayerNode(n, "x", (list(layout)[i - 1],) if i else ()) for i, n in enumerate(layout)))
  return Plan.from_json(layout_plan(graph, layout, global_batch=4, num_devices=2), "plan",
                        planned=False)


def test_a_background_job_beside_a_plan_with_no_idle_device_is_refused():
  model = ModelConfig.named("digits_mlp")
  with pytest.raises(UserError, match="the plan leaves no device idle"):
    TrainSpec(model=model, plan=plan_on({"a": [0, 1], "b": [0, 1]}), steps=8, output_dir=".",
              background=BG)
  TrainSpec(model=model, plan=plan_on({"a": [0, 1], "b": [0]}), steps=8, output_dir=".",
            background=BG)  # device 1 idles in b
  TrainSpec(model=model, plan=plan_on({"a": [0, 1], "b": [0, 1]}), steps=8, output_dir=".")


def ran_nothing(**more):
  return {"background": "same_family", "background_steps": 0, "background_pieces": 0,
          "background_refused": 12, "background_failures": 0, "background_on_failure": "fail",
          "background_slowdown_cap": 0.1, "final_step": 40, **more}


def test_a_job_that_ran_no_piece_fails_the_run_naming_the_cause():
  with pytest.raises(BackgroundFailed) as e:
    check_background(ran_nothing())
  assert str(e.value).startswith(
      "background job same_family ran no piece: each of the 12 pieces it offered was refused "
      "under the 10% slowdown cap")
  assert check_background(ran_nothing(background_on_failure="continue"))["final_step"] == 40
  assert check_background(ran_nothing(background_pieces=5, background_steps=1))
  with pytest.raises(BackgroundFailed, match="no idle window of the plan opened for it"):
    check_background(ran_nothing(background_refused=0))
  # steps=3 left every step to the foreground alone: a NaN background model 'trained' to exit 0
  with pytest.raises(BackgroundFailed, match=r"the run's 3 step\(s\) all ran the foreground "
                                             r"alone \(its first 3 measure it"):
    check_background(ran_nothing(final_step=3, alone_steps=3, background_refused=0))


def test_the_main_job_names_the_cause_too():
  trained = {k: v for k, v in ran_nothing().items() if k.startswith("background_")}
  said = background_failure(BG, trained_quantities(trained, BG.cap))
  assert "ran no step beside the plan: each of the 12 pieces it offered was refused under the " \
         "10% slowdown cap" in said
