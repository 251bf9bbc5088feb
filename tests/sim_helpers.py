"""Small synthetic plans for simulator tests (no JAX, no zoo)."""

import functools
import math
from pathlib import Path

from dp_jax.hardware.cluster import ClusterConfig, named_cluster
from dp_jax.layer_times.sources import profile_batches
from dp_jax.planner import make_plan, synthetic

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def cluster(name: str = "dgx_a100") -> ClusterConfig:
  return named_cluster(name)


@functools.cache
def graph(kind: str, size: int = 0):
  if kind == "resnet":
    return synthetic.resnet_like(blocks=(1, 1, 1, 1) if size else (3, 4, 6, 3))
  return synthetic.inception_like(modules=3 if size else 11)


@functools.cache
def profile(kind: str, batch: int, size: int = 0):
  return synthetic.analytic_profile(graph(kind, size), profile_batches(batch, 8))


@functools.cache
def plan(kind: str, g: int, b: int, limit: float = 2.0, overlap: bool = True, size: int = 0,
         cluster_name: str = "dgx_a100"):
  return make_plan(graph(kind, size), profile(kind, b, size), cluster(cluster_name),
                   num_devices=g, global_batch=b, amplification_limit=limit,
                   overlap_allreduce=overlap)


INF = math.inf
