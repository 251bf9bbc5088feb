"""Hydra entry points: one-line errors, per-job tracking, failed multirun cells recorded."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dp_jax.errors import UserError
from dp_jax.sweep_summary import SweepSummary

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
log = logging.getLogger("dp_jax")

TaskFn = Callable[[Any, Any], dict[str, Any] | None]  # task(cfg, run) -> summary


def one_line(exc: BaseException) -> str:
  """The message of `exc` (and of what caused it) as one readable line."""
  from hydra.errors import MissingConfigException
  from omegaconf.errors import OmegaConfBaseException

  if isinstance(exc, UserError):
    return _squash(str(exc))
  if isinstance(exc, MissingConfigException) and exc.options is not None:
    group = (exc.missing_cfg_file or "").rsplit("/", 1)
    name = group[-1]
    group_name = group[0] if len(group) == 2 else "config"
    valid = ", ".join(o for o in sorted(exc.options) if not o.endswith("_schema"))
    from dp_jax.config_files import FILE_GROUPS

    hint = (f"; or a YAML file: {group_name}=path/to/{name}.yaml (docs/extending.md)"
            if group_name in FILE_GROUPS else "")
    return f"unknown {group_name} '{name}' (valid {group_name} options: {valid}){hint}"
  from hydra.errors import OverrideParseException

  if isinstance(exc, OverrideParseException):
    return f"malformed override: {_squash(str(exc)).split('; See ')[0]}"
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


def _omegaconf_message(e: Any) -> str:
  import dataclasses

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


def hydra_app(config_name: str, schema: type) -> Callable[[TaskFn], Callable[[], None]]:
  """Turn `task(cfg, run) -> summary dict` into a Hydra app `main()` with one-line errors.

  `schema` is the app's structured config; conf/<config_name>.yaml lists `<config_name>_schema`
  first in its defaults so every value is type-checked against it.
  """

  def decorate(task: TaskFn) -> Callable[[], None]:
    @functools.wraps(task)
    def main() -> None:
      import hydra
      from hydra.core.config_store import ConfigStore

      ConfigStore.instance().store(name=f"{config_name}_schema", node=schema)
      # Hydra re-raises instead of printing its own multi-line report; we print one line.
      os.environ["HYDRA_FULL_ERROR"] = "1"
      job = functools.partial(_run_job, task, config_name)
      functools.update_wrapper(job, task)
      try:
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
      except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
      except Exception as e:  # noqa: BLE001 - every error ends as one line
        if os.environ.get("DP_JAX_TRACEBACK"):
          traceback.print_exc()
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
      finally:
        from dp_jax import tracking

        tracking.cleanup()

    return main

  return decorate


# Config groups that also take a file: `profile=x.json` means `profile=file profile.path=x.json`.
FILE_GROUPS = {"profile": "file"}


def expand_file_overrides(args: list[str]) -> list[str]:
  """Rewrite `group=<path>.json` overrides of FILE_GROUPS into the group's file option, and
  `model=` / `cluster=<path>.yaml` into an option on the search path (dp_jax/config_files.py)."""
  from dp_jax.config_files import expand_yaml_overrides

  args = expand_yaml_overrides(args, CONF_DIR)
  out = []
  for arg in args:
    key, sep, value = arg.partition("=")
    if sep and key in FILE_GROUPS and value.endswith(".json") and "," not in value:
      out += [f"{key}={FILE_GROUPS[key]}", f"{key}.path={value}"]
    else:
      out.append(arg)
  return out


def _run_job(task: TaskFn, app: str, cfg: Any) -> dict[str, Any] | None:
  """Run one job: tracking around it; a failure in a multirun is recorded, not raised.

  Nothing of ours is written before the task's first output (Run.begin): a job refused while
  validating leaves an existing run folder as it was (Hydra's own files are put back too).
  """
  from hydra.core.hydra_config import HydraConfig
  from hydra.types import RunMode

  from dp_jax import tracking

  hc = HydraConfig.get()
  _quiet_third_party_loggers()
  output_dir, writer = _join_processes(cfg, Path(hc.runtime.output_dir))
  multirun = hc.mode == RunMode.MULTIRUN
  run = tracking.start(cfg, app=app, output_dir=output_dir, writer=writer,
                       sweep_name=Path(hc.sweep.dir).name if multirun else None)
  try:
    from dp_jax.options import check_options

    check_options(cfg)
    summary = task(cfg, run) or {}
  except Exception as e:  # noqa: BLE001
    message = one_line(e)
    if writer and (run.begun or not _EXISTING.covers(output_dir)):
      run.begin()
      _write_status(output_dir, {"status": "failed", "error": message,
                                 "overrides": list(hc.overrides.task)})
      run.summary({"status": "failed", "error": message})
      run.finish(exit_code=1)
    elif writer:
      _EXISTING.restore()
    if os.environ.get("DP_JAX_TRACEBACK"):
      traceback.print_exc()
    print(f"error: {message}", file=sys.stderr)
    if multirun:
      log.error("cell %s failed: %s", " ".join(hc.overrides.task), message)
      return {"status": "failed", "error": message}
    raise SystemExit(2) from None
  summary = {"status": "ok", **summary}
  run.begin()
  if writer:
    _write_status(output_dir, {**summary, "overrides": list(hc.overrides.task)})
  run.summary(summary)
  run.finish()
  return summary


def _join_processes(cfg: Any, output_dir: Path) -> tuple[Path, bool]:
  """(run folder, whether this process writes it): one folder per multi-process job.

  Apps with runtime.distributed settings join jax.distributed here, before anything is
  written; every process then uses process 0's folder, and only process 0 writes the run's
  files (the others log to process_<i>.log there).
  """
  from omegaconf import OmegaConf

  from dp_jax.runtime import distributed

  dist = OmegaConf.select(cfg, "runtime.distributed")
  if not distributed.configured(dist):
    return output_dir, True
  distributed.initialize(dist, num_devices=OmegaConf.select(cfg, "runtime.num_devices"))
  shared = distributed.shared_dir(output_dir)
  rank = distributed.process_index()
  if rank:
    distributed.log_to_own_file(shared, rank, hydra_dir=output_dir)
  return shared, rank == 0


def _write_status(output_dir: Path, status: dict[str, Any]) -> None:
  from dp_jax.jsonfile import write_json

  write_json(output_dir / "status.json", status)


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

  def restore(self) -> None:
    """Put Hydra's files back as they were; remove the ones this job created."""
    for p in self._bookkeeping():
      if p not in self.files:
        p.unlink(missing_ok=True)
    for p, data in self.files.items():
      p.write_bytes(data)
    hydra_dir = self.root / ".hydra"
    if hydra_dir.is_dir() and not any(hydra_dir.iterdir()):
      hydra_dir.rmdir()

  def _bookkeeping(self) -> list[Path]:
    assert self.root is not None
    hydra_dir = self.root / ".hydra"
    out = list(self.root.glob("*.log"))
    if hydra_dir.is_dir():
      out += [p for p in hydra_dir.iterdir() if p.is_file()]
    return out


_EXISTING = _FolderSnapshot()


def _quiet_third_party_loggers() -> None:
  for name in ("jax._src", "absl", "orbax", "wandb"):
    logging.getLogger(name).setLevel(logging.WARNING)
