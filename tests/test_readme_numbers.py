"""README.md's and docs/validation.md's generated blocks: what experiments/readme_numbers.py
renders from their sources; --check names the first stale line; hand text is left alone."""

import re
import shutil

import pytest

from experiments import readme_numbers as numbers

ROOT = numbers.ROOT
README = ROOT / "README.md"
DOC = ROOT / "docs" / "validation.md"


@pytest.fixture(scope="module")
def facts():
  return numbers.Facts()


def outside(text: str) -> str:
  """`text` with every generated block (markers and content) as one placeholder."""
  return numbers.BLOCK.sub("<generated block>", text)


def run_at(lines: list[str], run: list[str], start: int) -> int:
  """The index after the first occurrence of `run` as consecutive lines from `start` on."""
  for i in range(start, len(lines) - len(run) + 1):
    if lines[i:i + len(run)] == run:
      return i + len(run)
  raise AssertionError(f"not found in the block (in order): {run[0]!r}")


def test_readme_and_doc_have_their_blocks():
  assert numbers.block_names(README.read_text()) == ["finds", "headline"]
  assert numbers.block_names(DOC.read_text()) == ["validation", "published"]


@pytest.mark.slow  # the cheap facts trace the 16 published models (~20 s)
def test_readme_cheap_parts_are_what_the_generator_renders(facts):
  """Tolerances, published rows and the local validation: every such line of the README's
  blocks, in order (the predicted and simulated parts: the slow test below)."""
  for name, text in numbers.blocks(README.read_text()).items():
    lines, at = text.splitlines(), 0
    for part in numbers.BLOCKS[name]:
      if part in numbers.CHEAP:
        at = run_at(lines, part(facts), at)


@pytest.mark.slow  # the cheap facts trace the 16 published models (~20 s)
def test_doc_blocks_are_what_the_generator_renders(facts):
  for name, text in numbers.blocks(DOC.read_text()).items():
    assert all(part in numbers.CHEAP for part in numbers.BLOCKS[name]), name
    assert text == numbers.render_block(name, facts), name


@pytest.mark.slow  # the cheap facts trace the 16 published models (~20 s)
def test_quoted_numbers_come_from_their_sources(facts):
  """The cheap facts against the library's own numbers (not the README's)."""
  from dp_jax.published.anchors import report
  from dp_jax.report.compare import (
    GPU_TOLERANCE_LARGE_BATCH,
    GPU_TOLERANCE_SMALL_BATCH,
    VALIDATED_TOLERANCE,
  )

  small, large, cpu = facts.tolerances
  assert (small, large, cpu) == (GPU_TOLERANCE_SMALL_BATCH, GPU_TOLERANCE_LARGE_BATCH,
                                 VALIDATED_TOLERANCE)
  assert f"on GPUs **{small:.1%}** at per-GPU batches B / G of 8 or less" in README.read_text()
  rep = report()
  assert facts.published.tolerances == {r: t.value for r, t in rep.tolerances.items()}
  assert round(facts.published.tolerances["small"], 3) == small
  assert facts.published.groups >= 5 and 0 < facts.published.absolute
  assert [v.model for v in facts.validation] == ["vgg16", "gpt2_small"]
  plans, median = facts.all_plans
  assert plans == sum(v.plans for v in facts.validation)
  assert round(median / 100, 3) == VALIDATED_TOLERANCE


def test_check_names_the_first_edited_line_in_one_line(tmp_path, capsys):
  """An edited generated number (the CPU tolerance, in the first, cheap, part) fails --check
  with one line naming the file and line; nothing is written."""
  text = README.read_text()
  lines = text.splitlines(keepends=True)
  at = next(i for i, ln in enumerate(lines) if "on this machine's CPU" in ln)
  lines[at] = re.sub(r"CPU \d+\.\d%", "CPU 9.9%", lines[at])
  edited = "".join(lines)
  assert edited != text
  copy = tmp_path / "README.md"
  copy.write_text(edited)
  assert numbers.main(["--check", str(copy)]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1, err
  assert f"{copy}:{at + 1}: differs from what experiments/readme_numbers.py writes" in err
  assert "CPU 9.9%" in err
  assert copy.read_text() == edited


@pytest.mark.slow  # the cheap facts trace the 16 published models (~20 s)
def test_hand_text_outside_the_markers_is_left_untouched(tmp_path, facts):
  """The README with its blocks stale (renamed to the cheap blocks, to stay fast): a rewrite
  renders the blocks anew and leaves every byte outside them as it was."""
  text = README.read_text()
  names = iter(["validation", "published"])
  stale = numbers.BLOCK.sub(
      lambda m: f"<!--experiments/readme_numbers.py:{next(names)}-->\nstale 1.0%\n{m.group(4)}",
      text)
  copy = tmp_path / "README.md"
  copy.write_text(stale)
  assert numbers.main([str(copy)]) == 0
  new = copy.read_text()
  assert outside(new) == outside(text)
  assert outside(text).count("<generated block>") == 2
  assert numbers.blocks(new) == {n: numbers.render_block(n, facts)
                                 for n in ("validation", "published")}
  assert numbers.main(["--check", str(copy)]) == 0


def test_unknown_block_is_one_error_line(tmp_path, capsys):
  copy = tmp_path / "README.md"
  copy.write_text("hand\n<!--experiments/readme_numbers.py:nope-->\nx\n<!--/numbers-->\n")
  assert numbers.main(["--check", str(copy)]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "unknown generated block 'nope'" in err


@pytest.mark.slow
def test_readme_is_what_the_generator_writes(facts):
  """Every block, predicted and simulated rows too (a cold graph cache traces six zoo models)."""
  text = README.read_text()
  assert numbers.stale_line(text, facts) is None
  assert numbers.rewrite(text, facts) == text


@pytest.mark.slow
def test_check_fails_on_an_edited_predicted_number(tmp_path, capsys):
  copy = tmp_path / "README.md"
  shutil.copy(README, copy)
  copy.write_text(copy.read_text().replace("1.52x", "1.62x", 1))
  assert numbers.main(["--check", str(copy)]) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "1.62x" in err
