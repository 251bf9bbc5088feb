"""Plan JSON dicts from a layer -> device-list layout (for tests, benchmarks and baselines)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dp_jax.graph import LayerGraph
from dp_jax.runtime.plan_check import PLAN_SCHEMA

Layout = Mapping[str, Sequence[int]] | Callable[[str], Sequence[int]]


def layout_plan(graph: LayerGraph, layout: Layout, *, global_batch: int,
                num_devices: int) -> dict[str, Any]:
  """A plan placing each layer on its listed devices, with equal contiguous sample ranges."""
  devices_of = layout if callable(layout) else layout.__getitem__
  layers = []
  for name in graph.names:
    devs = [int(d) for d in devices_of(name)]
    per = global_batch // len(devs)
    layers.append({"name": name, "devices": devs,
                   "samples": [[i * per, (i + 1) * per] for i in range(len(devs))]})
  return {"schema": PLAN_SCHEMA, "model": graph.model, "global_batch": global_batch,
          "num_devices": num_devices, "layers": layers, "predicted": {}}


def data_parallel_layout_plan(graph: LayerGraph, *, global_batch: int,
                              num_devices: int) -> dict[str, Any]:
  """Every layer on every device: plain data parallelism (one stage)."""
  return layout_plan(graph, lambda _: range(num_devices), global_batch=global_batch,
                     num_devices=num_devices)
