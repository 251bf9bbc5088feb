"""The plan app's whole-process time as a multiple of `python -c "import jax"`, measured in one run.

    python scripts/bench_app_start.py [--pairs 7] [--cmd "model=vgg16 logger=disabled" ...]

Runs the plan app (`python -m dp_jax.plan <overrides>`, default `model=vgg16 logger=disabled`
with its PNG chart, as a user runs it; then chart=false and chart_pdf=true) and `python -c
"import jax"` in turn, A B A B ..., after one warm-up of each (it fills the graph cache in the
scratch folder the runs share), and takes the ratio A / B pair by pair, so a machine whose speed
drifts moves both sides of each ratio alike. Prints, per command, the median ratio of wall time
and of CPU time (user + system of the finished process and its children), with the range over
the pairs, against a 2x target. A ratio, not an absolute time: it is
what carries from one machine to another. Measured, on this machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 2.0  # the plan app within this many `import jax`
DEFAULT = ("model=vgg16 logger=disabled", "model=vgg16 logger=disabled chart=false",
           "model=vgg16 logger=disabled chart_pdf=true")
ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
  """(wall s, CPU s) of one process run to its end (output discarded; a failure raises)."""
  env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        text=True)
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if done.returncode != 0:
    tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
    raise SystemExit(f"error: {shlex.join(cmd)} exited {done.returncode}: {tail[0]}")
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return wall, cpu


def paired(app: list[str], base: list[str], pairs: int, cwd: Path) -> dict[str, list[float]]:
  """Per pair, app / base of wall and of CPU time, the two run in turn after a warm-up each."""
  timed(app, cwd)
  timed(base, cwd)
  out: dict[str, list[float]] = {"wall": [], "cpu": []}
  for _ in range(pairs):
    a, b = timed(app, cwd), timed(base, cwd)
    out["wall"].append(a[0] / b[0])
    out["cpu"].append(a[1] / b[1])
  return out


def line(ratios: list[float]) -> str:
  """'1.62x [1.51-1.80]': the median over the pairs and the range."""
  return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def app_ratio(overrides: str, pairs: int, cwd: Path) -> dict[str, list[float]]:
  """The plan app with `overrides` (one string, split as a shell does) against import jax."""
  app = [sys.executable, "-m", "dp_jax.plan", *shlex.split(overrides)]
  return paired(app, [sys.executable, "-c", "import jax"], pairs, cwd)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=7, help="A B pairs per command (default 7)")
  parser.add_argument("--cmd", action="append", metavar="OVERRIDES",
                      help="the plan app's overrides, one string (repeatable; default: "
                           + "; ".join(DEFAULT) + ")")
  args = parser.parse_args(argv)
  if args.pairs < 1:
    parser.error("--pairs must be >= 1")
  print(f"plan app / python -c 'import jax', whole process, median over {args.pairs} pairs run "
        f"in turn [range]; target <= {TARGET:g}x on CPU time (measured, this machine)")
  with tempfile.TemporaryDirectory() as tmp:
    for overrides in args.cmd or DEFAULT:
      r = app_ratio(overrides, args.pairs, Path(tmp))
      verdict = "within" if statistics.median(r["cpu"]) <= TARGET else "over"
      print(f"  {overrides}: cpu {line(r['cpu'])}, wall {line(r['wall'])} ({verdict} "
            f"{TARGET:g}x)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
