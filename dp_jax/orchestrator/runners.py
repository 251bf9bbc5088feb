"""A background job on real devices: per device, its own copy, program and synthetic data.

The job is a plan of its own: every layer on one device, consecutive layers grouped as the
policy's BackgroundJob says (dp_jax/multiplex/policy.py), one stage per group, compiled by the
runtime's build_program. A step is runtime.step.train_step on that program, with an on_stage
gate that holds each piece (fwd, fwd_bwd, bwd: one jitted program each) until the policy
admits it, and with `timer` so that every piece is waited for and measured: at most one piece
is outstanding per device. Each device keeps its own parameters and optimizer state (no
gradient sync, as DeepPool's background tasks), and draws its batch on the device from a key
seeded by (seed, device index) and the step.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax

from dp_jax.base.errors import UserError
from dp_jax.multiplex.policy import BackgroundJob
from dp_jax.planner.contract import check_plan, layout_plan
from dp_jax.runtime import data as datalib
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.stages import structure_graph
from dp_jax.runtime.step import Program, TrainState, build_program, init_state, train_step

PIECE_PHASES = ("fwd", "fwd_bwd", "bwd")


def check_batch(batch: Any) -> int:
  """The per-device batch as an int >= 1, or a one-line UserError."""
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
    raise UserError(f"background batch_per_device must be an integer >= 1, got {batch!r}")
  return batch


def piece_index(num_groups: int, stage: int, phase: str) -> int:
  """Position of a stage call in the step's piece order (multiplex.step_pieces)."""
  return stage if phase != "bwd" else 2 * num_groups - 2 - stage


@dataclass(eq=False)
class DeviceRunner:
  """One device's copy of the job: its program, state, data and completed steps."""

  index: int
  program: Program
  state: TrainState
  data: datalib.DataSource
  batch: int
  steps: int = 0

  def step(self, gate: Callable | None = None,
           timer: list[dict[str, Any]] | None = None) -> jax.Array:
    """One training step; gate(stage_program, phase) runs before each piece."""
    p = self.program
    x, y = datalib.batch_at(self.data, self.steps, self.batch, p.input_stage.batch,
                            p.last_stage.batch)
    self.state, loss = train_step(p, self.state, x, y, timer=timer, on_stage=gate)
    self.steps += 1
    return loss

  def host_state(self) -> dict[str, Any]:
    """Parameters, statistics and optimizer state as numpy arrays, and the step count."""
    return {"state": jax.tree.map(np.asarray, self.state), "steps": self.steps}

  def load(self, saved: dict[str, Any]) -> None:
    """Put a host_state() back onto this device."""
    like = self.state
    self.state = jax.tree.map(lambda a, v: jax.device_put(v, a.sharding), like, saved["state"])
    self.steps = int(saved["steps"])


def build_runners(model, name: str, groups: Sequence[Sequence[str]],
                  optimizer: optax.GradientTransformation, batch: int,
                  devices: dict[int, jax.Device], *, seed: int = 0) -> dict[int, DeviceRunner]:
  """A DeviceRunner per device: `model`'s current values, fresh optimizer state, one stage per
  group (empty groups: one stage per layer)."""
  batch = check_batch(batch)
  graph = structure_graph(model, name)
  defs, params, stats = split_layers(model)
  breaks = {g[0] for g in groups} if groups else set(graph.names)
  plan = check_plan(layout_plan(graph, lambda _: [0], global_batch=batch, num_devices=1), graph,
                    available_devices=1)
  out = {}
  for i, d in devices.items():
    program = build_program(graph, defs, plan, optimizer, [d], breaks)
    state = init_state(program, params, stats, optimizer)
    data = datalib.synthetic(model, seed=seed * 1000 + i)
    out[i] = DeviceRunner(i, program, state, data, batch)
  return out


def measured_pieces(runner: DeviceRunner, steps: int = 2) -> np.ndarray:
  """Per-piece ms: the median over steps 2..`steps` (the first compiles; steps=1: that one),
  a profile made here.

  Call it on every runner before its dispatch thread starts: it compiles the pieces, on the
  main thread (warning filters are process-wide, not per thread).
  """
  timer: list[dict[str, Any]] = []
  per_step = []
  with warnings.catch_warnings():  # compiles here; per-layer programs cannot reuse every
    warnings.filterwarnings("ignore", "Some donated buffers were not usable")  # donated buffer
    for _ in range(max(1, steps)):
      timer.clear()
      runner.step(timer=timer)
      calls = [t for t in timer if t["phase"] in PIECE_PHASES]
      per_step.append([1e3 * (t["end_s"] - t["start_s"]) for t in calls])
  return np.median(np.array(per_step[1:] or per_step), axis=0)


def piece_gap_ms(runner: DeviceRunner, steps: int = 3) -> float:
  """Host time per piece: a step's wall time (the dispatch thread's loop: the step, then its
  loss read) minus its pieces' time, over its pieces; the median of `steps` steps. This is the
  switch cost the simulator charges after each piece (it includes the step's data and loss)."""
  per = []
  for _ in range(steps):
    timer: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    float(runner.step(timer=timer))
    wall = time.perf_counter() - t0
    calls = [t for t in timer if t["phase"] in PIECE_PHASES]
    busy = sum(t["end_s"] - t["start_s"] for t in calls)
    per.append(1e3 * (wall - busy) / max(1, len(calls)))
  return float(np.median(per))


def job_of_runner(runner: DeviceRunner, name: str, pieces_ms: np.ndarray,
                  memory_bytes: float) -> BackgroundJob:
  """The policy's description of a runner's job, with the given piece times."""
  stages = runner.program.stages
  n = len(stages)
  names = [f"{p}:{g}" for p, g in [("fwd", g) for g in range(n - 1)] + [("fwd_bwd", n - 1)]
           + [("bwd", g) for g in range(n - 2, -1, -1)]]
  if len(pieces_ms) != len(names):
    raise ValueError(f"{len(pieces_ms)} piece times for {len(names)} pieces")
  return BackgroundJob(name, runner.batch, tuple(names), np.asarray(pieces_ms, dtype=float),
                       float(memory_bytes), tuple(s.stage.layers for s in stages))
