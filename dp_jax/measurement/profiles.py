"""Every profile source, measured here included: the one place an app gets the ProfileTable its
profile options describe (the pure sources from dp_jax.layer_times; `measure` timed on this
machine's JAX backend, JAX imported only then)."""

from __future__ import annotations

from collections.abc import Sequence

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.layer_times.sources import ProfileConfig, profile_batches
from dp_jax.layer_times.table import ProfileTable
from dp_jax.models.zoo import ModelConfig


def load(options: ProfileConfig, graph: LayerGraph, device: str, batches: Sequence[int],
         model: ModelConfig | None = None) -> ProfileTable:
  """The ProfileTable of `graph` at per-device `batches` (`device`: the cluster's)."""
  if options.source != "measure":
    return options.load(graph, device, batches)
  if model is None:
    raise UserError("profile.source=measure needs a model config to build the layers")
  from dp_jax.measurement.alone import measure_profile  # JAX: measures on this backend

  return measure_profile(model.build(), graph, list(options.batches or batches),
                         cache_dir=options.cache_dir, repeats=options.repeats,
                         warmup=options.warmup)


def for_cluster(options: ProfileConfig, graph: LayerGraph, cluster_device: str,
                global_batch: int, *extra_batches: int,
                model: ModelConfig | None = None) -> ProfileTable:
  """The profile that prices a cluster of `cluster_device`: every per-device batch a plan of
  `global_batch` can use (and `extra_batches`), of the cluster's device (check_device)."""
  if options.source == "measure":  # its device is known before measuring (minutes): check it
    import jax  # JAX: measure runs on this backend anyway

    here = ProfileTable(graph.model, jax.devices()[0].device_kind, "", "measured", {})
    options.check_device(here, cluster_device)
  table = load(options, graph, cluster_device, profile_batches(global_batch, *extra_batches),
               model)
  return options.check_device(table, cluster_device)
