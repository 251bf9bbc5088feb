"""The planner's modules (the cost model's above all) import each other without a circle, and
each cost module imports alone."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PLANNER = Path(__file__).resolve().parents[1] / "dp_jax" / "planner"
COST_MODULES = ("costs", "footprint", "memory", "pricing", "sharded", "stage_terms")


def planner_imports(module: str) -> set[str]:
  """Planner modules `module` imports anywhere in its file (TYPE_CHECKING blocks included)."""
  path = PLANNER / (module.replace(".", "/") + ".py")
  if not module or not path.exists():
    path = PLANNER / module.replace(".", "/") / "__init__.py"
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dp_jax.planner"):
      base = node.module[len("dp_jax.planner"):].lstrip(".")
      out.update([base] if base else [a.name for a in node.names])
    elif isinstance(node, ast.Import):
      out.update(a.name[len("dp_jax.planner."):] for a in node.names
                 if a.name.startswith("dp_jax.planner."))
  return out


def planner_modules() -> list[str]:
  """Every module of the planner package, dotted below dp_jax.planner (the package itself: "")."""
  out = []
  for path in sorted(PLANNER.rglob("*.py")):
    parts = path.relative_to(PLANNER).with_suffix("").parts
    out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
  return out


def test_the_planner_import_graph_has_no_circle():
  seen, path, walked = set(), [], []

  def visit(module: str) -> None:
    assert module not in path, f"import circle: {' -> '.join([*path, module])}"
    if module in seen:
      return
    path.append(module)
    for dep in sorted(planner_imports(module)):
      visit(dep)
    path.pop()
    seen.add(module)
    walked.append(module)

  for module in planner_modules():
    visit(module)
  assert set(COST_MODULES) | {"make", "search.tables"} <= set(walked)
  assert "pricing" in planner_imports("memory") and "costs" in planner_imports("pricing")
  assert not planner_imports("costs") & {"memory", "sharded", "pricing"}


@pytest.mark.parametrize("module", ["costs", "memory", "sharded", "pricing"])
def test_each_cost_module_imports_alone_without_jax(module):
  code = (f"import sys, dp_jax.planner.{module} as m; assert m.__name__; "
          "assert 'jax' not in sys.modules, 'the planner imported jax'")
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=PLANNER.parents[1], check=False)
  assert run.returncode == 0, run.stderr
