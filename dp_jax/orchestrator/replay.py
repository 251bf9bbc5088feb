"""The simulator's fill replayed on what a run's hook measured: the simulated slowdown beside
the measured one (the same policy on the same alone step, pieces and noise; as
scripts/bench_multiplex.py compares them)."""

from __future__ import annotations

from typing import Any

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


def replay(hook: BackgroundScheduler | None, num_devices: int, iterations: int
           ) -> dict[str, Any]:
  """Simulated added ms per step, alone ms and background samples/s of this process's job
  under its cap, over `iterations` steps ({} without a running job or alone steps)."""
  if (hook is None or hook.job is None or hook.admission is None or not hook.runners
      or iterations < 1):
    return {}
  sim = fill_measured(measured_chain(hook, num_devices), num_devices, hook.job, cap=hook.cap,
                      iterations=iterations, switch_ms=hook.switch_ms,
                      alone_steps_ms=hook.alone_steps_ms)
  total_ms = float(sim.iteration_ms.sum())
  return {"simulated_added_ms": float(sim.iteration_ms.mean() - sim.alone_mean_ms),
          "simulated_alone_ms": float(sim.alone_mean_ms),
          "simulated_background_samples_per_s":
              float(sim.bg_steps.sum()) * hook.job.batch / total_ms * 1e3}
