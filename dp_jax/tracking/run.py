"""W&B tracking: one run per job, with provenance; local results never depend on it."""

from __future__ import annotations

import csv
import gc
import hashlib
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

from omegaconf import OmegaConf

from dp_jax.base.checks import Checked, build, option
from dp_jax.base.jsonfile import dumps, write_json

log = logging.getLogger(__name__)

TRACKED_PACKAGES = ("dp_jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "hydra-core",
                    "omegaconf", "wandb", "numpy", "matplotlib", "rich")
RUN_ID_FILE = "wandb_run_id.txt"


@dataclass(frozen=True)
class LoggerConfig(Checked):
  """The logger group (conf/logger/): W&B tracking, offline by default (no server needed);
  `disabled` turns it off. group: None: a multirun's sweep name, else no group; job_type:
  None: the app's name."""

  GROUP = "logger"

  mode: str = option("offline", choices=("online", "offline", "disabled"))
  project: str = "dp_jax"
  entity: str | None = None
  group: str | None = None
  job_type: str | None = None
  tags: tuple[str, ...] = ()


def git_state(repo: Path | None = None) -> dict[str, Any]:
  """The commit SHA and whether the work tree has uncommitted changes outside results/ (the
  committed outputs that studies regenerate: a study run while another study's new results are
  not yet committed runs clean code)."""
  repo = repo or Path(__file__).resolve().parents[2]

  def git(*args: str) -> str | None:
    try:
      out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                           timeout=10, check=True)
      return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
      return None

  sha = git("rev-parse", "HEAD")
  status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
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
  import jax  # JAX: only for an app that already runs it (finish() checks)

  devices = jax.devices()
  return {"backend": jax.default_backend(), "device_count": len(devices),
          "process_count": jax.process_count(),
          "devices": [f"{d.platform}:{d.id}:{getattr(d, 'device_kind', '')}" for d in devices]}


# The command as the user typed it and the config files it named (`model=my.yaml`), recorded
# by the Hydra edge before it rewrites them into a temporary config folder (cli/config_files.py)
_COMMAND: dict[str, Any] = {}


def record_command(argv: list[str], files: list[tuple[str, Path]]) -> None:
  """Remember the command line as typed and the (group, file) config files it named."""
  _COMMAND.update(argv=list(argv), files=list(files))


def provenance(config: dict[str, Any] | None = None) -> dict[str, Any]:
  """What replays a run: the commit, packages, the command as typed, the text of every config
  file it named (the temporary folder Hydra read them from is gone after the run) and a digest
  of the model's own source (a model outside the package: dp_jax/models/zoo.py model_sources)."""
  out = {**git_state(), "packages": package_versions(), "python": sys.version.split()[0],
         "platform": platform.platform(), "argv": _COMMAND.get("argv", sys.argv)}
  files = {}
  for group, path in _COMMAND.get("files", []):
    try:
      files[f"{group}={path}"] = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
      files[f"{group}={path}"] = f"(unreadable: {e})"
  if files:
    out["config_files"] = files
  target = ((config or {}).get("model") or {}).get("_target_")
  if isinstance(target, str):
    out["model_source"] = model_source(target)
  return out


def model_source(target: str) -> dict[str, Any]:
  """The model's source beyond the package (its modules, their sha256) for provenance; a zoo
  target's source is the commit's."""
  from dp_jax.models.zoo import model_sources, source_digest  # no JAX: the files are read

  files = model_sources(target)
  if files == []:
    return {"target": target, "in": "dp_jax (see git_sha)"}
  return {"target": target, "sha256": source_digest(target),
          "modules": {m: hashlib.sha256(f.read_bytes()).hexdigest()[:16] for m, f in files or []}}


@dataclass
class Run:
  """A job's tracking handle; writes nothing until begin() (first output), so a job refused
  during validation leaves an existing folder untouched. With W&B off or broken it still
  writes local files."""

  output_dir: Path
  wandb_run: Any | None = None
  writes: bool = True  # False on processes other than 0 of a multi-process job
  config: dict[str, Any] = field(default_factory=dict)  # the job's config, as config.json has it
  _summary: dict[str, Any] = field(default_factory=dict)
  _start: Callable[[], Any] | None = None  # writes config/provenance, returns the W&B run
  begun: bool = False
  # (artifact type, path) the job read and wrote: logged with lineage at a successful finish
  inputs: list[tuple[str, Path]] = field(default_factory=list)
  outputs: list[tuple[str, Path]] = field(default_factory=list)

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
      import wandb  # W&B: only with a W&B run (logger=disabled imports none)

      self._safe(lambda: self.wandb_run.log({key: wandb.Table(columns=columns, data=rows)}))
    return path

  def log_image(self, key: str, path: str | Path) -> None:
    self.begin()
    if self.wandb_run is not None:
      import wandb  # W&B: only with a W&B run (logger=disabled imports none)

      self._safe(lambda: self.wandb_run.log({key: wandb.Image(str(path))}))

  def summary(self, values: dict[str, Any]) -> None:
    self.begin()
    self._summary.update(values)
    if self.wandb_run is not None:
      self._safe(self.wandb_run.summary.update, _jsonable(values))

  def finish(self, exit_code: int = 0) -> None:
    if self.wandb_run is None:
      return
    if exit_code == 0:
      self._safe(self.log_artifacts)
    try:
      if "jax" in sys.modules:  # an app that never used JAX does not import it to describe it
        self.wandb_run.config.update({"devices": device_summary()}, allow_val_change=True)
    except Exception as e:  # noqa: BLE001
      log.warning("could not record the device summary: %s", e)
    self._safe(self.wandb_run.finish, exit_code=exit_code)
    self.wandb_run = None

  def log_artifacts(self) -> None:
    """The job's input files as used artifacts and its outputs as logged ones (W&B lineage);
    names are `<type>-<model>-<content digest>`, so a file one job wrote and another read is
    one artifact version."""
    import wandb  # W&B: only with a W&B run (logger=disabled imports none)

    used, logged = [], []
    for kind, path in self.inputs:
      if Path(path).is_file():
        art = file_artifact(kind, Path(path))
        use_artifact(self.wandb_run, art)
        used.append(art.name)
    for kind, path in self.outputs:
      path = Path(path)
      if path.is_file():
        art = file_artifact(kind, path)
      elif path.is_dir() and any(path.iterdir()):
        art = wandb.Artifact(f"{kind}-{self.wandb_run.id}", type=kind)
        # a reference (nothing uploaded), not hashed: checkpoints can be gigabytes
        art.add_reference(path.resolve().as_uri(), name=path.name, checksum=False)
      else:
        continue
      self.wandb_run.log_artifact(art)
      logged.append(art.name)
    if used or logged:
      self.wandb_run.config.update({"artifacts": {"used": used, "logged": logged}},
                                   allow_val_change=True)

  def _safe(self, fn, *args, **kwargs) -> None:
    try:
      fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - tracking must never break a job
      log.warning("W&B call failed (%s); local results are unaffected", e)


def start(cfg: Any, *, app: str, output_dir: Path, sweep_name: str | None = None,
          writer: bool = True, swept: list[str] | tuple[str, ...] = ()) -> Run:
  """The job's Run; config, provenance and the W&B run (mode from cfg.logger) come at begin().

  writer=False (processes other than 0 of a multi-process job): no files, no W&B run.
  swept: the cell's values of a sweep's swept options ('key=value'), named in the run's name.
  """
  output_dir = Path(output_dir)
  resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
  if not writer:
    return Run(output_dir, writes=False, config=resolved)
  logger = build(LoggerConfig, cfg.get("logger") or {})
  mode = os.environ.get("DP_JAX_WANDB_MODE", logger.mode)

  def write_and_start_wandb() -> Any | None:
    prov = provenance(resolved)
    write_json(output_dir / "provenance.json", prov)
    write_json(output_dir / "config.json", resolved)
    if mode == "disabled":
      return None
    return _start_wandb(resolved, prov, logger, mode, app, output_dir, sweep_name, swept)

  inputs, outputs = job_files(resolved, app, output_dir)
  return Run(output_dir, config=resolved, _start=write_and_start_wandb, inputs=inputs,
             outputs=outputs)


# What each app writes (relative to its run folder unless cfg.out names the file).
OUTPUTS = {"inspect": ("graph", "graph.json"), "profile": ("profile", "profile.json"),
           "plan": ("plan", "plan.json")}
PLAN_MODES = ("burst", "data_parallel")  # train's plan= values that plan in the job


def job_files(cfg: dict[str, Any], app: str,
              output_dir: Path) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
  """(inputs, outputs): the graph, profile, plan and checkpoint files of a job, by type."""
  inputs: list[tuple[str, Path]] = []
  if cfg.get("graph"):
    inputs.append(("graph", Path(cfg["graph"])))
  profile = cfg.get("profile") or {}
  if isinstance(profile, dict) and profile.get("source") == "file" and profile.get("path"):
    inputs.append(("profile", Path(profile["path"])))
  plan = cfg.get("plan")
  if isinstance(plan, str) and plan not in PLAN_MODES:
    inputs.append(("plan", Path(plan)))
  outputs: list[tuple[str, Path]] = []
  if app in OUTPUTS:
    kind, default = OUTPUTS[app]
    outputs.append((kind, Path(cfg["out"]) if cfg.get("out") else output_dir / default))
  elif app in ("simulate", "train") and not any(k == "plan" for k, _ in inputs):
    outputs.append(("plan", output_dir / "plan.json"))
  if app == "train":
    outputs.append(("checkpoint", output_dir / "checkpoints"))
  return inputs, outputs


def file_artifact(kind: str, path: Path):
  """A W&B artifact of one JSON file, named by type, model and content digest."""
  import wandb  # W&B: only with a W&B run (logger=disabled imports none)

  data = path.read_bytes()
  try:
    model = str(json.loads(data).get("model") or "model")
  except (ValueError, AttributeError):
    model = "model"
  model = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
  art = wandb.Artifact(f"{kind}-{model}-{hashlib.sha256(data).hexdigest()[:12]}", type=kind,
                       metadata={"file": path.name})
  art.add_file(str(path), name=path.name)
  return art


def use_artifact(run: Any, artifact: Any) -> None:
  """Declare `artifact` an input of `run`. Offline, W&B refuses run.use_artifact; there the
  run records the same draft-artifact use it would make online (synced by `wandb sync`)."""
  if not run.settings._offline:
    run.use_artifact(artifact)
    return
  run._log_artifact(artifact, is_user_created=True, use_after_commit=True)


# options run_name shows in its own parts (a swept one is not repeated as key=value)
NAMED_KEYS = ("model", "model.name", "cluster", "cluster.name", "cluster.num_devices",
              "runtime.num_devices", "batch_size", "planner.amplification_limit", "plan",
              "planner.gradient_precision")


def run_name(cfg: dict[str, Any], app: str, swept: list[str] | tuple[str, ...] = ()) -> str:
  """'simulate vit a100_nvlink_8 G8 B32 A2.0 bf16': app, model, cluster, G, B, amplification
  limit, gradient precision, then every other swept option of a sweep's cell (`swept`:
  'key=value'), so no two cells of a sweep share a name."""
  def pick(*keys: str) -> Any:
    node: Any = cfg
    for k in keys:
      node = node.get(k) if isinstance(node, dict) else None
    return node

  cluster = pick("cluster") or {}
  g = pick("cluster", "num_devices") or pick("runtime", "num_devices")
  if g is None and isinstance(cluster, dict) and cluster.get("devices_per_node"):
    g = int(cluster.get("num_nodes") or 1) * int(cluster["devices_per_node"])
  b, a, where = pick("batch_size"), pick("planner", "amplification_limit"), pick("cluster", "name")
  plan = plan_file_json(cfg.get("plan"))
  if plan:  # a job given a plan runs what the plan says
    g, b = plan.get("num_devices", g), plan.get("global_batch", b)
    a, where = plan.get("amplification_limit", a), plan.get("cluster", where)
  if a is None and "amplification_limit" in ((pick("planner") or {}) | plan):
    a = "inf"  # strict JSON records no limit (inf) as null
  precision = (plan.get("options") or {}).get("gradient_precision") or pick(
      "planner", "gradient_precision")
  parts = [app, pick("model", "name"), where, f"G{g}" if g is not None else None,
           f"B{b}" if b is not None else None, f"A{a}" if a is not None else None, precision]
  parts += [o for o in swept if o.partition("=")[0].lstrip("+~") not in NAMED_KEYS]
  return " ".join(str(p) for p in parts if p is not None)


def plan_file_json(plan: Any) -> dict[str, Any]:
  """The JSON of a plan file a job was given ({} for none, a plan mode, or an unreadable one)."""
  if not isinstance(plan, str) or plan in PLAN_MODES or not Path(plan).is_file():
    return {}
  try:
    data = json.loads(Path(plan).read_text())
  except (OSError, ValueError):
    return {}
  return data if isinstance(data, dict) else {}


def _start_wandb(resolved: dict[str, Any], prov: dict[str, Any], logger: LoggerConfig, mode: str,
                 app: str, output_dir: Path, sweep_name: str | None,
                 swept: list[str] | tuple[str, ...] = ()) -> Any | None:
  """The W&B run of this job (resumed by the id stored in its folder); None if W&B fails."""
  try:
    import wandb  # W&B: only with a W&B run (logger=disabled imports none)

    id_file = output_dir / RUN_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      run = wandb.init(
          mode=mode, project=logger.project, entity=logger.entity,
          group=logger.group or sweep_name, job_type=logger.job_type or app,
          name=run_name(resolved, app, swept), tags=list(logger.tags),
          config={**resolved, "provenance": prov},
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
