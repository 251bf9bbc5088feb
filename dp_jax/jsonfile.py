"""Reading and writing the project's JSON files, with one-line errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dp_jax.errors import UserError


def write_json(path: str | Path, obj: Any) -> Path:
  """Write `obj` as indented JSON, creating the parent folder."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj, indent=1))
  return path


def read_json(path: str | Path, what: str) -> Any:
  """The JSON in `path`; a missing or malformed `what` file is a one-line UserError."""
  path = Path(path)
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, IsADirectoryError):
    raise UserError(f"{what} file not found: {path}") from None
  except json.JSONDecodeError as e:
    raise UserError(f"{what} file {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
