"""Config -> model -> LayerGraph: the one place apps turn a model config into a graph."""

from __future__ import annotations

import functools
from typing import Any


def model_kwargs(model_cfg: Any) -> dict[str, Any]:
  """The size options of a model config that are set (None means the model's default)."""
  keys = ("image_size", "num_classes", "seq_len", "n_layer", "d_model", "n_head", "vocab_size",
          "dtype")
  return {k: model_cfg.get(k) for k in keys if model_cfg.get(k) is not None}


def build(model_cfg: Any, seed: int = 0, abstract: bool = False):
  """The zoo model a config names (abstract: parameter shapes only, nothing allocated)."""
  from dp_jax.models.registry import build_model

  return build_model(model_cfg.name, seed=seed, abstract=abstract, **model_kwargs(model_cfg))


def graph_of(model_cfg: Any, seed: int = 0):
  """The LayerGraph of the zoo model a config names (cached: multirun cells share it)."""
  return _traced(model_cfg.name, seed, tuple(sorted(model_kwargs(model_cfg).items())))


@functools.lru_cache(maxsize=32)
def _traced(name: str, seed: int, kwargs: tuple[tuple[str, Any], ...]):
  """Trace a zoo model once per (name, seed, size options); LayerGraph is immutable."""
  from dp_jax.models.registry import build_model
  from dp_jax.trace import trace_graph

  return trace_graph(build_model(name, seed=seed, abstract=True, **dict(kwargs)), name)
