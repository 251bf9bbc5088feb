"""A layer is priced from what it computes (its traced matrix products, convolutions and memory
traffic), never by its label: relabelled layers plan at the same price; a layer whose work the
graph does not state is refused in one line unless accepted by name; an embedding's forward
reads its gathered rows, not its table."""

import dataclasses
import math

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import named_cluster
from dp_jax.layer_times.analytic import UnpricedLayer, layer_cost
from dp_jax.layer_times.calibrated import calibrated_profile
from dp_jax.layer_times.sources import ProfileConfig
from dp_jax.models.zoo import ModelConfig
from dp_jax.planner import make_plan

LABELS = {"gqa_attention": "self_attention", "swiglu_mlp": "mlp_block", "rmsnorm": "layernorm",
          "embed": "token_lookup", "lm_head": "logits"}


def relabelled(graph: LayerGraph, labels: dict[str, str]) -> LayerGraph:
  return dataclasses.replace(graph, nodes=tuple(
      dataclasses.replace(n, kind=labels.get(n.kind, n.kind)) for n in graph.nodes))


@pytest.fixture(scope="module")
def llama():
  return ModelConfig.named("llama_tiny").graph()


def test_a_traced_graph_says_which_work_runs_on_the_matrix_units(llama):
  assert llama.meta["work_source"].startswith("jaxpr")
  attn = llama.node("layers.0.attn")
  assert 0.9 * attn.flops_per_sample <= attn.matmul_flops_per_sample <= attn.flops_per_sample
  assert llama.node("norm").matmul_flops_per_sample == 0
  embed = llama.node("embed")
  assert embed.gathered_param_bytes == embed.param_bytes > 0  # the table is only gathered


def test_relabelled_layers_plan_at_the_same_price(llama):
  cluster = named_cluster("dgx_h100", num_devices=8)
  plans = []
  for graph in (llama, relabelled(llama, LABELS),
                relabelled(llama, {k: f"custom_{i}" for i, k in enumerate(LABELS)})):
    profile = calibrated_profile(graph, cluster.device, "mixed bf16", [1, 2, 4, 8, 16, 32])
    plans.append(make_plan(graph, profile, cluster, num_devices=8, global_batch=32,
                           amplification_limit=math.inf))
  base = plans[0].predicted["iteration_ms"]
  for p in plans[1:]:
    assert p.predicted["iteration_ms"] == pytest.approx(base, rel=0.05)
    # the same to 0.1%: what differs is a label's refinement of traffic (an 'embed' reads its
    # gathered rows; an unknown label its token ids too)
    assert p.predicted["iteration_ms"] == pytest.approx(base, rel=1e-3)


def test_a_layer_whose_work_is_unknown_is_refused_unless_accepted(llama):
  """A graph file without traced work (meta emptied): the attention and MLP layers' kinds no
  formula knows, so the profile cannot tell their matrix work."""
  untraced = dataclasses.replace(llama, meta={})
  with pytest.raises(UnpricedLayer) as e:
    calibrated_profile(untraced, "H100-SXM5-80GB", "mixed bf16", [8])
  message = str(e.value)
  assert "\n" not in message and "layer 'layers.0.attn' (kind 'gqa_attention')" in message
  assert "profile.accept_vector_rate=[layers.0.attn]" in message
  unknown = ("layers.0.attn", "layers.0.mlp", "layers.1.attn", "layers.1.mlp", "norm")
  table = ProfileConfig(accept_vector_rate=unknown).load(untraced, "H100-SXM5-80GB", [8])
  assert table.lookup("layers.0.mlp", 8).total_ms > 0
  with pytest.raises(UserError, match="layers.1.mlp"):  # accepting some does not accept others
    ProfileConfig(accept_vector_rate=unknown[:3]).load(untraced, "H100-SXM5-80GB", [8])


def test_an_embedding_reads_its_gathered_rows_and_writes_its_dense_gradient(llama):
  embed = llama.node("embed")
  cost = layer_cost(llama, embed, "bfloat16")
  assert cost.param_bytes == 0  # the forward reads rows (its output), not the table
  assert cost.gathered_bytes > 0  # the backward writes the dense gradient (scatter-add)
  assert cost.act_bytes_per_sample < cost.gathered_bytes  # a sample reads rows, not the table
