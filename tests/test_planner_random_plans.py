"""Random valid plans: inside the planner's space, distinct, seeded."""

import numpy as np

from dp_jax.planner import evaluate_plan
from dp_jax.planner.random_plans import placements, random_assignments
from dp_jax.planner.synthetic import analytic_profile, resnet_like
from tests.sim_helpers import cluster


def test_placements_stay_inside_the_devices():
  ps = placements([1, 2, 4], 4)
  assert (0, 4) in ps and (3, 1) in ps and (2, 2) in ps
  assert all(s + c <= 4 for s, c in ps)
  assert len(ps) == 4 + 3 + 1


def test_random_assignments_are_distinct_seeded_and_evaluable():
  graph = resnet_like(blocks=(1, 1), width=8)
  profile = analytic_profile(graph, [2, 4, 8])
  dp = {n: (0, 4) for n in graph.names}
  a = random_assignments(graph, [1, 2, 4], 4, 6, seed=3, exclude=[dp])
  assert a == random_assignments(graph, [1, 2, 4], 4, 6, seed=3, exclude=[dp])
  assert len(a) == 6 and dp not in a
  assert all(x != y for i, x in enumerate(a) for y in a[i + 1:])
  for x in a:
    assert set(x) == set(graph.names)
    runs = sum(1 for i, n in enumerate(graph.names) if i == 0 or x[n] != x[graph.names[i - 1]])
    assert runs <= 6
    ev = evaluate_plan(graph, profile, cluster("a100_nvlink_8"), x, global_batch=8, num_devices=4)
    assert np.isfinite(ev.iteration_ms) and ev.iteration_ms > 0
