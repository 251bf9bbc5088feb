"""Columns read from a cell's config and summary, and markdown cells, shared by the studies."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from dp_jax.planner.contract import limit_label as plan_limit_label
from dp_jax.report.compare import (
  VALIDATED_TOLERANCE,
  VERDICTS,
  gpu_time_change,
  gpu_tolerance,
  validated_tolerance,
  verdict,
)

Row = dict[str, Any]
PLAN_IDENTITY = ("model", "cluster", "device", "num_devices", "global_batch",
                 "amplification_limit")
# What a plan/simulate cell's verdicts rest on (gradient precision, profile, A) and the device
# count when its plan is plain data parallelism (None otherwise).
PLAN_BASIS = ("basis", "plan_data_parallel_devices")
# The memory model's one-line errors: "no plan fits in 40 GB per device: device 0 needs 40.37 GB"
# and "layer 'x' does not fit in 40 GB per device on ...: it needs 41.00 GB".
MEMORY_ERROR = re.compile(r"fits? in ([\d.]+) GB per device\b.*?\bneeds ([\d.]+) GB")


def plan_identity(cfg: Row) -> Row:
  """Model, cluster, G, B and amplification limit of a plan/simulate cell, from its config."""
  model, cluster, planner = (cfg.get(k) or {} for k in ("model", "cluster", "planner"))
  return {"model": model.get("name"), "cluster": cluster.get("name"),
          "device": cluster.get("device"), "num_devices": cluster.get("num_devices"),
          "global_batch": cfg.get("batch_size"),
          "amplification_limit": unlimited(planner.get("amplification_limit"))}


def unlimited(x: Any) -> Any:
  """A limit read back from strict JSON, where null stands for no limit (inf)."""
  return math.inf if x is None else x


def pick(row: Row, keys: Sequence[str]) -> Row:
  """The summary values of `keys` (None where the cell has none, e.g. it failed)."""
  return {k: row.get(k) for k in keys}


def number(x: Any) -> float | None:
  """x as a finite float, else None."""
  try:
    v = float(x)
  except (TypeError, ValueError):
    return None
  return v if math.isfinite(v) else None


def ratio(a: Any, b: Any) -> float | None:
  """a / b, None when either is missing or b is zero."""
  a, b = number(a), number(b)
  return None if a is None or not b else a / b


def times(x: Any) -> str:
  """1.234 -> '1.23x' ('-' when missing)."""
  v = number(x)
  return "-" if v is None else f"{v:.2f}x"


def gpu_change(x: Any) -> str:
  """A GPU-time saving fraction as a ratio: 0.52 -> '2.08x less', -11.5 -> '12.5x more' ('-'
  when missing; dp_jax.report.compare.gpu_time_change)."""
  return gpu_time_change(number(x), "")


def limit_label(a: Any) -> str:
  """An amplification limit read back from a CSV or JSON cell as text: '2.0' -> '2', inf ->
  'inf' (the plan's own wording, dp_jax.planner.contract.limit_label)."""
  return plan_limit_label(float(a))


def pivot(rows: Sequence[Row], *, row_key: str, cols: Sequence[tuple[str, Callable[[Row], bool]]],
          value: Callable[[Row], str], row_header: str) -> str:
  """Markdown table: a line per row_key value, a column per (header, predicate), '-' if none."""
  keys = list(dict.fromkeys(r[row_key] for r in rows))
  lines = ["| " + " | ".join([row_header, *(h for h, _ in cols)]) + " |",
           "|" + "---|" * (len(cols) + 1)]
  for k in keys:
    sub = [r for r in rows if r[row_key] == k]
    cells = [next((value(r) for r in sub if pred(r)), "-") for _, pred in cols]
    lines.append("| " + " | ".join([str(k), *cells]) + " |")
  return "\n".join(lines) + "\n"


def tolerances_used(rows: Sequence[Row]) -> str:
  """The tolerances the rows are judged at, each with the regime it belongs to ('10.9% (per-GPU
  batch <= 8), 6.3% (per-GPU batch > 8)'); a tolerance of no regime alone."""
  named: dict[float, str] = {}
  for r in rows:
    t = tolerance(r)
    device = r.get("device") or ((r.get("config") or {}).get("cluster") or {}).get("device")
    per_device = per_device_batch(r)
    label = ""
    if device == "cpu" and t == VALIDATED_TOLERANCE:
      label = " (this machine's CPU)"
    elif device and device != "cpu" and per_device and gpu_tolerance(per_device).value == t:
      label = f" ({gpu_tolerance(per_device).regime})"
    named.setdefault(t, label)
  return ", ".join(f"{t:.1%}{label}" for t, label in sorted(named.items()))


def tolerance(row: Row) -> float:
  """The cell's comparison tolerance (its summary's), else the validated tolerance of its device
  (the row's, or its config's cluster's; the CPU's when it names none)."""
  t = number(row.get("comparison_tolerance"))
  if t is not None:
    return t
  device = row.get("device") or ((row.get("config") or {}).get("cluster") or {}).get("device")
  per_device = per_device_batch(row)
  return validated_tolerance(str(device), per_device) if device else VALIDATED_TOLERANCE


def per_device_batch(row: Row) -> float | None:
  """B / G of a cell: its summary's, else its config's (a failed cell has no summary)."""
  config = row.get("config") or {}
  b = number(row.get("global_batch")) or number(config.get("batch_size"))
  g = number(row.get("num_devices")) or number((config.get("cluster") or {}).get("num_devices"))
  return b / g if b and g else None


def data_parallel_label(row: Row) -> str | None:
  """'DP on d' when the cell's plan is plain data parallelism on d devices, else None."""
  d = number(row.get("plan_data_parallel_devices"))
  return None if d is None else f"DP on {int(d)}"


def judge(row: Row, names: Sequence[str]) -> Row:
  """name_margin and name_verdict of each ratio column (dp_jax/report/compare.py; None if
  missing)."""
  t, out = tolerance(row), {}
  for name in names:
    v = number(row.get(name))
    out[f"{name}_margin"] = None if v is None else v - 1
    out[f"{name}_verdict"] = None if v is None else verdict(v, t)
  return out


def verdict_columns(names: Sequence[str]) -> tuple[str, ...]:
  """The margin and verdict columns of `judge` for these ratios."""
  return tuple(c for n in names for c in (f"{n}_margin", f"{n}_verdict"))


def judged(row: Row, name: str) -> str:
  """'1.07x tie' / '2.11x ahead' ('-' when missing): the ratio and its verdict."""
  return ratio_verdict(row.get(name), tolerance(row))


def ratio_verdict(x: Any, tol: float) -> str:
  """A ratio and its verdict at tolerance tol: '1.07x tie' ('-' when missing)."""
  v = number(x)
  return "-" if v is None else f"{v:.2f}x {verdict(v, tol)}"


def tally(rows: Sequence[Row], name: str) -> str:
  """'3 ahead, 5 tie, 2 behind' over the rows with that ratio of a burst plan to data
  parallelism (verdicts of `judge`), then ', 4 is DP': the cells whose plan is data
  parallelism, not judged."""
  counts = {k: 0 for k in VERDICTS}
  plain = 0
  for r in rows:
    v = number(r.get(name))
    if data_parallel_label(r):
      plain += 1
    elif v is not None:
      counts[verdict(v, tolerance(r))] += 1
  return ", ".join(f"{n} {k}" for k, n in counts.items()) + (f", {plain} is DP" if plain else "")


def basis_line(rows: Sequence[Row]) -> str:
  """'Verdicts rest on: `a`, `b`.': the distinct bases (gradient precision, profile, A) of the
  cells, or that they did not record one."""
  bases = list(dict.fromkeys(str(r["basis"]) for r in rows if r.get("basis")))
  if not bases:
    return "Verdicts rest on: not recorded (these cells predate the summary's `basis`)."
  return "Verdicts rest on: " + ", ".join(f"`{b}`" for b in bases) + "."


def median_gpu_change(rows: Sequence[Row], name: str) -> str:
  """'median 1.72x less over 12 cells' of a GPU-time saving column (1 - ours / baseline) as a
  ratio ('not recorded' when no row has it)."""
  values = [v for v in (number(r.get(name)) for r in rows) if v is not None]
  if not values:
    return "not recorded"
  cells = f"{len(values)} cell" + ("s" if len(values) > 1 else "")
  return f"median {gpu_change(statistics.median(values))} over {cells}"


def memory_need(error: Any) -> tuple[float, float] | None:
  """(GB a device needs, GB it has) from the memory model's one-line error, else None."""
  match = MEMORY_ERROR.search(str(error or ""))
  return None if match is None else (float(match[2]), float(match[1]))
