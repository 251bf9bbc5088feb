"""The alone timeline reproduces the planner's prediction from the planner's own cost terms."""

import math

import numpy as np
import pytest
from sim_helpers import INF, cluster, graph, plan, profile

from dp_jax.hardware.cluster import collective_latency_ms
from dp_jax.planner import pricing
from dp_jax.planner.baseline import cost_model_for
from dp_jax.planner.costs import allreduce_volume_ms, move_ms, stage_sync_ms
from dp_jax.planner.evaluate import data_parallel_assignment, evaluate
from dp_jax.planner.segments import Move, Stage, segments
from dp_jax.simulator.timeline import build_timeline, merge_spans, union_spans
from dp_jax.simulator.windows import busy_ms, device_classes

PLANS = [("resnet", 8, 32, 2.0, True), ("resnet", 8, 32, INF, False), ("resnet", 32, 32, 2.0, True),
         ("resnet", 64, 64, 1.5, True), ("inception", 8, 32, 2.0, True),
         ("inception", 16, 32, 1.5, False), ("inception", 64, 64, 2.0, True),
         ("inception", 1024, 1024, 2.0, True)]


def _timeline(kind, g, b, limit, overlap):
  p = plan(kind, g, b, limit, overlap)
  model = cost_model_for(graph(kind), profile(kind, b), cluster(), p)
  return p, model, build_timeline(model, p.assignment())


@pytest.mark.parametrize("kind, g, b, limit, overlap", PLANS)
def test_alone_timeline_matches_the_planner_within_a_tenth_of_a_percent(kind, g, b, limit,
                                                                         overlap):
  p, _, tl = _timeline(kind, g, b, limit, overlap)
  assert tl.iteration_ms == pytest.approx(p.predicted["iteration_ms"], rel=1e-3)
  classes = device_classes(tl)
  gpu = float((busy_ms(tl, classes) * classes.sizes).sum())
  assert gpu == pytest.approx(p.predicted["gpu_ms"], rel=1e-3)
  assert p.predicted["idle_fraction"] >= 0


def _move_ms(model, a, mv):
  (s0, g0), (s1, g1) = a[mv.src], a[mv.dst]
  return float(move_ms(model.cluster, model.batch, model.out_bytes[model.row[mv.src]],
                       s0, g0, s1, g1))


def _two_pass(model, a, segs):
  """Reference: forward and backward critical paths summed (a block: max over branch groups)."""
  f = w = 0.0
  for s in segs:
    if isinstance(s, Stage):
      st, c = s.placement
      bwd = [pricing.layer_ms(model, n, (0, c))[1] for n in s.layers]
      f += sum(pricing.layer_ms(model, n, (0, c))[0] for n in s.layers) - sum(bwd)
      band = [float(allreduce_volume_ms(model.cluster, model.grad_bytes[model.row[n]], st, c))
              for n in s.layers]
      w += sum(bwd) + stage_sync_ms(band, bwd, float(collective_latency_ms(model.cluster, st, c)),
                                    model.options.overlap_allreduce)
      w += pricing.stage_overhead_ms(model, s.layers[0], s.layers[-1], c)
    elif isinstance(s, Move):
      half = _move_ms(model, a, s) / 2
      f, w = f + half, w + half
    else:
      fs, ws = [], []
      for group in s.groups:
        parts = [_two_pass(model, a, br.body) for br in group]
        fs.append(sum(x for x, _ in parts))
        ws.append(sum(y for _, y in parts))
      x, y = _two_pass(model, a, s.identity)
      sends = sum(_move_ms(model, a, br.move_in) + _move_ms(model, a, br.move_out)
                  for group in s.groups for br in group) / 2
      f, w = f + sends + max(fs) + x, w + sends + max(ws) + y
  return f, w


@pytest.mark.parametrize("kind, g, b, limit, overlap", PLANS + [("resnet", 16, 32, 1.5, False)])
def test_alone_iteration_is_forward_plus_backward_critical_path(kind, g, b, limit, overlap):
  p, model, tl = _timeline(kind, g, b, limit, overlap)
  f, w = _two_pass(model, p.assignment(), segments(model.graph, p.assignment()))
  assert tl.iteration_ms == pytest.approx(f + w, rel=1e-9)


@pytest.mark.parametrize("kind, g, b, limit, overlap", PLANS[:5])
def test_stages_and_moves_use_the_planner_costs(kind, g, b, limit, overlap):
  p, model, tl = _timeline(kind, g, b, limit, overlap)
  ev = evaluate(model, p.assignment())
  assert [s.layers for s in tl.stages] == [s.layers for s in ev.stages]
  for st in ev.stages:
    i = [s.layers for s in ev.stages].index(st.layers)
    compute = sum(t.duration_ms for t in tl.tasks if t.stage == i and t.kind in ("fwd", "bwd"))
    assert st.overhead_ms > 0  # the stage's launch (and boundaries): in its backward
    assert compute == pytest.approx(st.compute_ms + st.overhead_ms, rel=1e-9, abs=1e-12)
  moves = sum(t.duration_ms for t in tl.tasks if t.kind == "move")
  assert moves == pytest.approx(sum(m.ms for m in ev.moves), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("kind, g, b, limit, overlap", PLANS)
def test_schedule_is_consistent(kind, g, b, limit, overlap):
  _, _, tl = _timeline(kind, g, b, limit, overlap)
  for i, t in enumerate(tl.tasks):
    assert all(d < i for d in t.deps), "tasks are in a topological order"
    assert t.duration_ms > 0
    assert tl.start_ms[i] >= max((tl.end_ms[d] for d in t.deps), default=0.0) - 1e-12
  for d in sorted({0, g // 2, g - 1}):
    busy = [e for e in tl.on_device(d) if e.stream == "compute"]
    for a, c in zip(busy, busy[1:], strict=False):
      assert c.start_ms >= a.end_ms - 1e-9, f"device {d}: {a.label} overlaps {c.label}"


def test_data_parallel_plan_is_exact_and_leaves_no_idle_time():
  kind, g, b = "inception", 8, 32
  p = plan(kind, g, b)
  model = cost_model_for(graph(kind), profile(kind, b), cluster(), p)
  tl = build_timeline(model, data_parallel_assignment(model, g))
  assert tl.iteration_ms == pytest.approx(p.predicted["data_parallel_iteration_ms"], rel=1e-12)
  assert {t.spans for t in tl.tasks} == {((0, g),)}


def test_union_spans():
  assert union_spans((0, 4), (2, 4)) == [(0, 6)]
  assert union_spans((4, 4), (0, 4)) == [(0, 8)]
  assert union_spans((0, 2), (6, 2)) == [(0, 2), (6, 2)]
  assert math.isclose(sum(c for _, c in union_spans((0, 8), (0, 1))), 8)


def test_merge_spans():
  assert merge_spans([(4, 2), (0, 2), (1, 2)]) == [(0, 3), (4, 2)]
  assert merge_spans([(0, 4), (4, 4)]) == [(0, 8)]
  assert merge_spans([]) == []


def test_events_cover_each_span_once():
  _, _, tl = _timeline("inception", 8, 32, 2.0, True)
  assert len(tl.events()) == sum(len(t.spans) for t in tl.tasks)
  assert np.isclose(max(e.end_ms for e in tl.events()), tl.iteration_ms)
