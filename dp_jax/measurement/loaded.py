"""Layer times measured under the load a plan puts on the local devices (one copy per device).

A layer of a stage on g devices at per-device batch b runs as g partitions at once, one per
device. On CPU host devices that share cores, its time depends on how many devices are busy,
so each (layer, b) is timed with g = B // b copies running at once on devices 0..g-1, each
dispatched from its own thread (dp_jax.runtime.local_devices; one copy runs on the calling
thread, as the runtime runs a one-device stage): the time of a round is the slowest copy's.
With as many devices as cores, a layer on every device gets one core each and
a layer on one device gets the whole machine, as it does when the runtime runs it. Rounds:
`warmup`, then `passes` passes over all layers, each up to `repeats` timed rounds within
`budget_s` (passes spread a layer's samples over time, so a burst of load from other
processes hits few of them); `statistic` (default min: contention only adds time) of all. A
layer's rounds run back to back, and every batch of them starts with at least
`runs_per_turn` - 1 untimed rounds, so each timed round follows a round of the same programs
(as dp_jax.measurement.plan_timing times plans), never another layer's.
Cached like dp_jax.measurement.alone, with g and the core count in the key.

Each layer is its own program here, but the runtime runs a stage's layers as one program: so
the time of an empty round (a trivial program per device, the same threads) is subtracted
from every forward and backward time (floored at 0), and the runtime's dispatch is priced per
stage call instead (dp_jax.planner.stage_terms). meta["empty_round_ms"] records it per g.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import jax

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.layer_times.table import ProfileTable
from dp_jax.measurement import cache
from dp_jax.measurement.alone import layer_programs, model_dtype, out_structs, timing_key
from dp_jax.measurement.plan_timing import RUNS_PER_TURN, STATISTICS
from dp_jax.runtime.local_devices import DeviceThreads, cpu_cores

EMPTY_ROUNDS = 50


def empty_round_ms(threads: DeviceThreads, devices: list[jax.Device], statistic: str) -> float:
  """The statistic of the wall ms of a round of a trivial program on each of `devices`."""
  f = jax.jit(lambda v: v + 1)
  xs = [jax.device_put(jax.numpy.zeros((1,), jax.numpy.float32), d) for d in devices]
  return round_ms(threads, [lambda x=x: f(x) for x in xs], EMPTY_ROUNDS, 5, 10.0, statistic)


def round_samples(threads: DeviceThreads, calls: list[Callable[[], object]], repeats: int,
                  warmup: int, budget_s: float,
                  runs_per_turn: int = RUNS_PER_TURN) -> list[float]:
  """Wall ms of up to `repeats` rounds (within budget_s) that run every call at once, after
  max(warmup, runs_per_turn - 1) untimed rounds (the first timed one follows its own)."""
  jobs = [(i, lambda c=c: jax.block_until_ready(c())) for i, c in enumerate(calls)]
  # one copy runs on the calling thread, as the runtime runs a one-device stage
  run = (lambda: jobs[0][1]()) if len(jobs) == 1 else (lambda: threads.run(jobs))
  for _ in range(max(warmup, runs_per_turn - 1)):
    run()
  times: list[float] = []
  while len(times) < repeats and (not times or sum(times) < budget_s * 1e3):
    t0 = time.perf_counter()
    run()
    times.append((time.perf_counter() - t0) * 1e3)
  return times


def round_ms(threads: DeviceThreads, calls: list[Callable[[], object]], repeats: int,
             warmup: int, budget_s: float, statistic: str) -> float:
  """The statistic of the wall ms of rounds that run every call at once, one per device."""
  return STATISTICS[statistic](round_samples(threads, calls, repeats, warmup, budget_s))


def checked_counts(counts: Iterable[int], global_batch: int, devices: list[jax.Device],
                   statistic: str) -> list[int]:
  """The sorted distinct device counts, each dividing the batch and at most the devices."""
  counts = sorted({int(g) for g in counts})
  if statistic not in STATISTICS:
    raise UserError(f"statistic '{statistic}' is unknown (valid: {', '.join(STATISTICS)})")
  bad = [g for g in counts if g < 1 or g > len(devices) or global_batch % g]
  if bad or not counts:
    raise UserError(f"device counts {bad or counts} must divide the batch {global_batch} and "
                    f"be at most the {len(devices)} local devices")
  return counts


def loaded_profile(model, graph: LayerGraph, global_batch: int, counts: Iterable[int], *,
                   cache_dir: str | Path = cache.DEFAULT_CACHE_DIR, repeats: int = 5,
                   warmup: int = 2, budget_s: float = 1.0, statistic: str = "min",
                   passes: int = 3, devices: list[jax.Device] | None = None,
                   runs_per_turn: int = RUNS_PER_TURN) -> ProfileTable:
  """Fwd/bwd ms of every layer at per-device batch B // g with g copies at once, g in counts."""
  devices = devices or jax.devices()
  counts = checked_counts(counts, global_batch, devices, statistic)
  specs = {s.name: s for s in model.layer_specs()}
  structs = out_structs(model, graph)
  x = model.input_spec(1)
  dtype = model_dtype(model)
  base = {**timing_key(graph, dtype, devices[0]), "cores": cpu_cores(), "statistic": statistic,
          "passes": passes, "method": "loaded/3", "runs_per_turn": runs_per_turn}
  layers: dict[str, dict[int, tuple[float, float]]] = {n: {} for n in graph.names}
  todo: dict[tuple, dict] = {}  # signature -> what to time, its cache keys, its samples
  found: dict[tuple[str, int], tuple] = {}
  for name in graph.names:
    node = graph.node(name)
    ins = [structs[p] for p in node.inputs] if node.inputs else [x]
    shapes = [[list(s.shape[1:]), str(s.dtype)] for s in ins]
    for g in counts:
      b = global_batch // g
      key = {**base, "layer": name, "batch": b, "concurrent": g, "kind": node.kind,
             "in_shapes": shapes, "attrs": cache.layer_hash(node),
             "source": not node.inputs}
      sig = (node.kind, key["attrs"], str(shapes), b, g, key["source"])
      found[(name, g)] = sig
      hit = cache.load(cache_dir, key)
      if sig in todo:
        todo[sig]["keys"].append(key)
      elif hit is None:
        todo[sig] = {"layer": name, "ins": ins, "g": g, "keys": [key], "fwd": [], "bwd": []}
      else:
        todo[sig] = {"hit": hit, "keys": [key]}
  with DeviceThreads(max(counts)) as threads:
    empty = {g: empty_round_ms(threads, devices[:g], statistic) for g in counts}
    work = [t for t in todo.values() if "hit" not in t]
    for t in work:
      b = global_batch // t["g"]
      progs = [layer_programs(specs[t["layer"]].module, t["ins"], b,
                              source=not graph.node(t["layer"]).inputs, device=d)
               for d in devices[:t["g"]]]
      t["calls"] = ([lambda p=p: p[0][0](*p[0][1]) for p in progs],
                    [lambda p=p: p[1][0](*p[1][1]) for p in progs])
    for i in range(passes):  # passes over every layer spread its samples over time
      for t in work:
        for direction, calls in zip(("fwd", "bwd"), t["calls"], strict=True):
          t[direction] += round_samples(threads, calls, repeats, warmup if i == 0 else 0,
                                        budget_s, runs_per_turn)
  for t in todo.values():
    if "hit" not in t:
      t["hit"] = (STATISTICS[statistic](t["fwd"]), STATISTICS[statistic](t["bwd"]))
      t.pop("calls")
    for key in t["keys"]:
      cache.store(cache_dir, key, *t["hit"])
  for (name, g), sig in found.items():
    f, w = todo[sig]["hit"]
    if not (math.isfinite(f) and math.isfinite(w)):
      raise UserError(f"measured time of {name} at batch {global_batch // g} is not finite")
    layers[name][global_batch // g] = (max(f - empty[g], 0.0), max(w - empty[g], 0.0))
  return ProfileTable(model=graph.model, device=devices[0].device_kind, dtype=dtype,
                      source="measured", layers=layers,
                      meta={**base, "repeats": repeats, "passes": passes, "warmup": warmup,
                            "budget_s": budget_s,
                            "global_batch": global_batch, "counts": counts,
                            "empty_round_ms": empty})
