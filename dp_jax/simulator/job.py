"""Background jobs for the simulator: a model's step on one device cut into pieces; its memory.

A background job trains its own copy of a model on each device, independently (no gradient
sync), as DeepPool's background tasks do (one model per GPU). Its step is the runtime's own
sequence of programs for that model alone on one device (dp_jax/multiplex/policy.py, step_pieces):
consecutive layers (series-parallel order) grouped while a group's forward and backward each
stay within piece_ms (DeepPool: be_graph_split_ms, about 0.5 ms; a longer layer stands alone),
then each group's forward, the last group's forward+backward, each group's backward with its
optimizer update in reverse. Piece times come from the profile, plus each layer's optimizer
update priced as the planner prices it (dp_jax/planner/stage_terms.py: the job's whole model
on one device, in its backward pieces). Memory is the planner's model
(dp_jax/planner/memory.py) of the job on one device: parameters, gradients, optimizer state and
saved activations.
"""

from __future__ import annotations

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, flat_layers
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.multiplex.policy import DEFAULT_PIECE_MS, BackgroundJob, layer_groups, step_pieces
from dp_jax.planner import memory, pricing
from dp_jax.planner.costs import CostModel, build_cost_model
from dp_jax.planner.options import PlanOptions

__all__ = ["DEFAULT_PIECE_MS", "BackgroundJob", "background_job", "check_memory", "job_bytes",
           "rooms"]


def job_model(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig, batch: int, *,
              gradient_precision: str = "fp32", optimizer: str = "momentum",
              param_bytes_per_param: float = 4) -> CostModel:
  """The planner's cost model of the whole model on one device at `batch`."""
  opts = PlanOptions(num_devices=1, global_batch=batch, check_memory=False,
                     gradient_precision=gradient_precision, optimizer=optimizer,
                     param_bytes_per_param=param_bytes_per_param)
  return build_cost_model(graph, profile, cluster.with_num_devices(1), opts)


def job_bytes(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig, batch: int,
              **options) -> float:
  """The planner's memory model of the whole model on one device at `batch`."""
  model = job_model(graph, profile, cluster, batch, **options)
  return float(memory.device_bytes(model, {n: (0, 1) for n in model.names})[0])


def background_job(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig, batch: int, *,
                   piece_ms: float = DEFAULT_PIECE_MS, **options) -> BackgroundJob:
  """The job `graph` at per-device `batch`, timed by `profile` with its optimizer update,
  sized by the planner's model (`options`: gradient_precision, optimizer,
  param_bytes_per_param)."""
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
    raise UserError(f"background batch_per_device must be an integer >= 1, got {batch!r}")
  model = job_model(graph, profile, cluster, batch, **options)
  names = list(flat_layers(graph.decompose()))
  # on one device: no synchronisation; the update runs in the backward pieces
  times = [pricing.layer_time(model, n, (0, 1)) for n in names]
  fwd = [float(t.forward_total) for t in times]
  bwd = [float(t.backward_total + t.update) for t in times]
  groups = layer_groups(names, fwd, bwd, piece_ms)
  pieces = step_pieces(groups, fwd, bwd)
  ms = np.array([p[2] for p in pieces])
  if not ms.sum() > 0:
    raise UserError(f"background model {graph.model} takes no time at batch {batch} in its "
                    "profile; use a profile with timings for it")
  used = float(memory.device_bytes(model, {n: (0, 1) for n in model.names})[0])
  return BackgroundJob(graph.model, batch, tuple(f"{p}:{g}" for p, g, _ in pieces), ms, used,
                       tuple(tuple(names[i] for i in g) for g in groups),
                       sum(n.flops_per_sample for n in graph.nodes))


def free_bytes(foreground_bytes: np.ndarray, capacity_bytes: float) -> np.ndarray:
  """Per device: what the foreground leaves of the device's memory."""
  return capacity_bytes - np.asarray(foreground_bytes, dtype=float)


def rooms(job: BackgroundJob, foreground_bytes: np.ndarray, capacity_bytes: float,
          bounds: np.ndarray) -> np.ndarray:
  """Per device class (devices [bounds[k], bounds[k + 1])): whether the job fits beside the
  foreground on each of its devices. A scheduler starts no job where it does not fit, so the
  background runs on the classes with room only; the others stay as the foreground leaves
  them."""
  free = free_bytes(foreground_bytes, capacity_bytes)
  return np.array([job.memory_bytes <= free[lo:hi].min() * (1 + 1e-12)
                   for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])


def check_memory(job: BackgroundJob, foreground_bytes: np.ndarray, capacity_bytes: float) -> None:
  """Raise a one-line UserError unless the job fits beside the foreground on every device."""
  free = free_bytes(foreground_bytes, capacity_bytes)
  d = int(np.argmin(free))
  if job.memory_bytes > free[d]:
    raise UserError(
        f"background job {job.model} at batch {job.batch} needs {job.memory_bytes / 1e9:.2f} GB "
        f"per device but device {d} has only {max(free[d], 0) / 1e9:.2f} GB free beside the "
        f"foreground ({capacity_bytes / 1e9:g} GB in all); use a smaller background "
        "batch_per_device, a smaller background model or background=none")
