"""Config groups given as YAML files: `cluster=path/to/my_cluster.yaml`, `model=my_vit.yaml`.

Hydra picks a group option by name from its search path only. A `group=<file>.yaml` override
(also a sweep, `cluster=a.yaml,b.yaml`) is rewritten to the option `<file stem>` of that group,
found in a temporary config folder holding a link to the file, which joins `hydra.searchpath`.
The composed config is then checked against the group's schema like any shipped option.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

from dp_jax.base.errors import UserError
from dp_jax.base.yamlfile import SUFFIXES

FILE_GROUPS = ("model", "cluster")


def expand_yaml_overrides(args: list[str], conf_dir: str | Path) -> list[str]:
  """`group=<path>.yaml[,<path>.yaml...]` of FILE_GROUPS as group options on a search path."""
  out, root = [], None
  for arg in args:
    key, sep, value = arg.partition("=")
    paths = value.split(",") if sep else []
    if key not in FILE_GROUPS or not paths or not all(p.endswith(SUFFIXES) for p in paths):
      out.append(arg)
      continue
    root = root or Path(tempfile.mkdtemp(prefix="dp_jax_conf_"))
    names = [_link(root, key, Path(p), Path(conf_dir)) for p in paths]
    out.append(f"{key}={','.join(names)}")
  if root is None:
    return out
  atexit.register(shutil.rmtree, root, ignore_errors=True)
  return _with_search_path(out, f"file://{root}")


def _link(root: Path, group: str, path: Path, conf_dir: Path) -> str:
  path = path.expanduser().resolve()
  if not path.is_file():
    raise UserError(f"{group} file not found: {path}; give the path of a YAML file, or put "
                    f"<name>.yaml in <dir>/{group}/ and add hydra.searchpath=[file://<dir>] "
                    f"{group}=<name>")
  name = path.stem
  shipped = (conf_dir / group / f"{name}.yaml").exists()
  if shipped or (root / group / f"{name}.yaml").exists():
    name = f"{name}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"  # not a shipped one
  (root / group).mkdir(parents=True, exist_ok=True)
  (root / group / f"{name}.yaml").symlink_to(path)
  return name


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
