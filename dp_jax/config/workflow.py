"""Config -> cluster, graph, profile and plan: the steps every app shares, in one place."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_jax.base.errors import UserError

if TYPE_CHECKING:
  from dp_jax.planner.plan import Plan

log = logging.getLogger(__name__)


def enum_value(x: Any) -> Any:
  """The plain value of a config enum (or x itself)."""
  return getattr(x, "value", x)


def cluster_config(name: str) -> dict[str, Any]:
  """The cluster config conf/cluster/<name>.yaml, or the YAML file `name` names, as a dict."""
  from dp_jax.config.files import SUFFIXES, load_yaml
  from dp_jax.config.schema import CONF_DIR

  if str(name).endswith(SUFFIXES):
    return load_yaml("cluster", name)
  path = Path(CONF_DIR) / "cluster" / f"{name}.yaml"
  if not path.is_file():
    valid = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
    raise UserError(f"unknown cluster '{name}' (valid cluster options: {valid}; or a YAML "
                    "file: path/to/cluster.yaml)")
  return load_yaml("cluster", path)


def cluster_spec(cluster_cfg: Any):
  """The pod's ClusterSpec from a cluster config (the job's device count is separate)."""
  from dp_jax.hardware.cluster import load_cluster

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
    from dp_jax.graph.layer_graph import LayerGraph

    return LayerGraph.load(cfg.graph)
  from dp_jax.models import zoo

  return zoo.graph_of(cfg.model, seed=cfg.get("seed", 0))


def load_profile_for(cfg: Any, graph, cluster, global_batch: int, *extra_batches: int):
  """The profile cfg.profile names, covering every per-device batch a plan of B can use."""
  from dp_jax.profiling.sources import check_device, load_profile, profile_batches

  model_cfg = None if cfg.get("graph") else cfg.model
  table = load_profile(cfg.profile, graph, cluster.device,
                       profile_batches(global_batch, *extra_batches), model_cfg)
  return check_device(table, cluster.device, cfg.profile)


def plan_options(planner_cfg: Any, num_devices: int, global_batch: int) -> dict[str, Any]:
  """Keyword options shared by make_plan and data_parallel_plan."""
  return dict(num_devices=num_devices, global_batch=global_batch,
              overlap_allreduce=bool(planner_cfg.overlap_allreduce),
              device_counts=enum_value(planner_cfg.device_counts),
              amplification_floor_ms=float(planner_cfg.amplification_floor_ms),
              gradient_precision=str(planner_cfg.get("gradient_precision", "fp32")),
              optimizer=str(planner_cfg.get("optimizer", "momentum")),
              batch_norm=str(planner_cfg.get("batch_norm", "sync")),
              sharding=sharding_option(planner_cfg.get("sharding", ["samples"])))


def sharding_option(value: Any) -> tuple[str, ...]:
  """planner.sharding as a checked tuple of names (a list, or one name)."""
  from dp_jax.planner.options import check_sharding_choices

  if isinstance(value, str):
    return check_sharding_choices(value)
  try:
    names = [str(v) for v in value]
  except TypeError:
    names = value
  return check_sharding_choices(names)


def make_plan_from_config(planner_cfg: Any, graph, profile, cluster, *, num_devices: int,
                          global_batch: int, model_cfg: Any = None, cluster_cfg: Any = None):
  """A burst plan (planner=burst) or the data-parallel baseline (planner=data_parallel).

  The plan records what it was made for: the model config (made_for), the cluster and the
  profile, with the per-device batches the profile had to extrapolate to (warned once).
  """
  from dp_jax.planner import candidate_counts, data_parallel_plan, make_plan
  from dp_jax.planner.options import PlanOptions

  if global_batch < 1:
    raise UserError(f"batch_size={global_batch} must be >= 1")
  common = plan_options(planner_cfg, num_devices, global_batch)
  if planner_cfg.name == "data_parallel":
    plan = data_parallel_plan(graph, profile, cluster, **common)
  elif planner_cfg.name != "burst":
    raise UserError(f"planner '{planner_cfg.name}' is unknown (valid: burst, data_parallel)")
  else:
    limit = float(planner_cfg.amplification_limit)
    if not limit >= 1:
      raise UserError(f"planner.amplification_limit must be >= 1 (or inf), got {limit}")
    plan = make_plan(graph, profile, cluster, amplification_limit=limit,
                     mode=enum_value(planner_cfg.mode), **common)
  # the per-device batches this search priced: B / d for its device counts d <= G
  counts = candidate_counts(PlanOptions(**common))
  extrapolated = extrapolated_batches(profile, graph, sorted(global_batch // int(d)
                                                             for d in counts))
  if extrapolated:
    log.warning("profile of %s (%s) has no measurement at per-device batch(es) %s for some "
                "layers: extrapolated on a log-log line (recorded in the plan)", graph.model,
                profile.source, ", ".join(map(str, extrapolated)))
  made_for = {"made_for": model_record(graph, model_cfg),
              "cluster_config": _plain(cluster_cfg) if cluster_cfg is not None else None,
              "profile": {"source": profile.source, "device": profile.device,
                          "dtype": profile.dtype, "extrapolated_batches": extrapolated,
                          "estimated_layers": sorted(profile.meta.get("estimated_layers", {})),
                          "other_device": profile.meta.get("other_device"),
                          "calibration": profile.meta.get("calibration")}}
  return dataclasses.replace(plan, extra={**plan.extra, **made_for})


def predicted_step(graph, profile, cluster, cfg: Any, assignment: dict, g: int) -> dict[str, Any]:
  """A plan's predicted step time, validate's and the pipeline's: the planner's own evaluation
  of `assignment` on the (calibrated) cluster and the profile (dp_jax.planner.evaluate: compute
  with the update unless profiled, all-reduce unless profiled, moves, per-stage launches and
  boundaries), in ms, with its parts."""
  from dp_jax.planner import evaluate_plan

  opts = plan_options(cfg.planner, g, cfg.batch_size)
  opts.pop("num_devices")
  opts.pop("global_batch")
  ev = evaluate_plan(graph, profile, cluster, assignment, global_batch=cfg.batch_size,
                     num_devices=g, **opts)
  n = len(ev.stages)
  host = n * cluster.program_launch_us / 1e3 + (n - 1) * cluster.stage_boundary_us / 1e3
  return {"predicted_ms": ev.iteration_ms, "stages": n,
          "compute_ms": sum(s.compute_ms for s in ev.stages),
          "sync_ms": sum(s.sync_ms for s in ev.stages),
          "move_ms": sum(m.ms for m in ev.moves), "overhead_ms": ev.overhead_ms,
          "boundary_ms": ev.overhead_ms - host, "update_ms": ev.update_ms}


def extrapolated_batches(profile, graph, batches: list[int]) -> list[int]:
  """Per-device batches outside some layer's measured range (priced by extrapolation)."""
  out = set()
  for name in graph.names:
    measured = profile.batches(name)
    if measured:
      out |= {b for b in batches if b < measured[0] or b > measured[-1]}
  return sorted(out)


def model_record(graph, model_cfg: Any = None) -> dict[str, Any]:
  """What a plan was made for: model name, per-sample input shape, layer count, size options."""
  from dp_jax.models.zoo import model_kwargs

  options = model_kwargs(model_cfg) if model_cfg is not None else {}
  options.pop("dtype", None)
  return {"name": graph.model, "input_shape": list(graph.input_shape),
          "layers": len(graph.nodes), "options": options}


def check_made_for(plan: Plan, record: dict[str, Any], where: str) -> None:
  """Refuse a plan recorded as made for another model config (one line naming both)."""
  made = plan.made_for
  if made is None:
    return  # a plan from before plans recorded it: the layer names are still checked
  keys = ["name", "input_shape", "layers"]
  differs = [k for k in keys if k in made and k in record and made[k] != record[k]]
  ours, theirs = record.get("options", {}), made.get("options") or {}
  differs += [f"options.{k}" for k in ours if k in theirs and ours[k] != theirs[k]]
  if differs:
    raise UserError(f"{where} was made for {describe(made)}, not {describe(record)}; use the "
                    "model options it was made with or make a plan for this model")


def describe(record: dict[str, Any]) -> str:
  """'vgg16 (input 32x32x3, 22 layers, image_size=32)'."""
  shape = "x".join(map(str, record.get("input_shape") or [])) or "?"
  opts = "".join(f", {k}={v}" for k, v in sorted((record.get("options") or {}).items()))
  return f"{record.get('name')} (input {shape}, {record.get('layers')} layers{opts})"


def _plain(cfg: Any) -> Any:
  from omegaconf import DictConfig, OmegaConf

  if isinstance(cfg, DictConfig):
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
  return cfg
