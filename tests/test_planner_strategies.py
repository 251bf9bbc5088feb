"""Per-layer strategies beyond the samples split: state sharded as ZeRO / FSDP, recomputation,
expert parallelism. Each term checked against the collective model it names, the memory model
against its definition, the planner choosing them exactly when memory binds, and the plan JSON
keeping them."""

import dataclasses
import json
import math

import pytest
from test_planner_sharding import cost_model, mlp_graph
from test_planner_zoo import cluster

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import alltoall_ms, strided_volume_ms
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.planner import make_plan, memory, pricing, sharded
from dp_jax.planner.contract import as_plan
from dp_jax.planner.sharding import PLAIN, Strategy

STATE = ("samples", "state")


def _model(width=4096, gb=None, batch=32, **kw):
  cl = cluster("a100_nvlink_8")
  if gb is not None:
    cl = dataclasses.replace(cl, memory_gb_per_device=gb)
  return cost_model(mlp_graph(width), cl, batch=batch, **kw)


# --- state sharded over the data axis ------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 4, 8])
def test_state_memory_is_replicated_minus_the_sharded_part(count):
  model = _model(sharding=STATE)
  i = model.row["fc1"]
  total, opt = float(model.state_bytes[i]), float(model.optimizer_bytes[i])
  acts = memory.layer_need(model, "fc1", count) - total
  zero1 = memory.layer_need(model, "fc1", count, Strategy(state="optimizer"))
  fsdp = memory.layer_need(model, "fc1", count, Strategy(state="full"))
  assert zero1 == pytest.approx(total - opt + opt / count + acts)
  assert fsdp == pytest.approx(total / count + acts)
  # FSDP gathers the whole parameters and their gradients while the layer runs
  assert memory.transient_need(model, "fc1", count, Strategy(state="full")) == pytest.approx(
      total - opt)
  assert memory.transient_need(model, "fc1", count, Strategy(state="optimizer")) == 0.0


def test_state_prices_its_collectives_and_a_dth_of_the_update():
  model = _model(sharding=STATE)
  i, p = model.row["fc1"], (0, 8)
  grads, params = float(model.grad_bytes[i]), float(model.param_bytes[i])
  plain = pricing.layer_time(model, "fc1", p)
  zero1 = pricing.layer_time(model, "fc1", p, Strategy(state="optimizer"))
  fsdp = pricing.layer_time(model, "fc1", p, Strategy(state="full"))
  assert zero1.update == pytest.approx(plain.update / 8)
  assert fsdp.update == pytest.approx(plain.update / 8)
  assert zero1.forward == plain.forward and zero1.moves_forward == 0.0
  # ZeRO-1: the gradients reduce-scattered and the updated parameters all-gathered
  rs_ag = strided_volume_ms(model.cluster, grads, 0, 8, 1, 1.0) + strided_volume_ms(
      model.cluster, params, 0, 8, 1, 1.0)
  assert pricing.band_ms(model, "fc1", p, Strategy(state="optimizer")) == pytest.approx(rs_ag)
  # FSDP: the reduce-scatter in the sync, the parameters gathered in forward and backward
  rs = strided_volume_ms(model.cluster, grads, 0, 8, 1, 1.0)
  assert pricing.band_ms(model, "fc1", p, Strategy(state="full")) == pytest.approx(rs)
  assert fsdp.moves_forward > 0 and fsdp.moves_forward == pytest.approx(fsdp.moves_backward)
  assert pricing.band_ms(model, "fc1", p) == pytest.approx(
      strided_volume_ms(model.cluster, grads, 0, 8, 1, 2.0))


def test_state_is_offered_only_with_state_and_a_data_axis_of_two():
  node = mlp_graph().node("fc1")
  assert sharded.candidates(node, 8, ("samples",)) == [PLAIN]
  offered = sharded.candidates(node, 8, STATE)
  assert {s.state for s in offered} == {"replicated", "optimizer", "full"}
  assert sharded.candidates(node, 1, STATE) == [PLAIN]  # one device: nothing to shard over
  relu = mlp_graph().node("relu")
  assert sharded.candidates(relu, 8, STATE) == [PLAIN]  # no parameters


# --- recomputation -------------------------------------------------------------------------------


def _blocky_graph(blocks=1, saved_per_sample=4 * 1024 * 64):
  """input -> fc1 -> blk0 .. blk{n-1} (layers saving 64x their input) -> fc2: recomputation's
  case (its peak is every layer's inputs plus one layer's activations, not all of them)."""
  square = {"in_features": 1024, "out_features": 1024, "bias": True}
  nodes = [LayerNode("fc1", "linear", (), 1024 * 1024 + 1024, 4 * (1024 * 1024 + 1024), (1024,),
                     4 * 1024, attrs=square, saved_bytes_per_sample=4 * 1024)]
  for b in range(blocks):
    nodes.append(LayerNode(f"blk{b}", "linear", (nodes[-1].name,), 1024 * 1024 + 1024,
                           4 * (1024 * 1024 + 1024), (1024,), 4 * 1024, attrs=square,
                           saved_bytes_per_sample=saved_per_sample))
  nodes.append(LayerNode("fc2", "linear", (nodes[-1].name,), 1024 * 10 + 10, 4 * (1024 * 10 + 10),
                         (10,), 40, attrs={"in_features": 1024, "out_features": 10, "bias": True},
                         saved_bytes_per_sample=4 * 1024))
  return LayerGraph(model="blocky", input_shape=(1024,), input_dtype="float32",
                    nodes=tuple(nodes))


def _blocky_model(gb=None, batch=4096, **kw):
  cl = cluster("a100_nvlink_8")
  if gb is not None:
    cl = dataclasses.replace(cl, memory_gb_per_device=gb)
  return cost_model(_blocky_graph(), cl, batch=batch, **kw)


def test_recompute_keeps_the_input_and_runs_the_forward_again():
  model = _blocky_model(recompute="choose")
  i, p = model.row["blk0"], (0, 2)
  plain = pricing.layer_time(model, "blk0", p)
  again = pricing.layer_time(model, "blk0", p, Strategy(recompute=True))
  assert again.backward_total == pytest.approx(plain.backward_total + plain.forward_total)
  assert again.forward_total == pytest.approx(plain.forward_total)
  per_device = model.batch // 2
  saved = memory.layer_need(model, "blk0", 2) - float(model.state_bytes[i])
  kept = memory.layer_need(model, "blk0", 2, Strategy(recompute=True)) - float(
      model.state_bytes[i])
  assert saved == pytest.approx(model.saved_bytes[i] * per_device)
  assert kept == pytest.approx(model.in_bytes[i] * per_device)
  # while its backward runs it saves them again (one layer at a time)
  assert memory.transient_need(model, "blk0", 2, Strategy(recompute=True)) == pytest.approx(saved)


def test_full_state_recomputing_gathers_once_for_the_backward():
  model = _model(sharding=STATE, recompute="choose")
  p = (0, 8)
  fsdp = pricing.layer_time(model, "fc1", p, Strategy(state="full"))
  both = pricing.layer_time(model, "fc1", p, Strategy(state="full", recompute=True))
  gather = fsdp.moves_forward
  # the backward: the recomputed forward (with its gather) and the backward without another
  assert both.backward_total == pytest.approx(fsdp.backward_total + fsdp.forward_total - gather)


def test_planner_recomputes_exactly_when_activations_do_not_fit():
  # each block's activations on 8 devices: 4096 / 8 x 256 KiB = 134 MB, 1.07 GB for eight;
  # recomputed, 2 MB each plus one block's 134 MB while its backward runs
  g = _blocky_graph(blocks=8)
  prof = analytic_profile(g, "A100-SXM4-40GB", "float32", [4096 // d for d in (1, 2, 4, 8)])

  def planned(gb, recompute):
    cl = dataclasses.replace(cluster("a100_nvlink_8"), memory_gb_per_device=gb)
    return make_plan(g, prof, cl, num_devices=8, global_batch=4096,
                     amplification_limit=math.inf, recompute=recompute)

  roomy = planned(10.0, "choose")
  assert not any(lp.recompute for lp in roomy.layers)  # costs time, so not chosen when it fits
  gb = 0.4
  with pytest.raises(UserError, match="planner.recompute=choose"):
    planned(gb, "none")
  tight = planned(gb, "choose")
  chosen = {lp.name for lp in tight.layers if lp.recompute}
  assert len(chosen) >= 5 and chosen <= {f"blk{b}" for b in range(8)}
  assert max(tight.extra["memory_gb_per_device"]) <= gb + 1e-9
  assert tight.predicted["iteration_ms"] > roomy.predicted["iteration_ms"]  # recomputing costs


def test_planner_shards_state_exactly_when_it_does_not_fit_replicated():
  wide = 65536  # fc1: 268 MB of parameters, 1.07 GB with gradients and Adam-style state
  g = mlp_graph(wide)
  prof = analytic_profile(g, "A100-SXM4-40GB", "float32", [32 // d for d in (1, 2, 4, 8)])

  def planned(gb, sharding):
    cl = dataclasses.replace(cluster("a100_nvlink_8"), memory_gb_per_device=gb)
    return make_plan(g, prof, cl, num_devices=8, global_batch=32,
                     amplification_limit=math.inf, sharding=sharding)

  # 0.6 GB: ZeRO-1 fits (0.57 GB), FSDP's gather buffers do not (0.10 + 0.54 GB)
  with pytest.raises(UserError, match="state sharded"):
    planned(0.6, ("samples",))
  plan = planned(0.6, STATE)
  fc1 = next(lp for lp in plan.layers if lp.name == "fc1")
  assert fc1.strategy.state == "optimizer"
  assert max(plan.extra["memory_gb_per_device"]) <= 0.6
  # with room, sharding the state is still chosen where it is faster (ZeRO-1: the same bytes
  # on the wire, an eighth of the update), and the plan is never slower than samples alone
  roomy, alone = planned(40.0, STATE), planned(40.0, ("samples",))
  assert roomy.predicted["iteration_ms"] <= alone.predicted["iteration_ms"] * (1 + 1e-9)


def test_plan_json_keeps_every_strategy_and_writes_only_what_is_set():
  g = _blocky_graph(blocks=8)
  model_plan = make_plan(g, analytic_profile(
      g, "A100-SXM4-40GB", "float32", [4096 // d for d in (1, 2, 4, 8)]),
      dataclasses.replace(cluster("a100_nvlink_8"), memory_gb_per_device=0.4), num_devices=8,
      global_batch=4096, amplification_limit=math.inf, recompute="choose")
  doc = json.loads(json.dumps(model_plan.to_json()))
  back = as_plan(doc)
  assert [lp.strategy for lp in back.layers] == [lp.strategy for lp in model_plan.layers]
  assert any(lp.recompute for lp in back.layers)
  for entry, lp in zip(doc["layers"], model_plan.layers, strict=True):
    assert ("recompute" in entry) == lp.recompute


# --- experts -------------------------------------------------------------------------------------


def _moe_node(n_expert=8, d=64, ffn=128, top_k=2, seq=16, cap_factor=1.25, shared=0):
  params = 3 * n_expert * d * ffn + 3 * shared * d * ffn
  cap = math.ceil(seq * top_k * cap_factor / n_expert)
  return LayerNode("experts", "moe_experts", (), params, 4 * params, (seq, d), 4 * seq * d,
                   attrs={"n_expert": n_expert, "d_model": d, "ffn_dim": ffn, "top_k": top_k,
                          "capacity": cap, "seq_len": seq, "shared_ffn_dim": shared * ffn},
                   saved_bytes_per_sample=4 * seq * d * 4)


def test_experts_split_holds_the_routed_experts_in_m_shards_and_the_shared_whole():
  node = _moe_node(shared=1)
  routed = sharded.split_fraction(node, "experts")
  assert routed == pytest.approx(8 / 9)
  assert sharded.param_share(node, Strategy(4, "experts")) == pytest.approx(routed / 4
                                                                           + 1 - routed)
  assert "experts" in {s.split for s in sharded.candidates(node, 8, ("samples", "experts"))}
  assert "experts" not in {s.split for s in sharded.candidates(node, 8, ("samples", "weights"))}
  assert not any(s.split == "experts" for s in sharded.candidates(node, 8, ("samples", "experts"))
                 if 8 % s.m or s.m > 8)


def test_experts_move_tokens_with_two_all_to_alls_each_way():
  from test_models_moe import tiny_graph

  from dp_jax.planner.costs import build_cost_model
  from dp_jax.planner.options import PlanOptions
  g = tiny_graph("mixtral_tiny")
  cl = cluster("dgx_a100")
  prof = analytic_profile(g, "A100-SXM4-40GB", "float32", [64 // d for d in (1, 2, 4, 8, 16)])
  model = build_cost_model(g, prof, cl, PlanOptions(num_devices=16, global_batch=64,
                                                    sharding=("samples", "experts")))
  name = "layers.0.experts"
  node = g.node(name)
  assert {s.m for s in sharded.candidates(node, 16, ("samples", "experts"))
          if s.split == "experts"} == {2, 4, 8}  # m divides the 8 experts and the 16 devices
  fwd, bwd = pricing.activation_ms(model, name, (0, 16), Strategy(8, "experts"))
  a = node.attrs
  # E x C slots of D per sequence, 64 / 16 sequences per device
  buffer = 64 // 16 * node.out_bytes_per_sample * a["n_expert"] * a["capacity"] / a["seq_len"]
  one = alltoall_ms(cl, buffer, 0, 8)  # the model axis of 8 devices: one node each
  assert one > 0 and fwd == pytest.approx(2 * one) and bwd == pytest.approx(2 * one)
  assert alltoall_ms(cl, buffer, 0, 16) > one  # over two nodes: the NIC share
  # the planner prices and may choose it: every layer's strategy round-trips
  plan = make_plan(g, prof, cl, num_devices=16, global_batch=64, amplification_limit=math.inf,
                   sharding=("samples", "experts"))
  assert [lp.strategy for lp in as_plan(json.loads(json.dumps(plan.to_json()))).layers] == [
      lp.strategy for lp in plan.layers]


# --- never slower than the best uniform strategy ---------------------------------------------


@pytest.mark.parametrize("gb", [0.4, 10.0])
def test_burst_plan_without_a_limit_is_never_slower_than_the_best_uniform_strategy(gb):
  from dp_jax.planner.costs import build_cost_model
  from dp_jax.planner.options import PlanOptions
  from dp_jax.planner.uniform import best_uniform
  g = _blocky_graph(blocks=8)
  prof = analytic_profile(g, "A100-SXM4-40GB", "float32", [4096 // d for d in (1, 2, 4, 8)])
  cl = dataclasses.replace(cluster("a100_nvlink_8"), memory_gb_per_device=gb)
  opts = {"num_devices": 8, "global_batch": 4096, "amplification_limit": math.inf,
          "sharding": ("samples", "weights", "state"), "recompute": "choose"}
  uniform = best_uniform(build_cost_model(g, prof, cl, PlanOptions(**opts)))
  assert uniform.setting is not None, uniform.reason
  plan = make_plan(g, prof, cl, **opts)
  assert plan.predicted["iteration_ms"] <= uniform.evaluation.iteration_ms * (1 + 1e-9)


def test_every_plan_of_a_moe_model_states_its_capacity_factor():
  from test_models_moe import tiny_graph

  from dp_jax.report.plan_report import experts_line
  g = tiny_graph("mixtral_tiny")
  prof = analytic_profile(g, "A100-SXM4-40GB", "float32", [8 // d for d in (1, 2, 4, 8)])
  plan = make_plan(g, prof, cluster("a100_nvlink_8"), num_devices=8, global_batch=8,
                   amplification_limit=math.inf)
  node = g.node("layers.0.experts")
  rec = as_plan(json.loads(json.dumps(plan.to_json()))).extra["experts"]
  assert rec["layers.0.experts"]["capacity_factor"] == node.attrs["capacity_factor"]
  line = experts_line(plan)
  assert f"capacity factor {node.attrs['capacity_factor']:g}" in line and "in 2 layers" in line
