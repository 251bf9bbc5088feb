"""A failed write (full disk, read-only folder) is one line naming the path; what was written
before is kept."""

import errno
import json
import os
import pathlib
import stat

import pytest

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import check_writable, write_json
from dp_jax.cli.hydra_app import one_line


def full_disk(*_, **__):
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_json_write_on_a_full_disk_keeps_the_old_file_and_names_the_path(tmp_path,
                                                                          monkeypatch):
  path = write_json(tmp_path / "status.json", {"status": "ok"})
  before = path.read_bytes()
  monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
  with pytest.raises(OSError) as e:
    write_json(path, {"status": "failed"})
  assert path.read_bytes() == before
  assert [p.name for p in tmp_path.iterdir()] == ["status.json"], "no partial copy left"
  line = one_line(e.value)
  assert line == (f"disk full: could not write {path}: No space left on device; free some space or "
                  "choose another hydra.run.dir")


def test_a_write_failure_deep_in_a_chain_is_still_named(tmp_path):
  try:
    try:
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "x.csv"))
    except OSError as inner:
      raise RuntimeError("while logging a table") from inner
  except RuntimeError as outer:
    assert one_line(outer) == f"could not write {tmp_path / 'x.csv'}: Read-only file system"


class FailingManager:
  directory = "/run/checkpoints"

  def save(self, *_, **__):
    raise ValueError("RESOURCE_EXHAUSTED: No space left on device\nmore detail")

  def wait_until_finished(self):
    raise ValueError("RESOURCE_EXHAUSTED: No space left on device")

  def close(self):
    self.closed = True


def test_a_failed_checkpoint_save_is_one_line_naming_the_folder():
  from dp_jax.runtime import checkpoint as ckpt

  with pytest.raises(UserError) as e:
    ckpt.save(FailingManager(), 4, {})
  assert str(e.value) == ("could not write checkpoint step 4 in /run/checkpoints: "
                          "RESOURCE_EXHAUSTED: No space left on device; the checkpoints already "
                          "written are kept")
  manager = FailingManager()
  with pytest.raises(UserError, match="could not write a checkpoint in /run/checkpoints"):
    ckpt.finish(manager)
  assert manager.closed
  quiet = FailingManager()
  ckpt.finish(quiet, failing=True)  # another error is on its way: this one is only logged
  assert quiet.closed


# --- issue 41: a write replaces only a regular file; links are written through ----------------


def test_a_write_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path):
  target = write_json(tmp_path / "old.json", {"plan": "old"})
  link = tmp_path / "plan.json"
  link.symlink_to(target)
  assert write_json(link, {"plan": "new"}) == target
  assert link.is_symlink() and os.readlink(link) == str(target)
  assert json.loads(target.read_text()) == {"plan": "new"}


def test_a_fifo_or_a_device_is_refused_naming_what_it_is(tmp_path):
  fifo = tmp_path / "pipe"
  os.mkfifo(fifo)
  with pytest.raises(UserError, match=r"pipe is a FIFO \(named pipe\), not a regular file"):
    write_json(fifo, {"plan": 1})
  assert stat.S_ISFIFO(fifo.stat().st_mode)
  link = tmp_path / "out.json"
  link.symlink_to(fifo)
  with pytest.raises(UserError, match=f"a link to {fifo}"):
    write_json(link, {"plan": 1})
  # a character device: checked without writing (a failing check must not replace /dev/null)
  with pytest.raises(UserError, match="out=/dev/null: /dev/null is a character device"):
    check_writable("/dev/null", "out")
  with pytest.raises(UserError, match="is a folder"):
    check_writable(tmp_path, "out")
  assert check_writable(tmp_path / "new" / "plan.json", "out") == tmp_path / "new" / "plan.json"
