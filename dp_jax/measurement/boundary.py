"""What a stage boundary costs: the model cut into two stages on the same devices, measured.

A plan's stage that is not the last runs a forward and a backward program (its residuals
written by one and read by the other, no fusion across them), and the stage after it starts
from a program input, after another program ran, with its own first layers compiled apart
from their predecessors. For a cut after layer k (series-parallel order) the runtime's own
two-stage program on the g devices of a data-parallel stage (dp_jax.runtime.step.build_program
with a break at layer k+1, run by train_step with a timer) gives, per step: fwd(P_k) and
bwd(P_k) of the first stage and fused(S_k) of the second (the suffix, as the last stage runs
it); each round also steps the uncut model (one fused program, U). In a round each of the two
is stepped `runs_per_turn` times in a row and only the last step timed
(dp_jax.measurement.plan_timing.turns): a step is timed right after a step of the same program, as
training runs it. The boundary's cost is the paired difference within the round, net of the
empty call e of each extra program call (their host work is local_links' stage_us):

  boundary_k = fwd(P_k) + bwd(P_k) + fused(S_k) - 2e - U

rescaled by the profile's level of the whole model over its round's U (net of e; load drifting
between the profile's rounds cancels). Boundaries not measured are interpolated linearly in k
(nearest outside the measured cuts). A plan's boundary between a stage of per-device batch b1
and the next of b2 is priced at the mean of the two batches' boundary_k
(dp_jax.planner.stage_terms): a cut prices the first stage's split and the
second's start at one device count, and separating the two needs the prefix totals, measured
in other rounds, whose noise (about 5% of vgg16's step at 2 rounds) exceeds a boundary's
cost. What this leaves out: the split of a stage that starts after the first layer is priced
as the prefix's at the same k (a middle stage's own split is smaller), and a boundary between
device sets as one between the same devices (docs/validation.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np
import optax

from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.measurement.plan_timing import RUNS_PER_TURN, turns
from dp_jax.planner.contract import check_plan, data_parallel_layout_plan
from dp_jax.runtime.stages import series_parallel_order
from dp_jax.runtime.step import build_program, init_state, train_step

PHASES = ("fwd", "bwd", "suffix", "whole")


def cut_points(n: int, cuts: int) -> list[int]:
  """Up to `cuts` boundaries k (after layer k, 1 <= k < n), evenly spread over the layers."""
  if cuts >= n - 1:
    return list(range(1, n))
  return sorted({min(max(round(i * n / (cuts + 1)), 1), n - 1) for i in range(1, cuts + 1)})


def running_max(values: Sequence[float], floor: float = 0.0) -> list[float]:
  """Each value raised to the largest before it (and to `floor`)."""
  out, top = [], floor
  for v in values:
    top = max(top, v)
    out.append(top)
  return out


def boundary_costs(cut_ms: Mapping[int, Mapping[str, float]], empty: float,
                   whole: float) -> dict[int, float]:
  """ms a boundary after layer k costs, per measured cut k: its round's paired difference
  (fwd + bwd + suffix - 2 empty - whole), rescaled to `whole` (net of `empty`) by its round's
  uncut program (cut["whole"])."""
  out = {}
  for k, c in cut_ms.items():
    c = scaled(c, empty, whole)
    out[k] = c["fwd"] + c["bwd"] + c["suffix"] - 3 * empty - whole
  return out


def leveled(totals: Mapping, empty: float) -> dict:
  """One device count's totals (fused prefix totals, the whole model's split fwd/bwd, cuts)
  with the prefix totals and split pair rescaled, net of `empty`, so that the whole model as
  the profile prices it (the largest prefix total, which the layers' marginals sum to) costs
  the median of all the profile's measurements of its fused program: its prefix-loop rounds
  and the uncut reference step of every cut's rounds. The same program measured beside different
  programs differs by up to ~15% here (tiny GPT-2 on 2 devices, min of 16 rounds each: 11.6 ms
  in the prefix loop, 11.6-13.8 ms in the cuts' rounds, 13.4 ms in the validation's plan
  rounds); the prefix loop keeps the layers' relative costs, the median of the contexts their
  level. Cuts are left as measured (boundary_costs rescales them to the level)."""
  fused = list(totals["fused"])
  wholes = [fused[-1], *(c["whole"] for c in totals.get("cuts", {}).values() if "whole" in c)]
  net = max(fused) - empty  # what the layers' marginals sum to (through the running maximum)
  if net <= 0 or len(wholes) < 2:
    return dict(totals)
  s = (float(np.median(wholes)) - empty) / net
  out = dict(totals, fused=[empty + (f - empty) * s for f in fused])
  for p in ("fwd", "bwd"):
    if p in totals:
      out[p] = empty + (totals[p] - empty) * s
  return out


def scaled(cut: Mapping[str, float], empty: float, whole: float) -> dict[str, float]:
  """A cut's fwd, bwd and suffix ms rescaled (net of `empty`) by whole / its own round's
  uncut whole-model program (cut["whole"], if measured; whole is net of `empty`): the machine's
  load drifts between the profile's rounds, and a ratio taken within one round is robust to it."""
  if "whole" not in cut or cut["whole"] - empty <= 0:
    return {p: cut[p] for p in PHASES if p in cut}
  s = whole / (cut["whole"] - empty)
  return {p: empty + (cut[p] - empty) * s for p in PHASES if p in cut}


def cut_programs(defs, graph: LayerGraph, cuts: Sequence[int], global_batch: int,
                 devices: list[jax.Device], optimizer: optax.GradientTransformation):
  """({k: the model cut in two stages after layer k}, the uncut model): the runtime's programs
  of data parallelism on `devices`, built once so that every pass and every cut's round reuses
  their compiled code (each compiles on its first step)."""
  order = series_parallel_order(graph)
  plan = check_plan(data_parallel_layout_plan(graph, global_batch=global_batch,
                                              num_devices=len(devices)),
                    graph, available_devices=len(devices))

  def build(breaks):
    return build_program(graph, defs, plan, optimizer, list(devices), breaks=breaks)

  return {k: build({order[k]}) for k in cuts}, build(())


def cut_samples(cut, whole, host: tuple, optimizer: optax.GradientTransformation,
                repeats: int, warmup: int, samples: dict[str, list[float]],
                runs_per_turn: int = RUNS_PER_TURN) -> None:
  """`warmup` then `repeats` rounds, each a turn of the `cut` program (two stages) and one of
  the `whole` (uncut) program (runtime train_step on fresh state, each call timed, the last
  step of a turn kept: plan_timing.turns): fwd, bwd, suffix (the cut's programs) and whole
  (the uncut program) ms appended. host: (params, stats, x, y) as host arrays."""
  runs = [_Run(p, host, optimizer) for p in (cut, whole)]
  cuts, wholes = turns([r.step for r in runs], repeats, runs_per_turn=runs_per_turn,
                       warmup=warmup)
  for c, w in zip(cuts, wholes, strict=True):
    for p, v in {**c, "whole": w["suffix"]}.items():
      samples[p].append(v)


class _Run:
  """A program, its state and batch; step() runs one timed train_step."""

  def __init__(self, program, host: tuple, optimizer: optax.GradientTransformation):
    params, stats, x, y = host
    self.program = program
    self.state = init_state(program, params, stats, optimizer)
    self.x = jax.device_put(x, program.input_stage.batch)
    self.y = jax.device_put(y, program.last_stage.batch)

  def step(self) -> dict[str, float]:
    """ms of the step's stage calls by phase: fwd, bwd (non-last stages), suffix (the last)."""
    timer: list[dict] = []
    self.state, loss = train_step(self.program, self.state, self.x, self.y, timer=timer)
    jax.block_until_ready((self.state, loss))
    ms = {"fwd": 0.0, "bwd": 0.0, "suffix": 0.0}
    for t in timer:
      phase = {"fwd": "fwd", "bwd": "bwd", "fwd_bwd": "suffix"}.get(t["phase"])
      if phase is not None:
        ms[phase] += (t["end_s"] - t["start_s"]) * 1e3
    return ms

