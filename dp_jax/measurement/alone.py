"""Measure each layer's forward and backward time alone on one device of the current backend.

Per layer and per-device batch: jit the layer's forward, layer(*inputs), and its backward (the
VJP w.r.t. its parameters and float inputs, given the residuals of one jax.vjp forward, so the
forward is not timed twice; the layer that reads the model input gets no input gradient, as in
training); run `warmup` calls, then up to `repeats` timed calls each ending in
block_until_ready; keep the median. Results are
cached on disk (dp_jax.measurement.cache), so a second run only reads files. Layers with the same
kind, attrs, input shapes and dtype are timed once per run.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.layer_times.table import ProfileTable
from dp_jax.measurement import cache
from dp_jax.runtime.local_devices import other_xla_flags

DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 2
DEFAULT_BUDGET_S = 1.0  # timed seconds per layer, batch and direction before repeats stop


def pow2_batches(max_batch: int) -> list[int]:
  """1, 2, 4, ... up to and including max_batch (max_batch itself if not a power of two)."""
  if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
    raise UserError(f"max per-device batch must be an integer >= 1, got {max_batch!r}")
  out = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
  return out if out[-1] == max_batch else out + [max_batch]


def _median_ms(fn: Callable[..., Any], args: tuple, repeats: int, warmup: int,
               budget_s: float) -> float:
  """Median ms of up to `repeats` timed calls after `warmup` (at least one timed call).

  Timing stops early once the timed calls have taken budget_s: a layer that takes a second
  per call is timed a few times, not `repeats` times.
  """
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times: list[float] = []
  while len(times) < repeats and (not times or sum(times) < budget_s):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def _inputs(structs: Sequence[jax.ShapeDtypeStruct], batch: int, seed: int = 0) -> list[jax.Array]:
  """Random inputs made with numpy (jax.random would compile a generator per shape)."""
  rng = np.random.default_rng(seed)
  out = []
  for s in structs:
    shape = (batch, *s.shape[1:])
    if jnp.issubdtype(s.dtype, jnp.floating):
      out.append(jnp.asarray(rng.standard_normal(shape, np.float32), dtype=s.dtype))
    else:
      out.append(jnp.asarray(rng.integers(0, 2, shape), dtype=s.dtype))
  return out


def layer_programs(module: nnx.Module, in_structs: Sequence[jax.ShapeDtypeStruct], batch: int,
                   *, source: bool, device: jax.Device | None = None) -> tuple[tuple, tuple]:
  """((fwd, fwd_args), (bwd, bwd_args)): a layer's jitted forward and VJP, inputs on `device`."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  xs = _inputs(in_structs, batch)
  diff = [not source and jnp.issubdtype(x.dtype, jnp.floating) for x in xs]

  def apply(p, r, *args):
    return nnx.merge(graphdef, p, r)(*args)

  def with_vjp(p, r, *args):
    def f(p, r, *d):
      it = iter(d)
      return apply(p, r, *[next(it) if use else x for x, use in zip(args, diff, strict=True)])
    return jax.vjp(f, p, r, *[x for x, use in zip(args, diff, strict=True) if use])

  args = (params, rest, *xs)
  if device is not None:
    args = jax.device_put(args, device)
  out, vjp_fn = jax.jit(with_vjp)(*args)
  bwd = jax.jit(lambda v, g: v(g))
  return (jax.jit(apply), args), (bwd, (vjp_fn, jnp.ones_like(out)))


def time_layer(module: nnx.Module, in_structs: Sequence[jax.ShapeDtypeStruct], batch: int,
               *, source: bool, repeats: int, warmup: int,
               budget_s: float = DEFAULT_BUDGET_S) -> tuple[float, float]:
  """(forward ms, backward ms) of one layer at one per-device batch, medians of `repeats`."""
  (fwd, fwd_args), (bwd, bwd_args) = layer_programs(module, in_structs, batch, source=source)
  fwd_ms = _median_ms(fwd, fwd_args, repeats, warmup, budget_s)
  bwd_ms = _median_ms(bwd, bwd_args, repeats, warmup, budget_s)
  return fwd_ms, bwd_ms


def out_structs(model, graph: LayerGraph) -> dict[str, jax.ShapeDtypeStruct]:
  """Each layer's output at batch 1 (shape and dtype), by abstract evaluation."""
  structs: dict[str, jax.ShapeDtypeStruct] = {}
  x = model.input_spec(1)
  for s in model.layer_specs():
    graphdef, params, rest = nnx.split(s.module, nnx.Param, ...)
    ins = [structs[p] for p in s.inputs] if s.inputs else [x]
    structs[s.name] = jax.eval_shape(lambda p, r, *a, g=graphdef: nnx.merge(g, p, r)(*a),
                                     params, rest, *ins)
  missing = [n for n in graph.names if n not in structs]
  if missing:
    raise UserError(f"graph of {graph.model} has layers the model does not: {missing[:3]}; "
                    "trace the graph from this model (dp_jax.models.trace.trace_graph)")
  return structs


def model_dtype(model) -> str:
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  return str(leaves[0].dtype) if leaves else "float32"


def timing_key(graph: LayerGraph, dtype: str, device: jax.Device) -> dict[str, Any]:
  """What every measured timing of the model depends on beside its layer, batch and method: the
  model, its dtype, the device and backend, JAX's version and XLA's flags (less the host device
  count: the key holds the devices)."""
  return {"model": graph.model, "backend": jax.default_backend(),
          "device_kind": device.device_kind, "dtype": dtype, "jax": jax.__version__,
          "xla_flags": other_xla_flags()}


def measure_profile(model, graph: LayerGraph, batches: int | Iterable[int], *,
                    cache_dir: str | Path = cache.DEFAULT_CACHE_DIR,
                    repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                    budget_s: float = DEFAULT_BUDGET_S, progress: bool = True) -> ProfileTable:
  """Measured forward/backward ms of every layer of `graph` at each per-device batch.

  batches: a list of per-device batches, or an int N for 1, 2, 4, ... up to N.
  """
  bs = pow2_batches(batches) if isinstance(batches, int) else sorted(set(batches))
  if not bs or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bs):
    raise UserError(f"batches must be integers >= 1, got {bs}")
  if repeats < 1 or warmup < 0:
    raise UserError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
  specs = {s.name: s for s in model.layer_specs()}
  structs = out_structs(model, graph)
  x = model.input_spec(1)
  dev = jax.devices()[0]
  dtype = model_dtype(model)
  base = timing_key(graph, dtype, dev)
  layers: dict[str, dict[int, tuple[float, float]]] = {n: {} for n in graph.names}
  seen: dict[tuple, tuple[float, float]] = {}
  stats = {"measured": 0, "cached": 0, "shared": 0}
  work = [(n, b) for n in graph.names for b in bs]
  with _progress(progress, len(work), graph.model) as advance:
    for name, b in work:
      node, spec = graph.node(name), specs[name]
      ins = [structs[p] for p in node.inputs] if node.inputs else [x]
      shapes = [[list(s.shape[1:]), str(s.dtype)] for s in ins]
      key = {**base, "layer": name, "batch": b, "kind": node.kind, "in_shapes": shapes,
             "attrs": cache.layer_hash(node), "source": not node.inputs}
      hit = cache.load(cache_dir, key)
      sig = (node.kind, key["attrs"], str(shapes), b, key["source"])
      if hit is not None:
        stats["cached"] += 1
      elif sig in seen:
        hit = seen[sig]
        stats["shared"] += 1
        cache.store(cache_dir, key, *hit)
      else:
        hit = time_layer(spec.module, ins, b, source=not node.inputs, repeats=repeats,
                         warmup=warmup, budget_s=budget_s)
        stats["measured"] += 1
        cache.store(cache_dir, key, *hit)
      seen.setdefault(sig, hit)
      layers[name][b] = hit
      advance(name, b)
  for name, rows in layers.items():
    for b, (f, w) in rows.items():
      if not (math.isfinite(f) and math.isfinite(w)):
        raise UserError(f"measured time of {name} at batch {b} is not finite")
  return ProfileTable(model=graph.model, device=dev.device_kind, dtype=dtype, source="measured",
                      layers=layers, meta={**base, "repeats": repeats, "warmup": warmup,
                                           "budget_s": budget_s, "batches": bs, "counts": stats})


class _progress:
  """A rich progress bar (or nothing) whose context value advances it by one step."""

  def __init__(self, enabled: bool, total: int, model: str):
    self.enabled, self.total, self.model = enabled, total, model

  def __enter__(self):
    if not self.enabled:
      return lambda *_: None
    self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[at]}"))
    self.bar.__enter__()
    task = self.bar.add_task(f"profiling {self.model}", total=self.total, at="")
    return lambda name, b: self.bar.update(task, advance=1, at=f"{name} @ {b}")

  def __exit__(self, *exc):
    if self.enabled:
      self.bar.__exit__(*exc)
    return False
