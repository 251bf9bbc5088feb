"""The apps' training path: honest devices for a cap, background failures, merged processes."""

import json
import math

import jax
import pytest

from dp_jax.base.errors import UserError
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.orchestrator import jobs as training
from dp_jax.orchestrator.runners import DeviceRunner
from dp_jax.planner.contract import check_plan, layout_plan
from dp_jax.runtime.options import OptimizerConfig
from dp_jax.runtime.stages import structure_graph

TINY = ModelConfig.named("gpt2_small", n_layer=1, d_model=16, n_head=2, seq_len=8, vocab_size=32)


def test_a_cap_on_more_devices_than_cores_is_refused_naming_the_way_to_run_it_anyway():
  assert training.honest_processes(None, "same_family", cores=2) == 2
  assert training.honest_processes(1, "same_family", cores=2) == 1
  with pytest.raises(UserError) as e:
    training.honest_processes(4, "same_family", cores=2)
  msg = str(e.value)
  assert "\n" not in msg and "4 devices on 2 cores" in msg
  assert "runtime.num_devices<=2" in msg and "runtime.share_cores=true" in msg


def test_on_failure_takes_fail_or_continue_only():
  assert BackgroundConfig("same_family", on_failure="continue").on_failure == "continue"
  with pytest.raises(UserError, match="background.on_failure='maybe' is unknown .valid: fail, co"):
    BackgroundConfig("same_family", on_failure="maybe")


def test_a_multi_process_summary_keeps_process_0s_foreground_and_sums_the_background():
  p0 = {"final_step": 8, "measured_step_ms": 10.0, "background": "same_family",
        "background_steps": 0, "background_failures": 0, "background_pieces": 0,
        "background_refused": 0, "background_samples_per_s": 0.0, "background_errors": []}
  p1 = {**p0, "measured_step_ms": 99.0, "background_steps": 3, "background_pieces": 30,
        "background_samples_per_s": 6.0, "background_failures": 1, "background_errors": ["x"],
        "simulated_added_ms": 2.0, "simulated_alone_ms": 40.0,
        "simulated_background_samples_per_s": 5.0}
  out = training.merged([p0, p1])
  assert out["simulated_slowdown"] == 0.05 and out["simulated_background_samples_per_s"] == 5.0
  assert "simulated_added_ms" not in out
  assert training.merged([p0])["simulated_slowdown"] is None
  assert out["measured_step_ms"] == 10.0 and out["final_step"] == 8
  assert (out["background_steps"], out["background_pieces"], out["background_failures"],
          out["background_samples_per_s"], out["background_errors"]) == (3, 30, 1, 6.0, ["x"])


def spec(tmp_path, steps=6, **background):
  graph = structure_graph(TINY.build(), "gpt2_small")
  plan = layout_plan(graph, lambda n: [0, 1] if n in ("embed", "h.0") else [0], global_batch=4,
                     num_devices=2)
  job = BackgroundConfig(**{"name": "same_family", "batch_per_device": 2,
                          "slowdown_cap": math.inf, **background})
  return training.TrainSpec(model=TINY, plan=check_plan(plan, graph, available_devices=2),
                            steps=steps, output_dir=str(tmp_path), background=job,
                            optimizer=OptimizerConfig("adam", lr=0.02),
                            alone_steps=4, progress=False)


def test_a_spec_travels_to_pinned_processes_as_json_unchanged(tmp_path):
  """train_pinned writes the spec as JSON; each pinned process reads the same spec back."""
  sent = spec(tmp_path, on_failure="continue")
  received = training.TrainSpec.from_json(json.loads(json.dumps(sent.to_json())))
  assert received == sent and math.isinf(received.background.cap)
  assert received.optimizer.name == "adam" and received.plan.layers[0].devices == (0, 1)


@pytest.fixture
def dying_background(monkeypatch):
  """A background step dispatched beside the foreground raises (the profiling steps before
  the foreground starts, which pass no gate, run): a job that dies while the foreground runs."""
  real = DeviceRunner.step

  def step(self, gate=None, timer=None):
    if gate is not None:
      raise RuntimeError("background died")
    return real(self, gate, timer)

  monkeypatch.setattr(DeviceRunner, "step", step)


def test_a_background_job_that_dies_fails_the_run_after_the_foreground_kept_its_files(
    tmp_path, dying_background):
  summary = training.train_spec(spec(tmp_path), jax.devices()[:2])
  assert summary["final_step"] == 6 and (tmp_path / "metrics.jsonl").is_file()
  assert summary["background_failures"] >= 1
  with pytest.raises(training.BackgroundFailed) as e:
    training.check_background(summary)
  msg = str(e.value)
  assert "\n" not in msg and "RuntimeError: background died" in msg
  assert "background.on_failure=continue" in msg and "6 steps" in msg


@pytest.mark.slow  # the same dying job as above, where the default policy (fail) runs by default
def test_on_failure_continue_keeps_the_run_and_counts_the_failure(tmp_path, dying_background):
  summary = training.check_background(training.train_spec(
      spec(tmp_path, on_failure="continue"), jax.devices()[:2]))
  assert summary["final_step"] == 6 and summary["background_failures"] >= 1
