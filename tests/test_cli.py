"""Hydra apps: sweeps end with a summary and fail when a cell failed; refusals write nothing."""

from apps import assert_one_line_error, digest, run_app
from test_plan_app import write_graph_and_profile


def plan_args(tmp_path):
  gpath, ppath = write_graph_and_profile(tmp_path)
  return [f"graph={gpath}", f"profile={ppath}", "cluster=a100_nvlink_8", "batch_size=8",
          "logger=disabled"]


def test_a_sweep_whose_cells_all_fail_exits_non_zero_with_a_summary(tmp_path):
  result = run_app("plan", "-m", *plan_args(tmp_path), "cluster.num_devices=16,64",
                   cwd=tmp_path)
  assert result.returncode != 0
  assert "0 ok, 2 failed" in result.stdout
  assert "at most 8 devices" in result.stdout and "num_devices=64" in result.stdout
  assert "2 sweep cell(s) failed" in result.stderr


def test_a_sweep_with_one_failed_cell_lists_both(tmp_path):
  result = run_app("plan", "-m", *plan_args(tmp_path), "cluster.num_devices=4,16", cwd=tmp_path)
  assert result.returncode != 0
  assert "1 ok, 1 failed" in result.stdout


def test_a_sweep_of_good_cells_exits_zero(tmp_path):
  result = run_app("plan", "-m", *plan_args(tmp_path), "cluster.num_devices=2,4", cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  assert "2 ok, 0 failed" in result.stdout


def test_a_refused_start_leaves_an_existing_run_folder_byte_identical(tmp_path):
  args = plan_args(tmp_path)
  first = run_app("plan", *args, "cluster.num_devices=4", cwd=tmp_path)
  assert first.returncode == 0, first.stderr
  before = digest(tmp_path / "run")
  assert_one_line_error(run_app("plan", *args, "cluster.num_devices=16", cwd=tmp_path),
                        "at most 8 devices")
  assert_one_line_error(run_app("plan", *args, "batch_size=0", cwd=tmp_path), "batch_size=0")
  assert digest(tmp_path / "run") == before
