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
  from dp_jax.models.registry import MODEL_NAMES, ZOO

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


def graph_of(model_cfg: Any, seed: int = 0):
  """The LayerGraph of the model a config names (cached: multirun cells share it)."""
  key = json.dumps(model_kwargs(model_cfg), sort_keys=True, default=str)
  return _traced(target_of(model_cfg), name_of(model_cfg), seed, key)


@functools.lru_cache(maxsize=32)
def _traced(target: str, name: str, seed: int, options_json: str):
  """Trace a model once per (target, name, seed, options); LayerGraph is immutable."""
  from dp_jax.models.registry import build_target
  from dp_jax.trace import trace_graph

  options = json.loads(options_json)
  dtype = options.pop("dtype", "float32")
  model = build_target(target, options, name=name, dtype=dtype, seed=seed, abstract=True)
  return trace_graph(model, name)
