"""Measured step times of several plans, interleaved so that machine load drifts hit all alike.

Plans run in groups of `group` (each plan's program, parameters and optimizer state are held
only while its group runs). In a group every plan first runs `warmup` steps (the first
compiles), then `steps` rounds; in a round every plan takes its turn: `runs_per_turn` steps in
a row, only the last one timed, waiting for the loss and the new state. Training runs one plan
step after step, so a step is timed right after a step of the same plan (caches, allocator and
threads warm for it), while the rounds still spread every plan's samples over the same time
(load drift hits all alike). A plan's time is the median (or min) of its timed steps.

`turns` is the rule itself, shared with the profile (dp_jax.measurement.in_context, boundary,
local_links): a call's turn runs it until it has run `runs_per_turn` times in a row (counting
runs just before the turn, so a call alone in its rounds runs once per round after the first).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import optax

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.planner.contract import Plan
from dp_jax.runtime import data as datalib
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.step import build_program, init_state, train_step

STATISTICS = {"median": statistics.median, "min": min}
RUNS_PER_TURN = 2  # a timed run follows one run of the same program, as in training


def turns[T](calls: Sequence[Callable[[], T]], rounds: int, *, runs_per_turn: int = RUNS_PER_TURN,
          warmup: int = 0) -> list[list[T]]:
  """[call][round] results: `warmup` runs per call, then rounds of turns (last run of each kept)."""
  if runs_per_turn < 1 or rounds < 0 or warmup < 0:
    raise UserError(f"runs_per_turn must be >= 1, rounds and warmup >= 0, got {runs_per_turn}, "
                    f"{rounds} and {warmup}")
  streak = [-1, 0]  # the call that ran last, and how many times in a row

  def run(i: int) -> T:
    streak[:] = [i, streak[1] + 1 if streak[0] == i else 1]
    return calls[i]()

  for i in range(len(calls)):
    for _ in range(warmup):
      run(i)
  out: list[list[T]] = [[] for _ in calls]
  for _ in range(rounds):
    for i in range(len(calls)):
      result = run(i)
      while streak[1] < runs_per_turn:
        result = run(i)
      out[i].append(result)
  return out


def timed[T](call: Callable[[], T]) -> Callable[[], tuple[float, T]]:
  """call, returning (its wall ms, its result)."""

  def run() -> tuple[float, T]:
    t0 = time.perf_counter()
    result = call()
    return (time.perf_counter() - t0) * 1e3, result

  return run


@dataclass(frozen=True)
class PlanTiming:
  """The timed steps of one plan and its runtime stage count."""

  step_ms: tuple[float, ...]
  stages: int
  loss: float

  def ms(self, statistic: str = "median") -> float:
    return STATISTICS[statistic](self.step_ms)


def stepper(model, graph: LayerGraph, plan: Plan, devices: Sequence[jax.Device],
            optimizer: optax.GradientTransformation, seed: int = 0) -> tuple[Callable, int]:
  """(one_step() -> loss, number of stages) for `plan` (checked by
  planner.contract.check_plan, for `graph` and at most len(devices) devices) on `devices`, on
  a fixed batch."""
  if not isinstance(plan, Plan) or not plan.stages or plan.num_devices > len(devices):
    raise TypeError(f"stepper takes a Plan checked by planner.contract.check_plan for "
                    f"{len(devices)} devices, not {type(plan).__name__}")
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, plan, optimizer, list(devices))
  box = [init_state(program, params, stats, optimizer)]
  src = datalib.synthetic(model, seed=seed)
  x, y = datalib.batch_at(src, 0, plan.global_batch, program.input_stage.batch,
                          program.last_stage.batch)

  def one() -> jax.Array:
    box[0], loss = train_step(program, box[0], x, y)
    jax.block_until_ready((loss, box[0]))
    return loss

  return one, len(program.stages)


def time_plans(build: Callable[[], Any], graph: LayerGraph, plans: Sequence[Plan],
               devices: Sequence[jax.Device], *, steps: int, warmup: int = 2, group: int = 4,
               runs_per_turn: int = RUNS_PER_TURN,
               optimizer: optax.GradientTransformation | None = None,
               progress: Callable[[str], None] | None = None) -> list[PlanTiming]:
  """Timed steps of each checked plan (build() makes a fresh model per plan), interleaved per
  group."""
  if steps < 1:
    raise UserError(f"steps must be >= 1, got {steps}")
  optimizer = optimizer or optax.sgd(0.01, momentum=0.9)
  out: list[PlanTiming] = []
  for lo in range(0, len(plans), max(group, 1)):
    chunk = plans[lo:lo + max(group, 1)]
    steppers = [stepper(build(), graph, p, devices, optimizer) for p in chunk]
    runs = turns([timed(one) for one, _ in steppers], steps, runs_per_turn=runs_per_turn,
                 warmup=max(warmup, 1))
    out += [PlanTiming(tuple(ms for ms, _ in r), n, float(r[-1][1])) for r, (_, n) in
            zip(runs, steppers, strict=True)]
    if progress is not None:
      progress(f"timed plans {lo + 1}-{lo + len(chunk)} of {len(plans)}")
    del steppers
  return out
