"""Run a dp_jax Hydra app in a subprocess, as a user would, and read what it wrote."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_app(app: str, *overrides: str, cwd: Path, timeout: int = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
  """`python -W error -m dp_jax.<app> overrides...` with offline W&B; output folders under cwd."""
  full_env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
              "WANDB_DIR": str(cwd), "PYTHONPATH": str(REPO), **(env or {})}
  full_env.pop("XLA_FLAGS", None)  # apps configure their own devices
  return subprocess.run([sys.executable, "-W", "error", "-m", f"dp_jax.{app}", *overrides,
                         f"hydra.run.dir={cwd}/run", f"hydra.sweep.dir={cwd}/sweep"],
                        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


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
