"""The MoE decoders (Mixtral-style, DeepSeek-MoE-style): published total and active parameter
counts, router and experts as planner layers, capacity dispatch (FLOPs of the active experts
only), graph forward == natural forward, exact training through the runtime."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from apps import run_app
from flax import nnx
from runtime_helpers import by_prefix, run_plan, run_reference, sgd, state_diffs

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.models import moe
from dp_jax.models.base import run_layers
from dp_jax.models.trace import trace_graph
from dp_jax.models.zoo import build_model

# name -> (total, active, source). The published numbers are rounded to 3 and 2 significant
# digits: within 1% where that is finer than the rounding, else at the published precision.
PUBLISHED = {
    "mixtral_8x7b": (46.7e9, 12.9e9, "Mistral AI's Mixtral announcement: 46.7B / 12.9B"),
    "deepseek_moe_16b": (16.4e9, 2.8e9, "Dai et al., arXiv:2401.06066, sec. 5: 16.4B / 2.8B"),
}


def swiglu_params(d, f):
  return 3 * d * f


def mixtral_closed_form(vocab=32000, d=4096, layers=32, f=14336, experts=8, k=2, kv=1024):
  """(total, active) from the config: embeddings, attention (GQA), norms, router, experts."""
  per_layer = 2 * d * d + 2 * d * kv + 2 * d + d * experts
  common = 2 * vocab * d + d + layers * per_layer
  return (common + layers * experts * swiglu_params(d, f),
          common + layers * k * swiglu_params(d, f))


def deepseek_closed_form(vocab=102400, d=2048, layers=28, dense_f=10944, f=1408, experts=64,
                         k=6, shared=2):
  attn_norms = 4 * d * d + 2 * d
  common = (2 * vocab * d + d + layers * attn_norms + swiglu_params(d, dense_f)
            + (layers - 1) * (d * experts + swiglu_params(d, shared * f)))
  return (common + (layers - 1) * experts * swiglu_params(d, f),
          common + (layers - 1) * k * swiglu_params(d, f))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_total_and_active_parameters(name):
  total, active, source = PUBLISHED[name]
  counts = moe.param_counts(build_model(name, abstract=True))
  closed = {"mixtral_8x7b": mixtral_closed_form,
            "deepseek_moe_16b": deepseek_closed_form}[name]()
  assert (counts["total"], counts["active"]) == closed
  assert abs(counts["total"] / total - 1) < 0.01, (counts, source)
  if name == "mixtral_8x7b":
    assert abs(counts["active"] / active - 1) < 0.01, (counts, source)
  else:  # "2.8B" is 2 digits: 2,828,650,496 is 1.02% above 2.8e9 and rounds to it
    assert round(counts["active"] / 1e9, 1) == 2.8 and abs(counts["active"] / active - 1) < 0.011


def test_published_graphs_trace_with_the_published_routing():
  g = trace_graph(build_model("deepseek_moe_16b", abstract=True), "deepseek_moe_16b")
  assert g.node("layers.0.mlp").kind == "swiglu_mlp"  # first_k_dense_replace = 1
  assert "layers.0.router" not in g.names and len(g.fork_join_blocks()) == 27
  experts = g.node("layers.1.experts")
  assert experts.attrs["capacity"] == 480  # ceil(1.25 * 6 * 4096 / 64)
  routed = 2 * swiglu_params(2048, 1408) * 64 * 480
  shared = 2 * swiglu_params(2048, 2816) * 4096
  assert experts.flops_per_sample == pytest.approx(routed + shared, rel=0.01)
  assert g.total_params == moe.param_counts(build_model("deepseek_moe_16b", abstract=True))[
      "total"]


# --- the dispatch functions --------------------------------------------------------------------


def test_capacity():
  assert moe.capacity(16, 8, 2, 1.0) == 4
  assert moe.capacity(16, 8, 2, 1.25) == 5  # ceil(5.0)
  assert moe.capacity(15, 8, 2, 1.0) == 4  # ceil(3.75)
  assert moe.capacity(16, 8, 2, 100.0) == 16  # never more slots than tokens
  assert moe.capacity(16, 64, 1, 0.01) == 1


def test_dispatch_slots_put_first_choices_first_and_drop_past_capacity():
  experts_TxK = jnp.array([[0, 1], [0, 2], [1, 0], [0, 1]])
  slots = np.asarray(moe.dispatch_slots(experts_TxK, 3, 2))
  # expert 0 gets the first choices of tokens 0 and 1; token 3's first choice and token 2's
  # second choice (both expert 0) are dropped; expert 1: token 2 (1st), token 0 (2nd)
  drop = 3 * 2
  assert slots.tolist() == [[0, 3], [1, 4], [2, drop], [drop, drop]]


def dense_reference(x_TxD, gates_TxE, w_gate, w_up, w_down):
  """Every expert on every token, weighted by the gates (zero gates: no contribution)."""
  y_ExTxD = jnp.stack([jax.nn.silu(x_TxD @ w_gate[e]) * (x_TxD @ w_up[e]) @ w_down[e]
                       for e in range(gates_TxE.shape[1])])
  return jnp.einsum("te,etd->td", gates_TxE, y_ExTxD)


def random_moe(t=12, d=6, f=5, e=4, k=2, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
  gates = moe.top_k_gates(jnp.asarray(rng.standard_normal((t, e)), jnp.float32), k, True)
  w = tuple(jnp.asarray(rng.standard_normal(s) * 0.3, jnp.float32)
            for s in ((e, d, f), (e, d, f), (e, f, d)))
  return x, gates, w


def test_moe_ffn_without_drops_equals_every_expert_weighted_by_the_gates():
  x, gates, w = random_moe()
  assert (np.asarray(gates) > 0).sum(axis=1).tolist() == [2] * 12
  np.testing.assert_allclose(np.asarray(gates).sum(axis=1), 1.0, rtol=1e-6)
  out = jax.jit(moe.moe_ffn, static_argnums=(5, 6))(x, gates, *w, 2, 12)
  np.testing.assert_allclose(np.asarray(out), np.asarray(dense_reference(x, gates, *w)),
                             rtol=1e-5, atol=1e-6)
  assert int(moe.dropped_assignments(gates[None], 2, 12)[0]) == 0


def test_dropped_assignments_add_nothing_and_are_counted():
  x, gates, w = random_moe()
  cap = 3  # 4 experts x 3 slots for 24 assignments: at least 12 are dropped
  experts_TxK = np.asarray(moe.route(gates, 2)[1])
  slots = np.asarray(moe.dispatch_slots(jnp.asarray(experts_TxK), 4, cap))
  kept = np.zeros_like(np.asarray(gates))
  for t in range(12):
    for j in range(2):
      if slots[t, j] < 4 * cap:
        kept[t, experts_TxK[t, j]] = 1
  dropped = int(moe.dropped_assignments(gates[None], 2, cap)[0])
  assert dropped == 24 - int(kept.sum()) and dropped >= 12
  out = jax.jit(moe.moe_ffn, static_argnums=(5, 6))(x, gates, *w, 2, cap)
  np.testing.assert_allclose(np.asarray(out),
                             np.asarray(dense_reference(x, gates * kept, *w)), rtol=1e-5,
                             atol=1e-6)


def test_deepseek_gates_are_not_renormalised_and_mixtral_gates_are():
  logits = jnp.asarray(np.random.default_rng(1).standard_normal((5, 16)), jnp.float32)
  probs = np.asarray(jax.nn.softmax(logits))
  raw = np.asarray(moe.top_k_gates(logits, 4, normalize=False))
  top = np.sort(probs, axis=1)[:, -4:]
  np.testing.assert_allclose(np.sort(raw, axis=1)[:, -4:], top, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(moe.top_k_gates(logits, 4, normalize=True)).sum(1), 1.0,
                             rtol=1e-6)


# --- the tiny models' graphs -------------------------------------------------------------------


def tiny_graph(name, **kw):
  return trace_graph(build_model(name, abstract=True, **kw), name)


def test_mixtral_tiny_graph_has_router_and_experts_as_a_fork_join_per_block():
  g = tiny_graph("mixtral_tiny")
  assert [(n.name, n.kind) for n in g.nodes[:4]] == [
      ("embed", "embed"), ("layers.0.attn", "gqa_attention"), ("layers.0.router", "moe_router"),
      ("layers.0.experts", "moe_experts")]
  assert g.node("layers.0.experts").inputs == ("layers.0.attn", "layers.0.router")
  blocks = g.fork_join_blocks()
  assert [(b.fork, b.join) for b in blocks] == [
      (f"layers.{i}.attn", f"layers.{i}.experts") for i in range(2)]
  assert all(sorted(b.branches) == [(), (b.fork.replace("attn", "router"),)] for b in blocks)
  assert g.node("layers.0.router").out_shape == (16, 32 + 8)  # [normalised tokens, gates]
  assert g.nodes[-1].name == "lm_head"


def test_deepseek_tiny_graph_has_a_dense_first_block_and_shared_experts():
  g = tiny_graph("deepseek_moe_tiny")
  names = [n.name for n in g.nodes]
  assert names[:3] == ["embed", "layers.0.attn", "layers.0.mlp"]
  assert names[3:6] == ["layers.1.attn", "layers.1.router", "layers.1.experts"]
  experts = g.node("layers.1.experts")
  # 16 routed experts of 3 x 32 x 16 and one shared SwiGLU of 2 x 16
  assert experts.params == 16 * 3 * 32 * 16 + 3 * 32 * 32
  assert experts.attrs["shared_ffn_dim"] == 32 and experts.attrs["top_k"] == 4


def moe_layer_flops(**kw):
  return tiny_graph("mixtral_tiny", **kw).node("layers.0.experts")


def test_experts_flops_scale_with_top_k_and_capacity_not_with_the_expert_count():
  # mixtral_tiny: T = 16 tokens, D = 32, F = 64. Slots E x C: 8 x 4 = 16 x 2 = 32 at k = 2,
  # capacity factor 1; twice that at k = 4 or at capacity factor 2
  def flops(**kw):
    node = moe_layer_flops(**kw)
    return node.flops_per_sample, node.attrs["capacity"]

  base, c = flops(n_expert=8, top_k=2, capacity_factor=1.0)
  assert c == 4
  more_experts, c16 = flops(n_expert=16, top_k=2, capacity_factor=1.0)
  assert c16 == 2
  assert more_experts == pytest.approx(base, rel=0.05)  # twice the experts, same work
  assert flops(n_expert=8, top_k=4, capacity_factor=1.0)[0] == pytest.approx(2 * base, rel=0.05)
  assert flops(n_expert=8, top_k=2, capacity_factor=2.0)[0] == pytest.approx(2 * base, rel=0.05)
  # the work is the experts' matmuls on the slots (6 D F per slot), not every expert on every
  # token (8 x 16 slots)
  assert base == pytest.approx(6 * 32 * 64 * 32, rel=0.1)
  dense, _ = flops(n_expert=8, top_k=2, capacity_factor=4.0)
  assert dense == pytest.approx(4 * base, rel=0.05)


@pytest.mark.parametrize("name", ["mixtral_tiny", "deepseek_moe_tiny"])
def test_graph_forward_equals_natural_forward(name):
  model = build_model(name)
  x = jax.random.randint(jax.random.key(1), (2, model.seq_len), 0, model.vocab_size)
  natural, graph = nnx.jit(lambda m, x: (m(x), run_layers(m, x)))(model, x)
  assert natural.shape == (2, model.seq_len, model.vocab_size)
  np.testing.assert_allclose(np.asarray(graph), np.asarray(natural), rtol=1e-5, atol=1e-6)


def test_tiny_defaults_drop_no_token_and_a_small_capacity_drops_some():
  model = build_model("mixtral_tiny", capacity_factor=0.5)
  default = build_model("mixtral_tiny")
  x = jax.random.randint(jax.random.key(2), (4, 16), 0, 64)

  @nnx.jit
  def dropped(m):
    h = m.layers[0].attn(m.embed(x))
    return m.layers[0].experts.dropped(m.layers[0].router(h)).sum()

  assert int(dropped(default)) == 0
  assert int(dropped(model)) >= 4 * 16 * 2 // 2  # half the slots for all assignments


@pytest.mark.parametrize("kw, match", [
    ({"capacity_factor": 0}, "capacity_factor=0 .* must be a positive number"),
    ({"top_k": 9}, "top_k=9 .* between 1 and n_expert=8"),
    ({"n_kv_head": 3}, "n_kv_head=3"),
])
def test_bad_moe_options_are_user_errors(kw, match):
  with pytest.raises(UserError, match=match):
    build_model("mixtral_tiny", abstract=True, **kw)


@pytest.mark.slow  # the inspect CLI: test_inspect_app; the tiny graphs: tests above
def test_inspect_cli_on_the_tiny_models(tmp_path):
  models = ["llama_tiny", "llava_tiny", "mixtral_tiny", "deepseek_moe_tiny"]
  result = run_app("inspect", "-m", f"model={','.join(models)}", "logger=disabled",
                   cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  for i, name in enumerate(models):
    graph = LayerGraph.load(tmp_path / "sweep" / str(i) / "graph.json")
    assert graph.model == name and graph.names[-1] == "lm_head"
    assert json.loads((tmp_path / "sweep" / str(i) / "status.json").read_text())["status"] == "ok"
  assert "layers.0.experts" in result.stdout and "vision.blocks.1" in result.stdout


# --- training through the runtime: exact against one device ------------------------------------

ALL8, FIRST4 = range(8), range(4)
LAYOUTS = {
    # router and experts of block 0 on other devices than its attention
    "mixtral_tiny": by_prefix([("embed", FIRST4), ("layers.0.attn", ALL8),
                               ("layers.0.router", [4, 5]), ("layers.0.experts", [6, 7]),
                               ("layers.1", FIRST4), ("norm", [0, 1]), ("lm_head", [2])], ALL8),
    "deepseek_moe_tiny": by_prefix([("embed", FIRST4), ("layers.0", ALL8),
                                    ("layers.1.router", [4]), ("layers.1.experts", [4, 5, 6, 7]),
                                    ("layers.2.experts", [0, 1]), ("lm_head", [2, 3])], FIRST4),
}
MAKE = {"mixtral_tiny": moe.mixtral_tiny, "deepseek_moe_tiny": moe.deepseek_moe_tiny}


def _f64(name):
  return MAKE[name](dtype=jnp.float64, rngs=nnx.Rngs(0))


def token_batches(model, batch, steps):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(steps):
    tok = rng.integers(0, model.vocab_size, (batch, model.seq_len + 1), dtype=np.int32)
    out.append((tok[:, :-1], tok[:, 1:]))
  return out


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize("name, layout", [
    # the default run's MoE training: test_runtime_strategies (experts on their own mesh
    # between two stages, equal to one device)
    pytest.param("mixtral_tiny", "burst", marks=pytest.mark.slow),
    pytest.param("mixtral_tiny", "data_parallel", marks=pytest.mark.slow),
    pytest.param("deepseek_moe_tiny", "burst", marks=pytest.mark.slow),
    pytest.param("deepseek_moe_tiny", "data_parallel", marks=pytest.mark.slow)])
def test_training_matches_one_device(name, layout):
  # float64 (the loss itself is float32: dp_jax/runtime/loss.py), so that no routing decision
  # flips between reduction orders
  with jax.enable_x64(True):
    model = _f64(name)
    steps = token_batches(model, 8, 3)
    devices = (lambda _: ALL8) if layout == "data_parallel" else LAYOUTS[name]
    losses, program, _ = run_plan(model, name, devices, steps, sgd())
    counts = {len(s.stage.devices) for s in program.stages}
    assert (len(counts) >= 3) == (layout == "burst"), counts
    reference = _f64(name)
    ref_losses = run_reference(reference, steps, sgd())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    assert losses[0] != losses[-1], "the model should train"
    diff, update = state_diffs(model, reference, _f64(name))
    assert diff < 1e-7 and update > 1e-3, (diff, update)
    # the experts' weights moved (gradients reach them through the dispatch), the same way
    w0, w_ref, w = (np.asarray(m.layers[-1].experts.w_up[...])
                    for m in (_f64(name), reference, model))
    moved = np.abs(w_ref - w0).max()
    assert moved > 1e-6 and np.abs(w - w_ref).max() < 1e-3 * moved
