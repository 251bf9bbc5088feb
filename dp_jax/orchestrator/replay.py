"""The simulator's fill replayed on what a run's hook measured: the simulated slowdown and
background samples/s beside the measured ones (the same policy on the same alone step, pieces,
switch and noise; as scripts/bench_multiplex.py compares them).

The pieces and the host time between them are replayed as the run measured them beside the
foreground (`measured_pieces`), the policy's profile and switch as the run's policy had them:
the profile is timed alone on the main thread before the foreground starts, and beside it the
same pieces ran 0.7-1.7x that at batch 8 here and the host time between two pieces differed
from the profiled switch (docs/orchestrator.md, "Validated range")."""

from __future__ import annotations

from typing import Any

import numpy as np

from dp_jax.orchestrator.scheduler import BackgroundScheduler
from dp_jax.simulator.measured import fill_measured


def measured_chain(hook: BackgroundScheduler, num_devices: int) -> list:
  """The hook's measured alone calls as the simulator's chain: devices without this process's
  job count as busy; a held call ends early by its probed move, which then occupies every
  device (docs/orchestrator.md, "Several processes")."""
  own = set(hook.own_devices) if hook.own_devices is not None else set(range(num_devices))
  return chain_of(hook, num_devices, set(hook.runners), own)


def chain_of(hook: BackgroundScheduler, num_devices: int, job_devices: set[int],
             own: set[int]) -> list:
  """measured_chain with the background job's devices and this process's own devices given
  (scripts/bench_multiplex.py's processes know them up front)."""
  others = {i for i in range(num_devices) if i not in job_devices}
  out = []
  for j, (devs, ms, label) in enumerate(hook.alone_calls):
    lead = min(hook.lead_ms(j), ms) if not set(devs) & own else 0.0
    busy = tuple(sorted({*devs, *others}))
    if lead < ms:
      out.append((busy, ms - lead, label))
    if lead > 0:
      out.append((tuple(range(num_devices)), lead, f"{label}:move"))
  return out


def measured_pieces(hook: BackgroundScheduler) -> tuple[np.ndarray, float]:
  """(Per piece: the mean of its times measured in the run, its profile where none ran; the mean
  host gap between two pieces run back to back, the profiled switch where none was)."""
  job, stats = hook.job, hook.stats
  ms = np.array([np.mean(stats.piece_times_ms[k]) if stats.piece_times_ms.get(k) else p
                 for k, p in enumerate(job.pieces_ms)], dtype=float)
  gap = float(np.mean(stats.gaps_ms)) if stats.gaps_ms else hook.switch_ms
  return ms, max(gap, 0.0)


def replay(hook: BackgroundScheduler | None, num_devices: int, iterations: int
           ) -> dict[str, Any]:
  """Simulated added ms per step, alone ms and background samples/s of this process's job
  under its cap, over `iterations` steps ({} without a running job or alone steps)."""
  if (hook is None or hook.job is None or hook.admission is None or not hook.runners
      or iterations < 1):
    return {}
  actual_ms, gap_ms = measured_pieces(hook)
  sim = fill_measured(measured_chain(hook, num_devices), num_devices, hook.job, cap=hook.cap,
                      iterations=iterations, switch_ms=hook.switch_ms, actual_ms=actual_ms,
                      actual_switch_ms=gap_ms, alone_steps_ms=hook.alone_steps_ms)
  total_ms = float(sim.iteration_ms.sum())
  return {"simulated_added_ms": float(sim.iteration_ms.mean() - sim.alone_mean_ms),
          "simulated_alone_ms": float(sim.alone_mean_ms),
          "simulated_background_samples_per_s":
              float(sim.bg_steps.sum()) * hook.job.batch / total_ms * 1e3}
