"""Bytes of one layer from the graph alone: parameters, per-device state, saved activations.

The per-layer part of the memory model (dp_jax/planner/memory.py, which re-exports these);
its own module so the cost model (dp_jax/planner/costs.py) builds its arrays without importing
memory, which reads a CostModel. Pure Python: no JAX.
"""

from __future__ import annotations

from dp_jax.graph.layer_graph import LayerNode

MOMENTUM_STATE_BYTES = 4  # the default optimizer's state (PlanOptions.optimizer: momentum)


def layer_params(node: LayerNode, param_bytes_per_param: float = 4) -> float:
  """Parameter count of a layer (from param_bytes when the node gives no count)."""
  return float(node.params if node.params > 0 else node.param_bytes / param_bytes_per_param)


def state_bytes(node: LayerNode, grad_bytes_per_param: float = 4,
                optimizer_bytes_per_param: float = MOMENTUM_STATE_BYTES,
                param_bytes_per_param: float = 4) -> float:
  """Parameters + gradients + optimizer state of one layer, on every device that holds it."""
  return float(node.param_bytes) + layer_params(node, param_bytes_per_param) * (
      grad_bytes_per_param + optimizer_bytes_per_param)


def saved_bytes_per_sample(node: LayerNode, element_scale: float = 1.0) -> float:
  """Activations the layer keeps for its backward, per sample (XLA's residuals, else its
  output), times element_scale (profile element size / traced element size)."""
  saved = node.saved_bytes_per_sample or node.out_bytes_per_sample
  return float(saved) * element_scale
