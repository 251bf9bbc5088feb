"""Reading the project's YAML files (config groups, clusters) with one-line errors."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from dp_jax.base.errors import UserError

# The config groups' folder (conf/ at the repository root): Hydra's search path, and where a
# named cluster's file is read from.
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
SUFFIXES = (".yaml", ".yml")


def load_yaml(group: str, path: str | Path) -> dict:
  """A group's YAML file as a plain dict (one-line errors for a missing or bad file)."""
  path = Path(path).expanduser()
  if not path.is_file():
    raise UserError(f"{group} file not found: {path}; give a path to a YAML file "
                    f"({group}=path/to/file.yaml)")
  try:
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
  except Exception as e:  # noqa: BLE001 - YAML parse errors come in many types
    raise UserError(f"{group} file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
  if not isinstance(data, dict):
    raise UserError(f"{group} file {path} must hold a mapping of {group} options")
  return data


def group_file(group: str, name: str) -> dict:
  """The config `conf/<group>/<name>.yaml`, or the YAML file `name` names, as a dict."""
  if str(name).endswith(SUFFIXES):
    return load_yaml(group, name)
  path = Path(CONF_DIR) / group / f"{name}.yaml"
  if not path.is_file():
    valid = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
    raise UserError(f"unknown {group} '{name}' (valid {group} options: {valid}; or a YAML "
                    f"file: path/to/{group}.yaml)")
  return load_yaml(group, path)
