"""Imports that say why, and no import circle (issue 33).

An import inside a function keeps a module off a path that must not load it (JAX off the
planner, matplotlib off a run without charts, ...): it states that reason in a comment on its
line or the line right above (one comment above a block of consecutive imports covers the
block). And the package's module-level imports form no circle."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dp_jax"
NOT_A_REASON = ("noqa", "type:", "pragma", "fmt:")
IMPORTS = (ast.Import, ast.ImportFrom)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def module_name(path: Path) -> str:
  """The dotted name of a file under the package (a package's __init__: the package)."""
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files() -> list[Path]:
  return sorted(PACKAGE.rglob("*.py"))


def reason_lines(source: str) -> tuple[set[int], set[int]]:
  """(lines that are only a comment, lines ending in one) where the comment reads as a reason
  (a bare noqa or type: ignore is none)."""
  whole, trailing = set(), set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    text = token.string.lstrip("#").strip()
    if token.type == tokenize.COMMENT and text and not text.startswith(NOT_A_REASON):
      alone = not token.line[:token.start[1]].strip()
      (whole if alone else trailing).add(token.start[0])
  return whole, trailing


def import_blocks(body: list[ast.stmt]) -> list[list[ast.stmt]]:
  """Runs of import statements on consecutive lines within one statement list."""
  blocks: list[list[ast.stmt]] = []
  for stmt in body:
    if not isinstance(stmt, IMPORTS):
      continue
    last = blocks[-1][-1] if blocks else None
    if last is not None and last in body and body.index(last) + 1 == body.index(stmt) and (
        stmt.lineno == last.end_lineno + 1):
      blocks[-1].append(stmt)
    else:
      blocks.append([stmt])
  return blocks


def statement_lists(tree: ast.AST) -> list[list[ast.stmt]]:
  """Every statement list inside a function (bodies, else/finally branches, handlers)."""
  out = []
  for fn in ast.walk(tree):
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    for node in ast.walk(fn):
      for field in ("body", "orelse", "finalbody"):
        stmts = getattr(node, field, None)
        if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
          out.append(stmts)
  return out


def function_imports(path: Path) -> list[tuple[ast.stmt, bool]]:
  """Each import inside a function of `path`, and whether a comment states its reason."""
  source = path.read_text()
  tree = ast.parse(source, str(path))
  whole, trailing = reason_lines(source)
  seen, out = set(), []

  def explained(stmt: ast.stmt) -> bool:
    """A comment line right above `stmt`, or a comment on one of its own lines."""
    own = set(range(stmt.lineno, stmt.end_lineno + 1))
    return stmt.lineno - 1 in whole or bool((whole | trailing) & own)

  for stmts in statement_lists(tree):
    for block in import_blocks(stmts):
      head = block[0]
      covered = explained(head)
      for stmt in block:
        if id(stmt) not in seen:
          seen.add(id(stmt))
          out.append((stmt, covered or explained(stmt)))
  return sorted(out, key=lambda pair: pair[0].lineno)


def test_every_import_inside_a_function_states_its_reason():
  bad = [f"{path.relative_to(PACKAGE.parent)}:{stmt.lineno}" for path in package_files()
         for stmt, ok in function_imports(path) if not ok]
  assert not bad, ("imports inside functions without a stated reason (hoist them to the module "
                   "top, or say why on the line or the line above):\n" + "\n".join(bad))


def test_the_reason_check_reads_blocks_and_lines(tmp_path):
  sample = tmp_path / "dp_jax" / "sample.py"
  sample.parent.mkdir()
  sample.write_text(
      "def f():\n"
      "  # JAX: only when a run trains\n"
      "  import jax\n"
      "  import jax.numpy as jnp\n"
      "\n"
      "  import json\n"
      "  import os  # noqa: F401\n"
      "  from rich.table import (  # rich: only to print\n"
      "    Table,\n"
      "  )\n"
      "  x = 1  # a comment about x, not the import below\n"
      "  import re\n"
      "  return jax, jnp, json, os, Table, x, re\n")
  found = {stmt.lineno: ok for stmt, ok in function_imports(sample)}
  assert found == {3: True, 4: True, 6: False, 7: False, 8: True, 12: False}


def is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
      isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
  """Imports that run when the module is imported: not inside a function, not TYPE_CHECKING."""
  out = []

  def visit(node: ast.AST) -> None:
    if isinstance(node, FUNCTIONS):
      return
    if isinstance(node, IMPORTS):
      out.append(node)
      return
    if isinstance(node, ast.If) and is_type_checking(node.test):
      for child in node.orelse:
        visit(child)
      return
    for child in ast.iter_child_nodes(node):
      visit(child)

  visit(tree)
  return out


def resolve(node: ast.ImportFrom, name: str, is_package: bool) -> str:
  """The absolute module a (possibly relative) `from` import names."""
  if not node.level:
    return node.module or ""
  parts = name.split(".")
  base = parts if is_package else parts[:-1]
  base = base[:len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
  """dp_jax module -> the dp_jax modules its module-level imports load."""
  files = {module_name(p): p for p in package_files()}
  graph: dict[str, set[str]] = {}
  for name, path in files.items():
    edges = set()
    for node in module_level_imports(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        edges.update(a.name for a in node.names)
        continue
      source = resolve(node, name, path.name == "__init__.py")
      for alias in node.names:
        sub = f"{source}.{alias.name}"
        edges.add(sub if sub in files else source)
    graph[name] = {e for e in edges if e in files and e != name}
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One circle through each strongly connected group of modules (Tarjan)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  groups: list[set[str]] = []

  def connect(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(graph[v]):
      if w not in index:
        connect(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = set()
      while True:
        w = stack.pop()
        group.add(w)
        if w == v:
          break
      if len(group) > 1:
        groups.append(group)

  for v in sorted(graph):
    if v not in index:
      connect(v)
  return [circle_in(graph, group) for group in groups]


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
  """A shortest circle through the group's first module (breadth-first within the group)."""
  start = min(group)
  paths = {start: [start]}
  frontier = [start]
  while frontier:
    following = []
    for v in frontier:
      for w in sorted(graph[v] & group):
        if w == start:
          return [*paths[v], start]
        if w not in paths:
          paths[w] = [*paths[v], w]
          following.append(w)
    frontier = following
  raise AssertionError(f"no circle in {sorted(group)}")


def test_the_package_has_no_import_circle():
  found = circles(import_graph())
  assert not found, "import circles (module-level imports):\n" + "\n".join(
      " -> ".join(c) for c in found)


def test_the_circle_finder_sees_submodules_and_packages():
  graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": set()}
  assert circles(graph) == [["p", "p.a", "p.b", "p"]]
  assert circles({"a": {"b"}, "b": set()}) == []
  tree = ast.parse("from . import b\nfrom .c import d\nif TYPE_CHECKING:\n  import e\n"
                   "def f():\n  import g\n")
  assert [ast.unparse(n) for n in module_level_imports(tree)] == [
      "from . import b", "from .c import d"]
  graph = import_graph()
  assert "dp_jax.planner.make" in graph["dp_jax.planner"]
  assert all(not m.startswith("dp_jax.cli.hydra_app") for m in graph["dp_jax.base.checks"])
