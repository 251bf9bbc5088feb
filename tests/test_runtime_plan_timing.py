"""Interleaved timing of several plans on the runtime, each step timed after one of its own."""

import jax
import pytest

from dp_jax.base.errors import UserError
from dp_jax.measurement import plan_timing
from dp_jax.measurement.plan_timing import time_plans, turns
from dp_jax.models.zoo import build_model
from dp_jax.planner.contract import check_plan, data_parallel_layout_plan, layout_plan
from dp_jax.runtime.stages import structure_graph


def test_time_plans_runs_each_plan_and_counts_stages():
  def build():
    return build_model("gpt2_small", n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=64)

  graph = structure_graph(build(), "gpt2_small")
  dp = check_plan(data_parallel_layout_plan(graph, global_batch=4, num_devices=2), graph,
                  available_devices=2)
  split = check_plan(layout_plan(graph, lambda n: [0] if n == graph.names[-1] else [0, 1],
                                 global_batch=4, num_devices=2), graph, available_devices=2)
  seen = []
  out = time_plans(build, graph, [dp, split], jax.devices()[:2], steps=2, warmup=1, group=1,
                   progress=seen.append)
  assert [t.stages for t in out] == [1, 2]
  assert all(len(t.step_ms) == 2 and t.ms("min") <= t.ms("median") for t in out)
  assert out[0].loss == out[0].loss and len(seen) == 2  # finite loss; one report per group
  raw = data_parallel_layout_plan(graph, global_batch=4, num_devices=2)
  with pytest.raises(TypeError, match="takes a Plan checked by planner.contract.check_plan"):
    time_plans(build, graph, [raw], jax.devices()[:2], steps=1)  # the caller checks, once


def recorder(log, name):
  """A call that appends its name to `log` and returns its run number."""
  def call():
    log.append(name)
    return len(log)
  return call


def test_each_kept_run_follows_a_run_of_the_same_call():
  log = []
  out = turns([recorder(log, "a"), recorder(log, "b")], 3, runs_per_turn=2, warmup=1)
  assert "".join(log) == "ab" + "aabb" * 3  # warm-up, then per round two runs in a row each
  assert out == [[4, 8, 12], [6, 10, 14]]  # the second run of each turn is kept
  assert all(log[n - 2] == log[n - 1] for r in out for n in r)


def test_a_call_alone_runs_once_per_round_after_its_first_turn():
  log = []
  assert turns([recorder(log, "a")], 3, runs_per_turn=2) == [[2, 3, 4]]
  log.clear()
  assert turns([recorder(log, "a")], 2, runs_per_turn=3, warmup=1) == [[3, 4]]


def test_one_run_per_turn_is_plain_interleaving():
  log = []
  assert turns([recorder(log, "a"), recorder(log, "b")], 2, runs_per_turn=1) == [[1, 3], [2, 4]]
  assert "".join(log) == "abab"


def test_bad_turns_are_user_errors():
  for kw in (dict(runs_per_turn=0), dict(warmup=-1)):
    with pytest.raises(UserError):
      turns([lambda: 0], 1, **kw)


def test_time_plans_times_the_last_step_of_each_turn(monkeypatch):
  clock = [0.0]
  log = []

  def fake_stepper(model, graph, plan, devices, optimizer, seed=0):
    def one():
      log.append(plan)
      clock[0] += len(log) * 1e-3  # the n-th step of the run takes n ms
      return float(len(log))
    return one, plan

  monkeypatch.setattr(plan_timing, "stepper", fake_stepper)
  monkeypatch.setattr(plan_timing.time, "perf_counter", lambda: clock[0])
  out = time_plans(lambda: None, None, [1, 2, 3], [], steps=2, warmup=1, group=2,
                   runs_per_turn=2)
  # groups {1, 2} then {3}; plan 3 alone: its warm-up step precedes its first timed one
  assert log == [1, 2, 1, 1, 2, 2, 1, 1, 2, 2] + [3, 3, 3]
  assert [t.step_ms for t in out] == [pytest.approx(v) for v in ((4, 8), (6, 10), (12, 13))]
  assert [t.stages for t in out] == [1, 2, 3] and [t.loss for t in out] == [8.0, 10.0, 13.0]
  with pytest.raises(UserError):
    time_plans(lambda: None, None, [1], [], steps=0)
