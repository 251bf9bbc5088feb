"""Reading and writing the project's JSON files, with one-line errors for bad files."""

from __future__ import annotations

import errno
import json
import math
import os
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
  previous file whole (a failed write removes its partial copy and names the path).
  reserve: pad the file with trailing spaces to at least this many bytes, so that a later write
  of at most that size can overwrite it in place when the disk is full (overwriting blocks a
  file already has needs no new ones): a run's status can still say that the disk filled.
  """
  path = Path(path)
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
