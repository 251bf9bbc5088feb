"""dp_jax/models/zoo.py: a model config's graph is traced once per process (multirun cells share
it)."""

from omegaconf import OmegaConf

from dp_jax.base.checks import build
from dp_jax.models import zoo


def tiny(**more):
  return OmegaConf.create({"name": "gpt2_small", "n_layer": 1, "d_model": 16, "n_head": 2,
                           "seq_len": 8, "vocab_size": 32, "dtype": "float32", **more})


def test_graph_of_is_cached_by_the_config_values():
  first = build(zoo.ModelConfig, tiny()).graph()
  assert build(zoo.ModelConfig, tiny()).graph() is first  # an equal config hits the cache
  other = build(zoo.ModelConfig, tiny(seq_len=16)).graph()
  assert other is not first and other.node(other.source).out_shape != first.node(
      first.source).out_shape
