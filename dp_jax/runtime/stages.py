"""Stages: runs of consecutive layers (series-parallel order) that share one device set.

On a plan of contiguous device ranges the runtime's stages are the planner's segments'
stages (dp_jax/planner/segments.py, the walk evaluate and the simulator price) with two rules of
the runtime's own: consecutive segment stages on the same devices are one program (a fork's
run with a first branch on its devices, a branch with the next or with its join), and a run
is cut where its layers' (data, model) mesh shape changes. `segment_runs` states this on the
segments; tests/test_stage_segments.py checks group_stages against it on random plans.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from dp_jax.graph.layer_graph import LayerGraph, LayerNode, flat_layers
from dp_jax.planner import segments as seg

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


def group_stages(graph: LayerGraph, devices_of: Mapping[str, Sequence[int]],
                 breaks: Collection[str] = (),
                 mesh_of: Mapping[str, tuple[int, int]] | None = None) -> list[Stage]:
  """Fuse consecutive layers (series-parallel order) placed on the same ordered device set and
  mesh shape (mesh_of; default (count, 1)); a layer in `breaks` always starts a new stage (a
  background job's pieces)."""
  runs: list[tuple[tuple[int, ...], list[str], tuple[int, int]]] = []
  for name in series_parallel_order(graph):
    devs = tuple(devices_of[name])
    shape = tuple(mesh_of[name]) if mesh_of is not None else (len(devs), 1)
    if runs and runs[-1][0] == devs and runs[-1][2] == shape and name not in breaks:
      runs[-1][1].append(name)
    else:
      runs.append((devs, [name], shape))
  stage_of = {n: i for i, (_, names, _) in enumerate(runs) for n in names}
  readers: dict[str, set[int]] = {n: set() for n in graph.names}
  for node in graph.nodes:
    for p in node.inputs:
      readers[p].add(stage_of[node.name])
  stages = []
  for i, (devs, names, shape) in enumerate(runs):
    inputs: list[str] = []
    for n in names:
      for p in graph.node(n).inputs or (INPUT,):
        if (p == INPUT or stage_of[p] != i) and p not in inputs:
          inputs.append(p)
    exports = [n for n in names if readers[n] - {i} or n == graph.sink]
    stages.append(Stage(i, devs, tuple(names), tuple(inputs), tuple(exports), shape))
  return stages


def segment_runs(graph: LayerGraph, segments: Sequence[seg.Segment],
                 mesh_of: Mapping[str, tuple[int, int]] | None = None) -> list[tuple[str, ...]]:
  """The layers of each runtime stage, from a plan's segments (seg.segments(graph, a)): their
  stages in series-parallel order (a block's branches in graph order), consecutive ones on the
  same placement fused, each cut where mesh_of (default: one shape) changes."""
  position = {n: i for i, n in enumerate(series_parallel_order(graph))}

  def stages(items: Sequence[seg.Segment]):
    for item in items:
      if isinstance(item, seg.Stage):
        yield item
      elif isinstance(item, seg.Block):
        branches = sorted((b for group in item.groups for b in group),
                          key=lambda b: position[b.move_in.dst])
        for branch in branches:
          yield from stages(branch.body)

  runs: list[tuple[object, list[str]]] = []
  for st in stages(segments):
    if runs and runs[-1][0] == st.placement:
      runs[-1][1].extend(st.layers)
    else:
      runs.append((st.placement, list(st.layers)))
  shape = (lambda n: tuple(mesh_of[n])) if mesh_of is not None else (lambda n: None)
  out: list[tuple[str, ...]] = []
  for _, names in runs:
    cut = [0] + [i for i in range(1, len(names)) if shape(names[i]) != shape(names[i - 1])]
    out.extend(tuple(names[a:b]) for a, b in zip(cut, [*cut[1:], len(names)], strict=True))
  return out


def structure_graph(model, name: str) -> LayerGraph:
  """The layer wiring of a zoo model as a LayerGraph without costs (no tracing needed)."""
  nodes = [LayerNode(name=s.name, kind=s.kind, inputs=tuple(s.inputs), attrs=dict(s.attrs))
           for s in model.layer_specs()]
  return LayerGraph(model=name, input_shape=(), input_dtype="float32", nodes=tuple(nodes))
