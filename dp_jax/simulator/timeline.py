"""One foreground iteration as a dependency graph of tasks and its schedule, per device range.

Built from the planner's own cost terms (dp_jax/planner/costs.py) on the planner's segments
(dp_jax/planner/segments.py, following the plan's stages): the forward pass walks the segments
in order, then the backward pass walks them in reverse. A stage's layers run one after
another on its devices (forward, then backward in reverse); its gradient all-reduce runs on
the communication stream, one piece per layer as soon as that layer's backward is done when
the plan overlaps all-reduce with the backward pass (else one piece after the stage's
backward), then the ring latency once. As in the
planner, the next backward segment waits for the stage's all-reduce, and a stage's per-stage
terms (program launch, boundaries; pricing.stage_overhead_ms) end its backward. A move
costs half of the planner's move_ms forward (activations) and half backward (their
gradients), on every device of both layouts. A block starts with the fork's sends into all
its branches as one move (they
share the fork's link); then branch groups run side by side, branches in one group one after
another; then the join's receives from all branches as one move (they share the join's link);
identity (fork -> join) moves come last. Backward mirrors the forward order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.hardware.cluster import collective_latency_ms
from dp_jax.planner import pricing
from dp_jax.planner.costs import CostModel, Placement, move_ms
from dp_jax.planner.segments import Block, Move, Segment, Stage, Stages, segments
from dp_jax.planner.sharded import Strategy

TIMELINE_SCHEMA = "dp_jax.timeline/1"  # a step's events as JSON (Event.to_json), either source

STREAMS = ("compute", "comm")
KINDS = ("fwd", "bwd", "move", "allreduce", "bg")
Span = tuple[int, int]  # (first device, count), the planner's Placement convention


@dataclass(frozen=True)
class Event:
  """Work on devices [first, first + count) of one stream between two times (ms)."""

  devices: Span
  stream: str
  kind: str
  label: str
  start_ms: float
  end_ms: float

  def to_json(self) -> dict:
    return {"devices": list(self.devices), "stream": self.stream, "kind": self.kind,
            "label": self.label, "start_ms": self.start_ms, "end_ms": self.end_ms}


@dataclass(frozen=True)
class Task:
  """A node of the iteration's dependency graph: it starts when all of `deps` have ended."""

  spans: tuple[Span, ...]
  stream: str
  kind: str
  label: str
  duration_ms: float
  deps: tuple[int, ...]
  stage: int  # index of the planner stage it belongs to; -1 for moves


@dataclass(frozen=True, eq=False)
class Timeline:
  """Tasks of one foreground iteration and their schedule when the foreground runs alone."""

  num_devices: int
  tasks: tuple[Task, ...]
  start_ms: np.ndarray  # (tasks,)
  end_ms: np.ndarray  # (tasks,)
  stages: tuple[Stage, ...] = field(default=())

  @property
  def iteration_ms(self) -> float:
    return float(self.end_ms.max()) if len(self.tasks) else 0.0

  def events(self, start_ms=None, end_ms=None) -> list[Event]:
    """Every task as one Event per device span (optionally under another schedule)."""
    s = self.start_ms if start_ms is None else start_ms
    e = self.end_ms if end_ms is None else end_ms
    return [Event(span, t.stream, t.kind, t.label, float(s[i]), float(e[i]))
            for i, t in enumerate(self.tasks) for span in t.spans]

  def on_device(self, device: int) -> list[Event]:
    """Events that involve one device, by start time."""
    if not 0 <= device < self.num_devices:
      raise UserError(f"device {device} is outside the plan's {self.num_devices} devices")
    out = [ev for ev in self.events() if ev.devices[0] <= device < sum(ev.devices)]
    return sorted(out, key=lambda ev: (ev.start_ms, ev.stream))


def schedule(tasks: tuple[Task, ...] | list[Task]) -> tuple[np.ndarray, np.ndarray]:
  """Earliest start and end of every task (tasks are in a topological order)."""
  start = np.zeros(len(tasks))
  end = np.zeros(len(tasks))
  for i, t in enumerate(tasks):
    s = max((end[d] for d in t.deps), default=0.0)
    start[i], end[i] = s, s + t.duration_ms
  return start, end


def build_timeline(model: CostModel, assignment: Mapping[str, Placement],
                   shardings: Mapping[str, Strategy] | None = None,
                   stages: Stages | None = None) -> Timeline:
  """The alone timeline of a plan under the planner's cost model (`shardings`: the weight
  sharding of each weight-sharded layer, priced as the planner prices it; `stages`: the plan's
  stages, Plan.stage_layers, as the planner walks them; None: the walk's)."""
  b = _Builder(model, assignment, shardings or {})
  segs = segments(model.graph, assignment, stages)
  done = b.forward(segs, ())
  b.backward(segs, done)
  start, end = schedule(b.tasks)
  return Timeline(model.options.num_devices, tuple(b.tasks), start, end, tuple(b.stages))


class _Builder:
  """Appends tasks for the forward and backward walks; returns the ids a successor waits on."""

  def __init__(self, model: CostModel, assignment: Mapping[str, Placement],
               shardings: Mapping[str, Strategy]):
    self.m, self.a, self.s = model, assignment, shardings
    self.tasks: list[Task] = []
    self.stages: list[Stage] = []

  def add(self, spans, stream, kind, label, ms, deps, stage=-1) -> tuple[int, ...]:
    if ms <= 0:
      return deps  # nothing to wait for: successors wait on what this would have waited on
    self.tasks.append(Task(tuple(spans), stream, kind, label, float(ms), tuple(deps), stage))
    return (len(self.tasks) - 1,)

  # --- walks --------------------------------------------------------------------------------

  def forward(self, segs: tuple[Segment, ...], after: tuple[int, ...]) -> tuple[int, ...]:
    for seg in segs:
      if isinstance(seg, Stage):
        self.stages.append(seg)
        for name in seg.layers:
          total, bwd = pricing.layer_ms(self.m, name, seg.placement, self.s.get(name))
          after = self.add([seg.placement], "compute", "fwd", name, total - bwd, after, seg.index)
      elif isinstance(seg, Move):
        after = self.move(seg, after, "fwd")
      else:
        after = self.block_forward(seg, after)
    return after

  def backward(self, segs: tuple[Segment, ...], after: tuple[int, ...]) -> tuple[int, ...]:
    for seg in reversed(segs):
      if isinstance(seg, Stage):
        after = self.stage_backward(seg, after)
      elif isinstance(seg, Move):
        after = self.move(seg, after, "bwd")
      else:
        after = self.block_backward(seg, after)
    return after

  def block_forward(self, blk: Block, after: tuple[int, ...]) -> tuple[int, ...]:
    after = self.shared_moves(blk, "move_in", after, "fwd")
    ends: list[int] = []
    for group in blk.groups:
      a = after
      for br in group:
        a = self.forward(br.body, a)
      ends.extend(a)
    after = self.shared_moves(blk, "move_out", tuple(dict.fromkeys(ends)), "fwd")
    for mv in blk.identity:
      after = self.move(mv, after, "fwd")
    return after

  def block_backward(self, blk: Block, after: tuple[int, ...]) -> tuple[int, ...]:
    for mv in reversed(blk.identity):
      after = self.move(mv, after, "bwd")
    after = self.shared_moves(blk, "move_out", after, "bwd")
    ends: list[int] = []
    for group in blk.groups:
      a = after
      for br in reversed(group):
        a = self.backward(br.body, a)
      ends.extend(a)
    return self.shared_moves(blk, "move_in", tuple(dict.fromkeys(ends)), "bwd")

  def shared_moves(self, blk: Block, which: str, after: tuple[int, ...],
                   direction: str) -> tuple[int, ...]:
    """The fork's sends into every branch (which="move_in") or the join's receives from every
    branch ("move_out") as one task: they share the fork's (join's) link."""
    ms, spans = 0.0, []
    for group in blk.groups:
      for br in group:
        mv = getattr(br, which)
        one = self.move_ms(mv)
        if one > 0:
          ms += one
          spans.extend(union_spans(self.a[mv.src], self.a[mv.dst]))
    end = blk.fork if which == "move_in" else blk.join
    label = (f"{end} <-> branches" if direction == "fwd" else f"grad {end} <-> branches")
    return self.add(merge_spans(spans), "comm", "move", label, ms / 2, after)

  # --- segments -----------------------------------------------------------------------------

  def stage_backward(self, st: Stage, after: tuple[int, ...]) -> tuple[int, ...]:
    start, count = st.placement
    span = [st.placement]
    band = {n: pricing.band_ms(self.m, n, st.placement, self.s.get(n)) for n in st.layers}
    overlap = self.m.options.overlap_allreduce
    comm: tuple[int, ...] = ()
    for name in reversed(st.layers):
      back = pricing.layer_ms(self.m, name, st.placement, self.s.get(name))[1]
      after = self.add(span, "compute", "bwd", name, back, after, st.index)
      if overlap and band[name] > 0:
        comm = self.add(span, "comm", "allreduce", f"all-reduce {name}", band[name],
                        tuple(dict.fromkeys(after + comm)), st.index)
    if any(v > 0 for v in band.values()):
      latency = float(collective_latency_ms(self.m.cluster, start, count))
      label = f"all-reduce stage {st.index}"
      if overlap:
        done = self.add(span, "comm", "allreduce", f"{label} latency", latency,
                        tuple(dict.fromkeys(after + comm)), st.index)
      else:
        done = self.add(span, "comm", "allreduce", label, latency + sum(band.values()), after,
                        st.index)
      after = tuple(dict.fromkeys(after + done))
    # the per-stage terms (program launch, boundaries), at the end of its backward as the
    # planner charges them (pricing.stage_overhead_ms)
    over = pricing.stage_overhead_ms(self.m, st.layers[0], st.layers[-1], count)
    return self.add(span, "compute", "bwd", f"stage {st.index} launch and boundaries", over,
                    after, st.index)

  def move_ms(self, mv: Move) -> float:
    (s0, g0), (s1, g1) = self.a[mv.src], self.a[mv.dst]
    return float(move_ms(self.m.cluster, self.m.batch, self.m.out_bytes[self.m.row[mv.src]],
                         s0, g0, s1, g1))

  def move(self, mv: Move, after: tuple[int, ...], direction: str) -> tuple[int, ...]:
    (s0, g0), (s1, g1) = self.a[mv.src], self.a[mv.dst]
    ms = self.move_ms(mv)
    label = f"{mv.src} -> {mv.dst}" if direction == "fwd" else f"grad {mv.dst} -> {mv.src}"
    return self.add(union_spans((s0, g0), (s1, g1)), "comm", "move", label, ms / 2, after)


def union_spans(a: Span, b: Span) -> list[Span]:
  """Two device ranges as the fewest disjoint ranges covering both."""
  (s0, g0), (s1, g1) = sorted([a, b])
  if s1 <= s0 + g0:
    return [(s0, max(s0 + g0, s1 + g1) - s0)]
  return [(s0, g0), (s1, g1)]


def merge_spans(spans: list[Span]) -> list[Span]:
  """Device ranges as the fewest disjoint ranges covering them all."""
  out: list[Span] = []
  for s, c in sorted(spans):
    if out and s <= out[-1][0] + out[-1][1]:
      first, count = out[-1]
      out[-1] = (first, max(first + count, s + c) - first)
    else:
      out.append((s, c))
  return out
