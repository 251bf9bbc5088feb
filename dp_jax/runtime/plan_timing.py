"""Measured step times of several plans, interleaved so that machine load drifts hit all alike.

Plans run in groups of `group` (each plan's program, parameters and optimizer state are held
only while its group runs). In a group every plan first runs `warmup` steps (the first
compiles), then `steps` rounds each time one step of every plan in turn, waiting for the loss
and the new state. A plan's time is the median (or min) of its timed steps.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import optax

from dp_jax.graph import LayerGraph
from dp_jax.runtime import data as datalib
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.plan_check import check_plan
from dp_jax.runtime.step import build_program, init_state, train_step

STATISTICS = {"median": statistics.median, "min": min}


@dataclass(frozen=True)
class PlanTiming:
  """The timed steps of one plan and its runtime stage count."""

  step_ms: tuple[float, ...]
  stages: int
  loss: float

  def ms(self, statistic: str = "median") -> float:
    return STATISTICS[statistic](self.step_ms)


def stepper(model, graph: LayerGraph, plan: dict[str, Any], devices: Sequence[jax.Device],
            optimizer: optax.GradientTransformation, seed: int = 0) -> tuple[Callable, int]:
  """(one_step() -> loss, number of stages) for `plan` on `devices`, on a fixed batch."""
  defs, params, stats = split_layers(model)
  checked = check_plan(plan, graph, available_devices=len(devices))
  program = build_program(graph, defs, checked, optimizer, list(devices))
  box = [init_state(program, params, stats, optimizer)]
  src = datalib.synthetic(model, seed=seed)
  x, y = datalib.batch_at(src, 0, checked.global_batch, program.input_stage.batch,
                          program.last_stage.batch)

  def one() -> jax.Array:
    box[0], loss = train_step(program, box[0], x, y)
    jax.block_until_ready((loss, box[0]))
    return loss

  return one, len(program.stages)


def time_plans(build: Callable[[], Any], graph: LayerGraph, plans: Sequence[dict[str, Any]],
               devices: Sequence[jax.Device], *, steps: int, warmup: int = 2, group: int = 4,
               optimizer: optax.GradientTransformation | None = None,
               progress: Callable[[str], None] | None = None) -> list[PlanTiming]:
  """Timed steps of each plan (build() makes a fresh model per plan), interleaved per group."""
  optimizer = optimizer or optax.sgd(0.01, momentum=0.9)
  out: list[PlanTiming] = []
  for lo in range(0, len(plans), max(group, 1)):
    chunk = plans[lo:lo + max(group, 1)]
    steppers = [stepper(build(), graph, p, devices, optimizer) for p in chunk]
    losses = [None] * len(chunk)
    for i, (one, _) in enumerate(steppers):
      for _ in range(max(warmup, 1)):
        losses[i] = one()
    times: list[list[float]] = [[] for _ in chunk]
    for _ in range(steps):
      for i, (one, _) in enumerate(steppers):
        t0 = time.perf_counter()
        losses[i] = one()
        times[i].append((time.perf_counter() - t0) * 1e3)
    out += [PlanTiming(tuple(t), n, float(loss)) for t, (_, n), loss in
            zip(times, steppers, losses, strict=True)]
    if progress is not None:
      progress(f"timed plans {lo + 1}-{lo + len(chunk)} of {len(plans)}")
    del steppers
  return out
