"""The cost of a given plan: the single source of truth that the search is optimal against.

What one training step is charged (ms; B global batch, a layer on g devices holds B/g samples):
- compute: profiled fwd + bwd of every layer at per-device batch B/g, plus its optimizer update
  on each of its devices (dp_jax/planner/stage_terms.py; charged with the forward work, so a
  stage's all-reduce overlaps only its backward);
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
- a step is its forward pass then its backward pass; a chain costs the sum of its stages
  (forward: compute; backward: compute + exposed all-reduce; the next backward segment waits
  for a stage's all-reduce), moves (half forward, half backward) and non-merged blocks;
- a non-merged block: first the fork's sends into its branches, one after another (they share
  the fork's link), then the groups of branches that share a device side by side (branches in
  a group one after another), then the join's receives from the branches, one after another
  (they share the join's link), then the fork -> join moves of identity branches; backward
  mirrors it. The block's forward is the max over groups
  of their forward, its backward the max over groups of their backward, taken separately
  (the simulator's schedule, dp_jax/simulator/timeline.py);
- a weight-sharded layer (its plan entry's (d, m) mesh and split) is priced by
  dp_jax/planner/sharded.py: compute at the sharded shape, its entry gather and activation
  collectives in its forward / backward, its share of the gradients all-reduced over its data
  groups as its bandwidth term in the stage's all-reduce (docs/cost_model.md);
- a stage's per-stage terms (CostModel.stage_ms / enter_ms / leave_ms: its program launch, half
  of each boundary it touches: host work and the program time the profile measured there;
  dp_jax/planner/stage_terms.py) in its backward;
- gpu_ms: sum over stages of devices x (compute + sync + per-stage terms), over moves of
  devices of both sets x move time, and for a fork's sends (a join's receives) the devices of
  all of them together x their total time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import pricing
from dp_jax.planner.costs import CostModel, Placement, build_cost_model
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.segments import Block, Move, Segment, Stage, Stages, segments
from dp_jax.planner.sharded import Strategy, check_sharding, strategy


@dataclass(frozen=True)
class StageCost:
  """Consecutive layers on the same devices, run as one program with one combined all-reduce."""

  placement: Placement
  layers: tuple[str, ...]
  compute_ms: float
  sync_ms: float
  overhead_ms: float = 0.0  # the per-stage terms (pricing.stage_overhead_ms), in its backward
  update_ms: float = 0.0  # the optimizer update of its layers on one of its devices (in compute)


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
  forward_ms: float = 0.0  # the forward pass's share of iteration_ms
  update_ms: float = 0.0  # the stages' optimizer updates (in their compute), summed

  @property
  def overhead_ms(self) -> float:
    """The stages' per-stage terms (program launches, boundaries), summed."""
    return float(sum(s.overhead_ms for s in self.stages))


def evaluate_plan(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                  assignment: Mapping[str, Placement], *, global_batch: int,
                  num_devices: int | None = None, overlap_allreduce: bool = True,
                  shardings: Mapping[str, Strategy] | None = None, **options) -> Evaluation:
  """Cost of an assignment layer -> (first device, count) and the weight shardings of some
  layers (layer -> (m, split)); see the module docstring."""
  if num_devices is None:
    num_devices = min(global_batch, max([s + c for s, c in assignment.values()] or [1]))
  opts = PlanOptions(num_devices=num_devices, global_batch=global_batch,
                     overlap_allreduce=overlap_allreduce, **options)
  return evaluate(build_cost_model(graph, profile, cluster, opts), assignment, shardings)


def evaluate(model: CostModel, assignment: Mapping[str, Placement],
             shardings: Mapping[str, Strategy] | None = None,
             stages: Stages | None = None) -> Evaluation:
  """Cost of an assignment under a prepared CostModel (what the search and tests call);
  `shardings`: layer -> (m, split) of the weight-sharded layers (the rest split samples);
  `stages`: a plan's stages (Plan.stage_layers; None: the walk's)."""
  _check_assignment(model, assignment)
  shardings = weight_shardings(model, assignment, shardings)
  stages_out: list[StageCost] = []
  moves: list[MoveCost] = []
  walk = _Walk(model, assignment, shardings, stages_out, moves)
  fwd, bwd = walk.walk(segments(model.graph, assignment, stages))
  return Evaluation(iteration_ms=float(fwd + bwd), gpu_ms=float(walk.gpu),
                    stages=tuple(stages_out), moves=tuple(moves), forward_ms=float(fwd),
                    update_ms=float(sum(s.update_ms for s in stages_out)))


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


def weight_shardings(model: CostModel, assignment: Mapping[str, Placement],
                     shardings: Mapping[str, Strategy] | None) -> dict[str, Strategy]:
  """The layers of a plan whose strategy is not PLAIN (given as Strategy or a tuple (m, split[,
  state[, recompute]])), checked against their placements (one-line errors)."""
  out = {}
  for name, given in (shardings or {}).items():
    if name not in model.row:
      raise UserError(f"plan shards layer '{name}' that the graph does not have")
    sh = strategy(given)
    if not sh.plain:
      check_sharding(model.graph.node(name), assignment[name][1], sh)
      out[name] = sh
  return out


class _Walk:
  """One evaluation's walk over the plan's segments (dp_jax/planner/segments.py, the
  simulator's too): (forward ms, backward ms) per part, collecting stages, moves and
  device-ms (gpu)."""

  def __init__(self, model, assignment, shardings, stages, moves):
    self.m, self.a, self.s, self.stages, self.moves = model, assignment, shardings, stages, moves
    self.gpu = 0.0

  def walk(self, segs: tuple[Segment, ...]) -> tuple[float, float]:
    fwd = bwd = 0.0
    for seg in segs:
      if isinstance(seg, Stage):
        f, b = self._stage(seg)
      elif isinstance(seg, Move):
        f = b = self._move(seg.src, seg.dst) / 2
      else:
        f, b = self._block(seg)
      fwd, bwd = fwd + f, bwd + b
    return fwd, bwd

  def _stage(self, st: Stage) -> tuple[float, float]:
    p, run = st.placement, st.layers
    compute, sync = pricing.stage_cost(self.m, run, p, self.s)
    over = pricing.stage_overhead_ms(self.m, run[0], run[-1], p[1])
    update = sum(float(pricing.layer_time(self.m, n, p, self.s.get(n)).update) for n in run)
    self.stages.append(StageCost(p, run, compute, sync, over, update))
    self.gpu += p[1] * (compute + sync + over)
    bwd = sum(pricing.layer_ms(self.m, n, p, self.s.get(n))[1] for n in run)
    return compute - bwd, bwd + sync + over

  def _move(self, src: str, dst: str, count_gpu: bool = True) -> float:
    ms, devices = pricing.move_cost(self.m, src, self.a[src], self.a[dst])
    if ms > 0:
      self.moves.append(MoveCost(src, dst, ms, devices))
      if count_gpu:
        self.gpu += devices * ms
    return ms

  def _block(self, block: Block) -> tuple[float, float]:
    """The fork's sends into the branches, one after another (they share the fork's link);
    groups of branches that share a device side by side (branches in a group one after
    another); the join's receives from the branches, one after another (they share the join's
    link); the identity moves. Backward mirrors it. Forward and backward maxima over groups
    are taken separately."""
    parts = [self.walk(br.body) for br in block.branches]
    moved = self._shared_moves([br.move_in for br in block.branches])
    moved += self._shared_moves([br.move_out for br in block.branches])
    moved += sum(self._move(mv.src, mv.dst) for mv in block.identity)
    fwd = max((sum(parts[i][0] for i in g) for g in block.group_index), default=0.0)
    bwd = max((sum(parts[i][1] for i in g) for g in block.group_index), default=0.0)
    return fwd + moved / 2, bwd + moved / 2

  def _shared_moves(self, moves: list[Move]) -> float:
    """Moves that share one end's link, run one after another: the devices of all of them
    are busy for their total time."""
    total, mask = 0.0, 0
    for mv in moves:
      ms = self._move(mv.src, mv.dst, count_gpu=False)
      if ms > 0:
        total += ms
        mask |= _mask(self.a[mv.src]) | _mask(self.a[mv.dst])
    self.gpu += bin(mask).count("1") * total
    return total


def _mask(p: Placement) -> int:
  start, count = p
  return ((1 << count) - 1) << start


def data_parallel_assignment(model: CostModel, count: int) -> dict[str, Placement]:
  """Every layer on devices [0, count)."""
  return {n: (0, count) for n in model.names}

