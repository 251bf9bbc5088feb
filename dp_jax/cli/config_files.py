"""Config groups given as YAML files: `cluster=path/to/my_cluster.yaml`, `model=my_vit.yaml`.

Hydra picks a group option by name from its search path only. A `group=<file>.yaml` override
(also a sweep, `cluster=a.yaml,b.yaml`) is rewritten to the option `<file stem>` of that group,
found in a temporary config folder holding a link to the file, which joins `hydra.searchpath`.
The composed config is then checked against the group's schema like any shipped option.

Paths Hydra's override parser would split or refuse are taken whole: a value naming one
existing file is one path even with a comma in it, and a value with non-ASCII characters is
quoted for the parser (`quoted`); a file's option name is always a plain ASCII word.
"""

from __future__ import annotations

import atexit
import hashlib
import re
import shutil
import tempfile
from pathlib import Path

from dp_jax.base.errors import UserError
from dp_jax.base.yamlfile import SUFFIXES

FILE_GROUPS = ("model", "cluster")


def expand_yaml_overrides(args: list[str], conf_dir: str | Path) -> list[str]:
  """`group=<path>.yaml[,<path>.yaml...]` of FILE_GROUPS as group options on a search path."""
  out, root, linked = [], None, {}
  for arg in args:
    key, paths = _file_override(arg)
    if not paths:
      out.append(arg)
      continue
    root = root or Path(tempfile.mkdtemp(prefix="dp_jax_conf_"))
    names = [_link(root, key, Path(p), Path(conf_dir), linked) for p in paths]
    out.append(f"{key}={','.join(names)}")
  if root is None:
    return out
  atexit.register(shutil.rmtree, root, ignore_errors=True)
  return _with_search_path(out, f"file://{root}")


def named_files(args: list[str]) -> list[tuple[str, Path]]:
  """(group, file) of every config file the overrides name (what provenance records)."""
  return [(key, Path(p).expanduser().resolve()) for key, paths in map(_file_override, args)
          for p in paths]


def _file_override(arg: str) -> tuple[str, list[str]]:
  """(group, paths) of a `group=<file>.yaml[,...]` override of FILE_GROUPS, else (key, [])."""
  key, sep, value = arg.partition("=")
  value = unquoted(value)
  paths = ([value] if one_file(value) else value.split(",")) if sep else []
  if key not in FILE_GROUPS or not paths or not all(p.endswith(SUFFIXES) for p in paths):
    return key, []
  return key, paths


def _link(root: Path, group: str, path: Path, conf_dir: Path, linked: dict) -> str:
  """The option name of `path` in the temporary folder (linked once, however often named)."""
  path = path.expanduser().resolve()
  if (group, path) in linked:
    return linked[group, path]
  if not path.is_file():
    raise UserError(f"{group} file not found: {path}; give the path of a YAML file, or put "
                    f"<name>.yaml in <dir>/{group}/ and add hydra.searchpath=[file://<dir>] "
                    f"{group}=<name>")
  name = path.stem
  plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name) and name.lower() not in HYDRA_WORDS
  shipped = (conf_dir / group / f"{name}.yaml").exists()
  if not plain or shipped or (root / group / f"{name}.yaml").exists():
    word = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or group
    name = f"{word}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"  # not a shipped one
  (root / group).mkdir(parents=True, exist_ok=True)
  (root / group / f"{name}.yaml").symlink_to(path)
  linked[group, path] = name
  return name


# words Hydra's override parser reads as something other than a string (model=nan is a float)
HYDRA_WORDS = ("true", "false", "null", "nan", "inf")


def one_file(value: str) -> bool:
  """Whether `value` names one existing file (then a comma in it is part of the path)."""
  try:
    return bool(value) and Path(value).expanduser().is_file()
  except OSError:
    return False


def unquoted(value: str) -> str:
  """`value` without the quotes around it ('a,b.yaml' -> a,b.yaml)."""
  if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
    return value[1:-1]
  return value


def quoted(args: list[str]) -> list[str]:
  """Overrides whose value Hydra's parser would split or refuse, quoted as one string: a value
  naming one existing file with a comma in it, or a plain value with non-ASCII characters."""
  out = []
  for arg in args:
    key, sep, value = arg.partition("=")
    bare = unquoted(value)
    whole = bare != value or value[:1] in "[{" or not sep
    if not whole and ((one_file(value) and "," in value) or not value.isascii()):
      quote = "'" if "'" not in value else '"' if '"' not in value else None
      value = f"{quote}{value}{quote}" if quote else "'" + value.replace("'", "\\'") + "'"
    out.append(f"{key}{sep}{value}")
  return out


def _with_search_path(args: list[str], entry: str) -> list[str]:
  """args with `entry` added to hydra.searchpath (the user's own entries kept)."""
  for i, arg in enumerate(args):
    key, _, value = arg.partition("=")
    if key.lstrip("+") == "hydra.searchpath":
      inner = value.strip()
      inner = inner[1:-1] if inner.startswith("[") and inner.endswith("]") else inner
      items = [s for s in (x.strip() for x in inner.split(",")) if s]
      return [*args[:i], f"{key}=[{','.join([*items, entry])}]", *args[i + 1:]]
  return [*args, f"hydra.searchpath=[{entry}]"]
