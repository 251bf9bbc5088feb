"""The composed config at an app's edge: the app's frozen config dataclass as Hydra's schema,
every key known and every required value set, then the typed object the app receives."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from omegaconf import AnyNode, DictConfig, ListConfig, OmegaConf

from dp_jax.base.checks import build
from dp_jax.base.errors import UserError


def structured(schema: type) -> DictConfig:
  """The Hydra schema node of an app's frozen config dataclass: its fields typed and defaulted
  as the dataclass says, but writable, so that config files and overrides merge into it (a
  frozen dataclass makes a read-only node); the typed object is made from the composed config
  afterwards (`typed`), where every option is checked."""
  node = OmegaConf.structured(schema)
  _writable(node)
  _untyped_nulls(node)
  return node


def _untyped_nulls(node: Any) -> None:
  """Make each null group field (`background.model: ModelConfig | None = None`) an untyped
  null: OmegaConf cannot merge an override into a typed null node (`background.model={name:
  vgg16}` fails inside OmegaConf with "'NoneType' object has no attribute 'get'"), but sets an
  untyped one; the field is still typed and checked when the app's config is built (`typed`)."""
  if not isinstance(node, DictConfig) or node._is_none():
    return
  for key in list(node.keys()):
    child = node._get_node(key)
    if isinstance(child, DictConfig) and child._is_none() and dataclasses.is_dataclass(
        child._metadata.ref_type):
      node.__dict__["_content"][key] = AnyNode(None, key=key, parent=node)  # no public setter
    else:
      _untyped_nulls(child)


def _writable(node: Any) -> None:
  OmegaConf.set_readonly(node, None)
  if isinstance(node, DictConfig):
    children = [node._get_node(k) for k in node.keys()]
  elif isinstance(node, ListConfig):
    children = [node._get_node(i) for i in range(len(node))]
  else:
    return
  for child in children:
    if isinstance(child, (DictConfig, ListConfig)):
      _writable(child)
    elif child is not None:
      child._set_flag("readonly", None)


def typed[T](cfg: Any, schema: type[T]) -> T:
  """The app's typed config from the composed one: every group its frozen dataclass, every
  option checked where it is declared (one-line errors naming the option)."""
  return build(schema, cfg)


# --- every key of a composed config known to its schema ---------------------------------------


def check_known_keys(cfg: Any, schema: type, where: str = "") -> None:
  """Raise a one-line UserError for the first key of `cfg` that `schema` does not declare.

  Walks the composed config beside the dataclass: `+key=...` additions and keys a group file
  adds are checked the same way. Only fields typed as a mapping (dict) are open.
  """
  kind = _unwrap(schema)
  if kind is None:
    return
  if isinstance(cfg, DictConfig) and dataclasses.is_dataclass(kind):
    hints = typing.get_type_hints(kind)
    valid = [f.name for f in dataclasses.fields(kind)]
    for key in cfg.keys():
      name = f"{where}{key}"
      if key not in hints:
        raise UserError(_unknown_key_message(str(key), name, valid, where))
      check_known_keys(cfg._get_node(key), hints[key], f"{name}.")
  elif isinstance(cfg, ListConfig) and typing.get_origin(kind) in (list, tuple):
    item = next((a for a in typing.get_args(kind) if a is not Ellipsis), Any)
    for i in range(len(cfg)):
      check_known_keys(cfg._get_node(i), item, f"{where.rstrip('.')}[{i}].")


def _unwrap(t: Any) -> Any:
  """The type a field holds (X of `X | None`); None for open types (Any, dict)."""
  if t is Any or t is dict or typing.get_origin(t) is dict:
    return None
  if typing.get_origin(t) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return _unwrap(args[0]) if len(args) == 1 else None
  return t


def _unknown_key_message(key: str, name: str, valid: list[str], where: str) -> str:
  near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
  if near:
    hint = f"did you mean {where}{near[0]}?"
  else:
    hint = f"valid keys{' under ' + where.rstrip('.') if where else ''}: {', '.join(valid)}"
  return f"unknown option {name} ({hint})"


