"""trace_graph: parameter counts vs torchvision, graph structure, XLA costs, attrs, JSON."""

import functools
import json

import jax
import numpy as np
import pytest
from flax import nnx

from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.models.base import ImageModel, chain, run_layers, spec
from dp_jax.models.layers import Add, AvgPool2d, Conv2d, Flatten, Linear
from dp_jax.models.trace import trace_graph
from dp_jax.models.zoo import build_model

TORCHVISION_PARAMS = {  # full size; Inception-v3 without its aux head; GPT-2 with tied wte
    "vgg16": 138_357_544,
    "resnet50": 25_557_032,
    "wide_resnet50_2": 68_883_240,
    "wide_resnet101_2": 126_886_696,
    "inception_v3": 23_834_568,
    "gpt2_small": 124_439_808,
}
TINY_GPT2 = dict(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=101)
ATTR_KEYS = {
    "conv2d": {"in_channels", "out_channels", "kernel_size", "stride", "padding", "batch_norm",
               "activation", "in_shape"},
    "linear": {"in_features", "out_features", "bias"},
    "maxpool": {"kernel_size", "stride", "padding", "in_shape", "global"},
    "avgpool": {"kernel_size", "stride", "padding", "in_shape", "global"},
    "relu": {"in_shape"}, "flatten": {"in_shape"}, "concat": {"in_shape"},
    "add": {"in_shape", "activation"},
    "transformer_block": {"d_model", "n_head", "seq_len"},
    "embed": {"vocab_size", "d_model", "seq_len"},
    "layernorm": {"d_model"},
    "lm_head": {"tied_to", "vocab_size", "d_model"},
}


@functools.cache
def full(name: str) -> LayerGraph:
  return trace_graph(build_model(name, abstract=True), name)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n in ("inception_v3", "wide_resnet101_2", "wide_resnet50_2")
                                  else n for n in sorted(TORCHVISION_PARAMS)])
def test_param_counts_match_torchvision(name):
  g = full(name)
  graph_json = json.loads(json.dumps(g.to_json()))  # read the count as a user of the JSON would
  total = sum(node["params"] for node in graph_json["nodes"])
  assert abs(total - TORCHVISION_PARAMS[name]) <= 0.01 * TORCHVISION_PARAMS[name]
  assert g.total_param_bytes == 4 * g.total_params


def test_gpt2_medium_params_follow_the_closed_form():
  L, d, V, T = 24, 1024, 50257, 1024
  assert full("gpt2_medium").total_params == L * (12 * d * d + 13 * d) + (V + T) * d + 2 * d


def test_tied_lm_head_is_not_double_counted():
  g = full("gpt2_small")
  head = g.node("lm_head")
  assert head.params == 0 and head.param_bytes == 0 and head.attrs["tied_to"] == "embed"
  assert g.node("embed").params == (50257 + 1024) * 768
  assert head.flops_per_sample > 0


def test_resnet50_has_16_fork_join_blocks():
  blocks = full("resnet50").fork_join_blocks()
  assert len(blocks) == 16
  assert all(b.join.endswith(".add") for b in blocks)
  identity = [b for b in blocks if () in b.branches]
  assert len(identity) == 12  # the first block of each of the 4 stages downsamples
  first = blocks[0]
  assert (first.fork, first.join) == ("maxpool", "layer1.0.add")
  assert first.branches == (("layer1.0.conv1", "layer1.0.conv2", "layer1.0.conv3"),
                            ("layer1.0.downsample",))


def test_wide_resnet101_has_33_fork_join_blocks():
  assert len(full("wide_resnet101_2").fork_join_blocks()) == 33


def test_inception_modules_are_top_level_fork_joins_with_nested_e_splits():
  g = full("inception_v3")
  top = [item for item in g.decompose().items if not isinstance(item, str)]
  assert [b.join for b in top] == [f"{m}.concat" for m in (
      "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
      "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c")]
  nested = [(b.fork, b.join) for b in g.fork_join_blocks() if not b.join.endswith(".concat")]
  assert nested == [
      ("Mixed_7b.branch3x3_1", "Mixed_7b.branch3x3_concat"),
      ("Mixed_7b.branch3x3dbl_2", "Mixed_7b.branch3x3dbl_concat"),
      ("Mixed_7c.branch3x3_1", "Mixed_7c.branch3x3_concat"),
      ("Mixed_7c.branch3x3dbl_2", "Mixed_7c.branch3x3dbl_concat")]
  assert g.node("Mixed_5b.concat").out_shape == (35, 35, 256)
  assert g.node("Mixed_7c.concat").out_shape == (8, 8, 2048)


def test_full_size_shapes_and_attrs():
  g = full("vgg16")
  assert g.input_shape == (224, 224, 3) and g.input_dtype == "float32"
  first = g.node("features.0")
  assert first.attrs == {"in_channels": 3, "out_channels": 64, "kernel_size": [3, 3],
                         "stride": [1, 1], "padding": [1, 1], "batch_norm": False,
                         "activation": None, "in_shape": [224, 224, 3]}
  assert first.out_shape == (224, 224, 64) and first.out_bytes_per_sample == 224 * 224 * 64 * 4
  assert g.node("features.4").attrs == {"kernel_size": [2, 2], "stride": [2, 2],
                                        "padding": [0, 0], "global": False,
                                        "in_shape": [224, 224, 64]}
  assert g.node("classifier.0").attrs == {"in_features": 25088, "out_features": 4096,
                                          "bias": True}
  pool = full("resnet50").node("avgpool").attrs
  assert pool["global"] and pool["kernel_size"] == [7, 7] and pool["in_shape"] == [7, 7, 2048]


@pytest.mark.parametrize("name", ["vgg16", "resnet50", "inception_v3", "gpt2_small"])
def test_attrs_follow_the_contract(name):
  g = full(name)
  for n in g.nodes:
    assert set(n.attrs) == ATTR_KEYS[n.kind], n.name
    if "in_shape" in n.attrs:
      src = g.node(n.inputs[0]).out_shape if n.inputs else g.input_shape
      assert tuple(n.attrs["in_shape"]) == src, n.name


def test_flops_come_from_xla_and_are_per_sample():
  g = full("vgg16")
  conv = g.node("features.2")  # 64 -> 64, 3x3 at 224x224: 2 flops per multiply-add
  macs = 224 * 224 * 64 * 64 * 9
  assert conv.flops_per_sample == pytest.approx(2 * macs, rel=0.02)
  assert g.node("classifier.0").flops_per_sample == pytest.approx(2 * 25088 * 4096, rel=0.01)
  # forward GFLOPs per image, as commonly quoted (2 x MACs)
  assert g.total_flops_per_sample / 1e9 == pytest.approx(31.0, rel=0.05)
  assert full("resnet50").total_flops_per_sample / 1e9 == pytest.approx(8.2, rel=0.05)
  assert full("inception_v3").total_flops_per_sample / 1e9 == pytest.approx(11.4, rel=0.05)
  assert all(n.bytes_accessed_per_sample > 0 for n in g.nodes)


def test_bfloat16_halves_param_bytes():
  g = trace_graph(build_model("vgg16", image_size=32, dtype="bfloat16", abstract=True), "v")
  assert g.total_param_bytes == 2 * g.total_params
  assert g.node("features.0").out_bytes_per_sample == 32 * 32 * 64 * 2


class TinyNet(ImageModel):
  """conv+bn -> (conv | identity) -> add -> global avgpool -> flatten -> linear."""

  def __init__(self, rngs):
    self.image_size, self.num_classes = 8, 3
    self.config = {"image_size": 8}
    self.stem = Conv2d(3, 4, 3, padding=1, batch_norm=True, activation="relu", rngs=rngs)
    self.branch = Conv2d(4, 4, 1, rngs=rngs)
    self.add = Add("relu")
    self.pool = AvgPool2d(global_pool=True)
    self.flatten = Flatten()
    self.fc = Linear(4, 3, rngs=rngs)

  def __call__(self, x):
    y = self.stem(x)
    return self.fc(self.flatten(self.pool(self.add(self.branch(y), y))))

  def layer_specs(self):
    specs = chain([("stem", self.stem), ("branch", self.branch)])
    specs.append(spec("add", self.add, ("branch", "stem")))
    return specs + chain([("pool", self.pool), ("flatten", self.flatten), ("fc", self.fc)],
                         ("add",))


def test_trace_of_a_concrete_model_equals_the_abstract_trace():
  model = TinyNet(nnx.Rngs(0))
  g = trace_graph(model, "tiny")
  assert g == trace_graph(nnx.eval_shape(lambda: TinyNet(nnx.Rngs(0))), "tiny")
  assert [(b.fork, b.join, b.branches) for b in g.fork_join_blocks()] == [
      ("stem", "add", (("branch",), ()))]
  out = nnx.eval_shape(run_layers, model, model.input_spec(5))
  assert out.shape == (5, *g.node(g.sink).out_shape) == (5, 3)
  counted = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert g.total_params == counted == (27 * 4 + 8) + (4 * 4 + 4) + (4 * 3 + 3)
  assert g.node("stem").params == 27 * 4 + 8  # BatchStat mean/var are not parameters


def test_trace_of_a_concrete_gpt2_counts_the_tied_table_once():
  model = build_model("gpt2_small", **TINY_GPT2)
  g = trace_graph(model, "gpt2_small")
  assert g == trace_graph(build_model("gpt2_small", abstract=True, **TINY_GPT2), "gpt2_small")
  counted = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert g.total_params == counted and g.node("lm_head").params == 0


@pytest.mark.parametrize("name", ["vgg16", "resnet50", "inception_v3", "gpt2_small"])
def test_graph_json_round_trip(name, tmp_path):
  g = full(name)
  assert LayerGraph.from_json(json.loads(json.dumps(g.to_json()))) == g
  assert LayerGraph.load(g.save(tmp_path / f"{name}.json")) == g
  assert g.meta["config"] == build_model(name, abstract=True).config


def test_saved_bytes_are_the_compiled_forward_with_residuals_output():
  from dp_jax.models.trace import forward_with_residuals, residual_bytes

  layer = Conv2d(3, 8, 3, padding=1, batch_norm=True, activation="relu", rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(layer)
  sds = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
  x = jax.ShapeDtypeStruct((2, 8, 8, 3), np.float32)
  compiled = jax.jit(forward_with_residuals(graphdef)).lower(sds, x).compile()
  # the compiled output also holds the result tuple's table (8 bytes a leaf): within 1%
  assert residual_bytes(graphdef, sds, [x]) == pytest.approx(
      compiled.memory_analysis().output_size_in_bytes, rel=0.01)
