"""tracking.git_state: the commit and whether code (not regenerated results/) is uncommitted."""

import subprocess

from dp_jax.tracking.run import git_state


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_dirty_means_uncommitted_changes_outside_results(tmp_path):
  _git(tmp_path, "init", "-q")
  (tmp_path / "results").mkdir()
  (tmp_path / "code.py").write_text("x = 1\n")
  (tmp_path / "results" / "study.csv").write_text("a\n1\n")
  _git(tmp_path, "add", ".")
  _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
  clean = git_state(tmp_path)
  assert len(clean["git_sha"]) == 40 and clean["git_dirty"] is False
  (tmp_path / "results" / "study.csv").write_text("a\n2\n")  # a study regenerated its results
  assert git_state(tmp_path)["git_dirty"] is False
  (tmp_path / "code.py").write_text("x = 2\n")
  assert git_state(tmp_path)["git_dirty"] is True
