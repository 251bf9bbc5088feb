"""Per-layer sharding (v1): allowed splits per layer and mesh, and the plan's sharding entries."""

import pytest
from runtime_helpers import TINY_GPT2

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerNode
from dp_jax.models.zoo import build_model
from dp_jax.planner.sharding import SPLITS, default_sharding, layer_sharding, splits_for
from dp_jax.runtime.functional import split_layers


def linear(i=4096, o=1000):
  return LayerNode("fc", "linear", attrs={"in_features": i, "out_features": o, "bias": True})


def test_model_axis_of_one_allows_only_samples():
  assert splits_for(linear(), 1) == ("samples",)
  assert splits_for(LayerNode("r", "relu"), 1) == ("samples",)


def test_splits_follow_divisibility_of_the_split_dimension():
  assert splits_for(linear(), 8) == ("out", "in")
  assert splits_for(linear(o=1001), 8) == ("in",)
  assert splits_for(linear(i=6, o=1001), 4) == ()
  conv = LayerNode("c", "conv2d", attrs={"in_channels": 3, "out_channels": 64})
  assert splits_for(conv, 8) == ("out",) and splits_for(conv, 3) == ()
  block = LayerNode("h.0", "transformer_block", attrs={"d_model": 768, "n_head": 12})
  assert splits_for(block, 4) == ("heads",) and splits_for(block, 8) == ()
  head = LayerNode("lm_head", "lm_head", attrs={"vocab_size": 50257, "d_model": 768})
  assert splits_for(head, 2) == () and splits_for(
      LayerNode("lm_head", "lm_head", attrs={"vocab_size": 512}), 8) == ("out",)
  assert splits_for(LayerNode("p", "maxpool"), 2) == ()
  assert set(splits_for(linear(), 2)) <= set(SPLITS)


def test_layer_sharding_writes_mesh_axes_specs():
  s = layer_sharding(linear(), (2, 4), "out")
  assert s == {"mesh": [2, 4], "axes": ["data", "model"], "split": "out",
               "params": {"kernel": [None, "model"], "bias": ["model"]},
               "input": ["data"], "output": ["data"]}
  assert layer_sharding(linear(), (1, 8), "in")["params"] == {"kernel": ["model", None]}
  assert layer_sharding(linear(), (8, 1), "samples") == default_sharding(8)


@pytest.mark.parametrize("mesh,split", [((1, 8), "heads"), ((2, 4), "samples"), ((0, 8), "out"),
                                        ((1, 8), "rows")])
def test_disallowed_sharding_is_a_user_error(mesh, split):
  with pytest.raises(UserError, match="fc"):
    layer_sharding(linear(), mesh, split)


@pytest.mark.parametrize("name,kw,layer,split", [
    ("vgg16", dict(image_size=32, num_classes=16), "classifier.0", "out"),
    ("vgg16", dict(image_size=32, num_classes=16), "classifier.2", "in"),
    ("vgg16", dict(image_size=32, num_classes=16), "features.0", "out"),
    ("gpt2_small", TINY_GPT2, "h.0", "heads"),
])
def test_param_paths_are_the_runtime_keys_of_the_layer(name, kw, layer, split):
  model = build_model(name, **kw, abstract=True)
  spec = next(s for s in model.layer_specs() if s.name == layer)
  node = LayerNode(layer, spec.kind, attrs=spec.attrs)
  defs, _, _ = split_layers(model)
  paths = layer_sharding(node, (1, 2), split)["params"]
  assert paths and set(paths) <= set(defs[layer].keys)


def test_batch_norm_conv_splits_its_statistics_with_its_channels():
  from flax import nnx

  from dp_jax.models.base import GraphModel, chain
  from dp_jax.models.layers import Conv2d

  class OneConv(GraphModel):
    def __init__(self):
      self.c = Conv2d(3, 8, 3, batch_norm=True, rngs=nnx.Rngs(0))

    def layer_specs(self):
      return chain([("c", self.c)])

  model = OneConv()
  defs, _, _ = split_layers(model)
  node = LayerNode("c", "conv2d", attrs=model.c.attrs())
  assert set(layer_sharding(node, (1, 2), "out")["params"]) == set(defs["c"].keys)


def test_lm_head_out_split_names_the_tied_table():
  model = build_model("gpt2_small", **TINY_GPT2, abstract=True)
  spec = next(s for s in model.layer_specs() if s.name == "lm_head")
  node = LayerNode("lm_head", "lm_head", attrs=spec.attrs)
  defs, _, _ = split_layers(model)
  assert set(layer_sharding(node, (1, 2), "out")["params"]) == set(defs["lm_head"].keys)
