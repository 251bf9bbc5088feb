"""A study's multirun folder -> CSV, timing CSV, README.md, figures (PNG + PDF), provenance.

Before aggregating, the sweep is checked against the study: a sweep none of whose finished
cells has the study's results fails with one line; cells missing from the sweep's own grid or
from the study's grid (conf/experiment/<study>.yaml) are warned about by name and listed in
the README.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dp_jax.base.errors import UserError
from dp_jax.tracking import sweep_rows as aggregate
from experiments import fields

HEAD = ("job", "cell", "status")
OVERLAYS = Path(__file__).resolve().parents[1] / "conf" / "experiment"
TAIL = ("seed", "git_sha", "git_dirty", "error")
Row = dict[str, Any]


@dataclass(frozen=True)
class Study:
  """What a study sweeps (its app and overlay) and how its cells become columns and figures."""

  name: str
  app: str
  doc: str
  columns: tuple[str, ...]  # deterministic result columns, between HEAD and TAIL
  timing: tuple[str, ...]  # wall-clock columns: only in <name>_timing.csv
  derive: Callable[[Row], Row]  # one cell (summary + "config") -> its result columns
  figures: Callable[[list[Row], Path], list[Path]]
  headline: Callable[[list[Row]], str]  # markdown
  finish: Callable[[list[Row]], list[Row]] = list  # columns that need the whole table
  kind: str = "predicted"  # what its numbers are: predicted, simulated, measured (or a mix)
  fits: tuple[str, ...] = ()  # summary keys every finished cell of the study's app has
  lead: Callable[[list[Row]], str] | None = None  # markdown right under the title: the answer

  @property
  def csv_columns(self) -> list[str]:
    """Every column of <name>.csv, in order."""
    return [*HEAD, *self.columns, *TAIL]


def read_json(path: Path) -> dict[str, Any]:
  """A JSON object from `path`, or {} when the file is missing."""
  return json.loads(path.read_text()) if path.is_file() else {}


def cell_overrides(job_dir: Path, status: dict[str, Any]) -> list[str]:
  """The cell's own overrides (the study's +experiment=... left out)."""
  hydra_file = job_dir / ".hydra" / "overrides.yaml"
  if hydra_file.is_file():
    overrides = yaml.safe_load(hydra_file.read_text()) or []
  else:
    overrides = status.get("overrides") or []
  return [o for o in overrides if not o.lstrip("+~").startswith("experiment=")]


def cells(sweep_dir: str | Path) -> list[Row]:
  """Every cell of a sweep: status.json, config.json ("config"), its folder ("dir"), provenance."""
  sweep_dir = Path(sweep_dir)
  rows = []
  for base in aggregate.collect(sweep_dir):
    job_dir = sweep_dir / str(base["job"])
    status = read_json(job_dir / "status.json")
    cfg = read_json(job_dir / "config.json")
    prov = read_json(job_dir / "provenance.json")
    rows.append({**base, "config": cfg, "dir": job_dir,
                 "cell": " ".join(cell_overrides(job_dir, status)),
                 "seed": cfg.get("seed"), "git_sha": prov.get("git_sha"),
                 "git_dirty": prov.get("git_dirty")})
  if not rows:
    raise UserError(f"no cells in {sweep_dir}: expected numbered job folders of a Hydra multirun")
  return rows


def table_rows(study: Study, raw: Sequence[Row]) -> list[Row]:
  """The study's rows: HEAD, derived columns (failed cells: what their config says), TAIL."""
  return study.finish([{**{k: r.get(k) for k in (*HEAD, *TAIL)}, **study.derive(r),
                        **{k: r.get(k) for k in study.timing}} for r in raw])


def ok(rows: Sequence[Row]) -> list[Row]:
  """The cells that finished."""
  return [r for r in rows if r.get("status") == "ok"]


def failed_section(rows: Sequence[Row]) -> str:
  """Markdown list of the failed cells with their one-line errors; first, for cells the memory
  model refused, what they need (read from the error) against what a device has."""
  bad = [r for r in rows if r.get("status") != "ok"]
  if not bad:
    return "## Failed cells\n\nnone\n"
  needs = Counter(f"{cell_name(r)}: needs {need[0]:g} GB per device in the memory model, over "
                  f"the {need[1]:g} GB a device has"
                  for r in bad if (need := fields.memory_need(r.get("error"))))
  memory = "".join(f"- {line}{f' ({n} cells)' if n > 1 else ''}\n" for line, n in needs.items())
  return ("## Failed cells\n\n" + (f"{memory}\n" if memory else "")
          + aggregate.markdown_table(bad, ["job", "cell", "error"]))


def cell_name(row: Row) -> str:
  """'gpt2_small G=1 B=32 on dgx_a100' from a row's identity columns, else its overrides."""
  if row.get("model") is None or row.get("num_devices") is None:
    return str(row.get("cell"))
  where = f" on {row['cluster']}" if row.get("cluster") else ""
  return f"{row['model']} G={row['num_devices']} B={row.get('global_batch')}{where}"


def sweep_provenance(study: Study, sweep_dir: Path, rows: Sequence[Row]) -> dict[str, Any]:
  """Where the numbers come from: sweep folder, commits, packages and the sweep's wall time."""
  first = read_json(sweep_dir / str(rows[0]["job"]) / "provenance.json")
  stamps = [p.stat().st_mtime for p in sweep_dir.glob("*/status.json")]
  start = sweep_dir / "multirun.yaml"
  wall = max(stamps) - start.stat().st_mtime if stamps and start.is_file() else None
  return {"study": study.name, "app": study.app, "sweep_dir": str(sweep_dir),
          "cells": len(rows), "ok": len(ok(rows)), "failed": len(rows) - len(ok(rows)),
          "git_shas": sorted({str(r.get("git_sha")) for r in rows}),
          "git_dirty": any(bool(r.get("git_dirty")) for r in rows),
          "packages": first.get("packages"), "python": first.get("python"),
          "sweep_wall_s": None if wall is None else round(wall, 1)}


def markdown(study: Study, rows: Sequence[Row], prov: dict[str, Any],
             figures: Sequence[Path] = ()) -> str:
  """The study's README: what it is and how to rerun it (its docstring), what its numbers are,
  how comparisons are judged and what they rest on, headline tables, figures, missing and failed
  cells."""
  title, _, rest = study.doc.strip().partition("\n")
  judges = any(c.endswith("_verdict") for c in study.columns)
  recorded = any(r.get("comparison_tolerance") is not None for r in rows)
  used = fields.tolerances_used(ok(rows) or rows)
  judged = ("" if not judges else
            f"Comparisons: a margin within +-{used} (`comparison.tolerance`, default the "
            "validated tolerance of the cluster's device, and on GPUs of the regime of the "
            "per-GPU batch B / G: scripts/validate_published.py) is a tie, not a win "
            "(dp_jax/report/compare.py).\n\n" if recorded else
            f"Comparisons: verdicts use +-{used} (the validated median error of the cells' "
            "device; these cells did not record a tolerance).\n\n")
  if judges and "basis" in study.columns:
    judged += f"{fields.basis_line(ok(rows))}\n\n"
  if prov.get("from_csv"):
    judged += (f"Re-rendered from `{prov['from_csv']}` (`--from-csv`), without the sweep "
               "folder: figures that need per-cell files are not redrawn.")
    judged += ("" if recorded or not judges else
               " These cells predate `comparison.tolerance`: they are judged at the default"
               + (", and their matched baseline is the earlier one (data parallelism on the "
                  "fewest devices at least as fast, no tolerance band)"
                  if "matched_data_parallel_devices" in study.columns else "")
               + f"; `scripts/reproduce.sh {study.name}` regenerates them.")
    judged += "\n\n"
  figs = "".join(f"![{p.stem}]({p.name}) ([PDF]({p.with_suffix('.pdf').name}))\n\n"
                 for p in figures)
  missing = "".join(f"- {m}\n" for m in prov.get("missing") or [])
  lead = "" if study.lead is None else study.lead(ok(rows)).strip() + "\n\n"
  return (f"# {title}\n\n{lead}{textwrap.dedent(rest).strip(chr(10))}\n\n"
          f"All numbers here are **{study.kind}**. Cells: {prov['cells']} ({prov['ok']} ok, "
          f"{prov['failed']} failed); commit {', '.join(s[:12] for s in prov['git_shas'])}"
          f"{' (uncommitted changes)' if prov['git_dirty'] else ''}. Written by "
          f"`python -m experiments.{study.name} <sweep> --out <this folder>`.\n\n{judged}"
          f"{study.headline(ok(rows))}\n"
          + (f"## Figures\n\n{figs}" if figs else "")
          + (f"## Missing cells\n\n{missing}\n" if missing else "")
          + failed_section(rows))


def check_fits(study: Study, sweep_dir: Path, raw: Sequence[Row]) -> list[str]:
  """A UserError when no finished cell has the study's results (the sweep is of another app
  or study); else one warning per finished cell that lacks them."""
  done = ok(raw)
  if not study.fits or not done:
    return []
  lacking = [r for r in done if any(r.get(k) is None for k in study.fits)]
  if len(lacking) == len(done):
    raise UserError(f"{sweep_dir} is not a {study.name} sweep: none of its {len(done)} finished "
                    f"cells has {', '.join(study.fits)} (sweep it with python -m "
                    f"dp_jax.{study.app} -m +experiment={study.name}, or aggregate it with its "
                    "own study)")
  return [f"cell {r['job']} ({r['cell']}) has no {', '.join(study.fits)}" for r in lacking]


def swept_params(path: Path) -> dict[str, list[str]]:
  """{key: values} of a Hydra sweeper's params in a YAML file (multirun.yaml or an overlay)."""
  if not path.is_file():
    return {}
  hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra") or {}
  params = {parse_key(k): str(v) for k, v in ((hydra.get("sweeper") or {}).get("params")
                                              or {}).items()}
  for text in (hydra.get("overrides") or {}).get("task") or []:  # command-line sweeps win
    key, value = aggregate.parse_override(str(text))
    if key in params or ("," in value and not value.lstrip().startswith(("[", "{"))):
      params[key] = value
  return {k: split_choices(val) for k, val in params.items()}


def split_choices(text: str) -> list[str]:
  """'[a],[a,b],c' -> ['[a]', '[a,b]', 'c']: a sweep's choices, split on commas outside brackets."""
  out, depth, start = [], 0, 0
  for i, ch in enumerate(text + ","):
    depth += (ch in "[{(") - (ch in "]})")
    if ch == "," and depth == 0:
      out.append(text[start:i].strip())
      start = i + 1
  return [v for v in out if v]


def parse_key(key: str) -> str:
  """'+experiment/shape' -> 'experiment/shape' (as cell overrides are read back)."""
  return aggregate.parse_override(f"{key}=")[0]


def cell_values(raw: Sequence[Row]) -> dict[str, set[str]]:
  """{key: the values the sweep's cells took} from each cell's own overrides."""
  seen: dict[str, set[str]] = {}
  for r in raw:
    for text in str(r.get("cell") or "").split():
      key, value = aggregate.parse_override(text)
      seen.setdefault(key, set()).add(value)
  return seen


def missing_cells(study: Study, sweep_dir: Path, raw: Sequence[Row]) -> list[str]:
  """What the sweep lacks: cells of its own grid (multirun.yaml) that left no folder, and
  values of the study's grid (conf/experiment/<study>.yaml) that no cell took."""
  out = []
  own = swept_params(sweep_dir / "multirun.yaml")
  if own:
    expected = math.prod(len(v) for v in own.values())
    if len(raw) < expected:
      out.append(f"the sweep's grid has {expected} cells, {len(raw)} found in {sweep_dir}")
  seen = cell_values(raw)
  for key, values in swept_params(OVERLAYS / f"{study.name}.yaml").items():
    lack = [v for v in values if v not in seen.get(key, set())]
    if lack:
      out.append(f"no cells with {key}={','.join(lack)} (in the study's grid, "
                 f"conf/experiment/{study.name}.yaml): the tables show '-' or leave them out")
  return out


def load(study: Study, sweep_dir: str | Path) -> tuple[list[Row], dict[str, Any]]:
  """The study's rows of a sweep and the sweep's provenance (its warnings under 'missing')."""
  sweep_dir = Path(sweep_dir)
  raw = cells(sweep_dir)
  missing = check_fits(study, sweep_dir, raw) + missing_cells(study, sweep_dir, raw)
  for line in missing:
    print(f"warning: {study.name}: {line}", file=sys.stderr)
  return table_rows(study, raw), {**sweep_provenance(study, sweep_dir, raw), "missing": missing}


TEXT_COLUMNS = ("cell", "status", "error", "git_sha", "steps_per_seed")


def parse_value(column: str, text: str) -> Any:
  """A CSV cell back to the value the aggregator wrote ('' -> None, numbers, booleans)."""
  if text == "":
    return None
  if column in TEXT_COLUMNS:
    return text
  if text in ("True", "False"):
    return text == "True"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def load_csv(study: Study, folder: str | Path) -> tuple[list[Row], dict[str, Any]]:
  """The study's rows read back from a results folder it wrote (<study>.csv, the timing CSV,
  provenance.json), re-judged by its finish step: for re-rendering the README and figures
  without the sweep folder (figures that need per-cell files are left out)."""
  folder = Path(folder)
  path = folder / f"{study.name}.csv"
  if not path.is_file():
    raise UserError(f"{path} not found: --from-csv takes a folder the {study.name} aggregator "
                    "wrote")
  with path.open() as f:
    rows = [{k: parse_value(k, v) for k, v in r.items()} for r in csv.DictReader(f)]
  if not rows:
    raise UserError(f"{path} has no rows")
  timing = folder / f"{study.name}_timing.csv"
  if timing.is_file():
    with timing.open() as f:
      by_job = {int(r["job"]): r for r in csv.DictReader(f)}
    for r in rows:
      r.update({k: parse_value(k, v) for k, v in by_job.get(r["job"], {}).items()
                if k in study.timing})
  prov = read_json(folder / "provenance.json")
  prov.setdefault("cells", len(rows))
  prov.setdefault("ok", len(ok(rows)))
  prov.setdefault("failed", len(rows) - len(ok(rows)))
  prov.setdefault("git_shas", sorted({str(r.get("git_sha")) for r in rows}))
  prov.setdefault("git_dirty", any(bool(r.get("git_dirty")) for r in rows))
  prov["from_csv"] = str(path)
  return study.finish(rows), prov


def write(study: Study, rows: list[Row], prov: dict[str, Any], out: str | Path) -> dict[str, Path]:
  """Write CSV, timing CSV (if the study has timing columns), README.md, provenance, figures."""
  out = Path(out)
  out.mkdir(parents=True, exist_ok=True)
  paths = {"csv": aggregate.write_csv(rows, out / f"{study.name}.csv", study.csv_columns)}
  if study.timing:
    paths["timing csv"] = aggregate.write_csv(rows, out / f"{study.name}_timing.csv",
                                              ["job", "cell", "status", *study.timing])
  figures = study.figures(ok(rows), out) if ok(rows) else []
  paths["markdown"] = out / "README.md"
  paths["markdown"].write_text(markdown(study, rows, prov, figures))
  paths["provenance"] = out / "provenance.json"
  paths["provenance"].write_text(json.dumps(prov, indent=1))
  for png in figures:
    paths[f"figure {png.stem}"] = png
  return paths


def main(study: Study, argv: Sequence[str] | None = None) -> int:
  """CLI: python -m experiments.<study> SWEEP_DIR [--out DIR]; prints what it wrote."""
  ap = argparse.ArgumentParser(prog=f"python -m experiments.{study.name}",
                               description=study.doc.strip().splitlines()[0])
  ap.add_argument("sweep_dir", nargs="?", help="the Hydra multirun folder (hydra.sweep.dir)")
  ap.add_argument("--from-csv", metavar="FOLDER",
                  help="re-render from a results folder this study wrote (no sweep needed)")
  ap.add_argument("--out", default=f"results/local/{study.name}",
                  help="output folder (default: %(default)s)")
  args = ap.parse_args(argv)
  try:
    if (args.sweep_dir is None) == (args.from_csv is None):
      raise UserError(f"give a sweep folder or --from-csv FOLDER (python -m "
                      f"experiments.{study.name} SWEEP_DIR [--out DIR])")
    rows, prov = (load(study, args.sweep_dir) if args.sweep_dir else
                  load_csv(study, args.from_csv))
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  paths = write(study, rows, prov, args.out)
  print_written(study, rows, prov, args.sweep_dir or args.from_csv, paths)
  return 0


def print_written(study, rows: list[Row], prov: dict[str, Any], sweep_dir: Any,
                  paths: dict[str, Any]) -> None:
  """The study's cell counts, its failed cells and the files it wrote."""
  print(f"{study.name}: {prov['cells']} cells, {prov['ok']} ok, {prov['failed']} failed "
        f"(sweep {sweep_dir}, {prov['sweep_wall_s']} s)")
  for r in rows:
    if r.get("status") != "ok":
      print(f"  failed cell {r['job']} ({r['cell']}): {r.get('error')}")
  for kind, path in paths.items():
    print(f"{kind}: {path}")

