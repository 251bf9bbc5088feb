"""The cost of a given plan: the single source of truth that the search is optimal against.

What one training step is charged (ms; B global batch, a layer on g devices holds B/g samples):
- compute: profiled fwd + bwd of every layer at per-device batch B/g;
- a stage is a maximal run of consecutive chain items on the same devices; a fork/join block
  joins the run only when the fork, every branch layer and the join share those devices
  ("merged"); otherwise the block ends the fork's run and the join starts a new one;
- a stage's gradients (params x grad_bytes_per_param) go in one combined ring all-reduce on the
  slowest link its devices span: latency 2(g-1) x link latency once per stage (none without
  params or on one device), plus per layer 2(g-1)/g x bytes / bandwidth; without overlap all
  of it follows the stage's backward, with overlap a channel sends each layer's gradients once
  its backward is done while earlier layers' backward runs (costs.stage_sync_ms);
- a move along an edge whose layers sit on different devices costs 2 x (busiest device's
  bytes in or out / bandwidth + latency) on the slowest link of both device sets (activations
  forward, their gradients backward); samples that stay on their device do not move;
- a chain costs the sum of its stages, moves and non-merged blocks; a non-merged block costs
  max over groups of branches that share a device of the sum of their (move in + branch +
  move out), plus the fork -> join moves of identity branches (a branch's forward and backward
  are charged together, so concurrent branches overlap as wholes);
- gpu_ms: sum over stages of devices x (compute + sync) plus over moves of devices of both
  sets x move time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dp_jax.cluster import ClusterSpec
from dp_jax.errors import UserError
from dp_jax.graph import Chain, LayerGraph, Parallel
from dp_jax.planner.costs import CostModel, Placement, build_cost_model
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.structure import first_layer, flat_layers, last_layer, sharing_groups
from dp_jax.profile.table import ProfileTable


@dataclass(frozen=True)
class StageCost:
  """Consecutive layers on the same devices, run as one program with one combined all-reduce."""

  placement: Placement
  layers: tuple[str, ...]
  compute_ms: float
  sync_ms: float


@dataclass(frozen=True)
class MoveCost:
  """Samples moved along one edge whose layers sit on different devices (fwd + bwd)."""

  src: str
  dst: str
  ms: float
  devices: int


@dataclass(frozen=True)
class Evaluation:
  """Predicted cost of one plan."""

  iteration_ms: float
  gpu_ms: float
  stages: tuple[StageCost, ...]
  moves: tuple[MoveCost, ...]


def evaluate_plan(graph: LayerGraph, profile: ProfileTable, cluster: ClusterSpec,
                  assignment: Mapping[str, Placement], *, global_batch: int,
                  num_devices: int | None = None, overlap_allreduce: bool = True,
                  **options) -> Evaluation:
  """Cost of an assignment layer -> (first device, count); see the module docstring."""
  if num_devices is None:
    num_devices = min(global_batch, max([s + c for s, c in assignment.values()] or [1]))
  opts = PlanOptions(num_devices=num_devices, global_batch=global_batch,
                     overlap_allreduce=overlap_allreduce, **options)
  return evaluate(build_cost_model(graph, profile, cluster, opts), assignment)


def evaluate(model: CostModel, assignment: Mapping[str, Placement]) -> Evaluation:
  """Cost of an assignment under a prepared CostModel (what the search and tests call)."""
  _check_assignment(model, assignment)
  stages: list[StageCost] = []
  moves: list[MoveCost] = []
  walk = _Walk(model, assignment, stages, moves)
  time = walk.chain(model.graph.decompose())
  gpu = sum(s.placement[1] * (s.compute_ms + s.sync_ms) for s in stages)
  gpu += sum(m.devices * m.ms for m in moves)
  return Evaluation(iteration_ms=float(time), gpu_ms=float(gpu), stages=tuple(stages),
                    moves=tuple(moves))


def _check_assignment(model: CostModel, assignment: Mapping[str, Placement]) -> None:
  missing = [n for n in model.names if n not in assignment]
  if missing:
    raise UserError(f"plan has no devices for layer(s) {', '.join(missing[:5])}; "
                    "every layer of the graph needs a placement")
  extra = [n for n in assignment if n not in model.row]
  if extra:
    raise UserError(f"plan places layer(s) {', '.join(extra[:5])} that the graph does not have")
  b, g = model.batch, model.options.num_devices
  for name, (start, count) in assignment.items():
    if count < 1 or b % count:
      raise UserError(f"layer '{name}' is on {count} devices, which does not divide the global "
                      f"batch {b}; use a divisor of the batch")
    if start < 0 or start + count > g:
      raise UserError(f"layer '{name}' uses devices {start}..{start + count - 1}, outside the "
                      f"job's {g} devices")


class _Walk:
  """One evaluation's recursion over the decomposition (collects stages and moves)."""

  def __init__(self, model, assignment, stages, moves):
    self.m, self.a, self.stages, self.moves = model, assignment, stages, moves

  def chain(self, chain: Chain) -> float:
    time, run, prev_node = 0.0, None, None
    for item in chain.items:
      if isinstance(item, Parallel):
        if self._merged(item):
          run.extend(flat_layers(item))
          continue
        time += self._close(run)
        run, prev_node = None, None
        time += self._block(item)
        continue
      if run is not None and self.a[run[-1]] == self.a[item]:
        run.append(item)
      else:
        if run is not None:
          time += self._close(run)
        if prev_node is not None:
          time += self._move(prev_node, item)
        run = [item]
      prev_node = item
    return time + self._close(run)

  def _merged(self, block: Parallel) -> bool:
    p = self.a[block.fork]
    return self.a[block.join] == p and all(self.a[n] == p for n in flat_layers(block))

  def _close(self, run) -> float:
    if not run:
      return 0.0
    p = self.a[run[0]]
    compute, sync = self.m.stage(tuple(run), p)
    self.stages.append(StageCost(p, tuple(run), compute, sync))
    return compute + sync

  def _move(self, src: str, dst: str) -> float:
    ms, devices = self.m.move(src, self.a[src], self.a[dst])
    if ms > 0:
      self.moves.append(MoveCost(src, dst, ms, devices))
    return ms

  def _block(self, block: Parallel) -> float:
    identity, times, masks = 0.0, [], []
    for branch in block.branches:
      if not branch.items:
        identity += self._move(block.fork, block.join)
        continue
      t = self._move(block.fork, first_layer(branch)) + self.chain(branch)
      times.append(t + self._move(last_layer(branch), block.join))
      mask = 0
      for n in flat_layers(branch):
        s, c = self.a[n]
        mask |= ((1 << c) - 1) << s
      masks.append(mask)
    return _grouped_max(times, masks) + identity


def _grouped_max(times: list[float], masks: list[int]) -> float:
  """Branches sharing a device run one after another; groups that share none run side by side."""
  return max((sum(times[i] for i in g) for g in sharing_groups(masks)), default=0.0)


def data_parallel_assignment(model: CostModel, count: int) -> dict[str, Placement]:
  """Every layer on devices [0, count)."""
  return {n: (0, count) for n in model.names}

