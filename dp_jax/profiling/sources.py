"""Profile from config (analytic / deeppool_a100 / measure / file): the one place apps get costs."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.profiling.table import ProfileTable

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]


def divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def profile_batches(global_batch: int, *extra: int) -> list[int]:
  """Per-device batches a plan can use (B / d for every divisor d of B), plus `extra`."""
  return sorted({global_batch // d for d in divisors(global_batch)} | {int(e) for e in extra})


def _source(cfg: Any) -> str:
  value = cfg.get("source", "analytic")
  return str(getattr(value, "value", value))


def data_dir(path: str | None) -> str | None:
  """The A100 table folder: as given, else relative to the repository (apps run anywhere)."""
  if not path:
    return None
  p = Path(path)
  if p.is_dir() or p.is_absolute():
    return str(p)
  return str(REPO / p) if (REPO / p).is_dir() else str(p)


def warn_filled(model: str, filled: list[str]) -> None:
  """One warning naming the layers the A100 tables lack (filled from the analytic model)."""
  if filled:
    log.warning("DeepPool A100 tables lack %d layer(s) of %s, estimated from the analytic model "
                "calibrated on the matched rows: %s", len(filled), model, ", ".join(filled))


def load_profile(cfg: Any, graph: LayerGraph, device: str, batches: list[int],
                 model_cfg: Any = None) -> ProfileTable:
  """The ProfileTable the profile config names, for `graph` at per-device `batches`
  (`device`: the analytic profile's device unless profile.device names one)."""
  return _load(cfg, graph, device, batches, model_cfg)


def check_device(table: ProfileTable, device: str, cfg: Any) -> ProfileTable:
  """`table` if it is a profile of the cluster's `device`; else a one-line UserError naming
  both, unless profile.allow_other_device (then recorded in the table's meta, and so in the
  plan's `profile.other_device`). Used where a profile prices a cluster (workflow)."""
  allow, source = bool(cfg.get("allow_other_device", False)), _source(cfg)
  if table.device == device:
    return table
  if not allow:
    raise UserError(f"profile {source} is of {table.device} devices but the cluster has "
                    f"{device}; use a profile of {device} (e.g. profile=analytic) or pass "
                    "profile.allow_other_device=true to plan with it on purpose (recorded in "
                    "the plan)")
  log.warning("planning %s devices with a profile of %s (profile.allow_other_device=true)",
              device, table.device)
  other = {"profile_device": table.device, "cluster_device": device, "accepted": True}
  return dataclasses.replace(table, meta={**table.meta, "other_device": other})


def _load(cfg: Any, graph: LayerGraph, device: str, batches: list[int],
          model_cfg: Any = None) -> ProfileTable:
  source = _source(cfg)
  if source == "analytic":
    from dp_jax.profiling.analytic import analytic_profile

    return analytic_profile(graph, cfg.get("device") or device, cfg.get("dtype", "bfloat16"),
                            cfg.get("batches") or batches)
  if source == "calibrated":
    from dp_jax.profiling.calibrated import DEFAULT_DTYPE, calibrated_profile

    return calibrated_profile(graph, cfg.get("device") or device,
                              cfg.get("dtype") or DEFAULT_DTYPE, cfg.get("batches") or batches)
  if source == "deeppool_a100":
    from dp_jax.profiling.deeppool_import import import_deeppool_a100

    table, report = import_deeppool_a100(graph, data_dir(cfg.get("data_dir")))
    warn_filled(graph.model, report.filled)
    if report.estimated:
      log.info("backward estimated from forward for: %s", ", ".join(report.estimated))
    return table
  if source == "file":
    if not cfg.get("path"):
      raise UserError("profile.source=file needs profile.path=<profile.json>")
    table = ProfileTable.load(cfg.path)
    if table.model != graph.model:
      raise UserError(f"profile file {cfg.path} is for {table.model}, not {graph.model}; pass "
                      f"a profile of {graph.model}")
    return table
  if source == "measure":
    from dp_jax.models import zoo
    from dp_jax.profiling.measure import measure_profile

    if model_cfg is None:
      raise UserError("profile.source=measure needs a zoo model config to build the layers")
    return measure_profile(zoo.build(model_cfg), graph, cfg.get("batches") or batches,
                           cache_dir=cfg.get("cache_dir", ".cache/dp_jax/profiles"),
                           repeats=cfg.get("repeats", 5), warmup=cfg.get("warmup", 2))
  raise UserError(f"profile source '{source}' is unknown (valid: calibrated, analytic, "
                  "deeppool_a100, measure, file)")
