"""Config -> cluster, graph, profile and plan: the steps every app shares, in one place."""

from __future__ import annotations

from typing import Any

from dp_jax.errors import UserError


def enum_value(x: Any) -> Any:
  """The plain value of a config enum (or x itself)."""
  return getattr(x, "value", x)


def cluster_spec(cluster_cfg: Any):
  """The pod's ClusterSpec from a cluster config (the job's device count is separate)."""
  from dp_jax.cluster import load_cluster

  return load_cluster({k: v for k, v in cluster_cfg.items() if k != "num_devices"})


def job_devices(cluster_cfg: Any, cluster) -> int:
  """G: cluster.num_devices if set, else every device of the pod."""
  g = cluster_cfg.get("num_devices")
  g = cluster.num_devices if g is None else g
  cluster.with_num_devices(g)  # validates G against the pod
  return g


def load_graph(cfg: Any):
  """The graph JSON named by cfg.graph, else the zoo model cfg.model traced."""
  if cfg.get("graph"):
    from dp_jax.graph import LayerGraph

    return LayerGraph.load(cfg.graph)
  from dp_jax import zoo

  return zoo.graph_of(cfg.model, seed=cfg.get("seed", 0))


def load_profile_for(cfg: Any, graph, cluster, global_batch: int, *extra_batches: int):
  """The profile cfg.profile names, covering every per-device batch a plan of B can use."""
  from dp_jax.profile.sources import load_profile, profile_batches

  model_cfg = None if cfg.get("graph") else cfg.model
  return load_profile(cfg.profile, graph, cluster.device,
                      profile_batches(global_batch, *extra_batches), model_cfg)


def plan_options(planner_cfg: Any, num_devices: int, global_batch: int) -> dict[str, Any]:
  """Keyword options shared by make_plan and data_parallel_plan."""
  return dict(num_devices=num_devices, global_batch=global_batch,
              overlap_allreduce=bool(planner_cfg.overlap_allreduce),
              device_counts=enum_value(planner_cfg.device_counts),
              amplification_floor_ms=float(planner_cfg.amplification_floor_ms),
              grad_bytes_per_param=planner_cfg.gradient_bytes_per_param,
              optimizer_bytes_per_param=planner_cfg.optimizer_bytes_per_param,
              batch_norm=str(planner_cfg.get("batch_norm", "sync")))


def make_plan_from_config(planner_cfg: Any, graph, profile, cluster, *, num_devices: int,
                          global_batch: int):
  """A burst plan (planner=burst) or the data-parallel baseline (planner=data_parallel)."""
  from dp_jax.planner import data_parallel_plan, make_plan

  if global_batch < 1:
    raise UserError(f"batch_size must be >= 1, got {global_batch}")
  common = plan_options(planner_cfg, num_devices, global_batch)
  if planner_cfg.name == "data_parallel":
    return data_parallel_plan(graph, profile, cluster, **common)
  if planner_cfg.name != "burst":
    raise UserError(f"planner '{planner_cfg.name}' is unknown (valid: burst, data_parallel)")
  limit = float(planner_cfg.amplification_limit)
  if not limit >= 1:
    raise UserError(f"planner.amplification_limit must be >= 1 (or inf), got {limit}")
  return make_plan(graph, profile, cluster, amplification_limit=limit,
                   mode=enum_value(planner_cfg.mode), **common)
