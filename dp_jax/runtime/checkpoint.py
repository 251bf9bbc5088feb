"""Orbax checkpoints of the per-layer train state (plan-independent), with a compatibility file.

Layout of a checkpoint folder: one orbax step folder per save (`<step>/`) holding
{"params", "stats", "opt"} keyed by layer name, and `dp_jax_checkpoint.json` naming the model
and every array's shape and dtype. The state is stored per layer, not per stage, so a run may
resume under a different plan; arrays are restored straight onto the current plan's meshes.

Integrity: orbax checks no array data on restore (its zarr chunks carry no checksum), so each
save records, in the step's own orbax metadata (`custom_metadata`), its step and a checksum of
every array (`checksums`, computed on device); a restore recomputes them and refuses a step
whose data changed or that holds another step's checkpoint (a folder copied over another).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dp_jax.base.errors import UserError
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
  directory = Path(directory).resolve()
  check_compatible(directory, signature)
  directory.mkdir(parents=True, exist_ok=True)
  meta = directory / META_FILE
  if not meta.exists() and distributed.process_index() == 0:
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(signature, indent=1))
    tmp.replace(meta)
  return _new_manager(directory, max_to_keep)


def _new_manager(directory: Path, max_to_keep: int = 2):
  import orbax.checkpoint as ocp  # orbax: only when a run checkpoints (its import is slow)

  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         cleanup_tmp_directories=True)
  # one item, named: without it orbax guesses the items from the step folders, and one folder
  # missing its `default` makes every step read as several items ("Must provide Composite")
  return ocp.CheckpointManager(directory, options=options,
                               item_handlers=ocp.StandardCheckpointHandler())


def save(manager, step: int, state: Any, everywhere=None) -> None:
  """Save `state` as checkpoint `step` (async write; arrays are copied off device first).

  everywhere (several processes): a sharding over all devices; arrays of stages on one
  process's devices are saved from a copy there (orbax refuses process-local arrays).
  """
  import orbax.checkpoint as ocp  # orbax: only when a run checkpoints (its import is slow)

  portable = _portable(state, everywhere)
  record = {INTEGRITY_KEY: {"step": step, "checksums": checksums(portable)}}
  try:
    manager.save(step, args=ocp.args.StandardSave(portable), force=True,
                 custom_metadata=record)
  except Exception as e:  # noqa: BLE001 - a failed write (full disk, ...) as one line
    raise UserError(f"could not write checkpoint step {step} in {manager.directory}: "
                    f"{_first_line(e)}; the checkpoints already written are kept") from e


def finish(manager, failing: bool = False) -> None:
  """Wait for the pending saves and close; a failed save becomes a one-line UserError
  (failing: another error is already on its way, so this one is only logged)."""
  try:
    manager.wait_until_finished()
  except Exception as e:  # noqa: BLE001
    error = UserError(f"could not write a checkpoint in {manager.directory}: {_first_line(e)}; "
                      "the checkpoints already written are kept")
    if not failing:
      raise error from e
    logging.getLogger(__name__).warning("%s", error)
  finally:
    manager.close()


def restore_newest_good(manager, like: Any, everywhere=None):
  """(manager, (step, state) or None) from the newest checkpoint that restores.

  A damaged checkpoint (cut or corrupted files) is named in a warning and moved to
  `<folder>.damaged/<step>` (kept, out of orbax's way), and the one before it is used; when
  every checkpoint is damaged, a one-line UserError names them and nothing is moved. The
  manager is reopened after a move (it caches its steps).
  """
  directory = Path(manager.directory)
  damaged: list[tuple[int, str]] = []
  restored, step = None, None
  with _abandoned_reads_dropped() as state:
    for step in sorted(manager.all_steps(), reverse=True):
      try:
        restored = _restore(manager, step, like, everywhere)
        break
      except Exception as e:  # noqa: BLE001 - orbax reports damage as many exception types
        damaged.append((step, damage(directory / str(step), e)))
        if not isinstance(e, CheckpointDamaged) or e.__cause__ is not None:
          # orbax's reads failed (restoring, or reading the step's metadata): some are abandoned
          state["failed"] = True
          _quiet_abandoned_tasks()
    # every checkpoint damaged: the run ends with one error line, and the abandoned reads may
    # still print until the process exits (at exit, on a loaded machine): fd 2 stays closed to
    # them, Python's own output goes on to the terminal
    state["keep"] = restored is None and bool(damaged) and state["failed"]
  if restored is not None:
    if damaged:
      log = logging.getLogger(__name__)
      aside = directory.with_name(directory.name + ".damaged")
      for bad, why in damaged:
        log.warning("checkpoint step %d in %s is damaged (%s); resuming from step %d, the "
                    "damaged one moved to %s", bad, directory, why, step, aside / str(bad))
      manager = _move_aside(manager, [bad for bad, _ in damaged], aside)
    return manager, (step, restored)
  if damaged:
    listed = "; ".join(f"step {st}: {why}" for st, why in damaged)
    raise UserError(f"every checkpoint in {directory} is damaged ({listed}); move the folder "
                    "away to start the run afresh")
  return manager, None


# the lines of those tracebacks; threads interleave them ("RuntimeErrorTraceback ...", a line
# cut in two), so a line is dropped when nothing but these pieces and punctuation remain
ABANDONED_READ_LINE_MARKS = ("asyncio/base_events.py", "call_soon_threadsafe", "_check_closed")
ABANDONED_READ_PIECES = ("Traceback (most recent call last)", "raise RuntimeError",
                         "RuntimeError", "Event loop is closed", "self.", "()", "('", "')")
# after a failed restore, fd 2 stays redirected until the abandoned reads have been quiet for
# ABANDONED_READ_QUIET_S (they finish late on a loaded machine), at most ABANDONED_READ_WAIT_S
ABANDONED_READ_QUIET_S = 1.5
ABANDONED_READ_WAIT_S = 30.0


def _abandoned_read_line(line: str) -> bool:
  if any(m in line for m in ABANDONED_READ_LINE_MARKS):
    return True
  rest = line
  for piece in ABANDONED_READ_PIECES:
    rest = rest.replace(piece, "")
  return not any(c.isalnum() for c in rest)


@contextlib.contextmanager
def _abandoned_reads_dropped():
  """fd 2 through a file while restoring: after a failed restore, tensorstore still completes
  the reads orbax abandoned, and each callback prints a traceback from native code ("Event loop
  is closed"); those lines are dropped (the damage is named once), everything else is kept."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as f:
    os.dup2(f.fileno(), 2)
    state = {"failed": False, "keep": False}
    try:
      yield state
    finally:
      if state["failed"] and not state["keep"]:
        _wait_quiet(f)
      sys.stderr.flush()
      if state["keep"]:  # fd 2 to nothing for the rest of the process; sys.stderr to the terminal
        sink = os.open(os.devnull, os.O_WRONLY)
        os.dup2(sink, 2)
        os.close(sink)
        sys.stderr = _FilteredStderr(os.fdopen(saved, "w", buffering=1))
      else:
        os.dup2(saved, 2)
        os.close(saved)
      f.seek(0)
      for line in f.read().decode(errors="replace").splitlines():
        if not _abandoned_read_line(line):
          print(line, file=sys.stderr)


def _wait_quiet(f) -> None:
  """Until nothing was written to `f` for ABANDONED_READ_QUIET_S (or ABANDONED_READ_WAIT_S)."""
  start = last_change = time.monotonic()
  size = os.fstat(f.fileno()).st_size
  while time.monotonic() - last_change < ABANDONED_READ_QUIET_S:
    if time.monotonic() - start > ABANDONED_READ_WAIT_S:
      return
    time.sleep(0.1)
    now = os.fstat(f.fileno()).st_size
    if now != size:
      size, last_change = now, time.monotonic()


class _FilteredStderr:
  """sys.stderr without the abandoned reads' traceback lines (whole lines passed on or dropped;
  everything else is the stream's): after every checkpoint failed to restore, until the process
  exits."""

  def __init__(self, stream):
    self._stream, self._partial = stream, ""

  def write(self, text: str) -> int:
    lines = (self._partial + text).split("\n")
    self._partial = lines.pop()
    for line in lines:
      if not _abandoned_read_line(line):
        self._stream.write(line + "\n")
    return len(text)

  def flush(self) -> None:
    if self._partial and not _abandoned_read_line(self._partial):
      self._stream.write(self._partial)
      self._partial = ""
    self._stream.flush()

  def __getattr__(self, name: str):
    return getattr(self._stream, name)


class _AbandonedTasks:
  """A filter for asyncio's "exception was never retrieved" records: the read tasks a failed
  restore left behind report the same damage again when they are collected, later and on the
  logging path (fd 2 is no longer redirected then); the damage was named once already."""

  def filter(self, record) -> bool:
    return "exception was never retrieved" not in record.getMessage()


_ABANDONED_TASKS = _AbandonedTasks()


def _quiet_abandoned_tasks() -> None:
  logger = logging.getLogger("asyncio")
  if _ABANDONED_TASKS not in logger.filters:
    logger.addFilter(_ABANDONED_TASKS)


def _restore(manager, step: int, like: Any, everywhere) -> Any:
  import orbax.checkpoint as ocp  # orbax: only when a run checkpoints (its import is slow)

  step_dir = Path(manager.directory) / str(step)
  missing = [step_dir / n for n in ("default", "default/_METADATA") if not (step_dir / n).exists()]
  if missing:  # before orbax, which names no file for it
    raise CheckpointDamaged(f"{missing[0]}: missing")
  recorded = _recorded(manager, step)
  if recorded is not None and recorded.get("step") != step:
    raise CheckpointDamaged(f"{step_dir}: holds the checkpoint of step {recorded.get('step')}, "
                            f"not {step} (a step folder copied over another)")
  abstract = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
      _portable(like, everywhere, copy=False))
  restored = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  if recorded is not None:
    _verify(step_dir, recorded.get("checksums") or {}, checksums(restored))
  if everywhere is None:
    return restored
  return jax.tree.map(lambda r, a: transfer.move(r, a.sharding), restored, like)


# --- integrity: what each save records of itself, checked on restore -------------------------

INTEGRITY_KEY = "dp_jax"  # in the step's orbax custom_metadata: {"step", "checksums"}


class CheckpointDamaged(Exception):
  """A step that restored but is not what was saved (damage() names the file)."""


def checksums(state: Any) -> dict[str, str]:
  """Per array (its key path) a 64-bit checksum of its bits, computed on its own devices (a
  collective where an array spans processes): two sums over its elements, as unsigned words,
  weighted by odd multiples of the element's position, so a flipped bit or moved data changes
  them. Not cryptographic: it finds damage, not tampering."""
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  sums = {jax.tree_util.keystr(p): _checksum(a) for p, a in flat}
  return {k: f"{int(v[0]):08x}{int(v[1]):08x}" for k, v in jax.device_get(sums).items()}


@jax.jit
def _checksum(a):
  x = a.astype(jnp.uint8) if a.dtype == jnp.bool_ else a
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  x = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
  position = jnp.zeros(x.shape, jnp.uint32)
  for axis in range(x.ndim):  # the element's position in row-major order, as uint32
    stride = int(np.prod(x.shape[axis + 1:], dtype=np.int64)) & 0xFFFFFFFF
    position = position + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * np.uint32(stride)
  odd = position * np.uint32(2) + np.uint32(1)
  spread = position * np.uint32(0x9E3779B1) | np.uint32(1)
  return jnp.stack([jnp.sum(x * odd, dtype=jnp.uint32),
                    jnp.sum((x ^ position) * spread, dtype=jnp.uint32)])


def _recorded(manager, step: int) -> dict[str, Any] | None:
  """What the save of `step` recorded of itself (None: a checkpoint from before records)."""
  try:
    custom = manager.metadata(step).custom_metadata or {}
  except Exception as e:  # noqa: BLE001 - a damaged metadata file is named by damage()
    raise CheckpointDamaged(f"{Path(manager.directory) / str(step) / '_CHECKPOINT_METADATA'}: "
                            f"{type(e).__name__}: {_telling_line(e)}") from e
  record = custom.get(INTEGRITY_KEY)
  return record if isinstance(record, dict) else None


def _verify(step_dir: Path, saved: dict[str, str], now: dict[str, str]) -> None:
  changed = [k for k in now if k in saved and saved[k] != now[k]]
  if changed:
    data = sorted(step_dir.glob("default/ocdbt.process_*/d")) or [step_dir / "default"]
    more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
    raise CheckpointDamaged(f"{data[0]}: the data of {changed[0]}{more} differs from what was "
                            "saved (checksum mismatch)")


def _move_aside(manager, steps: list[int], aside: Path):
  """Move step folders to `aside` (process 0) and reopen the manager on the same folder."""
  directory = Path(manager.directory)
  max_to_keep = manager._options.max_to_keep  # noqa: SLF001 - reopened with the same count
  manager.close()
  if distributed.process_index() == 0:
    aside.mkdir(parents=True, exist_ok=True)
    for step in steps:
      target = aside / str(step)
      if target.exists():
        target = aside / f"{step}.{len(list(aside.iterdir()))}"
      (directory / str(step)).rename(target)
  return _new_manager(directory, max_to_keep)


# the files of an orbax step folder that hold JSON (the rest is tensorstore's binary data)
JSON_FILES = ("_CHECKPOINT_METADATA", "_METADATA", "_sharding")


def damage(step_dir: Path, e: BaseException) -> str:
  """What is wrong with a checkpoint step that did not restore, in one line: the file (the one
  the error names, else the first JSON file that does not parse or empty file found) and the
  damage (the error's type and its most telling line)."""
  if isinstance(e, CheckpointDamaged):
    return str(e)
  text = " ".join(str(e).split())
  named = [n for n in re.findall(re.escape(str(step_dir)) + r"[^\s\"',)]*", text)
           if Path(n).is_file()]
  files = named or [str(f) for f in damaged_files(step_dir)]
  where = files[0] if files else f"{step_dir} (a file of its array data)"
  return f"{where}: {type(e).__name__}: {_telling_line(e)}"


def damaged_files(step_dir: Path) -> list[Path]:
  """The files of a step folder that are visibly damaged: empty, or JSON that does not parse."""
  out = []
  for f in sorted(p for p in step_dir.rglob("*") if p.is_file()):
    if f.stat().st_size == 0:
      out.append(f)
    elif f.name in JSON_FILES or f.parent.name == "array_metadatas":
      try:
        json.loads(f.read_bytes())
      except (ValueError, UnicodeDecodeError):
        out.append(f)
  return out


def _telling_line(e: BaseException) -> str:
  """The error's line with the most words (tensorstore's 'See full details: <...>' tail and
  object reprs cut), at most 160 characters."""
  lines = [re.sub(r"<[^<>]*>", "", ln.split("See full TensorStore details")[0]).strip(" .:")
           for ln in str(e).splitlines()]
  best = max(lines, key=lambda ln: len(re.findall(r"[A-Za-z]{2,}", ln)), default="")
  best = best or type(e).__name__
  return best if len(best) <= 160 else best[:157] + "..."


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  line = text[0] if text else type(e).__name__
  return line if len(line) <= 160 else line[:157] + "..."


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
