"""The training path of the apps: a plan trained on local devices, with its background job.

`train` and `pipeline` both describe a run as a typed `TrainSpec` (its plan checked once, at
the app's edge; to_json / from_json carry it to other processes) and call `train_spec` (in this
process, on given devices) or `train_pinned` (N processes, each pinned to its own core with one
CPU device, joined by jax.distributed on localhost; the only way on XLA:CPU that an idle device
is an idle core, so that a background job's slowdown cap means what it says:
dp_jax/runtime/pinned.py, docs/orchestrator.md).

A background job that fails to start, or dies while the foreground trains, fails the run with
one line (the foreground's files kept) unless its `on_failure` is `continue`; its failures are
counted in the summary either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.multiplex.policy import busy_in_every_layer
from dp_jax.planner.contract import Plan
from dp_jax.runtime import distributed, pinned
from dp_jax.runtime.local_devices import cpu_cores
from dp_jax.runtime.options import DataConfig, OptimizerConfig

log = logging.getLogger("dp_jax.orchestrator.jobs")
SHARE_CORES = "runtime.share_cores=true"  # the option that runs a cap on shared cores anyway


@dataclass(frozen=True)
class TrainSpec:
  """Everything one training run needs, typed and checked once (the train app and the main job
  build it at their edge; a background job the plan leaves no device for is refused here);
  to_json / from_json carry it to pinned processes."""

  model: ModelConfig
  plan: Plan  # checked against the model's graph and the devices (planner.contract.check_plan);
  # its JSON carries its options, shardings and stages: a pinned process runs it unchecked again
  steps: int  # steps in all (alone ones included)
  output_dir: str
  optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
  data: DataConfig = field(default_factory=DataConfig)
  background: BackgroundConfig = field(default_factory=BackgroundConfig)  # name none: alone
  alone_steps: int | None = None  # steps before the background job starts (None: the default)
  window_steps: int = 0  # > 0: then on and off in windows of this many steps (interleaved)
  memory_gb_per_device: float = 2.0
  checkpoint_dir: str | None = None
  checkpoint_every: int = 0
  background_checkpoint_dir: str | None = None
  progress: bool = True
  seed: int = 0

  def __post_init__(self) -> None:
    check_background_runs(self.background, self.plan)

  def to_json(self) -> dict[str, Any]:
    d = {f.name: getattr(self, f.name) for f in fields(self)}
    return {**d, "model": self.model.to_json(), "plan": self.plan.to_json(),
            "optimizer": asdict(self.optimizer), "data": asdict(self.data),
            "background": self.background.to_json()}

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> TrainSpec:
    return cls(**{**d, "model": ModelConfig.from_json(d["model"]),
                  "plan": Plan.from_json(d["plan"], "plan", planned=False),
                  "optimizer": OptimizerConfig(**d["optimizer"]), "data": DataConfig(**d["data"]),
                  "background": BackgroundConfig.from_json(d["background"])})


def honest_processes(num_devices: int | None, background: str, *,
                     cores: int | None = None) -> int:
  """Pinned processes (one device each) for a background job's cap on CPU: one per core by
  default; a one-line refusal naming runtime.share_cores when more devices than cores."""
  cores = cpu_cores() if cores is None else cores
  n = num_devices or cores
  if n > cores:
    raise UserError(
        f"runtime.num_devices={n} with background={background}: {n} devices on {cores} cores "
        "share cores, so an idle device is not an idle core and the slowdown cap cannot be "
        f"honoured; use runtime.num_devices<={cores} (one pinned process per core), or "
        f"{SHARE_CORES} to run it anyway (exactness tests: the cap does not hold)")
  return n


# --- in this process ------------------------------------------------------------------------


def train_spec(spec: TrainSpec, devices, *, log_fn=None, on_start=None) -> dict[str, Any]:
  """Train spec.plan on `devices` (with its background job); the summary of every process
  of the job (`merged`; in one process, its own).
  """
  return merged(distributed.gather_json(
      train_process(spec, devices, log_fn=log_fn, on_start=on_start)))


def train_process(spec: TrainSpec, devices, *, log_fn=None, on_start=None) -> dict[str, Any]:
  """This process's part of train_spec: train, measure, replay; its own summary.

  The foreground trains even if its background job failed to start or died (it never reads
  background arrays); `check_background` then decides whether the run fails.
  """
  # JAX: these modules import it, only once a process trains
  from dp_jax.orchestrator import launch as orchestrator
  from dp_jax.orchestrator.replay import replay
  from dp_jax.runtime import data as datalib
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.runtime.train_loop import train

  model = spec.model.build(seed=spec.seed)
  graph = structure_graph(model, spec.model.name)
  alone = (orchestrator.alone_steps(spec.steps) if spec.alone_steps is None
           else spec.alone_steps)
  hook = orchestrator.start_background(
      spec.background, spec.model, spec.plan, devices,
      memory_gb_per_device=spec.memory_gb_per_device, learning_rate=spec.optimizer.lr,
      seed=spec.seed, start_after=alone, checkpoint_dir=spec.background_checkpoint_dir,
      checkpoint_every=spec.checkpoint_every, window_steps=spec.window_steps)
  data = datalib.make_source(spec.data.source, model, path=spec.data.path, seed=spec.data.seed)
  out = Path(spec.output_dir)
  result = train(model, graph, spec.plan, steps=spec.steps, optimizer=spec.optimizer.build(),
                 data=data,
                 checkpoint_dir=spec.checkpoint_dir, checkpoint_every=spec.checkpoint_every,
                 log_fn=with_background(log_fn, hook), output_dir=out, devices=list(devices),
                 progress=spec.progress, on_stage=hook, on_start=on_start)
  png = gantt(result.timeline_path) if result.timeline_path is not None else None
  losses = result.losses
  summary: dict[str, Any] = {
      "stages": len(result.program.stages), "resumed_from_step": result.start_step,
      "final_step": result.final_step, "loss_first": losses[0] if losses else None,
      "final_loss": losses[-1] if losses else None, "median_step_ms": result.median_step_ms,
      "alone_steps": alone if hook is not None else None,
      "gantt": str(png) if png is not None else None,
      **orchestrator.measure(result.step_ms, hook),
      **replay(hook, spec.plan.num_devices, on_steps(hook, spec.steps))}
  if result.median_step_ms:
    summary["samples_per_s"] = result.program.global_batch / result.median_step_ms * 1e3
  if hook is not None:
    summary.update(background=spec.background.name, background_errors=list(hook.stats.errors),
                   background_on_failure=spec.background.on_failure,
                   background_slowdown_cap=spec.background.cap)
  return summary


def on_steps(hook, steps: int) -> int:
  """The steps of a run of `steps` that admitted its background job."""
  return 0 if hook is None else sum(hook.background_on(k) for k in range(steps))


def check_background(summary: dict[str, Any]) -> dict[str, Any]:
  """The summary, or a BackgroundFailed (one line) if its background job failed, or ran
  nothing at all (no piece: idle_cause says why), and the job's on_failure is `fail`."""
  if summary.get("background_on_failure") != "fail":
    return summary
  if summary.get("background_failures") or idle_cause(summary) is not None:
    raise BackgroundFailed(summary)
  return summary


def check_background_runs(background: BackgroundConfig, plan: Plan) -> None:
  """Refuse, before any work, a background job beside a plan that leaves no device idle (every
  layer on every device): it could run no step, and the run would report it as a success."""
  g = plan.num_devices
  placed = [layer.devices for layer in plan.layers]
  if background.active and placed and busy_in_every_layer(placed, g) == set(range(g)):
    raise UserError(f"background={background.name}: the plan leaves no device idle (every layer "
                    f"runs on all {g} devices), so the background job could run no step; use "
                    "background=none, or a plan that leaves a device idle in some layer (a "
                    "burst plan; planner.amplification_limit bounds how many devices it uses)")


def idle_cause(summary: dict[str, Any]) -> str | None:
  """Why a background job ran no piece at all, in words (None: it ran one, or there is none):
  the run was too short to start it, every piece it offered was refused under the slowdown
  cap, or no idle window opened for it."""
  if not summary.get("background") or summary.get("background_pieces") or summary.get(
      "background_steps") or summary.get("background_failures"):
    return None
  refused, cap = summary.get("background_refused") or 0, summary.get("background_slowdown_cap")
  cap_text = "no" if cap is None or cap == float("inf") else f"the {cap:.0%}"
  ran = (summary.get("final_step") or 0) - (summary.get("resumed_from_step") or 0)
  alone = summary.get("alone_steps")
  if alone is not None and ran <= alone:
    return (f"the run's {ran} step(s) all ran the foreground alone (its first {alone} measure "
            "it before the job starts); train more steps")
  if refused:
    return (f"each of the {refused} pieces it offered was refused under {cap_text} slowdown cap: "
            "the plan's idle windows are shorter than its pieces; lower "
            "background.batch_per_device or raise background.slowdown_cap")
  return "no idle window of the plan opened for it"


BACKGROUND_SUMS = ("background_steps", "background_failures", "background_pieces",
                   "background_refused", "background_samples_per_s")


def merged(summaries: list[dict[str, Any]]) -> dict[str, Any]:
  """One summary of a multi-process run: process 0's foreground (its clock), the background
  counters summed over the processes (each dispatches to its own devices)."""
  out = dict(summaries[0])
  if "background" not in out:
    return out
  for k in BACKGROUND_SUMS:
    values = [s.get(k) for s in summaries if s.get(k) is not None]
    out[k] = sum(values) if values else None
  out["background_errors"] = [e for s in summaries for e in s.get("background_errors") or []]
  # the simulator's fill on each dispatching process's measured alone step: added times add up
  sim = [s for s in summaries if s.get("simulated_alone_ms")]
  out.update(simulated_slowdown=sum(s["simulated_added_ms"] for s in sim)
             / sim[0]["simulated_alone_ms"] if sim else None,
             simulated_background_samples_per_s=sum(
                 s["simulated_background_samples_per_s"] for s in sim) if sim else None)
  for k in ("simulated_added_ms", "simulated_alone_ms"):
    out.pop(k, None)
  return out


class BackgroundFailed(UserError):
  """The background job failed while the foreground trained (its summary kept)."""

  def __init__(self, summary: dict[str, Any]):
    self.summary = summary
    errors = summary.get("background_errors") or ["?"]
    cause = idle_cause(summary)
    what = (f"ran no piece: {cause}" if cause is not None else
            f"failed ({summary['background_failures']} failure(s), first: {errors[0]}) after "
            f"{summary.get('background_steps', 0)} step(s)")
    super().__init__(
        f"background job {summary.get('background')} {what}; the foreground trained "
        f"{summary.get('final_step')} steps and kept its files (background.on_failure=continue "
        "finishes the run regardless)")


def with_background(log_fn, hook):
  """log_fn, plus the background job's counters under background/ (same step)."""
  if hook is None or log_fn is None:
    return log_fn

  def logged(metrics: dict[str, Any], step: int) -> None:
    bg = {f"background/{k}": v for k, v in hook.stats.metrics().items() if v is not None}
    log_fn({**metrics, **bg}, step)

  return logged


def gantt(timeline_path: Path) -> Path | None:
  """gantt.png of the measured step, drawn by the simulator's plotter (None if absent)."""
  try:
    # the plotter: only when a run wrote a timeline
    from dp_jax.simulator.gantt import plot_gantt
    from dp_jax.simulator.timeline import Event
  except ImportError:
    return None
  t = json.loads(Path(timeline_path).read_text())
  events = [Event(**{**e, "devices": tuple(e["devices"])}) for e in t["alone"]["events"]]
  return plot_gantt(events, t["num_devices"], Path(timeline_path).with_name("gantt.png"),
                    title=f"{t['model']} B={t['global_batch']}: measured step {t['step']}")


# --- pinned processes -----------------------------------------------------------------------

WORKER_TIMEOUT_S = 1800


def train_pinned(spec: TrainSpec, processes: int, *, timeout_s: float = WORKER_TIMEOUT_S,
                 echo: bool = True) -> dict[str, Any]:
  """train_spec in `processes` processes, process i pinned to core i with one CPU device.

  Process 0 prints to this terminal (echo) and writes the run's files; the summary comes back
  from it. A failed run raises its one-line UserError (a failed process: its last log line).
  """
  with tempfile.TemporaryDirectory(prefix="dp_jax_pinned_") as tmp:
    spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
    spec_path.write_text(json.dumps(spec.to_json()))
    procs = pinned.start(["-m", "dp_jax.orchestrator.jobs", str(spec_path), str(result_path),
                          str(os.getpid())], processes, tmp, echo_first=echo, cwd=os.getcwd())
    try:
      codes = pinned.wait(procs, timeout_s)
    finally:  # interrupted, terminated or failed here: the workers end with this process
      pinned.wait(procs, 0)
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if result is not None and result.get("error"):
      raise UserError(result["error"])
    if any(codes) or result is None:
      bad = next((i for i, c in enumerate(codes) if c), 0)
      logf = Path(tmp) / f"process_{bad}.log"
      lines = logf.read_text().strip().splitlines() if logf.is_file() else []
      last = next((ln for ln in reversed(lines) if ln.startswith("error: ")),
                  lines[-1] if lines else "see its output above" if echo and bad == 0
                  else "no output")
      raise UserError(f"pinned training process {bad} of {processes} failed (exit "
                      f"{codes[bad]}): {last.removeprefix('error: ')}")
  return result["summary"]


def _worker(spec_path: str, result_path: str, parent: str | None = None) -> int:
  """One pinned process of train_pinned: join, train, process 0 writes the result. It ends
  with its parent (`parent`: its pid), however that ends."""
  summary, error, code = None, None, 0
  if parent is not None:
    end_with_parent(int(parent))
  try:
    pinned.check_pinned()  # before JAX sizes its thread pools
    distributed.initialize()
    # a first collective while the processes are together: it sets up the collectives'
    # context, whose set-up waits 30 s at most; later collectives wait as long as a peer needs
    # (one process may set up a background job for longer than that)
    distributed.gather_json("joined")
    import jax  # JAX: only now, in a pinned and joined process

    spec = TrainSpec.from_json(json.loads(Path(spec_path).read_text()))
    summary = check_background(train_spec(spec, jax.devices()))
  except BackgroundFailed as e:
    summary, error, code = e.summary, str(e), 2
  except UserError as e:
    error, code = str(e), 2
  except Exception as e:  # noqa: BLE001 - one line for the launcher, as the apps give
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    error, code = f"{type(e).__name__}: {first}", 1
  if distributed.process_index() == 0:
    Path(result_path).write_text(json.dumps({"summary": summary, "error": error}, default=str))
  elif error is not None:
    print(f"error: {error}", file=sys.stderr)
  return code


def end_with_parent(parent: int) -> None:
  """Have the kernel kill this process when its parent ends (Linux PR_SET_PDEATHSIG; also when
  the parent is killed and can stop nobody); exit at once if the parent is already gone."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):  # not Linux: the parent's own clean-up stops the workers
    pass
  if os.getppid() != parent:
    os._exit(1)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


if __name__ == "__main__":
  logging.basicConfig(level=logging.WARNING, format="[%(name)s][%(levelname)s] - %(message)s")
  logging.getLogger("dp_jax").setLevel(logging.INFO)
  sys.exit(_worker(*sys.argv[1:4]))
