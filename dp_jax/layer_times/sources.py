"""Where a plan's per-layer costs come from (calibrated / analytic / deeppool_a100 / measure /
file), as typed options, and the one place a ProfileTable is made from them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dp_jax.base.checks import Checked, ConfigError, option
from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.layer_times.calibrated import DEFAULT_DTYPE, calibrated_profile
from dp_jax.layer_times.deeppool_import import import_deeppool_a100
from dp_jax.layer_times.table import ProfileTable

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
SOURCES = ("calibrated", "analytic", "deeppool_a100", "measure", "file")


@dataclass(frozen=True)
class ProfileConfig(Checked):
  """The profile group (conf/profile/): where a plan's per-layer costs come from.

  source: calibrated (the roofline of the cluster's GPU fitted on published throughput; the
  default on GPU clusters), analytic (the plain roofline), deeppool_a100 (DeepPool's measured
  A100 tables), measure (each layer timed on this machine, cached in cache_dir) or file (a
  profile JSON at `path`); device: the roofline's device (None: the cluster's); dtype: the
  roofline's precision (None: the source's default); batches: per-device batches to profile
  (None: every one a plan of B can use); max_batch, repeats, warmup: measure's; data_dir:
  other A100 tables (None: the shipped ones); allow_other_device: a profile of another device
  than the cluster's is accepted (and recorded in the plan) instead of refused;
  accept_vector_rate: layers a roofline may price at the vector rate although the graph does
  not say how much of their work is matrix products (a graph file without traced work, a kind no
  formula knows): refused otherwise, so that no layer is priced by its label.
  """

  GROUP = "profile"

  source: str = option("calibrated", choices=SOURCES)
  path: str | None = None  # for source=file
  device: str | None = None
  dtype: str | None = None
  batches: tuple[int, ...] | None = option(None, low=1, integer=True, each=True)
  max_batch: int | None = option(None, low=1, integer=True)
  repeats: int = option(5, low=1, integer=True)
  warmup: int = option(2, low=0, integer=True)
  cache_dir: str = ".cache/dp_jax/profiles"
  data_dir: str | None = None
  allow_other_device: bool = False
  accept_vector_rate: tuple[str, ...] = ()

  def check(self) -> None:
    if self.source == "file" and not self.path:
      raise ConfigError("path", " is needed by profile.source=file: profile.path=<profile.json>"
                        " (or simply profile=<profile.json>)")

  def load(self, graph: LayerGraph, device: str, batches: Sequence[int]) -> ProfileTable:
    """The ProfileTable of `graph` at per-device `batches` (`device`: the cluster's)."""
    batches = list(self.batches or batches)
    if self.source == "analytic":
      return analytic_profile(graph, self.device or device, self.dtype or "bfloat16", batches,
                              accept=frozenset(self.accept_vector_rate))
    if self.source == "calibrated":
      return calibrated_profile(graph, self.device or device, self.dtype or DEFAULT_DTYPE,
                                batches, accept=frozenset(self.accept_vector_rate))
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
