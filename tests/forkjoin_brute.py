"""Brute force over every assignment evaluate() accepts, on small random fork/join graphs.

A case is one fork layer, 2-3 branches of 1-2 layers (or an identity branch), one join layer,
on G devices with random per-layer costs and a random cluster (1, 2 or 4 devices per node).
Every layer may sit on any contiguous range [s, s + c) of the G devices with c dividing B;
`brute_force` scores all of them with evaluate(), `restrictions` names what the best one does
that an older plan space could not (the issue's three restrictions, plus off-prefix ends).
"""

from __future__ import annotations

import itertools

import numpy as np

from dp_jax.cluster import ClusterSpec
from dp_jax.graph import LayerGraph, LayerNode, Parallel
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.search import build_tables, search
from dp_jax.planner.structure import flat_layers, sharing_groups
from dp_jax.planner.synthetic import linear_profile, random_layer


def random_forkjoin(rng: np.random.Generator, max_branches: int = 3,
                    max_depth: int = 2) -> LayerGraph:
  """fork -> 2..max_branches branches of 1..max_depth layers (at most one identity) -> join."""
  nodes: list[LayerNode] = []

  def node(inputs):
    return random_layer(rng, nodes, inputs)

  fork = node([])
  ends, identity = [], False
  for _ in range(int(rng.integers(2, max_branches + 1))):
    depth = int(rng.integers(0 if not identity else 1, max_depth + 1))
    identity |= depth == 0
    cur = fork
    for _ in range(depth):
      cur = node([cur])
    ends.append(cur)
  if len({e for e in ends if e != fork}) < 2:  # a block needs two non-identity branches
    ends.append(node([fork]))
  node(list(dict.fromkeys(ends)))
  return LayerGraph(model="forkjoin", input_shape=(1,), input_dtype="float32",
                    nodes=tuple(nodes))


def random_model(seed: int, g: int = 4, b: int = 4, max_branches: int = 3, max_depth: int = 2):
  """A cost model of a random fork/join graph on g devices, global batch b."""
  rng = np.random.default_rng(seed)
  graph = random_forkjoin(rng, max_branches, max_depth)
  cluster = ClusterSpec("t", "synthetic", 64, int(rng.choice([1, 2, 4])), 1e6,
                        float(rng.uniform(1, 50)), float(rng.uniform(0, 30)),
                        float(rng.uniform(0.1, 5)), float(rng.uniform(0, 100)))
  profile = linear_profile(graph, [1, 2, 3, 4, 6, 8, 12], rng)
  opts = PlanOptions(num_devices=g, global_batch=b, overlap_allreduce=bool(rng.random() < 0.5))
  return build_cost_model(graph, profile, cluster, opts)


def placements(model) -> list[tuple[int, int]]:
  """Every (start, count) evaluate() accepts: c divides B, [s, s + c) inside the G devices."""
  g = model.options.num_devices
  return [(s, int(c)) for c in model.counts for s in range(g - int(c) + 1)]


def brute_force(model) -> tuple[float, dict]:
  """The least iteration_ms over every assignment evaluate() accepts, and that assignment."""
  places = placements(model)
  names = model.names
  best, arg = np.inf, None
  for combo in itertools.product(places, repeat=len(names)):
    a = dict(zip(names, combo, strict=True))
    ms = evaluate(model, a).iteration_ms
    if ms < best - 1e-12:
      best, arg = ms, a
  return best, arg


def planner(model) -> tuple[float, dict]:
  """The search's assignment and its evaluate() cost (which must be the search's own value)."""
  mask = np.ones(model.compute_ms.shape, dtype=bool)
  a, _, value = search(build_tables(model, mask))
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
