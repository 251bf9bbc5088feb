"""Build a model from its target (an importable GraphModel subclass or factory) and options.

One path for every model: the zoo's names map to targets (ZOO, the same `_target_`s as
conf/model/*.yaml), and a model from outside the package is just another target. The target
is called with the options that are set, `dtype` (a JAX dtype) and `rngs` (docs/extending.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx

from dp_jax.errors import UserError
from dp_jax.models.base import GraphModel
from dp_jax.zoo import MODEL_NAMES, ZOO

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Typed size options of ModelConfig: positive integers when set (None: the target's default).
SIZE_OPTIONS = ("image_size", "num_classes", "seq_len", "n_layer", "d_model", "n_head",
                "vocab_size")


def build_model(name: str, *, seed: int = 0, abstract: bool = False, dtype: str = "float32",
                **options: Any) -> GraphModel:
  """The named zoo model; abstract=True gives ShapeDtypeStruct params (nothing allocated)."""
  if name not in ZOO:
    raise UserError(f"unknown model '{name}'; valid models: {', '.join(MODEL_NAMES)} (or a "
                    "model config with a _target_: docs/extending.md)")
  return build_target(ZOO[name], options, name=name, dtype=dtype, seed=seed, abstract=abstract)


def build_target(target: str, options: Mapping[str, Any], *, name: str, dtype: str = "float32",
                 seed: int = 0, abstract: bool = False) -> GraphModel:
  """`target(**options, dtype=..., rngs=nnx.Rngs(seed))`, checked; options: only those set."""
  if dtype not in DTYPES:
    raise UserError(f"unknown dtype '{dtype}' for model {name}; valid: {', '.join(DTYPES)}")
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise UserError(f"seed={seed!r} for model {name} must be an integer")
  make = locate(target, name)
  options = {k: v for k, v in options.items() if v is not None}
  for k in SIZE_OPTIONS:
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
    kw["dtype"] = DTYPES[dtype]
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
  return (SIZE_OPTIONS.index(key) if key in SIZE_OPTIONS else len(SIZE_OPTIONS), key)


def positive(name: str, option: str, value: Any) -> int:
  """value, if a positive integer; else a one-line error naming the option."""
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise UserError(f"{option}={value!r} for model {name} must be a positive integer")
  return value
