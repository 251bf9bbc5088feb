"""Background jobs beside a burst plan on 8 CPU devices: the foreground trains bit-identically."""

import logging
import math
import statistics
import threading

import jax
import numpy as np
import pytest
from runtime_helpers import batches, make_model, sgd

from dp_jax.base.errors import UserError
from dp_jax.models.zoo import ModelConfig, build_model
from dp_jax.multiplex import policy as multiplex
from dp_jax.multiplex.background import BackgroundConfig
from dp_jax.orchestrator.launch import start_background
from dp_jax.orchestrator.runners import build_runners, job_of_runner, measured_pieces
from dp_jax.orchestrator.scheduler import (
  PROBES,
  idle_by_stage,
  load_checkpoint,
  make_background_hook,
  window_ms,
)
from dp_jax.planner.contract import Plan, check_plan, layout_plan
from dp_jax.runtime.functional import split_layers
from dp_jax.runtime.stages import structure_graph
from dp_jax.runtime.step import build_program, init_state, train_step

STEPS, BATCH, ALONE = 5, 16, 3
TINY = dict(n_layer=1, d_model=16, n_head=2, seq_len=8, vocab_size=32)
BG_DEVICES = (3, 7)  # compile the background pieces on two devices only (CPU compile time)


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


def tiny_runners():
  model = build_model("gpt2_small", seed=1, **TINY)
  return build_runners(model, "gpt2_small", [], sgd(), 4,
                       {d: jax.devices()[d] for d in BG_DEVICES})


@pytest.fixture(scope="module")
def tiny():
  """Per-device runners of a tiny GPT-2 (one stage per layer, tied lm_head) and its job."""
  runners = tiny_runners()
  pieces = measured_pieces(runners[BG_DEVICES[0]])
  measured_pieces(runners[BG_DEVICES[1]], steps=1)
  return runners, job_of_runner(runners[BG_DEVICES[0]], "tiny", pieces, 0.0)


def test_a_job_rebuilt_from_its_model_after_steps_on_the_same_device_runs():
  """Regression: a runner's first step donated the model's own arrays (jax.device_put onto the
  sharding an array has returns it), so rebuilding the runners from the model (as
  start_background does when it groups layers into pieces) failed with "Array has been
  deleted"."""
  model = build_model("gpt2_small", seed=1, **TINY)
  devices = {0: jax.devices()[0]}  # the model's own device
  first = build_runners(model, "gpt2_small", [], sgd(), 4, devices)[0]
  float(first.step())
  _, params, stats = split_layers(model)
  assert not any(a.is_deleted() for a in jax.tree.leaves((params, stats)))
  again = build_runners(model, "gpt2_small", [["embed", "h.0"], ["ln_f", "lm_head"]], sgd(), 4,
                        devices)[0]
  assert math.isfinite(float(again.step())) and again.steps == 1


def assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(u, v)


@pytest.mark.slow  # VGG16 on 8 devices (~40 s); the main job's test runs pieces in windows
def test_pieces_run_only_in_idle_windows_and_the_foreground_is_identical(fg, tiny, monkeypatch):
  program, data, losses, params = fg
  runners, job = tiny
  assert len(job.pieces_ms) == 2 * len(runners[3].program.stages) - 1 > 4
  hook = make_background_hook(job, runners, start_after=ALONE, slowdown_cap=math.inf)
  busy: list[frozenset] = [frozenset()]
  seen: list[tuple[int, frozenset]] = []
  admit = multiplex.Admission.admit

  def spy_admit(self, k, left_ms, **where):
    ok = admit(self, k, left_ms, **where)
    if ok:
      seen.append((int(threading.current_thread().name.rsplit("-", 1)[1]), busy[0]))
    return ok

  def spy(sp, phase):
    with hook.cond:  # the hook's lock is re-entrant: the window update and `busy` agree
      busy[0] = frozenset(sp.stage.devices)
      hook(sp, phase)

  monkeypatch.setattr(multiplex.Admission, "admit", spy_admit)
  bg_losses, bg_params = run(program, data, on_stage=spy)
  stats = hook.drain()
  assert bg_losses == losses
  assert_same(bg_params, params)
  assert stats.failures == 0 and stats.dispatched > 0 and seen
  assert all(d not in used for d, used in seen)
  assert hook.baseline_ms > 0 and hook.admission.correction.seen > 0
  idle = idle_by_stage([s.stage for s in program.stages], BG_DEVICES)
  assert idle == {0: (7,), 1: (3, 7), 2: (3,), 3: (3, 7), 4: (3, 7)}


def fake_steps(hook, steps: int, stages=((0, (0, 1, 2, 3)), (1, (0,)))):
  """Drive the hook like a foreground of two stages (fwd, fwd_bwd, bwd) without running one."""
  for _ in range(steps):
    calls = [(i, "fwd") for i, _ in stages[:-1]] + [(stages[-1][0], "fwd_bwd")]
    calls += [(i, "bwd") for i, _ in reversed(stages[:-1])]
    for i, phase in calls:
      stage = type("Stage", (), {"index": i, "devices": dict(stages)[i]})
      hook(type("SP", (), {"stage": stage})(), phase)
      threading.Event().wait(0.002)


def test_failing_background_job_is_stopped_and_reported(tiny, caplog):
  _, job = tiny
  broken = tiny_runners()
  calls = []
  for r in broken.values():
    def flaky(gate=None, timer=None):
      calls.append(1)
      raise RuntimeError("boom in background")

    r.step = flaky
  hook = make_background_hook(job, broken, start_after=ALONE, slowdown_cap=math.inf)
  with caplog.at_level(logging.WARNING, logger="dp_jax.orchestrator"):
    fake_steps(hook, ALONE + 3)
    stats = hook.drain()
  assert stats.failures >= 1 and not hook.alive and calls and stats.steps == 0
  assert "RuntimeError: boom in background" in stats.errors[0]
  assert any("failed and is stopped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("own, held", [(BG_DEVICES, True), ((0, *BG_DEVICES), False),
                                       (None, False)])
def test_a_process_holds_its_foreground_thread_only_while_a_stage_has_none_of_its_devices(
    tiny, own, held):
  """Several processes: a process skips a stage on none of its devices and would post the next
  move (occupying its idle devices) at once; the hook holds it for the call's predicted time."""
  runners, job = tiny
  hook = make_background_hook(job, runners, start_after=ALONE, slowdown_cap=math.inf,
                              own_devices=own)
  fake_steps(hook, ALONE + PROBES + 1)  # stage 1 runs on device 0 only
  hook.drain()
  assert (hook.held_s > 0) == held
  if held:  # at most the predicted time of the held call, per step with the job
    j = hook.positions[(1, "fwd_bwd")]
    assert hook.held_s <= (PROBES + 1) * hook.durations[j] / 1e3 + 1e-3
    # the first PROBES holds measure the move (hold end -> next call), the next ones end early;
    # a hold that ends while a piece runs (here: at cap inf, timing-dependent) is no probe
    probes = hook.move_ms.get(j, [])
    assert len(probes) == PROBES or len(probes) + hook.spoilt_probes == PROBES + 1
    assert hook.lead_ms(j) == (min(probes) if len(probes) == PROBES else 0.0)
    assert all(ms > 0 for ms in probes)


def test_the_policy_gets_the_alone_steps_the_baseline_comes_from(tiny):
  runners, job = tiny
  hook = make_background_hook(job, runners, start_after=6, slowdown_cap=0.1)
  fake_steps(hook, 7)
  hook.drain()
  steps = hook.alone_steps_ms
  assert len(steps) == 4 and hook.baseline_ms == statistics.median(steps)
  assert hook.admission.alone_n == 4
  assert hook.admission.alone_sd_ms == pytest.approx(statistics.stdev(steps))


def test_background_checkpoint_round_trips(tiny, tmp_path):
  runners, job = tiny
  hook = make_background_hook(job, runners)
  hook.save(tmp_path, paused=True)
  fresh = tiny_runners()
  assert load_checkpoint(fresh, tmp_path)
  for d in BG_DEVICES:
    assert fresh[d].steps == runners[d].steps
    assert_same(fresh[d].host_state()["state"], runners[d].host_state()["state"])
  assert not load_checkpoint(fresh, tmp_path / "absent")


def test_windows_run_to_the_next_call_that_uses_the_device():
  uses = [frozenset({0, 1}), frozenset({0}), frozenset({0}), frozenset({0, 1})]
  w = window_ms([4.0, 1.0, 2.0, 3.0], uses, [1, 2])
  assert w[0] == {2: math.inf} and w[1] == {1: 3.0, 2: math.inf} and w[2] == {1: 2.0, 2: math.inf}


TINY_SPEC = ModelConfig.named("gpt2_small", **TINY)


def bg_spec(**kw):
  return BackgroundConfig(**{"name": "tiny", "model": TINY_SPEC, **kw})


# the foreground's memory: the planner's peak (no layers needed to price it)
PLAN = Plan(model="gpt2_small", global_batch=8, num_devices=8, layers=(),
            predicted={"memory_peak_gb": 0.5})


def test_build_failure_gives_a_stopped_hook(monkeypatch):
  def broken(*a, **k):
    raise RuntimeError("cannot build")

  TINY_SPEC.graph()  # traced before the build breaks: the job's memory check reads the graph
  monkeypatch.setattr(ModelConfig, "build", broken)
  hook = start_background(bg_spec(), TINY_SPEC, PLAN, jax.devices()[:2], memory_gb_per_device=2)
  assert not hook.alive and hook.stats.failures == 1
  assert "RuntimeError: cannot build" in hook.stats.errors[0]
  hook(type("SP", (), {"stage": type("S", (), {"index": 0, "devices": (0,)})})(), "fwd")
  assert hook.drain().steps == 0


def test_background_that_cannot_fit_is_one_line_user_error():
  with pytest.raises(UserError) as e:
    start_background(bg_spec(batch_per_device=10**7), TINY_SPEC, PLAN, jax.devices(),
                     memory_gb_per_device=2)
  msg = str(e.value)
  assert "\n" not in msg and "batch 10000000" in msg and "1.50 GB free" in msg


def test_negative_slowdown_cap_is_one_line_user_error_before_any_job():
  with pytest.raises(UserError, match=r"background.slowdown_cap=-0.1 must be >= 0") as e:
    bg_spec(slowdown_cap=-0.1)
  assert "\n" not in str(e.value)


def test_background_none_is_no_hook():
  assert start_background(bg_spec(name="none"), TINY_SPEC, PLAN, jax.devices(),
                          memory_gb_per_device=2) is None


def test_same_family_trains_the_foregrounds_model():
  assert BackgroundConfig("same_family").model_for(TINY_SPEC) is TINY_SPEC


def test_measure_compares_means_after_warmup():
  from dp_jax.orchestrator.launch import alone_steps, measure
  from dp_jax.orchestrator.scheduler import BackgroundScheduler

  hook = BackgroundScheduler(None, start_after=4)
  out = measure([100.0, 50.0, 10.0, 12.0, 30.0, 14.0], hook)
  assert out["measured_step_ms"] == 11.0 and out["measured_step_ms_with_background"] == 22.0
  assert out["foreground_slowdown"] == 1.0 and out["background_steps"] == 0
  assert measure([100.0, 50.0, 10.0, 12.0], None) == {"measured_step_ms": 11.0}
  assert [alone_steps(n) for n in (3, 6, 10)] == [3, 4, 6]
