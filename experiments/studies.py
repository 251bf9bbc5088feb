"""The studies by name: python -m experiments.studies <study> prints the app that sweeps it."""

from __future__ import annotations

import importlib
import sys

from dp_jax.base.errors import UserError
from experiments.aggregate import Study

NAMES = ("strong_scaling", "amplification", "cluster_throughput", "network", "runtime",
         "time_to_accuracy", "validation", "weight_sharding", "where_burst_pays")


def study(name: str) -> Study:
  """The Study of experiments/<name>.py."""
  if name not in NAMES:
    raise UserError(f"unknown study '{name}' (valid studies: {', '.join(NAMES)})")
  return importlib.import_module(f"experiments.{name}").STUDY


def main(argv: list[str]) -> int:
  """Print the app of the study named in argv (for scripts/reproduce.sh)."""
  try:
    if len(argv) != 1:
      raise UserError(f"usage: python -m experiments.studies <study> ({', '.join(NAMES)})")
    print(study(argv[0]).app)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
