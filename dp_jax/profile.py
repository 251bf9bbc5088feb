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

from omegaconf import MISSING

from dp_jax.base.rules import check
from dp_jax.cli.hydra_app import hydra_app, run_app_module
from dp_jax.cli.schema import ClusterConfig, LoggerConfig, ModelConfig, ProfileConfig
from dp_jax.hardware.cluster import job_from_config
from dp_jax.layer_times.deeppool_import import import_deeppool_a100
from dp_jax.layer_times.sources import ProfileOptions, data_dir, warn_filled
from dp_jax.measurement import profiles
from dp_jax.models.zoo import ModelSpec
from dp_jax.report import tables
from dp_jax.tracking.run import Run


@dataclass
class ProfileAppConfig:
  """python -m dp_jax.profile: measure, model or import a model's per-layer costs."""

  model: ModelConfig = MISSING
  cluster: ClusterConfig = MISSING  # the analytic source models the cluster's device
  profile: ProfileConfig = field(default_factory=ProfileConfig)
  logger: LoggerConfig = field(default_factory=LoggerConfig)
  batch_size: int = 32  # per-device batches 1, 2, 4, ... up to this (profile.batches overrides)
  out: str | None = None  # default <output dir>/profile.json
  seed: int = 0


def profile_batches(options: ProfileOptions, batch_size: int) -> list[int]:
  """profile.batches if given, else powers of two up to batch_size (and batch_size itself)."""
  if options.batches:
    return sorted(set(options.batches))
  check("batch_size", batch_size)
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


@dataclass(frozen=True)
class ProfileInputs:
  """The profile app's config, typed and checked (decode)."""

  device: str  # the cluster's device (the analytic profile's)
  model: ModelSpec
  options: ProfileOptions
  batches: list[int]
  out: Path | None
  seed: int


def decode(cfg: ProfileAppConfig) -> ProfileInputs:
  """The config's groups as typed options, every value checked, before any work."""
  cluster, _ = job_from_config(cfg.cluster)
  options = ProfileOptions.from_config(cfg.profile)
  return ProfileInputs(cluster.device, ModelSpec.from_config(cfg.model), options,
                       profile_batches(options, cfg.batch_size),
                       Path(cfg.out) if cfg.out else None, cfg.seed)


def profile_task(cfg: ProfileAppConfig, run: Run) -> dict[str, Any]:
  """Build the profile the config names, print it, write its JSON, log it."""
  from rich.console import Console  # rich: only to print (its import is not free)

  inputs = decode(cfg)
  model, options, batches = inputs.model, inputs.options, inputs.batches
  out = inputs.out or run.output_dir / "profile.json"
  graph = model.graph(inputs.seed)
  start = time.perf_counter()
  report = None
  if options.source == "deeppool_a100":  # the import's report is printed below
    table, report = import_deeppool_a100(graph, data_dir(options.data_dir))
    warn_filled(graph.model, report.filled)
  else:
    table = profiles.load(options, graph, inputs.device, batches, model)
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
