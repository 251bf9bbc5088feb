"""Where a plan's per-layer costs come from (calibrated / analytic / deeppool_a100 / measure /
file), as typed options, and the one place a ProfileTable is made from them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.base.rules import check
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.layer_times.calibrated import DEFAULT_DTYPE, calibrated_profile
from dp_jax.layer_times.deeppool_import import import_deeppool_a100
from dp_jax.layer_times.table import ProfileTable

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
SOURCES = ("calibrated", "analytic", "deeppool_a100", "measure", "file")
DEFAULT_CACHE = ".cache/dp_jax/profiles"


@dataclass(frozen=True)
class ProfileOptions:
  """The profile group, checked: the source and what it needs.

  device: the roofline's device (None: the cluster's); dtype: the roofline's precision (None:
  the source's default); batches: per-device batches to profile (None: every one a plan of B
  can use); allow_other_device: a profile of another device than the cluster's is accepted
  (and recorded in the plan) instead of refused.
  """

  source: str = "calibrated"
  path: str | None = None
  device: str | None = None
  dtype: str | None = None
  batches: tuple[int, ...] | None = None
  max_batch: int | None = None
  repeats: int = 5
  warmup: int = 2
  cache_dir: str = DEFAULT_CACHE
  data_dir: str | None = None
  allow_other_device: bool = False

  def __post_init__(self):
    if self.source not in SOURCES:
      raise UserError(f"profile source '{self.source}' is unknown (valid: "
                      f"{', '.join(SOURCES)})")
    if self.source == "file" and not self.path:
      raise UserError("profile.source=file needs profile.path=<profile.json>")
    check("profile.repeats", self.repeats)
    check("profile.warmup", self.warmup)
    check("profile.max_batch", self.max_batch)
    if self.batches is not None:
      check("profile.batches", list(self.batches))
      object.__setattr__(self, "batches", tuple(int(b) for b in self.batches))

  @classmethod
  def from_config(cls, cfg: Any) -> ProfileOptions:
    """The profile group of a config (a DictConfig or a mapping)."""
    get = cfg.get
    source = get("source", "calibrated")
    batches = get("batches")
    return cls(source=str(getattr(source, "value", source)), path=get("path"),
               device=get("device"), dtype=get("dtype"),
               batches=None if batches is None else tuple(batches), max_batch=get("max_batch"),
               repeats=get("repeats", 5), warmup=get("warmup", 2),
               cache_dir=get("cache_dir") or DEFAULT_CACHE, data_dir=get("data_dir"),
               allow_other_device=bool(get("allow_other_device", False)))

  def load(self, graph: LayerGraph, device: str, batches: Sequence[int]) -> ProfileTable:
    """The ProfileTable of `graph` at per-device `batches` (`device`: the cluster's)."""
    batches = list(self.batches or batches)
    if self.source == "analytic":
      return analytic_profile(graph, self.device or device, self.dtype or "bfloat16", batches)
    if self.source == "calibrated":
      return calibrated_profile(graph, self.device or device, self.dtype or DEFAULT_DTYPE,
                                batches)
    if self.source == "deeppool_a100":
      table, report = import_deeppool_a100(graph, data_dir(self.data_dir))
      warn_filled(graph.model, report.filled)
      if report.estimated:
        log.info("backward estimated from forward for: %s", ", ".join(report.estimated))
      return table
    if self.source == "file":
      table = ProfileTable.load(self.path)
      if table.model != graph.model:
        raise UserError(f"profile file {self.path} is for {table.model}, not {graph.model}; "
                        f"pass a profile of {graph.model}")
      return table
    raise UserError("profile.source=measure is measured on this machine: load it through "
                    "dp_jax.measurement.profiles (the apps do)")

  def for_cluster(self, graph: LayerGraph, cluster_device: str, global_batch: int,
                  *extra_batches: int) -> ProfileTable:
    """The profile that prices a cluster of `cluster_device`: every per-device batch a plan of
    `global_batch` can use (and `extra_batches`), of the cluster's device (check_device)."""
    table = self.load(graph, cluster_device, profile_batches(global_batch, *extra_batches))
    return self.check_device(table, cluster_device)

  def check_device(self, table: ProfileTable, device: str) -> ProfileTable:
    """`table` if it is a profile of the cluster's `device`; else a one-line UserError naming
    both, unless allow_other_device (then recorded in the table's meta, and so in the plan's
    `profile.other_device`)."""
    if table.device == device:
      return table
    if not self.allow_other_device:
      raise UserError(f"profile {self.source} is of {table.device} devices but the cluster has "
                      f"{device}; use a profile of {device} (e.g. profile=analytic) or pass "
                      "profile.allow_other_device=true to plan with it on purpose (recorded in "
                      "the plan)")
    log.warning("planning %s devices with a profile of %s (profile.allow_other_device=true)",
                device, table.device)
    other = {"profile_device": table.device, "cluster_device": device, "accepted": True}
    return dataclasses.replace(table, meta={**table.meta, "other_device": other})


def divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def profile_batches(global_batch: int, *extra: int) -> list[int]:
  """Per-device batches a plan can use (B / d for every divisor d of B), plus `extra`."""
  return sorted({global_batch // d for d in divisors(global_batch)} | {int(e) for e in extra})


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
