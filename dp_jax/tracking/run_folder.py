"""One run per folder: an advisory lock on the run folder itself, held while the job runs.

The lock is flock(2) on the folder's own descriptor: nothing is written into the folder, and
the kernel drops it when the process ends (also on SIGKILL), so no stale lock survives a crash.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError

_HELD: dict[Path, int] = {}


def lock(folder: str | Path, what: str = "run folder", option: str = "hydra.run.dir") -> None:
  """Hold the run folder (or a sweep's: `what`, `option`) for this process; a UserError if
  another run holds it."""
  folder = Path(folder).resolve()
  if folder in _HELD:
    return
  fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      raise UserError(f"{what} {folder} is in use by another run; wait for it to finish or "
                      f"choose another {option}") from None
    raise
  _HELD[folder] = fd


def unlock(folder: str | Path) -> None:
  """Release the folder (end of a job; a multirun locks each cell's folder in turn)."""
  fd = _HELD.pop(Path(folder).resolve(), None)
  if fd is not None:
    os.close(fd)  # closing the descriptor releases the flock


def write_error(e: OSError) -> str:
  """'could not write <path>: <reason>' for a failed write (full disk, read-only, ...)."""
  where = e.filename or "a file of the run"
  reason = e.strerror or str(e)
  if e.errno == errno.ENOSPC:
    return (f"disk full: could not write {where}: {reason}; free some space or choose another "
            "hydra.run.dir")
  return f"could not write {where}: {reason}"


def cell_status(folder: Path) -> dict[str, Any]:
  """A run folder's status.json; a run that never ended (no file, an unreadable one, or the
  'running' a run writes when it starts) reads as failed, saying so."""
  try:
    status = json.loads((Path(folder) / "status.json").read_text())
  except (OSError, ValueError):
    return {"status": "failed", "error": "no status.json: the run did not finish"}
  if status.get("status") == "running":
    return {**status, "status": "failed",
            "error": "the run did not finish (killed or still running: its status.json says "
                     "running)"}
  return status
