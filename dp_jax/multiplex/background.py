"""A background job as the apps name it (the background group, typed and checked once): which
model, at which per-device batch, under which slowdown cap, and what a failure does. No JAX."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dp_jax.base.checks import Checked, option
from dp_jax.models.zoo import ModelConfig

ON_FAILURE = ("fail", "continue")  # a failed job fails the run / the run finishes regardless


@dataclass(frozen=True)
class BackgroundConfig(Checked):
  """The background group (conf/background/): the job the devices a plan leaves idle run.

  name: none (no job), same_family (the foreground's own model) or a label; model: the job's
  model (None: the foreground's); batch_per_device: samples per device; slowdown_cap: how much
  slower the foreground may get (0.1: at most 10%; inf: no cap); on_failure: fail (a job that
  fails to start or dies fails the run) or continue.
  """

  GROUP = "background"

  name: str = "none"
  model: ModelConfig | None = None
  batch_per_device: int = option(8, low=1, integer=True)
  slowdown_cap: float = option(0.1, low=0, inf=True,
                               hint="0.1: the foreground may slow down by 10%; inf: no cap")
  on_failure: str = option("fail", choices=ON_FAILURE)

  @property
  def active(self) -> bool:
    """Whether a job runs at all (background=none: no)."""
    return self.name != "none"

  @property
  def cap(self) -> float:
    return float(self.slowdown_cap)

  def model_for(self, foreground: ModelConfig) -> ModelConfig:
    """The job's model: its own, or the foreground's."""
    return self.model or foreground

  def to_json(self) -> dict[str, Any]:
    """Plain JSON (it travels to pinned processes; from_json reads it back)."""
    cap = None if math.isinf(self.slowdown_cap) else self.slowdown_cap
    return {"name": self.name, "model": None if self.model is None else self.model.to_json(),
            "batch_per_device": self.batch_per_device, "slowdown_cap": cap,
            "on_failure": self.on_failure}

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> BackgroundConfig:
    cap = d.get("slowdown_cap")
    return cls(name=d["name"], model=None if d.get("model") is None else ModelConfig.from_json(
        d["model"]), batch_per_device=d["batch_per_device"],
               slowdown_cap=math.inf if cap is None else cap, on_failure=d["on_failure"])
