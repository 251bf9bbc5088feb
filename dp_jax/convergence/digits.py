"""scikit-learn's bundled handwritten digits (8x8, 10 classes) as a seeded train/test split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IMAGE_SIZE = 8
NUM_CLASSES = 10
TEST_FRACTION = 0.2  # 1,797 images -> 1,437 train, 360 test
PIXEL_MAX = 16.0  # the UCI digits store pixel counts 0..16 (load_digits' DESCR)


@dataclass(frozen=True)
class Split:
  """Train and test images (N x 8 x 8 x 1 float32 in [0, 1]) and labels (N int32)."""

  x_train_Nx8x8x1: np.ndarray
  y_train_N: np.ndarray
  x_test_Mx8x8x1: np.ndarray
  y_test_M: np.ndarray


def load(seed: int = 0) -> Split:
  """The digits split into train/test, stratified by class, with a fixed seed."""
  # scikit-learn (and scipy under it): only to load the data, not to name its Split
  from sklearn.datasets import load_digits
  from sklearn.model_selection import train_test_split

  digits = load_digits()  # read from the installed package: no download
  x_NxHxWx1 = (digits.images / PIXEL_MAX).astype(np.float32)[..., None]
  y_N = digits.target.astype(np.int32)
  x_tr, x_te, y_tr, y_te = train_test_split(x_NxHxWx1, y_N, test_size=TEST_FRACTION,
                                            random_state=seed, stratify=y_N)
  return Split(x_tr, y_tr, x_te, y_te)
