"""ProfileTable: per layer x per-device batch -> forward and backward milliseconds."""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import read_json, write_json

PROFILE_SCHEMA = "dp_jax.profile/1"
SOURCES = ("measured", "analytic", "calibrated", "imported")
log = logging.getLogger(__name__)


class MissingProfileError(UserError):
  """A layer has no timing at all in the table."""


@dataclass(frozen=True)
class LayerTiming:
  """Forward and backward time of one layer at one per-device batch."""

  fwd_ms: float
  bwd_ms: float
  interpolated: bool = False

  @property
  def total_ms(self) -> float:
    return self.fwd_ms + self.bwd_ms


@dataclass(frozen=True)
class ProfileTable:
  """Timings per layer name and per-device batch, with where they came from."""

  model: str
  device: str
  dtype: str
  source: str  # one of SOURCES
  layers: Mapping[str, Mapping[int, tuple[float, float]]]  # name -> batch -> (fwd_ms, bwd_ms)
  meta: Mapping[str, Any] = field(default_factory=dict)

  def __post_init__(self):
    if self.source not in SOURCES:
      raise UserError(f"profile source '{self.source}' is unknown (valid: {', '.join(SOURCES)})")
    for name, rows in self.layers.items():
      for b, (f, w) in rows.items():
        if b < 1 or not (math.isfinite(f) and math.isfinite(w)) or f < 0 or w < 0:
          raise UserError(f"profile of {self.model}: layer '{name}' at batch {b} has an invalid "
                          f"timing ({f}, {w}); times must be finite and >= 0, batches >= 1")

  def batches(self, layer: str) -> list[int]:
    return sorted(self.layers.get(layer, {}))

  def lookup(self, layer: str, batch: int) -> LayerTiming:
    """Timing at `batch`; between or beyond profiled batches, log-log interpolation (logged)."""
    rows = self.layers.get(layer)
    if not rows:
      raise MissingProfileError(
          f"profile of {self.model} on {self.device} has no timing for layer '{layer}'; "
          "profile it (python -m dp_jax.profile) or pass a profile that covers it")
    if batch in rows:
      f, w = rows[batch]
      return LayerTiming(f, w)
    if batch < 1:
      raise UserError(f"per-device batch must be >= 1, got {batch}")
    bs = sorted(rows)
    if len(bs) == 1:
      # One point: scale linearly with batch (the conservative choice: no batching gain).
      f, w = rows[bs[0]]
      s = batch / bs[0]
      timing = LayerTiming(f * s, w * s, interpolated=True)
    else:
      i = bisect.bisect_left(bs, batch)
      j = min(max(i, 1), len(bs) - 1)  # nearest pair; the end pairs extrapolate
      lo, hi = bs[j - 1], bs[j]
      timing = LayerTiming(_loglog(batch, lo, hi, rows[lo][0], rows[hi][0]),
                           _loglog(batch, lo, hi, rows[lo][1], rows[hi][1]), interpolated=True)
    log.debug("profile: %s at batch %d interpolated from batches %s", layer, batch, bs)
    return timing

  def iteration_ms(self, batch: int, layers: list[str] | None = None) -> float:
    """Sum of forward+backward over layers at one per-device batch."""
    names = layers if layers is not None else list(self.layers)
    return sum(self.lookup(n, batch).total_ms for n in names)

  def missing(self, layers: list[str]) -> list[str]:
    return [n for n in layers if not self.layers.get(n)]

  # --- JSON ------------------------------------------------------------------------------

  def to_json(self) -> dict[str, Any]:
    return {
        "schema": PROFILE_SCHEMA, "model": self.model, "device": self.device,
        "dtype": self.dtype, "source": self.source, "meta": dict(self.meta),
        "layers": {name: {str(b): {"fwd_ms": f, "bwd_ms": w} for b, (f, w) in sorted(rows.items())}
                   for name, rows in self.layers.items()},
    }

  @classmethod
  def from_json(cls, d: Any, where: str = "profile") -> ProfileTable:
    if not isinstance(d, dict):
      raise UserError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for key, typ in (("model", str), ("device", str), ("dtype", str), ("source", str),
                     ("layers", dict)):
      if key not in d:
        raise UserError(f"{where}: missing required field '{key}'")
      if not isinstance(d[key], typ):
        raise UserError(f"{where}: field '{key}' has type {type(d[key]).__name__}, "
                        f"expected {typ.__name__}")
    if d.get("schema", PROFILE_SCHEMA) != PROFILE_SCHEMA:
      raise UserError(f"{where}: schema '{d['schema']}' is not supported "
                      f"(expected '{PROFILE_SCHEMA}')")
    layers: dict[str, dict[int, tuple[float, float]]] = {}
    for name, rows in d["layers"].items():
      if not isinstance(rows, dict):
        raise UserError(f"{where}: layer '{name}' must map batch -> timing, "
                        f"got {type(rows).__name__}")
      out: dict[int, tuple[float, float]] = {}
      for b, t in rows.items():
        try:
          batch = int(b)
        except ValueError:
          raise UserError(f"{where}: layer '{name}' has batch key '{b}', not an integer") from None
        if batch < 1:
          raise UserError(f"{where}: layer '{name}' has batch key '{b}'; per-device batches "
                          "are >= 1")
        if batch in out:
          raise UserError(f"{where}: layer '{name}' has two timings for batch {batch} (keys "
                          f"'{b}' and another); keep one per batch")
        if not isinstance(t, dict):
          raise UserError(f"{where}: layer '{name}' batch {b}: timing must be an object "
                          "with fwd_ms and bwd_ms")
        for k in ("fwd_ms", "bwd_ms"):
          if k not in t:
            raise UserError(f"{where}: layer '{name}' batch {b} is missing field '{k}'")
          if isinstance(t[k], bool) or not isinstance(t[k], (int, float)):
            raise UserError(f"{where}: layer '{name}' batch {b} field '{k}' has type "
                            f"{type(t[k]).__name__}, expected a number")
          if not (math.isfinite(t[k]) and t[k] > 0):
            raise UserError(f"{where}: layer '{name}' batch {b} field '{k}' is {t[k]!r}; times "
                            "must be finite and > 0 ms")
        out[batch] = (float(t["fwd_ms"]), float(t["bwd_ms"]))
      layers[name] = out
    return cls(model=d["model"], device=d["device"], dtype=d["dtype"], source=d["source"],
               layers=layers, meta=dict(d.get("meta", {})))

  def save(self, path: str | Path) -> Path:
    return write_json(path, self.to_json())

  @classmethod
  def load(cls, path: str | Path) -> ProfileTable:
    return cls.from_json(read_json(path, "profile"), where=str(path))


def _loglog(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
  """Interpolate (or extrapolate) y at x on a log-log line through two points."""
  if y0 <= 0 or y1 <= 0:
    # Zero times cannot be placed on a log scale: interpolate linearly instead.
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))
  t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
  return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
