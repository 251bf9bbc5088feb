"""A measured foreground step (the runtime's alone stage calls) as a simulator timeline.

On CPU the runtime's stage calls run one after another, so the alone step is a chain of tasks,
each on its call's devices for its measured time; filling it with the shared policy predicts
what the runtime's orchestrator should get from the same windows (scripts/bench_multiplex.py),
on the same foreground noise when given the measured alone steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dp_jax.multiplex.policy import BackgroundJob
from dp_jax.simulator.fill import Fill, fill
from dp_jax.simulator.timeline import Task, Timeline, schedule
from dp_jax.simulator.windows import device_classes, idle_windows


def spans_of(devices: Sequence[int]) -> tuple[tuple[int, int], ...]:
  """Sorted devices as contiguous (first, count) spans."""
  out: list[list[int]] = []
  for d in sorted(set(devices)):
    if out and out[-1][0] + out[-1][1] == d:
      out[-1][1] += 1
    else:
      out.append([d, 1])
  return tuple((a, c) for a, c in out)


def chain_timeline(calls: Sequence[tuple[Sequence[int], float, str]],
                   num_devices: int) -> Timeline:
  """Calls (devices, ms, label) run one after another: one compute task each."""
  tasks = [Task(spans_of(devs), "compute", "fwd" if "fwd" in label else "bwd", label,
                float(ms), (i - 1,) if i else (), -1)
           for i, (devs, ms, label) in enumerate(calls)]
  start, end = schedule(tasks)
  return Timeline(num_devices, tuple(tasks), start, end)


def fill_measured(calls: Sequence[tuple[Sequence[int], float, str]], num_devices: int,
                  job: BackgroundJob, *, cap: float, iterations: int, switch_ms: float = 0.0,
                  actual_ms: np.ndarray | None = None, actual_switch_ms: float | None = None,
                  alone_steps_ms: Sequence[float] | None = None, seed: int = 0,
                  log_decisions: bool = False) -> Fill:
  """The shared policy replayed on a measured alone step (with the measured alone steps'
  noise when given, dp_jax/simulator/fill.py)."""
  tl = chain_timeline(calls, num_devices)
  classes = device_classes(tl)
  return fill(tl, classes, idle_windows(tl, classes), job, cap=cap, switch_ms=switch_ms,
              iterations=iterations, actual_ms=actual_ms, actual_switch_ms=actual_switch_ms,
              alone_steps_ms=alone_steps_ms,
              seed=seed, log_decisions=log_decisions)
