"""build_model: every zoo model by name, with validated size options."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import nnx

from dp_jax.errors import UserError
from dp_jax.models import digits, gpt2, inception, resnet, vgg
from dp_jax.models.base import GraphModel

_IMAGE = {  # name -> (constructor(**kw), default image size, minimum image size)
    "vgg16": (lambda **kw: vgg.VGG16(**kw), 224, vgg.MIN_IMAGE_SIZE),
    "resnet50": (lambda **kw: resnet.ResNet((3, 4, 6, 3), **kw), 224, resnet.MIN_IMAGE_SIZE),
    "wide_resnet50_2": (lambda **kw: resnet.ResNet((3, 4, 6, 3), width_per_group=128, **kw),
                        224, resnet.MIN_IMAGE_SIZE),
    "wide_resnet101_2": (lambda **kw: resnet.ResNet((3, 4, 23, 3), width_per_group=128, **kw),
                         224, resnet.MIN_IMAGE_SIZE),
    "inception_v3": (lambda **kw: inception.InceptionV3(**kw), 299, inception.MIN_IMAGE_SIZE),
    "digits_cnn": (lambda **kw: digits.DigitsCNN(**kw), 8, digits.MIN_IMAGE_SIZE),
    "digits_mlp": (lambda **kw: digits.DigitsMLP(**kw), 8, 1),
}
_CLASSES = {"digits_cnn": 10, "digits_mlp": 10}  # default num_classes where not ImageNet's 1000
_TEXT_DEFAULTS = {"seq_len": 1024, "vocab_size": 50257}
MODEL_NAMES: tuple[str, ...] = tuple(_IMAGE) + tuple(gpt2.PRESETS)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def build_model(name: str, *, image_size: int | None = None, num_classes: int | None = None,
                seq_len: int | None = None, n_layer: int | None = None,
                d_model: int | None = None, n_head: int | None = None,
                vocab_size: int | None = None, dtype: str = "float32", seed: int = 0,
                abstract: bool = False) -> GraphModel:
  """The named zoo model; abstract=True gives ShapeDtypeStruct params (nothing allocated)."""
  if name not in MODEL_NAMES:
    raise UserError(f"unknown model '{name}'; valid models: {', '.join(MODEL_NAMES)}")
  if dtype not in DTYPES:
    raise UserError(f"unknown dtype '{dtype}' for model {name}; valid: {', '.join(DTYPES)}")
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise UserError(f"seed={seed!r} for model {name} must be an integer")
  text = dict(seq_len=seq_len, n_layer=n_layer, d_model=d_model, n_head=n_head,
              vocab_size=vocab_size)
  image = dict(image_size=image_size, num_classes=num_classes)
  if name in _IMAGE:
    _reject(name, text)
    make = _image_builder(name, image)
  else:
    _reject(name, image)
    make = _text_builder(name, text)
  kw = dict(dtype=DTYPES[dtype])
  if abstract:
    return nnx.eval_shape(lambda: make(rngs=nnx.Rngs(seed), **kw))
  return make(rngs=nnx.Rngs(seed), **kw)


def _reject(name: str, options: dict[str, Any]) -> None:
  given = [k for k, v in options.items() if v is not None]
  if given:
    raise UserError(f"option(s) {', '.join(given)} do not apply to model {name}; remove them")


def _positive(name: str, option: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise UserError(f"{option}={value!r} for model {name} must be a positive integer")
  return value


def _image_builder(name: str, opts: dict[str, Any]) -> Callable[..., GraphModel]:
  ctor, default_size, min_size = _IMAGE[name]
  size = opts["image_size"] if opts["image_size"] is not None else default_size
  classes = opts["num_classes"] if opts["num_classes"] is not None else _CLASSES.get(name, 1000)
  size, classes = _positive(name, "image_size", size), _positive(name, "num_classes", classes)
  if size < min_size:
    raise UserError(f"image_size={size} is too small for {name}; use at least {min_size}")
  return lambda **kw: ctor(image_size=size, num_classes=classes, **kw)


def _text_builder(name: str, opts: dict[str, Any]) -> Callable[..., GraphModel]:
  cfg = {**gpt2.PRESETS[name], **_TEXT_DEFAULTS}
  cfg.update({k: v for k, v in opts.items() if v is not None})
  cfg = {k: _positive(name, k, v) for k, v in cfg.items()}
  if cfg["d_model"] % cfg["n_head"]:
    raise UserError(f"d_model={cfg['d_model']} for model {name} must be divisible by "
                    f"n_head={cfg['n_head']}; pick n_head dividing d_model")
  return lambda **kw: gpt2.GPT2(**cfg, **kw)
