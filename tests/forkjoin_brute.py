"""Brute force over every assignment evaluate() accepts, on small random fork/join graphs.

A case is one fork layer, 2-3 branches of 1-2 layers (or an identity branch), one join layer,
on G devices with random per-layer costs and a random cluster (1, 2 or 4 devices per node).
Every layer may sit on any contiguous range [s, s + c) of the G devices with c dividing B;
`brute_force` scores all of them with evaluate(), `restrictions` names what the best one does
that an older plan space could not (the issue's three restrictions, plus off-prefix ends).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from dp_jax.graph.layer_graph import LayerGraph, LayerNode, Parallel
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.search import ELEMENTWISE_KINDS, build_tables, search
from dp_jax.planner.structure import flat_layers, sharing_groups
from dp_jax.planner.synthetic import cluster as synthetic_cluster
from dp_jax.planner.synthetic import linear_profile, random_layer


def random_forkjoin(rng: np.random.Generator, max_branches: int = 3, max_depth: int = 2,
                    elementwise: float = 0.0) -> LayerGraph:
  """fork -> 2..max_branches branches of 1..max_depth layers (at most one identity) -> join;
  each branch layer is an elementwise relu with probability `elementwise`."""
  nodes: list[LayerNode] = []

  def node(inputs, in_branch=False):
    if in_branch and elementwise and rng.random() < elementwise:
      nodes.append(LayerNode(name=f"n{len(nodes)}", kind="relu", inputs=tuple(inputs), params=0,
                             param_bytes=0, out_bytes_per_sample=nodes[-1].out_bytes_per_sample))
      return nodes[-1].name
    return random_layer(rng, nodes, inputs)

  fork = node([])
  ends, identity = [], False
  for _ in range(int(rng.integers(2, max_branches + 1))):
    depth = int(rng.integers(0 if not identity else 1, max_depth + 1))
    identity |= depth == 0
    cur = fork
    for _ in range(depth):
      cur = node([cur], in_branch=True)
    ends.append(cur)
  if len({e for e in ends if e != fork}) < 2:  # a block needs two non-identity branches
    ends.append(node([fork], in_branch=True))
  node(list(dict.fromkeys(ends)))
  return LayerGraph(model="forkjoin", input_shape=(1,), input_dtype="float32",
                    nodes=tuple(nodes))


def random_model(seed: int, g: int = 4, b: int = 4, max_branches: int = 3, max_depth: int = 2,
                 elementwise: float = 0.0, stage_terms: bool = False):
  """A cost model of a random fork/join graph on g devices, global batch b (`elementwise`:
  random_forkjoin's share of relu layers in branches; `stage_terms`: with_stage_terms)."""
  rng = np.random.default_rng(seed)
  graph = random_forkjoin(rng, max_branches, max_depth, elementwise)
  cluster = synthetic_cluster("t", "synthetic", 64, int(rng.choice([1, 2, 4])), 4096.0,
                        float(rng.uniform(1, 50)), float(rng.uniform(0, 30)),
                        float(rng.uniform(0.1, 5)), float(rng.uniform(0, 100)),
                        update_memory_GBps=1e3)
  profile = linear_profile(graph, [1, 2, 3, 4, 6, 8, 12], rng)
  opts = PlanOptions(num_devices=g, global_batch=b, overlap_allreduce=bool(rng.random() < 0.5),
                     amplification_limit=math.inf)
  model = build_cost_model(graph, profile, cluster, opts)
  return with_stage_terms(model, seed) if stage_terms else model


def with_stage_terms(model, seed: int):
  """The model with random nonzero per-stage terms (CostModel.stage_ms, enter_ms, leave_ms)."""
  rng = np.random.default_rng(seed + 10**6)
  rows, cols = len(model.names), len(model.counts)
  return dataclasses.replace(model, stage_ms=rng.uniform(0.05, 2.0, cols),
                             enter_ms=rng.uniform(0.0, 1.0, (rows, cols)),
                             leave_ms=rng.uniform(0.0, 1.0, (rows, cols)))


def placements(model) -> list[tuple[int, int]]:
  """Every (start, count) evaluate() accepts: c divides B, [s, s + c) inside the G devices."""
  g = model.options.num_devices
  return [(s, int(c)) for c in model.counts for s in range(g - int(c) + 1)]


def pinned_pairs(model) -> list[tuple[str, str]]:
  """(layer, producer) of every single-input elementwise layer: the planner keeps it on its
  producer's devices (search.ELEMENTWISE_KINDS), so the brute force does too."""
  return [(n.name, n.inputs[0]) for n in model.graph.nodes
          if n.kind in ELEMENTWISE_KINDS and len(n.inputs) == 1]


def in_claimed_space(model, a: dict, count_changes: bool = True) -> bool:
  """Whether assignment `a` lies in the space search.py's docstring claims for its exact tier:
  top-level layers (forks, joins) on prefixes [0, c); each block merged, or its branches in
  sharing groups whose device hulls are disjoint, a group of several branches all on one
  placement (a group of one may change placement inside its hull, unless not
  `count_changes`: the space of the groups and packed tiers)."""
  for item in model.graph.decompose().items:
    if isinstance(item, str):
      if a[item][0] != 0:
        return False
      continue
    p = a[item.fork]
    if a[item.join] == p and all(a[n] == p for n in flat_layers(item)):
      continue  # merged
    branches = [b for b in item.branches if b.items]
    masks = [branch_mask(br, a) for br in branches]
    hulls = []
    for grp in sharing_groups(masks):
      layers = [n for i in grp for n in flat_layers(branches[i])]
      if (len(grp) > 1 or not count_changes) and len({a[n] for n in layers}) > 1:
        return False
      hulls.append((min(a[n][0] for n in layers), max(sum(a[n]) for n in layers)))
    hulls.sort()
    if any(hi > lo for (_, hi), (lo, _) in zip(hulls, hulls[1:], strict=False)):
      return False
  return True


def brute_force(model, claimed: bool = False, count_changes: bool = True) -> tuple[float, dict]:
  """The least iteration_ms over every assignment evaluate() accepts that keeps elementwise
  layers on their producers' devices (`claimed`: and lies in in_claimed_space), and that
  assignment."""
  places = placements(model)
  free = [n for n in model.names if n not in dict(pinned_pairs(model))]
  pins = pinned_pairs(model)
  best, arg = np.inf, None
  for combo in itertools.product(places, repeat=len(free)):
    a = dict(zip(free, combo, strict=True))
    for name, src in pins:  # producers come first (topological order)
      a[name] = a[src]
    if claimed and not in_claimed_space(model, a, count_changes):
      continue
    ms = evaluate(model, a).iteration_ms
    if ms < best - 1e-12:
      best, arg = ms, a
  return best, arg


def planner(model) -> tuple[float, dict]:
  """The search's assignment and its evaluate() cost (which must be the search's own value)."""
  mask = np.ones(model.compute_ms.shape, dtype=bool)
  a, _, value = search(build_tables(model, mask))[:3]
  ms = evaluate(model, a).iteration_ms
  assert abs(ms - value) <= 1e-9 * ms, (ms, value)
  return ms, a


def restrictions(model, a: dict) -> set[str]:
  """Which restrictions of the old plan space assignment `a` breaks (for the record)."""
  top = model.graph.decompose()
  out = set()
  for item in top.items:
    if isinstance(item, str):
      if a[item][0] != 0:
        out.add("off-prefix fork/join")
      continue
    _block_restrictions(item, a, out)
  return out


def _block_restrictions(block: Parallel, a: dict, out: set) -> None:
  p = a[block.fork]
  branches = [b for b in block.branches if b.items]
  if a[block.join] == p and all(a[n] == p for b in branches for n in flat_layers(b)):
    return  # merged
  masks, uniform = [], []
  for br in branches:
    masks.append(branch_mask(br, a))
    uniform.append(len({a[n] for n in flat_layers(br)}) == 1)
  groups = sharing_groups(masks)
  if len(groups) == 1:
    return  # serialized
  if any(len(grp) > 1 for grp in groups):
    out.add("mixed groups")
  if not all(uniform):
    out.add("count change in a concurrent branch")
  starts = [min(a[n][0] for n in flat_layers(br)) for br in branches]
  ends = [max(a[n][0] + a[n][1] for n in flat_layers(br)) for br in branches]
  packed, at = True, 0
  for i in range(len(branches)):
    if starts[i] != at:
      packed = False
    at = ends[i]
  if not packed:
    out.add("lanes not packed from 0 in branch order")


def branch_mask(branch, assignment) -> int:
  """Bit mask of the devices the layers of `branch` use under `assignment` (layer -> (s, c))."""
  mask = 0
  for n in flat_layers(branch):
    s, c = assignment[n]
    mask |= ((1 << c) - 1) << s
  return mask
