"""Every app's default config works out of the box for every model config of the zoo."""

import json

import pytest
from apps import REPO, run_app

MODELS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))


def sweep(app, tmp_path, *overrides):
  result = run_app(app, "-m", f"model={','.join(MODELS)}", "logger=disabled", *overrides,
                   cwd=tmp_path, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert f"{len(MODELS)} ok, 0 failed" in result.stdout
  return [json.loads((tmp_path / "sweep" / str(i) / "status.json").read_text())
          for i in range(len(MODELS))]


def test_simulate_and_its_planner_defaults_cover_every_model(tmp_path):
  """simulate's defaults: a100_nvlink_8, the A100 tables (rows they lack estimated), a burst
  plan, a background job."""
  cells = sweep("simulate", tmp_path)
  assert all(c["iteration_ms"] > 0 and c["data_parallel_iteration_ms"] > 0 for c in cells)


@pytest.mark.slow
@pytest.mark.parametrize("app", ["inspect", "plan"])  # profile: measures (slow on CPU)
def test_other_app_defaults_cover_every_model(tmp_path, app):
  sweep(app, tmp_path)
