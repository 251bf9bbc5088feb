"""A plan cut into stages, moves and fork/join blocks: the one stage walk of evaluate and the
simulator (dp_jax/planner/evaluate.py, dp_jax/simulator/timeline.py).

A stage is a maximal run of chain items on the same devices (a fork/join block whose fork,
branch layers and join share those devices joins the run); an edge between consecutive chain
layers on different devices is a move; any other block holds its non-empty branches in branch
order, grouped so that branches sharing a device are in one group (they run one after
another), plus the fork -> join moves of identity branches. Stages are numbered in walk order
(a block's branches in branch order). Pure Python: no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dp_jax.graph.layer_graph import Chain, LayerGraph, Parallel
from dp_jax.planner.structure import first_layer, flat_layers, last_layer, sharing_groups

Placement = tuple[int, int]  # (first device, number of devices) of the job


@dataclass(frozen=True)
class Stage:
  """Consecutive layers on one device range: one program, one combined all-reduce."""

  index: int  # the planner's stage order (Evaluation.stages[index])
  placement: Placement
  layers: tuple[str, ...]


@dataclass(frozen=True)
class Move:
  """Samples of `src`'s output that change device on their way to `dst`."""

  src: str
  dst: str


@dataclass(frozen=True)
class Branch:
  """One non-empty branch of a block: move in, its own segments, move out."""

  move_in: Move
  body: tuple[Segment, ...]
  move_out: Move


@dataclass(frozen=True)
class Block:
  """A fork/join block on more than one device range."""

  fork: str
  join: str
  branches: tuple[Branch, ...]  # the non-empty branches, in branch order
  group_index: tuple[tuple[int, ...], ...]  # groups of branches (indices) that share devices
  identity: tuple[Move, ...]  # fork -> join moves of empty branches, charged after the groups

  @property
  def groups(self) -> tuple[tuple[Branch, ...], ...]:
    """Groups share no device; branches in a group do (and run one after another)."""
    return tuple(tuple(self.branches[i] for i in g) for g in self.group_index)


Segment = Stage | Move | Block


def segments(graph: LayerGraph, assignment: Mapping[str, Placement]) -> tuple[Segment, ...]:
  """The whole plan as a sequence of segments (stages numbered as the planner numbers them)."""
  counter = [0]
  return _chain(graph.decompose(), assignment, counter)


def _chain(chain: Chain, a: Mapping[str, Placement], counter: list[int]) -> tuple[Segment, ...]:
  out: list[Segment] = []
  run: list[str] | None = None
  prev: str | None = None

  def close():
    if run:
      out.append(Stage(counter[0], a[run[0]], tuple(run)))
      counter[0] += 1

  for item in chain.items:
    if isinstance(item, Parallel):
      if _merged(item, a):
        run.extend(flat_layers(item))  # the fork is the item before: run is open
        continue
      close()
      run, prev = None, None
      out.append(_block(item, a, counter))
      continue
    if run is not None and a[run[-1]] == a[item]:
      run.append(item)
    else:
      close()
      if prev is not None:
        out.append(Move(prev, item))
      run = [item]
    prev = item
  close()
  return tuple(out)


def _merged(block: Parallel, a: Mapping[str, Placement]) -> bool:
  p = a[block.fork]
  return a[block.join] == p and all(a[n] == p for n in flat_layers(block))


def _block(block: Parallel, a: Mapping[str, Placement], counter: list[int]) -> Block:
  branches: list[Branch] = []
  masks: list[int] = []
  identity: list[Move] = []
  for chain in block.branches:
    if not chain.items:
      identity.append(Move(block.fork, block.join))
      continue
    move_in = Move(block.fork, first_layer(chain))
    body = _chain(chain, a, counter)
    branches.append(Branch(move_in, body, Move(last_layer(chain), block.join)))
    mask = 0
    for n in flat_layers(chain):
      s, c = a[n]
      mask |= ((1 << c) - 1) << s
    masks.append(mask)
  groups = tuple(tuple(g) for g in sharing_groups(masks))
  return Block(block.fork, block.join, tuple(branches), groups, tuple(identity))
