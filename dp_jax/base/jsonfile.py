"""Reading and writing the project's JSON files, with one-line errors for bad files."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError


def strict(obj: Any) -> Any:
  """`obj` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else None
  if isinstance(obj, dict):
    return {k: strict(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [strict(v) for v in obj]
  return obj


def dumps(obj: Any, indent: int | None = 1) -> str:
  """Strict JSON text of `obj`: non-finite floats become null, other objects their str()."""
  return json.dumps(strict(json.loads(json.dumps(obj, default=str))), indent=indent,
                    allow_nan=False)


def write_json(path: str | Path, obj: Any, indent: int | None = 1, *,
               reserve: int = 0) -> Path:
  """Write `obj` as strict, indented JSON, creating the parent folder.

  Atomic: written beside the target, then renamed over it, so a kill or a full disk leaves the
  previous file whole (a failed write removes its partial copy and names the path). A symbolic
  link is written through (its target replaced, the link kept); a path that is not a regular
  file (a FIFO, a device, a folder) is refused (file_target).
  reserve: pad the file with trailing spaces to at least this many bytes, so that a later write
  of at most that size can overwrite it in place when the disk is full (overwriting blocks a
  file already has needs no new ones): a run's status can still say that the disk filled.
  """
  path = file_target(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  text = dumps(obj, indent)
  text += " " * max(0, reserve - len(text.encode()) - 1) + "\n" if reserve else ""
  # this process's own partial copy: two processes writing one file (a shared cache) must not
  # rename each other's half-written copy, or find theirs gone
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  try:
    tmp.write_text(text)
    os.replace(tmp, path)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    if not (reserve and e.errno == errno.ENOSPC and _overwrite(path, text)):
      raise OSError(e.errno, e.strerror, str(path)) from e
  return path


def file_target(path: str | Path) -> Path:
  """The regular file a write to `path` replaces: `path`, or the file a symbolic link at it
  points to; a one-line UserError naming what is there if that is not a regular file (writing
  beside it and renaming would replace a FIFO or a device with a file)."""
  path = Path(path)
  real = Path(os.path.realpath(path)) if path.is_symlink() else path
  try:
    mode = real.stat().st_mode
  except FileNotFoundError:
    return real
  except OSError as e:
    raise UserError(f"cannot write {path}: {e.strerror}") from None
  if not stat.S_ISREG(mode):
    via = f" (a link to {real})" if real != path else ""
    raise UserError(f"{path}{via} is {_kind(mode)}, not a regular file; give the path of a file "
                    "to write")
  return real


def check_writable(path: str | Path, option: str) -> Path:
  """Before any work: the file `option` names can be written (a regular file or none yet, in a
  folder that is, or can be made, writable); a one-line UserError naming the option if not."""
  try:
    target = file_target(path)
  except UserError as e:
    raise UserError(f"{option}={path}: {e}") from None
  folder = target.parent
  while not folder.exists() and folder != folder.parent:
    folder = folder.parent
  if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
    raise UserError(f"{option}={path}: {folder} is not a writable folder; choose another path")
  if target.exists() and not os.access(target, os.W_OK):
    raise UserError(f"{option}={path}: the file is not writable; choose another path")
  return target


def _kind(mode: int) -> str:
  kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
           (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
           (stat.S_ISSOCK, "a socket")]
  return next((name for test, name in kinds if test(mode)), "not a file")


def _overwrite(path: Path, text: str) -> bool:
  """Overwrite `path` in place with `text` when it is at least as large (True: done)."""
  data = text.encode()
  try:
    if not path.is_file() or path.stat().st_size < len(data):
      return False
    with path.open("r+b") as f:
      f.write(data)
      f.truncate()
    return True
  except OSError:
    return False


def read_json(path: str | Path, what: str) -> Any:
  """The JSON in `path`; a missing or malformed `what` file, a key twice in one object, or a
  NaN / Infinity anywhere, is a one-line UserError naming the file and the field."""
  path = Path(path)
  try:
    text = path.read_text()
  except (FileNotFoundError, IsADirectoryError):
    raise UserError(f"{what} file not found: {path}") from None

  def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
      if key in out:
        raise UserError(f"{what} file {path}: key '{key}' appears twice in one object; keep "
                        "one entry per key")
      out[key] = value
    return out

  try:
    obj = json.loads(text, object_pairs_hook=unique)
  except json.JSONDecodeError as e:
    raise UserError(f"{what} file {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
  bad = non_finite_field(obj)
  if bad is not None:
    raise UserError(f"{what} file {path}: field '{bad[0]}' is {bad[1]}; numbers must be finite "
                    "(JSON has no NaN or Infinity)")
  return obj


def non_finite_field(obj: Any, where: str = "") -> tuple[str, float] | None:
  """(dotted path, value) of the first NaN or infinite number in `obj`, or None."""
  if isinstance(obj, float):
    return None if math.isfinite(obj) else (where or "(top level)", obj)
  items = obj.items() if isinstance(obj, dict) else enumerate(obj) \
      if isinstance(obj, list) else ()
  for key, value in items:
    path = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
    hit = non_finite_field(value, path)
    if hit is not None:
      return hit
  return None
