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


# --- integrity: each save records its step and a checksum of every array ---------------------


def saved_steps(tmp_path):
  import jax.numpy as jnp

  from dp_jax.runtime import checkpoint as ckpt

  state = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(3, jnp.bfloat16),
           "n": jnp.array(3, jnp.int32)}
  manager = ckpt.open_manager(tmp_path / "checkpoints", ckpt.state_signature("m", state))
  for step in (2, 4):
    ckpt.save(manager, step, jax_tree_add(state, step))
  ckpt.finish(manager)
  return state


def jax_tree_add(state, k):
  import jax

  return jax.tree.map(lambda a: a + k, state)


def restored(tmp_path, like):
  from dp_jax.runtime import checkpoint as ckpt

  manager = ckpt.open_manager(tmp_path / "checkpoints", ckpt.state_signature("m", like))
  manager, got = ckpt.restore_newest_good(manager, like)
  manager.close()
  return got


def test_a_checksum_sees_one_flipped_bit_and_moved_data():
  import jax.numpy as jnp

  from dp_jax.runtime.checkpoint import checksums

  a = jnp.arange(64, dtype=jnp.float32)
  flipped = a.view(jnp.uint32).at[7].set(a.view(jnp.uint32)[7] ^ 1).view(jnp.float32)
  swapped = a.at[3].set(a[4]).at[4].set(a[3])
  sums = [checksums({"a": x})["['a']"] for x in (a, flipped, swapped)]
  assert len(set(sums)) == 3
  assert checksums({"a": a}) == checksums({"a": a + 0})  # the same bits, the same sum


def test_a_step_folder_copied_over_another_is_named_and_the_one_before_restored(tmp_path):
  import shutil

  state = saved_steps(tmp_path)
  shutil.rmtree(tmp_path / "checkpoints" / "4")
  shutil.copytree(tmp_path / "checkpoints" / "2", tmp_path / "checkpoints" / "4")
  shutil.copytree(tmp_path / "checkpoints" / "2", tmp_path / "checkpoints" / "3")
  step, got = restored(tmp_path, state)
  assert step == 2 and float(got["w"][0, 0]) == 2.0
  assert sorted(p.name for p in (tmp_path / "checkpoints.damaged").iterdir()) == ["3", "4"]


def test_a_step_without_its_arrays_is_named_and_the_others_still_restore(tmp_path):
  """Without an explicit item handler orbax read every step as several items once one step
  folder lost its `default`, and every checkpoint was called damaged."""
  import shutil

  state = saved_steps(tmp_path)
  shutil.rmtree(tmp_path / "checkpoints" / "4" / "default")
  step, got = restored(tmp_path, state)
  assert step == 2 and float(got["n"]) == 5


def test_checksum_damage_names_the_array_data_folder(tmp_path):
  from dp_jax.runtime.checkpoint import CheckpointDamaged, _verify

  step = step_folder(tmp_path)
  (step / "default" / "ocdbt.process_0" / "d").mkdir(parents=True)
  try:
    _verify(step, {"['w']": "00", "['b']": "11"}, {"['w']": "01", "['b']": "11"})
  except CheckpointDamaged as e:
    said = damage(step, e)
  assert said == (f"{step / 'default' / 'ocdbt.process_0' / 'd'}: the data of ['w'] differs "
                  "from what was saved (checksum mismatch)")
