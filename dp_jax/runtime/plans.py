"""Plan JSON dicts from a layer -> device-list layout (for tests, benchmarks and baselines)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dp_jax.graph import LayerGraph
from dp_jax.planner.plan import PLAN_SCHEMA
from dp_jax.sharding import layer_sharding, sample_ranges

Layout = Mapping[str, Sequence[int]] | Callable[[str], Sequence[int]]
Shardings = Mapping[str, tuple[tuple[int, int], str]]  # layer -> ((d, m), split)


def layout_plan(graph: LayerGraph, layout: Layout, *, global_batch: int,
                num_devices: int, shardings: Shardings | None = None) -> dict[str, Any]:
  """A plan placing each layer on its listed devices; a layer in `shardings` runs on its
  (d, m) mesh with its split (samples: device k gets range k // m of d equal ranges), the
  others split samples in equal contiguous ranges."""
  devices_of = layout if callable(layout) else layout.__getitem__
  shardings = shardings or {}
  layers = []
  for name in graph.names:
    devs = [int(d) for d in devices_of(name)]
    layer: dict[str, Any] = {"name": name, "devices": devs}
    mesh, split = shardings.get(name, ((len(devs), 1), "samples"))
    ranges = sample_ranges(global_batch, *mesh)
    layer["samples"] = [list(r) for r in ranges]
    if split != "samples":
      layer["sharding"] = layer_sharding(graph.node(name), mesh, split)
    layers.append(layer)
  return {"schema": PLAN_SCHEMA, "model": graph.model, "global_batch": global_batch,
          "num_devices": num_devices, "layers": layers, "predicted": {}}


def data_parallel_layout_plan(graph: LayerGraph, *, global_batch: int,
                              num_devices: int) -> dict[str, Any]:
  """Every layer on every device: plain data parallelism (one stage)."""
  return layout_plan(graph, lambda _: range(num_devices), global_batch=global_batch,
                     num_devices=num_devices)


def staged_data_parallel_plan(graph: LayerGraph, stages: int, width: int, *, global_batch: int,
                              alternate: bool = False) -> dict[str, Any]:
  """Data parallelism cut into `stages` runs of consecutive layers (0 or more than the layers:
  one per layer), stage j on plan devices j*width .. j*width + width - 1 (with `alternate`,
  odd stages on j*width only). Run on devices * stages (plan device i is device i mod width),
  every stage uses the same devices, or alternates between all and the first."""
  names = graph.names
  k = len(names) if stages <= 0 else min(stages, len(names))
  stage = {n: i * k // len(names) for i, n in enumerate(names)}
  used = {n: 1 if alternate and stage[n] % 2 else width for n in names}
  return layout_plan(graph, {n: range(stage[n] * width, stage[n] * width + used[n])
                             for n in names},
                     global_batch=global_batch, num_devices=k * width)
