"""Read a Hydra multirun folder back: one row per cell, then CSV and markdown tables."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.tracking.run_folder import cell_status


def parse_override(text: str) -> tuple[str, str]:
  """'a.b=c' -> ('a.b', 'c'); '+a=1' and '++a=1' keep the key without the plus signs."""
  key, _, value = text.partition("=")
  return key.lstrip("+~"), value


def collect(sweep_dir: str | Path) -> list[dict[str, Any]]:
  """Every cell of a sweep (by job number): its overrides, then its status.json."""
  sweep_dir = Path(sweep_dir)
  if not sweep_dir.is_dir():
    raise UserError(f"sweep folder not found: {sweep_dir}")
  rows = []
  for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()),
                        key=lambda p: int(p.name)):
    row: dict[str, Any] = {"job": int(job_dir.name)}
    status = dict(cell_status(job_dir))
    for text in status.pop("overrides", []) or []:
      key, value = parse_override(text)
      row[key] = value
    row.update(status)
    rows.append(row)
  return rows


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path, columns: Sequence[str]) -> Path:
  """Rows as CSV with exactly `columns` (missing values empty)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with path.open("w", newline="") as f:
    w = csv.writer(f)
    w.writerow(columns)
    for r in rows:
      w.writerow([_cell(r.get(c)) for c in columns])
  return path


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str],
                   headers: Sequence[str] | None = None) -> str:
  """Rows as a GitHub markdown table."""
  headers = list(headers or columns)
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  for r in rows:
    lines.append("| " + " | ".join(_cell(r.get(c), markdown=True) for c in columns) + " |")
  return "\n".join(lines) + "\n"


def _cell(v: Any, markdown: bool = False) -> str:
  if v is None:
    return ""
  if isinstance(v, float):
    if math.isinf(v):
      return "inf"
    return f"{v:.4g}" if markdown else repr(round(v, 6))
  text = str(v)
  return text.replace("|", "/") if markdown else text
