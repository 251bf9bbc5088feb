"""Run a dp_jax Hydra app in a subprocess, as a user would, or its task in this process; read
what it wrote."""

import fcntl
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dp_jax.runtime.local_devices import other_xla_flags

REPO = Path(__file__).resolve().parents[1]


def run_app(app: str, *overrides: str, cwd: Path, timeout: int = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
  """`python -W error -m dp_jax.<app> overrides...` with offline W&B; output folders under cwd."""
  full_env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
              "WANDB_DIR": str(cwd), "PYTHONPATH": str(REPO), **(env or {})}
  full_env["XLA_FLAGS"] = other_xla_flags()  # the apps set their devices
  return subprocess.run([sys.executable, "-W", "error", "-m", f"dp_jax.{app}", *overrides,
                         f"hydra.run.dir={cwd}/run", f"hydra.sweep.dir={cwd}/sweep"],
                        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def run_task(app: str, *overrides: str, cwd: Path) -> dict[str, Any]:
  """The app's task in this process, as `python -m dp_jax.<app> overrides...` runs it into
  cwd/run: the config composed and checked (every key known, every option), a tracking Run
  writing that folder; returns the task's summary with "status": "ok" (as status.json holds it).

  Without Hydra's job wrapper (one-line errors, status.json, the folder's lock, W&B's end): for
  tests of what a task does with its inputs; each app's wrapper runs in its run_app tests. An
  error is raised as the task raised it (see task_error)."""
  from dp_jax.cli.hydra_app import compose_config
  from dp_jax.cli.schema import check_known_keys, typed
  from dp_jax.tracking import run as tracking

  main = importlib.import_module(f"dp_jax.{app}").main
  cfg = compose_config(main.config_name, main.schema, list(overrides))
  check_known_keys(cfg, main.schema)
  run = tracking.start(cfg, app=app, output_dir=Path(cwd) / "run")
  try:
    summary = {"status": "ok", **(main.__wrapped__(typed(cfg, main.schema), run) or {})}
  except BaseException:
    run.finish(exit_code=1)
    raise
  run.begin()
  run.summary(summary)
  run.finish()
  return summary


def task_error(app: str, *overrides: str, cwd: Path) -> str:
  """The one line (after 'error: ') the app prints for `overrides`: its task run in this
  process (run_task) must refuse them with a UserError (a config error is one too)."""
  import pytest

  from dp_jax.base.errors import UserError
  from dp_jax.cli.hydra_app import one_line

  with pytest.raises(UserError) as refused:
    run_task(app, *overrides, cwd=cwd)
  return one_line(refused.value)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
  """The app failed with exactly one 'error: ...' line on stderr and no traceback."""
  assert result.returncode != 0, result.stdout + result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
  errors = [ln for ln in lines if ln.startswith("error: ")]
  assert len(errors) == 1 and len(lines) == 1, result.stderr
  for f in fragments:
    assert f in errors[0], errors[0]
  return errors[0]


def digest(folder: Path) -> str:
  """A hash of every file's relative path and bytes under `folder`."""
  h = hashlib.sha256()
  for f in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
    h.update(str(f.relative_to(folder)).encode() + f.read_bytes())
  return h.hexdigest()


def once_per_session(name: str, make: Callable[[Path], None]) -> Path:
  """The folder `make(folder)` filled, made once for the whole test session: the first worker
  to ask makes it (the others wait for it), every later test reads the same folder. For an
  expensive run several tests (on any xdist worker) only read; a test that changes it copies
  it first."""
  root = Path(os.environ["DP_JAX_TEST_SESSION_DIR"]) / "once"  # conftest.py
  root.mkdir(exist_ok=True)
  folder, done = root / name, root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      make(folder)
      done.touch()
  return folder
