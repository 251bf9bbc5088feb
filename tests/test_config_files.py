"""Every config under conf/ composes into its app's typed config, and each default is stated
once: in its frozen dataclass, never again in a YAML file that could drift from it.

- Each app's own config, and every option of every group, compose into a typed config (each
  option checked where its dataclass declares it).
- No YAML value restates its dataclass's default (a restatement can silently disagree after the
  dataclass changes); the data groups (model, cluster) are exempt: their files state every
  number with its source.
- The option an app selects by default for a group sets nothing but what names it (name,
  source): any other value there would be a default the dataclass does not state.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from dp_jax.base.checks import _dataclass_in, _hints
from dp_jax.base.yamlfile import CONF_DIR
from dp_jax.cli.hydra_app import app_config

CONF = Path(CONF_DIR)
# apps in the order a group option is composed with (the first whose schema has the group)
APPS = ("plan", "simulate", "train", "profile", "inspect", "validate", "pipeline", "accuracy")
DATA_GROUPS = ("model", "cluster")  # files of data: every number stated with its source
NAMING_KEYS = ("name", "source")  # what names a group's option
NEEDS = {("profile", "file"): ["profile.path=p.json"]}  # options with a required value


def schema(app: str) -> type:
  return importlib.import_module(f"dp_jax.{app}").main.schema


def group_class(app: str, group: str) -> type | None:
  return _dataclass_in(_hints(schema(app)).get(group))


def defaults_list(app: str) -> dict[str, str]:
  """group -> the option conf/<app>.yaml selects."""
  out = {}
  for item in OmegaConf.to_container(OmegaConf.load(CONF / f"{app}.yaml"))["defaults"]:
    if isinstance(item, dict):
      ((group, option),) = item.items()
      if not group.startswith("override"):
        out[group] = option
  return out


def group_options() -> list[tuple[str, str, str]]:
  """(group, option, an app whose schema has the group) for every conf/<group>/<option>.yaml."""
  out = []
  for folder in sorted(p for p in CONF.iterdir() if p.is_dir()):
    app = next((a for a in APPS if group_class(a, folder.name) is not None), None)
    if app is None:
      continue  # hydra/, experiment/: not a group of an app's schema
    out += [(folder.name, f.stem, app) for f in sorted(folder.glob("*.yaml"))]
  return out


def restated(node: Any, kind: type, where: str) -> list[str]:
  """Keys of a YAML mapping whose value equals `kind`'s default (recursing into group fields)."""
  hints = _hints(kind)
  fields = {f.name: f for f in dataclasses.fields(kind)}
  out = []
  for key, value in node.items():
    if key in ("defaults", "hydra") or key not in fields:
      continue
    inner = _dataclass_in(hints.get(key))
    if inner is not None:
      if isinstance(value, dict) and key not in DATA_GROUPS:
        out += restated(value, inner, f"{where}{key}.")
      continue
    f = fields[key]
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    if default is dataclasses.MISSING or key in NAMING_KEYS:
      continue
    same = value == default or (isinstance(default, tuple) and value == list(default))
    if same and not (isinstance(value, str) and value.startswith("${")):
      out.append(f"{where}{key}: {value!r}")
  return out


def test_every_app_config_composes_into_its_typed_config():
  for app in APPS:
    cfg = app_config(importlib.import_module(f"dp_jax.{app}").main, [])
    assert type(cfg) is schema(app)


def test_every_group_option_composes_into_a_typed_config():
  options = group_options()
  assert {g for g, _, _ in options} >= {"model", "cluster", "planner", "profile", "background",
                                         "comparison", "logger"}
  assert len(options) > 30
  for group, option, app in options:
    cfg = app_config(importlib.import_module(f"dp_jax.{app}").main,
                     [f"{group}={option}", *NEEDS.get((group, option), [])])
    assert isinstance(getattr(cfg, group), group_class(app, group)), (group, option)


def test_no_yaml_value_restates_its_dataclass_default():
  bad = []
  for group, option, app in group_options():
    if group in DATA_GROUPS:
      continue
    node = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
    bad += restated(node or {}, group_class(app, group), f"conf/{group}/{option}.yaml: ")
  for app in APPS:
    node = OmegaConf.to_container(OmegaConf.load(CONF / f"{app}.yaml"))
    bad += restated(node, schema(app), f"conf/{app}.yaml: ")
  assert not bad, ("YAML values equal to their dataclass's default (state each default once, "
                   "in the dataclass; remove them):\n" + "\n".join(bad))


@pytest.mark.parametrize("app", APPS)
def test_the_option_an_app_selects_by_default_only_names_itself(app):
  for group, option in defaults_list(app).items():
    if group in DATA_GROUPS or group_class(app, group) is None:
      continue
    node = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml")) or {}
    extra = sorted(set(node) - set(NAMING_KEYS))
    assert not extra, (f"conf/{group}/{option}.yaml, {app}'s default, sets {extra}: a default "
                       f"there disagrees with the dataclass's; state it in the dataclass")


def test_a_restatement_is_found(tmp_path):
  from dp_jax.planner.options import PlannerConfig

  found = restated({"name": "burst", "amplification_limit": 2.0, "mode": "frontier",
                    "sharding": ["samples"]}, PlannerConfig, "x: ")
  assert found == ["x: amplification_limit: 2.0", "x: sharding: ['samples']"]
