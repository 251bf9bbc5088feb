"""The burst DP is optimal against evaluate(): brute force on small random graphs."""

import itertools
import math

import numpy as np
import pytest
from forkjoin_brute import with_stage_terms
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.search import build_tables, search
from dp_jax.planner.structure import flat_layers, plan_order
from dp_jax.planner.synthetic import cluster as synthetic_cluster
from dp_jax.planner.synthetic import linear_profile, random_series_parallel

SHAPES = [(4, 12), (6, 6), (8, 8), (4, 8)]  # (G, B): candidate counts 1,2,3,4 / 1,2,3,6 / ...


def enum_chain(chain, allowed, g):
  """Every assignment of the plan space (see search.py) for a chain on prefixes."""
  parts = []
  for item in chain.items:
    if isinstance(item, str):
      parts.append([{item: (0, c)} for c in allowed[item]])
    else:
      parts.append(list(enum_block(item, allowed, g)))
  for combo in itertools.product(*parts):
    yield {k: v for part in combo for k, v in part.items()}


def set_partitions(items):
  """Every partition of `items` into non-empty groups."""
  if not items:
    yield []
    return
  first, rest = items[0], items[1:]
  for part in set_partitions(rest):
    yield [[first], *part]
    for i in range(len(part)):
      yield [*part[:i], [first, *part[i]], *part[i + 1:]]


def group_ranges(groups, allowed, g):
  """Per group, every range [s, s + c) with c allowed for all of its layers."""
  out = []
  for group in groups:
    counts = set.intersection(*[set(allowed[n]) for b in group for n in flat_layers(b)])
    out.append([(s, c) for c in sorted(counts) for s in range(g - c + 1)])
  return out


def enum_block(block, allowed, g):
  """Serialized (each branch a chain on prefixes) or groups of branches, each group one after
  another on one range at one count, ranges disjoint anywhere in [0, G). (The planner's space
  also lets a short branch change count inside its lane: tests/test_planner_forkjoin.py.)"""
  branches = [b for b in block.branches if b.items]
  for combo in itertools.product(*[list(enum_chain(b, allowed, g)) for b in branches]):
    yield {k: v for part in combo for k, v in part.items()}
  for groups in set_partitions(branches):
    for ranges in itertools.product(*group_ranges(groups, allowed, g)):
      masks = [((1 << c) - 1) << s for s, c in ranges]
      if any(masks[i] & masks[j] for i in range(len(masks)) for j in range(i)):
        continue
      yield {n: r for group, r in zip(groups, ranges, strict=True)
             for b in group for n in flat_layers(b)}


def space_size(chain, allowed, g):
  """Upper bound on the number of assignments."""
  total = 1
  for item in chain.items:
    if isinstance(item, str):
      total *= len(allowed[item])
    else:
      branches = [b for b in item.branches if b.items]
      total *= math.prod(space_size(b, allowed, g) for b in branches) + sum(
          math.prod(len(r) for r in group_ranges(groups, allowed, g))
          for groups in set_partitions(branches))
  return total


def random_case(seed, overlap):
  rng = np.random.default_rng(seed)
  graph = random_series_parallel(rng, max_layers=7)
  g, b = SHAPES[seed % len(SHAPES)]
  cluster = synthetic_cluster("t", "synthetic", 64, int(rng.choice([1, 2, 4, 8])), 4096.0,
                        float(rng.uniform(1, 50)), float(rng.uniform(0, 30)),
                        float(rng.uniform(0.1, 5)), float(rng.uniform(0, 100)),
                        update_memory_GBps=1e3)
  profile = linear_profile(graph, [1, 2, 3, 4, 6, 8, 12], rng)
  opts = PlanOptions(num_devices=g, global_batch=b, overlap_allreduce=overlap,
                     amplification_limit=math.inf)
  model = build_cost_model(graph, profile, cluster, opts)
  mask = rng.random(model.compute_ms.shape) < 0.75
  mask[np.arange(len(mask)), rng.integers(0, mask.shape[1], len(mask))] = True
  allowed = {n: [int(model.counts[c]) for c in np.flatnonzero(mask[i])]
             for i, n in enumerate(model.names)}
  return model, mask, allowed


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(seed=st.integers(0, 10**6), overlap=st.booleans())
def test_dp_equals_brute_force(seed, overlap):
  model, mask, allowed = random_case(seed, overlap)
  top = model.graph.decompose()
  assume(space_size(top, allowed, model.options.num_devices) <= 3000)
  assignment, _, value = search(build_tables(model, mask))[:3]
  assert all(mask[model.row[n], list(model.counts).index(c)] for n, (_, c) in assignment.items())
  assert evaluate(model, assignment).iteration_ms == np.float64(value) or math.isclose(
      evaluate(model, assignment).iteration_ms, value, rel_tol=1e-9)
  best = min(evaluate(model, a).iteration_ms
             for a in enum_chain(top, allowed, model.options.num_devices))
  assert value <= best * (1 + 1e-9) + 1e-12  # the space also has count changes inside lanes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(seed=st.integers(0, 10**6), overlap=st.booleans())
def test_dp_optimizes_per_stage_terms(seed, overlap):
  """Random nonzero per-stage terms (CostModel.stage_ms, enter_ms, leave_ms): the search's value
  is its plan's evaluate() cost, and no plan of the enumerated space is faster."""
  model, mask, allowed = random_case(seed, overlap)
  model = with_stage_terms(model, seed)
  top = model.graph.decompose()
  assume(space_size(top, allowed, model.options.num_devices) <= 3000)
  assignment, _, value = search(build_tables(model, mask))[:3]
  assert evaluate(model, assignment).iteration_ms == pytest.approx(value, rel=1e-9)
  best = min(evaluate(model, a).iteration_ms
             for a in enum_chain(top, allowed, model.options.num_devices))
  assert value <= best * (1 + 1e-9) + 1e-12


def graph_of(edges: dict[str, list[str]]) -> LayerGraph:
  rng = np.random.default_rng(len(edges))
  nodes = [LayerNode(name=n, kind="x", inputs=tuple(ins), params=int(rng.integers(0, 10**6)),
                     param_bytes=0, out_bytes_per_sample=int(rng.integers(1, 10**5)))
           for n, ins in edges.items()]
  return LayerGraph(model="hand", input_shape=(1,), input_dtype="float32", nodes=tuple(nodes))


HAND = {
    "chain": {"a": [], "b": ["a"], "c": ["b"], "d": ["c"], "e": ["d"], "f": ["e"]},
    "resnet": {"a": [], "b": ["a"], "c": ["b"], "add": ["c", "a"], "r": ["add"], "m": ["r"],
               "down": ["r"], "add2": ["m", "down"]},
    "inception": {"a": [], "b1": ["a"], "b2": ["a"], "b3": ["b2"], "n": ["a"], "n1": ["n"],
                  "n2": ["n"], "ncat": ["n1", "n2"], "cat": ["b1", "b3", "ncat"]},
}


@pytest.mark.parametrize("name", sorted(HAND))
@pytest.mark.parametrize("overlap", [False, True])
def test_dp_equals_brute_force_on_hand_made_blocks(name, overlap):
  graph = graph_of(HAND[name])
  top = graph.decompose()
  for seed in range(4):
    rng = np.random.default_rng(seed)
    cluster = synthetic_cluster("t", "synthetic", 4, 2, 4096.0, 20.0, 5.0, 2.0, 30.0,
                          update_memory_GBps=1e3)
    model = build_cost_model(graph, linear_profile(graph, [1, 2, 4, 8], rng), cluster,
                             PlanOptions(num_devices=8, global_batch=8, overlap_allreduce=overlap,
                                         amplification_limit=math.inf))
    mask = np.ones(model.compute_ms.shape, dtype=bool)
    allowed = {n: [int(c) for c in model.counts] for n in model.names}
    while space_size(top, allowed, 8) > 4000:
      i = int(rng.integers(len(model.names)))
      if mask[i].sum() > 1:
        mask[i, rng.choice(np.flatnonzero(mask[i]))] = False
        allowed[model.names[i]] = [int(model.counts[c]) for c in np.flatnonzero(mask[i])]
    _, _, value = search(build_tables(model, mask))[:3]
    best = min(evaluate(model, a).iteration_ms for a in enum_chain(top, allowed, 8))
    assert value <= best * (1 + 1e-9)  # the space also has count changes inside lanes


def test_space_size_bounds_enumeration():
  for seed in range(40):
    model, _, allowed = random_case(seed, True)
    top = model.graph.decompose()
    g = model.options.num_devices
    if space_size(top, allowed, g) <= 3000:
      assert space_size(top, allowed, g) >= sum(1 for _ in enum_chain(top, allowed, g)) > 0


def test_plan_covers_every_layer_once_within_g():
  for seed in range(30):
    model, mask, _ = random_case(seed, seed % 2 == 0)
    assignment, _, _ = search(build_tables(model, mask))[:3]
    assert sorted(assignment) == sorted(plan_order(model.graph.decompose()))
    for start, count in assignment.values():
      assert 0 <= start and start + count <= model.options.num_devices
