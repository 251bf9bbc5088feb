"""A run's status survives a full disk: status.json is padded when written, and a write that
finds the disk full overwrites it in place (base/jsonfile.py, write_json's reserve)."""

import errno
import json
import os
import pathlib

import pytest

from dp_jax.base.jsonfile import write_json
from dp_jax.tracking.run_folder import cell_status


def disk_full(monkeypatch):
  """Every new file write fails as on a full disk; opening an existing file in place works."""
  def write_text(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  monkeypatch.setattr(pathlib.Path, "write_text", write_text)


def test_a_reserved_status_is_overwritten_in_place_when_the_disk_is_full(tmp_path, monkeypatch):
  path = tmp_path / "status.json"
  write_json(path, {"status": "running"}, reserve=4096)
  assert path.stat().st_size == 4096 and json.loads(path.read_text()) == {"status": "running"}
  disk_full(monkeypatch)
  failed = {"status": "failed", "error": "disk full: could not write metrics.jsonl"}
  write_json(path, failed, reserve=4096)
  assert json.loads(path.read_text()) == failed
  assert not list(tmp_path.glob(".*.tmp"))  # no partial copy left


def test_without_a_reserve_a_full_disk_is_an_error_naming_the_file(tmp_path, monkeypatch):
  path = tmp_path / "status.json"
  write_json(path, {"status": "running"})
  disk_full(monkeypatch)
  with pytest.raises(OSError, match="status.json"):
    write_json(path, {"status": "failed", "error": "x" * 100})
  assert json.loads(path.read_text()) == {"status": "running"}  # the old file whole


def test_a_run_that_never_ended_reads_as_failed(tmp_path):
  assert cell_status(tmp_path)["status"] == "failed"  # no status.json
  write_json(tmp_path / "status.json", {"status": "running", "overrides": ["a=1"]}, reserve=64)
  status = cell_status(tmp_path)
  assert status["status"] == "failed" and "did not finish" in status["error"]
  assert status["overrides"] == ["a=1"]
  write_json(tmp_path / "status.json", {"status": "ok"})
  assert cell_status(tmp_path) == {"status": "ok"}
