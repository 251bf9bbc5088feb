"""The GPU model against published measurements: the anchors table and its split, the calibrated
profile's fit, the three relative checks and the GPU tolerance of each regime taken from them
(dp_jax/published/anchors.py, scripts/validate_published.py, dp_jax/report/compare.py)."""

import dataclasses
import importlib.util
import math
import statistics
import sys
from pathlib import Path

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.layer_times.calibrated import CALIBRATION, calibrated_profile
from dp_jax.published.anchors import (
  ANCHORS_FILE,
  BOTH,
  MIN_ALLREDUCE_BYTES,
  _graph,
  _ratios,
  _small_batch_table,
  accumulated_ms,
  block_index,
  evaluation,
  fit_calibration,
  load_anchors,
  load_published,
  predict,
  report,
  step_ms,
  strategies,
)
from dp_jax.report import compare

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rep():
  return report()


@pytest.fixture(scope="module")
def rows(rep):
  return rep.absolute


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


@pytest.mark.slow  # the whole report: traces 16 published models (about 40 s)
def test_fit_rows_are_reproduced_and_held_out_rows_are_predicted(rows):
  for r in rows:
    if r.anchor.role == "fit" and r.anchor.kind == "training":
      assert r.ratio == pytest.approx(1.0, abs=0.005), r.anchor.id
    if r.anchor.role == "not_modelled":
      assert r.predicted is None
    else:
      assert r.predicted > 0


@pytest.mark.slow  # the whole report: traces 16 published models (about 40 s)
def test_each_regime_tolerance_is_the_committed_one_recomputed_from_the_table(rep):
  for regime, constant in (("small", compare.GPU_TOLERANCE_SMALL_BATCH),
                           ("large", compare.GPU_TOLERANCE_LARGE_BATCH)):
    t = rep.tolerances[regime]
    assert round(t.value, 3) == constant, regime
    # the median of group medians: each group once, from its points in the regime
    assert t.value == pytest.approx(statistics.median(g.median for g in t.groups))
    keys = [(g.check, g.group) for g in t.groups]
    assert len(keys) == len(set(keys))
    for g in t.groups:
      points = [j.error for j in rep.judged if (j.check, j.group) == (g.check, g.group)
                and j.regime in (regime, BOTH)]
      assert g.median == pytest.approx(statistics.median(points)) and g.points == len(points)
  assert {g.check for g in rep.tolerances["small"].groups} == {"scaling", "small_batch",
                                                               "allreduce"}


@pytest.mark.slow  # the whole report: traces 16 published models (about 40 s)
def test_the_checks_judge_held_out_entries_only(rep):
  table = load_published()
  fit_curves = {c.id for c in table.allreduce if c.role == "fit"}
  for j in rep.check("allreduce"):
    assert j.id.split("@")[0] not in fit_curves and j.regime == BOTH
  sizes = [b for c in table.allreduce if c.role == "held_out" for b, _ in c.points]
  assert len(rep.check("allreduce")) == sum(b >= MIN_ALLREDUCE_BYTES for b in sizes)
  assert {j.id for j in rep.check("scaling")} == {p.id for p in table.scaling
                                                  if p.role == "held_out"}


@pytest.mark.slow  # the whole report: traces 16 published models (about 40 s)
def test_scaling_is_the_per_gpu_throughput_of_two_scales_of_one_table(rep):
  j = next(j for j in rep.check("scaling") if j.id == "dle_pyt_rn50_a100_8gpu_amp_vs_1gpu")
  assert j.published == pytest.approx(16621 / 8 / 2470)  # 0.84, as the issue quotes it
  rows = {a.id: a for a in load_anchors()}
  eight, one = rows["dle_pyt_rn50_a100_8gpu_amp"], rows["dle_pyt_rn50_a100_1gpu_amp"]
  assert j.predicted == pytest.approx(predict(eight) / 8 / predict(one))


def test_a_step_accumulates_micro_batches_with_one_all_reduce_and_one_update():
  a = next(a for a in load_anchors() if a.id == "dle_pyt_bert_large_p2_a100_256gpu_mn_tf32")
  ev = evaluation(a)
  sync = sum(st.sync_ms for st in ev.stages)
  assert sync > 0 and ev.update_ms > 0
  assert accumulated_ms(ev, 1) == pytest.approx(ev.iteration_ms)
  assert accumulated_ms(ev, a.accumulation) == pytest.approx(
      a.accumulation * ev.iteration_ms - (a.accumulation - 1) * (sync + ev.update_ms))
  per_sample = [accumulated_ms(ev, k) / k for k in (1, 4)]
  assert per_sample[1] < per_sample[0]  # the all-reduce and update amortised


@pytest.mark.slow  # the whole report: traces 16 published models (about 40 s)
def test_leave_one_model_out_fits_the_shape_on_the_other_tables_only(rep):
  table = load_published()
  tables = {t.id: _small_batch_table(t) for t in table.small_batch}
  grid = [(t, us) for t in table.grid["tile"] for us in table.grid["kernel_overhead_us"]]

  def error(ids, shape):
    errs = [abs(math.log(p / m)) for i in ids for p, m in _ratios(tables[i], *shape).values()]
    return sum(errs) / len(errs)

  assert len(rep.folds) == len(tables)
  for fold in rep.folds:
    others = [i for i in tables if i != fold.left_out]
    best = min(grid, key=lambda g, others=others: error(others, g))
    assert (fold.tile, fold.kernel_overhead_us) == best
    assert fold.fit_error == pytest.approx(error(others, best))
    judged = [j for j in rep.check("small_batch") if j.id.startswith(fold.left_out + "@")]
    assert {int(j.id.split("=")[1]) for j in judged} == set(tables[fold.left_out].spec.batches)


@pytest.mark.slow  # the whole report: traces 16 published models (about 40 s)
def test_the_script_ends_with_the_three_checks_and_one_tolerance_per_regime(capsys, rep):
  spec = importlib.util.spec_from_file_location("validate_published",
                                                ROOT / "scripts" / "validate_published.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  code = module.main([])
  lines = capsys.readouterr().out.strip().splitlines()
  assert [ln[:3] for ln in lines[-5:-2]] == ["(a)", "(b)", "(c)"]
  assert lines[-2].startswith("GPU tolerance, per-GPU batch <= 8: ")
  assert lines[-1].startswith("GPU tolerance, per-GPU batch > 8: ")
  for line, regime in ((lines[-2], "small"), (lines[-1], "large")):
    printed = float(line.split(": ", 1)[1].split("%")[0]) / 100
    assert printed == pytest.approx(rep.tolerances[regime].value, abs=5e-4)
  assert any("framework-dependent" in ln for ln in lines)  # absolute throughput, labelled
  assert code == 0


def test_gpu_tolerance_names_the_regime_of_the_per_gpu_batch():
  small, large = compare.gpu_tolerance(4), compare.gpu_tolerance(32)
  assert (small.value, large.value) == (compare.GPU_TOLERANCE_SMALL_BATCH,
                                        compare.GPU_TOLERANCE_LARGE_BATCH)
  assert small.regime == "per-GPU batch <= 8" and large.regime == "per-GPU batch > 8"
  assert compare.gpu_tolerance(8).regime == small.regime  # 8 is small
  assert "published GPU measurements" in small.basis
  assert compare.validated_tolerance("A100-SXM4-40GB", 64) == large.value
  assert compare.validated_tolerance("H100-SXM5-80GB") == compare.GPU_VALIDATED_TOLERANCE
  assert compare.validated_tolerance("cpu", 2) == compare.VALIDATED_TOLERANCE
  with pytest.raises(UserError, match="per-GPU batch 0 must be a positive number"):
    compare.gpu_tolerance(0)


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


# --- today's dense decoders without pipeline parallelism (issue 44 item 5) ------------------

LLM_SOURCES = ("torchtitan_perf_a100_2404", "torchtitan_h100_2412", "torchtitan_asynctp_h100_2506",
               "dgxc_llama31_8b_2409", "megatron_bridge_2509", "nemo_automodel_2604",
               "megatron_core_moe_v09")


def _llm_rows():
  return [a for a in load_published().rows if a.group[2] in LLM_SOURCES]


def test_the_llm_rows_are_held_out_or_not_modelled_and_no_fit_reads_them():
  rows = _llm_rows()
  assert {a.role for a in rows} == {"held_out", "not_modelled"}
  assert sum(a.role == "held_out" for a in rows) >= 6
  assert all(a.why and a.source for a in rows)
  ids = {a.id for a in rows}
  assert not ids & set(fit_calibration().fitted_on)  # the calibration never reads them
  pairs = [p for p in load_published().scaling if p.base.id in ids]
  assert len(pairs) >= 2 and all(p.role == "held_out" and p.base.role == p.scaled.role
                                 == "held_out" for p in pairs)
  for a in rows:  # fp8, context or pipeline parallelism: recorded, never predicted
    if a.precision == "fp8":
      assert a.role == "not_modelled", a.id


@pytest.mark.slow  # the whole report: traces 16 published models (about 40 s)
def test_the_llm_rows_are_priced_by_their_per_layer_strategies(rows):
  by_id = {r.anchor.id: r for r in rows}
  for a in _llm_rows():
    if a.role != "held_out":
      assert by_id[a.id].predicted is None
      continue
    graph = _graph(a)
    st = strategies(a, graph)
    assert set(st) == set(graph.names)
    for node in graph.nodes:
      s = st[node.name]
      assert s.state == (a.setup["state"] if node.params else "replicated"), (a.id, node.name)
      block = block_index(node.name)
      want = block is not None and (a.setup["recompute"] is True or (
          a.setup["recompute"] == "alternate" and block % 2 == 1))
      assert s.recompute == want, (a.id, node.name)
      if a.tensor_parallel > 1 and node.kind in ("gqa_attention", "swiglu_mlp"):
        assert (s.m, s.split) == (a.tensor_parallel, "heads")
      if a.tensor_parallel > 1 and node.kind == "lm_head":
        assert (s.m, s.split) == (a.tensor_parallel, "out")
    assert by_id[a.id].predicted > 0
    # tokens per second per GPU from the step: samples x sequence / step / GPUs
    assert by_id[a.id].predicted == pytest.approx(
        a.batch * a.model["seq_len"] / (step_ms(a) / 1e3) / a.gpus)


def test_recomputing_every_second_block_costs_between_none_and_all():
  a = next(a for a in _llm_rows() if a.setup.get("recompute") == "alternate")
  times = {rc: step_ms(dataclasses.replace(a, setup={**a.setup, "recompute": rc}))
           for rc in (False, "alternate", True)}
  assert times[False] < times["alternate"] < times[True]
  # half the blocks recomputed: half the extra forward of recomputing them all
  assert times["alternate"] - times[False] == pytest.approx((times[True] - times[False]) / 2,
                                                            rel=0.05)
  replicated = step_ms(dataclasses.replace(a, setup={**a.setup, "state": "replicated"}))
  assert replicated != times["alternate"]  # FSDP's gathers and sharded update are priced


def test_a_per_gpu_unit_is_not_divided_again_in_a_scaling_pair():
  pair = next(p for p in load_published().scaling if p.base.unit == "tokens/s/gpu")
  assert pair.published == pytest.approx(pair.scaled.measured / pair.base.measured)


def test_a_bad_llm_setup_is_one_line_naming_the_row(tmp_path):
  bad = tmp_path / "anchors.yaml"
  row = ("schema: dp_jax.anchors/2\nrows:\n  - {id: x, role: held_out, why: w, group: [a, b, c], "
         "regime: small, source: s, hardware: h, measured: 1, unit: tokens/s/gpu, gpus: 1, "
         "global_batch: 1, setup: {%s}}\n")
  bad.write_text(row % "recompute: sometimes")
  with pytest.raises(UserError, match="row x: recompute must be one of"):
    load_anchors(bad)
  bad.write_text(row % "state: sharded")
  with pytest.raises(UserError, match="row x: state must be one of"):
    load_anchors(bad)
