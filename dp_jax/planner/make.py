"""make_plan: validate, price every layer, search, check memory, compare with data parallelism."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.table import ProfileTable
from dp_jax.planner import memory, pricing, sharded
from dp_jax.planner.amplification import (
  allowed_counts,
  amplification,
  offers,
  sharded_amplification,
)
from dp_jax.planner.baseline import data_parallel
from dp_jax.planner.contract import LayerPlan, Plan, PlanStage, planner_config, recorded
from dp_jax.planner.costs import CostModel, Placement, build_cost_model
from dp_jax.planner.evaluate import Evaluation, data_parallel_assignment, evaluate
from dp_jax.planner.frontier import DEFAULT_LIMITS, FrontierPoint, sweep
from dp_jax.planner.options import PlanOptions, candidate_counts
from dp_jax.planner.search import SHARDING_RULES, SPACE, build_tables, lower_bound, search
from dp_jax.planner.sharded import Strategy
from dp_jax.planner.sharding import LayerSharding, layer_sharding, sample_ranges
from dp_jax.planner.uniform import best_uniform

log = logging.getLogger(__name__)
# Lagrange multipliers (ms per GB of saved activations) tried in turn when the fastest plan
# overflows device memory, up to the one after the first whose plan fits; the fastest plan that
# fits wins.
MEMORY_PENALTIES_MS_PER_GB = (0.01, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e6)


def plan_with(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
              options: PlanOptions, frontier_limits: Iterable[float] = DEFAULT_LIMITS) -> Plan:
  """The plan `options.name` names: the fastest burst-parallel plan under the amplification
  limit (mode="frontier" also attaches the Pareto front of (iteration_ms, gpu_ms) over
  frontier_limits), or the data-parallel baseline."""
  start = time.perf_counter()
  model = build_cost_model(graph, profile, cluster, options)
  baseline = data_parallel(model)
  if options.name == "data_parallel":
    count, ev = baseline
    return build_plan(model, data_parallel_assignment(model, count), ev, baseline,
                      seconds=time.perf_counter() - start, extra={"strategy": "data_parallel"})
  fits = memory.fits_alone(model)
  best = plan_for_limit(model, options.amplification_limit, fits, baseline, bound=True)
  extra: dict[str, Any] = {"strategy": "burst", "optimality": optimality(best)}
  if options.mode == "frontier":
    front = sweep(lambda a: plan_for_limit(model, a, fits, baseline), frontier_limits)
    extra["frontier"] = [p.to_json() for p in front]
  return build_plan(model, dict(best.assignment),
                    evaluate(model, best.assignment, best.shardings), baseline,
                    seconds=time.perf_counter() - start, extra=extra, shardings=best.shardings)


def plan_for(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
             options: PlanOptions, *, model: Mapping[str, Any] | None = None,
             cluster_record: Mapping[str, Any] | None = None) -> Plan:
  """`plan`, recording what it was made for (the model record, the cluster, the profile with
  the per-device batches it had to extrapolate to, warned once: planner/contract.py, `recorded`)."""
  made = plan_with(graph, profile, cluster, options)
  # the per-device batches this search priced: B / d for its device counts d <= G
  b = options.global_batch
  extrapolated = extrapolated_batches(profile, graph,
                                      sorted(b // int(d) for d in candidate_counts(options)))
  if extrapolated:
    log.warning("profile of %s (%s) has no measurement at per-device batch(es) %s for some "
                "layers: extrapolated on a log-log line (recorded in the plan)", graph.model,
                profile.source, ", ".join(map(str, extrapolated)))
  return recorded(made, model=model, cluster=cluster_record, profile={
      "source": profile.source, "device": profile.device, "dtype": profile.dtype,
      "extrapolated_batches": extrapolated,
      "estimated_layers": sorted(profile.meta.get("estimated_layers", {})),
      "other_device": profile.meta.get("other_device"),
      "calibration": profile.meta.get("calibration")})


def idle_device_limit(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                      options: PlanOptions, limits: Iterable[float] = DEFAULT_LIMITS
                      ) -> float | None:
  """The highest of `limits` at or below options' amplification limit whose fastest plan
  leaves some device idle in some layer (room for a background job); None when each is data
  parallelism on all G devices.

  A lower limit only removes device counts, so the plan under the highest such limit is the
  fastest plan with an idle device among those the limits give.
  """
  for limit in sorted({float(a) for a in limits if a <= options.amplification_limit},
                      reverse=True):
    plan = plan_with(graph, profile, cluster, replace(options, amplification_limit=limit))
    if any(count < options.num_devices for _, count in plan.assignment().values()):
      return limit
  return None


def plan_with_idle_device(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                          options: PlanOptions, **record: Any) -> tuple[Plan, float | None]:
  """plan_for's plan if some layer leaves a device idle (room for a background job), with None;
  else the fastest plan with an idle device (idle_device_limit) and the limit it was made
  under. `record`: plan_for's model and cluster_record. A UserError when every limit gives
  data parallelism."""
  plan = plan_for(graph, profile, cluster, options, **record)
  if any(count < options.num_devices for _, count in plan.assignment().values()):
    return plan, None
  limit = idle_device_limit(graph, profile, cluster, options)
  if limit is None:
    raise UserError(
        f"every plan of {graph.model} on {options.num_devices} devices, down to amplification "
        "limit 1, is data parallelism (its profile has every layer run at least twice as fast "
        "on twice the devices): no device idles for a background job; profile it again on a "
        "quieter machine, or run without the background job")
  return plan_for(graph, profile, cluster, replace(options, amplification_limit=limit),
                  **record), limit


def extrapolated_batches(profile: ProfileTable, graph: LayerGraph,
                         batches: list[int]) -> list[int]:
  """Per-device batches outside some layer's measured range (priced by extrapolation)."""
  out = set()
  for name in graph.names:
    measured = profile.batches(name)
    if measured:
      out |= {b for b in batches if b < measured[0] or b > measured[-1]}
  return sorted(out)


def make_plan(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig, *,
              frontier_limits: Iterable[float] = DEFAULT_LIMITS, **options: Any) -> Plan:
  """The fastest burst-parallel plan; `options`: PlanOptions' fields (num_devices,
  global_batch, amplification_limit, ...)."""
  return plan_with(graph, profile, cluster, PlanOptions(**options), frontier_limits)


def data_parallel_plan(graph: LayerGraph, profile: ProfileTable, cluster: ClusterConfig,
                       **options: Any) -> Plan:
  """The data-parallel plan with predicted and data-parallel numbers (they coincide);
  `options`: PlanOptions' fields."""
  options.pop("amplification_limit", None)
  return plan_with(graph, profile, cluster, PlanOptions(**options, name="data_parallel"))


def plan_for_limit(model: CostModel, limit: float, fits: np.ndarray,
                   baseline: tuple[int, Evaluation] | None = None,
                   bound: bool = False) -> FrontierPoint:
  """Fastest plan under `limit` that fits in memory (Lagrange repair when the sum overflows).

  With weight sharding allowed, one search per sharding rule (search.SHARDING_RULES: samples
  only, and exact: every layer's sharding chosen per stage, stage_choice); the fitting plan
  evaluate() prices fastest wins, so it is never slower than the samples-only plan. The exact
  rule searches the options amplification.offers gives: samples where it fits within the limit
  and every (count, sharding) that fits alone (memory.weight_fits) within the limit, so a layer
  whose samples split does not fit may still get a weight split that does. `bound`: also a
  lower bound on every plan of the search's space (search.lower_bound, least over the rules;
  the plan's own cost where no block was searched heuristically)."""
  allowed = allowed_counts(model, limit, fits)
  weights = model.options.chooses_strategies
  rules = SHARDING_RULES if weights else SHARDING_RULES[:1]
  offer = offers(model, limit, fits, memory.weight_fits(model)) if weights else None

  def tables(rule, lam=None):
    penalty = None if lam is None else lam * act_gb
    if rule == "samples":
      return build_tables(model, allowed, penalty_ms=penalty)
    return build_tables(model, offer.samples, penalty_ms=penalty, rule=rule,
                        offers=offer.weights, penalty_per_gb=lam)

  act_gb = memory.activation_bytes(model) / memory.GB

  if not allowed.any(axis=1).all():  # some layer fits only under a weight split
    rules = tuple(r for r in rules if r != "samples")
  found: list[tuple[float, dict, dict]] = []
  tried = None
  floors, heuristic = [], 0
  for rule in rules:
    t = tables(rule)
    result = search(t)
    assignment, shardings = result.assignment, result.shardings
    heuristic = max(heuristic, result.heuristic_blocks)
    if bound:
      floors.append(lower_bound(t) if result.heuristic_blocks else result.iteration_ms)
    tried = (assignment, shardings) if assignment else tried
    if assignment and memory.fits(model, assignment, shardings):
      found.append((evaluate(model, assignment, shardings).iteration_ms, assignment, shardings))
  floor = {"lower_bound_ms": min(floors), "heuristic_blocks": heuristic} if floors else {}
  uniform = _uniform_candidate(model, offer)
  if found:
    found.extend(uniform)
    _, assignment, shardings = min(found, key=lambda x: x[0])
    ev = evaluate(model, assignment, shardings)
    return FrontierPoint(limit, ev.iteration_ms, ev.gpu_ms, assignment, shardings, **floor)
  fitted_at = None
  for k, lam in enumerate(MEMORY_PENALTIES_MS_PER_GB):
    if fitted_at is not None and k > fitted_at + 1:
      break  # a larger multiplier only trades more time for memory that already fits
    for rule in rules:
      candidate, shards = _search(tables(rule, lam))
      tried = (candidate, shards) if candidate else tried
      if candidate and memory.fits(model, candidate, shards):
        found.append((evaluate(model, candidate, shards).iteration_ms, candidate, shards))
        fitted_at = k if fitted_at is None else fitted_at
  found.extend(uniform)
  if baseline is not None:
    count = baseline[0]
    column = int(np.searchsorted(model.counts, count))
    dp = {n: (0, count) for n in model.names}
    if allowed[:, column].all() and memory.fits(model, dp):
      found.append((baseline[1].iteration_ms, dp, {}))
  if not found:
    if tried is None:
      raise UserError(f"no plan of {model.graph.model} on {model.options.num_devices} devices "
                      f"places every layer where it fits under amplification limit {limit:g}; "
                      "raise planner.amplification_limit or use more devices")
    memory.check_fits(model, tried[0], shardings=tried[1])  # raises, naming the device
  _, assignment, shardings = min(found, key=lambda x: x[0])
  ev = evaluate(model, assignment, shardings)
  return FrontierPoint(limit, ev.iteration_ms, ev.gpu_ms, assignment, shardings, **floor)


def _uniform_candidate(model: CostModel, offer) -> list[tuple[float, dict, dict]]:
  """The best uniform strategy (planner/uniform.py) as a candidate plan where every layer's
  setting is offered under the limit (`offer`: amplification.offers): it lies in the search's
  space, so the plan is never slower than it; the memory repair's penalties may miss it."""
  if offer is None:
    return []
  memo = pricing.memo(model)
  best = memo.get("best uniform")
  if best is None:
    best = memo["best uniform"] = best_uniform(model)
  if best.setting is None:
    return []
  count = best.setting.devices
  column = int(np.searchsorted(model.counts, count))
  if column >= len(model.counts) or model.counts[column] != count:
    return []
  for r, name in enumerate(model.names):
    s = best.shardings.get(name)
    plain = s is None or sharded.strategy(s).plain
    if not (offer.samples[r, column] if plain else
            sharded.strategy(s) in offer.weights.get((r, column), ())):
      return []
  assignment = {n: (0, count) for n in model.names}
  shards = {n: sharded.strategy(s) for n, s in best.shardings.items()
            if not sharded.strategy(s).plain}
  return [(evaluate(model, assignment, shards).iteration_ms, assignment, shards)]


EXACT_GAP = 1e-9  # a plan within this (relative: float rounding) of its lower bound is exact


def optimality(point: FrontierPoint) -> dict[str, Any]:
  """How far the plan can be from the best of the search's space (`space`: search.SPACE): a
  lower bound on every plan of it (ms), the plan's gap to it (plan / bound - 1), the number of
  blocks searched short of their whole space (search.Found.heuristic_blocks: they take the
  bound's floor), and `exact`: the plan is proven the space's best, its cost meeting the bound
  (false where a heuristic block, or the memory repair, may have cost time)."""
  low = point.lower_bound_ms
  gap = point.iteration_ms / low - 1 if low and math.isfinite(low) else None
  return {"lower_bound_ms": low, "gap": gap, "heuristic_blocks": point.heuristic_blocks,
          "exact": gap is not None and gap <= EXACT_GAP, "space": SPACE}


def _search(tables) -> tuple[dict[str, Placement], dict[str, Strategy]]:
  """The search's assignment and the weight shardings of its layers (empty: none exists)."""
  found = search(tables)
  return found.assignment, found.shardings


def _amplification(model: CostModel, amp: np.ndarray, name: str, count: int,
                   sh: Strategy | None, column: int) -> float:
  """The layer's amplification as the limit saw it: under its strategy, if not PLAIN."""
  if sh is None or sh.plain:
    return float(amp[model.row[name], column])
  return sharded_amplification(model, name, count, sh)


def experts_record(graph: LayerGraph) -> dict[str, Any]:
  """{"experts": {layer: capacity factor, capacity per expert per sequence, top-k, experts}}
  for a model with mixture-of-experts layers (every plan of it states them), else {}."""
  rec = {n.name: {k: n.attrs.get(k) for k in ("capacity_factor", "capacity", "top_k",
                                                "n_expert", "seq_len")}
         for n in graph.nodes if n.kind == "moe_experts"}
  return {"experts": rec} if rec else {}


def build_plan(model: CostModel, assignment: Mapping[str, Placement], ev: Evaluation,
               baseline: tuple[int, Evaluation], *, seconds: float,
               extra: Mapping[str, Any] | None = None,
               shardings: Mapping[str, Strategy] | None = None) -> Plan:
  """A Plan with per-layer and per-stage costs and the data-parallel comparison, its options and
  the stages `ev` walked; layers with a weight sharding carry it (LayerSharding, from
  dp_jax.planner.sharding.layer_sharding)."""
  opts, g = model.options, model.options.num_devices
  shardings = shardings or {}
  dp_count, dp = baseline
  stage_of, sync_share = {}, {}
  for i, st in enumerate(ev.stages):
    grads = sum(pricing.grad_bytes(model, n, shardings.get(n)) for n in st.layers)
    for n in st.layers:
      stage_of[n] = i
      mine = pricing.grad_bytes(model, n, shardings.get(n))
      sync_share[n] = st.sync_ms * mine / grads if grads else 0.0
  moved_in: dict[str, float] = {}
  for mv in ev.moves:
    moved_in[mv.dst] = moved_in.get(mv.dst, 0.0) + mv.ms
  amp = amplification(model)
  ranges = functools.cache(lambda b, d, m, split: tuple(sample_ranges(b, d, m, split)))
  layers = []
  for node in model.graph.nodes:
    start, count = assignment[node.name]
    sh = sharded.strategy(shardings.get(node.name))
    t = pricing.layer_time(model, node.name, (start, count), sh)
    fb, bwd = float(t.total), float(t.backward_total)
    column = np.searchsorted(model.counts, count)
    in_table = column < len(model.counts) and model.counts[column] == count
    m = sh.m
    layers.append(LayerPlan(
        name=node.name, devices=tuple(range(start, start + count)),
        samples=ranges(opts.global_batch, count // m, m, sh.split),
        sharding=None if sh.split == "samples" and sh.state == "replicated" else
        LayerSharding.from_json(layer_sharding(node, (count // m, m), sh.split, sh.state), count,
                                node.name),
        recompute=sh.recompute,
        extra={"kind": node.kind,
               "per_device_batch": opts.global_batch // sh.sample_groups(count),
               "compute_ms": fb, "fwd_ms": fb - bwd, "bwd_ms": bwd,
               "update_ms": float(t.update),
               "memory_gb": (memory.layer_need(model, node.name, count, sh)
                             + memory.transient_need(model, node.name, count, sh)) / memory.GB,
               "sync_ms": float(sync_share[node.name]),
               "move_in_ms": float(moved_in.get(node.name, 0.0)),
               "amplification": _amplification(model, amp, node.name, count, sh, column)
                                if in_table else None,
               "stage": stage_of[node.name]}))
  used = memory.device_bytes(model, assignment, {n: sharded.strategy(x)
                                                 for n, x in shardings.items()})
  dp_used = memory.device_bytes(model, {n: (0, dp_count) for n in model.names})
  predicted = {
      "iteration_ms": ev.iteration_ms, "gpu_ms": ev.gpu_ms,
      "data_parallel_iteration_ms": dp.iteration_ms, "data_parallel_gpu_ms": dp.gpu_ms,
      "idle_fraction": 1.0 - ev.gpu_ms / (g * ev.iteration_ms) if ev.iteration_ms else 0.0,
      "data_parallel_idle_fraction":
          1.0 - dp.gpu_ms / (g * dp.iteration_ms) if dp.iteration_ms else 0.0,
      "samples_per_s": opts.global_batch / ev.iteration_ms * 1e3 if ev.iteration_ms else 0.0,
      "data_parallel_samples_per_s":
          opts.global_batch / dp.iteration_ms * 1e3 if dp.iteration_ms else 0.0,
      "speedup_vs_data_parallel": dp.iteration_ms / ev.iteration_ms if ev.iteration_ms else 1.0,
      "data_parallel_devices": dp_count,
      # of iteration_ms: the optimizer updates (in compute) and the stage terms (launches,
      # boundaries), summed over stages; docs/cost_model.md
      "update_ms": ev.update_ms, "data_parallel_update_ms": dp.update_ms,
      "stage_overhead_ms": ev.overhead_ms, "data_parallel_stage_overhead_ms": dp.overhead_ms,
      "memory_peak_gb": float(used.max()) / memory.GB,
      "memory_capacity_gb": float(memory.capacity_bytes(model)) / memory.GB,
      "data_parallel_memory_peak_gb": float(dp_used.max()) / memory.GB,
  }
  job = model.cluster.with_num_devices(g)
  stages = tuple(PlanStage((int(s.placement[0]), int(s.placement[1])), s.layers, {
      "compute_ms": s.compute_ms, "sync_ms": s.sync_ms, "update_ms": s.update_ms,
      "overhead_ms": s.overhead_ms}) for s in ev.stages)
  more = {
      "memory_gb_per_device": [round(float(x) / memory.GB, 6) for x in used],
      **experts_record(model.graph),
      "moves": [{"src": m.src, "dst": m.dst, "ms": m.ms, "devices": m.devices}
                for m in ev.moves],
      "topology": {"nodes": job.num_nodes, "devices_per_node": job.devices_per_node,
                   "multi_node": job.num_nodes > 1},
      "cluster_spec": asdict(model.cluster),
      "candidate_counts": [int(c) for c in model.counts],
      "interpolated_layers": sorted(model.interpolated),
      **dict(extra or {}),
  }
  return Plan(model=model.graph.model, global_batch=opts.global_batch, num_devices=g,
              cluster=model.cluster.name, amplification_limit=float(opts.amplification_limit),
              layers=tuple(layers), predicted=predicted, planner_seconds=seconds,
              options=planner_config(opts), stages=stages, extra=more)


