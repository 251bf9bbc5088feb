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


# Traced graphs are kept here as graph JSON (DP_JAX_GRAPH_CACHE overrides; empty: no disk cache),
# keyed by the model, its options, the JAX / Flax versions and the tracing code's bytes, so a
# known graph needs no JAX import.
GRAPH_CACHE = ".cache/dp_jax/graphs"
_TRACING_CODE = ("models", "trace.py", "graph.py", "zoo.py")


def graph_of(model_cfg: Any, seed: int = 0):
  """The LayerGraph of the zoo model a config names (cached: multirun cells share it, and
  later processes read it from the disk cache)."""
  return _traced(model_cfg.name, seed, tuple(sorted(model_kwargs(model_cfg).items())))


@functools.lru_cache(maxsize=32)
def _traced(name: str, seed: int, kwargs: tuple[tuple[str, Any], ...]):
  """Trace a zoo model once per (name, seed, size options); LayerGraph is immutable."""
  from dp_jax.graph import LayerGraph

  path = _cache_path(name, seed, kwargs)
  if path is not None and path.is_file():
    return LayerGraph.load(path)
  from dp_jax.models.registry import build_model
  from dp_jax.trace import trace_graph

  graph = trace_graph(build_model(name, seed=seed, abstract=True, **dict(kwargs)), name)
  if path is not None:
    graph.save(path)
  return graph


def _cache_path(name: str, seed: int, kwargs: tuple[tuple[str, Any], ...]):
  """Where the traced graph of these options lives in the disk cache (None: no cache)."""
  import hashlib
  import json
  import os
  from importlib import metadata
  from pathlib import Path

  folder = os.environ.get("DP_JAX_GRAPH_CACHE", GRAPH_CACHE)
  if not folder:
    return None
  h = hashlib.sha256(json.dumps([name, seed, [list(kv) for kv in kwargs]], default=str).encode())
  for package in ("jax", "jaxlib", "flax"):
    try:
      h.update(f"{package}={metadata.version(package)}".encode())
    except metadata.PackageNotFoundError:
      h.update(package.encode())
  root = Path(__file__).resolve().parent
  for part in _TRACING_CODE:
    for f in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
      h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
  return Path(folder) / f"{name}-{h.hexdigest()[:20]}.json"
