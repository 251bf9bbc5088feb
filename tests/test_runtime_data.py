"""Data sources: deterministic by step, plan-independent, each device loading its own rows."""

import re

import jax
import numpy as np
import pytest
from runtime_helpers import TINY_GPT2

from dp_jax.base.errors import UserError
from dp_jax.models.zoo import build_model
from dp_jax.runtime import data as datalib
from dp_jax.runtime import mesh as meshlib


@pytest.fixture(scope="module")
def image_model():
  return build_model("vgg16", image_size=32, num_classes=10, abstract=True)


@pytest.fixture(scope="module")
def token_model():
  return build_model("gpt2_small", **TINY_GPT2, abstract=True)


def shardings(*device_lists):
  return [meshlib.batch_sharding(meshlib.stage_mesh([jax.devices()[i] for i in d]))
          for d in device_lists]


def test_synthetic_batches_are_deterministic_and_plan_independent(image_model):
  src = datalib.synthetic(image_model, seed=3)
  one, four, two = shardings([0], [0, 1, 2, 3], [6, 7])
  x1, y1 = datalib.batch_at(src, 5, 8, one, one)
  x4, y2 = datalib.batch_at(src, 5, 8, four, two)
  assert x1.shape == (8, 32, 32, 3) and y1.shape == (8,) and y1.dtype == np.int32
  np.testing.assert_array_equal(x1, x4)
  np.testing.assert_array_equal(y1, y2)
  assert x4.sharding == four and y2.sharding == two
  assert not np.array_equal(x1, datalib.batch_at(src, 6, 8, one, one)[0])
  assert int(np.max(y1)) < 10


def test_synthetic_tokens_label_the_next_token(token_model):
  src = datalib.synthetic(token_model)
  x, y = datalib.batch_at(src, 0, 4, *shardings([0, 1], [2, 3]))
  assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == np.int32
  np.testing.assert_array_equal(np.asarray(x)[:, 1:], np.asarray(y)[:, :-1])


def test_sample_ids_shuffle_each_epoch_deterministically():
  ids = np.concatenate([datalib.sample_ids(10, 0, s, 4) for s in range(5)])  # 2 epochs
  assert sorted(ids[:10]) == list(range(10)) and sorted(ids[10:20]) == list(range(10))
  assert not np.array_equal(ids[:10], ids[10:20])
  np.testing.assert_array_equal(datalib.sample_ids(10, 0, 3, 4), ids[12:16])


def test_npz_rows_are_read_per_device(tmp_path, image_model):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
  y = rng.integers(0, 10, (12,))
  np.savez(tmp_path / "d.npz", x=x, y=y)
  src = datalib.make_source("npz", image_model, path=str(tmp_path / "d.npz"), seed=1)
  calls = []
  read_x = src.read_x
  src = datalib.DataSource(**{**src.__dict__, "read_x": lambda ids: calls.append(ids) or
                              read_x(ids)})
  xs, ys = datalib.batch_at(src, 2, 8, *shardings([0, 1, 2, 3], [4, 5]))
  ids = datalib.sample_ids(12, 1, 2, 8)
  np.testing.assert_allclose(xs, x[ids] / 255.0, rtol=1e-6)
  np.testing.assert_array_equal(ys, y[ids])
  assert sorted(len(c) for c in calls) == [2, 2, 2, 2]  # each device read its own two rows
  np.testing.assert_array_equal(np.concatenate(calls), ids)


def test_folder_of_png_and_npy_images(tmp_path, image_model):
  from PIL import Image

  rng = np.random.default_rng(0)
  for c, name in enumerate(["cat", "dog"]):
    (tmp_path / name).mkdir()
    for i in range(2):
      img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
      Image.fromarray(img).save(tmp_path / name / f"{i}.png")
    np.save(tmp_path / name / "2.npy", np.full((32, 32, 3), c, np.float32))
  src = datalib.make_source("folder", image_model, path=str(tmp_path))
  assert src.num_samples == 6
  ids = datalib.sample_ids(6, 0, 0, 6)
  xs, ys = datalib.batch_at(src, 0, 6, *shardings([0, 1, 2], [0]))
  want = [0, 0, 0, 1, 1, 1]
  np.testing.assert_array_equal(ys, [want[i] for i in ids])
  npy = [k for k, i in enumerate(ids) if i in (2, 5)]
  np.testing.assert_allclose(np.asarray(xs)[npy].max(axis=(1, 2, 3)), [want[ids[k]] for k in npy])


@pytest.mark.parametrize("arrays, message", [
    (dict(x=np.zeros((4, 16, 16, 3)), y=np.zeros(4, int)), "samples of shape (16, 16, 3)"),
    (dict(x=np.zeros((4, 32, 32, 3)), y=np.full(4, 10)), "values must lie in [0, 10)"),
    (dict(x=np.zeros((4, 32, 32, 3)), y=np.zeros(3, int)), "one per sample of x"),
    (dict(x=np.zeros((4, 32, 32, 3))), "must hold arrays 'x' and 'y'"),
])
def test_bad_npz_files_are_one_line_errors(tmp_path, image_model, arrays, message):
  np.savez(tmp_path / "d.npz", **arrays)
  with pytest.raises(UserError, match=re.escape(message)):
    datalib.make_source("npz", image_model, path=str(tmp_path / "d.npz"))


def test_bad_sources_are_one_line_errors(tmp_path, image_model):
  with pytest.raises(UserError, match="unknown data source 'csv'"):
    datalib.make_source("csv", image_model)
  with pytest.raises(UserError, match="needs a path"):
    datalib.make_source("npz", image_model)
  with pytest.raises(UserError, match="no class subfolders"):
    datalib.make_source("folder", image_model, path=str(tmp_path))
  (tmp_path / "a").mkdir()
  np.save(tmp_path / "a" / "x.npy", np.zeros((8, 8, 3), np.float32))
  src = datalib.make_source("folder", image_model, path=str(tmp_path))
  one = shardings([0])[0]
  with pytest.raises(UserError, match=r"image of shape \(8, 8, 3\), the model reads"):
    datalib.batch_at(src, 0, 1, one, one)
