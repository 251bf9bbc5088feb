"""Background fill: the slowdown cap holds in every iteration; pieces only use idle time."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import cluster, graph, plan, profile

from dp_jax.base.errors import UserError
from dp_jax.layer_times.sources import profile_batches
from dp_jax.planner import make_plan
from dp_jax.planner.baseline import data_parallel
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.make import build_plan, data_parallel_plan
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.synthetic import linear_profile
from dp_jax.simulator.engine import simulate
from dp_jax.simulator.fill import fill
from dp_jax.simulator.job import background_job
from dp_jax.simulator.windows import busy_intervals


def _job(kind="inception", size=0, batch=8, piece_ms=0.5):
  return background_job(graph(kind, size), profile(kind, 32, size), cluster(), batch,
                        piece_ms=piece_ms)


def _assert_pieces_in_idle_time(sim):
  """In the recorded iteration, no background piece overlaps foreground work on its devices."""
  bounds = sim.classes.bounds
  for k in range(len(sim.classes)):
    lo = int(bounds[k])
    fg = sorted((e.start_ms, e.end_ms) for e in sim.fill.events
                if e.kind != "bg" and e.devices[0] <= lo < sum(e.devices))
    for bg in (e for e in sim.fill.events if e.kind == "bg" and e.devices[0] == lo):
      for s, e in fg:
        assert bg.end_ms <= s + 1e-6 or bg.start_ms >= e - 1e-6, (k, bg, s, e)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["resnet", "inception"]), g=st.sampled_from([4, 8, 16, 32]),
       limit=st.sampled_from([1.2, 2.0, math.inf]), overlap=st.booleans(),
       cap=st.floats(0, 0.5), switch_ms=st.floats(0, 0.3), piece_ms=st.floats(0.05, 2.0),
       seed=st.integers(0, 10**6))
def test_slowdown_cap_holds_in_every_iteration(kind, g, limit, overlap, cap, switch_ms, piece_ms,
                                               seed):
  gr, b = graph(kind, 1), 32
  prof = linear_profile(gr, profile_batches(b, 8), np.random.default_rng(seed))
  p = make_plan(gr, prof, cluster(), num_devices=g, global_batch=b, amplification_limit=limit,
                overlap_allreduce=overlap)
  job = background_job(gr, prof, cluster(), 8, piece_ms=piece_ms)
  sim = simulate(gr, prof, cluster(), p, job=job, cap=cap, switch_ms=switch_ms,
                 iterations=3)
  alone = sim.timeline.iteration_ms
  assert len(sim.fill.iteration_ms) == 3
  assert sim.fill.iteration_ms.max() <= (1 + cap) * alone * (1 + 1e-9) + 1e-9
  assert sim.fill.warmup_ms <= (1 + cap) * alone * (1 + 1e-9) + 1e-9
  assert sim.fill.iteration_ms.min() >= alone * (1 - 1e-9)
  # background uses at most the idle device-time of each iteration
  busy = sum((sum(e - s for s, e, _ in busy_intervals(sim.timeline, ids)) * n)
             for ids, n in zip(sim.classes.tasks, sim.classes.sizes, strict=True))
  idle = g * sim.fill.iteration_ms - busy
  assert np.all(sim.fill.bg_work_ms <= idle + 1e-6)
  _assert_pieces_in_idle_time(sim)


def test_no_idle_time_means_no_background_at_cap_zero():
  gr, prof = graph("inception"), profile("inception", 32)
  p = data_parallel_plan(gr, prof, cluster(), num_devices=8, global_batch=32)
  sim = simulate(gr, prof, cluster(), p, job=_job(), cap=0.0)
  assert sim.windows == ()
  assert sim.fill.bg_steps.sum() == 0
  assert np.allclose(sim.fill.iteration_ms, sim.timeline.iteration_ms)


def test_free_switch_and_exact_predictions_never_slow_the_foreground_at_cap_zero():
  p = plan("inception", 8, 32)
  job = _job(piece_ms=0.05)
  sim = simulate(graph("inception"), profile("inception", 32), cluster(), p, job=job, cap=0.0,
                 switch_ms=0.0)
  assert np.allclose(sim.fill.iteration_ms, sim.timeline.iteration_ms, rtol=1e-12)
  assert sim.fill.bg_steps.sum() > 0 and sim.fill.pieces_refused > 0
  assert sim.fill.admitted.any()


def test_online_correction_keeps_the_cap_when_pieces_run_twice_as_long_as_profiled():
  gr, prof, cl = graph("inception"), profile("inception", 32), cluster()
  sim = simulate(gr, prof, cl, plan("inception", 8, 32))
  job = _job(piece_ms=0.05)
  args = (sim.timeline, sim.classes, list(sim.windows), job)
  exact = fill(*args, cap=0.1, switch_ms=0.0)
  slow = fill(*args, cap=0.1, switch_ms=0.0, actual_ms=2 * job.pieces_ms)
  alone = sim.timeline.iteration_ms
  assert slow.iteration_ms.max() <= 1.1 * alone * (1 + 1e-9)
  assert 0 < slow.bg_steps.sum() < exact.bg_steps.sum()


def test_devices_without_foreground_work_run_background_at_full_speed():
  gr, prof, g, b = graph("resnet"), profile("resnet", 32), 4, 32
  model = build_cost_model(gr, prof, cluster(), PlanOptions(num_devices=g, global_batch=b,
                                                            amplification_limit=math.inf))
  one = {n: (0, 1) for n in gr.names}
  p = build_plan(model, one, evaluate(model, one), data_parallel(model), seconds=0.0)
  job = _job("resnet")
  sim = simulate(gr, prof, cluster(), p, job=job, cap=0.1)
  expected = (g - 1) * sim.fill.iteration_ms / job.step_ms
  assert np.allclose(sim.fill.bg_steps, expected, rtol=1e-12)


def test_no_background_job_means_no_fill():
  p = plan("resnet", 8, 32)
  sim = simulate(graph("resnet"), profile("resnet", 32), cluster(), p, job=None)
  assert sim.fill is None


@pytest.mark.parametrize("kwargs, match", [
    ({"cap": -0.1}, "slowdown_cap must be a number >= 0"),
    ({"cap": float("nan")}, "slowdown_cap"),
    ({"policy": "greedy"}, "policy 'greedy' is unknown"),
    ({"policy": "overrun"}, "policy 'overrun' is unknown"),
    ({"iterations": 0}, "iterations must be an integer >= 1"),
    ({"switch_ms": -1.0}, "switch_us must be a number >= 0"),
])
def test_bad_fill_settings_are_user_errors(kwargs, match):
  p = plan("resnet", 8, 32)
  with pytest.raises(UserError, match=match):
    simulate(graph("resnet"), profile("resnet", 32), cluster(), p, job=_job("resnet"), **kwargs)


def test_background_that_does_not_fit_is_one_error():
  p = plan("resnet", 8, 32)
  job = background_job(graph("resnet"), profile("resnet", 32), cluster(), 8 * 10**5)
  with pytest.raises(UserError, match="needs .* GB per device but device"):
    simulate(graph("resnet"), profile("resnet", 32), cluster(), p, job=job)
