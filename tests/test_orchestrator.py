"""Background jobs beside a burst plan on 8 CPU devices: the foreground trains bit-identically."""

import logging

import jax
import numpy as np
import pytest
from omegaconf import OmegaConf
from runtime_helpers import batches, make_model, sgd

from dp_jax.config import BackgroundConfig, ModelConfig
from dp_jax.errors import UserError
from dp_jax.models.registry import build_model
from dp_jax.orchestrator import (
  BackgroundJob,
  build_job,
  idle_by_stage,
  make_background_hook,
  start_background,
)
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.plan_check import check_plan
from dp_jax.runtime.plans import layout_plan
from dp_jax.runtime.stages import structure_graph
from dp_jax.runtime.step import build_program, init_state, train_step

STEPS, BATCH = 3, 16
TINY = dict(n_layer=1, d_model=16, n_head=2, seq_len=8, vocab_size=32)
BG_DEVICES = (3, 7)  # compile the background step on two devices only (CPU compile time)


def vgg16_devices(name: str):
  """4 -> 2 -> 2 (other devices) -> 2 -> 1 along the chain."""
  if name.startswith("features."):
    i = int(name.split(".")[1])
    return range(4) if i < 10 else [4, 5] if i < 20 else [6, 7]
  if name == "flatten":
    return [6, 7]
  return [2] if name == "classifier.4" else [0, 1]


@pytest.fixture(scope="module")
def fg():
  """The foreground program (compiled once), its batches and its run alone."""
  model = make_model("vgg16")
  graph = structure_graph(model, "vgg16")
  plan = layout_plan(graph, vgg16_devices, global_batch=BATCH, num_devices=8)
  defs, _, _ = split_layers(model)
  program = build_program(graph, defs, check_plan(plan, graph, available_devices=8), sgd(),
                          jax.devices())
  x_sh, y_sh = program.input_stage.batch, program.last_stage.batch
  data = [(jax.device_put(x, x_sh), jax.device_put(y, y_sh))
          for x, y in batches(model, BATCH, STEPS)]
  losses, params = run(program, data)
  return program, data, losses, params


def run(program, data, on_stage=None):
  """STEPS steps from the same initial values; (losses, final params as numpy)."""
  _, params, stats = split_layers(make_model("vgg16"))
  state = init_state(program, params, stats, sgd())
  losses = []
  for x, y in data:
    state, loss = train_step(program, state, x, y, on_stage=on_stage)
    losses.append(float(loss))
  return losses, jax.tree.map(np.asarray, state["params"])


@pytest.fixture(scope="module")
def tiny_job():
  model = build_model("gpt2_small", seed=1, **TINY)
  return build_job("tiny", model, sgd(), 4, {d: jax.devices()[d] for d in BG_DEVICES})


def assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(u, v)


def test_background_steps_only_on_idle_devices_and_foreground_is_identical(fg, tiny_job):
  program, data, losses, params = fg
  seen, current = [], []
  hook = make_background_hook(tiny_job, max_in_flight=1)
  dispatch = tiny_job.dispatch

  def spy_dispatch(d):
    seen.append((current[-1], d))
    return dispatch(d)

  def spy(sp, phase):
    current.append(set(sp.stage.devices))
    hook(sp, phase)

  tiny_job.dispatch = spy_dispatch
  bg_losses, bg_params = run(program, data, on_stage=spy)
  stats = hook.drain()
  assert bg_losses == losses
  assert_same(bg_params, params)
  assert stats.failures == 0 and stats.steps > 0 and stats.steps == stats.dispatched
  del tiny_job.dispatch
  assert seen and all(d not in used for used, d in seen)
  assert max(len(q) for q in hook.in_flight.values()) == 0
  idle = idle_by_stage([s.stage for s in program.stages], BG_DEVICES)
  assert idle == {0: (7,), 1: (3, 7), 2: (3,), 3: (3, 7), 4: (3, 7)}


def test_failing_background_job_is_stopped_and_foreground_finishes(fg, tiny_job, caplog):
  program, data, losses, params = fg
  calls = []

  def flaky(*args):
    calls.append(1)
    if len(calls) == 2:
      raise RuntimeError("boom in background")
    return tiny_job.step_fn(*args)

  job = BackgroundJob("flaky", tiny_job.batch, flaky, tiny_job.copies)
  hook = make_background_hook(job, max_in_flight=2)
  with caplog.at_level(logging.WARNING, logger="dp_jax.orchestrator"):
    bg_losses, bg_params = run(program, data, on_stage=hook)
  stats = hook.drain()
  assert bg_losses == losses
  assert_same(bg_params, params)
  assert stats.failures == 1 and not hook.alive and len(calls) == 2
  assert "RuntimeError: boom in background" in stats.errors[0]
  assert any("failed and is stopped" in r.getMessage() for r in caplog.records)


def bg_cfg(**kw):
  return OmegaConf.structured(BackgroundConfig(**{"name": "tiny", **kw}))


def tiny_cfg():
  return OmegaConf.structured(ModelConfig(name="gpt2_small", **TINY))


PLAN = {"num_devices": 8, "predicted": {"memory_peak_gb": 0.5}, "layers": []}


def test_build_failure_gives_a_stopped_hook(monkeypatch):
  from dp_jax import zoo

  def broken(*a, **k):
    raise RuntimeError("cannot build")

  monkeypatch.setattr(zoo, "build", broken)
  cfg = bg_cfg(model=ModelConfig(name="gpt2_small", **TINY))
  hook = start_background(cfg, tiny_cfg(), PLAN, jax.devices()[:2], memory_gb_per_device=2)
  assert not hook.alive and hook.stats.failures == 1
  hook(type("SP", (), {"stage": type("S", (), {"index": 0, "devices": (0,)})})(), "fwd")
  assert hook.drain().steps == 0


def test_background_that_cannot_fit_is_one_line_user_error():
  cfg = bg_cfg(model=ModelConfig(name="gpt2_small", **TINY), batch_per_device=10**7)
  with pytest.raises(UserError) as e:
    start_background(cfg, tiny_cfg(), PLAN, jax.devices(), memory_gb_per_device=2)
  msg = str(e.value)
  assert "\n" not in msg and "batch 10000000" in msg and "1.50 GB free" in msg


def test_negative_slowdown_cap_is_one_line_user_error():
  with pytest.raises(UserError, match=r"slowdown_cap must be a number >= 0") as e:
    start_background(bg_cfg(slowdown_cap=-0.1), tiny_cfg(), PLAN, jax.devices(),
                     memory_gb_per_device=2)
  assert "\n" not in str(e.value)


def test_background_none_is_no_hook():
  assert start_background(bg_cfg(name="none"), tiny_cfg(), PLAN, jax.devices(),
                          memory_gb_per_device=2) is None


def test_measure_compares_means_after_warmup():
  from dp_jax.orchestrator import BackgroundScheduler, alone_steps, measure

  hook = BackgroundScheduler(None, start_after=4)
  out = measure([100.0, 50.0, 10.0, 12.0, 30.0, 14.0], hook)
  assert out["measured_step_ms"] == 11.0 and out["measured_step_ms_with_background"] == 22.0
  assert out["foreground_slowdown"] == 1.0 and out["background_steps"] == 0
  assert measure([100.0, 50.0, 10.0, 12.0], None) == {"measured_step_ms": 11.0}
  assert [alone_steps(n) for n in (3, 6, 10)] == [3, 4, 6]
