"""Config -> model -> LayerGraph: the one place apps turn a model config into a graph.

A model config names its model by `_target_` (an importable GraphModel subclass or factory,
dp_jax's own or a user's); a config with only a zoo `name` (old configs, `paper.model`) takes
that name's target from the registry. Either way the model is built by
`registry.build_target` (docs/extending.md).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from dp_jax.errors import UserError

# The zoo: name -> _target_ (the same `_target_`s as conf/model/*.yaml); JAX-free, so a known
# graph plans without importing the models.
ZOO: dict[str, str] = {  # name -> _target_
    "vgg16": "dp_jax.models.vgg.VGG16",
    "resnet50": "dp_jax.models.resnet.resnet50",
    "wide_resnet50_2": "dp_jax.models.resnet.wide_resnet50_2",
    "wide_resnet101_2": "dp_jax.models.resnet.wide_resnet101_2",
    "inception_v3": "dp_jax.models.inception.InceptionV3",
    "digits_cnn": "dp_jax.models.digits.DigitsCNN",
    "digits_mlp": "dp_jax.models.digits.DigitsMLP",
    "vit": "dp_jax.models.vit.ViT",
    "gpt2_small": "dp_jax.models.gpt2.gpt2_small",
    "gpt2_medium": "dp_jax.models.gpt2.gpt2_medium",
}
MODEL_NAMES: tuple[str, ...] = tuple(ZOO)

SIZE_KEYS = ("image_size", "num_classes", "seq_len", "n_layer", "d_model", "n_head",
             "vocab_size")


def _get(model_cfg: Any, key: str) -> Any:
  """model_cfg[key], None when absent or missing (???), for DictConfigs and dicts alike."""
  from omegaconf import DictConfig, OmegaConf

  if isinstance(model_cfg, DictConfig):
    if key not in model_cfg or OmegaConf.is_missing(model_cfg, key):
      return None
    try:
      value = model_cfg[key]
    except Exception:  # noqa: BLE001 - the default name interpolates a missing _target_
      return None
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
  return model_cfg.get(key) if model_cfg is not None else None


def target_of(model_cfg: Any) -> str:
  """The `_target_` of a model config (a zoo name's target when only `name` is given)."""
  target, name = _get(model_cfg, "_target_"), _get(model_cfg, "name")
  if target:
    if name in ZOO and ZOO[name] != target:  # names pick DeepPool recipes and label plans
      raise UserError(f"model name '{name}' is the zoo's {ZOO[name]}, not {target}; pick the "
                      f"zoo model with model={name}, or give your model another model.name")
    return str(target)
  if name in ZOO:
    return ZOO[name]
  raise UserError(f"unknown model '{name}'; valid models: {', '.join(MODEL_NAMES)}, or give "
                  "model._target_ (an importable GraphModel class or factory; "
                  "docs/extending.md)")


def name_of(model_cfg: Any) -> str:
  """The model's name: `name`, else the last component of `_target_`."""
  return str(_get(model_cfg, "name") or target_of(model_cfg).rsplit(".", 1)[-1])


def model_kwargs(model_cfg: Any) -> dict[str, Any]:
  """The options a config passes to its target: size options set, dtype, and `kwargs`."""
  out = {k: _get(model_cfg, k) for k in SIZE_KEYS if _get(model_cfg, k) is not None}
  if _get(model_cfg, "dtype") is not None:
    out["dtype"] = _get(model_cfg, "dtype")
  extra = _get(model_cfg, "kwargs") or {}
  if not isinstance(extra, dict):
    raise UserError(f"model.kwargs must be a mapping of argument names to values, got {extra!r}")
  both = sorted(set(extra) & (set(out) | {"rngs", "dtype"}))
  if both:
    raise UserError(f"model.kwargs.{both[0]} repeats an option of the model config; set it "
                    f"as model.{both[0]} instead")
  return {**out, **extra}


def build(model_cfg: Any, seed: int = 0, abstract: bool = False):
  """The model a config names (abstract: parameter shapes only, nothing allocated)."""
  from dp_jax.models.registry import build_target

  options = model_kwargs(model_cfg)
  dtype = options.pop("dtype", "float32")
  return build_target(target_of(model_cfg), options, name=name_of(model_cfg), dtype=dtype,
                      seed=seed, abstract=abstract)


# Traced graphs are kept here as graph JSON (DP_JAX_GRAPH_CACHE overrides; empty: no disk cache),
# keyed by the model, its options, the JAX / Flax versions and the tracing code's bytes, so a
# known graph needs no JAX import.
GRAPH_CACHE = ".cache/dp_jax/graphs"
_TRACING_CODE = ("models", "trace.py", "graph.py", "zoo.py")


def graph_of(model_cfg: Any, seed: int = 0):
  """The LayerGraph of the model a config names (cached: multirun cells share it, and later
  processes read it from the disk cache without importing JAX)."""
  key = json.dumps(model_kwargs(model_cfg), sort_keys=True, default=str)
  return _traced(target_of(model_cfg), name_of(model_cfg), seed, key)


@functools.lru_cache(maxsize=32)
def _traced(target: str, name: str, seed: int, options_json: str):
  """Trace a model once per (target, name, seed, options); LayerGraph is immutable."""
  from dp_jax.graph import LayerGraph

  path = _cache_path(target, name, seed, options_json)
  if path is not None and path.is_file():
    return LayerGraph.load(path)
  from dp_jax.models.registry import build_target
  from dp_jax.trace import trace_graph

  options = json.loads(options_json)
  dtype = options.pop("dtype", "float32")
  model = build_target(target, options, name=name, dtype=dtype, seed=seed, abstract=True)
  graph = trace_graph(model, name)
  if path is not None:
    graph.save(path)
  return graph


def _cache_path(target: str, name: str, seed: int, options_json: str):
  """Where the traced graph of these options lives in the disk cache (None: no cache). The key
  holds the target's own source file, so editing a model from outside the package retraces."""
  import hashlib
  import importlib.util
  import os
  from importlib import metadata
  from pathlib import Path

  folder = os.environ.get("DP_JAX_GRAPH_CACHE", GRAPH_CACHE)
  if not folder:
    return None
  h = hashlib.sha256(json.dumps([target, name, seed, options_json]).encode())
  for package in ("jax", "jaxlib", "flax"):
    try:
      h.update(f"{package}={metadata.version(package)}".encode())
    except metadata.PackageNotFoundError:
      h.update(package.encode())
  root = Path(__file__).resolve().parent
  for part in _TRACING_CODE:
    for f in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
      h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
  module = target.rsplit(".", 1)[0]
  if not module.startswith("dp_jax."):
    try:
      spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
      spec = None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
      return None  # a target whose source cannot be read is traced every time
    h.update(Path(spec.origin).read_bytes())
  return Path(folder) / f"{name}-{h.hexdigest()[:20]}.json"
