"""Walks of the series-parallel decomposition in the one order every planner module uses."""

from __future__ import annotations

from dp_jax.graph import Chain, flat_layers

__all__ = ["first_layer", "flat_layers", "last_layer", "plan_order"]


def first_layer(chain: Chain) -> str:
  first = chain.items[0]
  assert isinstance(first, str), "a chain starts with a layer"
  return first


def last_layer(chain: Chain) -> str:
  last = chain.items[-1]
  assert isinstance(last, str), "a chain ends with a layer"
  return last


def plan_order(top: Chain) -> list[str]:
  """All layers in flattened order (a topological order)."""
  return list(flat_layers(top))
