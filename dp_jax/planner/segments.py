"""A plan cut into stages, moves and fork/join blocks: the one stage walk of the planner, the
simulator and the runtime (dp_jax/planner/evaluate.py, dp_jax/simulator/timeline.py,
dp_jax/runtime/stages.py), and the stages a plan records (dp_jax/planner/contract.py).

A stage is a maximal run of chain items on the same devices (a fork/join block whose fork,
branch layers and join share those devices joins the run); an edge between consecutive chain
layers on different devices is a move; any other block holds its non-empty branches in branch
order, grouped so that branches sharing a device are in one group (they run one after
another), plus the fork -> join moves of identity branches. Stages are numbered in walk order
(a block's branches in branch order). Given a plan's stages (each a set of layers), a run
also ends where the next item is in another of them: the walk then follows the plan's stages
where each is a run it can make (check_plan checks that each is: walk_stages lists the walk's).
Pure Python: no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


Stages = Sequence[Sequence[str]]  # a plan's stages: each the layers of one, in walk order


def segments(graph: LayerGraph, assignment: Mapping[str, Placement],
             stages: Stages | None = None) -> tuple[Segment, ...]:
  """The whole plan as a sequence of segments (stages numbered as the planner numbers them);
  `stages`: the plan's stages (None: the walk's maximal runs)."""
  stage_of = None if stages is None else {n: i for i, s in enumerate(stages) for n in s}
  return _Walk(assignment, stage_of).chain(graph.decompose())


def walk_stages(segs: Sequence[Segment]) -> tuple[Stage, ...]:
  """Every stage of a walk, in the planner's order (Stage.index)."""
  out: list[Stage] = []

  def visit(items: Sequence[Segment]) -> None:
    for item in items:
      if isinstance(item, Stage):
        out.append(item)
      elif isinstance(item, Block):
        for branch in item.branches:
          visit(branch.body)

  visit(segs)
  return tuple(sorted(out, key=lambda s: s.index))


class _Walk:
  """One walk: layers together in a run when on the same devices and (given) in the same
  stage of the plan's; stages numbered in walk order."""

  def __init__(self, a: Mapping[str, Placement], stage_of: Mapping[str, int] | None):
    self.a, self.stage_of, self.counter = a, stage_of, 0

  def together(self, x: str, y: str) -> bool:
    return self.a[x] == self.a[y] and (self.stage_of is None
                                       or self.stage_of[x] == self.stage_of[y])

  def chain(self, chain: Chain) -> tuple[Segment, ...]:
    a = self.a
    out: list[Segment] = []
    run: list[str] | None = None
    prev: str | None = None

    def close():
      if run:
        out.append(Stage(self.counter, a[run[0]], tuple(run)))
        self.counter += 1

    for item in chain.items:
      if isinstance(item, Parallel):
        if self.merged(item):
          run.extend(flat_layers(item))  # the fork is the item before: run is open
          continue
        close()
        run, prev = None, None
        out.append(self.block(item))
        continue
      if run is not None and self.together(run[-1], item):
        run.append(item)
      else:
        close()
        if prev is not None and a[prev] != a[item]:  # (a plan's stage may end on its devices)
          out.append(Move(prev, item))
        run = [item]
      prev = item
    close()
    return tuple(out)

  def merged(self, block: Parallel) -> bool:
    return self.together(block.fork, block.join) and all(
        self.together(block.fork, n) for n in flat_layers(block))

  def block(self, block: Parallel) -> Block:
    branches: list[Branch] = []
    masks: list[int] = []
    identity: list[Move] = []
    for chain in block.branches:
      if not chain.items:
        identity.append(Move(block.fork, block.join))
        continue
      move_in = Move(block.fork, first_layer(chain))
      body = self.chain(chain)
      branches.append(Branch(move_in, body, Move(last_layer(chain), block.join)))
      mask = 0
      for n in flat_layers(chain):
        s, c = self.a[n]
        mask |= ((1 << c) - 1) << s
      masks.append(mask)
    groups = tuple(tuple(g) for g in sharing_groups(masks))
    return Block(block.fork, block.join, tuple(branches), groups, tuple(identity))
