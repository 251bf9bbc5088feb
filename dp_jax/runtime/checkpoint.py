"""Orbax checkpoints of the per-layer train state (plan-independent), with a compatibility file.

Layout of a checkpoint folder: one orbax step folder per save (`<step>/`) holding
{"params", "stats", "opt"} keyed by layer name, and `dp_jax_checkpoint.json` naming the model
and every array's shape and dtype. The state is stored per layer, not per stage, so a run may
resume under a different plan; arrays are restored straight onto the current plan's meshes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax

from dp_jax.errors import UserError
from dp_jax.runtime import distributed, transfer

META_FILE = "dp_jax_checkpoint.json"


def state_signature(model: str, state: Any) -> dict[str, Any]:
  """Model name and the shape/dtype of every array of `state`: what a checkpoint must match."""
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  return {"model": model, "arrays": {jax.tree_util.keystr(p): [list(a.shape), str(a.dtype)]
                                     for p, a in flat}}


def check_compatible(directory: str | Path, signature: dict[str, Any]) -> None:
  """Raise UserError if `directory` holds checkpoints of another model or size (reads only)."""
  meta = Path(directory) / META_FILE
  if not meta.is_file():
    return
  try:
    saved = json.loads(meta.read_text())
  except json.JSONDecodeError:
    raise UserError(f"{meta} is corrupt; move the checkpoint folder away to start fresh") from None
  if saved.get("model") != signature["model"]:
    raise UserError(f"{directory} holds checkpoints of model '{saved.get('model')}', not "
                    f"'{signature['model']}'; use another output folder")
  if saved.get("arrays") != signature["arrays"]:
    a, b = saved.get("arrays", {}), signature["arrays"]
    diff = sorted(set(a) ^ set(b)) or sorted(k for k in a if a[k] != b.get(k))
    raise UserError(f"{directory} holds checkpoints of a different {signature['model']} "
                    f"(first difference: {diff[0]}); use another output folder or the same "
                    "model size and optimizer")


def open_manager(directory: str | Path, signature: dict[str, Any], *, max_to_keep: int = 2):
  """An orbax CheckpointManager on `directory`; records the signature file once."""
  import orbax.checkpoint as ocp

  directory = Path(directory).resolve()
  check_compatible(directory, signature)
  directory.mkdir(parents=True, exist_ok=True)
  meta = directory / META_FILE
  if not meta.exists() and distributed.process_index() == 0:
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(signature, indent=1))
    tmp.replace(meta)
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         cleanup_tmp_directories=True)
  return ocp.CheckpointManager(directory, options=options)


def save(manager, step: int, state: Any, everywhere=None) -> None:
  """Save `state` as checkpoint `step` (async write; arrays are copied off device first).

  everywhere (several processes): a sharding over all devices; arrays of stages on one
  process's devices are saved from a copy there (orbax refuses process-local arrays).
  """
  import orbax.checkpoint as ocp

  manager.save(step, args=ocp.args.StandardSave(_portable(state, everywhere)), force=True)


def restore_latest(manager, like: Any, everywhere=None) -> tuple[int, Any] | None:
  """(step, state) of the newest checkpoint, placed like `like`; None if there is none."""
  import orbax.checkpoint as ocp

  step = manager.latest_step()
  if step is None:
    return None
  abstract = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
      _portable(like, everywhere, copy=False))
  restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  if everywhere is None:
    return step, restored
  return step, jax.tree.map(lambda r, a: transfer.move(r, a.sharding), restored, like)


def _portable(state: Any, everywhere, copy: bool = True) -> Any:
  """Arrays that live on one process's devices (several processes) moved to `everywhere`."""
  if everywhere is None:
    return state

  def one(a):
    if len({d.process_index for d in a.sharding.device_set}) > 1:
      return a
    if not copy:
      return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=everywhere)
    return transfer.move(a, everywhere)

  return jax.tree.map(one, state)
