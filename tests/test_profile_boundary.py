"""What a stage boundary costs: cut points, interpolation and attribution on synthetic numbers."""

import random

import pytest

from dp_jax.profile import boundary


def test_cut_points_spread_evenly_and_cover_small_models():
  assert boundary.cut_points(5, 10) == [1, 2, 3, 4]  # every boundary of a small model
  assert boundary.cut_points(5, 0) == []
  pts = boundary.cut_points(37, 4)
  assert len(pts) == 4 and all(1 <= k < 37 for k in pts)
  gaps = [b - a for a, b in zip([0, *pts], [*pts, 37], strict=True)]
  assert max(gaps) - min(gaps) <= 1  # even spread


def test_interpolate_is_linear_between_points_and_nearest_outside():
  assert boundary.interpolate({2: 1.0, 6: 5.0}, [1, 2, 4, 6, 8]) == [1.0, 1.0, 3.0, 5.0, 5.0]
  assert boundary.interpolate({}, [1, 2]) == [0.0, 0.0]


def synthetic(n, cuts, seed):
  """Fused prefix totals, and per cut the fwd, bwd, suffix ms of a made-up model."""
  rng = random.Random(seed)
  empty = 0.5
  f = [empty]
  for _ in range(n):
    f.append(f[-1] + rng.uniform(1, 20))
  fused = f[1:]
  cut_ms = {}
  for k in cuts:
    net = fused[k - 1] - empty
    split = net * rng.uniform(0.9, 1.6)
    cut_ms[k] = {"fwd": empty + split * 0.4, "bwd": empty + split * 0.6,
                 "suffix": empty + fused[-1] - fused[k - 1] + rng.uniform(-5, 30)}
  return fused, empty, cut_ms


@pytest.mark.parametrize("seed", range(5))
def test_a_measured_two_stage_cut_is_priced_as_its_measured_programs(seed):
  n = 12
  cuts = boundary.cut_points(n, 3)
  fused, empty, cut_ms = synthetic(n, cuts, seed)
  split, start = boundary.attribute(fused, empty, cut_ms, whole_split=2 * empty + 1.3 * (
      fused[-1] - empty))
  assert len(split) == len(start) == n and start[0] == 0.0
  for k, c in cut_ms.items():
    # marginals of the whole model + split of layers 1..k + start of the stage at layer k+1
    priced = (fused[-1] - empty) + sum(split[:k]) + start[k]
    measured = c["fwd"] + c["bwd"] + c["suffix"] - 3 * empty  # each call's dispatch apart
    assert priced == pytest.approx(measured)


def test_cuts_not_measured_lie_between_their_neighbours():
  n = 9
  fused, empty, cut_ms = synthetic(n, [2, 6], seed=7)
  _, start = boundary.attribute(fused, empty, cut_ms)
  lo, hi = sorted((start[2], start[6]))
  assert all(lo - 1e-9 <= start[k] <= hi + 1e-9 for k in range(3, 6))
  assert start[1] == pytest.approx(start[2]) and start[8] == pytest.approx(start[6])


def test_without_cuts_the_whole_split_ratio_scales_every_layer():
  fused, empty = [3.0, 7.0, 11.0], 1.0
  split, start = boundary.attribute(fused, empty, {}, whole_split=2 * empty + 1.5 * 10.0)
  assert split == pytest.approx([1.0, 2.0, 2.0])  # 0.5 x each layer's marginal (2, 4, 4)
  assert start == [0.0, 0.0, 0.0]


def test_a_cut_measured_under_heavier_load_is_rescaled_by_its_own_uncut_round():
  fused, empty, cut_ms = synthetic(10, [3, 7], seed=3)
  split, start = boundary.attribute(fused, empty, cut_ms)
  net_whole = fused[-1] - empty
  slow = {k: {**{p: empty + 2.5 * (v - empty) for p, v in c.items()},
              "whole": empty + 2.5 * net_whole} for k, c in cut_ms.items()}  # all 2.5x slower
  split2, start2 = boundary.attribute(fused, empty, slow)
  assert split2 == pytest.approx(split) and start2 == pytest.approx(start)


def test_a_cut_and_its_uncut_reference_are_each_timed_after_a_step_of_their_own(monkeypatch):
  from dp_jax.models.registry import build_model
  from dp_jax.runtime.stages import structure_graph

  graph = structure_graph(build_model("digits_mlp"), "digits_mlp")
  log = []

  class FakeRun:
    def __init__(self, program, host, optimizer):
      self.name = "cut" if program else "whole"

    def step(self):
      log.append(self.name)
      return {"fwd": len(log), "bwd": 0.0, "suffix": len(log)}

  monkeypatch.setattr(boundary, "build_program", lambda *a, breaks: bool(breaks))
  monkeypatch.setattr(boundary, "_Run", FakeRun)
  samples = {p: [] for p in boundary.PHASES}
  boundary.cut_samples(None, graph, 1, 8, [None, None], None, (), repeats=2, warmup=1,
                       samples=samples)
  assert log == ["cut", "whole"] + ["cut", "cut", "whole", "whole"] * 2
  assert samples["fwd"] == [4, 8] and samples["whole"] == [6, 10]  # each turn's second step
