"""Traced zoo graphs are cached on disk as graph JSON: a later process reads them, no JAX."""

from omegaconf import OmegaConf

from dp_jax.base.checks import build
from dp_jax.models import zoo


def test_a_cached_graph_is_the_traced_one(tmp_path, monkeypatch):
  monkeypatch.setenv("DP_JAX_GRAPH_CACHE", str(tmp_path))
  cfg = OmegaConf.create({"name": "digits_mlp"})
  zoo._traced.cache_clear()
  traced = build(zoo.ModelConfig, cfg).graph()
  files = list(tmp_path.glob("digits_mlp-*.json"))
  assert len(files) == 1
  zoo._traced.cache_clear()
  assert build(zoo.ModelConfig, cfg).graph().to_json() == traced.to_json()  # read back
  other = OmegaConf.create({"name": "digits_mlp", "num_classes": 5})
  zoo._traced.cache_clear()
  assert build(zoo.ModelConfig, other).graph().to_json() != traced.to_json()  # another entry
  assert len(list(tmp_path.glob("digits_mlp-*.json"))) == 2
  zoo._traced.cache_clear()
