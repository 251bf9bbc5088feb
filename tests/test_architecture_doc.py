"""docs/architecture.md stays a true map: every repository path it names exists, its folder list
names every folder of dp_jax, and the layer order and JAX-free packages it states are the ones
tests/test_layers.py enforces (LAYERS, JAX_FREE)."""

import re
from pathlib import Path

from test_layers import JAX_FREE, LAYERS, PACKAGE

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
TOP = ("dp_jax", "tests", "scripts", "conf", "experiments", "docs")
# a repository path: a top folder, then path characters; a placeholder (<app>, *) ends it
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./{{}},-]*)")


def section(title: str) -> str:
  m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, flags=re.M | re.S)
  assert m, f"docs/architecture.md has no '## {title}' section"
  return m.group(1)


def expand(path: str) -> list[str]:
  """`a/{b,c}.py` -> a/b.py, a/c.py (one brace group); a path as written otherwise."""
  m = re.search(r"\{([^{}]*)\}", path)
  if not m:
    return [path]
  return [path[:m.start()] + part + path[m.end():] for part in m.group(1).split(",")]


FOLDERS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
# a module named inside the package, as the prose writes it: planner/memory.py
SHORT = re.compile(rf"(?<![\w./-])((?:{'|'.join(FOLDERS)})/[\w./]*\.py)\b")


def named_paths(text: str) -> set[str]:
  out = {p for raw in PATH.findall(text) for p in expand(raw.rstrip(".,;:"))}
  return out | {f"dp_jax/{p}" for p in SHORT.findall(text)}


def stated_layers(text: str) -> tuple[tuple[str, ...], ...]:
  """The 'a < b, c < ...' order of the folders section, bottom up."""
  lines = [ln.strip() for ln in text.splitlines() if re.match(r"^\s+(\w+(, \w+)* )?<", ln)
           or re.match(r"^\s+base <", ln)]
  chain = " ".join(lines)
  assert chain, "the folders section states no 'base < ...' layer order"
  return tuple(tuple(n.strip() for n in part.split(",")) for part in chain.split("<"))


def stated_jax_free(text: str) -> set[str]:
  m = re.search(r"JAX-free \([^)]*\):\s*(.*?)\.", text, flags=re.S)
  assert m, "the folders section does not say which packages are JAX-free"
  return {n.strip() for n in m.group(1).split(",")}


def test_the_path_finder_reads_paths_as_the_doc_writes_them():
  text = ("`dp_jax/planner/memory.py` (`x`), tests/test_layers.py, `dp_jax/<app>.py`, "
          "`conf/*.yaml`, `dp_jax/a/{b,c}.py`, runtime/step.py; the plan `dp_jax.plan/2`")
  assert named_paths(text) == {"dp_jax/planner/memory.py", "tests/test_layers.py", "dp_jax/",
                               "conf/", "dp_jax/a/b.py", "dp_jax/a/c.py",
                               "dp_jax/runtime/step.py"}


def test_every_path_the_doc_names_exists():
  paths = named_paths(DOC)
  assert len(paths) > 100  # the doc was read
  missing = sorted(p for p in paths if not (ROOT / p).exists())
  assert not missing, "docs/architecture.md names paths that do not exist:\n" + "\n".join(missing)


def test_the_folder_list_names_every_folder_and_app():
  text = section("The folders (one screen)")
  folders = FOLDERS
  apps = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
  listed = set(re.findall(r"^\s+([\w.]+/)", text, flags=re.M))
  missing = [f"{f}/" for f in folders if f"{f}/" not in listed]
  missing += [a for a in apps if not re.search(rf"(?<![\w.]){re.escape(a)}\b", text)]
  for top in ("experiments/", "scripts/", "conf/", "tests/"):
    if top not in listed:
      missing.append(top)
  assert not missing, f"the folders section does not list: {', '.join(missing)}"


def test_the_stated_layer_order_is_the_enforced_one():
  text = section("The folders (one screen)")
  assert stated_layers(text) == LAYERS, (
      f"docs/architecture.md states the layers {stated_layers(text)}, tests/test_layers.py "
      f"enforces {LAYERS}")
  assert stated_jax_free(text) == set(JAX_FREE)
