"""Per-layer pure functions: roles of state, tied params, apply == module call, write-back."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from runtime_helpers import TINY_GPT2

from dp_jax.models.zoo import build_model
from dp_jax.runtime.functional import (
  PARAM,
  STAT,
  TIED,
  apply_layer,
  layer_params,
  split_layers,
  write_back,
)


def test_gpt2_lm_head_reads_the_embedding_table_of_embed():
  model = build_model("gpt2_small", **TINY_GPT2)
  defs, params, stats = split_layers(model)
  assert defs["lm_head"].roles == (TIED,) and defs["lm_head"].tied == {"wte": ("embed", "wte")}
  assert params["lm_head"] == {} and set(params["embed"]) == {"wpe", "wte"}
  assert layer_params(defs["lm_head"], params)["wte"] is params["embed"]["wte"]
  x = jnp.ones((2, 16, 32))
  out, _ = apply_layer(defs["lm_head"], layer_params(defs["lm_head"], params), {}, [x])
  np.testing.assert_allclose(out, model.lm_head(x), rtol=1e-6)


def test_batch_norm_layer_returns_updated_running_statistics():
  model = build_model("resnet50", image_size=32, num_classes=10)
  defs, params, stats = split_layers(model)
  d = defs["conv1"]
  roles = dict(zip(d.keys, d.roles, strict=True))
  assert roles == {"bn/bias": PARAM, "bn/mean": STAT, "bn/scale": PARAM, "bn/var": STAT,
                   "conv/kernel": PARAM}
  x = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))
  out, new = jax.jit(lambda p, s, x: apply_layer(d, p, s, [x]))(params["conv1"],
                                                                 stats["conv1"], x)
  want = model.conv1(x)  # updates the module's own statistics in place
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(new["bn/mean"], model.conv1.bn.mean[...], rtol=1e-5, atol=1e-6)
  assert not np.allclose(new["bn/mean"], stats["conv1"]["bn/mean"])


def test_write_back_stores_values_in_the_model():
  model = build_model("gpt2_small", **TINY_GPT2)
  defs, params, stats = split_layers(model)
  params = jax.tree.map(lambda a: a + 1.0, params)
  before = np.asarray(model.embed.wte[...])
  write_back(model, defs, params, stats)
  np.testing.assert_allclose(model.embed.wte[...], before + 1.0)
  assert model.lm_head.wte is model.embed.wte  # the tie survives
  state = nnx.state(model, nnx.Param)
  assert len(jax.tree.leaves(state)) == sum(len(p) for p in params.values())
