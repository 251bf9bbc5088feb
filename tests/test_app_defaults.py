"""Every app's default config works out of the box for every model config of the zoo."""

import json

import pytest
from apps import REPO, run_app

MODELS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))


# The default suite's share: a model the A100 tables cover in part (resnet50), ones they do not
# cover at all (gpt2, digits_mlp), and gpt2_medium, whose background job does not fit.
QUICK = ["resnet50", "gpt2", "digits_mlp", "gpt2_medium"]
# Published shapes that no plan fits on the default 8 A100s of 40 GB with the default options
# (samples split only, B = 32 sequences of thousands of tokens): refused with the memory error,
# which names the options and the memory that could fit them.
TOO_LARGE = ["deepseek_moe_16b", "llama3_70b", "llama3_8b", "llava_1_5_7b", "mixtral_8x7b"]


def refused_for_memory(cells, models):
  for m in models:
    error = cells[m]["error"]
    assert "fits in 40 GB per device" in error and "planner.recompute=choose" in error, error


def sweep(app, tmp_path, *overrides, models=MODELS, failing=()):
  result = run_app(app, "-m", f"model={','.join(models)}", "logger=disabled", *overrides,
                   cwd=tmp_path, timeout=900)
  assert (result.returncode == 0) == (not failing), result.stdout[-3000:] + result.stderr
  assert f"{len(models) - len(failing)} ok, {len(failing)} failed" in result.stdout
  return {m: json.loads((tmp_path / "sweep" / str(i) / "status.json").read_text())
          for i, m in enumerate(models)}


@pytest.mark.parametrize("models", [QUICK, pytest.param(MODELS, marks=pytest.mark.slow)])
def test_simulate_and_its_planner_defaults_cover_every_model(tmp_path, models):
  """simulate's defaults: a100_nvlink_8, the A100 tables (rows they lack estimated), a burst
  plan, a background job of the same model at batch 8 beside it. GPT-2 medium's background
  job (30.1 GB at batch 8 x 1024 tokens with momentum SGD, mostly saved activations) fits
  beside no foreground on a 40 GB A100: that cell is refused with the memory error, and plans
  without it."""
  large = [m for m in TOO_LARGE if m in models]
  cells = sweep("simulate", tmp_path, models=models, failing=["gpt2_medium", *large])
  assert "needs 30.11 GB per device" in cells["gpt2_medium"]["error"]
  refused_for_memory(cells, large)
  assert all(c["iteration_ms"] > 0 and c["data_parallel_iteration_ms"] > 0
             for m, c in cells.items() if m != "gpt2_medium" and m not in large)
  alone = run_app("simulate", "model=gpt2_medium", "background=none", "logger=disabled",
                  cwd=tmp_path, timeout=600)
  assert alone.returncode == 0, alone.stderr


@pytest.mark.slow
@pytest.mark.parametrize("app", ["inspect", "plan"])  # profile: measures (slow on CPU)
def test_other_app_defaults_cover_every_model(tmp_path, app):
  failing = TOO_LARGE if app == "plan" else ()
  cells = sweep(app, tmp_path, failing=failing)
  refused_for_memory(cells, failing)
