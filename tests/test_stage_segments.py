"""One stage walk (dp_jax/planner/segments.py) for planner, simulator and runtime: the runtime's
stages come from the plan's segments (runtime/stages.py, segment_runs); on random plans they
are the layers grouped by their devices, and a plan's recorded stages are the ones planner,
simulator and runtime use."""

import dataclasses
import math

import numpy as np
import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import named_cluster
from dp_jax.planner import make_plan
from dp_jax.planner.contract import Plan, check_plan, layout_plan
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.random_plans import placements
from dp_jax.planner.segments import Block, Stage, segments, walk_stages
from dp_jax.planner.synthetic import analytic_profile, random_series_parallel, resnet_like
from dp_jax.runtime.stages import (
  group_stages,
  plan_stages,
  segment_runs,
  series_parallel_order,
)
from dp_jax.simulator.engine import simulate


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


def grouped_by_devices(graph, devices, mesh=None):
  """An independent statement of the runtime's stages on a plan without recorded stages:
  consecutive layers (series-parallel order) on the same devices and mesh shape."""
  runs = []
  for name in series_parallel_order(graph):
    key = (devices[name], None if mesh is None else mesh[name])
    if runs and runs[-1][0] == key:
      runs[-1][1].append(name)
    else:
      runs.append((key, [name]))
  return [tuple(names) for _, names in runs]


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
  assert [s.layers for s in runtime] == grouped_by_devices(graph, devices, mesh)
  assert [s.layers for s in runtime] == [r.layers for r in segment_runs(graph, plan_segments,
                                                                         mesh)]
  for st in runtime:  # one device set and mesh shape per runtime stage
    assert {devices[n] for n in st.layers} == {st.devices}
    assert {mesh[n] for n in st.layers} == {st.mesh_shape}
  # without meshes: every runtime stage is whole segment stages, each segment stage in one
  plain = group_stages(graph, devices)
  assert [s.layers for s in plain] == grouped_by_devices(graph, devices)
  stage_of = {n: i for i, s in enumerate(plain) for n in s.layers}
  for st in segment_stages(plan_segments):
    assert len({stage_of[n] for n in st.layers}) == 1
    assert devices[st.layers[0]] == plain[stage_of[st.layers[0]]].devices
  flat = [n for s in plain for n in s.layers]
  assert flat == series_parallel_order(graph)
  # a checked plan records the walk's stages, and the runtime runs the same stages from them
  checked = check_plan(layout_plan(graph, devices, global_batch=4, num_devices=4), graph,
                       available_devices=4)
  assert [s.layers for s in checked.stages] == [s.layers for s in walk_stages(plan_segments)]
  assert [(s.layers, s.devices) for s in plan_stages(graph, checked)] == [
      (s.layers, s.devices) for s in plain]


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
  assert [s.layers for s in runtime] == [r.layers for r in segment_runs(graph, segs)]


# --- a plan's recorded stages are the ones everybody uses ---------------------------------------


def chain(n=4) -> LayerGraph:
  nodes = [LayerNode(f"l{i}", "linear", (f"l{i - 1}",) if i else (), 1000 * (i + 1),
                     4000 * (i + 1), (16,), 64,
                     attrs={"in_features": 16, "out_features": 16, "bias": True})
           for i in range(n)]
  return LayerGraph("chain", (16,), "float32", tuple(nodes))


def split_chain_plan(graph, global_batch=8, num_devices=2) -> dict:
  """Every layer on all devices, recorded as two stages (the walk alone makes one)."""
  d = layout_plan(graph, lambda n: range(num_devices), global_batch=global_batch,
                  num_devices=num_devices)
  names = graph.names
  d["stages"] = [{"devices": [0, num_devices], "layers": names[:2]},
                 {"devices": [0, num_devices], "layers": names[2:]}]
  return d


def test_a_plan_whose_stages_are_recorded_is_run_with_exactly_those():
  graph = chain()
  plain = check_plan(layout_plan(graph, lambda n: range(2), global_batch=8, num_devices=2),
                     graph, available_devices=2)
  assert [s.layers for s in plain.stages] == [tuple(graph.names)]  # the walk: one stage
  assert [s.layers for s in plan_stages(graph, plain)] == [tuple(graph.names)]
  split = check_plan(split_chain_plan(graph), graph, available_devices=2)
  runtime = plan_stages(graph, split)
  assert [s.layers for s in runtime] == [("l0", "l1"), ("l2", "l3")]
  assert [s.devices for s in runtime] == [(0, 1), (0, 1)]
  assert runtime[0].exports == ("l1",) and runtime[1].inputs == ("l1",)
  # the stages travel with the plan's JSON (to pinned processes, to plan.json)
  again = Plan.from_json(split.to_json(), planned=False)
  assert [s.layers for s in plan_stages(graph, again)] == [("l0", "l1"), ("l2", "l3")]
  # a background job's pieces still cut inside them
  cut = plan_stages(graph, split, breaks={"l1", "l3"})
  assert [s.layers for s in cut] == [("l0",), ("l1",), ("l2",), ("l3",)]


def test_the_planner_and_the_simulator_price_the_recorded_stages():
  graph = chain()
  profile = analytic_profile(graph, (1, 2, 4, 8))
  cluster = named_cluster("a100_nvlink_8")
  opts = PlanOptions(num_devices=2, global_batch=8, amplification_limit=math.inf)
  model = build_cost_model(graph, profile, cluster, opts)
  split = check_plan(split_chain_plan(graph), graph, available_devices=2)
  a = split.assignment()
  one, two = evaluate(model, a), evaluate(model, a, stages=split.stage_layers)
  assert len(one.stages) == 1 and [s.layers for s in two.stages] == [("l0", "l1"), ("l2", "l3")]
  assert two.overhead_ms > one.overhead_ms  # two launches and a boundary
  assert not two.moves  # a stage that ends on its devices moves no samples
  sim = simulate(graph, profile, cluster, dataclasses.replace(split, cluster=cluster.name,
                                                               options=opts))
  assert [s.layers for s in sim.evaluation.stages] == [("l0", "l1"), ("l2", "l3")]
  assert {t.stage for t in sim.timeline.tasks} == {0, 1}
  assert sim.timeline.iteration_ms == pytest.approx(two.iteration_ms, rel=1e-9)


def test_a_planner_plan_records_the_stages_it_priced():
  graph = resnet_like(blocks=(1,), width=8)
  plan = make_plan(graph, analytic_profile(graph, (1, 2, 4, 8)), named_cluster("a100_nvlink_8"),
                   num_devices=4, global_batch=8, amplification_limit=math.inf)
  walked = walk_stages(segments(graph, plan.assignment()))
  assert [(s.placement, s.layers) for s in plan.stages] == [(s.placement, s.layers)
                                                            for s in walked]
  assert all("compute_ms" in s.extra for s in plan.stages)  # as the planner priced them
  checked = check_plan(plan, graph, available_devices=4)
  assert checked.stages == plan.stages  # checked, not walked again


@pytest.mark.parametrize("stages, needle", [
    ([["l0", "l2"], ["l1", "l3"]], "plan stage 0 (l0, l2) is not one run"),
    ([["l0", "l1"], ["l3"]], "leave out layer(s) l2"),
    ([["l0", "l1", "l2", "l3"], ["l0"]], "lists layer 'l0' again"),
    ([["l2", "l3"], ["l0", "l1"]], "plan stage 0 (l2, l3) is not one run"),
])
def test_recorded_stages_the_walk_cannot_make_are_refused(stages, needle):
  graph = chain()
  d = split_chain_plan(graph)
  d["stages"] = [{"devices": [0, 2], "layers": s} for s in stages]
  with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
    check_plan(d, graph, available_devices=2)


def test_a_stage_on_other_devices_than_its_layers_is_refused():
  graph = chain()
  d = split_chain_plan(graph)
  d["stages"][1]["devices"] = [1, 1]
  with pytest.raises(UserError, match="stages\\[1\\] is on devices 1..1 but its layer 'l2'"):
    Plan.from_json(d, planned=False)
