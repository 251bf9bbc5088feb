"""Device memory of a plan: parameters, gradients, optimizer state and saved activations."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dp_jax.errors import UserError
from dp_jax.planner.costs import CostModel, Placement

GB = 1e9


def activation_bytes(model: CostModel) -> np.ndarray:
  """(L, C): activations a layer saves for backward on each of its devices, per count."""
  return model.out_bytes[:, None] * (model.batch // model.counts)[None, :]


def layer_bytes(model: CostModel) -> np.ndarray:
  """(L, C): what one layer alone needs on each of its devices, per count."""
  return model.state_bytes[:, None] + activation_bytes(model)


def capacity_bytes(model: CostModel) -> float:
  return model.cluster.memory_gb_per_device * GB


def fits_alone(model: CostModel) -> np.ndarray:
  """(L, C) bool: the layer fits on its devices by itself; raises naming a layer that never does."""
  if not model.options.check_memory:
    return np.ones(model.compute_ms.shape, dtype=bool)
  need = layer_bytes(model)
  ok = need <= capacity_bytes(model)
  for i in np.flatnonzero(~ok.any(axis=1)):
    name = model.names[i]
    raise UserError(
        f"layer '{name}' does not fit in {model.cluster.memory_gb_per_device:g} GB per device on "
        f"{model.cluster.name} at any device count: it needs {need[i].min() / GB:.2f} GB "
        f"(params+grads+optimizer {model.state_bytes[i] / GB:.2f} GB); use devices with more "
        "memory or a smaller global batch")
  return ok


def device_bytes(model: CostModel, assignment: Mapping[str, Placement]) -> np.ndarray:
  """Bytes each job device holds under the assignment (index = device)."""
  per_device = np.zeros(model.options.num_devices + 1)
  for name, (start, count) in assignment.items():
    i = model.row[name]
    need = model.state_bytes[i] + model.out_bytes[i] * (model.batch // count)
    per_device[start] += need
    per_device[start + count] -= need
  return np.cumsum(per_device)[:-1]


def largest_layer_on(model: CostModel, assignment: Mapping[str, Placement], device: int) -> str:
  """The layer that takes the most memory on `device`."""
  best, best_bytes = "", -1.0
  for name, (start, count) in assignment.items():
    if start <= device < start + count:
      i = model.row[name]
      need = model.state_bytes[i] + model.out_bytes[i] * (model.batch // count)
      if need > best_bytes:
        best, best_bytes = name, need
  return best


def check_fits(model: CostModel, assignment: Mapping[str, Placement], what: str = "plan") -> None:
  """Raise a one-line UserError when some device of the plan runs out of memory."""
  if not model.options.check_memory:
    return
  used = device_bytes(model, assignment)
  d = int(np.argmax(used))
  if used[d] > capacity_bytes(model):
    raise UserError(
        f"no {what} fits in {model.cluster.memory_gb_per_device:g} GB per device: device {d} needs "
        f"{used[d] / GB:.2f} GB; largest layer there is "
        f"'{largest_layer_on(model, assignment, d)}'; use more devices, a smaller global batch "
        "or devices with more memory")
