"""The memory model: per-layer state and XLA's saved activations, against XLA's step peak."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.models.trace import trace_graph
from dp_jax.models.zoo import build_model
from dp_jax.planner import memory
from dp_jax.planner.contract import as_plan

TINY_GPT2 = dict(n_layer=2, d_model=64, n_head=2, seq_len=32, vocab_size=512)


def xla_step_peak_bytes(model, batch: int) -> float:
  """XLA's memory analysis of one compiled Adam training step on one device."""
  opt = optax.adam(1e-3)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  x, y = model.input_spec(batch), model.label_spec(batch)

  def step(p, r, o, x, y):
    def loss(p):
      logits = nnx.merge(graphdef, p, r)(x)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    value, grads = jax.value_and_grad(loss)(p)
    updates, o = opt.update(grads, o, p)
    return value, optax.apply_updates(p, updates), o

  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, rest))
  opt_state = jax.eval_shape(opt.init, abstract[0])
  stats = jax.jit(step, donate_argnums=(0, 2)).lower(*abstract, opt_state, x, y).compile()
  m = stats.memory_analysis()
  return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


@pytest.mark.parametrize("name,kw,batch", [
    ("gpt2_small", TINY_GPT2, 8),
    pytest.param("vgg16", dict(image_size=32, num_classes=10), 32, marks=pytest.mark.slow),
])
def test_model_peak_within_a_quarter_of_xla(name, kw, batch):
  model = build_model(name, seed=0, **kw)
  graph = trace_graph(model, name)
  predicted = memory.job_bytes(graph, batch, grad_bytes_per_param=4, optimizer_bytes_per_param=8)
  measured = xla_step_peak_bytes(model, batch)
  assert predicted == pytest.approx(measured, rel=0.25)


def test_saved_activations_exceed_outputs_where_xla_keeps_more():
  # A transformer block keeps its attention probabilities, not just its output.
  graph = trace_graph(build_model("gpt2_small", seed=0, **TINY_GPT2), "gpt2_small")
  block = next(n for n in graph.nodes if n.kind == "transformer_block")
  assert block.saved_bytes_per_sample > 2 * block.out_bytes_per_sample
  probs = TINY_GPT2["n_head"] * TINY_GPT2["seq_len"] ** 2 * 4
  assert block.saved_bytes_per_sample >= probs


def node(**kw):
  base = dict(name="a", kind="linear", inputs=(), params=10, param_bytes=40, out_shape=(5,),
              out_bytes_per_sample=20)
  return LayerNode(**{**base, **kw})


def test_layer_state_and_saved_bytes():
  n = node(saved_bytes_per_sample=60)
  assert memory.state_bytes(n, 4, 8) == 40 + 10 * 12
  assert memory.saved_bytes_per_sample(n) == 60
  assert memory.saved_bytes_per_sample(n, 0.5) == 30
  assert memory.saved_bytes_per_sample(node()) == 20  # no XLA residuals: the output


def test_job_and_placed_bytes_agree():
  a, b = node(name="a", saved_bytes_per_sample=60), node(name="b", inputs=("a",))
  graph = LayerGraph(model="m", input_shape=(5,), input_dtype="float32", nodes=(a, b))
  whole = memory.job_bytes(graph, 4, optimizer_bytes_per_param=8)  # Adam
  layers = [{"name": "a", "devices": [0, 1], "samples": [[0, 2], [2, 4]]},
            {"name": "b", "devices": [0], "samples": [[0, 4]]}]
  used = memory.placed_bytes(graph, as_plan({"model": "m", "global_batch": 4, "num_devices": 2,
                                            "layers": layers}), optimizer_bytes_per_param=8)
  assert used[0] == pytest.approx(160 + 2 * 60 + 160 + 4 * 20)
  assert used[1] == pytest.approx(160 + 2 * 60)
  assert whole == pytest.approx(2 * 160 + 4 * 60 + 4 * 20)
  assert np.all(used <= whole)
