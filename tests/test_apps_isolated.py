"""The apps (dp_jax/apps/) stay thin: no app imports another app (shared code lives in library
modules), and each `python -m dp_jax.<app>` entry module only calls its app's main."""

import ast
from pathlib import Path

import dp_jax.apps

APPS_DIR = Path(dp_jax.apps.__file__).parent
APPS = sorted(p.stem for p in APPS_DIR.glob("*.py") if p.stem != "__init__")
# python -m names that do not map to a dp_jax.<app> of the same name: none but profile's package
ENTRY = {app: APPS_DIR.parent / f"{app}.py" for app in APPS} | {
    "profile": APPS_DIR.parent / "profile" / "__main__.py"}


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
  """The app a module name refers to (dp_jax.apps.<app>, or the entry dp_jax.<app>)."""
  parts = module.split(".")
  if parts[:2] == ["dp_jax", "apps"] and len(parts) > 2:
    return parts[2]
  if parts[0] == "dp_jax" and len(parts) > 1 and parts[1] in APPS and parts[1] != "profile":
    return parts[1]
  if module == "dp_jax.profile.__main__":
    return "profile"
  return None


def test_every_app_found():
  assert {"inspect", "profile", "plan", "simulate", "train", "pipeline", "accuracy",
          "validate"} <= set(APPS)


def test_no_app_imports_another_app():
  crossing = [f"dp_jax/apps/{app}.py imports {m}" for app in APPS
              for m in sorted(imported_modules(APPS_DIR / f"{app}.py"))
              if app_of(m) not in (None, app) or m == "dp_jax.apps"]
  assert not crossing, "apps import other apps (move what they share to a library module):\n" + (
      "\n".join(crossing))


def test_library_modules_do_not_import_apps():
  lib = [p for p in APPS_DIR.parent.rglob("*.py")
         if APPS_DIR not in p.parents and p not in ENTRY.values()]
  assert len(lib) > 20
  bad = [f"{p.relative_to(APPS_DIR.parent.parent)} imports {m}" for p in lib
         for m in sorted(imported_modules(p)) if app_of(m) is not None]
  assert not bad, "\n".join(bad)


def test_entry_modules_only_call_their_app():
  for app, path in ENTRY.items():
    assert imported_modules(path) == {f"dp_jax.apps.{app}", f"dp_jax.apps.{app}.main"}, path
    assert 'if __name__ == "__main__":\n  main()' in path.read_text(), path
