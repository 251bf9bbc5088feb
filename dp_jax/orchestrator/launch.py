"""From a background spec to a running hook: check memory, build, warm up.

The spec's cap and batch are checked where it is decoded (multiplex.background.BackgroundConfig);
a job that cannot fit beside the foreground is a one-line UserError before anything is built.
Anything that fails while building or compiling the job is logged and gives a stopped hook (its
failure counted); the foreground runs regardless.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.models.zoo import ModelConfig
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.multiplex.policy import (
  DEFAULT_PIECE_MS,
  busy_in_every_layer,
  layer_groups,
  noise_threshold_ms,
)
from dp_jax.orchestrator.runners import (
  build_runners,
  job_of_runner,
  measured_pieces,
  piece_gap_ms,
)
from dp_jax.orchestrator.scheduler import BackgroundScheduler, load_checkpoint
from dp_jax.planner import memory
from dp_jax.planner.contract import Plan

log = logging.getLogger(__name__)
GB = 1e9


def memory_bytes(graph: LayerGraph, batch: int, state_copies: int = 3) -> float:
  """Params, grads and momentum (state_copies x param bytes) + saved activations at `batch`
  (the planner's memory model, dp_jax/planner/memory.py)."""
  return memory.job_bytes(graph, batch, grad_bytes_per_param=4,
                          optimizer_bytes_per_param=4 * (state_copies - 2))


def foreground_bytes(plan: Plan, graph: LayerGraph | None) -> dict[int, float]:
  """Device -> bytes the foreground holds: the planner's peak if the plan has it, else the
  memory model's params+grads+momentum and saved activations per device (traced graph)."""
  peak = plan.predicted.get("memory_peak_gb")
  devices = range(plan.num_devices)
  if peak is not None:
    return {d: float(peak) * GB for d in devices}
  used = memory.placed_bytes(graph, plan, optimizer_bytes_per_param=4)
  return {d: float(used[d]) for d in devices}


def check_fits(name: str, batch: int, need: float, used: Mapping[int, float],
               capacity_gb: float) -> None:
  """One-line UserError unless the job fits beside the foreground on every one of its devices."""
  d = max(used, key=lambda k: used[k])
  free = capacity_gb * GB - used[d]
  if need > free:
    raise UserError(
        f"background job {name} at batch {batch} needs {need / GB:.2f} GB per device but device "
        f"{d} has only {max(free, 0) / GB:.2f} GB free beside the foreground ({capacity_gb:g} GB "
        "in all); use a smaller background batch_per_device, a smaller model or background=none")


def start_background(background: BackgroundConfig, foreground: ModelConfig, plan: Plan,
                     devices: Sequence[jax.Device], *, memory_gb_per_device: float,
                     learning_rate: float = 0.01, seed: int = 0, start_after: int = 0,
                     piece_ms: float = DEFAULT_PIECE_MS, margin: float = 0.0,
                     checkpoint_dir: str | Path | None = None, checkpoint_every: int = 0,
                     window_steps: int = 0) -> BackgroundScheduler | None:
  """The hook of `background` beside the foreground model's `plan` on `devices` (None for
  background=none).

  Pieces: consecutive layers grouped while a group's measured forward and backward stay within
  piece_ms; their times, measured here on the first device, are the policy's profile. With a
  checkpoint_dir, the job resumes from its background checkpoint there and saves beside the
  foreground's (every checkpoint_every steps and at the end). window_steps > 0: on and off in
  windows of that many steps after the alone ones (scheduler.BackgroundScheduler).
  """
  if not background.active:
    return None
  cap, batch = background.cap, background.batch_per_device
  spec = background.model_for(foreground)
  need = memory_bytes(spec.graph(seed), batch)
  fg_graph = None if "memory_peak_gb" in plan.predicted else foreground.graph(seed)
  check_fits(spec.name, batch, need, foreground_bytes(plan, fg_graph), memory_gb_per_device)
  name = f"{background.name}:{spec.name}"
  placed = [layer.devices for layer in plan.layers]
  kw = dict(start_after=start_after, slowdown_cap=process_cap(cap, placed, devices),
            margin=margin, window_steps=window_steps)
  if jax.process_count() > 1:
    kw["own_devices"] = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
  # several processes: each dispatches only to the devices it owns; a device every layer uses
  # is never idle and gets no copy of the job (nor its compile time on that device's core)
  busy = busy_in_every_layer(placed, len(devices)) if placed else set()
  devs = {i: d for i, d in enumerate(devices)
          if d.process_index == jax.process_index() and i not in busy}
  if not devs:
    log.info("background job %s: no device of this process is ever idle", name)
    return BackgroundScheduler(None, {}, **kw)
  try:
    model = spec.build(seed=seed + 1)
    opt = optax.sgd(learning_rate, momentum=0.9)
    first = next(iter(devs))
    runners = build_runners(model, spec.name, [], opt, batch, devs, seed=seed)
    pieces = measured_pieces(runners[first])
    groups = _groups(runners[first], pieces, piece_ms)
    if any(len(g) > 1 for g in groups):
      runners = build_runners(model, spec.name, groups, opt, batch, devs, seed=seed)
      pieces = measured_pieces(runners[first])
    kw["switch_ms"] = piece_gap_ms(runners[first])  # the policy's switch, as the simulator's
    for r in runners.values():
      if r.index != first:
        measured_pieces(r, steps=1)  # compile on every device before the foreground starts
      r.steps = 0
    job = job_of_runner(runners[first], name, pieces, need)
    if checkpoint_dir is not None and load_checkpoint(runners, checkpoint_dir):
      log.info("background job %s resumed from %s", name, checkpoint_dir)
  except UserError:
    raise
  except Exception as e:  # noqa: BLE001 - the foreground must run without it
    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    log.warning("background job %s failed to start and is stopped: %s", name, msg)
    return BackgroundScheduler(None, failures=[msg], **kw)
  log.info("background job %s: batch %d on %d device(s), %d pieces, slowdown cap %s", name,
           batch, len(runners), len(job.pieces_ms), cap)
  return BackgroundScheduler(job, runners, checkpoint_dir=checkpoint_dir,
                             checkpoint_every=checkpoint_every, **kw)


def process_cap(cap: float, placed: Iterable[Iterable[int]],
                devices: Sequence[jax.Device]) -> float:
  """This process's share of the cap: each process admits against its own budget, so with k
  processes owning devices that some layer (or stage) leaves idle, each gets cap / k (their
  added times add up). placed: each layer's (or stage's) device indices."""
  everywhere = busy_in_every_layer(placed, len(devices))
  k = len({devices[i].process_index for i in range(len(devices)) if i not in everywhere})
  return cap / k if k > 1 else cap


def _groups(runner, layer_pieces_ms, piece_ms: float) -> list[list[str]]:
  """Layer groups of at most piece_ms forward and backward, from a one-layer-per-stage step."""
  stages = runner.program.stages
  n = len(stages)
  names = [s.stage.layers[0] for s in stages]
  fwd = [float(layer_pieces_ms[i]) for i in range(n)]
  bwd = [0.0] * n
  for i in range(n - 1):
    bwd[i] = float(layer_pieces_ms[2 * n - 2 - i])
  return [[names[i] for i in g] for g in layer_groups(names, fwd, bwd, piece_ms)]


def host_load() -> dict[str, Any]:
  """The machine's 1-minute load average (runnable processes, this job's included) and its
  cores: a load above the cores means other work shared them while the steps were timed."""
  try:
    load = os.getloadavg()[0]
  except OSError:  # not every platform has it
    return {}
  return {"host_load": round(load, 2), "host_cores": os.cpu_count()}


def alone_steps(steps: int) -> int:
  """Steps a run leaves to the foreground alone: compile, timed step, then half the rest."""
  return 2 + max(1, (steps - 2) // 2)


def measure(step_ms: Sequence[float], hook: BackgroundScheduler | None) -> dict[str, Any]:
  """Foreground step time alone vs with the background job (same run) and the job's output.

  Without windows: the mean of the calibration steps against the mean of the steps after them.
  With interleaved windows (hook.window_steps; scheduler.step_kind says which step is which):
  the steps are fitted as ms = alone + drift x step + slowdown_ms x [with], so a load from other
  processes that grows or falls linearly over the run cancels (the alone and with steps of a
  window pair sit at different times), and alone and with are reported at the run's mean step;
  the noise is the fit's residual scatter. Means, not medians: a background step that delays
  one foreground step is a real cost. The host's load (1-minute average, other processes
  included) is reported with it: host_load, host_cores.
  """
  if hook is None:
    alone = list(step_ms[2:]) or list(step_ms[1:]) or list(step_ms)
    return {"measured_step_ms": statistics.fmean(alone) if alone else None}
  stats = hook.drain()
  kinds = [hook.step_kind(k) for k in range(len(step_ms))]
  alone_kind = "alone" if hook.window_steps else "calibration"
  alone = [ms for ms, kind in zip(step_ms, kinds, strict=True) if kind == alone_kind]
  with_bg = [ms for ms, kind in zip(step_ms, kinds, strict=True) if kind == "with"]
  out: dict[str, Any] = {
      "measured_step_ms": statistics.fmean(alone) if alone else None,
      "measured_step_ms_with_background": statistics.fmean(with_bg) if with_bg else None,
      "foreground_slowdown": None, "background_samples_per_s": stats.samples_per_s,
      "background_steps": stats.steps, "background_failures": stats.failures,
      "background_pieces": stats.dispatched, "background_refused": stats.refused,
      "alone_steps_measured": len(alone), "with_steps_measured": len(with_bg),
      "window_steps": hook.window_steps or None, **host_load()}
  if not (alone and with_bg):
    return out
  sd = statistics.stdev(alone) if len(alone) >= 2 else 0.0
  if hook.window_steps and len(alone) >= 2 and len(with_bg) >= 2:
    at, sd = drift_free(step_ms, kinds)
    out["measured_step_ms"], out["measured_step_ms_with_background"] = at
  out["foreground_slowdown"] = out["measured_step_ms_with_background"] / out[
      "measured_step_ms"] - 1.0
  # the slowdown the alone steps' own noise reaches with probability 1% (the policy's test)
  out["foreground_slowdown_noise"] = (noise_threshold_ms(sd, len(alone), len(with_bg))
                                      / out["measured_step_ms"] if len(alone) >= 2 else None)
  return out


def drift_free(step_ms: Sequence[float], kinds: Sequence[str]
               ) -> tuple[tuple[float, float], float]:
  """((alone ms, with ms) at the mean step, the residual standard deviation) of a least-squares
  fit of the alone and with steps to alone + drift x step + added x [with]."""
  rows = [(k, ms, kind == "with") for k, (ms, kind) in enumerate(zip(step_ms, kinds, strict=True))
          if kind in ("alone", "with")]
  k = np.array([r[0] for r in rows], dtype=float)
  y = np.array([r[1] for r in rows], dtype=float)
  w = np.array([r[2] for r in rows], dtype=float)
  x = np.stack([np.ones_like(k), k - k.mean(), w], axis=1)
  coef, *_ = np.linalg.lstsq(x, y, rcond=None)
  resid = y - x @ coef
  sd = float(np.sqrt(resid @ resid / max(len(y) - 3, 1)))
  alone_ms = float(coef[0])  # steps centred on their mean: the intercept is alone there
  return (alone_ms, alone_ms + float(coef[2])), sd
