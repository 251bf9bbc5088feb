"""A damaged checkpoint is named by its file and its damage (runtime/checkpoint.py, damage)."""

import json

from dp_jax.runtime.checkpoint import damage, damaged_files


def step_folder(tmp_path):
  step = tmp_path / "checkpoints" / "8"
  (step / "default" / "d").mkdir(parents=True)
  (step / "_CHECKPOINT_METADATA").write_text(json.dumps({"init_timestamp_nsecs": 1}))
  (step / "default" / "_METADATA").write_text(json.dumps({"tree_metadata": {}}))
  (step / "default" / "d" / "0a1b").write_bytes(b"\x00binary")
  (step / "commit_success.txt").write_text("Checkpoint commit was successful")  # not JSON
  return step


def test_a_cut_metadata_file_is_named_whatever_the_error_says(tmp_path):
  step = step_folder(tmp_path)
  (step / "default" / "_METADATA").write_text('{"tree_metadata": {"pa')
  assert damaged_files(step) == [step / "default" / "_METADATA"]
  said = damage(step, RuntimeError("Traceback (most recent call last):\n  })>."))
  assert said.startswith(f"{step / 'default' / '_METADATA'}: RuntimeError")
  assert "})>." not in said


def test_the_file_the_error_names_wins_and_object_reprs_are_cut(tmp_path):
  step = step_folder(tmp_path)
  data = step / "default" / "d" / "0a1b"
  error = ValueError(f'DATA_LOSS: Error reading "params.fc.kernel/.zarray" at local file '
                     f'"{data}"\nSee full TensorStore details: <bound method f of <x at 0x1>>')
  said = damage(step, error)
  assert said.startswith(f"{data}: ValueError: DATA_LOSS: Error reading")
  assert "bound method" not in said and "See full" not in said


def test_an_array_read_error_without_a_file_says_so(tmp_path):
  step = step_folder(tmp_path)
  said = damage(step, Exception("Encountered error while reading array index: (slice(0, 64, 1),)"))
  assert said == (f"{step} (a file of its array data): Exception: Encountered error while "
                  "reading array index: (slice(0, 64, 1),)")
