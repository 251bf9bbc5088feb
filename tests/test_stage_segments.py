"""The runtime's stage grouping agrees with the planner's segments (dp_jax/planner/segments.py):
on random plans, group_stages gives the segments' stages with the runtime's two rules."""

import numpy as np
import pytest

from dp_jax.planner.random_plans import placements
from dp_jax.planner.segments import Block, Stage, segments
from dp_jax.planner.synthetic import random_series_parallel
from dp_jax.runtime.stages import group_stages, segment_runs, series_parallel_order


def random_plan(rng, graph, num_devices=4):
  """Each layer on one of three random placements (so neighbours often share one), and a
  random (data, model) mesh of its devices for some layers."""
  options = placements((1, 2, 4), num_devices)
  picks = [options[int(i)] for i in rng.choice(len(options), size=3, replace=False)]
  assignment = {n: picks[int(rng.integers(3))] for n in graph.names}
  mesh = {}
  for n, (_, count) in assignment.items():
    m = int(rng.choice([d for d in (1, 2, 4) if count % d == 0])) if rng.random() < 0.3 else 1
    mesh[n] = (count // m, m)
  return assignment, mesh


def segment_stages(items):
  for item in items:
    if isinstance(item, Stage):
      yield item
    elif isinstance(item, Block):
      for group in item.groups:
        for branch in group:
          yield from segment_stages(branch.body)


@pytest.mark.parametrize("seed", range(40))
def test_runtime_stages_are_the_segments_stages(seed):
  rng = np.random.default_rng(seed)
  graph = random_series_parallel(rng, max_layers=int(rng.integers(4, 12)))
  assignment, mesh = random_plan(rng, graph)
  devices = {n: tuple(range(s, s + c)) for n, (s, c) in assignment.items()}
  plan_segments = segments(graph, assignment)
  runtime = group_stages(graph, devices, mesh_of=mesh)
  assert [s.layers for s in runtime] == segment_runs(graph, plan_segments, mesh)
  for st in runtime:  # one device set and mesh shape per runtime stage
    assert {devices[n] for n in st.layers} == {st.devices}
    assert {mesh[n] for n in st.layers} == {st.mesh_shape}
  # without meshes: every runtime stage is whole segment stages, each segment stage in one
  plain = group_stages(graph, devices)
  assert [s.layers for s in plain] == segment_runs(graph, plan_segments)
  stage_of = {n: i for i, s in enumerate(plain) for n in s.layers}
  for st in segment_stages(plan_segments):
    assert len({stage_of[n] for n in st.layers}) == 1
    assert devices[st.layers[0]] == plain[stage_of[st.layers[0]]].devices
  flat = [n for s in plain for n in s.layers]
  assert flat == series_parallel_order(graph)


def test_a_fork_and_its_first_branch_on_the_same_devices_are_one_runtime_stage():
  """Where the two differ: the segments keep a fork's run and a branch apart (the planner
  prices them as two stages), the runtime compiles them as one program."""
  rng = np.random.default_rng(0)
  for _ in range(200):
    graph = random_series_parallel(rng, max_layers=8)
    blocks = graph.fork_join_blocks()
    if blocks and all(len(b) for b in blocks[0].branches):
      break
  block = blocks[0]
  a = {n: (0, 2) for n in graph.names}
  for n in block.branches[1]:
    a[n] = (2, 2)  # the second branch elsewhere: the block is not merged into one stage
  segs = segments(graph, a)
  planner_stages = [s.layers for s in segment_stages(segs)]
  runtime = group_stages(graph, {n: tuple(range(s, s + c)) for n, (s, c) in a.items()})
  assert len(runtime) < len(planner_stages)
  fork_stage = next(s for s in runtime if block.fork in s.layers)
  assert block.branches[0][0] in fork_stage.layers
  assert [s.layers for s in runtime] == segment_runs(graph, segs)
