"""A background job as the apps name it (the background group, typed and checked once): which
model, at which per-device batch, under which slowdown cap, and what a failure does. No JAX."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.base.rules import check
from dp_jax.models.zoo import ModelSpec

ON_FAILURE = ("fail", "continue")  # a failed job fails the run / the run finishes regardless


@dataclass(frozen=True)
class BackgroundSpec:
  """The job the devices a plan leaves idle run: `model` (None: the foreground's own model, as
  `same_family`), `batch_per_device` samples per device, the foreground's `slowdown_cap` (0.1:
  at most 10% slower; inf: no cap) and `on_failure`. name 'none': no background job."""

  name: str = "none"
  model: ModelSpec | None = None
  batch_per_device: int = 8
  slowdown_cap: float = 0.1
  on_failure: str = "fail"

  def __post_init__(self):
    check("background.batch_per_device", self.batch_per_device)
    check("background.slowdown_cap", self.slowdown_cap)
    if self.on_failure not in ON_FAILURE:
      raise UserError(f"background.on_failure={self.on_failure} must be one of "
                      f"{', '.join(ON_FAILURE)}")

  @property
  def active(self) -> bool:
    """Whether a job runs at all (background=none: no)."""
    return self.name != "none"

  @property
  def cap(self) -> float:
    return float(self.slowdown_cap)

  @classmethod
  def from_config(cls, cfg: Any) -> BackgroundSpec:
    """The background group of a config (a DictConfig or a mapping; None: no job)."""
    if cfg is None:
      return cls()
    model = cfg.get("model")
    return cls(name=str(cfg.get("name", "none")),
               model=None if model is None else ModelSpec.from_config(model),
               batch_per_device=cfg.get("batch_per_device", 8),
               slowdown_cap=cfg.get("slowdown_cap", 0.1),
               on_failure=str(cfg.get("on_failure", "fail")))

  def model_for(self, foreground: ModelSpec) -> ModelSpec:
    """The job's model: its own, or the foreground's."""
    return self.model or foreground

  def to_json(self) -> dict[str, Any]:
    """Plain JSON (it travels to pinned processes; from_json reads it back)."""
    cap = None if math.isinf(self.slowdown_cap) else self.slowdown_cap
    return {"name": self.name, "model": None if self.model is None else self.model.to_json(),
            "batch_per_device": self.batch_per_device, "slowdown_cap": cap,
            "on_failure": self.on_failure}

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> BackgroundSpec:
    cap = d.get("slowdown_cap")
    return cls(name=d["name"], model=None if d.get("model") is None else ModelSpec.from_json(
        d["model"]), batch_per_device=d["batch_per_device"],
               slowdown_cap=math.inf if cap is None else cap, on_failure=d["on_failure"])
