"""Probe rows of issue 41 on sweeps: a sweep owns its folder (refused while another sweep holds
it or when it holds another sweep's cells), its summary lists exactly its cells and leads with
the fair comparison, run names name every swept option, provenance records what replays a run."""

import json

from apps import assert_one_line_error, digest, run_app
from test_probe_caches import user_package

from dp_jax.tracking import run as tracking
from dp_jax.tracking import run_folder
from dp_jax.tracking.sweep_summary import identity, sweep_table, swept_options

SWEEP = ["-m", "model=digits_mlp", "logger=disabled"]


def rows(sweep_dir):
  return (sweep_dir / "sweep_summary.csv").read_text().splitlines()[1:]


def test_a_sweep_folder_holding_another_sweep_is_refused_untouched(tmp_path):
  first = run_app("inspect", *SWEEP, "model.num_classes=3,4,5", cwd=tmp_path)
  assert first.returncode == 0, first.stderr
  assert len(rows(tmp_path / "sweep")) == 3
  before = digest(tmp_path / "sweep")
  other = run_app("inspect", *SWEEP, "model.num_classes=6,7", cwd=tmp_path)
  assert_one_line_error(other, f"sweep folder {tmp_path / 'sweep'} holds the cells of `inspect",
                        "model.num_classes=3,4,5`", "choose another hydra.sweep.dir")
  assert digest(tmp_path / "sweep") == before
  again = run_app("inspect", *SWEEP, "model.num_classes=3,4,5", cwd=tmp_path)  # resumes
  assert again.returncode == 0, again.stderr
  assert [r.split(",")[0] for r in rows(tmp_path / "sweep")] == [
      f"model.num_classes={k}" for k in (3, 4, 5)]


def test_a_sweep_folder_in_use_by_another_sweep_is_refused(tmp_path):
  (tmp_path / "sweep").mkdir()
  run_folder.lock(tmp_path / "sweep")  # another sweep holds it (this process, not the app's)
  try:
    result = run_app("inspect", *SWEEP, "model.num_classes=3,4", cwd=tmp_path)
  finally:
    run_folder.unlock(tmp_path / "sweep")
  assert_one_line_error(result, f"sweep folder {tmp_path / 'sweep'} is in use by another run")
  assert list((tmp_path / "sweep").iterdir()) == []


def test_cells_of_an_earlier_sweep_without_a_record_are_not_mixed_in(tmp_path):
  (tmp_path / "sweep" / "2").mkdir(parents=True)
  (tmp_path / "sweep" / "2" / "status.json").write_text('{"status": "ok"}')
  result = run_app("inspect", *SWEEP, "model.num_classes=3,4", cwd=tmp_path)
  assert_one_line_error(result, "holds 1 cell(s) of an earlier sweep")


def test_the_table_leads_with_the_fair_comparison_and_its_verdict():
  cells = [{"cell": "a", "status": "ok", "error": "", "amplification_limit": float("inf"),
            "speedup_vs_best_data_parallel_alone": 1.03,
            "speedup_vs_best_data_parallel_alone_verdict": "tie",
            "cluster_throughput_vs_matched_data_parallel": 0.6,
            "cluster_throughput_vs_matched_data_parallel_verdict": "behind",
            "cluster_throughput_vs_data_parallel": 1.59}]
  columns, table = sweep_table(cells, "simulate")
  assert columns[2:7] == ["A", "speed-up vs fastest DP on <= G (simulated)",
                          "verdict vs fastest DP", "cluster throughput / matched DP (simulated)",
                          "verdict vs matched DP"]
  assert columns[-1] == "cluster throughput / DP on all G alone (simulated)"
  assert table[0][2:7] == ["inf", 1.03, "tie", 0.6, "behind"]


def test_no_amplification_limit_reads_inf_not_blank():
  # strict JSON records inf as null: config.json and plan.json alike
  assert identity({"planner": {"amplification_limit": None}})["amplification_limit"] == float(
      "inf")
  assert "amplification_limit" not in identity({"model": {"name": "m"}})  # no planner: no limit


def test_run_names_name_the_gradient_precision_and_every_swept_option(tmp_path):
  cfg = {"model": {"name": "vgg16"}, "cluster": {"name": "dgx_a100", "num_devices": 32},
         "batch_size": 32, "planner": {"amplification_limit": None, "gradient_precision": "bf16"},
         "background": {"name": "vgg16"}}
  assert tracking.run_name(cfg, "simulate", ["planner.gradient_precision=bf16",
                                             "background=vgg16"]) == (
      "simulate vgg16 dgx_a100 G32 B32 Ainf bf16 background=vgg16")
  (tmp_path / "sweep.json").write_text(json.dumps(
      {"app": "simulate", "overrides": ["model=vgg16", "background=none,vgg16",
                                        "planner.gradient_precision=fp32,bf16"]}))
  assert swept_options(tmp_path, ["model=vgg16", "background=vgg16",
                                  "planner.gradient_precision=bf16"]) == [
      "background=vgg16", "planner.gradient_precision=bf16"]


def test_provenance_records_the_config_files_and_the_models_own_source(tmp_path, monkeypatch):
  root = user_package(tmp_path)
  monkeypatch.syspath_prepend(str(root))
  monkeypatch.setattr(tracking, "_COMMAND", {})
  tracking.record_command(["plan", f"model={root / 'mlp.yaml'}"],
                          [("model", root / "mlp.yaml")])
  prov = tracking.provenance({"model": {"_target_": "umods.mlp.MLP"}})
  assert prov["argv"] == ["plan", f"model={root / 'mlp.yaml'}"]  # as typed, no temporary folder
  assert prov["config_files"] == {f"model={root / 'mlp.yaml'}": (root / "mlp.yaml").read_text()}
  source = prov["model_source"]
  assert set(source["modules"]) == {"umods", "umods.helpers", "umods.mlp"}
  (root / "umods" / "helpers.py").write_text("WIDTH = 99\n")
  assert tracking.provenance({"model": {"_target_": "umods.mlp.MLP"}})["model_source"][
      "sha256"] != source["sha256"]
