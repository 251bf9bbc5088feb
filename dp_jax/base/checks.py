"""Options checked where they are declared.

A config group is one frozen dataclass (levanter's pattern): it is the Hydra schema of its YAML
group and the typed object the library receives. Each field states its default once and its
range or choices beside it (`option(...)`); `Checked.__post_init__` checks every field when
the object is made, by an app's edge from the composed config or by library code, and raises
a one-line `ConfigError` naming the option (`planner.amplification_limit=0.5 must be >= 1`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

from dp_jax.base.errors import UserError

# A required option's default (OmegaConf's MISSING, "???"): a Hydra schema leaves it for a
# config file to set, and a config made in code without it is refused.
REQUIRED: Any = "???"


class ConfigError(UserError):
  """A bad option: `<where><key><detail>`; `at(path)` names it where the config holds it."""

  def __init__(self, key: str, detail: str, where: str = ""):
    self.key, self.detail, self.where = key, detail, where
    super().__init__(f"{where}{key}{detail}")

  def at(self, where: str) -> ConfigError:
    return ConfigError(self.key, self.detail, where)


@dataclass(frozen=True)
class Rule:
  """A field's range or choices. low/high: bounds (open: excluded); inf: +inf allowed;
  integer: a whole number; choices: the allowed strings; each: a sequence whose items follow
  the rule (and that is not empty); hint: what the option means, said after a violation."""

  low: float = -math.inf
  low_open: bool = False
  high: float = math.inf
  high_open: bool = False
  inf: bool = False
  integer: bool = False
  choices: tuple[str, ...] = ()
  each: bool = False
  hint: str = ""

  def check(self, key: str, value: Any) -> Any:
    """`value` checked (a ConfigError naming `key`) and normalised (numpy scalars to Python,
    sequences to tuples)."""
    if value is None:
      return None
    if self.each:
      if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(key, f"={value!r} must be a list of {self._what()}{self._note()}")
      if not value:
        raise ConfigError(key, f"=[] is empty; give at least one value ({self._what()})")
      return tuple(dataclasses.replace(self, each=False).check(f"{key}[{i}]", v)
                   for i, v in enumerate(value))
    if self.choices:
      value = getattr(value, "value", value)  # an enum's value
      if value not in self.choices:
        raise ConfigError(key, f"='{value}' is unknown (valid: {', '.join(self.choices)})"
                          f"{self._note()}")
      return value
    value = _plain_number(value)
    if not _is_number(value):
      raise ConfigError(key, f"={value!r} must be a number{self._note()}")
    if math.isnan(value) or (math.isinf(value) and not (self.inf and value > 0)):
      raise ConfigError(key, f"={value} must be a finite number{' (or inf)' if self.inf else ''}"
                        f"{self._note()}")
    if self.integer and not isinstance(value, int):
      raise ConfigError(key, f"={value} must be an integer{self._note()}")
    low = value < self.low or (self.low_open and value == self.low)
    high = value > self.high or (self.high_open and value == self.high)
    if low or high:
      raise ConfigError(key, f"={value} must be {self._range()}{self._note()}")
    return value

  def _what(self) -> str:
    return ", ".join(self.choices) if self.choices else f"numbers {self._range()}"

  def _note(self) -> str:
    return f" ({self.hint})" if self.hint else ""

  def _range(self) -> str:
    parts = []
    if self.low > -math.inf:
      parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
    if self.high < math.inf:
      parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
    text = " and ".join(parts) or "finite"
    return f"{text} (or inf)" if self.inf else text


def option(default: Any = MISSING, *, default_factory: Any = MISSING, **rule: Any) -> Any:
  """A dataclass field with its default and its Rule (keywords of Rule)."""
  kw: dict[str, Any] = {"metadata": {"rule": Rule(**rule)}}
  if default_factory is not MISSING:
    kw["default_factory"] = default_factory
  else:
    kw["default"] = default
  return field(**kw)


def rule_of(f: dataclasses.Field) -> Rule | None:
  return f.metadata.get("rule")


class Checked:
  """Base of a config group's frozen dataclass: every field's Rule checked when it is made,
  then the class's own cross-field `check()`. GROUP names the group in messages."""

  GROUP: ClassVar[str] = ""

  def __post_init__(self) -> None:
    where = f"{self.GROUP}." if self.GROUP else ""
    hints = _hints(type(self))
    for f in dataclasses.fields(self):  # type: ignore[arg-type]
      value = getattr(self, f.name)
      rule = rule_of(f)
      try:
        if isinstance(value, str) and value == REQUIRED:
          raise ConfigError(f.name, f" is required{self.required_hint()}")
        if rule is not None:
          value = rule.check(f.name, value)
        value = _as_declared(hints.get(f.name), value)
      except ConfigError as e:
        raise e.at(where) from None
      object.__setattr__(self, f.name, value)
    try:
      self.check()
    except ConfigError as e:
      raise e.at(where) from None

  def check(self) -> None:
    """Cross-field checks (raise ConfigError(field, detail))."""

  def required_hint(self) -> str:
    """What a message about a required option adds (where to set it)."""
    return " (set it in a config file or on the command line: key=value)"

  def replace(self, **changes: Any):
    """A copy with `changes` (checked again)."""
    return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def fields_of(obj: Any, kind: type) -> dict[str, Any]:
  """The values of `kind`'s init fields read from `obj` (a dataclass of kind or a subclass):
  what a subclass instance passes on to its base's constructor."""
  return {f.name: getattr(obj, f.name) for f in dataclasses.fields(kind) if f.init}


def _hints(kind: type) -> dict[str, Any]:
  try:
    return typing.get_type_hints(kind)
  except Exception:  # noqa: BLE001 - unresolvable forward references: no normalisation
    return {}


def _as_declared(hint: Any, value: Any) -> Any:
  """Sequences as tuples where the field is a tuple (OmegaConf hands lists), mappings as
  plain dicts, numpy scalars as Python numbers."""
  if value is None or hint is None:
    return value
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return _as_declared(args[0], value) if len(args) == 1 else value
  if (hint is tuple or origin is tuple) and isinstance(value, Sequence) and not isinstance(
      value, str):
    return tuple(value)
  if (hint is dict or origin is dict) and hasattr(value, "items"):
    return dict(value)
  if hint in (int, float):
    return _plain_number(value)
  return value


def _plain_number(value: Any) -> Any:
  item = getattr(value, "item", None)  # numpy scalars
  if callable(item) and not isinstance(value, (int, float, bool)) and getattr(
      value, "shape", None) == ():
    return item()
  return value


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def build[T](kind: type[T], data: Any, where: str = "") -> T:
  """An instance of the config dataclass `kind` from `data`: an instance already, or a mapping
  (a dict, an OmegaConf DictConfig) whose keys are its fields; dataclass fields are built the
  same way. A bad key or value is one ConfigError naming it where the config holds it
  (`where`: its dotted prefix, e.g. "background.model.")."""
  if isinstance(data, kind):
    return data
  where = where or (f"{kind.GROUP}." if getattr(kind, "GROUP", "") else "")
  if isinstance(data, str) and data == REQUIRED:  # a group no option of which was chosen
    key = where.rstrip(".")
    raise ConfigError(key, f" is required: choose one ({key}=<option>)")
  if hasattr(data, "_metadata") and hasattr(data, "items"):  # an OmegaConf DictConfig
    from omegaconf import OmegaConf  # OmegaConf: only to read a composed config

    data = OmegaConf.to_container(data, resolve=True, enum_to_str=True,
                                  throw_on_missing=False)
  if not isinstance(data, dict):
    raise ConfigError(where.rstrip("."), f"={data!r} must be a mapping of "
                      f"{kind.__name__} options")
  hints = _hints(kind)
  known = {f.name: f for f in dataclasses.fields(kind) if f.init}  # type: ignore[arg-type]
  kwargs = {}
  for key, value in data.items():
    if key not in known:
      near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
      hint = f"did you mean {where}{near[0]}?" if near else f"valid: {', '.join(known)}"
      raise ConfigError(f"{key}", f" is not an option ({hint})", where)
    kwargs[key] = _built(hints.get(key), value, f"{where}{key}")
  try:
    return kind(**kwargs)
  except ConfigError as e:
    raise (e.at(where) if where else e) from None


def _built(hint: Any, value: Any, key: str) -> Any:
  """A field's value with the dataclasses in it built: the field's own, or a sequence's
  items."""
  if value is None:
    return None
  inner = _dataclass_in(hint)
  if inner is not None:
    return build(inner, value, f"{key}.")
  item = _sequence_item(hint)
  if item is not None and not isinstance(value, (str, bytes)) and hasattr(value, "__iter__"):
    return tuple(build(item, v, f"{key}[{i}].") for i, v in enumerate(value))
  return value


def _sequence_item(hint: Any) -> type | None:
  """X of a field typed tuple[X, ...] or list[X] where X is a dataclass, else None."""
  if hint is None:
    return None
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return _sequence_item(args[0]) if len(args) == 1 else None
  if typing.get_origin(hint) in (tuple, list):
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    return _dataclass_in(args[0]) if len(args) == 1 else None
  return None


def _dataclass_in(hint: Any) -> type | None:
  """The dataclass a field holds (X of `X | None`), else None."""
  if hint is None:
    return None
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return _dataclass_in(args[0]) if len(args) == 1 else None
  return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None
