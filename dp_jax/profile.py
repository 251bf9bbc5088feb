"""python -m dp_jax.profile: per-layer forward/backward times of a model, as profile JSON.

    python -m dp_jax.profile model=vgg16 model.image_size=32 profile=measure out=p.json
    python -m dp_jax.profile model=vgg16 profile=deeppool_a100 batch_size=32
    python -m dp_jax.profile model=resnet50 profile=analytic cluster=dgx_h100 batch_size=64
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_jax.base.checks import REQUIRED, Checked, option
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.deeppool_import import import_deeppool_a100
from dp_jax.layer_times.sources import ProfileConfig, data_dir, warn_filled
from dp_jax.measurement import profiles
from dp_jax.models.zoo import ModelConfig
from dp_jax.report import tables
from dp_jax.tracking.run import LoggerConfig, Run


@dataclass(frozen=True)
class ProfileAppConfig(Checked):
  """python -m dp_jax.profile: measure, model or import a model's per-layer costs.

  cluster: its device is the one the roofline sources model; batch_size: per-device batches
  1, 2, 4, ... up to this (profile.batches overrides); out: the profile JSON (default
  <output dir>/profile.json).
  """

  model: ModelConfig = REQUIRED
  cluster: ClusterConfig = REQUIRED
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  batch_size: int = option(32, low=1, integer=True)
  out: str | None = None
  seed: int = 0


def profile_batches(options: ProfileConfig, batch_size: int) -> list[int]:
  """profile.batches if given, else powers of two up to batch_size (and batch_size itself)."""
  if options.batches:
    return sorted(set(options.batches))
  out, b = [], 1
  while b < batch_size:
    out.append(b)
    b *= 2
  return out + [batch_size]


def summary_rows(table, layers: list[str], batches: list[int]) -> list[list[Any]]:
  """Per layer: fwd+bwd ms at each batch (interpolated cells marked with *)."""
  rows = []
  for name in layers:
    row: list[Any] = [name]
    for b in batches:
      t = table.lookup(name, b)
      row.append(f"{t.total_ms:.4f}{'*' if t.interpolated else ''}")
    rows.append(row)
  return rows


def profile_task(cfg: ProfileAppConfig, run: Run) -> dict[str, Any]:
  """Build the profile the config names, print it, write its JSON, log it."""
  from rich.console import Console  # rich: only to print (its import is not free)

  model, options, batches = cfg.model, cfg.profile, profile_batches(cfg.profile, cfg.batch_size)
  out = Path(cfg.out) if cfg.out else run.output_dir / "profile.json"
  graph = model.graph(cfg.seed)
  start = time.perf_counter()
  report = None
  if options.source == "deeppool_a100":  # the import's report is printed below
    table, report = import_deeppool_a100(graph, data_dir(options.data_dir))
    warn_filled(graph.model, report.filled)
  else:
    table = profiles.load(options, graph, cfg.cluster.device, batches, model)
  seconds = time.perf_counter() - start
  table.save(out)
  present = [n for n in graph.names if n not in table.missing(list(graph.names))]
  columns = ["layer"] + [f"b={b} ms" for b in batches]
  rows = summary_rows(table, present, batches)
  totals = ["total"] + [f"{table.iteration_ms(b, present):.3f}" for b in batches]
  rich_table = tables.table(f"{graph.model} on {table.device} ({table.source}, {table.dtype}): "
                            "forward+backward ms per layer (* interpolated)", columns, rows)
  rich_table.add_section()
  rich_table.add_row(*totals)
  Console(width=160).print(rich_table)
  run.log_table("profile", columns, rows + [totals])
  missing = table.missing(list(graph.names))
  if report is not None:
    print(f"matched {len(report.matched)} of {len(graph.names)} layers to DeepPool A100 rows; "
          f"unmatched: {', '.join(report.unmatched) or 'none'}"
          + (" (estimated from the calibrated analytic model)" if report.unmatched else ""))
  print(f"profile: {out} ({seconds:.1f} s)")
  return {"model": graph.model, "device": table.device, "source": table.source,
          "dtype": table.dtype, "layers": len(graph.names), "missing_layers": missing,
          "batches": batches, "seconds": seconds, "profile": str(out),
          **{f"iteration_ms_b{b}": float(totals[i + 1]) for i, b in enumerate(batches)}}


main = hydra_app("profile", ProfileAppConfig)(profile_task)


if __name__ == "__main__":
  run_app_module("dp_jax.profile")
