"""Training batches: seeded synthetic data, .npz arrays and image folders, loaded per device.

Every source is deterministic in the step index (so a resumed run sees the same batches) and
independent of the plan: inputs land directly on the first stage's batch sharding and labels
on the last stage's, each device producing or reading only its own samples. Synthetic data
is drawn on the devices (threefry is partitionable, so values do not depend on sharding);
file data is read on the host per device shard with jax.make_array_from_callback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from dp_jax.base.errors import UserError

SOURCES = ("synthetic", "npz", "folder")
IMAGE_SUFFIXES = (".png", ".npy")
Reader = Callable[[np.ndarray], np.ndarray]  # sample indices -> stacked samples


@dataclass(frozen=True, eq=False)
class DataSource:
  """Where batches come from: per-sample specs and either a generator or host readers."""

  kind: str
  x_shape: tuple[int, ...]  # per sample
  x_dtype: str
  y_shape: tuple[int, ...]
  num_labels: int  # classes, or vocabulary size for token models
  seed: int = 0
  num_samples: int | None = None  # None: synthetic (unbounded)
  read_x: Reader | None = None
  read_y: Reader | None = None
  image_prefix: int = 0  # token inputs: pixel values (0-255) before the token ids (a VLM)

  @property
  def tokens(self) -> bool:
    return jnp.issubdtype(self.x_dtype, jnp.integer)


def make_source(kind: str, model, *, path: str | None = None, seed: int = 0) -> DataSource:
  """The data source `kind` (synthetic | npz | folder) shaped for `model`."""
  if kind not in SOURCES:
    raise UserError(f"unknown data source '{kind}' (valid: {', '.join(SOURCES)})")
  if kind == "synthetic":
    return synthetic(model, seed=seed)
  if not path:
    raise UserError(f"data source '{kind}' needs a path; set data.path=<file or folder>")
  return from_npz(path, model, seed=seed) if kind == "npz" else from_folder(path, model, seed=seed)


def synthetic(model, *, seed: int = 0) -> DataSource:
  """Random inputs and labels (tokens: next-token labels of one random sequence, after
  `model.image_prefix` random pixel values if the model reads an image before its tokens)."""
  x, y = model.input_spec(1), model.label_spec(1)
  return DataSource("synthetic", tuple(x.shape[1:]), str(x.dtype), tuple(y.shape[1:]),
                    _num_labels(model), seed, image_prefix=int(getattr(model, "image_prefix", 0)))


def from_npz(path: str | Path, model, *, seed: int = 0) -> DataSource:
  """Arrays x (N, ...) and y (N, ...) from an .npz file; uint8 images are scaled to [0, 1]."""
  path = Path(path)
  if not path.is_file():
    raise UserError(f"data file not found: {path}")
  try:
    with np.load(path) as f:
      if "x" not in f or "y" not in f:
        raise UserError(f"{path} must hold arrays 'x' and 'y', found {', '.join(f.files)}")
      x, y = f["x"], f["y"]
  except (ValueError, OSError) as e:
    raise UserError(f"{path} is not a readable .npz file: {e}") from None
  src = synthetic(model, seed=seed)
  x = _as_inputs(x, src, str(path))
  y = _as_labels(y, src, str(path), len(x))
  return DataSource("npz", src.x_shape, src.x_dtype, src.y_shape, src.num_labels, seed, len(x),
                    lambda ids: x[ids], lambda ids: y[ids], src.image_prefix)


def from_folder(path: str | Path, model, *, seed: int = 0) -> DataSource:
  """Images in one subfolder per class (sorted names = labels), as .png or .npy (H, W, 3)."""
  path = Path(path)
  if not path.is_dir():
    raise UserError(f"image folder not found: {path}")
  classes = sorted(p.name for p in path.iterdir() if p.is_dir())
  files = [(f, i) for i, c in enumerate(classes) for f in sorted((path / c).iterdir())
           if f.suffix.lower() in IMAGE_SUFFIXES]
  src = synthetic(model, seed=seed)
  if src.tokens:
    raise UserError("an image folder cannot feed a token model; use data.source=npz")
  if not files:
    raise UserError(f"{path} has no class subfolders with {' or '.join(IMAGE_SUFFIXES)} images")
  if len(classes) > src.num_labels:
    raise UserError(f"{path} has {len(classes)} classes but the model has {src.num_labels}; "
                    f"set model.num_classes={len(classes)}")
  labels = np.array([i for _, i in files], dtype=np.int32)

  def read_x(ids: np.ndarray) -> np.ndarray:
    return np.stack([_read_image(files[i][0], src) for i in ids])

  return DataSource("folder", src.x_shape, src.x_dtype, src.y_shape, src.num_labels, seed,
                    len(files), read_x, lambda ids: labels[ids])


def sample_ids(num_samples: int, seed: int, step: int, global_batch: int) -> np.ndarray:
  """The dataset rows of batch `step`: consecutive positions of a per-epoch shuffle."""
  pos = np.arange(step * global_batch, (step + 1) * global_batch, dtype=np.int64)
  epochs, offsets = np.divmod(pos, num_samples)
  out = np.empty_like(pos)
  for e in np.unique(epochs):
    perm = _permutation(num_samples, seed, int(e))
    out[epochs == e] = perm[offsets[epochs == e]]
  return out


def batch_at(src: DataSource, step: int, global_batch: int, x_sharding: NamedSharding,
             y_sharding: NamedSharding) -> tuple[jax.Array, jax.Array]:
  """Batch `step`: inputs on `x_sharding`, labels on `y_sharding` (each device: own samples)."""
  x_shape = (global_batch, *src.x_shape)
  y_shape = (global_batch, *src.y_shape)
  if src.kind == "synthetic":
    gen_x, gen_y = _generators(src, global_batch, x_sharding, y_sharding)
    return gen_x(step), gen_y(step)
  ids = sample_ids(src.num_samples, src.seed, step, global_batch)
  return (_host_array(x_shape, x_sharding, ids, src.read_x, src.x_dtype),
          _host_array(y_shape, y_sharding, ids, src.read_y, "int32"))


def _host_array(shape, sharding, ids: np.ndarray, read: Reader, dtype: str) -> jax.Array:
  def shard(index):
    rows = ids[index[0]]
    return read(rows)[(slice(None), *index[1:])]

  # dtype: a process holding none of the sharding's devices reads nothing
  return jax.make_array_from_callback(shape, sharding, shard, dtype=np.dtype(dtype))


@lru_cache(maxsize=16)
def _generators(src: DataSource, global_batch: int, x_sharding, y_sharding):
  """Jitted per-step generators of x and y, each computing only its devices' shards."""
  key = jax.random.key(src.seed)

  if src.tokens:
    prefix = src.image_prefix
    seq = src.x_shape[0] - prefix

    def tokens(step):
      k = jax.random.fold_in(key, step)
      return jax.random.randint(k, (global_batch, seq + 1), 0, src.num_labels, src.x_dtype)

    def inputs(step):
      if not prefix:
        return tokens(step)[:, :-1]
      k = jax.random.fold_in(jax.random.fold_in(key, step), 1)
      pixels = jax.random.randint(k, (global_batch, prefix), 0, 256, src.x_dtype)
      return jnp.concatenate([pixels, tokens(step)[:, :-1]], axis=1)

    return (jax.jit(inputs, out_shardings=x_sharding),
            jax.jit(lambda s: tokens(s)[:, 1:].astype(jnp.int32), out_shardings=y_sharding))

  def images(step):
    k = jax.random.fold_in(key, step)
    return jax.random.normal(jax.random.fold_in(k, 0), (global_batch, *src.x_shape), src.x_dtype)

  def labels(step):
    k = jax.random.fold_in(jax.random.fold_in(key, step), 1)
    return jax.random.randint(k, (global_batch, *src.y_shape), 0, src.num_labels, jnp.int32)

  return (jax.jit(images, out_shardings=x_sharding), jax.jit(labels, out_shardings=y_sharding))


@lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(num_samples)


def _num_labels(model) -> int:
  n = getattr(model, "num_classes", None) or getattr(model, "vocab_size", None)
  if not n:
    raise UserError(f"model {type(model).__name__} has neither num_classes nor vocab_size")
  return int(n)


def _as_inputs(x: np.ndarray, src: DataSource, where: str) -> np.ndarray:
  if tuple(x.shape[1:]) != src.x_shape:
    raise UserError(f"{where}: x has samples of shape {tuple(x.shape[1:])} but the model reads "
                    f"{src.x_shape}; resize the data or set the model size to match")
  if len(x) == 0:
    raise UserError(f"{where}: x holds no samples")
  if src.tokens:
    if not np.issubdtype(x.dtype, np.integer):
      raise UserError(f"{where}: token inputs x must be integers, got {x.dtype}")
    p = src.image_prefix
    if p and (x[:, :p].min() < 0 or x[:, :p].max() > 255):
      raise UserError(f"{where}: the first {p} values of each x are pixel values of the model's "
                      f"image and must lie in [0, 255], found [{x[:, :p].min()}, "
                      f"{x[:, :p].max()}]")
    _check_range(x[:, p:], src.num_labels, where, "x")
  elif x.dtype == np.uint8:
    return (x / 255.0).astype(src.x_dtype)
  return x.astype(src.x_dtype)


def _as_labels(y: np.ndarray, src: DataSource, where: str, n: int) -> np.ndarray:
  if len(y) != n or tuple(y.shape[1:]) != src.y_shape:
    raise UserError(f"{where}: y has shape {y.shape} but {n} labels of shape {src.y_shape} "
                    "are needed (one per sample of x)")
  if not np.issubdtype(y.dtype, np.integer):
    raise UserError(f"{where}: labels y must be integers, got {y.dtype}")
  _check_range(y, src.num_labels, where, "y")
  return y.astype(np.int32)


def _check_range(a: np.ndarray, n: int, where: str, name: str) -> None:
  if a.size and (a.min() < 0 or a.max() >= n):
    raise UserError(f"{where}: {name} values must lie in [0, {n}), found [{a.min()}, {a.max()}]; "
                    "check the model's num_classes / vocab_size")


def _read_image(path: Path, src: DataSource) -> np.ndarray:
  if path.suffix.lower() == ".npy":
    a = np.load(path)
  else:
    from PIL import Image  # Pillow: only for image files (.npy folders need none)

    with Image.open(path) as im:
      a = np.asarray(im.convert("RGB"))
  if tuple(a.shape) != src.x_shape:
    raise UserError(f"{path}: image of shape {tuple(a.shape)}, the model reads {src.x_shape}; "
                    "resize the images or set model.image_size to match")
  return (a / 255.0).astype(src.x_dtype) if a.dtype == np.uint8 else a.astype(src.x_dtype)
