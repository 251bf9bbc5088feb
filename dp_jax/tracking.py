"""W&B tracking: one run per job, with provenance; local results never depend on it."""

from __future__ import annotations

import csv
import json
import logging
import os
import platform
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from dp_jax.jsonfile import dumps, write_json

log = logging.getLogger(__name__)

TRACKED_PACKAGES = ("dp_jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "hydra-core",
                    "omegaconf", "wandb", "numpy", "matplotlib", "rich")
RUN_ID_FILE = "wandb_run_id.txt"


def git_state(repo: Path | None = None) -> dict[str, Any]:
  """The commit SHA and whether the work tree has uncommitted changes."""
  repo = repo or Path(__file__).resolve().parents[1]

  def git(*args: str) -> str | None:
    try:
      out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                           timeout=10, check=True)
      return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
      return None

  sha = git("rev-parse", "HEAD")
  status = git("status", "--porcelain", "--untracked-files=no")
  return {"git_sha": sha, "git_dirty": bool(status) if status is not None else None}


def package_versions() -> dict[str, str | None]:
  out: dict[str, str | None] = {}
  for name in TRACKED_PACKAGES:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


def device_summary() -> dict[str, Any]:
  """The JAX backend and its devices (imports jax: call after the app has configured it)."""
  import jax

  devices = jax.devices()
  return {"backend": jax.default_backend(), "device_count": len(devices),
          "process_count": jax.process_count(),
          "devices": [f"{d.platform}:{d.id}:{getattr(d, 'device_kind', '')}" for d in devices]}


def provenance() -> dict[str, Any]:
  return {**git_state(), "packages": package_versions(), "python": sys.version.split()[0],
          "platform": platform.platform(), "argv": sys.argv}


@dataclass
class Run:
  """A job's tracking handle; writes nothing until begin() (first output), so a job refused
  during validation leaves an existing folder untouched. With W&B off or broken it still
  writes local files."""

  output_dir: Path
  wandb_run: Any | None = None
  writes: bool = True  # False on processes other than 0 of a multi-process job
  _summary: dict[str, Any] = field(default_factory=dict)
  _start: Callable[[], Any] | None = None  # writes config/provenance, returns the W&B run
  begun: bool = False
  writes: bool = True  # False on processes other than 0 of a multi-process job

  def begin(self) -> None:
    """Write config.json and provenance.json and start the W&B run (once)."""
    if self.begun:
      return
    self.begun = True
    if not self.writes:
      return
    self.output_dir.mkdir(parents=True, exist_ok=True)
    if self._start is not None:
      self.wandb_run = self._start()

  def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
    self.begin()
    if self.wandb_run is not None:
      self._safe(self.wandb_run.log, metrics, step=step)

  def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> Path:
    """Write `key`.csv in the output folder and log it as a W&B table."""
    self.begin()
    path = self.output_dir / f"{key}.csv"
    if not self.writes:
      return path
    if not self.writes:
      return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
      w = csv.writer(f)
      w.writerow(columns)
      w.writerows(rows)
    if self.wandb_run is not None:
      import wandb

      self._safe(lambda: self.wandb_run.log({key: wandb.Table(columns=columns, data=rows)}))
    return path

  def log_image(self, key: str, path: str | Path) -> None:
    self.begin()
    if self.wandb_run is not None:
      import wandb

      self._safe(lambda: self.wandb_run.log({key: wandb.Image(str(path))}))

  def summary(self, values: dict[str, Any]) -> None:
    self.begin()
    self._summary.update(values)
    if self.wandb_run is not None:
      self._safe(self.wandb_run.summary.update, _jsonable(values))

  def finish(self, exit_code: int = 0) -> None:
    if self.wandb_run is None:
      return
    try:
      if "jax" in sys.modules:  # an app that never used JAX does not import it to describe it
        self.wandb_run.config.update({"devices": device_summary()}, allow_val_change=True)
    except Exception as e:  # noqa: BLE001
      log.warning("could not record the device summary: %s", e)
    self._safe(self.wandb_run.finish, exit_code=exit_code)
    self.wandb_run = None

  def _safe(self, fn, *args, **kwargs) -> None:
    try:
      fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - tracking must never break a job
      log.warning("W&B call failed (%s); local results are unaffected", e)


def start(cfg: Any, *, app: str, output_dir: Path, sweep_name: str | None = None,
          writer: bool = True) -> Run:
  """The job's Run; config, provenance and the W&B run (mode from cfg.logger) come at begin().

  writer=False (processes other than 0 of a multi-process job): no files, no W&B run.
  """
  from omegaconf import OmegaConf

  output_dir = Path(output_dir)
  if not writer:
    return Run(output_dir, writes=False)
  resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
  logger_cfg = cfg.get("logger") or {}
  mode = str(getattr(logger_cfg.get("mode", "offline"), "value", logger_cfg.get("mode", "offline")))
  mode = os.environ.get("DP_JAX_WANDB_MODE", mode)

  def write_and_start_wandb() -> Any | None:
    prov = provenance()
    write_json(output_dir / "provenance.json", prov)
    write_json(output_dir / "config.json", resolved)
    if mode == "disabled":
      return None
    return _start_wandb(resolved, prov, logger_cfg, mode, app, output_dir, sweep_name)

  return Run(output_dir, _start=write_and_start_wandb)


def _start_wandb(resolved: dict[str, Any], prov: dict[str, Any], logger_cfg: Any, mode: str,
                 app: str, output_dir: Path, sweep_name: str | None) -> Any | None:
  """The W&B run of this job (resumed by the id stored in its folder); None if W&B fails."""
  try:
    import wandb

    id_file = output_dir / RUN_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      run = wandb.init(
          mode=mode, project=logger_cfg.get("project", "dp_jax"), entity=logger_cfg.get("entity"),
          group=logger_cfg.get("group") or sweep_name, job_type=logger_cfg.get("job_type") or app,
          tags=list(logger_cfg.get("tags") or []), config={**resolved, "provenance": prov},
          dir=str(output_dir), id=run_id, resume="allow", reinit="finish_previous",
          settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))
    write_json(Path(run.dir) / "dp_jax_config.json", {**resolved, "provenance": prov})
    return run
  except Exception as e:  # noqa: BLE001
    log.warning("W&B could not start (%s); continuing without it, local results still written",
                str(e).splitlines()[0] if str(e) else type(e).__name__)
    return None


def cleanup() -> None:
  """Remove W&B's temporary folders now (else they warn at interpreter exit)."""
  artifact_module = sys.modules.get("wandb.sdk.artifacts.artifact")
  folders = []
  media = sys.modules.get("wandb.sdk.data_types._private")
  if media is not None:
    folders.append(getattr(media, "MEDIA_TMP", None))
  if artifact_module is not None:
    artifact_cls = artifact_module.Artifact
    folders.append(getattr(artifact_cls, "_TMP_DIR", None))
    import gc

    # Each logged wandb.Table builds an Artifact holding a temporary folder of its own.
    folders += [getattr(o, "_tmp_dir", None) for o in gc.get_objects()
                if isinstance(o, artifact_cls)]
  for folder in folders:
    if folder is not None and hasattr(folder, "cleanup"):
      try:
        folder.cleanup()
      except OSError:
        pass


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
  return json.loads(dumps(values, None))
