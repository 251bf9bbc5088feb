"""README.md: short, and its Layout section names every top-level module and folder of dp_jax/."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def layout_section() -> str:
  """The text of the README's '## Layout' section (up to the next '## ' heading)."""
  m = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", README, flags=re.M | re.S)
  assert m, "README.md has no '## Layout' section"
  return m.group(1)


def package_entries() -> list[str]:
  """Top-level modules (without .py) and folders of the dp_jax package, from the tree."""
  pkg = ROOT / "dp_jax"
  mods = [p.stem for p in pkg.glob("*.py") if p.name != "__init__.py"]
  dirs = [p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
  return sorted(mods + dirs)


def test_layout_names_every_top_level_module_and_folder():
  text = layout_section()
  entries = package_entries()
  assert len(entries) > 10  # the tree was read
  missing = [e for e in entries if not re.search(rf"(?<![\w/.]){re.escape(e)}(\.py|/)?(?![\w])",
                                                  text)]
  assert not missing, f"README.md's Layout section does not name: {', '.join(missing)}"


def test_readme_is_under_two_thousand_words():
  assert len(README.split()) <= 2000, len(README.split())
