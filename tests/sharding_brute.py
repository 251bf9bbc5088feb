"""Brute force over every (count, sharding) per layer on small random chains of linear and
transformer layers.

A case is a chain of 2-5 layers reading a (seq, width) input: linear layers (random input and
output features, some not divisible by 4) and transformer blocks (4 heads), or a fork/join
block of linear layers joined by an add (`forkjoin`), priced by the
analytic A100 roofline (so the sharded compute follows the roofline ratio) on a random cluster
(1, 2 or 4 devices per node, random bandwidths and latencies), G = 4, B = 4 or 8, overlapped
all-reduce on or off. Every layer may sit on any prefix [0, c) with c dividing B and take any
sharding dp_jax.planner.sharding allows there (samples, or an out / in / heads split over m | c);
`brute_force` scores every combination with evaluate(). On prefixes a block's branches share
device 0, so the brute force covers merged and serialized blocks; the planner may also run
them concurrently on disjoint lanes (samples only), which the brute force does not see.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from forkjoin_brute import branch_mask, with_stage_terms

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.layer_times.analytic import analytic_profile
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.evaluate import evaluate
from dp_jax.planner.make import plan_for_limit
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.sharded import candidates
from dp_jax.planner.structure import flat_layers, sharing_groups
from dp_jax.planner.synthetic import cluster as synthetic_cluster

WIDTHS = (6, 10, 64, 256, 1024, 2048, 4096, 8192)
WEIGHTS = ("samples", "weights")


def random_chain(rng: np.random.Generator, layers: int) -> LayerGraph:
  """A chain of `layers` linear layers and transformer blocks on (seq, width) activations."""
  seq = int(rng.choice([1, 4, 16]))
  width = int(rng.choice(WIDTHS[2:]))
  nodes: list[LayerNode] = []
  for i in range(layers):
    inputs = (nodes[-1].name,) if nodes else ()
    if width % 4 == 0 and rng.random() < 0.35:
      d = width
      params = 12 * d * d + 13 * d
      nodes.append(LayerNode(
          f"l{i}", "transformer_block", inputs, params, 4 * params, (seq, d), 4 * seq * d,
          attrs={"d_model": d, "n_head": 4, "seq_len": seq}))
      continue
    out = int(rng.choice(WIDTHS))
    params = width * out + out
    nodes.append(LayerNode(
        f"l{i}", "linear", inputs, params, 4 * params, (seq, out), 4 * seq * out,
        attrs={"in_features": width, "out_features": out, "bias": True}))
    width = out
  return LayerGraph(model="sharding_chain", input_shape=(seq, int(nodes[0].attrs.get(
      "in_features", nodes[0].attrs.get("d_model", 1)))), input_dtype="float32",
      nodes=tuple(nodes))


def random_forkjoin(rng: np.random.Generator, depth: int = 1, branches: int = 2) -> LayerGraph:
  """A linear fork layer, `branches` branches of `depth` width-keeping linear layers (each but
  the first may be an identity), an add joining them."""
  seq, width = int(rng.choice([1, 4, 16])), int(rng.choice(WIDTHS[2:]))
  nodes: list[LayerNode] = []

  def linear(inputs, fin, fout):
    params = fin * fout + fout
    nodes.append(LayerNode(
        f"l{len(nodes)}", "linear", inputs, params, 4 * params, (seq, fout), 4 * seq * fout,
        attrs={"in_features": fin, "out_features": fout, "bias": True}))
    return nodes[-1].name

  fin = int(rng.choice(WIDTHS[2:]))
  fork = linear((), fin, width)
  ends = []
  for b in range(branches):
    cur = fork
    for _ in range(0 if b and rng.random() < 0.3 else depth):
      cur = linear((cur,), width, width)
    ends.append(cur)
  nodes.append(LayerNode(f"l{len(nodes)}", "add", tuple(ends), 0, 0, (seq, width),
                         4 * seq * width))
  return LayerGraph(model="sharding_forkjoin", input_shape=(seq, fin), input_dtype="float32",
                    nodes=tuple(nodes))


def random_model(seed: int, layers: int = 3, overlap: bool | None = None,
                 forkjoin: bool = False, branches: int = 2, stage_terms: bool = False):
  """A cost model of a random chain (or fork/join block: `layers` is then the branch depth) on
  G = 4 devices, B = 4 or 8, weight sharding allowed (`stage_terms`: random per-stage terms,
  forkjoin_brute.with_stage_terms)."""
  rng = np.random.default_rng(seed)
  graph = random_forkjoin(rng, layers, branches) if forkjoin else random_chain(rng, layers)
  batch = int(rng.choice([4, 8]))
  cluster = synthetic_cluster("t", "A100-SXM4-40GB", 64, int(rng.choice([1, 2, 4])), 4096.0,
                        float(rng.uniform(1, 300)), float(rng.uniform(0, 30)),
                        float(rng.uniform(1, 50)), float(rng.uniform(0, 100)))
  profile = analytic_profile(graph, "A100-SXM4-40GB", "bfloat16", [1, 2, 4, 8])
  if overlap is None:
    overlap = bool(rng.random() < 0.5)
  opts = PlanOptions(num_devices=4, global_batch=batch, overlap_allreduce=overlap,
                     check_memory=False, sharding=WEIGHTS, amplification_limit=math.inf)
  model = build_cost_model(graph, profile, cluster, opts)
  return with_stage_terms(model, seed) if stage_terms else model


def choices(model, name: str, anywhere: bool = False
            ) -> list[tuple[tuple[int, int], tuple[int, str] | None]]:
  """Every (placement, sharding) of one layer that evaluate() accepts: on the prefix [0, c),
  or with `anywhere` on every contiguous range [s, s + c) of the G devices."""
  node = model.graph.node(name)
  g = model.options.num_devices
  out = []
  for c in model.counts:
    for s in range(g - int(c) + 1 if anywhere else 1):
      for sh in candidates(node, int(c), WEIGHTS):
        out.append(((s, int(c)), None if sh[1] == "samples" else sh))
  return out


def brute_force(model, anywhere: bool | frozenset = False) -> tuple[float, dict, dict]:
  """The least iteration_ms over every per-layer (placement, sharding) (`choices`), its
  assignment and shardings; `anywhere`: True, or the layers that may leave the prefix."""
  names = model.names
  best, arg = math.inf, ({}, {})
  free = set(names) if anywhere is True else set(anywhere or ())
  for combo in itertools.product(*(choices(model, n, n in free) for n in names)):
    a = {n: p for n, (p, _) in zip(names, combo, strict=True)}
    s = {n: sh for n, (_, sh) in zip(names, combo, strict=True) if sh is not None}
    ms = evaluate(model, a, s).iteration_ms
    if ms < best - 1e-12:
      best, arg = ms, (a, s)
  return best, *arg


def planner(model) -> tuple[float, dict, dict]:
  """The planner's plan (every rule, as make_plan runs them) and its evaluate() cost."""
  fits = np.ones(model.compute_ms.shape, dtype=bool)
  point = plan_for_limit(model, math.inf, fits)
  return point.iteration_ms, dict(point.assignment), dict(point.shardings)


def margin(seed: int, **kw) -> float:
  """How much faster the brute force's best plan is than the planner's (relative; >= 0 on
  chains, where the brute force sees every plan the planner can return)."""
  model = random_model(seed, **kw)
  best, _, _ = brute_force(model)
  ms, _, _ = planner(model)
  if not kw.get("forkjoin"):
    assert ms >= best * (1 - 1e-9), (seed, ms, best)
  return ms / best - 1


def concurrent_shardings(model, assignment: dict, shardings: dict) -> set[str]:
  """Weight-sharded layers of branches that run beside another branch (concurrent lanes:
  the block is neither merged nor one sharing group)."""
  out = set()
  for item in model.graph.decompose().items:
    if isinstance(item, str):
      continue
    branches = [b for b in item.branches if b.items]
    masks = [branch_mask(br, assignment) for br in branches]
    if len(sharing_groups(masks)) > 1:
      out |= {n for br in branches for n in flat_layers(br) if n in shardings}
  return out


def off_prefix(assignment: dict) -> set[str]:
  """Layers that do not start on device 0."""
  return {n for n, (s, _) in assignment.items() if s}


def survey(seeds, overlap: bool, layers: int = 1, branches_only: bool = False,
           branches: int = 2, stage_terms: bool = False) -> list[tuple]:
  """(seed, margin of the brute force over every placement and sharding, the winner's
  concurrent weight-sharded layers, its off-prefix layers) per fork/join seed;
  `branches_only`: the fork and the join stay on prefixes (a quicker check of the lanes)."""
  rows = []
  for seed in seeds:
    model = random_model(seed, layers=layers, overlap=overlap, forkjoin=True,
                         branches=branches, stage_terms=stage_terms)
    ends = {model.names[0], model.names[-1]}
    anywhere = frozenset(set(model.names) - ends) if branches_only else True
    best, a, s = brute_force(model, anywhere=anywhere)
    ms, _, _ = planner(model)
    rows.append((seed, ms / best - 1, concurrent_shardings(model, a, s), off_prefix(a)))
  return rows
