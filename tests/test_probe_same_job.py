"""check_same_job on a run folder (in process): what a resume must keep, and when it applies."""

import json

import pytest

from dp_jax.base.errors import UserError
from dp_jax.runtime.train_loop import check_same_job, repair_metrics

CONFIG = {"model": {"name": "gpt2", "d_model": 32}, "optimizer": {"name": "adam", "lr": 0.01},
          "plan": "data_parallel", "seed": 0, "data": {"source": "synthetic", "seed": 0},
          "steps": 8, "logger": {"mode": "disabled"}}
PLAN = {"global_batch": 4, "layers": [{"name": "embed", "devices": [0, 1],
                                       "samples": [[0, 2], [2, 4]]}]}


def folder(tmp_path, trained=True):
  (tmp_path / "config.json").write_text(json.dumps(CONFIG))
  (tmp_path / "plan.json").write_text(json.dumps(PLAN))
  if trained:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
  return tmp_path


def test_the_same_job_with_more_steps_may_resume(tmp_path):
  check_same_job(folder(tmp_path), {**CONFIG, "steps": 20, "logger": {"mode": "wandb"}}, PLAN, 20)


@pytest.mark.parametrize("config, plan, steps, fragment", [
    ({**CONFIG, "optimizer": {"name": "adam", "lr": 0.5}}, PLAN, 8,
     "optimizer.lr (0.01 recorded, 0.5 now)"),
    ({**CONFIG, "model": {"name": "vgg16", "d_model": 32}}, PLAN, 8,
     "model.name ('gpt2' recorded, 'vgg16' now)"),
    (CONFIG, {**PLAN, "global_batch": 8}, 8, "batch_size (4 recorded, 8 now)"),
    (CONFIG, {**PLAN, "layers": [{**PLAN["layers"][0], "devices": [0]}]}, 8, "the plan's layers"),
    (CONFIG, PLAN, 4, "steps (8 recorded, 4 now: steps may only grow)"),
])
def test_another_job_is_refused_naming_what_differs(tmp_path, config, plan, steps, fragment):
  with pytest.raises(UserError) as e:
    check_same_job(folder(tmp_path), config, plan, steps)
  assert "holds another job" in str(e.value) and fragment in str(e.value)


def test_a_folder_with_nothing_trained_takes_any_job(tmp_path):
  check_same_job(folder(tmp_path, trained=False), {**CONFIG, "seed": 3}, PLAN, 8)


def test_a_cut_last_metrics_line_is_dropped_and_a_damaged_one_before_it_named(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
  repair_metrics(path, 2)
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
  path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
  with pytest.raises(UserError, match="line 2 is damaged"):
    repair_metrics(path, 3)
