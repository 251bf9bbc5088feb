"""Layer times in context: prefixes of the model as the runtime's stage programs, differenced."""

import statistics
import time

import jax
import optax
import pytest

from dp_jax.base.errors import UserError
from dp_jax.measurement import in_context
from dp_jax.measurement.plan_timing import stepper
from dp_jax.models.zoo import build_model
from dp_jax.planner.contract import check_plan, layout_plan
from dp_jax.runtime.stages import INPUT, structure_graph


def tiny(**kw):
  size = dict(n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=64) | kw
  m = build_model("gpt2_small", **size)
  return m, structure_graph(m, "gpt2_small")


def test_marginals_difference_prefixes_through_their_running_maximum():
  assert in_context.marginals([5.0, 4.0, 9.0], 1.0) == [4.0, 0.0, 4.0]
  assert in_context.marginals([0.5, 2.0], 1.0) == [0.0, 1.0]  # below the empty round: 0


def test_prefix_stage_holds_the_first_layers_and_exports_the_last():
  _, g = tiny()
  names = g.names
  two = in_context.prefix_stage(g, 2)
  assert two.layers == names[:2] and two.inputs == (INPUT,) and names[1] in two.exports
  whole = in_context.prefix_stage(g, len(names))
  assert whole.layers == names and whole.exports == (g.sink,)


def mlp():
  m = build_model("digits_mlp")
  return m, structure_graph(m, "digits_mlp")


def test_profile_covers_each_count_records_the_split_and_reads_its_cache(tmp_path, monkeypatch):
  m, g = mlp()
  devices = jax.devices()[:2]
  p = in_context.in_context_profile(m, g, 8, [2], cache_dir=tmp_path, repeats=1, passes=1,
                                    devices=devices, cuts=1)
  assert all(set(p.batches(n)) == {4} for n in g.names)  # per-device batch on 2 devices
  assert all(t >= 0 for n in g.names for t in p.layers[n][4])
  assert p.meta["includes_update"] and p.meta["includes_allreduce"]
  assert p.meta["method"] == in_context.METHOD and len(p.meta["cuts"]) == 1
  for b in (4,):  # the layers sum to the whole model's leveled fused program, less the empty call
    prefix = p.meta["prefix_ms"][str(8 // b)]
    e = p.meta["empty_round_ms"][8 // b]
    assert len(prefix["fused"]) == len(g.names) and prefix["fwd"] > 0 and prefix["bwd"] > 0
    level = statistics.median([prefix["fused"][-1], *(c["whole"] for c in prefix["cuts"].values())])
    whole = max(in_context.boundary.leveled(prefix, e)["fused"]) - e
    assert whole == pytest.approx(level - e) or max(prefix["fused"]) > prefix["fused"][-1]
    assert sum(sum(p.layers[n][b]) for n in g.names) == pytest.approx(whole)
    (k, cut), = prefix["cuts"].items()  # the measured cut is priced as its paired difference
    assert set(cut) == set(in_context.boundary.PHASES) and all(v > 0 for v in cut.values())
    cut = in_context.boundary.scaled(cut, e, whole)  # to the profile's load (its uncut round)
    assert p.meta["boundary_ms"][str(b)][k] == pytest.approx(
        cut["fwd"] + cut["bwd"] + cut["suffix"] - 3 * e - whole)

  def no_timing(*a, **k):
    raise AssertionError("timed again despite the cache")

  monkeypatch.setattr(in_context, "_Prefix", no_timing)
  monkeypatch.setattr(in_context.boundary, "cut_samples", no_timing)
  again = in_context.in_context_profile(m, g, 8, [2], cache_dir=tmp_path, repeats=1,
                                        passes=1, devices=devices, cuts=1)
  assert again.layers == p.layers


def test_bad_counts_statistic_and_repeats_are_user_errors(tmp_path):
  m, g = tiny()
  for kw in (dict(counts=[3]), dict(counts=[1], statistic="mean"), dict(counts=[1], repeats=0),
             dict(counts=[1], cuts=-1)):
    counts = kw.pop("counts")
    with pytest.raises(UserError):
      in_context.in_context_profile(m, g, 8, counts, cache_dir=tmp_path, **kw)


class FakePrefix:
  """Records the calls prefix_rounds makes in a shared log; bwd only right after its fwd."""

  def __init__(self, log, name):
    self.log, self.name = log, name

  def load(self, *host):
    self.log.append("load")

  def drop(self):
    self.log.append("drop")

  def fwd(self):
    self.log.append(f"fwd{self.name}")
    return 0

  def bwd(self):
    assert self.log[-1] == f"fwd{self.name}"
    self.log.append(f"bwd{self.name}")
    return 0

  def fused_step(self):
    self.log.append(f"fused{self.name}")
    return 0


def test_prefix_programs_take_turns_each_timed_right_after_itself():
  log = []
  prefixes = [FakePrefix(log, 0), FakePrefix(log, 1)]
  samples = [{p: [] for p in in_context.PHASES} for _ in prefixes]
  in_context.prefix_rounds(prefixes, (), repeats=2, warmup=1, samples=samples)
  first, pair, whole = ["fused0"], ["fwd1", "bwd1"], ["fused1"]
  # warm-up: each call once; then rounds in which every call runs twice in a row (second timed)
  assert log == ["load", "load", *first, *pair, *whole,
                 *(first * 2 + pair * 2 + whole * 2) * 2, "drop", "drop"]
  assert [len(s["fused"]) for s in samples] == [2, 2]
  assert [len(samples[1][p]) for p in ("fwd", "bwd")] == [2, 2] and not samples[0]["fwd"]


@pytest.mark.slow
@pytest.mark.timing
def test_profiled_layers_sum_to_the_measured_one_stage_step(tmp_path):
  """Independent check: the runtime's one-stage train_step, timed apart from the profile, is
  within 25% of the sum of the profiled layers plus one dispatch (the empty round)."""
  m, g = tiny(n_layer=2, d_model=64, seq_len=32, vocab_size=512)
  device = jax.devices()[:1]
  p = in_context.in_context_profile(m, g, 16, [1], cache_dir=tmp_path, repeats=5, passes=2,
                                    devices=device, statistic="min")
  predicted = sum(sum(p.layers[n][16]) for n in g.names) + p.meta["empty_round_ms"][1]
  plan = check_plan(layout_plan(g, {n: range(0, 1) for n in g.names}, global_batch=16,
                                num_devices=1), g, available_devices=1)
  one, stages = stepper(m, g, plan, device, optax.sgd(0.01, momentum=0.9))
  assert stages == 1
  one()
  times = []
  for _ in range(10):
    t0 = time.perf_counter()
    one()
    times.append((time.perf_counter() - t0) * 1e3)
  measured = min(times)
  assert predicted == pytest.approx(measured, rel=0.25), (predicted, statistics.median(times))


def test_forward_share_stays_within_zero_and_one_when_a_half_times_below_the_empty_call():
  # a tiny model under load: its forward program timed below the trivial program's call
  assert in_context.forward_share(0.9, 3.0, 1.0) == 0.0
  assert in_context.forward_share(3.0, 0.5, 1.0) == 1.0
  assert in_context.forward_share(2.0, 4.0, 1.0) == 0.25
  assert in_context.forward_share(0.5, 0.5, 1.0) == 0.5
