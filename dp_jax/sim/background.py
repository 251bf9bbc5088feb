"""Background jobs: one training step of a model at a per-device batch, cut into pieces; its memory.

A background job trains its own copy of a model on each device, independently (no gradient
sync), as DeepPool's background tasks do (one TorchScript model per GPU). Its step is the
profiled forward of every layer, then the backward in reverse. Each backward is two kernels of
equal time (input gradient and weight gradient; one for the layer reading the model input),
the convention of dp_jax/profile/analytic.py; a kernel is never split. Consecutive kernels are
merged into pieces of at most piece_ms (DeepPool: be_graph_split_ms, about 0.5 ms); a kernel
longer than that is a piece of its own. Memory is the planner's model (dp_jax/planner/memory.py)
of the job on one device: parameters, gradients, optimizer state and saved activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dp_jax.cluster import ClusterSpec
from dp_jax.errors import UserError
from dp_jax.graph import LayerGraph
from dp_jax.planner import memory
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.options import PlanOptions
from dp_jax.profile.table import ProfileTable

DEFAULT_PIECE_MS = 0.5


@dataclass(frozen=True, eq=False)
class BackgroundJob:
  """A background model's step on one device: its pieces in order and its memory."""

  model: str
  batch: int
  pieces_ms: np.ndarray
  memory_bytes: float

  @property
  def step_ms(self) -> float:
    return float(self.pieces_ms.sum())


def kernels_ms(graph: LayerGraph, profile: ProfileTable, batch: int) -> list[float]:
  """Kernel times of one training step in execution order (forward, then backward reversed)."""
  fwd, bwd = [], []
  for node in graph.nodes:
    t = profile.lookup(node.name, batch)
    fwd.append(t.fwd_ms)
    halves = 1 if not node.inputs else 2
    bwd.append([t.bwd_ms / halves] * halves)
  return fwd + [k for ks in reversed(bwd) for k in ks]


def merge_pieces(kernels: list[float], piece_ms: float) -> np.ndarray:
  """Consecutive kernels merged into pieces of at most piece_ms (a longer kernel stands alone)."""
  pieces: list[float] = []
  current = 0.0
  for k in kernels:
    if k <= 0:
      continue
    if current > 0 and current + k > piece_ms:
      pieces.append(current)
      current = 0.0
    current += k
  if current > 0:
    pieces.append(current)
  return np.array(pieces)


def background_job(graph: LayerGraph, profile: ProfileTable, cluster: ClusterSpec, batch: int, *,
                   piece_ms: float = DEFAULT_PIECE_MS, grad_bytes_per_param: float = 4,
                   optimizer_bytes_per_param: float = 8,
                   param_bytes_per_param: float = 4) -> BackgroundJob:
  """The job `graph` at per-device `batch`, timed by `profile`, sized by the planner's model."""
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
    raise UserError(f"background batch_per_device must be an integer >= 1, got {batch!r}")
  if not (isinstance(piece_ms, (int, float)) and math.isfinite(piece_ms) and piece_ms > 0):
    raise UserError(f"background piece_ms must be a number > 0, got {piece_ms!r}")
  opts = PlanOptions(num_devices=1, global_batch=batch, check_memory=False,
                     grad_bytes_per_param=grad_bytes_per_param,
                     optimizer_bytes_per_param=optimizer_bytes_per_param,
                     param_bytes_per_param=param_bytes_per_param)
  model = build_cost_model(graph, profile, cluster.with_num_devices(1), opts)
  need = float(memory.device_bytes(model, {n: (0, 1) for n in model.names})[0])
  pieces = merge_pieces(kernels_ms(graph, profile, batch), piece_ms)
  if not len(pieces):
    raise UserError(f"background model {graph.model} takes no time at batch {batch} in its "
                    "profile; use a profile with timings for it")
  return BackgroundJob(graph.model, batch, pieces, need)


def check_memory(job: BackgroundJob, foreground_bytes: np.ndarray, capacity_bytes: float) -> None:
  """Raise a one-line UserError unless the job fits beside the foreground on every device."""
  free = capacity_bytes - np.asarray(foreground_bytes, dtype=float)
  d = int(np.argmin(free))
  if job.memory_bytes > free[d]:
    raise UserError(
        f"background job {job.model} at batch {job.batch} needs {job.memory_bytes / 1e9:.2f} GB "
        f"per device but device {d} has only {max(free[d], 0) / 1e9:.2f} GB free beside the "
        f"foreground ({capacity_bytes / 1e9:g} GB in all); use a smaller background "
        "batch_per_device, a smaller background model or background=none")
