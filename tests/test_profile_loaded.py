"""Layer times under load: g copies at once, one per device; cached per (layer, batch, g)."""

import jax
import pytest

from dp_jax.base.errors import UserError
from dp_jax.measurement import loaded
from dp_jax.models.zoo import build_model
from dp_jax.runtime.local_devices import DeviceThreads
from dp_jax.runtime.stages import structure_graph


def tiny():
  m = build_model("gpt2_small", n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=64)
  return m, structure_graph(m, "gpt2_small")


@pytest.mark.slow  # 15 s; the older `loaded` profile (the in-context one is the default's)
def test_loaded_profile_covers_each_count_and_reads_its_cache(tmp_path, monkeypatch):
  m, g = tiny()
  devices = jax.devices()[:2]
  p = loaded.loaded_profile(m, g, 8, [1, 2], cache_dir=tmp_path, repeats=1, warmup=1,
                            devices=devices)
  assert all(set(p.batches(n)) == {8, 4} for n in g.names)
  assert all(t >= 0 for n in g.names for b in (8, 4) for t in p.layers[n][b])
  assert sum(sum(p.layers[n][8]) for n in g.names) > 0
  assert p.meta["counts"] == [1, 2] and p.meta["cores"] >= 1
  assert set(p.meta["empty_round_ms"]) == {1, 2} and min(p.meta["empty_round_ms"].values()) > 0

  def no_timing(*a, **k):
    raise AssertionError("timed again despite the cache")

  monkeypatch.setattr(loaded, "layer_programs", no_timing)
  again = loaded.loaded_profile(m, g, 8, [1, 2], cache_dir=tmp_path, repeats=1, warmup=1,
                                devices=devices)
  assert {n: set(r) for n, r in again.layers.items()} == {n: set(r) for n, r in p.layers.items()}


def test_round_ms_runs_every_call_each_round():
  calls = []
  with DeviceThreads(2) as threads:
    ms = loaded.round_ms(threads, [lambda: calls.append(0), lambda: calls.append(1)], repeats=3,
                         warmup=1, budget_s=10, statistic="min")
  assert sorted(calls) == [0] * 4 + [1] * 4 and ms >= 0


def test_the_first_timed_round_follows_a_round_of_its_own_even_without_warmup():
  calls = []
  with DeviceThreads(1) as threads:
    times = loaded.round_samples(threads, [lambda: calls.append(0)], repeats=2, warmup=0,
                                 budget_s=10)
  assert len(times) == 2 and len(calls) == 3  # one untimed round, then the two timed


def test_bad_counts_and_statistic_are_user_errors(tmp_path):
  m, g = tiny()
  with pytest.raises(UserError, match="divide the batch"):
    loaded.loaded_profile(m, g, 8, [3], cache_dir=tmp_path, devices=jax.devices()[:4])
  with pytest.raises(UserError, match="statistic"):
    loaded.loaded_profile(m, g, 8, [1], cache_dir=tmp_path, statistic="mean")
