"""Moving arrays between stage meshes, also when the two device sets live on other processes.

One process: `jax.device_put` (a copy between devices, or a no-op on the same device set).
Several processes (jax.distributed): `jax.device_put` handles a move only when source and target
have the same device set; JAX 0.12's cross-host device_put for different device sets needs
identical shard layouts and a DCN transfer server (see docs/multihost.md). Every other move runs
as one jit program over the union U of both device sets: each device of U contributes one block
(its shard of the source, or zeros), the program assembles the array and cuts the target's
blocks, and XLA's collectives (gloo on CPU, NCCL on GPU) carry the bytes between processes.
Every process calls move() in the same order; a process that owns none of U's devices skips it
and gets an array without local shards.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from dp_jax.runtime import mesh as meshlib


def move(tree: Any, sharding: NamedSharding) -> Any:
  """Every array leaf of `tree` placed on `sharding` (across processes when needed); a tree
  already there is returned as it is (no device_put call)."""
  if jax.process_count() == 1:
    if all(getattr(a, "sharding", None) == sharding for a in jax.tree.leaves(tree)):
      return tree
    return jax.device_put(tree, sharding)
  return jax.tree.map(lambda a: _move_array(a, sharding), tree)


def local_value(a: jax.Array, everywhere: NamedSharding) -> np.ndarray:
  """The full value of `a` on this process; with several processes every one must call it."""
  if jax.process_count() == 1:
    return np.asarray(a)
  return np.asarray(move(a, everywhere).addressable_shards[0].data)


def _move_array(a: jax.Array, dst: NamedSharding) -> jax.Array:
  src = a.sharding
  if not isinstance(src, NamedSharding) or src.device_set == dst.device_set:
    return jax.device_put(a, dst)  # host-side or same devices (device_put reorders)
  prog = _union_program(a.shape, str(a.dtype), src, dst)
  me = jax.process_index()
  if not any(d.process_index == me for d in prog.union):
    return jax.make_array_from_single_device_arrays(a.shape, dst, [], dtype=a.dtype)
  shards = {s.device: s.data for s in a.addressable_shards}
  blocks = [jnp.expand_dims(shards[d], 0) if d in shards else _zeros(prog.src_block, a.dtype, d)
            for d in prog.union if d.process_index == me]
  u = jax.make_array_from_single_device_arrays((len(prog.union), *prog.src_block),
                                               prog.union_sharding, blocks)
  out = jax.block_until_ready(prog.run(u))
  mine = {s.device: s.data for s in out.addressable_shards}
  local = [jnp.squeeze(mine[d], 0) for d in _devices(dst) if d in mine]
  return jax.make_array_from_single_device_arrays(a.shape, dst, local, dtype=a.dtype)


class _UnionProgram:
  """The jitted move src -> dst over the union of both device sets."""

  def __init__(self, shape, dtype, src, dst):
    self.union = list(dict.fromkeys([*_devices(src), *_devices(dst)]))
    pos = {d: i for i, d in enumerate(self.union)}
    self.union_sharding = meshlib.batch_sharding(meshlib.stage_mesh(self.union))
    src_idx = src.devices_indices_map(shape)
    dst_idx = dst.devices_indices_map(shape)
    self.src_block = _block_shape(shape, next(iter(src_idx.values())))
    dst_block = _block_shape(shape, next(iter(dst_idx.values())))
    sources, seen = [], set()
    for d, idx in src_idx.items():
      key = _key(shape, idx)
      if key not in seen:
        seen.add(key)
        sources.append((pos[d], idx))
    targets = [(pos[d], idx) for d, idx in dst_idx.items()]
    n = len(self.union)

    def run(u):
      full = jnp.zeros(shape, dtype)
      for i, idx in sources:
        full = full.at[idx].set(u[i])
      out = jnp.zeros((n, *dst_block), dtype)
      for i, idx in targets:
        out = out.at[i].set(full[idx])
      return out

    self.run = jax.jit(run, out_shardings=self.union_sharding)


@lru_cache(maxsize=512)
def _union_program(shape, dtype, src, dst) -> _UnionProgram:
  return _UnionProgram(shape, dtype, src, dst)


@lru_cache(maxsize=512)
def _zeros(block, dtype, device) -> jax.Array:
  return jax.device_put(np.zeros((1, *block), dtype), device)


def _devices(sharding: NamedSharding) -> list[jax.Device]:
  return list(sharding.mesh.devices.flat)


def _block_shape(shape, idx) -> tuple[int, ...]:
  return tuple(len(range(*s.indices(n))) for s, n in zip(idx, shape, strict=True))


def _key(shape, idx) -> tuple[tuple[int, int, int], ...]:
  return tuple(s.indices(n) for s, n in zip(idx, shape, strict=True))


def replicated_everywhere(devices) -> NamedSharding:
  """A full copy on every one of `devices` (for values every process must read)."""
  return NamedSharding(meshlib.stage_mesh(devices), PartitionSpec())
