"""The apps' layer: no import circle through cli (issue 23.7), lazy imports counted too."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dp_jax"


def imports_of(module: str) -> set[str]:
  """dp_jax modules `module` imports anywhere in its source (function-level imports too)."""
  path = PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dp_jax"):
      out.add(node.module)
      out |= {f"{node.module}.{a.name}" for a in node.names}
    elif isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name.startswith("dp_jax")}
  return {m for m in out if PACKAGE.joinpath(*m.split(".")[1:]).with_suffix(".py").is_file()}


def test_the_hydra_edge_forms_no_circle():
  for module in ("dp_jax.base.checks", "dp_jax.cli.config_files", "dp_jax.cli.schema",
                 "dp_jax.tracking.run_folder"):
    assert "dp_jax.cli.hydra_app" not in imports_of(module), module
  for module in imports_of("dp_jax.cli.hydra_app"):
    assert "dp_jax.cli.hydra_app" not in imports_of(module), module
