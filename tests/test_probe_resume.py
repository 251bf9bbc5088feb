"""Probe rows of issue 27 on train's run folder: a resume is the same job, a cut metrics line or
a damaged checkpoint does not make a run unresumable, a full disk is one line, one run per folder,
and (slow) a run killed at random moments resumes to the uninterrupted result."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from apps import REPO, assert_one_line_error, digest, run_app

from dp_jax.runtime.local_devices import other_xla_flags

TINY = ["model=gpt2", "model.n_layer=2", "model.d_model=32", "model.n_head=2",
        "model.seq_len=16", "model.vocab_size=64", "runtime.num_devices=2", "logger=disabled",
        "runtime.progress=false", "optimizer.name=adam", "optimizer.lr=0.01",
        "plan=data_parallel", "batch_size=4", "runtime.checkpoint_every=2"]
STEPS = 8


def env_with(cache, **extra):
  env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(REPO),
         **cache, **extra}
  env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  return env


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  d = tmp_path_factory.mktemp("jax_cache")
  return {"JAX_COMPILATION_CACHE_DIR": str(d), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache):
  """An uninterrupted 8-step run (checkpoints at 6 and 8 kept)."""
  cwd = tmp_path_factory.mktemp("finished")
  result = run_app("train", *TINY, f"steps={STEPS}", cwd=cwd, env=cache)
  assert result.returncode == 0, result.stderr
  return cwd / "run"


def params(run_dir, step=STEPS):
  import orbax.checkpoint as ocp

  return ocp.StandardCheckpointer().restore(run_dir / "checkpoints" / str(step) / "default")


def losses(run_dir):
  lines = (run_dir / "metrics.jsonl").read_text().splitlines()
  return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def assert_same_result(run_dir, finished):
  assert losses(run_dir) == losses(finished)
  for a, b in zip(jax.tree.leaves(params(run_dir)), jax.tree.leaves(params(finished)),
                  strict=True):
    np.testing.assert_array_equal(a, b)


def copy_of(finished, tmp_path):
  shutil.copytree(finished, tmp_path / "run")
  return tmp_path / "run"


@pytest.mark.parametrize("changed, fragment", [
    (["optimizer.lr=0.5", "steps=10"], "optimizer.lr (0.01 recorded, 0.5 now)"),
    pytest.param(["batch_size=8", "steps=10"], "batch_size (4 recorded, 8 now)",
                 marks=pytest.mark.slow),  # each key also in test_probe_same_job (fast)
    pytest.param(["seed=1"], "seed (0 recorded, 1 now)", marks=pytest.mark.slow),
    pytest.param(["data.seed=5"], "data.seed (0 recorded, 5 now)", marks=pytest.mark.slow),
    (["steps=6"], "steps (8 recorded, 6 now: steps may only grow)"),
])
def test_a_resume_with_other_settings_is_refused_and_the_folder_kept(tmp_path, finished, cache,
                                                                     changed, fragment):
  run_dir = copy_of(finished, tmp_path)
  before = digest(run_dir)
  keys = {c.split("=")[0] for c in changed}
  args = [a for a in TINY if a.split("=")[0] not in keys]
  result = run_app("train", *args, *changed, cwd=tmp_path, env=cache)
  assert_one_line_error(result, "holds another job", fragment)
  assert digest(run_dir) == before


@pytest.mark.slow
def test_only_steps_may_grow(tmp_path, finished, cache):
  run_dir = copy_of(finished, tmp_path)
  result = run_app("train", *TINY, "steps=10", cwd=tmp_path, env=cache)
  assert result.returncode == 0, result.stderr
  status = json.loads((run_dir / "status.json").read_text())
  assert status["resumed_from_step"] == STEPS and status["final_step"] == 10
  assert [s for s, _ in losses(run_dir)] == list(range(1, 11))


@pytest.mark.slow  # a resume after a kill (~10 s), beside the 20-kill test (slow)
def test_a_metrics_line_cut_by_a_kill_is_dropped_and_its_steps_replayed(tmp_path, finished,
                                                                        cache):
  run_dir = copy_of(finished, tmp_path)
  shutil.rmtree(run_dir / "checkpoints" / str(STEPS))  # killed after step 7's save... of 6
  kept = (run_dir / "metrics.jsonl").read_text().splitlines()[:6]
  (run_dir / "metrics.jsonl").write_text("\n".join(kept) + '\n{"step": 7, "lo')
  result = run_app("train", *TINY, f"steps={STEPS}", cwd=tmp_path, env=cache)
  assert result.returncode == 0, result.stderr
  assert json.loads((run_dir / "status.json").read_text())["resumed_from_step"] == 6
  assert_same_result(run_dir, finished)


def _damage(step_dir):
  manifest = step_dir / "default" / "manifest.ocdbt"
  manifest.write_bytes(manifest.read_bytes()[:10])


@pytest.mark.slow  # the bit-flip case below names the file and uses the one before (fast)
def test_a_damaged_checkpoint_is_named_and_the_one_before_used(tmp_path, finished, cache):
  run_dir = copy_of(finished, tmp_path)
  _damage(run_dir / "checkpoints" / str(STEPS))
  result = run_app("train", *TINY, f"steps={STEPS}", cwd=tmp_path, env=cache)
  assert result.returncode == 0, result.stderr
  said = result.stdout + result.stderr
  assert f"checkpoint step {STEPS} in" in said and "is damaged" in said, said
  assert "Traceback" not in said, said
  assert json.loads((run_dir / "status.json").read_text())["resumed_from_step"] == 6
  assert (run_dir / "checkpoints.damaged" / str(STEPS)).is_dir(), "the damaged one is kept"
  assert_same_result(run_dir, finished)


def _flip_a_bit(step_dir):
  data = max((step_dir / "default").glob("ocdbt.process_*/d/*"), key=lambda f: f.stat().st_size)
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  data.write_bytes(bytes(raw))


def _copy_6_over_8(step_dir):
  shutil.rmtree(step_dir)
  shutil.copytree(step_dir.parent / "6", step_dir)


def _remove_its_arrays(step_dir):
  shutil.rmtree(step_dir / "default")


@pytest.mark.parametrize("damage, named", [
    (_flip_a_bit, "differs from what was saved (checksum mismatch)"),
    # in process, fast: tests/test_checkpoint_damage.py
    pytest.param(_copy_6_over_8, "holds the checkpoint of step 6, not 8", marks=pytest.mark.slow),
    pytest.param(_remove_its_arrays, "default: missing", marks=pytest.mark.slow),
])
def test_damage_orbax_does_not_see_is_found_and_the_good_checkpoint_used(tmp_path, finished,
                                                                         cache, damage, named):
  """Issue 41: a flipped bit, another step's folder and a missing item all resumed silently
  (or made every checkpoint read as damaged); each is named and step 6 resumes exactly."""
  run_dir = copy_of(finished, tmp_path)
  damage(run_dir / "checkpoints" / str(STEPS))
  result = run_app("train", *TINY, f"steps={STEPS}", cwd=tmp_path, env=cache)
  assert result.returncode == 0, result.stderr
  said = result.stdout + result.stderr
  assert f"checkpoint step {STEPS} in" in said and named in said, said
  assert json.loads((run_dir / "status.json").read_text())["resumed_from_step"] == 6
  assert_same_result(run_dir, finished)


def test_a_resume_that_would_lose_its_metrics_history_is_refused(tmp_path, finished, cache):
  run_dir = copy_of(finished, tmp_path)
  (run_dir / "metrics.jsonl").unlink()
  before = digest(run_dir)
  result = run_app("train", *TINY, f"steps={STEPS + 2}", cwd=tmp_path, env=cache)
  assert_one_line_error(result, "metrics.jsonl is missing", "resumes from checkpoint step 8",
                        "put the file back")
  assert digest(run_dir) == before


def test_every_checkpoint_damaged_is_one_line_and_the_folder_kept(tmp_path, finished, cache):
  run_dir = copy_of(finished, tmp_path)
  for step in (6, STEPS):
    _damage(run_dir / "checkpoints" / str(step))
  before = digest(run_dir)
  result = run_app("train", *TINY, f"steps={STEPS + 2}", cwd=tmp_path, env=cache)
  assert_one_line_error(result, "every checkpoint in", "is damaged", "step 8:", "step 6:")
  assert digest(run_dir) == before


def test_a_full_disk_is_one_line_naming_the_file_and_keeps_the_checkpoints(tmp_path, cache):
  cmd = [sys.executable, str(REPO / "tests" / "full_disk.py"), "train", *TINY, f"steps={STEPS}",
         f"hydra.run.dir={tmp_path}/run"]
  result = subprocess.run(cmd, cwd=tmp_path, env=env_with(cache, FULL_DISK_AFTER_LINES="5"),
                          capture_output=True, text=True, timeout=300)
  line = assert_one_line_error(result, "could not write", "metrics.jsonl",
                               "No space left on device")
  assert str(tmp_path / "run" / "metrics.jsonl") in line and "disk full: " in line
  # the status says so too: written in place over the bytes reserved at the start
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["status"] == "failed" and status["error"].startswith("disk full: could not"), (
      status)
  kept = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                if p.name.isdigit())
  assert kept == [2, 4], kept
  assert [s for s, _ in losses(tmp_path / "run")] == [1, 2, 3, 4, 5]


@pytest.mark.slow  # ~10 s; a sweep folder in use: test_probe_sweeps (fast)
def test_a_second_run_into_a_folder_in_use_is_refused_without_touching_it(tmp_path, cache):
  args = [a for a in TINY if a != "logger=disabled"] + ["logger=wandb", f"steps={STEPS}",
                                                        f"hydra.run.dir={tmp_path}/run"]
  env = env_with(cache, WANDB_DIR=str(tmp_path), DP_JAX_STEP_SLEEP_S="0.5")
  first = subprocess.Popen([sys.executable, "-m", "dp_jax.train", *args], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  metrics = tmp_path / "run" / "metrics.jsonl"
  deadline = time.time() + 240
  while not (metrics.exists() and metrics.read_text()):
    assert first.poll() is None, first.stderr.read().decode()
    assert time.time() < deadline
    time.sleep(0.1)
  second = subprocess.run([sys.executable, "-m", "dp_jax.train", *args], cwd=tmp_path,
                          env={**env, "DP_JAX_STEP_SLEEP_S": "0"}, capture_output=True,
                          text=True, timeout=300)
  running = first.poll() is None
  assert first.wait(timeout=300) == 0, first.stderr.read().decode()
  assert running, "the first run ended before the second started: no overlap was tested"
  assert_one_line_error(second, "is in use by another run")
  assert [s for s, _ in losses(tmp_path / "run")] == list(range(1, STEPS + 1))
  runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
  assert len(runs) == 1, runs


@pytest.mark.slow
def test_a_run_killed_20_times_at_random_moments_resumes_to_the_same_result(tmp_path, finished,
                                                                             cache):
  """SIGKILL at random moments, and at the worst ones (halfway through a metrics line, with a
  checkpoint save in flight), 20 times in a row; then the run ends as the uninterrupted one."""
  rng = random.Random(0)
  args = [*TINY, f"steps={STEPS}", f"hydra.run.dir={tmp_path}/run"]
  hooks = [f"metrics:{s}" for s in (3, 5, 7)] + [f"checkpoint:{s}" for s in (2, 4, 6)]
  kills = 0
  while kills < 20:
    extra = {"DP_JAX_STEP_SLEEP_S": "0.05"}
    if kills % 3 == 0:
      extra["DP_JAX_DIE_AT"] = hooks[(kills // 3) % len(hooks)]
    proc = subprocess.Popen([sys.executable, "-m", "dp_jax.train", *args], cwd=tmp_path,
                            env=env_with(cache, **extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    if "DP_JAX_DIE_AT" not in extra:
      try:
        proc.wait(timeout=rng.uniform(2.0, 14.0))
      except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    code = proc.wait(timeout=300)
    if code == 0:  # finished before the kill: start the job over to keep killing it
      shutil.rmtree(tmp_path / "run")
      continue
    assert code == -signal.SIGKILL, proc.stderr.read().decode()
    kills += 1
  result = run_app("train", *TINY, f"steps={STEPS}", cwd=tmp_path, env=cache)
  assert result.returncode == 0, result.stderr
  assert_same_result(tmp_path / "run", finished)
