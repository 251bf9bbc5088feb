"""Model zoo: registry validation, natural forward == graph forward, naming, GPT-2 tie."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.models.base import GraphModel, run_layers
from dp_jax.models.zoo import MODEL_NAMES, build_model

SMALL = {  # the smallest sizes each family supports, so the tests stay fast
    "vgg16": dict(image_size=32, num_classes=10),
    "resnet50": dict(image_size=32, num_classes=10),
    "inception_v3": dict(image_size=75, num_classes=10),
    "gpt2_small": dict(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=101),
    "digits_cnn": dict(),
    "digits_mlp": dict(),
}


@functools.cache
def small(name: str) -> GraphModel:
  return build_model(name, **SMALL[name])


def example_input(model: GraphModel, batch: int = 2, seed: int = 1):
  spec = model.input_spec(batch)
  key = jax.random.key(seed)
  if jnp.issubdtype(spec.dtype, jnp.integer):
    return jax.random.randint(key, spec.shape, 0, model.config["vocab_size"], spec.dtype)
  return jax.random.normal(key, spec.shape, spec.dtype)


def module_at(model: nnx.Module, name: str):
  m = model
  for part in name.split("."):
    m = m[int(part)] if part.isdigit() else getattr(m, part)
  return m


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "inception_v3"
                                  else n for n in sorted(SMALL)])
def test_graph_forward_equals_natural_forward(name):
  model = small(name)
  x = example_input(model)
  # one program computing both keeps the test to a single XLA compile (batch norm in train
  # mode both times: each call normalises with the batch's own statistics)
  natural, graph = nnx.jit(lambda m, x: (m(x), run_layers(m, x)))(model, x)
  assert natural.shape == graph.shape
  np.testing.assert_allclose(np.asarray(graph), np.asarray(natural), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_layer_names_are_module_paths_and_unique(name):
  model = small(name)
  specs = model.layer_specs()
  assert len({s.name for s in specs}) == len(specs)
  for s in specs:
    assert module_at(model, s.name) is s.module
    assert s.kind == s.module.kind


@pytest.mark.parametrize("name", sorted(SMALL))
def test_specs_are_topological_with_one_source_and_the_logits_last(name):
  specs = small(name).layer_specs()
  seen = set()
  for s in specs:
    assert all(p in seen for p in s.inputs)
    seen.add(s.name)
  assert [s.name for s in specs if not s.inputs] == [specs[0].name]
  assert specs[-1].kind in ("linear", "lm_head")


def test_output_shapes_are_logits():
  assert small("vgg16").input_spec(3).shape == (3, 32, 32, 3)
  assert small("inception_v3").label_spec(3) == jax.ShapeDtypeStruct((3,), jnp.int32)
  gpt = small("gpt2_small")
  assert gpt.input_spec(3) == jax.ShapeDtypeStruct((3, 16), jnp.int32)
  assert gpt.label_spec(3) == jax.ShapeDtypeStruct((3, 16), jnp.int32)
  out = jax.eval_shape(lambda x: gpt(x), gpt.input_spec(3))
  assert out.shape == (3, 16, 101)


def test_resnet_bottleneck_is_a_real_fork_join():
  specs = {s.name: s for s in small("resnet50").layer_specs()}
  assert specs["layer1.0.conv1"].inputs == ("maxpool",)
  assert specs["layer1.0.downsample"].inputs == ("maxpool",)
  assert specs["layer1.0.add"].inputs == ("layer1.0.conv3", "layer1.0.downsample")
  assert specs["layer1.1.add"].inputs == ("layer1.1.conv3", "layer1.0.add")  # identity
  assert specs["layer1.0.add"].attrs == {"activation": "relu"}
  assert specs["conv1"].attrs["batch_norm"] and specs["conv1"].attrs["activation"] == "relu"
  assert specs["layer1.0.conv3"].attrs["activation"] is None
  assert [s.kind for s in list(specs.values())[-3:]] == ["avgpool", "flatten", "linear"]


def test_vgg16_layer_sequence_matches_deeppool_granularity():
  kinds = [s.kind for s in small("vgg16").layer_specs()]
  assert kinds.count("conv2d") == 13 and kinds.count("maxpool") == 5
  assert kinds[:5] == ["conv2d", "relu", "conv2d", "relu", "maxpool"]
  assert kinds[-6:] == ["flatten", "linear", "relu", "linear", "relu", "linear"]


def test_inception_e_has_inner_concat_joins():
  specs = {s.name: s for s in small("inception_v3").layer_specs()}
  assert specs["Mixed_7b.branch3x3_concat"].inputs == ("Mixed_7b.branch3x3_2a",
                                                       "Mixed_7b.branch3x3_2b")
  assert specs["Mixed_7b.concat"].inputs == (
      "Mixed_7b.branch1x1", "Mixed_7b.branch3x3_concat", "Mixed_7b.branch3x3dbl_concat",
      "Mixed_7b.branch_pool")
  assert specs["Mixed_5b.pool"].kind == "avgpool" and specs["Mixed_6a.pool"].kind == "maxpool"
  assert specs["Mixed_5b.branch1x1"].inputs == ("maxpool2",)


def test_gpt2_lm_head_is_tied_to_the_embedding():
  model = small("gpt2_small")
  assert model.lm_head.wte is model.embed.wte
  params = nnx.state(model, nnx.Param)
  assert "lm_head" not in params and "wte" in params["embed"]
  x = example_input(model)

  def loss(m):
    return jnp.sum(m(x) ** 2)

  grads = nnx.jit(nnx.grad(loss))(model)
  assert "lm_head" not in grads
  only_embed_use = nnx.jit(nnx.grad(lambda m: jnp.sum(m.embed(x) ** 2)))(model)
  # the tied gradient includes the lm_head's use, not only the embedding lookup's
  assert not np.allclose(grads["embed"]["wte"][...], only_embed_use["embed"]["wte"][...])


def test_gpt2_is_causal():
  model = small("gpt2_small")
  x = example_input(model, batch=1)
  y = x.at[0, -1].set((x[0, -1] + 1) % 101)
  fwd = nnx.jit(lambda m, x: m(x))
  a, b = fwd(model, x), fwd(model, y)
  np.testing.assert_allclose(np.asarray(a[0, :-1]), np.asarray(b[0, :-1]), rtol=1e-5, atol=1e-6)
  assert not np.allclose(np.asarray(a[0, -1]), np.asarray(b[0, -1]))


def test_same_seed_same_params_different_seed_different_params():
  a = build_model("gpt2_small", **SMALL["gpt2_small"], seed=3)
  b = build_model("gpt2_small", **SMALL["gpt2_small"], seed=3)
  c = build_model("gpt2_small", **SMALL["gpt2_small"], seed=4)
  same = jax.tree.map(lambda u, v: bool(jnp.array_equal(u, v)), nnx.state(a), nnx.state(b))
  assert all(jax.tree.leaves(same))
  assert not np.array_equal(a.embed.wte[...], c.embed.wte[...])


def test_abstract_build_allocates_nothing():
  model = build_model("vgg16", abstract=True)
  kernel = model.classifier[0].kernel
  assert isinstance(kernel.get_value(), jax.ShapeDtypeStruct)
  assert kernel.shape == (512 * 7 * 7, 4096)


def test_dtype_option_sets_param_dtype():
  model = build_model("resnet50", image_size=32, dtype="bfloat16", abstract=True)
  assert model.conv1.conv.kernel.dtype == jnp.bfloat16


def test_model_names():
  assert set(MODEL_NAMES) == {"vgg16", "resnet50", "wide_resnet50_2", "wide_resnet101_2",
                              "inception_v3", "gpt2_small", "gpt2_medium", "digits_cnn", "vit",
                              "digits_mlp", "llama3_8b", "llama3_70b", "llama_tiny",
                              "llava_1_5_7b", "llava_tiny", "mixtral_8x7b", "mixtral_tiny",
                              "deepseek_moe_16b", "deepseek_moe_tiny"}


def test_unknown_model_lists_valid_names():
  with pytest.raises(UserError, match="unknown model 'resnet18'.*vgg16.*gpt2_medium"):
    build_model("resnet18")


def test_digits_models_read_one_channel_8x8_and_predict_ten_classes():
  for name in ("digits_cnn", "digits_mlp"):
    model = small(name)
    assert model.input_spec(3) == jax.ShapeDtypeStruct((3, 8, 8, 1), jnp.float32)
    assert jax.eval_shape(model, model.input_spec(3)).shape == (3, 10)
  kinds = [s.kind for s in small("digits_cnn").layer_specs()]
  assert kinds == ["conv2d", "maxpool", "conv2d", "maxpool", "flatten", "linear", "relu", "linear"]
  assert [s.kind for s in small("digits_mlp").layer_specs()] == [
      "flatten", "linear", "relu", "linear", "relu", "linear"]


@pytest.mark.parametrize("name,kw,match", [
    ("digits_cnn", dict(image_size=2), "too small for digits_cnn; use at least 4"),
    ("digits_mlp", dict(seq_len=8), "seq_len do not apply to model digits_mlp"),
    ("vgg16", dict(image_size=16), "too small for vgg16; use at least 32"),
    ("inception_v3", dict(image_size=74), "use at least 75"),
    ("resnet50", dict(image_size=0), "model.image_size=0 must be >= 1"),
    ("resnet50", dict(image_size=-3), "image_size=-3 must be >= 1"),
    ("resnet50", dict(image_size=32.0), "image_size=32.0 must be an integer"),
    ("resnet50", dict(num_classes=0), "num_classes=0"),
    ("vgg16", dict(image_size=True), "image_size=True must be a number"),
    ("gpt2_small", dict(n_head=5), "divisible by n_head=5"),
    ("gpt2_small", dict(seq_len=0), "seq_len=0"),
    ("gpt2_medium", dict(vocab_size=-1), "vocab_size=-1"),
    ("gpt2_small", dict(image_size=224), "image_size do not apply to model gpt2_small"),
    ("vgg16", dict(n_layer=2, seq_len=8), "seq_len, n_layer do not apply"),
    ("vgg16", dict(dtype="float64"), "model.dtype='float64' is unknown"),
    ("vgg16", dict(seed="1"), "seed='1' .* must be an integer"),
])
def test_bad_options_raise_user_error(name, kw, match):
  with pytest.raises(UserError, match=match):
    build_model(name, **kw)
