"""The layer order of the package, as a table of allowed edges, checked on every import.

Each folder of dp_jax (and the apps at its root, and the studies in experiments/) may import
only the folders this table lists for it: the layers below it. The check reads every import,
at module level, inside functions and under TYPE_CHECKING, so that a lazy import cannot point
up either. docs/architecture.md draws the same table.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dp_jax"

# The layers, bottom up; a folder may import the folders of the layers below its own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("base",),                                  # errors, JSON and YAML files, option checks
    ("graph", "hardware"),                      # LayerGraph; devices and clusters
    ("models", "layer_times", "convergence"),   # the zoo and its tracer; per-layer times; steps
    ("planner",),                               # the search, the cost model, the plan contract
    ("multiplex", "report", "published"),       # the policy; verdicts, a plan shown; published rows
    ("simulator",),                             # a plan's iteration per device, background fill
    ("runtime",),                               # plans on JAX devices
    ("measurement", "orchestrator"),            # measured here; background and training jobs
    ("tracking",),                              # W&B runs, run folders, sweeps read back
    ("cli", "main_job"),                        # the apps' Hydra edge; the main job's parts
    ("apps",),                                  # dp_jax/<app>.py
    ("experiments",),                           # the studies (outside the package)
)
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
ALLOWED: dict[str, frozenset[str]] = {
    name: frozenset(n for below in LAYERS[:LAYER_OF[name]] for n in below) for name in LAYER_OF}
# Packages that never import JAX, at module level or anywhere: they run where JAX is not.
JAX_FREE = ("base", "graph", "hardware", "layer_times", "planner", "multiplex", "report",
            "published", "simulator")
APPS = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def unit_of(module: str) -> str | None:
  """The folder (or 'apps', 'experiments') a dotted module name belongs to."""
  parts = module.split(".")
  if parts[0] == "experiments":
    return "experiments"
  if parts[0] != "dp_jax" or len(parts) < 2:
    return None
  return "apps" if parts[1] in APPS else parts[1]


def source_files() -> list[tuple[str, Path]]:
  out = []
  for base in (PACKAGE, ROOT / "experiments"):
    for path in sorted(base.rglob("*.py")):
      parts = path.relative_to(ROOT).with_suffix("").parts
      out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
  return out


def imports(path: Path) -> list[tuple[int, str]]:
  """(line, module) of every import in the file, wherever it stands ('from a import b' gives
  a.b, which is a's folder either way)."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
  return out


def upward_edges() -> list[str]:
  bad = []
  for module, path in source_files():
    src = unit_of(module)
    if src is None or src == "dp_jax":
      continue
    for line, target in imports(path):
      dst = unit_of(target)
      if dst is None or dst == src or dst == "dp_jax" and target == "dp_jax.__init__":
        continue
      if dst not in ALLOWED.get(src, frozenset()):
        bad.append(f"{path.relative_to(ROOT)}:{line} ({src}) imports {target} ({dst})")
  return bad


def test_every_folder_is_in_the_table():
  folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
  assert folders == set(LAYER_OF) - {"apps", "experiments"}, (
      "a folder of dp_jax is missing from LAYERS (or the table names one that is gone): "
      f"{sorted(folders ^ (set(LAYER_OF) - {'apps', 'experiments'}))}")


def test_no_import_points_up_the_layers():
  bad = upward_edges()
  assert not bad, ("imports against the layer order of tests/test_layers.py (move the code to "
                   "the layer that owns it):\n" + "\n".join(bad))


def test_the_check_sees_imports_inside_functions(tmp_path):
  sample = tmp_path / "sample.py"
  sample.write_text("import numpy\n\ndef f():\n  from dp_jax.runtime import step\n"
                    "  import dp_jax.planner.costs\n")
  assert imports(sample) == [(1, "numpy"), (4, "dp_jax.runtime.step"),
                             (5, "dp_jax.planner.costs")]
  assert "runtime" not in ALLOWED["planner"] and "planner" in ALLOWED["runtime"]


def test_the_jax_free_layers_load_without_jax():
  modules = [m for m, _ in source_files() if unit_of(m) in JAX_FREE]
  code = ("import importlib, sys\n"
          f"for m in {modules!r}:\n  importlib.import_module(m)\n"
          "bad = sorted(k for k in sys.modules if k == 'jax' or k.startswith(('jax.', 'flax')))\n"
          "print(','.join(bad))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       check=True).stdout.strip()
  assert len(modules) > 40 and out == "", f"JAX loaded by a JAX-free layer: {out}"
