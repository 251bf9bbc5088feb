"""No assignment evaluate() accepts beats the planner by more than FORKJOIN_MARGIN (G = 4).

Brute force over every layer on every contiguous device range (tests/forkjoin_brute.py), on
random fork/join graphs (G = B = 4; 2-3 branches of up to 2 layers). FORKJOIN_MARGIN is
measured, not proven: on the slow set (48 graphs of up to 6 layers) a plan outside the
planner's space (dp_jax/planner/search/__init__.py docstring: fork and join off the prefix)
won once, by 0.37%; every other graph is solved exactly (docs/cost_model.md).
"""

import math

import numpy as np
import pytest
from forkjoin_brute import (
  branch_mask,
  brute_force,
  pinned_pairs,
  planner,
  random_model,
  restrictions,
)

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.planner import make_plan
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.search import build_tables, lanes, lower_bound, search
from dp_jax.planner.search.chains import _lane
from dp_jax.planner.search.lanes import _lane_plan
from dp_jax.planner.synthetic import cluster as synthetic_cluster
from dp_jax.planner.synthetic import linear_profile
from dp_jax.simulator.engine import simulate
from dp_jax.simulator.metrics import metrics

FORKJOIN_MARGIN = 0.01  # relative; measured max 0.37%


def small_seeds(count: int, max_layers: int, **kw):
  """The first `count` seeds whose graph has at most `max_layers` layers."""
  out, seed = [], 0
  while len(out) < count:
    if len(random_model(seed, **kw).names) <= max_layers:
      out.append(seed)
    seed += 1
  return out


def check(seed: int, **kw) -> float:
  model = random_model(seed, **kw)
  best, _ = brute_force(model)
  ms, _ = planner(model)
  assert ms >= best * (1 - 1e-9)  # the brute force sees every plan the planner can return
  assert ms <= best * (1 + FORKJOIN_MARGIN), (seed, ms, best)
  return ms / best - 1


def exact_tier(seed: int, **kw) -> bool:
  """The block's lane search runs its exact tier."""
  model = random_model(seed, **kw)
  t = build_tables(model, np.ones(model.compute_ms.shape, dtype=bool))
  block = next(i for i in model.graph.decompose().items if not isinstance(i, str))
  lanes = [_lane(t, b, model.row[block.fork]) for b in block.branches if b.items]
  plan = _lane_plan(t, lanes)
  return plan is not None and plan.tau_f is not None


@pytest.mark.parametrize("seed", small_seeds(4, 4))
def test_planner_within_margin_of_every_assignment(seed):
  check(seed)


def test_small_blocks_run_the_exact_lane_search():
  assert all(exact_tier(seed) for seed in small_seeds(16, 6))


def test_simulator_runs_the_wider_layouts_as_priced():
  """Plans with lanes off device 0, mixed groups and count changes inside a lane: the
  simulator's alone timeline equals the planner's prediction (within 0.1%)."""
  seen = set()
  for seed in small_seeds(24, 6):
    m = random_model(seed)
    plan = make_plan(m.graph, m.profile, m.cluster, num_devices=4, global_batch=4,
                     overlap_allreduce=m.options.overlap_allreduce, check_memory=False,
                     amplification_limit=math.inf)
    sim = metrics(simulate(m.graph, m.profile, m.cluster, plan, switch_ms=0.01))
    assert sim["alone_iteration_ms"] == pytest.approx(plan.predicted["iteration_ms"], rel=1e-3)
    assert sim["gpu_ms"] == pytest.approx(plan.predicted["gpu_ms"], rel=1e-3)
    seen |= restrictions(m, plan.assignment())
  assert {"lanes not packed from 0 in branch order", "mixed groups",
          "count change in a concurrent branch"} <= seen  # the check covers every new layout


@pytest.mark.slow
def test_planner_within_margin_on_bigger_graphs():
  seeds = small_seeds(48, 6)
  assert all(exact_tier(seed) for seed in seeds)
  gaps = [check(seed) for seed in seeds]
  assert math.isfinite(max(gaps))
  print(f"brute force wins {sum(g > 1e-9 for g in gaps)} of {len(gaps)}, max {max(gaps):.2%}")


def elementwise_seeds(count: int, max_free: int = 4) -> list[int]:
  """The first `count` seeds (random_model with half the branch layers relu) whose block has a
  branch opening with an elementwise layer and at most `max_free` layers not pinned to their
  producers."""
  out, seed = [], 0
  while len(out) < count:
    m = random_model(seed, elementwise=0.5)
    pins = pinned_pairs(m)
    if (len(m.names) - len(pins) <= max_free
        and any(src == m.names[0] for _, src in pins)):
      out.append(seed)
    seed += 1
  return out


def test_no_claimed_plan_beats_the_planner_with_elementwise_opened_branches():
  """Over every assignment of the claimed space (forkjoin_brute.in_claimed_space, elementwise
  layers on their producers' devices) the planner's plan is optimal. Before branches opening
  with an elementwise layer could run in concurrent lanes, 39 of the first 80 such seeds had
  a faster plan, by up to 46%."""
  for seed in elementwise_seeds(30):
    model = random_model(seed, elementwise=0.5)
    assert exact_tier(seed, elementwise=0.5)
    best, _ = brute_force(model, claimed=True)
    ms, _ = planner(model)
    assert ms <= best * (1 + 1e-9), (seed, ms, best)


def issue_model(seed: int = 0):
  """stem -> branch a: relu -> relu; branch b: one layer; join add(a, b, stem); head; on two
  nodes of two devices, B = 4."""
  rng = np.random.default_rng(seed)

  def layer(name, inputs):
    p = int(rng.integers(1, 10**6))
    return LayerNode(name, "synthetic", inputs, p, 4 * p,
                     out_bytes_per_sample=int(rng.integers(1, 10**5)))

  stem = layer("stem", ())
  out = stem.out_bytes_per_sample
  nodes = (stem, LayerNode("a1", "relu", ("stem",), 0, 0, out_bytes_per_sample=out),
           LayerNode("a2", "relu", ("a1",), 0, 0, out_bytes_per_sample=out), layer("b", ("stem",)),
           LayerNode("add", "add", ("a2", "b", "stem"), 0, 0, out_bytes_per_sample=out))
  nodes += (layer("head", ("add",)),)
  graph = LayerGraph("issue", (1,), "float32", nodes)
  cluster = synthetic_cluster("t", "synthetic", 4, 2, 4096.0, float(rng.uniform(1, 50)),
                        float(rng.uniform(0, 30)), float(rng.uniform(0.1, 5)),
                        float(rng.uniform(0, 100)), update_memory_GBps=1e3)
  profile = linear_profile(graph, [1, 2, 4], rng)
  opts = PlanOptions(num_devices=4, global_batch=4, overlap_allreduce=bool(rng.random() < 0.5),
                     amplification_limit=math.inf)
  return build_cost_model(graph, profile, cluster, opts)


def test_a_branch_opening_with_relu_runs_beside_the_other_branch():
  """The issue's block: branch a (relu, relu) and branch b run side by side (14% faster than b
  after a on device 0, the plan before), at least as fast as every plan keeping a on the
  stem's device (a branch may now open with an elementwise layer anywhere: here a runs on two
  other devices, 4.6% faster still)."""
  model = issue_model(0)
  best, _ = brute_force(model, claimed=True)  # a on the stem's devices
  ms, a = planner(model)
  assert ms <= best * (1 + 1e-9)
  block = model.graph.decompose().items[1]
  lane_a, lane_b = (branch_mask(b, a) for b in block.branches if b.items)
  assert a["a1"] == a["a2"] and lane_a & lane_b == 0, a
  serial = dict(a, b=a["a1"])
  assert evaluate(model, serial).iteration_ms > 1.1 * ms


@pytest.mark.parametrize("elementwise", [0.0, 0.5])
def test_the_planner_optimizes_per_stage_terms_exactly(elementwise):
  """With random nonzero per-stage terms (dispatch, boundaries: CostModel.stage_ms, enter_ms,
  leave_ms) the search's value is its plan's evaluate() cost and no assignment of the claimed
  space is faster (merged, serialized and concurrent blocks, count changes inside lanes)."""
  seeds = elementwise_seeds(12) if elementwise else small_seeds(12, 5)
  for seed in seeds:
    model = random_model(seed, elementwise=elementwise, stage_terms=True)
    assert model.stage_ms is not None and model.enter_ms.any()
    best, _ = brute_force(model, claimed=True)
    ms, _ = planner(model)  # asserts the search's value is evaluate()'s
    assert ms <= best * (1 + 1e-9), (seed, ms, best)


@pytest.mark.parametrize("tier", ["packed", "groups"])
def test_lower_bound_brackets_the_heuristic_tiers(monkeypatch, tier):
  """With the lane search forced into a heuristic tier, lower_bound is at most the optimum of
  that tier's space (brute force: groups on lanes at one count) and the search's plan at least
  it; in the exact tier the bound is the search's value and no block is heuristic."""
  seeds = small_seeds(10, 5)
  for seed in seeds:
    model = random_model(seed, stage_terms=seed % 2 == 1)
    t = build_tables(model, np.ones(model.compute_ms.shape, dtype=bool))
    found = search(t)
    assert found.heuristic_blocks == 0
    assert lower_bound(t) == pytest.approx(found.iteration_ms, rel=1e-12)
  monkeypatch.setattr(lanes, "GROUP_CELLS", 0 if tier == "packed" else 1e12)
  monkeypatch.setattr(lanes, "EXACT_CELLS", 0)
  gaps = []
  for seed in seeds:
    model = random_model(seed, stage_terms=seed % 2 == 1)
    t = build_tables(model, np.ones(model.compute_ms.shape, dtype=bool))
    found = search(t)
    assert found.heuristic_blocks == 1
    best, _ = brute_force(model, claimed=True, count_changes=False)
    low = lower_bound(t)
    assert low <= best * (1 + 1e-9) and best <= found.iteration_ms * (1 + 1e-9), (seed, low, best)
    gaps.append(found.iteration_ms / low - 1)
  assert max(gaps) > 0  # the bound is not the plan's value


def test_the_plan_reports_its_bound_and_gap(monkeypatch, tmp_path):
  """make_plan writes the lower bound, the plan's gap to it and the heuristic blocks into the
  plan JSON: exact (gap 0) in the exact tier, a finite gap >= 0 when lanes were packed."""
  from dp_jax.planner import Plan

  m = random_model(small_seeds(1, 5)[0])
  kw = dict(num_devices=4, global_batch=4, overlap_allreduce=m.options.overlap_allreduce,
            check_memory=False)
  exact = make_plan(m.graph, m.profile, m.cluster, **kw).extra["optimality"]
  assert exact["exact"] and exact["gap"] == pytest.approx(0.0, abs=1e-12)
  monkeypatch.setattr(lanes, "GROUP_CELLS", 0)
  plan = make_plan(m.graph, m.profile, m.cluster, **kw)
  loaded = Plan.load(plan.save(tmp_path / "plan.json")).extra["optimality"]
  assert loaded["heuristic_blocks"] == 1 and not loaded["exact"]
  assert loaded["gap"] >= -1e-12 and loaded["lower_bound_ms"] <= plan.predicted["iteration_ms"]
