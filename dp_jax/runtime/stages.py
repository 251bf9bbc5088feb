"""Stages: runs of consecutive layers (series-parallel order) that share one device set.

The runtime's stages are a plan's stages (the planner's segments, dp_jax/planner/segments.py:
the walk evaluate and the simulator price, as the checked plan records them) with the
runtime's rules, stated once in `segment_runs`: consecutive segment stages on the same devices
on either side of a fork/join block's edge are one program (a fork's run with a first branch
on its devices, a branch with the next or with its join; two stages of one chain stay two, as
the plan records them), and a run is cut where its layers' (data, model) mesh shape changes
and before a layer in `breaks` (a background job's pieces). tests/test_stage_segments.py
checks them against layers grouped by their devices on random plans.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dp_jax.graph.layer_graph import LayerGraph, LayerNode, flat_layers
from dp_jax.planner import segments as seg

if TYPE_CHECKING:
  from dp_jax.planner.contract import Plan

INPUT = "<input>"  # producer name of the model input


@dataclass(frozen=True)
class Stage:
  """Layers compiled as one program on one device set; exports are read by later stages."""

  index: int
  devices: tuple[int, ...]
  layers: tuple[str, ...]
  inputs: tuple[str, ...]  # producers outside the stage it reads (INPUT: the model input)
  exports: tuple[str, ...]  # its layers read by later stages, and the model output
  mesh_shape: tuple[int, int] = (0, 0)  # (data, model); (0, 0): (len(devices), 1)

  def __post_init__(self):
    if self.mesh_shape == (0, 0):
      object.__setattr__(self, "mesh_shape", (len(self.devices), 1))


def series_parallel_order(graph: LayerGraph) -> list[str]:
  """Every layer once: fork, then each branch in full, then the join (a topological order)."""
  return list(flat_layers(graph.decompose()))


def plan_stages(graph: LayerGraph, plan: Plan, breaks: Collection[str] = ()) -> list[Stage]:
  """The runtime's stages of a checked plan: its recorded stages (planner.contract.check_plan
  records them) walked into segments, with the runtime's rules (segment_runs); a layer in
  `breaks` starts a new stage."""
  if not plan.stages:
    raise TypeError("the runtime takes a Plan checked by planner.contract.check_plan (which "
                    "records its stages)")
  mesh_of = {lp.name: lp.mesh for lp in plan.layers}
  return _stages(graph, segment_runs(graph, plan.walk(graph), mesh_of, breaks), mesh_of)


def group_stages(graph: LayerGraph, devices_of: Mapping[str, Sequence[int]],
                 breaks: Collection[str] = (),
                 mesh_of: Mapping[str, tuple[int, int]] | None = None) -> list[Stage]:
  """The runtime's stages of a layout without a plan (each layer on a contiguous device range,
  its mesh shape mesh_of, default (count, 1); the profile's prefixes): the walk's stages with
  the runtime's rules, as plan_stages."""
  assignment = {}
  for name, devs in devices_of.items():
    devs = tuple(devs)
    if devs != tuple(range(devs[0], devs[0] + len(devs))):
      raise ValueError(f"layer '{name}' is on devices {list(devs)}, not a contiguous range")
    assignment[name] = (devs[0], len(devs))
  return _stages(graph, segment_runs(graph, seg.segments(graph, assignment), mesh_of, breaks),
                 mesh_of)


def segment_runs(graph: LayerGraph, segments: Sequence[seg.Segment],
                 mesh_of: Mapping[str, tuple[int, int]] | None = None,
                 breaks: Collection[str] = ()) -> list[seg.Stage]:
  """The runtime's stages (index, placement, layers) from a plan's segments: their stages in
  series-parallel order (a block's branches in graph order); two consecutive ones on the same
  placement fused where a block's edge lies between them (not two stages of one chain); each
  cut where mesh_of (default: one shape) changes and before a layer in `breaks`."""
  position = {n: i for i, n in enumerate(series_parallel_order(graph))}

  def stages(items: Sequence[seg.Segment]) -> Iterator[tuple[seg.Stage, bool]]:
    """(stage, whether it may join the stage before: not when that one is the chain's item
    just before it)."""
    after_stage = False
    for item in items:
      if isinstance(item, seg.Stage):
        yield item, not after_stage
      elif isinstance(item, seg.Block):
        branches = sorted((b for group in item.groups for b in group),
                          key=lambda b: position[b.move_in.dst])
        for branch in branches:
          yield from stages(branch.body)
      after_stage = isinstance(item, seg.Stage)

  runs: list[tuple[seg.Placement, list[str]]] = []
  for st, may_join in stages(segments):
    if runs and may_join and runs[-1][0] == st.placement:
      runs[-1][1].extend(st.layers)
    else:
      runs.append((st.placement, list(st.layers)))
  shape = (lambda n: tuple(mesh_of[n])) if mesh_of is not None else (lambda n: None)
  out: list[seg.Stage] = []
  for placement, names in runs:
    cut = [0] + [i for i in range(1, len(names))
                 if shape(names[i]) != shape(names[i - 1]) or names[i] in breaks]
    for a, b in zip(cut, [*cut[1:], len(names)], strict=True):
      out.append(seg.Stage(len(out), placement, tuple(names[a:b])))
  return out


def _stages(graph: LayerGraph, runs: Sequence[seg.Stage],
            mesh_of: Mapping[str, tuple[int, int]] | None) -> list[Stage]:
  """Runtime stages of runs (in order): each run's devices, mesh shape, the producers it reads
  and the layers it exports."""
  stage_of = {n: r.index for r in runs for n in r.layers}
  readers: dict[str, set[int]] = {n: set() for n in graph.names}
  for node in graph.nodes:
    for p in node.inputs:
      readers[p].add(stage_of[node.name])
  stages = []
  for r in runs:
    i, (start, count) = r.index, r.placement
    inputs: list[str] = []
    for n in r.layers:
      for p in graph.node(n).inputs or (INPUT,):
        if (p == INPUT or stage_of[p] != i) and p not in inputs:
          inputs.append(p)
    exports = [n for n in r.layers if readers[n] - {i} or n == graph.sink]
    shape = tuple(mesh_of[r.layers[0]]) if mesh_of is not None else (count, 1)
    stages.append(Stage(i, tuple(range(start, start + count)), r.layers, tuple(inputs),
                        tuple(exports), shape))
  return stages


def structure_graph(model, name: str) -> LayerGraph:
  """The layer wiring of a zoo model as a LayerGraph without costs (no tracing needed)."""
  nodes = [LayerNode(name=s.name, kind=s.kind, inputs=tuple(s.inputs), attrs=dict(s.attrs))
           for s in model.layer_specs()]
  return LayerGraph(model=name, input_shape=(), input_dtype="float32", nodes=tuple(nodes))
