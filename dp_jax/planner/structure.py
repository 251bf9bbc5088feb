"""Walks of the series-parallel decomposition in the one order every planner module uses."""

from __future__ import annotations

from dp_jax.graph.layer_graph import Chain, flat_layers

__all__ = ["first_layer", "flat_layers", "last_layer", "plan_order", "sharing_groups"]


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


def sharing_groups(masks: list[int]) -> list[list[int]]:
  """Indices grouped into connected components of 'shares a device' (device bit masks), each
  group in index order, groups ordered by their first index."""
  root = list(range(len(masks)))

  def find(i: int) -> int:
    while root[i] != i:
      root[i] = root[root[i]]
      i = root[i]
    return i

  for i in range(len(masks)):
    for j in range(i):
      if masks[i] & masks[j]:
        root[find(i)] = find(j)
  groups: dict[int, list[int]] = {}
  for i in range(len(masks)):
    groups.setdefault(find(i), []).append(i)
  return list(groups.values())
