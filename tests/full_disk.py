"""`python tests/full_disk.py <app> overrides...`: the app with its disk full after N metrics lines.

FULL_DISK_AFTER_LINES=N: the (N+1)th append to metrics.jsonl, and every file write after it,
raise OSError(ENOSPC) as a full disk does (checkpoints are written by orbax's own I/O and are
not affected, so the ones saved before the disk filled must survive).
"""

import errno
import os
import pathlib
import runpy
import sys

LIMIT = int(os.environ["FULL_DISK_AFTER_LINES"])
_open, _write_text = pathlib.Path.open, pathlib.Path.write_text
_state = {"lines": 0, "full": False}


def _full() -> OSError:
  return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def open_(self, mode="r", *args, **kwargs):
  if "a" in mode and self.name == "metrics.jsonl":
    _state["lines"] += 1
    _state["full"] |= _state["lines"] > LIMIT
  if _state["full"] and any(c in mode for c in "wax"):
    raise _full()
  return _open(self, mode, *args, **kwargs)


def write_text(self, *args, **kwargs):
  if _state["full"]:
    raise _full()
  return _write_text(self, *args, **kwargs)


pathlib.Path.open, pathlib.Path.write_text = open_, write_text
sys.argv = [f"dp_jax.{sys.argv[1]}", *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
