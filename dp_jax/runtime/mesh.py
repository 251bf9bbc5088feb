"""Sub-meshes: a 2-D (data, model) mesh over exactly a stage's devices; batch over "data"."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

BATCH_AXIS = "data"
MODEL_AXIS = "model"


def job_devices(num_devices: int | None = None) -> list[jax.Device]:
  """The job's device list: plan device index i is jax.devices()[i]."""
  devices = jax.devices()
  return devices if num_devices is None else devices[:num_devices]


def stage_mesh(devices: Sequence[jax.Device], shape: tuple[int, int] | None = None) -> Mesh:
  """A (d, m) mesh over `devices` in the given order (device (i, j) = devices[i*m + j]);
  default (len(devices), 1); GSPMD (Auto) axes ("data", "model")."""
  d, m = shape or (len(devices), 1)
  grid = np.array(list(devices), dtype=object).reshape(d, m)
  return Mesh(grid, (BATCH_AXIS, MODEL_AXIS), axis_types=(AxisType.Auto, AxisType.Auto))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over "data" (row i holding the i-th contiguous range),
  replicated over "model"."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  """A full copy on every device of the mesh."""
  return NamedSharding(mesh, PartitionSpec())


def spec_sharding(mesh: Mesh, spec: Sequence) -> NamedSharding:
  """The NamedSharding of a PartitionSpec written as a JSON list (null | axis | [axes])."""
  return NamedSharding(mesh, PartitionSpec(*(tuple(e) if isinstance(e, list) else e
                                             for e in spec)))
