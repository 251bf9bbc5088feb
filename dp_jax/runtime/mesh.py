"""Sub-meshes: a 1-D mesh over exactly a stage's devices; batch sharded, params replicated."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

BATCH_AXIS = "data"


def job_devices(num_devices: int | None = None) -> list[jax.Device]:
  """The job's device list: plan device index i is jax.devices()[i]."""
  devices = jax.devices()
  return devices if num_devices is None else devices[:num_devices]


def stage_mesh(devices: Sequence[jax.Device]) -> Mesh:
  """A 1-D mesh over `devices` in the given order (the plan's sample order), GSPMD (Auto) axis."""
  return Mesh(np.array(list(devices), dtype=object), (BATCH_AXIS,), axis_types=(AxisType.Auto,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over the mesh, device i holding the i-th contiguous range."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  """A full copy on every device of the mesh."""
  return NamedSharding(mesh, PartitionSpec())
