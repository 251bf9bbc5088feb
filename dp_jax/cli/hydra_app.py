"""Hydra entry points: one-line errors, per-job tracking, failed multirun cells recorded."""

from __future__ import annotations

import dataclasses
import errno
import functools
import importlib
import logging
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException, OverrideParseException
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import check_writable, write_json
from dp_jax.base.yamlfile import CONF_DIR
from dp_jax.cli.config_files import FILE_GROUPS as YAML_FILE_GROUPS
from dp_jax.cli.config_files import (
  expand_yaml_overrides,
  named_files,
  one_file,
  quoted,
  unquoted,
)
from dp_jax.cli.schema import check_known_keys, structured, typed
from dp_jax.runtime import distributed
from dp_jax.tracking import run as tracking
from dp_jax.tracking import run_folder
from dp_jax.tracking.sweep_summary import SweepRefused, SweepSummary, swept_options

log = logging.getLogger("dp_jax")

# task(cfg, run) -> summary; cfg is the app's typed config (its frozen schema dataclass, every
# group its own frozen dataclass, every option checked where it is declared)
type TaskFn[Schema] = Callable[[Schema, Any], dict[str, Any] | None]
# a failed write (full disk, read-only folder, quota, I/O error): one line naming the path
WRITE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EACCES,
                errno.EPERM)


def one_line(exc: BaseException) -> str:
  """The message of `exc` (and of what caused it) as one readable line."""
  if isinstance(exc, UserError):
    return _squash(str(exc))
  failed_write = _failed_write(exc)
  if failed_write is not None:
    return _squash(run_folder.write_error(failed_write))
  if isinstance(exc, MissingConfigException) and exc.options is not None:
    group = (exc.missing_cfg_file or "").rsplit("/", 1)
    name = group[-1]
    group_name = group[0] if len(group) == 2 else "config"
    valid = ", ".join(o for o in sorted(exc.options) if not o.endswith("_schema"))
    hint = (f"; or a YAML file: {group_name}=path/to/{name}.yaml (docs/extending.md)"
            if group_name in YAML_FILE_GROUPS else "")
    return f"unknown {group_name} '{name}' (valid {group_name} options: {valid}){hint}"
  if isinstance(exc, OverrideParseException):
    return (f"malformed override: {_squash(str(exc)).split('; See ')[0]} (quote a value with "
            "spaces, non-ASCII or special characters: key='value')")
  msgs = []
  e: BaseException | None = exc
  while e is not None:
    if isinstance(e, OmegaConfBaseException):
      msgs.append(_omegaconf_message(e))
      break  # what an OmegaConf error wraps repeats it with placeholders
    text = _squash(str(e)).replace("; To append to your config use", " (to add a new key use")
    if "(to add a new key use" in text:
      text = text.rstrip(".") + ")"
    if text and text not in msgs:
      msgs.append(text)
    e = e.__cause__ or e.__context__
  return ": ".join(msgs) or type(exc).__name__


def _failed_write(exc: BaseException) -> OSError | None:
  """The OSError of a failed write in exc's chain (None if there is none)."""
  e: BaseException | None = exc
  seen = 0
  while e is not None and seen < 20:
    if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
      return e
    e, seen = e.__cause__ or e.__context__, seen + 1
  return None


def _omegaconf_message(e: Any) -> str:
  first = str(e).splitlines()[0] if str(e) else type(e).__name__
  key = getattr(e, "full_key", None)
  if key and key not in first:
    first = f"{key}: {first}"
  schema = getattr(e, "object_type", None)
  if " not in '" in first and schema is not None and dataclasses.is_dataclass(schema):
    first += f" (valid keys: {', '.join(f.name for f in dataclasses.fields(schema))})"
  return _squash(first)


def _squash(text: str) -> str:
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  boilerplate = ("Config search path", "provider=", "Set the env")
  lines = [ln for ln in lines if not ln.startswith(boilerplate)]
  return re.sub(r"\s+", " ", "; ".join(lines)).strip()


def run_app_module(module: str) -> None:
  """`python -m dp_jax.<app>`: run the app's main from its module imported by its package name.

  Run as a script, the module is `__main__`, and so are its schema and task: a launcher that
  runs the job in another process (hydra/launcher=submitit_local, SLURM) pickles them by that
  name, and the other process cannot find them there ("name 'ModelConfig' is not defined")."""
  importlib.import_module(module).main()


def hydra_app[Schema](config_name: str,
                      schema: type[Schema]) -> Callable[[TaskFn[Schema]], Callable[[], None]]:
  """Turn `task(cfg: schema, run) -> summary dict` into a Hydra app `main()` with one-line errors.

  `schema` is the app's structured config; conf/<config_name>.yaml lists `<config_name>_schema`
  first in its defaults so every value is type-checked against it, and every key of the
  composed config (`+key=` additions too) must be one of its fields (config.check_known_keys).
  """

  def decorate(task: TaskFn[Schema]) -> Callable[[], None]:
    @functools.wraps(task)
    def main() -> None:
      ConfigStore.instance().store(name=f"{config_name}_schema", node=structured(schema))
      # Hydra re-raises instead of printing its own multi-line report; we print one line.
      os.environ["HYDRA_FULL_ERROR"] = "1"
      job = functools.partial(_run_job, task, config_name, schema)
      stop_on_signals()
      functools.update_wrapper(job, task)
      try:
        tracking.record_command(sys.argv, named_files(sys.argv[1:]))
        sys.argv[1:] = expand_file_overrides(sys.argv[1:])
      except UserError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
      _EXISTING.take(sys.argv[1:])
      hydra_main = hydra.main(version_base=None, config_path=CONF_DIR, config_name=config_name)(job)
      try:
        hydra_main()
        if SweepSummary.failed:
          print(f"error: {SweepSummary.failed} sweep cell(s) failed (see the table above)",
                file=sys.stderr)
          sys.exit(1)
      except SystemExit:
        raise
      except SweepRefused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
      except (KeyboardInterrupt, Stopped) as e:
        status, how, code = ending(e)
        print(f"{status}: {how}", file=sys.stderr)
        sys.exit(code)
      except Exception as e:  # noqa: BLE001 - every error ends as one line
        if os.environ.get("DP_JAX_TRACEBACK"):
          traceback.print_exc()
        message = None
        if ((isinstance(e, AssertionError) and "Unexpected type for root" in str(e))
            or "Could not override" in str(e)):  # perhaps a key under a null group
          message = _null_parent_message(config_name, sys.argv[1:])
        print(f"error: {message or one_line(e)}", file=sys.stderr)
        sys.exit(2)
      finally:
        tracking.cleanup()

    main.schema = schema  # type: ignore[attr-defined] - the app's typed config, for tests
    main.config_name = config_name  # type: ignore[attr-defined]
    return main

  return decorate


def compose_config(config_name: str, schema: type, overrides: list[str]) -> Any:
  """The config `python -m dp_jax.<config_name> overrides...` composes (no run): for tests,
  studies and numbers computed from an app's config."""
  ConfigStore.instance().store(name=f"{config_name}_schema", node=structured(schema))
  GlobalHydra.instance().clear()
  try:
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
      return compose(config_name=config_name, overrides=expand_file_overrides(list(overrides)))
  finally:
    GlobalHydra.instance().clear()


def app_config(main: Callable[[], None], overrides: list[str]) -> Any:
  """The typed config an app's `main` runs with for `overrides` (every key known, required
  values set, every option checked), without running it."""
  cfg = compose_config(main.config_name, main.schema, overrides)  # type: ignore[attr-defined]
  check_known_keys(cfg, main.schema)  # type: ignore[attr-defined]
  return typed(cfg, main.schema)  # type: ignore[attr-defined]


def _null_parent_message(config_name: str, argv: list[str]) -> str | None:
  """For `a.b.c=v` where a.b is null in the composed config: a line naming the override."""
  overrides = [a for a in argv if "=" in a and not a.startswith(("-", "hydra."))]
  dotted = [a for a in overrides if "." in a.partition("=")[0]]
  plain = [a for a in overrides if a not in dotted]
  GlobalHydra.instance().clear()
  try:
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
      cfg = compose(config_name=config_name, overrides=plain)
  except Exception:  # noqa: BLE001 - the original message is used instead
    return None
  for arg in dotted:
    key, _, value = arg.lstrip("+~").partition("=")
    parts = key.split(".")
    for i in range(1, len(parts)):
      parent = ".".join(parts[:i])
      node = OmegaConf.select(cfg, parent, default="missing", throw_on_missing=False)
      if node is None:
        group = parts[0]
        choice = OmegaConf.select(cfg, f"{group}.name", default=None)
        where = f" with {group}={choice}" if choice else ""
        return (f"{key}={value}: {parent} is null{where}, so it has no key "
                f"'{parts[i]}' to set; give {parent} whole (e.g. {parent}={{{parts[i]}: {value}}})"
                f" or choose a {group} option that sets it")
  return None


# Config groups that also take a file: `profile=x.json` means `profile=file profile.path=x.json`.
FILE_GROUPS = {"profile": "file"}


def expand_file_overrides(args: list[str]) -> list[str]:
  """Rewrite `group=<path>.json` overrides of FILE_GROUPS into the group's file option, and
  `model=` / `cluster=<path>.yaml` into an option on the search path
  (dp_jax/cli/config_files.py)."""
  args = expand_yaml_overrides(args, CONF_DIR)
  out = []
  for arg in args:
    key, sep, value = arg.partition("=")
    value = unquoted(value)
    if sep and key in FILE_GROUPS and value.endswith(".json") and (
        "," not in value or one_file(value)):
      out += [f"{key}={FILE_GROUPS[key]}", f"{key}.path={value}"]
    else:
      out.append(arg)
  return quoted(out)


def _run_job(task: TaskFn[Any], app: str, schema: type, cfg: Any) -> dict[str, Any] | None:
  """Run one job: tracking around it; a failure in a multirun is recorded, not raised.

  Nothing of ours is written before the task's first output (Run.begin): a job refused while
  validating leaves an existing run folder as it was (Hydra's own files are put back too). The
  run folder is locked for the job (dp_jax/tracking/run_folder.py): a second run into a folder in
  use is
  refused before it writes anything.
  """
  hc = HydraConfig.get()
  _quiet_third_party_loggers()
  logging.raiseExceptions = False  # a full disk under the log file: no traceback per record
  output_dir, writer = _join_processes(cfg, Path(hc.runtime.output_dir))
  multirun = hc.mode == RunMode.MULTIRUN
  if writer:
    try:
      run_folder.lock(output_dir)
    except UserError as e:  # another run owns the folder: touch nothing of it
      if _EXISTING.covers(output_dir):
        _EXISTING.restore(logs=False)
      return _refused(one_line(e), multirun, hc)
  try:
    return _run_locked(task, app, schema, cfg, hc, output_dir, writer, multirun)
  finally:
    run_folder.unlock(output_dir)


def _refused(message: str, multirun: bool, hc: Any) -> dict[str, Any]:
  print(f"error: {message}", file=sys.stderr)
  if multirun:
    log.error("cell %s failed: %s", " ".join(hc.overrides.task), message)
    return {"status": "failed", "error": message}
  raise SystemExit(2) from None


def _run_locked(task: TaskFn[Any], app: str, schema: type, cfg: Any, hc: Any, output_dir: Path,
                writer: bool, multirun: bool) -> dict[str, Any] | None:
  run = tracking.start(cfg, app=app, output_dir=output_dir, writer=writer,
                       sweep_name=Path(hc.sweep.dir).name if multirun else None,
                       swept=swept_options(Path(hc.sweep.dir), list(hc.overrides.task))
                       if multirun else ())
  if writer and not _EXISTING.covers(output_dir):  # a new folder: its status reserved
    _write_status(output_dir, {"status": "running", "overrides": list(hc.overrides.task)})
  try:
    check_known_keys(cfg, schema)  # every key known, then every value (required ones set)
    out = OmegaConf.select(cfg, "out", default=None)
    if out:  # the file the app writes, checked before its work (tracing, measuring, planning)
      check_writable(out, "out")
    summary = task(typed(cfg, schema), run) or {}
  except (KeyboardInterrupt, Stopped) as e:  # the status says how the run ended
    if writer and (run.begun or not _EXISTING.covers(output_dir)):
      status, how, code = ending(e)
      _record_failure(run, output_dir, how, hc, status=status, exit_code=code)
    raise
  except Exception as e:  # noqa: BLE001
    message = one_line(e)
    if writer and (run.begun or not _EXISTING.covers(output_dir)):
      _record_failure(run, output_dir, message, hc)
    elif writer:
      _EXISTING.restore()
    if os.environ.get("DP_JAX_TRACEBACK"):
      traceback.print_exc()
    return _refused(message, multirun, hc)
  summary = {"status": "ok", **summary}
  run.begin()
  if writer:
    _write_status(output_dir, {**summary, "overrides": list(hc.overrides.task)})
  run.summary(summary)
  run.finish()
  return summary


def _record_failure(run: Any, output_dir: Path, message: str, hc: Any, *,
                    status: str = "failed", exit_code: int = 1) -> None:
  """status.json (failed, interrupted or terminated) and the W&B run's end; a write that fails
  here too is left out (the job's one line already says what went wrong; what was written is
  kept)."""
  try:
    run.begin()
    _write_status(output_dir, {"status": status, "error": message,
                               "overrides": list(hc.overrides.task)})
  except OSError:
    pass
  run.summary({"status": status, "error": message})
  run.finish(exit_code=exit_code)


class Stopped(BaseException):
  """The run was stopped by SIGTERM or SIGHUP: it unwinds like Ctrl-C (every `finally` runs,
  so child processes end with it), and its status says which signal."""

  def __init__(self, signum: int):
    self.signum = signum
    super().__init__(signal.Signals(signum).name)


def stop_on_signals() -> None:
  """SIGTERM and SIGHUP raise Stopped in the main thread (by default they kill the process
  before it can stop its children or say how it ended); a signal the process was started
  ignoring (SIGHUP under nohup) stays ignored."""
  if threading.current_thread() is not threading.main_thread():
    return

  def stop(signum: int, _frame: Any) -> None:
    raise Stopped(signum)

  for signum in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(signum) is signal.SIG_DFL:  # one ignored (nohup) stays ignored
      signal.signal(signum, stop)


def ending(e: BaseException) -> tuple[str, str, int]:
  """(status, how, exit code) of a run stopped by Ctrl-C or a signal."""
  if isinstance(e, Stopped):
    name = signal.Signals(e.signum).name
    return "terminated", f"stopped by {name}", 128 + e.signum
  return "interrupted", "stopped by SIGINT (Ctrl-C)", 130


def _join_processes(cfg: Any, output_dir: Path) -> tuple[Path, bool]:
  """(run folder, whether this process writes it): one folder per multi-process job.

  Apps with runtime.distributed settings join jax.distributed here, before anything is
  written; every process then uses process 0's folder, and only process 0 writes the run's
  files (the others log to process_<i>.log there).
  """
  dist = OmegaConf.select(cfg, "runtime.distributed")
  if not distributed.configured(dist):
    return output_dir, True
  distributed.initialize(dist, num_devices=OmegaConf.select(cfg, "runtime.num_devices"))
  shared = distributed.shared_dir(output_dir)
  rank = distributed.process_index()
  if rank:
    distributed.log_to_own_file(shared, rank, hydra_dir=output_dir)
  return shared, rank == 0


# status.json is padded to this size, so that a failed run can still overwrite it in place
# when the disk is full (base/jsonfile.py, write_json's reserve)
STATUS_RESERVE_BYTES = 4096


def _write_status(output_dir: Path, status: dict[str, Any]) -> None:
  write_json(output_dir / "status.json", status, reserve=STATUS_RESERVE_BYTES)


class _FolderSnapshot:
  """The small bookkeeping files of an existing run folder, to put back after a refusal."""

  KEEP = (".hydra", "*.log")

  def __init__(self) -> None:
    self.root: Path | None = None
    self.files: dict[Path, bytes] = {}

  def take(self, argv: list[str]) -> None:
    """Remember the run folder named by hydra.run.dir=..., if it already exists."""
    self.root, self.files = None, {}
    for arg in argv:
      key, _, value = arg.partition("=")
      if key.lstrip("+") == "hydra.run.dir" and value and Path(value).is_dir():
        self.root = Path(value).resolve()
    if self.root is not None:
      self.files = {p: p.read_bytes() for p in self._bookkeeping()}

  def covers(self, output_dir: Path) -> bool:
    return self.root is not None and Path(output_dir).resolve() == self.root

  def restore(self, logs: bool = True) -> None:
    """Put Hydra's files back as they were; remove the ones this job created.

    logs=False: leave the log files (another run that holds the folder appends to them).
    """
    if self.root is None:
      return
    for p in self._bookkeeping(logs):
      if p not in self.files:
        p.unlink(missing_ok=True)
    for p, data in self.files.items():
      if logs or p.parent.name == ".hydra":
        p.write_bytes(data)
    hydra_dir = self.root / ".hydra"
    if hydra_dir.is_dir() and not any(hydra_dir.iterdir()):
      hydra_dir.rmdir()

  def _bookkeeping(self, logs: bool = True) -> list[Path]:
    assert self.root is not None
    hydra_dir = self.root / ".hydra"
    out = list(self.root.glob("*.log")) if logs else []
    if hydra_dir.is_dir():
      out += [p for p in hydra_dir.iterdir() if p.is_file()]
    return out


_EXISTING = _FolderSnapshot()


def _quiet_third_party_loggers() -> None:
  for name in ("jax._src", "absl", "orbax", "wandb"):
    logging.getLogger(name).setLevel(logging.WARNING)
