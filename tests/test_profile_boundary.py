"""What a stage boundary costs: cut points, paired differences, leveling."""

import pytest

from dp_jax.measurement import boundary


def test_cut_points_spread_evenly_and_cover_small_models():
  assert boundary.cut_points(5, 10) == [1, 2, 3, 4]  # every boundary of a small model
  assert boundary.cut_points(5, 0) == []
  pts = boundary.cut_points(37, 4)
  assert len(pts) == 4 and all(1 <= k < 37 for k in pts)
  gaps = [b - a for a, b in zip([0, *pts], [*pts, 37], strict=True)]
  assert max(gaps) - min(gaps) <= 1  # even spread


def test_a_boundary_costs_its_rounds_paired_difference_rescaled_to_the_level():
  empty, whole = 0.5, 20.0  # whole: the profile's level of the uncut model, net of empty
  cut = {"fwd": 6.5, "bwd": 9.5, "suffix": 10.5, "whole": 20.5}  # its round at the level
  assert boundary.boundary_costs({3: cut}, empty, whole) == {3: pytest.approx(5.0)}
  slow = {p: empty + 2 * (v - empty) for p, v in cut.items()}  # a round 2x slower
  assert boundary.boundary_costs({3: slow}, empty, whole)[3] == pytest.approx(5.0)
  fused = {p: v for p, v in cut.items() if p != "whole"}  # no uncut round: as measured
  assert boundary.boundary_costs({3: fused}, empty, whole)[3] == pytest.approx(5.0)


def test_leveling_puts_the_whole_model_at_the_median_of_its_measurements():
  e = 1.0
  totals = {"empty": e, "fused": [3.0, 7.0, 11.0], "fwd": 5.0, "bwd": 9.0,
            "cuts": {"1": {"whole": 13.0}, "2": {"whole": 15.0}}}
  out = boundary.leveled(totals, e)
  assert out["fused"] == pytest.approx([1 + 2 * 1.2, 1 + 6 * 1.2, 1 + 10 * 1.2])  # 11 -> 13
  assert out["fwd"] == pytest.approx(1 + 4 * 1.2) and out["bwd"] == pytest.approx(1 + 8 * 1.2)
  assert out["cuts"] == totals["cuts"] and totals["fused"] == [3.0, 7.0, 11.0]  # not mutated
  assert boundary.leveled({**totals, "cuts": {}}, e)["fused"] == totals["fused"]  # one sample
  bumpy = {**totals, "fused": [3.0, 12.0, 11.0]}  # a noisy prefix above the whole model
  assert max(boundary.leveled(bumpy, e)["fused"]) == pytest.approx(13.0)  # median of 11, 13, 15


def test_a_cut_and_its_uncut_reference_are_each_timed_after_a_step_of_their_own(monkeypatch):
  from dp_jax.models.zoo import build_model
  from dp_jax.runtime.stages import structure_graph

  graph = structure_graph(build_model("digits_mlp"), "digits_mlp")
  log = []

  class FakeRun:
    def __init__(self, program, host, optimizer):
      self.name = "cut" if program else "whole"

    def step(self):
      log.append(self.name)
      return {"fwd": len(log), "bwd": 0.0, "suffix": len(log)}

  monkeypatch.setattr(boundary, "check_plan", lambda plan, *a, **k: plan)
  monkeypatch.setattr(boundary, "build_program", lambda *a, breaks: bool(breaks))
  monkeypatch.setattr(boundary, "_Run", FakeRun)
  cuts, whole = boundary.cut_programs(None, graph, [1], 8, [None, None], None)
  samples = {p: [] for p in boundary.PHASES}
  boundary.cut_samples(cuts[1], whole, (), None, repeats=2, warmup=1, samples=samples)
  assert log == ["cut", "whole"] + ["cut", "cut", "whole", "whole"] * 2
  assert samples["fwd"] == [4, 8] and samples["whole"] == [6, 10]  # each turn's second step
