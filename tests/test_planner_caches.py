"""The planner's caches change no result: prices shared by identical layers (pricing.signature)
and the work the searches of one plan share (blocks, lanes, packed lane searches, floors)."""

import dataclasses
import math
from pathlib import Path

import numpy as np

from dp_jax.hardware.cluster import named_cluster
from dp_jax.planner import memory, pricing, sharded, synthetic
from dp_jax.planner.amplification import allowed_counts, offers
from dp_jax.planner.costs import build_cost_model
from dp_jax.planner.options import PlanOptions
from dp_jax.planner.search import build_tables, lower_bound, search

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ("samples", "weights")
BATCHES = [2 ** k for k in range(11)]


def splittable(graph):
  """The synthetic graph with convolutions and the dense head as the zoo's kinds (so that
  their weights may split)."""
  nodes = []
  for n in graph.nodes:
    if n.kind == "conv":
      n = dataclasses.replace(n, kind="conv2d", attrs={"out_channels": n.out_shape[-1]})
    elif n.kind == "dense":
      cin = graph.node(n.inputs[0]).out_shape[-1]
      n = dataclasses.replace(n, kind="linear", attrs={"in_features": cin, "bias": True,
                                                       "out_features": n.out_shape[-1]})
    nodes.append(n)
  return dataclasses.replace(graph, nodes=tuple(nodes))


def model_of(graph, profile, g):
  cluster = named_cluster("dgx_a100")
  return build_cost_model(graph, profile, cluster,
                          PlanOptions(num_devices=g, global_batch=g, sharding=WEIGHTS,
                                      amplification_limit=math.inf))


def prices(model, names):
  """Every weight-sharded (layer, count, sharding) price, the layers priced in `names`' order."""
  out = {}
  for name in names:
    for g in model.counts:
      for sh in sharded.candidates(model.graph.node(name), int(g), WEIGHTS)[1:]:
        p = (0, int(g))
        out[(name, p, sh)] = (pricing.layer_ms(model, name, p, sh),
                              pricing.band_ms(model, name, p, sh),
                              memory.layer_need(model, name, int(g), sh))
  return out


def test_identical_layers_share_prices_and_only_they():
  graph = splittable(synthetic.resnet_like(blocks=(3, 2), width=16))
  profile = synthetic.analytic_profile(graph, BATCHES)
  model = model_of(graph, profile, 16)
  groups = {}
  for name in model.names:
    groups.setdefault(pricing.signature(model, name), []).append(name)
  twins = [names for names in groups.values() if len(names) > 1]
  assert twins  # the repeated blocks' layers
  forward = prices(model, model.names)
  assert len(forward) > 100
  # a fresh model whose first-priced layer of each signature is another one: the same prices
  assert prices(model_of(graph, profile, 16), model.names[::-1]) == forward
  # a twin timed differently is priced on its own
  first, second = next(names[:2] for names in twins if graph.node(names[0]).kind == "conv2d")
  rows = {b: (2 * f, 2 * w) for b, (f, w) in profile.layers[second].items()}
  slower = dataclasses.replace(profile, layers={**profile.layers, second: rows})
  other = model_of(graph, slower, 16)
  assert pricing.signature(other, first) != pricing.signature(other, second)
  key = (0, 16), sharded.candidates(graph.node(second), 16, WEIGHTS)[1]
  assert pricing.layer_ms(other, second, *key) != pricing.layer_ms(other, first, *key)
  assert pricing.layer_ms(other, first, *key) == pricing.layer_ms(model, first, *key)


def plan_searches(model, samples_first: bool):
  """The exact rule's search and lower bound, after the samples rule's (as make_plan runs
  them) or on fresh tables with the bound first."""
  fits = memory.fits_alone(model)
  allowed = allowed_counts(model, math.inf, fits)
  offer = offers(model, math.inf, fits, memory.weight_fits(model))
  if samples_first:
    t = build_tables(model, allowed)
    search(t)
    lower_bound(t)
  exact = build_tables(model, offer.samples, rule="exact", offers=offer.weights)
  if samples_first:
    return search(exact), lower_bound(exact), exact
  bound = lower_bound(exact)
  return search(exact), bound, exact


def test_a_plans_searches_share_work_without_changing_results():
  graph = splittable(synthetic.inception_like(modules=6))
  profile = synthetic.analytic_profile(graph, BATCHES)
  shared, shared_bound, tables = plan_searches(model_of(graph, profile, 1024), True)
  alone, alone_bound, _ = plan_searches(model_of(graph, profile, 1024), False)
  assert shared.heuristic_blocks > 0  # packed lanes: the floor and the shared lane search ran
  assert any(k[0] == "packed" for k in tables.edges if isinstance(k, tuple))
  assert any(start > 0 for start, _ in shared.assignment.values())  # lanes beside device 0
  assert shared.assignment == alone.assignment
  assert shared.shardings == alone.shardings
  assert shared.iteration_ms == alone.iteration_ms
  assert shared_bound == alone_bound and np.isfinite(shared_bound)
  assert shared_bound < shared.iteration_ms
