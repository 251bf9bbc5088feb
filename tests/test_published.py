"""The GPU model against published measurements: the anchors table, the calibrated profile's fit,
the held-out error and the GPU tolerance taken from it (dp_jax/validation/published.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.profiling.calibrated import CALIBRATION, calibrated_profile
from dp_jax.validation.published import (
  ANCHORS_FILE,
  fit_calibration,
  load_anchors,
  load_published,
  predict,
  results,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
  return results()


def test_every_row_is_cited_and_the_split_is_stated():
  table = load_published()
  for a in table.rows:
    assert a.source and a.hardware and a.measured > 0 and a.why, a.id
  roles = {a.role for a in table.rows}
  assert roles == {"fit", "held_out", "not_modelled"}
  # the anchors: DeepLearningExamples ResNet-50 on 1 and 8 A100, Megatron-LM on A100 and
  # H100, DeepPool's own iteration time
  ids = " ".join(a.id for a in table.rows)
  for part in ("rn50_a100_1gpu", "rn50_a100_8gpu", "megatron_2021_gpt_1p7b_32gpu",
               "megatron_core_2024", "deeppool_readme"):
    assert part in ids, part
  # the three relative checks, every held-out entry in a group of (model, hardware, table)
  assert len(table.scaling) >= 20 and len(table.allreduce) >= 10 and len(table.small_batch) >= 4
  assert {p.regime for p in table.scaling} == {"small", "large"}
  curves = [c for c in table.allreduce if c.role == "held_out"]
  assert any(min(b for b, _ in c.points) <= 2**20 for c in curves)  # from 1 MiB up


def test_a_fit_benchmark_at_another_scale_counts_only_in_the_scaling_check():
  table = load_published()
  fit = [a for a in table.rows if a.role == "fit"]

  def benchmark_of_a_fit_row(a) -> bool:  # the same model, table, precision and per-GPU batch
    return a.role != "fit" and any(
        a.group[0] == f.group[0] and a.group[2].startswith(f.group[2])
        and a.precision == f.precision and a.per_device_batch == f.per_device_batch for f in fit)

  for a in table.rows:
    assert a.scaling_only == benchmark_of_a_fit_row(a), a.id
  paired = {p.scaled.id for p in table.scaling} | {p.base.id for p in table.scaling}
  assert all(a.id in paired for a in table.rows if a.scaling_only)


def test_a_constant_checked_on_a_row_makes_it_a_fit_row():
  curves = {c.id: c for c in load_published().allreduce}
  # 0.86 was set on it and 0.96 chosen while checking it (issue 43)
  assert curves["nccl_1048_a100_2node_4nic"].role == "fit"
  assert "inter_node_bus_efficiency" in curves["nccl_1048_a100_2node_4nic"].why


def test_regimes_follow_the_per_gpu_batch(tmp_path):
  for a in load_published().rows:
    if a.role != "not_modelled":
      assert a.regime == ("small" if a.per_device_batch <= 8 else "large"), a.id
  text = ANCHORS_FILE.read_text().replace(
      "group: [vgg16, A100 server, deeppool_readme], regime: small",
      "group: [vgg16, A100 server, deeppool_readme], regime: large")
  bad = tmp_path / "anchors.yaml"
  bad.write_text(text)
  with pytest.raises(UserError, match="deeppool_readme_vgg16_dp_8gpu_b32: regime large but its "
                     "per-GPU batch is 4"):
    load_published(bad)


def test_the_fit_reproduces_the_calibration_from_the_fit_rows_alone():
  refit = fit_calibration()
  assert refit.fitted_on == CALIBRATION.fitted_on
  for key, value in CALIBRATION.efficiency.items():
    assert refit.efficiency[key] == pytest.approx(value, abs=1e-3), key


def test_fit_rows_are_reproduced_and_held_out_rows_are_predicted(rows):
  for r in rows:
    if r.anchor.role == "fit" and r.anchor.kind == "training":
      assert r.ratio == pytest.approx(1.0, abs=0.005), r.anchor.id
    if r.anchor.role == "not_modelled":
      assert r.predicted is None
    else:
      assert r.predicted > 0


def test_the_script_ends_with_the_held_out_line(capsys):
  spec = importlib.util.spec_from_file_location("validate_published",
                                                ROOT / "scripts" / "validate_published.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  code = module.main([])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith("held-out median |error| ")
  assert "rows), worst " in lines[-1]
  held = [ln for ln in lines if " ratio " in ln]
  assert len(held) >= 30
  worst = float(lines[-1].rsplit("worst ", 1)[1].rstrip("%")) / 100
  assert code == (0 if worst <= module.TARGET_WORST else 1)


def test_a_malformed_table_is_one_line_naming_the_row(tmp_path):
  bad = tmp_path / "anchors.yaml"
  bad.write_text("schema: dp_jax.anchors/2\nrows:\n  - {id: x, role: guessed, source: s, "
                 "hardware: h, measured: 1, unit: images/s}\n")
  with pytest.raises(UserError, match="row x: role must be one of"):
    load_anchors(bad)
  bad.write_text("schema: other\n")
  with pytest.raises(UserError, match="not a published-anchors table"):
    load_anchors(bad)


def test_a_row_predicts_throughput_from_its_iteration_time():
  a = next(a for a in load_anchors() if a.id == "dle_pyt_rn50_a100_8gpu_amp")
  ms = 8 * 256 / predict(a) * 1e3  # images/s back to ms per iteration
  assert 80 < ms < 140  # a ResNet-50 step at 256 images per A100


def _tiny() -> LayerGraph:
  return LayerGraph("tiny", (8,), "float32", (
      LayerNode("fc1", "linear", (), param_bytes=4 * 64, out_bytes_per_sample=32,
                out_shape=(8,), attrs={"in_features": 8, "out_features": 8}, params=64,
                flops_per_sample=128),))


def test_the_calibrated_profile_refuses_the_cpu_and_an_uncalibrated_precision():
  with pytest.raises(UserError, match="profile=measure"):
    calibrated_profile(_tiny(), "cpu", "mixed bf16", [1])
  with pytest.raises(UserError, match="no fit for float32"):
    calibrated_profile(_tiny(), "A100-SXM4-40GB", "float32", [1])
  table = calibrated_profile(_tiny(), "H100-SXM5-80GB", "mixed bf16", [1, 2])
  assert table.source == "calibrated" and table.meta["calibration"]["fitted_on"]
