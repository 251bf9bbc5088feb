"""The training loop: a plan's program, checkpoints, metrics, progress, a measured timeline.

train() runs a plan its caller checked (planner.contract.check_plan, once, at the app's edge),
resumes from the newest checkpoint in checkpoint_dir, saves every `checkpoint_every` steps (0:
only at the end) and at the end, and writes metrics.jsonl (one line per step) and timeline.json
(the second step of the call, every stage call waited for) to output_dir (default: the parent of
checkpoint_dir). With several processes every one trains and checkpoints (orbax writes
collectively), and process 0 alone writes metrics.jsonl and timeline.json. Batches depend
only on the step index, so a resumed run repeats exactly what an uninterrupted one does.
A model whose mixture-of-experts layers can drop tokens by capacity (C < T) reports the
token-expert assignments they dropped in each step's metrics (`dropped_assignments`) and logs
a warning line at the first step that drops any.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import optax

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import dumps
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.planner.contract import Plan
from dp_jax.runtime import checkpoint as ckpt
from dp_jax.runtime import data as datalib
from dp_jax.runtime import distributed
from dp_jax.runtime import measured_timeline as tl
from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime.batch_norm import set_statistics_groups
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.step import Program, TrainState, build_program, init_state, train_step

log = logging.getLogger(__name__)
LogFn = Callable[[dict[str, Any], int], None]
METRICS_FILE = "metrics.jsonl"
TIMELINE_FILE = "timeline.json"
STEP_SLEEP_ENV = "DP_JAX_STEP_SLEEP_S"  # test hook: pause after each step (kill/resume tests)
# test hook: "metrics:<step>" SIGKILLs the process halfway through that step's metrics line,
# "checkpoint:<step>" right after that step's checkpoint save is issued (kill/resume tests)
DIE_AT_ENV = "DP_JAX_DIE_AT"


@dataclass
class TrainResult:
  """What a call of train() did: the final state, losses and timings of the steps it ran."""

  state: TrainState
  program: Program
  start_step: int  # steps already done (restored from a checkpoint) when the call began
  final_step: int
  losses: list[float] = field(default_factory=list)
  step_ms: list[float] = field(default_factory=list)
  timeline_path: Path | None = None
  metrics_path: Path | None = None

  @property
  def median_step_ms(self) -> float | None:
    times = self.step_ms[1:] or self.step_ms  # the first step includes compilation
    return statistics.median(times) if times else None


def train(model, graph: LayerGraph, plan: Plan, *, steps: int,
          optimizer: optax.GradientTransformation, data: datalib.DataSource,
          checkpoint_dir: str | Path | None = None, checkpoint_every: int = 0,
          log_fn: LogFn | None = None, output_dir: str | Path | None = None,
          devices: list[jax.Device] | None = None, progress: bool = False,
          on_stage: Callable | None = None,
          on_start: Callable[[], None] | None = None) -> TrainResult:
  """Train `model` under `plan` until `steps` steps in total are done (see the module doc).

  `plan`: checked for `graph` and the devices by the caller (planner.contract.check_plan);
  its recorded stages are the programs it runs (runtime/stages.py, plan_stages).
  on_stage(stage_program, phase) is passed to every train_step (background job hook);
  on_start() runs once the checkpoint folder is known to fit, before any write.
  A non-finite loss stops training with a UserError; the last good checkpoint is kept.
  """
  if not isinstance(plan, Plan):
    raise TypeError(f"train() takes a Plan checked by planner.contract.check_plan, not "
                    f"{type(plan).__name__}")
  devices = devices or meshlib.job_devices()
  _check_model_graph(model, graph)
  set_statistics_groups(model, plan)
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, plan, optimizer, devices)
  state = init_state(program, params, stats, optimizer)
  del params, stats
  if output_dir is None and checkpoint_dir is not None:
    output_dir = Path(checkpoint_dir).resolve().parent
  manager, start = None, 0
  if checkpoint_dir is not None:
    manager = ckpt.open_manager(checkpoint_dir, ckpt.state_signature(graph.model, state))
    manager, restored = ckpt.restore_newest_good(manager, state, _everywhere(program))
    if restored is not None:
      start, state = restored
      log.info("resumed from checkpoint step %d in %s", start, checkpoint_dir)
  metrics_path = None
  if output_dir is not None and distributed.process_index() == 0:  # process 0 writes files
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    metrics_path = Path(output_dir) / METRICS_FILE
    repair_metrics(metrics_path, start)
  if on_start is not None:
    on_start()
  result = TrainResult(state, program, start, start, metrics_path=metrics_path)
  try:
    _run(result, data, steps, manager, checkpoint_every, log_fn, output_dir, progress,
         on_stage)
  except BaseException:
    if manager is not None:
      ckpt.finish(manager, failing=True)
    raise
  if manager is not None:
    ckpt.finish(manager)
  return result


def _run(result: TrainResult, data, steps: int, manager, every: int, log_fn, output_dir,
         progress: bool, on_stage: Callable | None = None) -> None:
  program, batch = result.program, result.program.global_batch
  x_sh, y_sh = program.input_stage.batch, program.last_stage.batch
  # the measured timeline: the run's middle step, well past compilation (the first one or two
  # steps compile and warm up), as a representative step
  timed_step = min(max(result.start_step + 1, (result.start_step + steps) // 2), steps - 1)
  sleep_s = float(os.environ.get(STEP_SLEEP_ENV, "0") or 0)
  bar = _progress(progress)
  warned = False
  with bar:
    task = bar.add_task("train", total=steps, completed=result.start_step, loss=float("nan"))
    for step in range(result.start_step, steps):
      t0 = time.perf_counter()
      x, y = datalib.batch_at(data, step, batch, x_sh, y_sh)
      timer: list[dict[str, Any]] | None = [] if step == timed_step else None
      counts: dict[str, jax.Array] = {}
      result.state, loss = train_step(program, result.state, x, y, timer=timer,
                                      on_stage=on_stage, counts=counts)
      loss_value = float(program.value(loss))
      ms = (time.perf_counter() - t0) * 1e3
      done = step + 1
      if not math.isfinite(loss_value):
        kept = manager.latest_step() if manager is not None else None
        raise UserError(f"loss is {loss_value} at step {done}: training stopped (last good "
                        f"checkpoint: {'none' if kept is None else f'step {kept}'}); lower "
                        "optimizer.lr or check the data")
      metrics: dict[str, Any] = {"step": done, "loss": loss_value, "step_ms": ms,
                                 "samples_per_s": batch / ms * 1e3}
      if counts:
        dropped = {n: int(program.value(v)) for n, v in counts.items()}
        metrics["dropped_assignments"] = sum(dropped.values())
        if metrics["dropped_assignments"] and not warned:
          warned = True
          log.warning("step %d: mixture-of-experts layers dropped %d token-expert assignments "
                      "by capacity (%s); raise model.kwargs.capacity_factor to drop none",
                      done, metrics["dropped_assignments"],
                      ", ".join(f"{n}: {c}" for n, c in dropped.items() if c))
      if timer:
        metrics["stage_ms"] = tl.stage_ms(timer)
        if result.metrics_path is not None:
          result.timeline_path = tl.write_timeline(
              Path(output_dir) / TIMELINE_FILE,
              tl.timeline_json(timer, [s.stage for s in program.stages], model=program.model,
                               global_batch=batch, num_devices=program.num_devices, step=done))
      result.losses.append(loss_value)
      result.step_ms.append(ms)
      result.final_step = done
      if result.metrics_path is not None:
        _die_at("metrics", done, result.metrics_path, json.dumps(metrics))
        append_line(result.metrics_path, json.dumps(metrics))
      if log_fn is not None:
        log_fn({f"train/{k}": v for k, v in metrics.items() if k != "step"}, done)
      if manager is not None and ((every and done % every == 0) or done == steps):
        ckpt.save(manager, done, result.state, _everywhere(program))
        _die_at("checkpoint", done)
      bar.update(task, completed=done, loss=loss_value)
      if sleep_s:
        time.sleep(sleep_s)


def _die_at(where: str, step: int, path: Path | None = None, line: str = "") -> None:
  """The DIE_AT_ENV test hook (see there); a no-op unless it names this point."""
  if os.environ.get(DIE_AT_ENV) != f"{where}:{step}":
    return
  if path is not None:  # half a line, on disk, as a kill during the write leaves it
    with path.open("a") as f:
      f.write(line[: len(line) // 2])
  os.kill(os.getpid(), signal.SIGKILL)


def _everywhere(program: Program):
  """All the plan's devices, when several processes share them (else None: save as is)."""
  return program.everywhere if jax.process_count() > 1 else None


def _check_model_graph(model, graph: LayerGraph) -> None:
  names = [s.name for s in model.layer_specs()]
  if set(names) != set(graph.names):
    missing = sorted(set(graph.names) - set(names))[:3]
    extra = sorted(set(names) - set(graph.names))[:3]
    raise UserError(f"graph of {graph.model} does not match the model's layers (graph only: "
                    f"{missing}, model only: {extra}); trace the graph from this model")


def repair_metrics(path: Path, start: int) -> None:
  """Keep only the metrics of steps <= start (a resumed run replays the later ones).

  A last line cut by a kill is dropped (its step is replayed); a damaged line before it is a
  one-line UserError naming the file and line. Rewritten atomically (a kill keeps the old file).
  A resume whose file lacks a step the checkpoint covers (deleted or edited: each line is
  written before its step's checkpoint) is refused: it would lose that history silently.
  """
  lines = path.read_text().splitlines() if path.exists() else []
  keep = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      if i == len(lines) - 1:
        log.warning("%s: its last line was cut (%r); dropped, its step is trained again",
                    path, line[:40])
        continue
      raise UserError(f"{path} line {i + 1} is damaged ({line[:40]!r}); remove that line or "
                      "the file to resume") from None
    if isinstance(record, dict) and record.get("step", 0) <= start:
      keep.append(line)
  have = {r.get("step") for r in map(json.loads, keep) if isinstance(r, dict)}
  missing = [s for s in range(1, start + 1) if s not in have]
  if missing:
    what = "is missing" if not path.exists() else f"lacks {len(missing)} of them (first: step " \
        f"{missing[0]})"
    raise UserError(f"{path} {what}, but the run resumes from checkpoint step {start}, which "
                    f"covers steps 1-{start}: resuming would lose their history; put the file "
                    "back, or move the run folder away to start afresh")
  text = "".join(ln + "\n" for ln in keep)
  if text != (path.read_text() if path.exists() else ""):
    tmp = path.with_name(f".{path.name}.tmp")
    _write_text(tmp, text)
    tmp.replace(path)


def append_line(path: Path, line: str) -> None:
  """Append one line (a failed write names the file: the OS error alone would not)."""
  try:
    with path.open("a") as f:
      f.write(line + "\n")
  except OSError as e:
    raise OSError(e.errno, e.strerror, str(path)) from e


def _write_text(path: Path, text: str) -> None:
  try:
    path.write_text(text)
  except OSError as e:
    path.unlink(missing_ok=True)
    raise OSError(e.errno, e.strerror, str(path)) from e


# --- a resume is the same job ------------------------------------------------------------------

JOB_KEYS = ("model", "optimizer", "plan", "seed", "data")  # what a resume must keep
CONFIG_FILE = "config.json"  # the run's recorded config (dp_jax/tracking/run.py)
PLAN_FILE = "plan.json"


def check_same_job(output_dir: str | Path, config: Mapping[str, Any], plan: Mapping[str, Any],
                   steps: int) -> None:
  """Refuse (reading only) to continue a run folder's job with other settings.

  The folder's config.json and plan.json record the job: JOB_KEYS of `config` (the app's
  config as plain JSON, as config.json records it), the layers and global batch of `plan` (its
  JSON: Plan.to_json) must match; only `steps` may grow. A folder without a checkpoint or a
  metrics line (or without config.json) holds no job yet.
  """
  out = Path(output_dir)
  if not _trained(out):
    return  # nothing trained there yet (e.g. a run refused before its first step): a new job
  recorded = _read_record(out / CONFIG_FILE)
  if recorded is None:
    return
  config, plan = json.loads(dumps(config)), json.loads(dumps(plan))
  differs = []
  for key in JOB_KEYS:
    differs += _differences(key, recorded.get(key), config.get(key))
  recorded_plan = _read_record(out / PLAN_FILE)
  if recorded_plan is not None:
    if recorded_plan.get("global_batch") != plan.get("global_batch"):
      differs.append(f"batch_size ({recorded_plan.get('global_batch')} recorded, "
                     f"{plan.get('global_batch')} now)")
    elif _layout(recorded_plan) != _layout(plan):
      differs.append("the plan's layers (plan.json differs from the plan made now)")
  before = recorded.get("steps")
  if isinstance(before, int) and steps < before:
    differs.append(f"steps ({before} recorded, {steps} now: steps may only grow)")
  if differs:
    more = f" and {len(differs) - 4} more" if len(differs) > 4 else ""
    raise UserError(f"{out} holds another job: {'; '.join(differs[:4])}{more}; a resume must be "
                    "the same job (only steps may grow): use the recorded options or another "
                    "hydra.run.dir")


def _trained(out: Path) -> bool:
  """Whether the run folder holds training progress: a checkpoint or a metrics line."""
  checkpoints = out / "checkpoints"
  if checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()):
    return True
  metrics = out / METRICS_FILE
  return metrics.is_file() and metrics.stat().st_size > 0


def _read_record(path: Path) -> dict[str, Any] | None:
  if not path.is_file():
    return None
  try:
    record = json.loads(path.read_text())
  except json.JSONDecodeError:
    raise UserError(f"{path} is damaged (not valid JSON); the run folder's job cannot be "
                    "checked: move the folder away to start afresh") from None
  return record if isinstance(record, dict) else None


def _differences(key: str, old: Any, new: Any) -> list[str]:
  if isinstance(old, dict) and isinstance(new, dict):
    out = []
    for k in sorted(set(old) | set(new), key=lambda k: (k != "name", k)):
      out += _differences(f"{key}.{k}", old.get(k), new.get(k))
    return out
  return [] if old == new else [f"{key} ({old!r} recorded, {new!r} now)"]


def _layout(plan: dict[str, Any]) -> list[Any]:
  return [(lp.get("name"), lp.get("devices"), lp.get("samples"), lp.get("sharding"))
          for lp in plan.get("layers") or []]


def _progress(enabled: bool):
  # rich: only when a run trains (its import is not free)
  from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

  return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]:.4f}"), TimeElapsedColumn(),
                  disable=not enabled, transient=False)
