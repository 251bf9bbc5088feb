"""The model zoo, and config -> model -> LayerGraph: the one place models are named and built.

The zoo's names map to targets (ZOO, the same `_target_`s as conf/model/*.yaml); a model from
outside the package is just another target (an importable GraphModel subclass or factory,
docs/extending.md). A config with only a zoo `name` (`paper.model`) takes that name's target.
The target is called with the options that are set, `dtype` (a JAX dtype) and `rngs`. Naming a
model and reading its traced graph from the disk cache import no JAX; building one does.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import inspect
import json
import os
import sysconfig
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from dp_jax.base.checks import Checked, ConfigError, option
from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph

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
    "llama3_8b": "dp_jax.models.llama.llama3_8b",
    "llama3_70b": "dp_jax.models.llama.llama3_70b",
    "llama_tiny": "dp_jax.models.llama.llama_tiny",
    "llava_1_5_7b": "dp_jax.models.vlm.llava_1_5_7b",
    "llava_tiny": "dp_jax.models.vlm.llava_tiny",
    "mixtral_8x7b": "dp_jax.models.moe.mixtral_8x7b",
    "mixtral_tiny": "dp_jax.models.moe.mixtral_tiny",
    "deepseek_moe_16b": "dp_jax.models.moe.deepseek_moe_16b",
    "deepseek_moe_tiny": "dp_jax.models.moe.deepseek_moe_tiny",
}
MODEL_NAMES: tuple[str, ...] = tuple(ZOO)

SIZE_KEYS = ("image_size", "num_classes", "seq_len", "n_layer", "d_model", "n_head",
             "vocab_size")


DTYPES = ("float32", "bfloat16", "float16")  # model dtypes, as jax.numpy names
_SIZE = dict(low=1, integer=True)


@dataclass(frozen=True)
class ModelConfig(Checked):
  """The model group (conf/model/): an importable GraphModel subclass or factory (`_target_`),
  its label and the arguments it is called with (docs/extending.md).

  The size options that are set (None: the target's own default) and `kwargs` are passed to
  the target as keyword arguments, with `dtype` (a JAX dtype) and `rngs`. `name` labels the
  model in graphs, plans and runs (default: the last component of `_target_`); a config with
  only a zoo `name` takes that name's target.
  """

  GROUP = "model"

  _target_: str | None = None
  name: str | None = None
  image_size: int | None = option(None, **_SIZE)
  num_classes: int | None = option(None, **_SIZE)
  seq_len: int | None = option(None, **_SIZE)
  n_layer: int | None = option(None, **_SIZE)
  d_model: int | None = option(None, **_SIZE)
  n_head: int | None = option(None, **_SIZE)
  vocab_size: int | None = option(None, **_SIZE)
  dtype: str = option("float32", choices=DTYPES)
  kwargs: dict[str, Any] = field(default_factory=dict)  # the target's other arguments

  def check(self) -> None:
    target, name = self._target_, self.name
    if not target:
      if name not in ZOO:
        raise ConfigError("name", f"='{name}' is not a zoo model; valid models: "
                          f"{', '.join(MODEL_NAMES)}, or give model._target_ (an importable "
                          "GraphModel class or factory; docs/extending.md)")
      object.__setattr__(self, "_target_", target := ZOO[name])
    if not isinstance(target, str) or "." not in target:
      raise ConfigError("_target_", f"={target!r} must be a dotted path such as "
                        "'my_models.vit.ViT'")
    if not name:
      object.__setattr__(self, "name", name := target.rsplit(".", 1)[-1])
    if name in ZOO and ZOO[name] != target:  # names pick recipes, label plans
      raise ConfigError("name", f"='{name}' is the zoo's {ZOO[name]}, not {target}; pick the "
                        f"zoo model with model={name}, or give your model another model.name")
    if not isinstance(self.kwargs, dict):
      raise ConfigError("kwargs", f"={self.kwargs!r} must be a mapping of argument names to "
                        "values")
    both = sorted(set(self.kwargs) & (set(SIZE_KEYS) | {"rngs", "dtype"}))
    if both:
      raise ConfigError(f"kwargs.{both[0]}", f" repeats an option of the model config; set it "
                        f"as model.{both[0]} instead")

  @property
  def target(self) -> str:
    return str(self._target_)

  @property
  def options(self) -> dict[str, Any]:
    """The arguments the target is called with (besides dtype and rngs)."""
    sizes = {k: getattr(self, k) for k in SIZE_KEYS if getattr(self, k) is not None}
    return {**sizes, **self.kwargs}

  @classmethod
  def named(cls, name: str, **options: Any) -> ModelConfig:
    """The zoo model `name` with `options` (dtype among them, or float32)."""
    if name not in ZOO:
      raise UserError(f"unknown model '{name}'; valid models: {', '.join(MODEL_NAMES)} (or a "
                      "model config with a _target_: docs/extending.md)")
    return cls.of(ZOO[name], name, {k: v for k, v in options.items() if v is not None})

  @classmethod
  def of(cls, target: str, name: str, options: Mapping[str, Any],
         dtype: str | None = None) -> ModelConfig:
    """The config calling `target` with `options` (size options and other arguments alike)."""
    options = dict(options)
    dtype = dtype or options.pop("dtype", "float32")
    sizes = {k: options.pop(k) for k in SIZE_KEYS if k in options}
    return cls(_target_=target, name=name, dtype=dtype, kwargs=options, **sizes)

  def to_json(self) -> dict[str, Any]:
    """The config as plain JSON (it travels to pinned processes; from_json reads it back)."""
    return {"target": self.target, "name": self.name, "options": self.options,
            "dtype": self.dtype}

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> ModelConfig:
    return cls.of(d["target"], d["name"], dict(d.get("options") or {}),
                  d.get("dtype", "float32"))

  def build(self, seed: int = 0, abstract: bool = False):
    """The model (abstract: parameter shapes only, nothing allocated)."""
    return _build(self, seed, abstract)

  def graph(self, seed: int = 0):
    """Its LayerGraph (cached: multirun cells share it, and later processes read it from the
    disk cache without importing JAX)."""
    key = json.dumps({**self.options, "dtype": self.dtype}, sort_keys=True, default=str)
    return _traced(self.target, self.name, seed, key, source_digest(self.target))


def build_model(name: str, *, seed: int = 0, abstract: bool = False, **options: Any):
  """The named zoo model with `options` (dtype among them); abstract=True gives
  ShapeDtypeStruct params (nothing allocated)."""
  return ModelConfig.named(name, **options).build(seed=seed, abstract=abstract)


def _build(spec: ModelConfig, seed: int, abstract: bool):
  """`target(**options, dtype=..., rngs=nnx.Rngs(seed))` of a checked spec; what the target
  accepts is checked here, where it is imported."""
  import jax.numpy as jnp  # JAX only to build a model: a known graph is read without it
  from flax import nnx

  from dp_jax.models.base import GraphModel  # JAX: the models' base class is a flax module

  name, target, options = spec.name, spec.target, dict(spec.options)
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise UserError(f"seed={seed!r} for model {name} must be an integer")
  make = locate(target, name)
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
  if accepted is None or "dtype" in accepted:
    options["dtype"] = getattr(jnp, spec.dtype)
  elif spec.dtype != "float32":
    raise UserError(f"option dtype does not apply to model {name} ({target} takes no dtype); "
                    "remove it")
  check_option_types(make, spec)

  def build() -> Any:  # the type checked inside: eval_shape would fail on a non-JAX output
    try:
      model = make(rngs=nnx.Rngs(seed), **options)
    except UserError:
      raise
    except Exception as e:  # noqa: BLE001 - the user's constructor can fail any way
      given = ", ".join(f"{_option_name(spec, k)}={v!r}" for k, v in spec.options.items())
      raise UserError(f"model {name}: {target}({given or 'no options'}) failed: "
                      f"{type(e).__name__}: {_first_line(e)}; check those options against what "
                      f"{target} needs (docs/extending.md)") from e
    if not isinstance(model, GraphModel):
      raise UserError(f"model {name}: {target} returned a {type(model).__name__}, not a "
                      "dp_jax.models.GraphModel; subclass it (docs/extending.md)")
    return model

  model = nnx.eval_shape(build) if abstract else build()
  from dp_jax.models.trace import check_protocol  # JAX: as the build

  check_protocol(model, name)
  return model


def check_option_types(make: Callable[..., Any], spec: ModelConfig) -> None:
  """Each option given against the type the target annotates it with (int, float, bool, str,
  or a union of those and None): a one-line UserError naming the option, the target and the
  type it needs (a string where an int is needed failed deep inside flax otherwise)."""
  fn = make.__init__ if inspect.isclass(make) else make
  try:
    params = inspect.signature(fn, eval_str=True).parameters
  except (TypeError, ValueError, NameError, SyntaxError):
    return
  for key, value in spec.options.items():
    param = params.get(key)
    wanted = _simple_types(param.annotation) if param is not None else None
    if not wanted or (value is None and type(None) in wanted):
      continue
    ok = any(isinstance(value, t) and not (t in (int, float) and isinstance(value, bool))
             for t in wanted) or (float in wanted and isinstance(value, int)
                                  and not isinstance(value, bool))
    if not ok:
      needs = " or ".join("None" if t is type(None) else t.__name__ for t in wanted)
      raise UserError(f"{_option_name(spec, key)}={value!r} for model {spec.name}: {spec.target} "
                      f"takes {key} as {needs}, not {type(value).__name__}")


def _simple_types(annotation: Any) -> tuple[type, ...] | None:
  """(int,), (float, NoneType), ... for an annotation of plain scalar types; None otherwise."""
  scalars = (int, float, bool, str, type(None))
  args = typing.get_args(annotation) if typing.get_origin(annotation) in (
      typing.Union, types.UnionType) else (annotation,)
  return tuple(args) if args and all(a in scalars for a in args) else None


def _option_name(spec: ModelConfig, key: str) -> str:
  return f"model.{key}" if key in SIZE_KEYS else f"model.kwargs.{key}"


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  line = lines[0] if lines else type(e).__name__
  return line if len(line) <= 200 else line[:197] + "..."


def locate(target: str, name: str) -> Callable[..., Any]:
  """The object a dotted path names (module attributes, nested), as a one-line error if not."""
  from hydra.utils import get_object  # hydra: only to import a target (zoo names need none)

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
    raise UserError(f"{option}={value!r} must be a positive integer (model {name})")
  return value


# Traced graphs are kept here as graph JSON (DP_JAX_GRAPH_CACHE overrides; empty: no disk cache),
# keyed by everything a graph depends on: the model, its options and seed, the JAX / Flax
# versions and platform, the tracing code's bytes and the model's own source (its module and
# every module outside the installed packages it imports), so a known graph needs no JAX import
# and an edited model (or a helper it imports) is traced again.
GRAPH_CACHE = ".cache/dp_jax/graphs"
_TRACING_CODE = ("models", "graph")
_MAX_SOURCES = 500  # modules followed from a target at most (a guard, not a limit in practice)


@functools.lru_cache(maxsize=32)
def _traced(target: str, name: str, seed: int, options_json: str, sources: str | None):
  """Trace a model once per (target, name, seed, options, source digest); LayerGraph is
  immutable."""
  path = _cache_path(target, name, seed, options_json, sources)
  if path is not None and path.is_file():
    return LayerGraph.load(path)
  from dp_jax.models.trace import trace_graph  # JAX: only when the graph is not in the disk cache

  options = json.loads(options_json)
  dtype = options.pop("dtype", "float32")
  graph = trace_graph(ModelConfig.of(target, name, options, dtype).build(seed, abstract=True), name)
  if path is not None:
    graph.save(path)
  return graph


def _cache_path(target: str, name: str, seed: int, options_json: str, sources: str | None):
  """Where the traced graph of these options lives in the disk cache (None: no cache, also for
  a target whose source cannot be read: it is traced every time)."""
  folder = os.environ.get("DP_JAX_GRAPH_CACHE", GRAPH_CACHE)
  if not folder or sources is None:
    return None
  h = hashlib.sha256(json.dumps([target, name, seed, options_json, sources]).encode())
  for package in ("jax", "jaxlib", "flax"):
    try:
      h.update(f"{package}={metadata.version(package)}".encode())
    except metadata.PackageNotFoundError:
      h.update(package.encode())
  h.update(f"platforms={os.environ.get('JAX_PLATFORMS', '')}".encode())
  root = Path(__file__).resolve().parents[1]  # dp_jax/
  for part in _TRACING_CODE:
    for f in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
      h.update(f.relative_to(root).as_posix().encode() + f.read_bytes())
  return Path(folder) / f"{name}-{h.hexdigest()[:20]}.json"


def source_digest(target: str) -> str | None:
  """sha256 of a model target's own source: its module and every module outside the installed
  packages and dp_jax that it imports, transitively (read, not imported); '' for a dp_jax
  target (the package's code, hashed with the tracing code), None if its module is not found."""
  files = model_sources(target)
  if files is None:
    return None
  h = hashlib.sha256()
  for module, path in files:
    h.update(module.encode() + b"\0" + path.read_bytes() + b"\0")
  return h.hexdigest()


def model_sources(target: str) -> list[tuple[str, Path]] | None:
  """(module, file) of the source a target depends on beyond the installed packages and dp_jax
  (see source_digest): found by reading each module's import statements; None if the target's
  own module is not found."""
  module = target.rsplit(".", 1)[0]
  if module == "dp_jax" or module.startswith("dp_jax."):
    return []
  installed = _installed_roots()
  out: dict[str, Path] = {}
  todo, seen = [module], set()
  while todo and len(seen) < _MAX_SOURCES:
    name = todo.pop()
    if name in seen or not name or name == "dp_jax" or name.startswith("dp_jax."):
      continue
    seen.add(name)
    spec = _find_module(name)
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is None or not origin.is_file() or origin.suffix != ".py":
      if name == module:
        return None
      continue
    if any(origin.is_relative_to(r) for r in installed):
      continue
    out[name] = origin
    package = name if origin.name == "__init__.py" else name.rpartition(".")[0]
    todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # parents
    todo += _imports(origin, package)
  return sorted(out.items())


def _imports(path: Path, package: str) -> list[str]:
  """The modules a source file imports (and `from m import n`'s m.n, n may be a module)."""
  try:
    tree = ast.parse(path.read_bytes())
  except (SyntaxError, ValueError):
    return []
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        parent = ".".join(parts[:len(parts) - (node.level - 1)])
        base = f"{parent}.{base}" if base else parent
      out += [base, *(f"{base}.{a.name}" for a in node.names if a.name != "*")]
  return out


def _find_module(name: str):
  """The module spec of `name` found on sys.path without importing anything (parents' folders
  searched in turn), or None."""
  spec = None
  for i, part in enumerate(name.split(".")):
    path = None if i == 0 else list(spec.submodule_search_locations or []) if spec else []
    if i and not path:
      return None
    full = part if i == 0 else f"{spec.name}.{part}"
    try:
      spec = importlib.machinery.PathFinder.find_spec(full, path)
    except (ImportError, ValueError):
      return None
    if spec is None:
      return None
  return spec


@functools.cache
def _installed_roots() -> tuple[Path, ...]:
  """The folders of the standard library and installed packages (their source is versioned)."""
  keys = ("stdlib", "platstdlib", "purelib", "platlib")
  return tuple({Path(p).resolve() for k, p in sysconfig.get_paths().items() if k in keys})
