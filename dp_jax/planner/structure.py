"""Walks of the series-parallel decomposition in the one order every planner module uses."""

from __future__ import annotations

from collections.abc import Iterator

from dp_jax.graph import Chain, Parallel


def flat_layers(item: Chain | Parallel) -> Iterator[str]:
  """Layers of a chain or of a block's branches, forward order: branches one after another."""
  items = item.items if isinstance(item, Chain) else ()
  if isinstance(item, Parallel):
    for branch in item.branches:
      yield from flat_layers(branch)
    return
  for it in items:
    if isinstance(it, Parallel):
      yield from flat_layers(it)
    else:
      yield it


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
