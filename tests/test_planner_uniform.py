"""The best uniform strategy (dp_jax/planner/uniform.py): one setting for every layer, searched
with the burst planner's cost model and memory model; and the plan app printing it beside the
plan with per-device memory."""

import dataclasses
import functools
import itertools
import json
import math

import pytest
from apps import run_app

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import named_cluster
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.planner import make_plan, memory
from dp_jax.planner.baseline import data_parallel_evaluations, fastest_data_parallel
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.sharding import Strategy
from dp_jax.planner.uniform import Setting, best_uniform, settings, uniform_frontier
from dp_jax.report.plan_report import comparisons, layer_rows, print_plan

SEQ, D, FFN, E = 64, 256, 1024, 4  # tokens per sample, width, expert hidden size, experts
B, G = 64, 16
ALL = ("samples", "weights", "state", "experts")


def _graph() -> LayerGraph:
  """fc1 (linear D -> D, saves 8x its input) -> experts (E SwiGLU experts, top-2, saves 16x its
  input) -> fc2 (linear D -> 512, saves its input): a linear layer splits `out` at every power
  of two up to G, the experts layer `experts` at 2 and 4."""
  def linear(name, inputs, i, o, saved):
    work = 2.0 * SEQ * i * o
    return LayerNode(name, "linear", inputs, i * o + o, 4 * (i * o + o), (SEQ, o), 4 * SEQ * o,
                     work, attrs={"in_features": i, "out_features": o, "bias": True},
                     saved_bytes_per_sample=saved, matmul_flops_per_sample=work)
  params = 3 * E * D * FFN
  work = 2.0 * 3 * SEQ * 2 * D * FFN
  experts = LayerNode("experts", "moe_experts", ("fc1",), params, 4 * params, (SEQ, D),
                      4 * SEQ * D, work, attrs={
                          "n_expert": E, "d_model": D, "ffn_dim": FFN, "top_k": 2,
                          "capacity": math.ceil(SEQ * 2 * 1.25 / E), "seq_len": SEQ,
                          "shared_ffn_dim": 0},
                      saved_bytes_per_sample=16 * 4 * SEQ * D, matmul_flops_per_sample=work)
  nodes = (linear("fc1", (), D, D, 8 * 4 * SEQ * D), experts,
           linear("fc2", ("experts",), D, 512, 4 * SEQ * D))
  return LayerGraph(model="moe_mlp", input_shape=(SEQ, D), input_dtype="float32", nodes=nodes,
                    meta={"work_source": "written by hand"})


GRAPH = _graph()
PROFILE = analytic_profile(GRAPH, "A100-SXM4-40GB", "float32", [B // d for d in (1, 2, 4, 8, 16)])


def _model(gb=40.0, sharding=ALL, recompute="choose"):
  cl = dataclasses.replace(named_cluster("dgx_a100"), memory_gb_per_device=gb)
  return build_cost_model(GRAPH, PROFILE, cl, PlanOptions(
      num_devices=G, global_batch=B, sharding=sharding, recompute=recompute))


def _by_hand(model):
  """Every uniform setting of the graph, its strategies written out: fc1 and fc2 split `out`
  tp ways, the experts `experts` ep ways, the state on each layer with a data axis of two or
  more, recomputation on fc1 and the experts (fc2 keeps only its input: nothing to save).
  Yields (setting, strategies, evaluation, peak bytes)."""
  for count in (1, 2, 4, 8, 16):
    for tp, ep, state, again in itertools.product((1, 2, 4, 8, 16), (1, 2, 4),
                                                  ("replicated", "optimizer", "full"),
                                                  (False, True)):
      if count % tp or count % ep or (count == 1 and state != "replicated"):
        continue  # one device: nothing to split or shard over
      shards = {"fc1": _strategy(count, tp, "out", state, again),
                "experts": _strategy(count, ep, "experts", state, again),
                "fc2": _strategy(count, tp, "out", state, False)}
      shards = {n: s for n, s in shards.items() if not s.plain}
      a = {n: (0, count) for n in model.names}
      yield (Setting(count, tp, ep, state, again), shards, evaluate(model, a, shards),
             float(memory.device_bytes(model, a, shards).max()))


def _strategy(count, m, split, state, recompute):
  return Strategy(m, split if m > 1 else "samples", state if count // m >= 2 else "replicated",
                  recompute)


@functools.cache
def _hand():
  """_by_hand's settings (their times and peaks do not depend on the device's memory)."""
  return tuple(_by_hand(_model()))


def _fastest_that_fits(model):
  cap = memory.capacity_bytes(model)
  fit = [(ev.iteration_ms, ev.gpu_ms, s.devices, s) for s, _, ev, peak in _hand()
         if peak <= cap]
  return min(fit, key=lambda x: x[:3]) if fit else None


def test_finds_the_fastest_setting_a_hand_enumeration_finds():
  roomy = _model()
  best = best_uniform(roomy)
  want = _fastest_that_fits(roomy)
  assert best.evaluation.iteration_ms == pytest.approx(want[0], rel=1e-12)
  # every setting the hand enumeration prices is one the search offers
  assert {s for s, *_ in _hand()} <= set(settings(roomy))
  # just below the fastest one's peak it no longer fits: the search moves to the next
  tight = _model(gb=best.peak_bytes / memory.GB * 0.95)
  second = best_uniform(tight)
  want = _fastest_that_fits(tight)
  assert second.setting != best.setting
  assert second.evaluation.iteration_ms == pytest.approx(want[0], rel=1e-12)
  assert second.evaluation.iteration_ms > best.evaluation.iteration_ms
  assert second.peak_bytes <= memory.capacity_bytes(tight)


def test_never_returns_a_setting_that_does_not_fit():
  peaks = sorted({peak for *_, peak in _hand()})
  for gb in (peaks[0] * 0.99 / memory.GB, *(p / memory.GB for p in peaks[::7]),
             peaks[-1] / memory.GB):
    model = _model(gb=gb)
    u = best_uniform(model)
    cap = memory.capacity_bytes(model)
    if u.setting is None:  # below every setting's peak: says what the least one needs
      assert gb < peaks[0] / memory.GB
      assert u.least_bytes == pytest.approx(peaks[0], rel=1e-9)
      assert f"needs {peaks[0] / memory.GB:.2f} GB" in u.reason
      assert u.to_json()["fits"] is False
      continue
    a = {n: (0, u.setting.devices) for n in model.names}
    assert float(memory.device_bytes(model, a, u.shardings).max()) <= cap
    assert u.peak_bytes == pytest.approx(float(memory.device_bytes(model, a, u.shardings).max()))
    assert u.evaluation.iteration_ms == pytest.approx(_fastest_that_fits(model)[0], rel=1e-12)


def _fastest_on(model, count):
  """The hand enumeration's fastest setting on exactly `count` devices that fits (None: none)."""
  cap = memory.capacity_bytes(model)
  fit = [(ev.iteration_ms, ev.gpu_ms, s) for s, _, ev, peak in _hand()
         if s.devices == count and peak <= cap]
  return min(fit, key=lambda x: x[:2]) if fit else None


@pytest.mark.parametrize("gb", [40.0, 0.05])
def test_the_frontier_is_the_fastest_setting_on_each_count(gb):
  model = _model(gb=gb)
  front = uniform_frontier(model)
  cap = memory.capacity_bytes(model)
  # each count the hand enumeration fits on is in the frontier, at the hand's fastest time
  want = {c: w for c in (1, 2, 4, 8, 16) if (w := _fastest_on(model, c)) is not None}
  assert set(front) == set(want) and len(front) >= 2
  for count, u in front.items():
    assert u.setting.devices == count
    assert u.evaluation.iteration_ms == pytest.approx(want[count][0], rel=1e-12)
    a = {n: (0, count) for n in model.names}
    assert float(memory.device_bytes(model, a, u.shardings).max()) <= cap
    assert u.peak_bytes <= cap
  # its fastest entry is best_uniform's setting and iteration
  best = best_uniform(model)
  top = min(front.values(), key=lambda u: (u.evaluation.iteration_ms, u.evaluation.gpu_ms,
                                           u.setting.devices))
  assert top.setting == best.setting
  assert top.evaluation.iteration_ms == best.evaluation.iteration_ms
  # the counts differ in speed: the frontier is a trade-off, not one point repeated
  assert len({round(u.evaluation.iteration_ms, 9) for u in front.values()}) > 1


def test_the_frontier_leaves_out_the_counts_where_nothing_fits():
  peaks = {}
  for s, _, _, peak in _hand():
    peaks[s.devices] = min(peak, peaks.get(s.devices, math.inf))
  # room for the least-memory setting on the widest counts only
  gb = sorted(peaks.values())[1] / memory.GB
  model = _model(gb=gb)
  front = uniform_frontier(model)
  assert set(front) == {c for c, p in peaks.items() if p <= memory.capacity_bytes(model)}
  assert 0 < len(front) < len(peaks)


def test_samples_alone_is_the_fastest_data_parallelism():
  model = _model(gb=0.05, sharding=("samples",), recompute="none")
  u = best_uniform(model)
  d, ms = fastest_data_parallel({c: e.iteration_ms for c, e in
                                 data_parallel_evaluations(model).items()})
  assert (u.setting.devices, u.setting.tp, u.setting.ep, u.setting.state) == (d, 1, 1,
                                                                             "replicated")
  assert u.evaluation.iteration_ms == pytest.approx(ms)
  assert not u.shardings


def test_the_report_prints_the_uniform_line_and_per_device_memory(capsys):
  cl = named_cluster("dgx_a100")
  plan = make_plan(GRAPH, PROFILE, cl, num_devices=G, global_batch=B, sharding=ALL,
                   recompute="choose", amplification_limit=math.inf)
  fair = comparisons(GRAPH, PROFILE, cl, plan, 0.1)
  u = best_uniform(build_cost_model(GRAPH, PROFILE, cl, plan.plan_options))
  assert fair["uniform_setting"] == u.setting.describe()
  assert fair["speedup_vs_uniform"] == pytest.approx(
      u.evaluation.iteration_ms / plan.predicted["iteration_ms"])
  # the burst planner's space holds every uniform setting: never slower without a limit
  assert fair["speedup_vs_uniform"] >= 1 - 1e-9
  print_plan(plan, layer_rows(plan), fair)
  out = " ".join(capsys.readouterr().out.split())
  assert f"vs the best uniform strategy ({u.setting.describe()}: " in out
  assert f"{u.evaluation.iteration_ms:.3f} ms/iter" in out
  peak = max(plan.extra["memory_gb_per_device"])
  assert f"memory per device (predicted): the plan's peak {peak:.2f} GB of 40 GB" in out
  assert f"best uniform: {u.peak_bytes / memory.GB:.2f} GB on each of its" in out
  assert out.index("best uniform strategy (") < out.index("data parallelism")  # the fair first
  # samples alone: the uniform search is the fastest data parallelism, so it is not repeated
  alone = make_plan(GRAPH, PROFILE, cl, num_devices=G, global_batch=B,
                    amplification_limit=math.inf)
  assert "uniform" not in comparisons(GRAPH, PROFILE, cl, alone, 0.1)


def test_plan_app_prints_and_records_the_best_uniform_strategy(tmp_path):
  gpath = tmp_path / "graph.json"
  gpath.write_text(json.dumps(GRAPH.to_json()))
  ppath = PROFILE.save(tmp_path / "profile.json")
  out = tmp_path / "plan.json"
  result = run_app("plan", f"graph={gpath}", f"profile={ppath}", "cluster=dgx_a100",
                   f"cluster.num_devices={G}", f"batch_size={B}",
                   "planner.sharding=[samples,weights,state,experts]",
                   "planner.recompute=choose", "chart=false", f"out={out}", "logger=disabled",
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr
  text = " ".join(result.stdout.split())
  record = json.loads(out.read_text())["uniform"]
  assert record["fits"] and record["dp"] * record["tp"] == record["devices"]
  assert f"vs the best uniform strategy ({record['describe']}: " in text
  assert "memory per device (predicted): the plan's peak " in text
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["uniform_iteration_ms"] == pytest.approx(record["iteration_ms"])
  assert status["speedup_vs_uniform_verdict"] in ("ahead", "tie", "behind")


@pytest.mark.slow
def test_llama3_70b_on_1024_gpus_searches_in_under_5_s():
  from dp_jax.layer_times.sources import ProfileConfig
  from dp_jax.measurement import profiles
  from dp_jax.models.zoo import ModelConfig

  config = ModelConfig.named("llama3_70b")
  graph = config.graph()
  cl = named_cluster("dgx_h100")
  profile = profiles.for_cluster(ProfileConfig(), graph, cl.device, 1024, model=config)
  model = build_cost_model(graph, profile, cl, PlanOptions(
      num_devices=1024, global_batch=1024, sharding=ALL, recompute="choose"))
  u = best_uniform(model)
  assert u.seconds < 5.0 and u.setting is not None
  assert u.peak_bytes <= memory.capacity_bytes(model)
