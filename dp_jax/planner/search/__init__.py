"""Burst-parallel search: dynamic programming over the series-parallel decomposition.

The objective is exactly evaluate() (dp_jax/planner/evaluate.py) over this plan space:
- every chain lives on a prefix [0, count) of the job's devices, one count per layer;
- a fork/join block is either merged into a stage (fork, branches and join on one count),
  serialized (each branch a chain of its own on prefixes, branches one after another), or
  concurrent: the non-identity branches are split into groups, each group on its own
  contiguous lane [s, s + count) with its branches one after another at that count, lanes
  disjoint and anywhere in [0, G) in any order (one group on one lane is allowed too); in
  the exact tier (below) a group of one short branch may also change device count inside its
  lane, its layers on any ranges within the lane [lo, hi) they span, and with weight sharding
  each of its layers may take any sharding offered on its count;
- a single-input elementwise layer (ELEMENTWISE_KINDS) stays on its producer's devices: a
  branch that opens with one runs on the fork's devices (serialized: on the fork's count; in a
  concurrent block its group's lane is the fork's [0, f), beside the other groups' lanes).

Chain DP. V[k][f, g]: least cost of the chain up to node item k, given the enclosing fork
runs on count f and node k on count g. A stage is a run of items i..k on one count g, so
V[k][:, g] = min over run starts i of Vin[i][:, g] + run(i..k, g), where Vin[i] prices
everything before i (the move into i, or the block that i joins). A run also pays the cost
model's per-stage terms (CostModel.stage_ms[g] + enter_ms[i, g] + leave_ms[k, g], all >= 0),
as does every stage of a branch in a lane. Runs may be cut where evaluate() would not cut
them; that never helps (latency and per-stage terms are paid once per run, exposure is
sub-additive), so the minimum is evaluate()'s optimum. Cost O(items^2 C + items C^3) per
chain with C candidate counts.

Weight sharding (planner.sharding with weights, rule "exact"): each (layer, count) on the
prefix offers samples and its undominated weight shardings (stage_choice), and a stage takes
the best combination exactly: a run's cost is the least of a no-sync stage (every layer on an
option that all-reduces nothing, no latency: cumulative sums) and a sync stage (latency once;
without overlap cumulative sums of compute + bandwidth; with overlap the open-stage states
(P, Q) of stage_choice, whose Pareto frontier per (fork count, count) is carried from layer to
layer, new stages entering it at every node item). So the chain DP is exact over placements
on prefixes and per-layer shardings jointly (tests/test_planner_sharding_brute.py checks it by
brute force). In a concurrent block, a lane that holds one short branch (at most
SHARDED_LAYOUTS per-layer (range, sharding) combinations) enumerates them exactly (_options),
priced by the cost model's stages as evaluate() prices them; lanes that hold several branches,
and longer branches, split samples. make.plan_for_limit also runs the samples-only search and
keeps the faster plan that fits.

Block DP. A block's cost is a matrix over (fork count, join count): serialized sums the
branch chains (each solved once with its fork context); concurrent runs the lane search
(_lane_dp), whose state is (branches placed, end of the last lane) and whose tier depends on
the block's size alone (n non-identity branches, C counts, G devices; cells = C^3 (G + 1)):
- exact: ((3^n - 2^n) x cells + option steps) x (candidate maxima)^2 <= EXACT_CELLS: for
  every pair of candidate forward / backward maxima the least moves with every lane within
  them; exact over the concurrent space above (every block of <= 3 branches at G = 4 in
  practice).
  Branches that are plain chains with at most OPTION_LAYOUTS layouts (placements^layers)
  also get every count-changing layout inside a lane (with weight sharding: every layout and
  per-layer sharding, at most SHARDED_LAYOUTS, else samples only), less those another layout
  beats on every term (forward, backward, each send and receive) within a hull no wider;
- groups: (3^n - 2^n) x cells <= GROUP_CELLS: the same space less count changes inside
  lanes, keeping per state the partial layout of least partial cost (exact for one lane, a
  heuristic for more);
- packed (larger blocks, e.g. every block at G >= 64): one lane per branch packed from
  device 0 in branch order (the search before groups), exact for two lanes, a heuristic
  beyond. Cost O(branches G C^3).
Where a block's tier is a heuristic (groups of 2+ branches, packed), lower_bound() reruns the
DP with its concurrent cost floored (lanes.concurrent_floor): a lower bound on the best plan
of this space, which make_plan records with the plan's gap to it. The rerun reuses the
search's block solutions (only the floors and the chains around the blocks are recomputed).

Outside the space (evaluate() accepts them, the search never returns them): chains, forks and
joins off the prefix [0, count); outside the exact tier, a branch that changes device count
(or takes weight shardings) while another group runs beside it; weight shardings in a lane
holding several branches; a group of several branches on different ranges; lanes that
interleave (one branch's layers on both sides of another's). No bound on what these cost is
proven; tests/test_planner_forkjoin.py (samples) and tests/test_planner_sharding_brute.py
(weights) measure it by brute force over every assignment evaluate() accepts on random
fork/join graphs at G = 4 and assert their margins there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dp_jax.planner.costs import Placement
from dp_jax.planner.search.chains import _place_chain, _solve_chain, heuristic_blocks
from dp_jax.planner.search.tables import (
  ELEMENTWISE_KINDS,
  SHARDING_RULES,
  _Tables,
  build_tables,
)
from dp_jax.planner.sharded import Sharding

__all__ = ["ELEMENTWISE_KINDS", "SHARDING_RULES", "Found", "build_tables", "lower_bound",
           "search"]


class Found(NamedTuple):
  """What a search found: every layer's placement, the weight-sharded layers' shardings (the
  rest split samples) and the plan's cost (ms per iteration; infinite and empty: none)."""

  assignment: dict[str, Placement]
  shardings: dict[str, Sharding]
  iteration_ms: float
  heuristic_blocks: int = 0  # blocks whose lane search was a heuristic (lower_bound prices them)


def search(t: _Tables) -> Found:
  """The least-cost plan of the whole graph; writes only caches into `t` (its solved blocks,
  which lower_bound reuses; moves, lanes and packed lane searches in t.edges, shared by the
  searches of one cost model)."""
  top = t.model.graph.decompose()
  sol = _solve_chain(t, top, np.zeros((1, len(t.counts))))
  final = sol.value[len(top.items) - 1][0]
  g = int(final.argmin())
  out: dict[str, Placement] = {}
  shards: dict[str, Sharding] = {}
  if np.isfinite(final[g]):
    _place_chain(t, sol, 0, g, out, shards)
  return Found(out, shards, float(final[g]), heuristic_blocks(sol))


def lower_bound(t: _Tables) -> float:
  """A lower bound (ms) on the cost of every plan of the space above on these tables: the same
  DP with each heuristically searched block's concurrent cost replaced by a lower bound of it
  (lanes.concurrent_floor); equal to search's cost when no block is heuristic."""
  top = t.model.graph.decompose()
  sol = _solve_chain(t, top, np.zeros((1, len(t.counts))), floor=True)
  return float(sol.value[len(top.items) - 1][0].min())

