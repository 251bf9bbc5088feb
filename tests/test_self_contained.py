"""A fresh clone is self-contained: nothing outside docs reads the folder beside the repo."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OUTSIDE = ".." + "/shared"  # spelled in two parts so this file does not match itself


def tracked_files() -> list[Path]:
  try:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  return [REPO / f for f in out.stdout.splitlines() if not f.startswith("docs/")]


def test_no_tracked_file_outside_docs_refers_to_the_folder_beside_the_repo():
  offenders = [str(p.relative_to(REPO)) for p in tracked_files()
               if p.is_file() and OUTSIDE in p.read_text(errors="ignore")]
  assert offenders == []


def test_the_a100_tables_ship_inside_the_package_with_their_licence():
  from dp_jax.layer_times.deeppool_import import DEFAULT_DATA_DIR, RECIPES

  assert DEFAULT_DATA_DIR.is_relative_to(REPO / "dp_jax")
  assert "MIT License" in (DEFAULT_DATA_DIR / "LICENSE").read_text()
  files = {f for recipe in RECIPES.values() for f, _ in recipe}
  assert all((DEFAULT_DATA_DIR / f).is_file() for f in files)
