"""The model zoo, and config -> model -> LayerGraph: the one place models are named and built.

The zoo's names map to targets (ZOO, the same `_target_`s as conf/model/*.yaml); a model from
outside the package is just another target (an importable GraphModel subclass or factory,
docs/extending.md). A config with only a zoo `name` (`paper.model`) takes that name's target.
The target is called with the options that are set, `dtype` (a JAX dtype) and `rngs`. Naming a
model and reading its traced graph from the disk cache import no JAX; building one does.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from dp_jax.base.errors import UserError

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


DTYPES = ("float32", "bfloat16", "float16")  # model dtypes, as jax.numpy names


def build_model(name: str, *, seed: int = 0, abstract: bool = False, dtype: str = "float32",
                **options: Any):
  """The named zoo model; abstract=True gives ShapeDtypeStruct params (nothing allocated)."""
  if name not in ZOO:
    raise UserError(f"unknown model '{name}'; valid models: {', '.join(MODEL_NAMES)} (or a "
                    "model config with a _target_: docs/extending.md)")
  return build_target(ZOO[name], options, name=name, dtype=dtype, seed=seed, abstract=abstract)


def build_target(target: str, options: Mapping[str, Any], *, name: str, dtype: str = "float32",
                 seed: int = 0, abstract: bool = False):
  """`target(**options, dtype=..., rngs=nnx.Rngs(seed))`, checked; options: only those set."""
  import jax.numpy as jnp  # JAX only to build a model: a known graph is read without it
  from flax import nnx

  from dp_jax.models.base import GraphModel

  if dtype not in DTYPES:
    raise UserError(f"unknown dtype '{dtype}' for model {name}; valid: {', '.join(DTYPES)}")
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise UserError(f"seed={seed!r} for model {name} must be an integer")
  make = locate(target, name)
  options = {k: v for k, v in options.items() if v is not None}
  for k in SIZE_KEYS:
    if k in options:
      positive(name, k, options[k])
  accepted = _arguments(make)
  if accepted is not None:
    extra = sorted((k for k in options if k not in accepted), key=_option_order)
    if extra:
      valid = ", ".join(k for k in accepted if k not in ("dtype", "rngs")) or "none"
      raise UserError(f"option(s) {', '.join(extra)} do not apply to model {name} ({target} "
                      f"takes: {valid}); remove them")
    if "rngs" not in accepted:
      raise UserError(f"model {name}: {target} must take a keyword argument 'rngs' (an "
                      "nnx.Rngs); see docs/extending.md")
  min_size = getattr(make, "min_image_size", None)
  if min_size is not None and options.get("image_size", min_size) < min_size:
    raise UserError(f"image_size={options['image_size']} is too small for {name}; use at least "
                    f"{min_size}")
  kw = dict(options)
  if accepted is None or "dtype" in accepted:
    kw["dtype"] = getattr(jnp, dtype)
  elif dtype != "float32":
    raise UserError(f"option dtype does not apply to model {name} ({target} takes no dtype); "
                    "remove it")

  def build() -> Any:
    return make(rngs=nnx.Rngs(seed), **kw)

  model = nnx.eval_shape(build) if abstract else build()
  if not isinstance(model, GraphModel):
    raise UserError(f"model {name}: {target} returned a {type(model).__name__}, not a "
                    "dp_jax.models.GraphModel; subclass it (docs/extending.md)")
  return model


def locate(target: str, name: str) -> Callable[..., Any]:
  """The object a dotted path names (module attributes, nested), as a one-line error if not."""
  from hydra.utils import get_object

  if not isinstance(target, str) or "." not in target:
    raise UserError(f"model {name}: _target_ {target!r} must be a dotted path such as "
                    "'my_models.vit.ViT'")
  try:
    obj = get_object(target)
  except Exception as e:  # noqa: BLE001 - an import of user code can fail any way
    cause = e.__cause__ or e
    raise UserError(f"model {name}: cannot import _target_ '{target}' ({cause}); is its package "
                    "on PYTHONPATH?") from None
  if not callable(obj):
    raise UserError(f"model {name}: _target_ '{target}' is not a class or function")
  return obj


def _arguments(make: Callable[..., Any]) -> list[str] | None:
  """The keyword arguments `make` accepts (None: it takes **kwargs, anything goes)."""
  if inspect.isclass(make) and make.__init__ is object.__init__:
    return []  # a class without an __init__ of its own takes nothing
  fn = make.__init__ if inspect.isclass(make) else make
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    return None
  if inspect.isclass(make):
    params = params[1:]  # self
  if any(p.kind is p.VAR_KEYWORD for p in params):
    return None
  return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _option_order(key: str) -> tuple[int, str]:
  return (SIZE_KEYS.index(key) if key in SIZE_KEYS else len(SIZE_KEYS), key)


def positive(name: str, option: str, value: Any) -> int:
  """value, if a positive integer; else a one-line error naming the option."""
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise UserError(f"{option}={value!r} for model {name} must be a positive integer")
  return value


def build(model_cfg: Any, seed: int = 0, abstract: bool = False):
  """The model a config names (abstract: parameter shapes only, nothing allocated)."""
  options = model_kwargs(model_cfg)
  dtype = options.pop("dtype", "float32")
  return build_target(target_of(model_cfg), options, name=name_of(model_cfg), dtype=dtype,
                      seed=seed, abstract=abstract)


# Traced graphs are kept here as graph JSON (DP_JAX_GRAPH_CACHE overrides; empty: no disk cache),
# keyed by the model, its options, the JAX / Flax versions and the tracing code's bytes, so a
# known graph needs no JAX import.
GRAPH_CACHE = ".cache/dp_jax/graphs"
_TRACING_CODE = ("models", "graph")


def graph_of(model_cfg: Any, seed: int = 0):
  """The LayerGraph of the model a config names (cached: multirun cells share it, and later
  processes read it from the disk cache without importing JAX)."""
  key = json.dumps(model_kwargs(model_cfg), sort_keys=True, default=str)
  return _traced(target_of(model_cfg), name_of(model_cfg), seed, key)


@functools.lru_cache(maxsize=32)
def _traced(target: str, name: str, seed: int, options_json: str):
  """Trace a model once per (target, name, seed, options); LayerGraph is immutable."""
  from dp_jax.graph.layer_graph import LayerGraph

  path = _cache_path(target, name, seed, options_json)
  if path is not None and path.is_file():
    return LayerGraph.load(path)
  from dp_jax.graph.trace import trace_graph  # JAX: only when the graph is not in the disk cache

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
  root = Path(__file__).resolve().parents[1]  # dp_jax/
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
