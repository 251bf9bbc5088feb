"""After a multirun: one table of its cells' key metrics, printed and written as CSV/markdown.

Each cell's `status.json` (the app's summary, dp_jax/cli/hydra_app.py) gives its row: the cell's
overrides, status, error, and the metrics below that any cell has, each labelled predicted
(cost model), simulated (dp_jax/simulator) or measured (a run on this machine). Written to the
sweep folder as sweep_summary.csv and sweep_summary.md.

A sweep owns its folder: it holds a lock on it while it runs (a second sweep into it is refused)
and records its app and overrides in sweep.json; a folder holding another sweep's cells is
refused before any cell runs (rerunning the same sweep resumes it), so the summary lists
exactly the sweep's own cells.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import write_json
from dp_jax.report.tables import table
from dp_jax.tracking import run_folder
from dp_jax.tracking.run import plan_file_json
from dp_jax.tracking.run_folder import cell_status

CSV_FILE, MARKDOWN_FILE = "sweep_summary.csv", "sweep_summary.md"
IDENTITY = [("model", "model"), ("cluster", "cluster"), ("num_devices", "G"),
            ("global_batch", "B"), ("amplification_limit", "A")]
# app -> (summary key, column label); the label says where the number comes from. Each table
# leads with the fair comparison and its verdict (README: the fastest data parallelism on
# d <= G; with a background job, the matched baseline); data parallelism on all G alone, which
# leaves no device idle to lend, comes after, named as such.
METRICS: dict[str, list[tuple[str, str]]] = {
    "plan": [("speedup_vs_best_data_parallel", "speed-up vs fastest DP on <= G (predicted)"),
             ("speedup_vs_best_data_parallel_verdict", "verdict vs fastest DP"),
             ("iteration_ms", "iteration ms (predicted)"),
             ("best_data_parallel_iteration_ms", "fastest DP iteration ms (predicted)"),
             ("data_parallel_iteration_ms", "DP on all G iteration ms (predicted)"),
             ("speedup", "speed-up vs DP on all G (predicted)"),
             ("gpu_time_saving", "GPU time saved vs DP on all G (predicted)")],
    "simulate": [("speedup_vs_best_data_parallel_alone",
                  "speed-up vs fastest DP on <= G (simulated)"),
                 ("speedup_vs_best_data_parallel_alone_verdict", "verdict vs fastest DP"),
                 ("cluster_throughput_vs_matched_data_parallel",
                  "cluster throughput / matched DP (simulated)"),
                 ("cluster_throughput_vs_matched_data_parallel_verdict",
                  "verdict vs matched DP"),
                 ("planner_iteration_ms", "iteration ms (predicted)"),
                 ("alone_iteration_ms", "iteration ms alone (simulated)"),
                 ("iteration_ms", "iteration ms with background (simulated)"),
                 ("cluster_samples_per_s", "cluster samples/s (simulated)"),
                 ("speedup_vs_data_parallel_alone", "speed-up vs DP on all G (simulated)"),
                 ("cluster_throughput_vs_data_parallel",
                  "cluster throughput / DP on all G alone (simulated)")],
    "train": [("final_step", "steps (measured)"), ("median_step_ms", "iteration ms (measured)"),
              ("samples_per_s", "samples/s (measured)"), ("final_loss", "final loss (measured)")],
    "validate": [("plans", "plans (measured)"),
                 ("median_abs_pct_error", "median abs % error, predicted vs measured"),
                 ("max_abs_pct_error", "max abs % error, predicted vs measured"),
                 ("spearman", "Spearman, predicted vs measured")],
}
BASE = ["cell", "status"]


class SweepSummary(Callback):
  """Hydra callback (conf/hydra/callbacks): after a multirun, one table of its cells."""

  failed = 0  # failed cells of the last sweep in this process; main() exits non-zero on it

  def on_multirun_start(self, config: Any, **_: Any) -> None:
    SweepSummary.failed = 0
    try:
      own_folder(Path(config.hydra.sweep.dir), app_name(config),  # as typed: ${hydra:...}
                 OmegaConf.to_container(config.hydra.overrides.task, resolve=False))  # unset yet
    except UserError as e:
      raise SweepRefused(str(e)) from None

  def on_multirun_end(self, config: Any, **_: Any) -> None:
    sweep_dir = Path(config.hydra.sweep.dir)
    try:
      cells = sweep_cells(sweep_dir)
      SweepSummary.failed = sum(c["status"] != "ok" for c in cells)
      columns, rows = sweep_table(cells, app_name(config))
      write_tables(sweep_dir, columns, rows)
      print_sweep_summary(columns, rows, sweep_dir, SweepSummary.failed)
    finally:
      run_folder.unlock(sweep_dir)


class SweepRefused(BaseException):
  """A sweep refused before its first cell; a BaseException because Hydra turns an Exception
  raised in a callback into a warning and runs the sweep anyway (the app prints it as one
  line)."""


SWEEP_FILE = "sweep.json"


def own_folder(sweep_dir: Path, app: str, overrides: list[str]) -> None:
  """Hold `sweep_dir` for this sweep: locked while it runs, and refused (a UserError) if it
  holds cells of another sweep (other app or overrides, or cells without a sweep.json)."""
  sweep_dir.mkdir(parents=True, exist_ok=True)
  run_folder.lock(sweep_dir, "sweep folder", "hydra.sweep.dir")
  mine = {"app": app, "overrides": overrides}
  path = sweep_dir / SWEEP_FILE
  try:
    held = json.loads(path.read_text()) if path.exists() else None
  except (OSError, ValueError):
    held = {}
  cells = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
  if held != mine and (held is not None or cells):
    run_folder.unlock(sweep_dir)
    what = (f"the cells of `{held.get('app')} {' '.join(held.get('overrides') or [])}`"
            if isinstance(held, dict) and held else f"{len(cells)} cell(s) of an earlier sweep")
    raise UserError(f"sweep folder {sweep_dir} holds {what}; its summary would mix them with "
                    "this sweep's: choose another hydra.sweep.dir (rerunning that same sweep "
                    "resumes it)")
  write_json(path, mine)


def swept_options(sweep_dir: Path, cell: list[str]) -> list[str]:
  """The cell's overrides ('key=value') of the options its sweep sweeps (sweep.json's
  overrides with several values: a,b, range(...), glob(...)); [] if that is not known."""
  try:
    lines = json.loads((sweep_dir / SWEEP_FILE).read_text())["overrides"]
    keys = {o.get_key_element() for o in OverridesParser.create().parse_overrides(lines)
            if o.is_sweep_override()}
  except Exception:  # noqa: BLE001 - an unreadable record names nothing; the run still runs
    return []
  return [o for o in cell if o.partition("=")[0] in keys]


def app_name(config: Any) -> str:
  """The app of the sweep ('simulate' for python -m dp_jax.simulate)."""
  try:
    return str(config.hydra.job.name).rsplit(".", 1)[-1]
  except Exception:  # noqa: BLE001
    return ""


def sweep_cells(sweep_dir: Path) -> list[dict[str, Any]]:
  """Every cell folder's status.json (cell order), with its overrides joined as `cell`."""
  out = []
  folders = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]
  for folder in sorted(folders, key=lambda p: int(p.name)):
    status = cell_status(folder)
    try:
      config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
      config = {}
    out.append({**identity(config), **status, "overrides": status.get("overrides", []),
                "folder": folder.name, "status": str(status.get("status")),
                "error": str(status.get("error") or "")})
  common = set.intersection(*(set(c["overrides"]) for c in out)) if len(out) > 1 else set()
  for c in out:  # a cell is named by the overrides that differ between cells
    c["cell"] = " ".join(o for o in c["overrides"] if o not in common) or c["folder"]
  return out


def identity(config: dict[str, Any]) -> dict[str, Any]:
  """model, cluster, G, B, A of a cell's resolved config (config.json)."""
  model, cluster = config.get("model") or {}, config.get("cluster") or {}
  planner, runtime = config.get("planner") or {}, config.get("runtime") or {}
  g = cluster.get("num_devices") or runtime.get("num_devices")
  if g is None and cluster.get("devices_per_node"):
    g = int(cluster.get("num_nodes") or 1) * int(cluster["devices_per_node"])
  keys = dict(model=model.get("name"), cluster=cluster.get("name"), num_devices=g,
              global_batch=config.get("batch_size"),
              amplification_limit=_limit(planner))
  plan = plan_file_json(config.get("plan"))  # a job given a plan runs what the plan says
  keys.update({k: plan[k] for k in ("cluster", "num_devices", "global_batch") if k in plan})
  if "amplification_limit" in plan:
    keys["amplification_limit"] = _limit(plan)
  return {k: v for k, v in keys.items() if v is not None}


def _limit(record: dict[str, Any]) -> float | None:
  """The amplification limit of a config or plan: strict JSON records inf (no limit) as null."""
  if "amplification_limit" not in record:
    return None
  a = record["amplification_limit"]
  return math.inf if a is None else a


def sweep_table(cells: list[dict[str, Any]], app: str) -> tuple[list[str], list[list[Any]]]:
  """(columns, rows): cell, status, the identity and metric columns any cell has, error."""
  wanted = IDENTITY + METRICS.get(app, [m for ms in METRICS.values() for m in ms])
  seen, keys = set(), []
  for key, label in wanted:
    if label not in seen and any(c.get(key) is not None for c in cells):
      seen.add(label)
      keys.append((key, label))
  has_error = any(c["error"] for c in cells)
  columns = BASE + [label for _, label in keys] + (["error"] if has_error else [])
  rows = []
  for c in cells:
    row = [c["cell"], c["status"]] + [_value(c.get(k)) for k, _ in keys]
    rows.append(row + ([c["error"]] if has_error else []))
  return columns, rows


def _value(v: Any) -> Any:
  if isinstance(v, float):
    return round(v, 4) if math.isfinite(v) else str(v)
  return "" if v is None else v


def write_tables(sweep_dir: Path, columns: list[str], rows: list[list[Any]]) -> None:
  """sweep_summary.csv and sweep_summary.md in the sweep folder."""
  with (sweep_dir / CSV_FILE).open("w", newline="") as f:
    w = csv.writer(f)
    w.writerow(columns)
    w.writerows(rows)
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |" for r in rows]
  (sweep_dir / MARKDOWN_FILE).write_text("\n".join(lines) + "\n")


def print_sweep_summary(columns: list[str], rows: list[list[Any]], sweep_dir: Path,
                        failed: int) -> None:
  from rich.console import Console  # rich: only to print (its import is not free)

  Console(width=200).print(table(f"sweep {sweep_dir}: {len(rows) - failed} ok, {failed} failed "
                                 f"({CSV_FILE}, {MARKDOWN_FILE})", columns, rows,
                                 left=columns))
