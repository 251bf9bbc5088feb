"""Every repository path the docs name exists: docs/*.md and README.md, read as
tests/test_architecture_doc.py reads docs/architecture.md (its path finder), and every Python
file they name: a path read from the root or from dp_jax/ (so `sim/job.py` fails once the
package has no sim/), a backticked bare name somewhere in the repository (`measure.py`)."""

import re

import pytest
from test_architecture_doc import ROOT, named_paths

DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
# other projects' files the docs cite (JAX's source, DeepPool's, NVIDIA's BERT examples)
EXTERNAL = {"jax/_src/lax/slicing.py", "jax/_src/dispatch.py", "examples/vit.py",
            "run_pretraining.py", "optimization.py"}
# a Python file: a/b.py, read from the root or from dp_jax/; `b.py`, backticked
MODULE = re.compile(r"(?<![\w./])((?:\w[\w-]*/)+\w[\w-]*\.py)\b")
BARE = re.compile(r"`(\w[\w-]*\.py)`")
FILES = {p.name for top in ("dp_jax", "scripts", "experiments", "tests")
         for p in (ROOT / top).rglob("*.py")}


def missing_paths(text: str) -> list[str]:
  """The repository paths `text` names that do not exist."""
  missing = {p for p in named_paths(text) if not (ROOT / p).exists()}
  missing |= {p for p in MODULE.findall(text) if p not in EXTERNAL
              and not ((ROOT / p).exists() or (ROOT / "dp_jax" / p).exists())}
  missing |= {p for p in BARE.findall(text) if p not in EXTERNAL and p not in FILES}
  return sorted(missing)


def test_the_path_finder_finds_moved_and_missing_modules():
  text = ("`dp_jax/planner/memory.py`, `simulator/job.py`, `planner/search/tables.py`, "
          "`dp_jax/simulate.py`, `hydra_app.py`, `jax/_src/dispatch.py`, dp_jax/sim/job.py, "
          "`sim/report.py`, `apps/simulate.py`, `measure.py`, profile/devices.py")
  assert missing_paths(text) == ["apps/simulate.py", "dp_jax/sim/job.py", "measure.py",
                                 "profile/devices.py", "sim/report.py"]


def test_the_docs_are_read():
  names = {p.relative_to(ROOT).as_posix() for p in DOCS}
  assert {"README.md", "docs/architecture.md", "docs/simulator.md", "docs/runtime.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_doc_names_exists(doc):
  missing = missing_paths(doc.read_text())
  assert not missing, (f"{doc.relative_to(ROOT)} names paths that do not exist:\n"
                       + "\n".join(missing))
