"""The runtime's config groups (no JAX at import: the train app reads them before it sets the
host device count): the optimizer, the training data, and the runtime's devices and files."""

from __future__ import annotations

from dataclasses import dataclass, field

from dp_jax.base.checks import Checked, option
from dp_jax.runtime.distributed import DistributedConfig


@dataclass(frozen=True)
class OptimizerConfig(Checked):
  """The optimizer group: an element-wise optax optimizer (applied per stage, so no
  global-norm transforms): sgd (with momentum), adam or adamw (momentum: their b1;
  weight_decay: adamw only)."""

  GROUP = "optimizer"

  name: str = option("sgd", choices=("sgd", "adam", "adamw"))
  lr: float = option(0.01, low=0, low_open=True)
  momentum: float = option(0.9, low=0, high=1, high_open=True)
  weight_decay: float = option(0.0, low=0)

  def build(self):
    """The optax optimizer."""
    import optax  # JAX: only when a run trains

    if self.name == "sgd":
      return optax.sgd(self.lr, momentum=self.momentum or None)
    if self.name == "adam":
      return optax.adam(self.lr, b1=self.momentum)
    return optax.adamw(self.lr, b1=self.momentum, weight_decay=self.weight_decay)


@dataclass(frozen=True)
class DataConfig(Checked):
  """The data group: synthetic (seeded), an .npz with x and y, or a class-per-folder tree
  (docs/extending.md, "Data")."""

  GROUP = "data"

  source: str = option("synthetic", choices=("synthetic", "npz", "folder"))
  path: str | None = None
  seed: int = 0


@dataclass(frozen=True)
class RuntimeConfig(Checked):
  """The runtime group: devices, checkpoints and progress display.

  num_devices: None: every device (on a CPU cluster its G host devices; with a background job
  on CPU: one per core); on CPU also the host device count. checkpoint_every: steps between
  checkpoints (0: only at the end).
  share_cores: with a background job on CPU the job runs as one pinned process per device (an
  idle device is then an idle core and the slowdown cap holds); true: one process whose
  devices share the cores (exact, but the cap does not hold: for exactness tests).
  """

  GROUP = "runtime"

  num_devices: int | None = option(None, low=1, integer=True)
  checkpoint_every: int = option(50, low=0, integer=True)
  progress: bool = True
  share_cores: bool = False
  distributed: DistributedConfig = field(default_factory=DistributedConfig)
