"""python -m dp_jax.train as a user runs it: SIGKILL + resume, outputs, one-line bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from apps import REPO, assert_one_line_error, digest, once_per_session, run_app, task_error

from dp_jax.runtime.local_devices import other_xla_flags

TINY = ["model=gpt2", "model.n_layer=2", "model.d_model=32", "model.n_head=2",
        "model.seq_len=16", "model.vocab_size=64", "runtime.num_devices=8",
        "logger=disabled", "runtime.progress=false", "optimizer.name=adam",
        "optimizer.lr=0.01"]
STEPS = ["steps=8", "runtime.checkpoint_every=2"]  # plan files give the batch size (8)


@pytest.fixture(scope="module")
def finished():
  """An uninterrupted 8-step run under a burst plan file (its folder), one for the session."""

  def train(cwd):
    plan = burst_plan_file(cwd)
    result = run_app("train", *TINY, *STEPS, f"plan={plan}", cwd=cwd)
    assert result.returncode == 0, result.stderr

  return once_per_session("train_app_finished", train) / "run"


def burst_plan_file(folder) -> str:
  from dp_jax.graph.layer_graph import LayerGraph, LayerNode
  from dp_jax.planner.contract import layout_plan

  names = ["embed", "h.0", "h.1", "ln_f", "lm_head"]
  graph = LayerGraph("gpt2_small", (16,), "int32", tuple(
      LayerNode(n, "x", (names[i - 1],) if i else ()) for i, n in enumerate(names)))
  layout = {"embed": range(4), "h.0": range(8), "h.1": [4, 5], "ln_f": [4, 5], "lm_head": [6, 7]}
  path = folder / "burst.json"
  path.write_text(json.dumps(layout_plan(graph, layout, global_batch=8, num_devices=8)))
  return str(path)


def final_state(run_dir, step=8):
  import orbax.checkpoint as ocp

  return ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(step) / "default")


def metrics(run_dir, key):
  return [json.loads(x)[key] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_finished_run_writes_its_outputs(finished):
  status = json.loads((finished / "status.json").read_text())
  assert status["status"] == "ok" and status["final_step"] == 8 and status["stages"] == 4
  assert status["processes"] == 1 and status["cpu_cores"] == len(os.sched_getaffinity(0))
  assert metrics(finished, "step") == list(range(1, 9))
  assert json.loads((finished / "timeline.json").read_text())["source"] == "measured"
  assert (finished / "gantt.png").stat().st_size > 0
  assert len(json.loads((finished / "plan.json").read_text())["layers"]) == 5


@pytest.mark.slow  # an app killed mid-run; test_runtime_train_loop resumes in-process
def test_sigkilled_run_resumes_to_the_same_parameters(tmp_path, finished):
  plan = burst_plan_file(tmp_path)
  env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
         "PYTHONPATH": str(REPO), "DP_JAX_STEP_SLEEP_S": "1"}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  cmd = [sys.executable, "-m", "dp_jax.train", *TINY, *STEPS, f"plan={plan}",
         f"hydra.run.dir={tmp_path}/run"]
  proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
  ckpt = tmp_path / "run" / "checkpoints"
  try:
    deadline = time.time() + 240
    while not (ckpt / "4").is_dir():
      assert proc.poll() is None, proc.stderr.read().decode()
      assert time.time() < deadline, "no checkpoint at step 4"
      time.sleep(0.1)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert max(metrics(tmp_path / "run", "step")) < 8, "killed before its end"
  result = run_app("train", *TINY, *STEPS, f"plan={plan}", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert 4 <= status["resumed_from_step"] < 8 and status["final_step"] == 8
  for a, b in zip(jax.tree.leaves(final_state(tmp_path / "run")),
                  jax.tree.leaves(final_state(finished)), strict=True):
    np.testing.assert_array_equal(a, b)
  assert metrics(tmp_path / "run", "loss") == metrics(finished, "loss")


def bad_layers_plan(folder) -> list[str]:
  p = json.loads(open(burst_plan_file(folder)).read())
  p["layers"][2]["name"] = "h.7"
  (folder / "bad.json").write_text(json.dumps(p))
  return [f"plan={folder / 'bad.json'}"]


def sixteen_device_plan(folder) -> list[str]:
  p = json.loads(open(burst_plan_file(folder)).read())
  p["num_devices"] = 16
  p["layers"][1]["devices"] = list(range(8, 16))
  (folder / "big.json").write_text(json.dumps(p))
  return [f"plan={folder / 'big.json'}"]


@pytest.mark.parametrize("args, fragments", [
    (bad_layers_plan, ["plan layers do not match model gpt2_small", "unknown: h.7"]),
    (sixteen_device_plan, ["plan needs 16 devices but only 8 are available"]),
    (lambda _: ["plan=data_parallel", "batch_size=12"],
     ["layer 'embed' splits global batch 12 over 8 devices"]),
    (lambda _: ["plan=nowhere.json"], ["plan='nowhere.json' is neither burst nor data_parallel"]),
    (lambda _: ["plan=data_parallel", "batch_size=0"], ["batch_size=0 must be >= 1"]),
    (lambda _: ["plan=data_parallel", "batch_size=8", "optimizer.lr=nan"],
     ["optimizer.lr=nan must be a finite number"]),
    (lambda _: ["plan=data_parallel", "batch_size=8", "steps=-1"], ["steps=-1 must be >= 0"]),
    (lambda _: ["plan=data_parallel", "batch_size=8", "model.d_model=48"],
     ["holds another job", "model.d_model (32 recorded, 48 now)"]),
])
def test_bad_input_is_one_line_and_leaves_the_run_folder_byte_identical(tmp_path, finished, args,
                                                                        fragments):
  """The task refuses before it writes (in this process: the wrapper that prints the line is
  run by the test below)."""
  shutil.copytree(finished, tmp_path / "run")
  before = digest(tmp_path / "run")
  overrides = [a for a in TINY + STEPS if a.split("=")[0] not in {x.split("=")[0]
                                                                    for x in args(tmp_path)}]
  error = task_error("train", *overrides, *args(tmp_path), cwd=tmp_path)
  assert "\n" not in error and all(f in error for f in fragments), error
  assert digest(tmp_path / "run") == before


def test_another_model_in_a_finished_run_folder_is_refused_without_a_trace(tmp_path, finished):
  shutil.copytree(finished, tmp_path / "run")
  before = digest(tmp_path / "run")
  result = run_app("train", "model=vgg16", "model.image_size=32", "runtime.num_devices=8",
                   "batch_size=8", "steps=1", "logger=disabled", "runtime.progress=false",
                   cwd=tmp_path)
  assert_one_line_error(result, "holds another job",
                        "model.name ('gpt2_small' recorded, 'vgg16' now)")
  assert digest(tmp_path / "run") == before


def test_a_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
  tiny = [a for a in TINY if not a.startswith(("optimizer.", "model.d_model"))]
  result = run_app("train", *tiny, "model.d_model=32", "optimizer.name=sgd", "optimizer.lr=1e12",
                   "plan=data_parallel", "batch_size=8", "steps=6", "runtime.checkpoint_every=1",
                   cwd=tmp_path)
  error = assert_one_line_error(result, "training stopped", "lower optimizer.lr")
  status = json.loads((tmp_path / "run" / "status.json").read_text(),
                      parse_constant=lambda c: pytest.fail(f"status.json holds {c}"))
  assert status["status"] == "failed" and status["error"] == error[len("error: "):]
  bad_step = int(error.split(" at step ")[1].split(":")[0])
  kept = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                if p.name.isdigit())
  assert kept and max(kept) == bad_step - 1
  lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == bad_step - 1  # no metrics line for the bad step


def test_importing_the_app_leaves_jax_unloaded():
  """The app must set XLA_FLAGS (host device count) before JAX starts."""
  code = "import sys, dp_jax.train; assert 'jax' not in sys.modules, 'jax imported'"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
  assert result.returncode == 0, result.stderr


def test_host_device_count_flag_is_replaced_not_duplicated(monkeypatch):
  from dp_jax.runtime.local_devices import set_host_device_count

  monkeypatch.setenv("XLA_FLAGS", "--foo=1 --xla_force_host_platform_device_count=2")
  set_host_device_count(8)
  assert os.environ["XLA_FLAGS"] == "--foo=1 --xla_force_host_platform_device_count=8"


def test_burst_plan_is_made_for_the_local_devices(tmp_path):
  # no runtime.num_devices: the cluster's G (local_cpu: 8 host devices), not JAX's one
  default_devices = [a for a in TINY if not a.startswith("runtime.num_devices=")]
  result = run_app("train", *default_devices, "batch_size=8", "plan=burst", "steps=0",
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  plan = json.loads((tmp_path / "run" / "plan.json").read_text())
  assert plan["num_devices"] == 8 and plan["global_batch"] == 8
  one_stage = len(plan["stages"]) == 1
  assert ("the burst plan is one stage on all 8 devices" in result.stdout) == one_stage
  assert [x["name"] for x in plan["layers"]] == ["embed", "h.0", "h.1", "ln_f", "lm_head"]
  assert plan["made_for"]["input_shape"] == [16] and plan["made_for"]["layers"] == 5
  # the same plan for a longer sequence is refused, naming both configs (the task, in this
  # process: the wrapper's one line is the bad-input tests')
  longer = [a.replace("model.seq_len=16", "model.seq_len=32") for a in TINY]
  error = task_error("train", *longer, f"plan={tmp_path / 'run' / 'plan.json'}", "steps=0",
                     cwd=tmp_path / "other")
  assert "was made for gpt2_small (input 16, 5 layers" in error, error
  assert "not gpt2_small (input 32, 5 layers" in error, error


def test_a_burst_plan_of_one_stage_says_so():
  from dp_jax.graph.layer_graph import LayerGraph, LayerNode
  from dp_jax.planner.contract import check_plan, data_parallel_layout_plan, layout_plan
  from dp_jax.train import one_stage_note

  graph = LayerGraph("chain", (4,), "float32", tuple(
      LayerNode(n, "x", (p,) if p else ()) for n, p in (("a", None), ("b", "a"))))
  dp = check_plan(data_parallel_layout_plan(graph, global_batch=8, num_devices=4), graph,
                  available_devices=4)
  assert "one stage on all 4 devices, i.e. data parallelism" in one_stage_note("burst", dp)
  assert one_stage_note("data_parallel", dp) is None  # asked for: nothing to say
  one = check_plan(data_parallel_layout_plan(graph, global_batch=8, num_devices=1), graph,
                   available_devices=1)
  assert "set runtime.num_devices" in one_stage_note("burst", one)
  two = check_plan(layout_plan(graph, {"a": range(4), "b": range(2)}, global_batch=8,
                               num_devices=4), graph, available_devices=4)
  assert len(two.stages) == 2 and one_stage_note("burst", two) is None
