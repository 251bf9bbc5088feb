"""The apps (the modules at the package root: `python -m dp_jax.<app>`) stay thin: no app
imports another app (shared code lives in library folders), no library module imports an app,
and the package root holds nothing but the apps."""

import ast
from pathlib import Path

import dp_jax

ROOT = Path(dp_jax.__file__).parent
APPS = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")


def imported_modules(path: Path) -> set[str]:
  """Every module a file imports, at top level or inside functions ('from a import b' gives
  'a' and 'a.b', since b may be a module)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out.add(node.module)
      out.update(f"{node.module}.{a.name}" for a in node.names)
  return out


def app_of(module: str) -> str | None:
  """The app a module name refers to (dp_jax.<app>)."""
  parts = module.split(".")
  return parts[1] if parts[0] == "dp_jax" and len(parts) == 2 and parts[1] in APPS else None


def test_the_root_holds_the_apps_and_nothing_else():
  assert APPS == sorted(["accuracy", "inspect", "pipeline", "plan", "profile", "simulate",
                         "train", "validate"])
  for app in APPS:
    text = (ROOT / f"{app}.py").read_text()
    assert f'hydra_app("{app}"' in text, app
    # run by its package name, so that launchers in other processes unpickle its schema
    assert f'if __name__ == "__main__":\n  run_app_module("dp_jax.{app}")' in text, app


def test_no_app_imports_another_app():
  crossing = [f"dp_jax/{app}.py imports {m}" for app in APPS
              for m in sorted(imported_modules(ROOT / f"{app}.py")) if app_of(m) not in (None, app)]
  assert not crossing, "apps import other apps (move what they share to a library module):\n" + (
      "\n".join(crossing))


def test_library_modules_do_not_import_apps():
  lib = [p for p in ROOT.rglob("*.py") if p.parent != ROOT]
  assert len(lib) > 20
  bad = [f"{p.relative_to(ROOT.parent)} imports {m}" for p in lib
         for m in sorted(imported_modules(p)) if app_of(m) is not None]
  assert not bad, "\n".join(bad)
