"""Multiplexing on the local devices: measured vs simulated, for several slowdown caps.

    .venv/bin/python scripts/bench_multiplex.py [--caps 0.05 0.1 0.25 inf] [--alone 6]
        [--steps 20] [--out bench_multiplex.json]

Devices: as many CPU host devices as this process may use cores, the foreground on the main
thread and one background dispatch thread per device. XLA:CPU offers no setting that confines
a device's programs to one core (a program spreads over every core of the process), so a piece
running on an "idle" device still shares the cores with the foreground: the measured slowdown
includes that sharing, which a GPU would not have (docs/orchestrator.md).

Foreground: GPT-2 (4 blocks, d_model 128, 64 tokens, vocabulary 512) at B=16, a burst
layout: the embedding and the first block on every device, every later layer on device 0
(device 1 idles while they run; XLA:CPU runs VGG16 at 32x32 far too slowly for this).
Background: a smaller GPT-2 (2 blocks, d_model 64, 32 tokens) at batch 4 per device on every
device, one piece per layer (its profile: piece times measured here first, and the host's gap
between two pieces, which the simulator charges as its switch cost). For each cap, in one
process: a fresh hook, `alone` steps alone (two warm-up, the rest predict the windows), then
`steps` with the job, then `alone - 2` alone steps again. Every foreground stage call is
waited for (the hook's `wait_for_stages`), in the alone steps too. Measured: slowdown = mean
step with / mean of the alone steps before and after - 1 (0.15: 1.15x as long); background
samples/s = completed steps x batch / time (steps finished after the foreground's last step do
not count); --out writes cap ("inf" for no cap) and the four numbers per row, plus details.
Simulated: the same policy (dp_jax/multiplex.py) replayed on the measured alone stage calls
with the job's measured piece times (dp_jax/sim/measured.py), over the same number of steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

CORES = len(os.sched_getaffinity(0))
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={CORES}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import optax  # noqa: E402

from dp_jax.models.registry import build_model  # noqa: E402
from dp_jax.orchestrator import BackgroundScheduler, build_runners, job_of_runner  # noqa: E402
from dp_jax.orchestrator.background import measured_pieces, piece_gap_ms  # noqa: E402
from dp_jax.runtime import data as datalib  # noqa: E402
from dp_jax.runtime.functional import split_layers  # noqa: E402
from dp_jax.runtime.plan_check import check_plan  # noqa: E402
from dp_jax.runtime.plans import layout_plan  # noqa: E402
from dp_jax.runtime.stages import structure_graph  # noqa: E402
from dp_jax.runtime.step import build_program, init_state, train_step  # noqa: E402
from dp_jax.sim.measured import fill_measured  # noqa: E402

FG_BATCH, BG_BATCH = 16, 4
FG_GPT2 = dict(n_layer=4, d_model=128, n_head=4, seq_len=64, vocab_size=512)
BG_GPT2 = dict(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab_size=256)


def burst_layout(name: str) -> list[int]:
  """The embedding and the first block on every device, everything later on device 0."""
  return list(range(CORES)) if name in ("embed", "h.0") else [0]


def foreground():
  """The foreground program on the local devices, its state and a step function."""
  model = build_model("gpt2_small", seed=0, **FG_GPT2)
  graph = structure_graph(model, "gpt2_small")
  plan = check_plan(layout_plan(graph, burst_layout, global_batch=FG_BATCH, num_devices=CORES),
                    graph, available_devices=CORES)
  opt = optax.sgd(0.01, momentum=0.9)
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, plan, opt, jax.devices()[:CORES])
  box = [init_state(program, params, stats, opt)]
  data = datalib.synthetic(model, seed=0)
  counter = [0]

  def step(hook) -> float:
    x, y = datalib.batch_at(data, counter[0], FG_BATCH, program.input_stage.batch,
                            program.last_stage.batch)
    t0 = time.perf_counter()
    box[0], loss = train_step(program, box[0], x, y, on_stage=hook)
    float(loss)
    counter[0] += 1
    return 1e3 * (time.perf_counter() - t0)

  return program, step


class WaitOnly:
  """A hook that only has each stage call waited for, as the background hook does."""

  wait_for_stages = True

  def __call__(self, sp, phase: str) -> None:
    pass


def one_cap(cap: float, step, runners, job, alone: int, steps: int, gap_ms: float) -> dict:
  """Alone steps, then steps with the job under `cap`; measured and simulated."""
  hook = BackgroundScheduler(job, runners, start_after=alone, slowdown_cap=cap)
  times = [step(hook) for _ in range(alone + steps)]
  stats = hook.drain()
  after = [step(WaitOnly()) for _ in range(alone - 2)]  # alone again, against load drift
  alone_ms = statistics.fmean(times[2:alone] + after)
  with_ms = statistics.fmean(times[alone:])
  sim = fill_measured(hook.alone_calls, CORES, job, cap=cap, iterations=steps, switch_ms=gap_ms)
  sim_total = float(sim.iteration_ms.sum())
  return {
      "cap": cap, "piece_gap_ms": gap_ms, "measured_alone_step_ms": alone_ms,
      "measured_step_ms": with_ms,
      "measured_slowdown": with_ms / alone_ms - 1.0,
      "background_samples_per_s": stats.samples_per_s or 0.0,
      "background_steps": stats.steps, "pieces_run": stats.dispatched,
      "pieces_refused": stats.refused,
      "measured_over_profiled": hook.admission.correction.overall,
      "usable_fraction_at_end": hook.admission.usable,
      "simulated_alone_step_ms": sum(ms for _, ms, _ in hook.alone_calls),
      "simulated_slowdown": float(sim.iteration_ms.mean() / sim.alone_ms - 1.0),
      "simulated_background_samples_per_s": float(sim.bg_steps.sum()) * job.batch / sim_total
      * 1e3,
      "alone_calls_ms": [[list(d), ms, label] for d, ms, label in hook.alone_calls]}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--caps", nargs="+", type=float, default=[0.05, 0.1, 0.25, math.inf])
  ap.add_argument("--alone", type=int, default=6, help="alone steps per cap (first two skipped)")
  ap.add_argument("--steps", type=int, default=20, help="steps with the job per cap")
  ap.add_argument("--out", type=Path, default=None, help="write the rows as a JSON list")
  args = ap.parse_args()
  if args.alone < 3 or args.steps < 1:
    sys.exit("error: --alone must be >= 3 and --steps >= 1")
  devices = jax.devices()[:CORES]
  print(f"{CORES} CPU devices (one per core of this process), background threads: {CORES}")
  _, step = foreground()
  bg_model = build_model("gpt2_small", seed=1, **BG_GPT2)
  runners = build_runners(bg_model, "gpt2_small", [], optax.sgd(0.01, momentum=0.9), BG_BATCH,
                          dict(enumerate(devices)))
  pieces = measured_pieces(runners[0], steps=3)
  for r in list(runners.values())[1:]:
    measured_pieces(r, steps=1)
  job = job_of_runner(runners[0], "gpt2_small", pieces, 0.0)
  gap_ms = piece_gap_ms(runners[0])
  print(f"background: gpt2_small {BG_GPT2} x{BG_BATCH}, {len(pieces)} pieces, "
        f"{job.step_ms:.1f} ms per step, {gap_ms:.2f} ms between pieces (measured alone)")
  rows = [one_cap(cap, step, runners, job, args.alone, args.steps, gap_ms) for cap in args.caps]
  print(f"\n{'cap':>6} | {'alone ms':>9} | {'meas. slowdown':>14} | {'sim. slowdown':>13} | "
        f"{'meas. bg/s':>10} | {'sim. bg/s':>9} | {'meas/prof':>9}")
  for r in rows:
    print(f"{r['cap']:>6} | {r['measured_alone_step_ms']:9.1f} | {r['measured_slowdown']:+14.1%} "
          f"| {r['simulated_slowdown']:+13.1%} | {r['background_samples_per_s']:10.1f} | "
          f"{r['simulated_background_samples_per_s']:9.1f} | {r['measured_over_profiled']:9.2f}")
  if args.out is not None:
    keys = ("cap", "measured_slowdown", "background_samples_per_s", "simulated_slowdown",
            "simulated_background_samples_per_s")
    out = [{**{k: r[k] for k in keys}, "cap": r["cap"] if math.isfinite(r["cap"]) else "inf",
            "details": {k: v for k, v in r.items() if k not in keys}} for r in rows]
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
