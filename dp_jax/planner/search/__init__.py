"""Burst-parallel search: dynamic programming over the series-parallel decomposition.

The objective is exactly evaluate() (dp_jax/planner/evaluate.py) over this plan space (SPACE,
recorded in the plan's `optimality`):
- every chain (the graph's, and a serialized branch's) lives on prefixes [0, count) of the
  job's devices, one count per layer (with weight sharding, any sharding offered there);
- a single-input elementwise layer (ELEMENTWISE_KINDS) that follows a layer of its chain stays
  on that layer's devices; a branch may open with one anywhere (the fork's output moves into
  it as into any branch's first layer);
- a fork/join block is merged into a stage (fork, branches and join on one count), serialized
  (each branch a chain of this space with its fork's context, branches one after another), or
  concurrent: the non-identity branches are split into groups, each group on its own
  contiguous lane [s, s + count), lanes disjoint and anywhere in [0, G) in any order (one group
  on one lane is allowed too); a group's branches run one after another on its range,
  splitting samples. A group of one plain branch (no block nested in it) with at most
  OPTION_LAYOUTS layouts (placements^layers) may also lay its layers on any ranges inside its
  lane [lo, hi) (the hull of their ranges), and with weight sharding, at most SHARDED_LAYOUTS
  (range, sharding) combinations, each layer may take any sharding offered on its count
  (layouts.py, "lane options"). Longer branches, and branches holding a block, take one range.

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
on prefixes and per-layer shardings jointly. Lane options with shardings are priced by the
cost model's stages as evaluate() prices them; uniform lanes split samples.
make.plan_for_limit also runs the samples-only search and keeps the faster plan that fits.

Block DP. A block's cost is a matrix over (fork count, join count): serialized sums the
branch chains (each solved once with its fork context); concurrent runs the lane search
(lanes._lane_dp), whose state is (branches placed, end of the last lane). Its tier depends on
the block alone (n non-identity branches, C counts, G devices; cells = C^3 (G + 1)):
- one branch: its lane on every range and its lane options (lanes._single_lane_dp): exact
  where (G + 1) C^2 <= SINGLE_CELLS (G = B = 1024 and 960 are; 16,384 is not: there its lane
  is packed on device 0, a heuristic);
- exact: (3^n - 2^n) x cells <= GROUP_CELLS and, with the lane options,
  ((3^n - 2^n) x cells + option steps) x (candidate maxima)^2 <= EXACT_CELLS: for every pair
  of candidate forward / backward maxima the least moves with every lane within them; exact
  over the concurrent space above;
- heuristic (the block counts in Found.heuristic_blocks): past EXACT_CELLS with the options
  the exact tier without them (uniform lanes exact, options unsearched), else the groups tier
  (least partial cost per state, options included; exact for one lane only); past
  GROUP_CELLS, packed: one lane per branch packed from device 0 in branch order (every block
  of 2+ branches at G >= 64 in practice). Cost O(branches G C^3).
For the heuristic blocks lower_bound() reruns the DP with their concurrent cost floored
(lanes.concurrent_floor, over uniform lanes and the lane options): a lower bound on the best
plan of the space, which make_plan records with the plan's gap to it. The rerun reuses the
search's block solutions (only the floors and the chains around the blocks are recomputed).
tests/test_search_exhaustive.py checks by brute force over every assignment of this space on
random graphs at G = 4 that no plan of it beats the search, that the search's value is its
plan's evaluate() cost, and that the bound bounds.

Outside the space (evaluate() accepts them, the search never returns them): chains, forks and
joins off the prefix [0, count); count changes or weight shardings inside a lane that holds
several branches, a longer branch or one holding a block; a group of several branches on
different ranges; lanes that interleave (one branch's layers on both sides of another's).
No bound on what these cost is proven; tests/test_planner_forkjoin.py (samples) and
tests/test_planner_sharding_brute.py (weights) measure it by brute force over every
assignment evaluate() accepts on random fork/join graphs at G = 4 and assert their margins.
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
from dp_jax.planner.sharded import Strategy

__all__ = ["ELEMENTWISE_KINDS", "SHARDING_RULES", "SPACE", "Found", "build_tables",
           "lower_bound", "search"]

# The space the search is exact over (module docstring), as the plan's `optimality` states it.
SPACE = ("chains on device prefixes [0, count); fork/join blocks merged, serialized, or "
         "concurrent: groups of branches on disjoint lanes anywhere, a group's branches one "
         "after another on one range, a short plain branch alone in its lane on any ranges "
         "(and weight shardings) inside it; an elementwise layer after a layer on its devices, "
         "one that opens a branch anywhere")


class Found(NamedTuple):
  """What a search found: every layer's placement, the weight-sharded layers' shardings (the
  rest split samples) and the plan's cost (ms per iteration; infinite and empty: none)."""

  assignment: dict[str, Placement]
  shardings: dict[str, Strategy]
  iteration_ms: float
  heuristic_blocks: int = 0  # blocks searched short of their whole space (lower_bound floors them)


def search(t: _Tables) -> Found:
  """The least-cost plan of the whole graph; writes only caches into `t` (its solved blocks,
  which lower_bound reuses; moves, lanes and packed lane searches in t.edges, shared by the
  searches of one cost model)."""
  top = t.model.graph.decompose()
  sol = _solve_chain(t, top, np.zeros((1, len(t.counts))))
  final = sol.value[len(top.items) - 1][0]
  g = int(final.argmin())
  out: dict[str, Placement] = {}
  shards: dict[str, Strategy] = {}
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

