"""dp_jax/convergence/digits.py: the bundled digits, split train/test by a fixed seed."""

import numpy as np

from dp_jax.convergence import digits


def test_split_sizes_shapes_and_range():
  d = digits.load(0)
  assert d.x_train_Nx8x8x1.shape == (1437, 8, 8, 1) and d.x_test_Mx8x8x1.shape == (360, 8, 8, 1)
  assert d.y_train_N.shape == (1437,) and d.y_test_M.shape == (360,)
  assert d.x_train_Nx8x8x1.dtype == np.float32 and d.y_train_N.dtype == np.int32
  assert d.x_train_Nx8x8x1.min() == 0 and d.x_train_Nx8x8x1.max() == 1
  assert set(d.y_test_M.tolist()) == set(range(10))


def test_split_is_stratified():
  d = digits.load(0)
  train, test = np.bincount(d.y_train_N), np.bincount(d.y_test_M)
  np.testing.assert_allclose(test / train, 360 / 1437, atol=0.02)


def test_same_seed_same_split_other_seed_other_split():
  a, b, c = digits.load(0), digits.load(0), digits.load(1)
  assert np.array_equal(a.x_test_Mx8x8x1, b.x_test_Mx8x8x1)
  assert np.array_equal(a.y_train_N, b.y_train_N)
  assert not np.array_equal(a.y_test_M, c.y_test_M)
  # a split partitions the 1,797 images: no test image is also a training image
  train = {x.tobytes() for x in a.x_train_Nx8x8x1}
  assert sum(x.tobytes() in train for x in a.x_test_Mx8x8x1) < 5  # the set has a few duplicates
