"""On-disk timing cache: round trip, key mismatch and corrupt files read as misses."""

from dp_jax.measurement import cache

KEY = {"model": "m", "layer": "conv1", "batch": 4, "backend": "cpu", "dtype": "float32",
       "in_shapes": [[[8, 8, 3], "float32"]], "attrs": cache.attrs_hash({"k": 3})}


def test_roundtrip(tmp_path):
  assert cache.load(tmp_path, KEY) is None
  path = cache.store(tmp_path, KEY, 1.5, 3.0)
  assert path.parent.name == "m"
  assert cache.load(tmp_path, KEY) == (1.5, 3.0)


def test_other_key_misses(tmp_path):
  cache.store(tmp_path, KEY, 1.5, 3.0)
  assert cache.load(tmp_path, {**KEY, "batch": 8}) is None
  assert cache.load(tmp_path, {**KEY, "attrs": cache.attrs_hash({"k": 5})}) is None


def test_corrupt_file_is_a_miss(tmp_path):
  path = cache.store(tmp_path, KEY, 1.5, 3.0)
  path.write_text("{not json")
  assert cache.load(tmp_path, KEY) is None


def test_attrs_hash_is_order_independent():
  assert cache.attrs_hash({"a": 1, "b": [2, 3]}) == cache.attrs_hash({"b": [2, 3], "a": 1})
