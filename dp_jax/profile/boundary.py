"""What a stage boundary costs: the model cut into two stages on the same devices, measured.

A plan's stage that is not the last runs a forward and a backward program (its residuals
written by one and read by the other, no fusion across them), and the stage after it starts
from a program input, after another program ran, with its own first layers compiled apart
from their predecessors. For a cut after layer k (series-parallel order) the runtime's own
two-stage program on the g devices of a data-parallel stage (dp_jax.runtime.step.build_program
with a break at layer k+1, run by train_step with a timer) gives, per step: fwd(P_k) and
bwd(P_k) of the first stage and fused(S_k) of the second (the suffix, as the last stage runs
it); each round also steps the uncut model (one fused program, U), and the cut's times are
rescaled by F_n / U (net of the empty call e) so that load drifting between the profile's
prefixes and its cuts cancels. In a round each of the two is stepped `runs_per_turn` times in a
row and only the last step timed (dp_jax.runtime.plan_timing.turns): a step is timed right
after a step of the same program, as training runs it. Against the profile's fused prefix totals F_k
(dp_jax.profile.in_context, net of e):

  split_k = fwd(P_k) + bwd(P_k) - 2e - F_k     what the prefix costs more as a non-last stage
  start_k = fused(S_k) - e - (F_n - F_k)       what the suffix costs beyond its layers' marginals

so a two-stage cut at k is priced F_n + split_k + start_k: exactly its measured programs. The
split is spread over layers as the marginal of the interpolated ratio r_k = (F_k + split_k) /
F_k (a stage between two cuts pays the marginals of its layers), the start is charged to the
first layer of every stage but the first. Cuts not measured are interpolated linearly in k
(nearest outside the measured ones). The host work of the extra calls is not in these program
times (it is local_links' stage_us).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np
import optax

from dp_jax.graph import LayerGraph
from dp_jax.runtime.plan_check import check_plan
from dp_jax.runtime.plan_timing import RUNS_PER_TURN, turns
from dp_jax.runtime.plans import data_parallel_layout_plan
from dp_jax.runtime.stages import series_parallel_order
from dp_jax.runtime.step import build_program, init_state, train_step

PHASES = ("fwd", "bwd", "suffix", "whole")


def cut_points(n: int, cuts: int) -> list[int]:
  """Up to `cuts` boundaries k (after layer k, 1 <= k < n), evenly spread over the layers."""
  if cuts >= n - 1:
    return list(range(1, n))
  return sorted({min(max(round(i * n / (cuts + 1)), 1), n - 1) for i in range(1, cuts + 1)})


def interpolate(points: Mapping[int, float], ks: Sequence[int]) -> list[float]:
  """Values at `ks`, linear in k between the measured `points` (nearest outside them)."""
  if not points:
    return [0.0 for _ in ks]
  xs = sorted(points)
  return [float(v) for v in np.interp(ks, xs, [points[x] for x in xs])]


def running_max(values: Sequence[float], floor: float = 0.0) -> list[float]:
  """Each value raised to the largest before it (and to `floor`)."""
  out, top = [], floor
  for v in values:
    top = max(top, v)
    out.append(top)
  return out


def attribute(fused: Sequence[float], empty: float, cut_ms: Mapping[int, Mapping[str, float]],
              whole_split: float | None = None) -> tuple[list[float], list[float]]:
  """(split extra of each layer, start cost of a stage beginning at each layer), in ms.

  fused[k-1]: the fused prefix total F_k (with its empty call `empty`); cut_ms[k]: a cut
  after layer k's measured fwd, bwd and suffix ms; whole_split: fwd + bwd of the whole model
  as one split stage (it prices the layers after the last cut), if measured.
  """
  n = len(fused)
  f = [t - empty for t in running_max(fused, empty)]  # net prefix totals, non-decreasing
  cut_ms = {k: scaled(c, empty, f[-1]) for k, c in cut_ms.items()}
  ratio = {k: (c["fwd"] + c["bwd"] - 2 * empty) / f[k - 1]
           for k, c in cut_ms.items() if f[k - 1] > 0}
  if whole_split is not None and f[-1] > 0:
    ratio[n] = (whole_split - 2 * empty) / f[-1]
  r = interpolate(ratio, range(1, n + 1)) if ratio else [1.0] * n
  # no running maximum here: the split totals telescope, so a measured cut is priced exactly
  s = [rk * fk for rk, fk in zip(r, f, strict=True)]
  marg_s = [b - a for a, b in zip([0.0, *s[:-1]], s, strict=True)]
  marg_f = [b - a for a, b in zip([0.0, *f[:-1]], f, strict=True)]
  split = [a - b for a, b in zip(marg_s, marg_f, strict=True)]
  start = {k: c["suffix"] - empty - (f[-1] - f[k - 1]) for k, c in cut_ms.items()}
  # a stage beginning at layer k+1 (1-based) follows a cut after layer k; the first has none
  return split, [0.0, *interpolate(start, range(1, n))]


def scaled(cut: Mapping[str, float], empty: float, whole: float) -> dict[str, float]:
  """A cut's fwd, bwd and suffix ms rescaled (net of `empty`) by whole / its own round's
  uncut whole-model program (cut["whole"], if measured): the machine's load drifts between the
  profile's prefixes and its cuts, and a ratio taken within one round is robust to it."""
  if "whole" not in cut or cut["whole"] - empty <= 0:
    return {p: cut[p] for p in PHASES if p in cut}
  s = whole / (cut["whole"] - empty)
  return {p: empty + (cut[p] - empty) * s for p in PHASES if p in cut}


def cut_samples(defs, graph: LayerGraph, k: int, global_batch: int,
                devices: list[jax.Device], optimizer: optax.GradientTransformation,
                host: tuple, repeats: int, warmup: int,
                samples: dict[str, list[float]], runs_per_turn: int = RUNS_PER_TURN) -> None:
  """`warmup` then `repeats` rounds, each a turn of the model cut after layer k into two
  stages on all `devices` and one of the uncut model (runtime train_step, each call timed,
  the last step of a turn kept: plan_timing.turns): fwd, bwd, suffix (the cut's programs) and
  whole (the uncut program) ms appended. host: (params, stats, x, y) as host arrays."""
  order = series_parallel_order(graph)
  plan = check_plan(data_parallel_layout_plan(graph, global_batch=global_batch,
                                              num_devices=len(devices)),
                    graph, available_devices=len(devices))
  runs = [_Run(build_program(graph, defs, plan, optimizer, list(devices), breaks=b), host,
               optimizer) for b in ({order[k]}, ())]
  cuts, wholes = turns([r.step for r in runs], repeats, runs_per_turn=runs_per_turn,
                       warmup=warmup)
  for cut, whole in zip(cuts, wholes, strict=True):
    for p, v in {**cut, "whole": whole["suffix"]}.items():
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

