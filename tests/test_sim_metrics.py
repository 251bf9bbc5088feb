"""Simulator metrics follow the definitions in docs/simulator.md."""

import pytest
from sim_helpers import cluster, graph, plan, profile

from dp_jax.simulator.engine import simulate
from dp_jax.simulator.job import background_job
from dp_jax.simulator.metrics import (
  cluster_frontier,
  data_parallel_frontier,
  matched_data_parallel,
  metrics,
)


@pytest.fixture(scope="module")
def sim():
  job = background_job(graph("inception"), profile("inception", 32), cluster(), 8)
  return simulate(graph("inception"), profile("inception", 32), cluster(),
                  plan("inception", 32, 32), job=job, cap=0.1)


def test_definitions(sim):
  m = metrics(sim)
  g, b = 32, 32
  assert m["alone_idle_fraction"] == pytest.approx(1 - m["gpu_ms"] / (g * m["alone_iteration_ms"]))
  assert m["samples_per_s"] == pytest.approx(b / m["iteration_ms"] * 1e3)
  assert m["cluster_samples_per_s"] == pytest.approx(
      m["samples_per_s"] + m["background_samples_per_s"])
  assert m["cluster_throughput_vs_data_parallel"] == pytest.approx(
      m["cluster_samples_per_s"] / m["data_parallel_samples_per_s"])
  assert m["data_parallel_iteration_ms"] == pytest.approx(
      sim.plan.predicted["data_parallel_iteration_ms"])
  assert 0 <= m["idle_fraction"] <= m["alone_idle_fraction"] <= 1
  assert m["max_slowdown"] <= m["slowdown_cap"] + 1e-9
  assert m["timeline_vs_planner"] == pytest.approx(0, abs=0.01)
  assert m["gpu_ms"] <= m["planner_gpu_ms"] * (1 + 1e-9)  # the union never double counts
  assert m["best_data_parallel_iteration_ms"] <= m["data_parallel_iteration_ms"]


def test_background_none_has_no_background_numbers():
  s = simulate(graph("resnet"), profile("resnet", 32), cluster(), plan("resnet", 8, 32))
  m = metrics(s)
  assert m["background_samples_per_s"] == 0
  assert m["iteration_ms"] == m["alone_iteration_ms"]
  assert m["cluster_samples_per_s"] == m["samples_per_s"]


def test_data_parallel_frontier_prices_every_count():
  front = data_parallel_frontier({1: 40.0, 2: 20.0, 4: 12.0, 8: 10.0}, 8, 32, 100.0)
  assert [p["devices"] for p in front] == [1, 2, 4, 8]
  assert front[1]["cluster_samples_per_s"] == pytest.approx(32 / 20.0 * 1e3 + 6 * 100.0)
  assert front[-1]["cluster_samples_per_s"] == pytest.approx(32 / 10.0 * 1e3)


def test_matched_baseline_is_the_best_cluster_throughput_at_least_as_fast():
  front = data_parallel_frontier({1: 40.0, 2: 20.0, 4: 12.0, 8: 10.0}, 8, 32, 1000.0)
  m = matched_data_parallel(front, 15.0, 3000.0, 0.0)
  assert m["matched_data_parallel_devices"] == 4  # 2,667 + 4 x 1,000 beats DP on 8's 3,200
  assert m["cluster_throughput_vs_matched_data_parallel"] == pytest.approx(
      3000.0 / (32 / 12.0 * 1e3 + 4 * 1000.0))
  few = data_parallel_frontier({1: 40.0, 2: 20.0, 4: 12.0, 8: 10.0}, 8, 32, 100.0)
  assert matched_data_parallel(few, 15.0, 3000.0, 0.0)["matched_data_parallel_devices"] == 8
  none = matched_data_parallel(front, 5.0, 3000.0, 0.0)
  assert none["matched_data_parallel_devices"] is None
  assert "no data parallelism" in none["matched_data_parallel_note"]


def test_a_burst_plan_slower_than_small_data_parallelism_is_not_reported_ahead():
  # G = B = 64, A = 1: the burst plan is slower than data parallelism on a few devices, which
  # with the background job on the rest has more cluster throughput. The fastest-DP baseline
  # (DP on all 64 devices, no room for the background job) calls burst far ahead; the matched
  # baseline names the small data-parallel count and says burst is behind.
  job = background_job(graph("resnet"), profile("resnet", 64), cluster(), 8)
  p = plan("resnet", 64, 64, 1.0)
  m = metrics(simulate(graph("resnet"), profile("resnet", 64), cluster(), p, job=job, cap=0.1))
  d = m["matched_data_parallel_devices"]
  assert d is not None and d < 64
  front = {q["devices"]: q for q in m["data_parallel_frontier"]}
  band = [q for q in front.values()
          if q["iteration_ms"] <= m["iteration_ms"] * (1 + m["comparison_tolerance"]) + 1e-9]
  assert front[d] in band
  assert all(q["cluster_samples_per_s"] <= front[d]["cluster_samples_per_s"] for q in band)
  assert front[d]["cluster_samples_per_s"] > m["cluster_samples_per_s"]
  assert m["cluster_throughput_vs_matched_data_parallel"] < 1
  assert m["cluster_throughput_vs_best_data_parallel"] > 1  # what the old baseline claimed


def test_every_data_parallel_baseline_fits_in_memory():
  """The issue: the frontier offered DP on 1-8 devices that needed 670 GB. Only data
  parallelism that fits is a baseline: the frontier, the fastest and the matched one."""
  from dp_jax.planner import make_plan, memory
  from dp_jax.planner.baseline import cost_model_for, data_parallel_evaluations
  from dp_jax.planner.evaluate import data_parallel_assignment

  g, p = graph("inception"), profile("inception", 32)
  roomy = make_plan(g, p, cluster(), num_devices=32, global_batch=32)
  model = cost_model_for(g, p, cluster(), roomy)
  need = {int(c): float(memory.device_bytes(model, data_parallel_assignment(model, int(c))).max())
          / memory.GB for c in model.counts}
  budget = (need[4] + need[2]) / 2  # DP on 1 and 2 devices do not fit, on 4 and more they do
  tight = cluster().replace(memory_gb_per_device=budget)
  plan_ = make_plan(g, p, tight, num_devices=32, global_batch=32)
  job = background_job(g, p, tight, 1)  # a batch that fits beside the foreground
  m = metrics(simulate(g, p, tight, plan_, job=job, cap=0.1))
  fitting = {d for d, gb in need.items() if gb <= budget}
  assert fitting and min(fitting) == 4 and {1, 2} & fitting == set()
  assert {q["devices"] for q in m["data_parallel_frontier"]} == fitting
  assert m["best_data_parallel_devices"] in fitting
  assert m["matched_data_parallel_devices"] in fitting | {None}
  tight_model = cost_model_for(g, p, tight, plan_)
  assert set(data_parallel_evaluations(tight_model)) == fitting



def test_where_no_data_parallelism_fits_there_is_no_baseline_and_a_line_says_why():
  import math

  from dp_jax.planner.baseline import (
    data_parallel_evaluations,
    data_parallel_misfit,
    fastest_data_parallel,
  )
  from dp_jax.planner.costs import build_cost_model
  from dp_jax.planner.options import PlanOptions

  g, p = graph("resnet"), profile("resnet", 32)
  tiny = cluster().replace(memory_gb_per_device=0.001)
  model = build_cost_model(g, p, tiny, PlanOptions(num_devices=8, global_batch=32,
                                                    amplification_limit=math.inf))
  assert data_parallel_evaluations(model) == {}
  assert fastest_data_parallel({}) == (None, None)
  note = data_parallel_misfit(model)
  assert note.startswith("no data parallelism on d <= 8 devices fits: on 8 it needs ")
  assert note.endswith("GB per device, over the 0.001 GB a device has")


def test_with_samples_only_the_uniform_baselines_are_data_parallelism(sim):
  # the planner may split samples only: a uniform setting is data parallelism on its count, so
  # the uniform frontier and its matched point are the data-parallel ones, and the sentence
  # leads with data parallelism
  m = metrics(sim)
  dp = {q["devices"]: q for q in m["data_parallel_frontier"]}
  uni = {q["devices"]: q for q in m["uniform_frontier"]}
  assert set(uni) == set(dp) and len(uni) > 2
  for d, q in uni.items():
    assert q["setting"] == f"dp {d}, replicated, on {d} device{'s' if d > 1 else ''}"
    assert q["iteration_ms"] == pytest.approx(dp[d]["iteration_ms"], rel=1e-12)
    assert q["cluster_samples_per_s"] == pytest.approx(dp[d]["cluster_samples_per_s"], rel=1e-12)
  assert m["uniform_iteration_ms"] == pytest.approx(m["best_data_parallel_iteration_ms"])
  assert m["matched_uniform_devices"] == m["matched_data_parallel_devices"]
  assert m["planner_chooses_strategies"] is False
  assert "uniform" not in m["fair_comparison"]


def test_no_matched_uniform_strategy_where_none_is_as_fast_as_the_burst_foreground(sim):
  m = metrics(sim, 0.0)  # the burst foreground is faster than every uniform setting
  assert m["iteration_ms"] < min(q["iteration_ms"] for q in m["uniform_frontier"])
  assert m["matched_uniform_devices"] is None and m["matched_uniform_setting"] is None
  assert m["matched_uniform_cluster_samples_per_s"] is None
  assert m["cluster_throughput_vs_matched_uniform"] is None
  assert m["cluster_throughput_vs_matched_uniform_verdict"] is None
  assert m["matched_uniform_note"] == ("no uniform strategy on d <= G is within 0.0% of the "
                                       "burst foreground")
  assert m["speedup_vs_uniform_alone"] == pytest.approx(
      m["uniform_iteration_ms"] / m["alone_iteration_ms"])
  assert m["speedup_vs_uniform_alone_verdict"] == "ahead"


def test_a_state_sharded_uniform_strategy_on_fewer_devices_is_the_fairer_matched_baseline():
  # G = B = 64, A = 1: the burst foreground is slower than data parallelism on a few devices.
  # Below the memory DP on 2 devices needs, DP fits on 4 or more only; ZeRO-1 with
  # recomputation fits on 2 (the planner may shard state and recompute). With a background job
  # that makes a free device worth more than the foreground's gain from 2 more devices, the
  # matched uniform strategy runs on 2 and leaves 2 more devices to the background than the
  # matched DP on 4: more cluster samples/s, so burst's margin against it is smaller.
  from dp_jax.planner import make_plan, memory
  from dp_jax.planner.baseline import cost_model_for
  from dp_jax.planner.evaluate import data_parallel_assignment

  g, p = graph("resnet"), profile("resnet", 64)
  roomy = make_plan(g, p, cluster(), num_devices=64, global_batch=64, amplification_limit=1.0)
  model = cost_model_for(g, p, cluster(), roomy)
  need2 = float(memory.device_bytes(model, data_parallel_assignment(model, 2)).max())
  tight = cluster().replace(memory_gb_per_device=need2 * 0.92 / memory.GB)
  plan_ = make_plan(g, p, tight, num_devices=64, global_batch=64, amplification_limit=1.0,
                    sharding=("samples", "state"), recompute="choose")
  job = background_job(g, p, tight, 8)
  m = metrics(simulate(g, p, tight, plan_, job=job, cap=0.1))
  dp = {q["devices"]: q for q in m["data_parallel_frontier"]}
  uni = {q["devices"]: q for q in m["uniform_frontier"]}
  assert min(dp) == 4 and 2 in uni  # DP does not fit on 2, a uniform setting does
  assert "ZeRO-1" in uni[2]["setting"] or "FSDP" in uni[2]["setting"]
  d = m["matched_uniform_devices"]
  assert d == 2 < m["matched_data_parallel_devices"] == 4
  assert m["matched_uniform_setting"] == uni[2]["setting"]
  band = [q for q in uni.values()
          if q["iteration_ms"] <= m["iteration_ms"] * (1 + m["comparison_tolerance"]) + 1e-9]
  assert uni[d] in band
  assert all(q["cluster_samples_per_s"] <= uni[d]["cluster_samples_per_s"] for q in band)
  per_device = job.batch / job.step_ms * 1e3  # the background alone on a free device
  assert m["matched_uniform_cluster_samples_per_s"] == pytest.approx(
      64 / uni[2]["iteration_ms"] * 1e3 + 62 * per_device)
  assert (m["matched_uniform_cluster_samples_per_s"]
          > m["matched_data_parallel_cluster_samples_per_s"])
  assert m["cluster_throughput_vs_matched_uniform"] == pytest.approx(
      m["cluster_samples_per_s"] / m["matched_uniform_cluster_samples_per_s"])
  assert (m["cluster_throughput_vs_matched_uniform"]
          < m["cluster_throughput_vs_matched_data_parallel"])
  # the planner chooses strategies: the uniform baselines lead the sentence, DP follows
  fair = m["fair_comparison"]
  assert m["planner_chooses_strategies"] is True
  assert (fair.index("against the best uniform strategy")
          < fair.index("against the fastest data parallelism"))
  assert (fair.index("against the matched uniform strategy (dp 2,")
          < fair.index("against the matched DP on 4"))


def test_cluster_frontier_carries_settings_where_given():
  front = cluster_frontier({2: 20.0, 4: 12.0}, 8, 32, 100.0, {2: "a", 4: "b"})
  assert [(q["devices"], q["setting"]) for q in front] == [(2, "a"), (4, "b")]
  assert front[0]["cluster_samples_per_s"] == pytest.approx(32 / 20.0 * 1e3 + 6 * 100.0)


def test_a_background_of_another_model_counts_by_its_flops(sim):
  """A ResNet-like image beside an Inception-like one counts for its FLOPs, in the cluster sum
  and on the devices a baseline frees alike; the job's own samples/s stay its own."""
  fg, bg = graph("inception"), graph("resnet")
  job = background_job(bg, profile("resnet", 32), cluster(), 8)
  s = simulate(fg, profile("inception", 32), cluster(), plan("inception", 32, 32), job=job,
               cap=0.1)
  m = metrics(s)
  weight = sum(n.flops_per_sample for n in bg.nodes) / sum(n.flops_per_sample for n in fg.nodes)
  assert job.flops_per_sample > 0 and m["background_weight"] == pytest.approx(weight)
  assert weight != pytest.approx(1.0, rel=0.05)  # the two models differ: the weight matters
  assert m["background_samples_per_s"] > 0
  assert m["cluster_samples_per_s"] == pytest.approx(
      m["samples_per_s"] + weight * m["background_samples_per_s"])
  own = job.batch / job.step_ms * 1e3  # the job's samples/s on a device of its own
  for p in m["data_parallel_frontier"]:
    assert p["cluster_samples_per_s"] == pytest.approx(
        32 / p["iteration_ms"] * 1e3 + (32 - p["devices"]) * own * weight)
  assert f"counted as {weight:.3g} foreground samples" in m["fair_comparison"]
  assert metrics(sim)["background_weight"] == 1.0  # the foreground's own model


def test_the_background_runs_only_on_devices_with_room_beside_the_foreground(sim):
  """A job larger than what some devices have free runs on the others only (a scheduler
  starts no job where it does not fit); none with room at all is the one-line error."""
  from dataclasses import replace

  from dp_jax.base.errors import UserError
  from dp_jax.planner import memory

  cap = memory.capacity_bytes(sim.model)
  free = cap - sim.foreground_bytes
  assert free.min() < free.max()  # the burst plan holds more on some devices than on others
  job = replace(sim.job, memory_bytes=float((free.min() + free.max()) / 2))
  s = simulate(graph("inception"), profile("inception", 32), cluster(),
               plan("inception", 32, 32), job=job, cap=0.1)
  full = free < job.memory_bytes
  assert s.background_devices_without_room == int(full.sum()) > 0
  bg = [e for e in s.fill.events if e.kind == "bg"]
  assert bg, "the devices with room ran background pieces"
  for e in bg:
    first, count = e.devices
    assert not full[first:first + count].any(), e
  m = metrics(s)
  assert m["background_devices_without_room"] == int(full.sum())
  assert f"on {32 - int(full.sum())} of 32 devices" in m["fair_comparison"]
  with pytest.raises(UserError, match="GB free beside the foreground"):
    simulate(graph("inception"), profile("inception", 32), cluster(), plan("inception", 32, 32),
             job=replace(sim.job, memory_bytes=float(free.max()) * 1.01), cap=0.1)
