"""Layer times measured in context: the runtime's own stage programs on every prefix of the model.

XLA compiles a layer alone into other code than inside a stage program (vgg16's 2x2-map
convolutions on CPU: seconds alone, a fraction of that inside the model; docs/validation.md),
so each layer is timed as the runtime runs it. For every prefix P_k (the first k layers in
series-parallel order) and every device count g, the runtime's fused program of a stage
holding P_k on devices 0..g-1 (dp_jax.runtime.step.stage_program: forward, backward, the
gradient all-reduce over the g devices and the optimizer update, as the last stage runs; loss:
the training loss for the whole model, the mean of the output for a shorter prefix) runs on
the global batch B (per-device batch B // g). Layer k's cost is fused(P_k) - fused(P_k-1)
(through the running maximum, so a noisy prefix never gives a negative cost; a trivial
program's call stands for P_0, the dispatch being priced per stage call by
dp_jax.planner.stage_terms), so the costs of any stage that starts at the first layer sum
to its measured program, with the update, the all-reduce and the fusion with neighbours
inside (meta: includes_update, includes_allreduce).

What a stage boundary costs (dp_jax.measurement.boundary): at `cuts` boundaries k spread over the
model, the runtime's two-stage program cut after layer k on the same g devices is stepped
beside the uncut model and each program timed; meta["boundary_ms"][b][k] is the paired
difference (per-device batch b). The whole model is also timed as split forward and backward
programs. The totals of each count are leveled (dp_jax.measurement.boundary.leveled): the whole
model's fused program is measured in the prefix loop and beside every cut, and the median of
these sets the level of every prefix total.
The table's fwd/bwd division of a layer's cost follows the whole model's fwd / (fwd + bwd)
(each less the trivial program's call, at least 0; halves when both are 0).
`statistic` of `passes` passes over all prefixes and cuts of `repeats` rounds each (every
program is built once and reused by every pass: compiling dominates the profile's time); the
totals are cached (dp_jax.measurement.cache, method in_context/5, with `runs_per_turn` in the key).

Every timed program runs right after itself, as in training and as dp_jax.measurement.plan_timing
times the plans (dp_jax.measurement.plan_timing.turns): in a round every prefix's fused program in
turn runs until it has run `runs_per_turn` times in a row and the last run is timed (all
prefixes of a device count are loaded together and take turns round after round, so load that
drifts during a pass hits every prefix alike and a layer's cost, a difference of two prefixes,
stays paired); the whole model's split pair (fwd then bwd) likewise, before its fused program;
a cut's step and its uncut reference step likewise (dp_jax.measurement.boundary).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.layer_times.table import ProfileTable
from dp_jax.measurement import boundary, cache
from dp_jax.measurement.alone import model_dtype, timing_key
from dp_jax.measurement.loaded import STATISTICS, checked_counts
from dp_jax.measurement.plan_timing import RUNS_PER_TURN, timed, turns
from dp_jax.runtime import data as datalib
from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.local_devices import cpu_cores
from dp_jax.runtime.loss import cross_entropy
from dp_jax.runtime.stages import Stage, group_stages, series_parallel_order
from dp_jax.runtime.step import stage_program

METHOD = "in_context/5"
PHASES = ("fwd", "bwd", "fused")


def prefix_stage(graph: LayerGraph, k: int) -> Stage:
  """The stage holding the first k layers (series-parallel order), as group_stages cuts it."""
  order = series_parallel_order(graph)
  return group_stages(graph, {n: (0,) if i < k else (1,) for i, n in enumerate(order)})[0]


def mean_loss(out, _y):
  """The loss of a prefix that ends before the model's output: the mean of its output."""
  return jnp.mean(out.astype(jnp.float32))


class _Prefix:
  """A prefix stage's split and fused programs on a device mesh; its state exists while timed."""

  def __init__(self, graph: LayerGraph, stage: Stage, defs, optimizer,
               devices: list[jax.Device]):
    last = stage.layers[-1]
    loss_of = cross_entropy if len(stage.layers) == len(graph.names) else mean_loss
    stage = dataclasses.replace(stage, devices=tuple(range(len(devices))), mesh_shape=(0, 0))
    self.stage = stage
    self.split = stage_program(stage, devices, defs, optimizer, None)
    self.fused = stage_program(stage, devices, defs, optimizer, last, loss_of=loss_of)
    self.init = jax.jit(lambda p: {n: optimizer.init(v) for n, v in p.items()},
                        out_shardings=self.split.replicated)
    self.out_shapes = None

  def load(self, params, stats, x, y) -> None:
    """Fresh copies of the stage's params, stats, optimizer state and the batch, placed as the
    runtime places them (host numpy in: new buffers, so donation never frees the originals)."""
    rep, batch = self.split.replicated, self.split.batch
    self.params = jax.device_put({n: params[n] for n in self.stage.layers}, rep)
    self.stats = jax.device_put({n: stats[n] for n in self.stage.layers}, rep)
    self.opt = self.init(self.params)
    self.x, self.y = jax.device_put(x, batch), jax.device_put(y, batch)
    if self.out_shapes is None:
      self.out_shapes = jax.eval_shape(self.split.fwd, self.params, self.stats, {}, {}, self.x)[0]
    self.cots = jax.device_put({e: (np.ones(s.shape, s.dtype),)
                                for e, s in self.out_shapes.items()}, batch)
    self.vjp = None

  def drop(self) -> None:
    self.params = self.stats = self.opt = self.x = self.y = self.cots = self.vjp = None

  def fwd(self):
    outs, self.vjp, self.stats = self.split.fwd(self.params, self.stats, {}, {}, self.x)
    return outs, self.vjp

  def bwd(self):
    self.params, self.opt, _, _ = self.split.bwd(self.vjp, self.cots, self.params, {}, {},
                                                 self.opt, {})
    self.vjp = None
    return self.params, self.opt

  def fused_step(self):
    loss, self.params, self.stats, self.opt, _, _ = self.fused.fused(
        self.params, self.stats, self.opt, {}, {}, self.x, self.y, {})
    return loss, self.params


@dataclasses.dataclass
class _CountWork:
  """One device count's programs and samples while it is profiled."""

  g: int
  key: dict
  prefixes: list[_Prefix]
  cut_at: dict  # k -> the runtime program cut after layer k
  uncut: object  # the runtime program of the whole model
  samples: list[dict[str, list[float]]]  # per prefix, per phase
  cut_samples: dict[int, dict[str, list[float]]]  # per cut, per phase


def split_pair(prefix: _Prefix) -> dict[str, float]:
  """Wall ms of the prefix's forward program, then of its backward program."""
  fwd_ms, _ = timed(lambda: jax.block_until_ready(prefix.fwd()))()
  bwd_ms, _ = timed(lambda: jax.block_until_ready(prefix.bwd()))()
  return {"fwd": fwd_ms, "bwd": bwd_ms}


def fused_call(prefix: _Prefix) -> dict[str, float]:
  """Wall ms of the prefix's fused program."""
  return {"fused": timed(lambda: jax.block_until_ready(prefix.fused_step()))()[0]}


def prefix_rounds(prefixes: Sequence[_Prefix], host: tuple, repeats: int, warmup: int,
                  samples: Sequence[dict[str, list[float]]],
                  runs_per_turn: int = RUNS_PER_TURN) -> None:
  """`repeats` rounds (after `warmup` untimed runs of each) in which every prefix's fused
  program takes its turn, the last prefix (the whole model) first its split pair: each call
  timed right after itself (plan_timing.turns), and every prefix sampled over the same span, so
  that load drifting during the pass hits all alike and their differences (the layers' costs)
  stay paired. Wall ms appended to samples[k] of prefix k."""
  calls, owner = [], []
  for k, prefix in enumerate(prefixes):
    if k == len(prefixes) - 1:
      calls.append(lambda p=prefix: split_pair(p))
      owner.append(k)
    calls.append(lambda p=prefix: fused_call(p))
    owner.append(k)
  try:
    for prefix in prefixes:
      prefix.load(*host)
    for k, runs in zip(owner, turns(calls, repeats, runs_per_turn=runs_per_turn, warmup=warmup),
                       strict=True):
      for ms in runs:
        for p, v in ms.items():
          samples[k][p].append(v)
  finally:
    for prefix in prefixes:
      prefix.drop()


def empty_call_ms(devices: list[jax.Device], statistic: str, rounds: int = 50) -> float:
  """The statistic of the wall ms of a trivial program on the mesh of `devices` (dispatch)."""
  m = meshlib.stage_mesh(devices)
  f = jax.jit(lambda v: v + 1)
  v = jax.device_put(np.zeros((len(devices),), np.float32), meshlib.batch_sharding(m))
  for _ in range(5):
    jax.block_until_ready(f(v))
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    jax.block_until_ready(f(v))
    times.append((time.perf_counter() - t0) * 1e3)
  return STATISTICS[statistic](times)


def marginals(totals: list[float], empty: float) -> list[float]:
  """Per-layer differences of prefix totals (P_0 = `empty`), through their running maximum."""
  tops = boundary.running_max(totals, empty)
  return [b - a for a, b in zip([empty, *tops[:-1]], tops, strict=True)]


def forward_share(fwd_ms: float, bwd_ms: float, empty_ms: float) -> float:
  """The forward's share of a step from the split programs' times, each less the trivial
  program's call: a tiny model's half can time below that call under load, so each counts as at
  least 0 (both 0: half each) and the share stays within [0, 1]."""
  fwd, bwd = max(0.0, fwd_ms - empty_ms), max(0.0, bwd_ms - empty_ms)
  return fwd / (fwd + bwd) if fwd + bwd > 0 else 0.5


def in_context_profile(model, graph: LayerGraph, global_batch: int, counts: Iterable[int], *,
                       cache_dir: str | Path = cache.DEFAULT_CACHE_DIR, repeats: int = 3,
                       warmup: int = 1, statistic: str = "median", passes: int = 2,
                       devices: list[jax.Device] | None = None, cuts: int = 4,
                       optimizer: optax.GradientTransformation | None = None,
                       runs_per_turn: int = RUNS_PER_TURN,
                       progress: Callable[[str], None] | None = None) -> ProfileTable:
  """Fwd/bwd ms of every layer at per-device batch B // g (a g-device stage), from prefixes."""
  devices = devices or jax.devices()
  counts = checked_counts(counts, global_batch, devices, statistic)
  if repeats < 1 or passes < 1 or runs_per_turn < 1 or warmup < 0 or cuts < 0:
    raise UserError(f"repeats, passes and runs_per_turn must be >= 1, warmup and cuts >= 0, "
                    f"got {repeats}, {passes}, {runs_per_turn}, {warmup} and {cuts}")
  optimizer = optimizer or optax.sgd(0.01, momentum=0.9)
  order = series_parallel_order(graph)
  at = boundary.cut_points(len(order), cuts)
  dtype = model_dtype(model)
  base = {**timing_key(graph, dtype, devices[0]), "cores": cpu_cores(), "statistic": statistic,
          "passes": passes, "repeats": repeats, "method": METHOD, "cuts": at,
          "runs_per_turn": runs_per_turn,
          "layers": [[n, graph.node(n).kind, cache.layer_hash(graph.node(n))] for n in order]}
  totals: dict[int, dict[str, list[float]]] = {}
  todo = []
  for g in counts:
    key = {**base, "global_batch": global_batch, "devices": g}
    hit = cache.load_entry(cache_dir, key)
    if hit is not None:
      totals[g] = hit
    else:
      todo.append((g, key))
  empty = {g: totals[g]["empty"] for g in totals}
  for g, _ in todo:
    empty[g] = empty_call_ms(devices[:g], statistic)
  if todo:
    defs, params, stats = split_layers(model)
    params, stats = jax.tree.map(np.asarray, (params, stats))  # host: every load copies
    src = datalib.synthetic(model, seed=0)
    one = meshlib.batch_sharding(meshlib.stage_mesh(devices[:1]))
    host = tuple(np.asarray(a) for a in datalib.batch_at(src, 0, global_batch, one, one))
    work = []
    for g, key in todo:
      prefixes = [_Prefix(graph, prefix_stage(graph, k), defs, optimizer, list(devices[:g]))
                  for k in range(1, len(order) + 1)]
      cut_at, uncut = boundary.cut_programs(defs, graph, at, global_batch, list(devices[:g]),
                                            optimizer)
      work.append(_CountWork(g, key, prefixes, cut_at, uncut,
                             [{p: [] for p in PHASES} for _ in prefixes],
                             {k: {p: [] for p in boundary.PHASES} for k in at}))
    for i in range(passes):
      for w in work:
        # every prefix fused (as a last stage), in rounds; the whole model also split (fwd, bwd)
        prefix_rounds(w.prefixes, (params, stats, *host), repeats, warmup if i == 0 else 0,
                      w.samples, runs_per_turn=runs_per_turn)
        for k in at:  # the model cut in two after layer k, on the same devices
          boundary.cut_samples(w.cut_at[k], w.uncut, (params, stats, *host), optimizer,
                               repeats, max(warmup, 1), w.cut_samples[k],
                               runs_per_turn=runs_per_turn)
        if progress is not None:
          progress(f"in-context profile: pass {i + 1} of {passes}, {w.g} device(s) done")
    for w in work:
      g, samples = w.g, w.samples
      totals[g] = {"empty": empty[g],
                   "fused": [STATISTICS[statistic](s["fused"]) for s in samples],
                   "cuts": {str(k): {p: STATISTICS[statistic](v) for p, v in c.items()}
                            for k, c in w.cut_samples.items()},
                   **{p: STATISTICS[statistic](samples[-1][p]) for p in ("fwd", "bwd")}}
      cache.store_entry(cache_dir, w.key, totals[g])
  layers: dict[str, dict[int, tuple[float, float]]] = {n: {} for n in order}
  bounds: dict[str, dict[str, float]] = {}
  for g in counts:
    b = global_batch // g
    t = boundary.leveled(totals[g], empty[g])
    cut_ms = {int(k): c for k, c in t["cuts"].items()}
    values = [*t["fused"], t["fwd"], t["bwd"], t["empty"],
              *(v for c in cut_ms.values() for v in c.values())]
    if not all(math.isfinite(v) and v >= 0 for v in values):
      raise UserError(f"a measured prefix time of {graph.model} at batch {b} is not finite")
    fused = marginals(t["fused"], empty[g])
    fwd_share = forward_share(t["fwd"], t["bwd"], empty[g])
    whole = max(t["fused"]) - empty[g]
    bounds[str(b)] = {str(k): v for k, v in boundary.boundary_costs(cut_ms, empty[g],
                                                                    whole).items()}
    for n, u in zip(order, fused, strict=True):
      layers[n][b] = (u * fwd_share, u * (1 - fwd_share))
  return ProfileTable(model=graph.model, device=devices[0].device_kind, dtype=dtype,
                      source="measured", layers=layers,
                      meta={**{k: v for k, v in base.items() if k != "layers"},
                            "warmup": warmup, "global_batch": global_batch, "counts": counts,
                            "empty_round_ms": empty, "boundary_ms": bounds,
                            "prefix_ms": {str(g): totals[g] for g in counts},
                            "split_over_fused": {str(global_batch // g): (
                                totals[g]["fwd"] + totals[g]["bwd"] - 2 * empty[g]) / max(
                                max(totals[g]["fused"]) - empty[g], 1e-9) for g in counts},
                            "includes_update": True, "includes_allreduce": True})

