"""From a background config to a running hook: validate, check memory, build, warm up.

Bad settings (slowdown cap, batch, a job that cannot fit beside the foreground) raise one-line
UserErrors before anything is built. Anything that fails while building or compiling the job
is logged and gives a stopped hook (its failure counted); the foreground runs regardless.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from dp_jax.errors import UserError
from dp_jax.orchestrator.background import GB, build_job, check_batch, memory_bytes
from dp_jax.orchestrator.scheduler import BackgroundScheduler, check_cap

log = logging.getLogger(__name__)


def foreground_bytes(plan: Mapping[str, Any], graph) -> dict[int, float]:
  """Device -> bytes the foreground holds: the planner's peak if the plan has it, else
  params+grads+momentum and saved activations of the layers on each device (traced graph)."""
  peak = (plan.get("predicted") or {}).get("memory_peak_gb")
  devices = range(int(plan["num_devices"]))
  if peak is not None:
    return {d: float(peak) * GB for d in devices}
  nodes = {n.name: n for n in graph.nodes}
  used = {d: 0.0 for d in devices}
  for layer in plan["layers"]:
    n = nodes[layer["name"]]
    for d, (a, b) in zip(layer["devices"], layer["samples"], strict=True):
      used[d] += 3 * n.param_bytes + (b - a) * n.out_bytes_per_sample
  return used


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


def start_background(bg_cfg: Any, fg_model_cfg: Any, plan: Mapping[str, Any],
                     devices: Sequence[jax.Device], *, memory_gb_per_device: float,
                     learning_rate: float = 0.01, seed: int = 0, start_after: int = 0,
                     max_in_flight: int = 1) -> BackgroundScheduler | None:
  """The hook of background job `bg_cfg` on `devices` (None for background=none)."""
  import optax

  from dp_jax import zoo

  if bg_cfg is None or bg_cfg.name in (None, "none"):
    return None
  cap = check_cap(bg_cfg.slowdown_cap)
  batch = check_batch(bg_cfg.batch_per_device)
  model_cfg = bg_cfg.model if bg_cfg.model is not None else fg_model_cfg
  need = memory_bytes(zoo.graph_of(model_cfg, seed), batch)
  fg_graph = None if "memory_peak_gb" in (plan.get("predicted") or {}) else zoo.graph_of(
      fg_model_cfg, seed)
  check_fits(model_cfg.name, batch, need, foreground_bytes(plan, fg_graph), memory_gb_per_device)
  name = f"{bg_cfg.name}:{model_cfg.name}"
  try:
    model = zoo.build(model_cfg, seed=seed + 1)
    # several processes: each dispatches only to the devices it owns
    mine = {i: d for i, d in enumerate(devices) if d.process_index == jax.process_index()}
    job = build_job(name, model, optax.sgd(learning_rate, momentum=0.9), batch, mine, seed=seed)
    jax.block_until_ready([job.dispatch(i) for i in job.copies])  # compile on every device
  except UserError:
    raise
  except Exception as e:  # noqa: BLE001 - the foreground must run without it
    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    log.warning("background job %s failed to start and is stopped: %s", name, msg)
    return BackgroundScheduler(None, start_after=start_after, slowdown_cap=cap, failures=[msg])
  log.info("background job %s: batch %d on %d device(s), slowdown cap %s", name, batch,
           len(job.copies), cap)
  return BackgroundScheduler(job, start_after=start_after, slowdown_cap=cap,
                             max_in_flight=max_in_flight)


def alone_steps(steps: int) -> int:
  """Steps a run leaves to the foreground alone: compile, timed step, then half the rest."""
  return 2 + max(1, (steps - 2) // 2)


def measure(step_ms: Sequence[float], hook: BackgroundScheduler | None) -> dict[str, Any]:
  """Foreground step time alone vs with the background job (same run) and the job's output.

  Means, not medians: a background step that delays one foreground step is a real cost.
  """
  import statistics

  if hook is None:
    alone = list(step_ms[2:]) or list(step_ms[1:]) or list(step_ms)
    return {"measured_step_ms": statistics.fmean(alone) if alone else None}
  stats = hook.drain()
  a = hook.start_after
  alone, with_bg = list(step_ms[2:a]), list(step_ms[a:])
  out: dict[str, Any] = {
      "measured_step_ms": statistics.fmean(alone) if alone else None,
      "measured_step_ms_with_background": statistics.fmean(with_bg) if with_bg else None,
      "foreground_slowdown": None, "background_samples_per_s": stats.samples_per_s,
      "background_steps": stats.steps, "background_failures": stats.failures,
      "background_paused_steps": stats.paused_steps}
  if alone and with_bg:
    out["foreground_slowdown"] = out["measured_step_ms_with_background"] / out[
        "measured_step_ms"] - 1.0
  return out
