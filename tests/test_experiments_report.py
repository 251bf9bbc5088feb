"""experiments/aggregate.py: a multirun folder -> CSV, timing CSV, markdown, provenance, figures."""

import csv
import json

import pytest

from dp_jax.base.errors import UserError
from experiments import aggregate as report
from experiments.strong_scaling import STUDY

SHA = "0123456789abcdef0123456789abcdef01234567"


def write_cell(sweep, job, overrides, cfg, status):
  d = sweep / str(job)
  (d / ".hydra").mkdir(parents=True)
  (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
  (d / "config.json").write_text(json.dumps(cfg))
  (d / "provenance.json").write_text(json.dumps({"git_sha": SHA, "git_dirty": False,
                                                 "packages": {"jax": "0"}, "python": "3.12"}))
  (d / "status.json").write_text(json.dumps({**status, "overrides": overrides}))


def config(g, b, model="vgg16"):
  return {"model": {"name": model}, "batch_size": b, "seed": 0,
          "cluster": {"name": "dgx_a100", "device": "A100-SXM4-40GB", "num_devices": g},
          "planner": {"amplification_limit": 2.0}}


@pytest.fixture
def sweep(tmp_path):
  s = tmp_path / "sweep"
  s.mkdir()
  (s / "multirun.yaml").write_text("{}\n")
  write_cell(s, 0, ["model=vgg16", "+experiment/shape=g8_b32", "+experiment=strong_scaling"],
             config(8, 32), {"status": "ok", "iteration_ms": 10.0, "gpu_ms": 40.0,
                             "data_parallel_iteration_ms": 12.0, "data_parallel_gpu_ms": 96.0,
                             "speedup": 1.2, "gpu_time_saving": 0.5833, "planner_seconds": 0.1})
  write_cell(s, 1, ["model=vgg16", "cluster.num_devices=64", "+experiment=strong_scaling"],
             config(64, 32), {"status": "failed", "error": "num_devices (64) is larger than "
                                                           "global_batch (32)"})
  return s


def read_csv(path):
  with path.open() as f:
    return list(csv.DictReader(f))


def test_rows_carry_config_identity_provenance_and_failures(sweep):
  rows, prov = report.load(STUDY, sweep)
  assert [r["status"] for r in rows] == ["ok", "failed"]
  assert rows[0]["cell"] == "model=vgg16 +experiment/shape=g8_b32"
  assert rows[0]["samples_per_s"] == pytest.approx(3200.0)
  assert rows[0]["idle_fraction"] == pytest.approx(0.5)
  assert rows[1]["num_devices"] == 64 and rows[1]["iteration_ms"] is None
  assert all(r["git_sha"] == SHA and r["seed"] == 0 for r in rows)
  assert prov["cells"] == 2 and prov["failed"] == 1 and prov["git_shas"] == [SHA]


def test_outputs_split_timing_and_list_failed_cells(sweep, tmp_path):
  rows, prov = report.load(STUDY, sweep)
  paths = report.write(STUDY, rows, prov, tmp_path / "out")
  table = read_csv(paths["csv"])
  assert list(table[0]) == STUDY.csv_columns and "planner_seconds" not in table[0]
  assert read_csv(paths["timing csv"])[0]["planner_seconds"] == "0.1"
  md = paths["markdown"].read_text()
  assert "## Failed cells" in md and "cluster.num_devices=64" in md and "larger than" in md
  assert json.loads(paths["provenance"].read_text())["packages"] == {"jax": "0"}
  assert all(p.read_bytes()[:4] == b"\x89PNG" for k, p in paths.items() if k.startswith("fig"))


def test_the_csv_is_the_same_twice(sweep, tmp_path):
  for out in ("a", "b"):
    rows, prov = report.load(STUDY, sweep)
    report.write(STUDY, rows, prov, tmp_path / out)
  name = f"{STUDY.name}.csv"
  assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_cli_prints_outputs_and_failed_cells(sweep, tmp_path, capsys):
  assert report.main(STUDY, [str(sweep), "--out", str(tmp_path / "cli")]) == 0
  out = capsys.readouterr().out
  assert "2 cells, 1 ok, 1 failed" in out and "failed cell 1" in out
  assert f"csv: {tmp_path / 'cli' / 'strong_scaling.csv'}" in out


def test_missing_or_empty_sweep_is_a_user_error(tmp_path, capsys):
  with pytest.raises(UserError, match="not found"):
    report.load(STUDY, tmp_path / "nope")
  with pytest.raises(UserError, match="no cells"):
    report.load(STUDY, tmp_path)
  assert report.main(STUDY, [str(tmp_path / "nope")]) == 2
  assert capsys.readouterr().err.startswith("error: sweep folder not found")


def test_a_sweep_of_another_study_fails_in_one_line(tmp_path):
  s = tmp_path / "sweep"
  s.mkdir()
  write_cell(s, 0, ["model=vgg16"], config(8, 32), {"status": "ok", "cluster_samples_per_s": 1.0})
  with pytest.raises(UserError, match="is not a strong_scaling sweep: none of its 1 finished"):
    report.load(STUDY, s)


def test_missing_cells_are_warned_by_name_and_listed(sweep, tmp_path, capsys):
  (sweep / "multirun.yaml").write_text(
      "hydra:\n  sweeper:\n    params:\n      model: vgg16,resnet50,gpt2\n"
      "      +experiment/shape: g8_b32\n  overrides:\n    task: [planner.amplification_limit=2]\n")
  rows, prov = report.load(STUDY, sweep)
  err = capsys.readouterr().err
  assert "the sweep's grid has 3 cells, 2 found" in err
  assert "no cells with model=resnet50,inception_v3,wide_resnet101_2,gpt2" in err
  assert "conf/experiment/strong_scaling.yaml" in err
  md = report.write(STUDY, rows, prov, tmp_path / "out")["markdown"].read_text()
  assert md.split("## Missing cells")[1].count("no cells with") >= 2
  assert "All numbers here are **predicted**" in md


def test_list_valued_choices_are_not_split_at_their_inner_commas(tmp_path):
  path = tmp_path / "multirun.yaml"
  path.write_text("hydra:\n  sweeper:\n    params:\n"
                  "      planner.sharding: '[samples],[samples,weights]'\n      model: a, b\n")
  assert report.swept_params(path) == {"planner.sharding": ["[samples]", "[samples,weights]"],
                                       "model": ["a", "b"]}


def test_readme_judges_ratios_and_embeds_figures(sweep, tmp_path):
  rows, prov = report.load(STUDY, sweep)
  paths = report.write(STUDY, rows, prov, tmp_path / "out")
  md = paths["markdown"].read_text()
  assert paths["markdown"].name == "README.md"
  assert "1.20x ahead" in md  # speedup 1.2: +20% is beyond the A100's 10.9% tolerance
  assert "python -m experiments.strong_scaling" in md
  for k, p in paths.items():
    if k.startswith("figure"):
      assert f"]({p.name})" in md and p.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
  assert rows[0]["speedup_verdict"] == "ahead" and rows[0]["speedup_margin"] == pytest.approx(0.2)


def test_a_results_folder_re_renders_from_its_csv(sweep, tmp_path, capsys):
  rows, prov = report.load(STUDY, sweep)
  out = tmp_path / "out"
  report.write(STUDY, rows, prov, out)
  again, prov2 = report.load_csv(STUDY, out)
  assert [r["status"] for r in again] == ["ok", "failed"]
  assert again[0]["iteration_ms"] == 10.0 and again[0]["num_devices"] == 8
  assert again[0]["speedup_verdict"] == "ahead" and again[1]["iteration_ms"] is None
  assert again[0]["planner_seconds"] == 0.1 and prov2["from_csv"].endswith("strong_scaling.csv")
  assert report.main(STUDY, ["--from-csv", str(out), "--out", str(out)]) == 0
  assert "Re-rendered from" in (out / "README.md").read_text()
  assert report.main(STUDY, ["--from-csv", str(tmp_path / "nope")]) == 2
  assert report.main(STUDY, []) == 2
  assert capsys.readouterr().err.count("error: ") == 2


BASIS = "bf16 gradients; calibrated A100-SXM4-40GB mixed bf16 profile; A=2"
MEMORY_ERROR = ("no plan fits in 40 GB per device: device 0 needs 40.37 GB; largest layer there "
                "is 'h.0'; use more devices, a smaller global batch or devices with more memory")


def test_readme_says_what_verdicts_rest_on_and_calls_a_data_parallel_plan_that(tmp_path):
  s = tmp_path / "sweep"
  s.mkdir()
  plan = {"status": "ok", "basis": BASIS, "plan_data_parallel_devices": None,
          "iteration_ms": 10.0, "gpu_ms": 40.0, "data_parallel_iteration_ms": 12.0,
          "data_parallel_gpu_ms": 96.0, "speedup": 1.2, "gpu_time_saving": 0.5833,
          "best_data_parallel_devices": 8, "best_data_parallel_iteration_ms": 12.0,
          "speedup_vs_best_data_parallel": 1.2, "cheapest_data_parallel_devices": 4,
          "cheapest_data_parallel_iteration_ms": 12.5, "cheapest_data_parallel_gpu_ms": 50.0,
          "gpu_time_saving_vs_cheapest_data_parallel": 0.2}
  write_cell(s, 0, ["model=vgg16", "+experiment/shape=g8_b32"], config(8, 32), plan)
  write_cell(s, 1, ["model=vgg16", "+experiment/shape=g32_b32"], config(32, 32),
             {**plan, "plan_data_parallel_devices": 8, "iteration_ms": 9.0, "gpu_ms": 72.0,
              "speedup": 1.31, "speedup_vs_best_data_parallel": 1.0, "gpu_time_saving": 0.75,
              "gpu_time_saving_vs_cheapest_data_parallel": 0.0})
  write_cell(s, 2, ["model=gpt2", "+experiment/shape=g1_b32"], config(1, 32, "gpt2_small"),
             {"status": "failed", "error": MEMORY_ERROR})
  rows, prov = report.load(STUDY, s)
  out = report.write(STUDY, rows, prov, tmp_path / "out")
  md = out["markdown"].read_text()
  assert f"Verdicts rest on: `{BASIS}`." in md
  # the A100's of per-GPU batches 32 / 8 and 32 / 32 (the failed cell is not judged)
  assert "a margin within +-10.9% (per-GPU batch <= 8) (" in md and "4.3%" not in md
  assert ("| vgg16 | 1.20x ahead / 1.20x ahead (1.25x less / 2.40x less) | DP on 8 (the same / "
          "4.00x less) |") in md  # GPU time as ratios: saved 20% is 0.8 of the baseline's
  assert "1.31x" not in md  # a data-parallel plan has no burst speed-up to judge
  assert "against the fastest data parallelism on <= G: 1 ahead, 0 tie, 0 behind, 1 is DP" in md
  assert ("GPU time against the cheapest data parallelism within the tolerance of the "
          "fastest (the fair baseline): median 1.11x less over 2 cells; against data parallelism "
          "on all G: median 3.00x less over 2 cells.") in md
  assert ("- gpt2_small G=1 B=32 on dgx_a100: needs 40.37 GB per device in the memory model, "
          "over the 40 GB a device has\n") in md
  table = {r["job"]: r for r in read_csv(out["csv"])}
  assert table["1"]["plan_data_parallel_devices"] == "8" and table["0"]["basis"] == BASIS
  assert table["0"]["gpu_time_saving_vs_cheapest_data_parallel"] == "0.2"
  assert table["2"]["comparison_tolerance"] == "0.063"  # B / G = 32: the large-batch regime
