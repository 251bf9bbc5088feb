"""Multiplexing on honest local devices (one process per core): measured vs simulated per cap.

    .venv/bin/python scripts/bench_multiplex.py [--caps 0.05 0.1 0.25 inf] [--alone 10]
        [--steps 20] [--processes N] [--out results/multiplex/bench.json]

Devices: N processes (default: one per core this shell may use), process i pinned to core i
(CPU affinity set by each process before JAX starts, dp_jax/runtime/pinned.py) with one CPU
device, joined by jax.distributed on localhost. XLA:CPU spreads a program over every core its
process may use, so only pinning makes an idle device an idle core; each worker checks
afterwards, per thread (/proc), that all its threads stayed on its core.

Foreground: GPT-2 (4 blocks, d_model 128, 64 tokens, vocabulary 512) at B=16, a burst
layout over the N devices: the embedding and the first block on every device, every later
layer on device 0 (the other devices idle while they run). Background: a smaller GPT-2
(2 blocks, d_model 64, 32 tokens) at batch 256 per device (`--background-batch`) on every
device that has idle windows, one piece per layer; each process dispatches pieces to the idle
devices it owns (device 0 is never idle). Batch 256 because there the cap binds (its two
largest pieces, about 146 and 151 ms, nearly fill device 1's 153-181 ms window): at 64 (measured,
results/multiplex/bench_bg64_run{1,2,3}.json) every piece fits the windows, every cap runs
about 2 background steps per iteration and no cap gives 0.88-0.99x the samples/s of cap 0.1,
so the bench could not show what a cap costs. The policy's profile (piece times, and the
host's gap between two pieces, charged as the switch cost) is measured in each process on its
own pinned core before the runs, and given to the runtime's policy and the simulator's alike.
The cap is the whole foreground's: with k processes dispatching, each admits against cap / k.

For each cap, in one run: a fresh hook, `alone` steps alone (two warm-up, the rest predict the
windows; their spread is the noise the slowdown feedback allows for), `steps` with the job,
then `alone - 2` alone steps again. Measured: slowdown = mean
step with / mean of the alone steps before and after - 1 (process 0's clock; 0.15: 1.15x as
long); background samples/s = completed steps x batch / time, summed over processes (steps
finished after the foreground's last step do not count). Simulated: the same policy
(dp_jax/multiplex/policy.py) replayed by the simulator on each dispatching process's measured alone
stage calls (devices without its job count as busy; after a held call, its probed move
occupies every device) with its measured piece times, over the same number of steps, each
step's foreground scaled by a factor drawn (seeded) from the same process's alone steps over
their median, and the policy given those steps, so both run the same feedback on the same
noise; samples/s summed, added time summed (against the mean alone step under that noise).
--out writes a JSON list of {cap ("inf" for no cap), measured_slowdown,
background_samples_per_s, simulated_slowdown, simulated_background_samples_per_s, details}.
Diagnostics: BENCH_SHOW_LOGS=1 prints a failed worker's log; BENCH_TIMERS=FILE writes every
foreground call's start and end per step and process (perf_counter, one clock for all
processes of the machine); BENCH_DECISIONS=FILE writes, per process and cap, every admission
decision of the runtime and of the simulator (multiplex.Decision) side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FG_BATCH, BG_BATCH = 16, 256  # BG 256: pieces long enough that the cap binds (see above)
FG_GPT2 = dict(n_layer=4, d_model=128, n_head=4, seq_len=64, vocab_size=512)
BG_GPT2 = dict(n_layer=2, d_model=64, n_head=4, seq_len=32, vocab_size=256)
PROFILE_STEPS = 8  # the job's piece profile: median over the steps after the first
KEYS = ("cap", "measured_slowdown", "background_samples_per_s", "simulated_slowdown",
        "simulated_background_samples_per_s")


# --- worker: one pinned process, one device ---------------------------------------------------


def foreground(devices, n: int):
  """The foreground program over all processes' devices, and a step(hook) -> ms function."""
  import optax

  from dp_jax.models.zoo import build_model
  from dp_jax.planner.contract import check_plan, layout_plan
  from dp_jax.runtime import data as datalib
  from dp_jax.runtime.functional import split_layers
  from dp_jax.runtime.stages import structure_graph
  from dp_jax.runtime.step import build_program, init_state, train_step

  def burst(name: str) -> list[int]:
    return list(range(n)) if name in ("embed", "h.0") else [0]

  model = build_model("gpt2_small", seed=0, **FG_GPT2)
  graph = structure_graph(model, "gpt2_small")
  plan = check_plan(layout_plan(graph, burst, global_batch=FG_BATCH, num_devices=n), graph,
                    available_devices=n)
  opt = optax.sgd(0.01, momentum=0.9)
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, plan, opt, devices)
  box = [init_state(program, params, stats, opt)]
  data = datalib.synthetic(model, seed=0)
  counter = [0]

  def step(hook) -> float:
    x, y = datalib.batch_at(data, counter[0], FG_BATCH, program.input_stage.batch,
                            program.last_stage.batch)
    t0, c0 = time.perf_counter(), time.process_time()
    timer: list = []
    box[0], loss = train_step(program, box[0], x, y, on_stage=hook, timer=timer)
    step.timers.append(timer)
    program.value(loss)  # every process reads the loss (a move across processes)
    counter[0] += 1
    cpu_ms.append(1e3 * (time.process_time() - c0))
    return 1e3 * (time.perf_counter() - t0)

  cpu_ms: list[float] = []  # this process's CPU time per step (all its threads)
  step.cpu_ms = cpu_ms
  step.timers = []

  return program, step


class CallClock:
  """Wraps a hook (or none): every stage call waited for, the time of each call recorded."""

  wait_for_stages = True

  def __init__(self, hook=None):
    self.hook, self.calls = hook, []

  def __call__(self, sp, phase: str) -> None:
    self.calls.append((f"{sp.stage.index}:{phase}", time.perf_counter()))
    if self.hook is not None:
      self.hook(sp, phase)


def call_ms(calls: list[tuple[str, float]], first: int, last: int) -> dict[str, float]:
  """Mean ms from each call to the next, per call label, over steps [first, last)."""
  per_step = [i for i, (label, _) in enumerate(calls) if label == calls[0][0]]
  lo, hi = per_step[first], per_step[last] if last < len(per_step) else len(calls) - 1
  out: dict[str, list[float]] = {}
  for (label, t0), (_, t1) in zip(calls[lo:hi], calls[lo + 1:hi + 1], strict=True):
    out.setdefault(label, []).append(1e3 * (t1 - t0))
  return {k: statistics.fmean(v) for k, v in out.items()}


def sim_calls(hook, n: int, job_devices: set[int], own: set[int]) -> list:
  """The alone calls as the simulator's chain (dp_jax.orchestrator.replay.chain_of, the one
  the train app's replay uses)."""
  from dp_jax.orchestrator.replay import chain_of

  return chain_of(hook, n, job_devices, own)


def one_cap(cap: float, share: float, step, runners, job, alone: int, steps: int, gap_ms: float,
            n: int, own: list[int]) -> dict:
  """Alone steps, then steps with the job under `cap` (this process: cap x share); measured
  and, where this process dispatches, simulated."""
  from jax.experimental import multihost_utils

  from dp_jax.orchestrator.scheduler import BackgroundScheduler
  from dp_jax.simulator.measured import fill_measured

  mine = cap * share if math.isfinite(cap) else math.inf
  logged = bool(os.environ.get("BENCH_DECISIONS"))
  hook = BackgroundScheduler(job if runners else None, runners, start_after=alone,
                             slowdown_cap=mine, switch_ms=gap_ms, own_devices=own,
                             log_decisions=logged)
  clock = CallClock(hook)
  step.cpu_ms.clear()
  times = [step(clock) for _ in range(alone + steps)]
  stats = hook.drain()
  multihost_utils.sync_global_devices(f"bench_multiplex drained {cap}")
  after = [step(CallClock()) for _ in range(alone - 2)]  # alone again, against load drift
  cpu = step.cpu_ms
  row = {"cap": cap, "process_cap": mine, "alone_ms": times[2:alone] + after,
         "with_ms": times[alone:], "background_samples_per_s": stats.samples_per_s or 0.0,
         "background_steps": stats.steps, "pieces_run": stats.dispatched,
         "pieces_refused": stats.refused, "piece_ms": stats.piece_ms,
         "active_s": stats.active_s, "failures": stats.failures,
         "held_ms_per_step": 1e3 * hook.held_s / steps,
        "move_probes_ms": {str(k): v for k, v in hook.move_ms.items()},
        "spoilt_probes": hook.spoilt_probes,
         "cpu_ms_alone": cpu[2:alone] + cpu[alone + steps:],
         "cpu_ms_with": cpu[alone:alone + steps],
         "call_ms_alone": call_ms(clock.calls, 2, alone),
         "call_ms_with": call_ms(clock.calls, alone, alone + steps)}
  if runners and hook.admission is not None:
    calls = sim_calls(hook, n, set(runners), set(own))
    # the same noise: the alone steps this process's policy learnt its feedback threshold from
    sim = fill_measured(calls, n, job, cap=mine, iterations=steps, switch_ms=gap_ms,
                        alone_steps_ms=hook.alone_steps_ms, log_decisions=logged)
    total_ms = float(sim.iteration_ms.sum())
    row.update({
        "measured_over_profiled": hook.admission.correction.overall,
        "measured_over_profiled_per_piece": [
            None if math.isnan(r) else float(r) for r in hook.admission.correction.ratio],
        "usable_fraction_at_end": hook.admission.usable,
        "tightened": hook.admission.tightened,
        "policy_alone_steps_ms": hook.alone_steps_ms,
        "feedback_threshold_ms": hook.admission.excess_threshold_ms(hook.admission.window),
        "alone_calls_ms": [[list(d), ms, label] for d, ms, label in hook.alone_calls],
        "simulated_alone_ms": sim.alone_mean_ms,  # the mean alone step under the same noise
        "simulated_baseline_ms": sim.alone_ms,
        "simulated_added_ms": float(sim.iteration_ms.mean() - sim.alone_mean_ms),
        "simulated_usable_fraction_at_end": sim.usable_at_end,
        "simulated_tightened": sim.tightened,
        "simulated_samples_per_s": float(sim.bg_steps.sum()) * job.batch / total_ms * 1e3,
        "simulated_steps_per_iteration": float(sim.bg_steps.mean()),
        "simulated_piece_ms_per_s": float(sim.bg_work_ms.sum()) / total_ms * 1e3,
        "simulated_pieces_admitted": sim.pieces_admitted,
        "simulated_pieces_refused": sim.pieces_refused})
    if logged:
      row["decisions"] = {"runtime": [asdict(x) for x in hook.admission.decisions],
                          "simulated": [asdict(x) for x in sim.decisions],
                          "runtime_observations": hook.admission.observations,
                          "profile_ms": [float(x) for x in job.pieces_ms],
                          "runtime_baseline_ms": hook.baseline_ms,
                          "simulated_baseline_ms": sim.alone_ms,
                          "move_ms": {str(k): v for k, v in hook.move_ms.items()},
                          "sim_calls": [[list(d), ms, label] for d, ms, label in calls]}
  return row


def worker(args) -> None:
  """One pinned process: join, build, measure the job's profile, run every cap, check cores."""
  from dp_jax.runtime import pinned

  core = pinned.check_pinned()  # before JAX starts its thread pools
  from dp_jax.runtime import distributed

  distributed.initialize(num_devices=args.processes)
  import jax
  import optax

  from dp_jax.models.zoo import build_model
  from dp_jax.orchestrator.launch import process_cap
  from dp_jax.orchestrator.runners import (
    build_runners,
    job_of_runner,
    measured_pieces,
    piece_gap_ms,
  )

  wall0, cpu0 = time.perf_counter(), time.process_time()
  n, me = jax.process_count(), jax.process_index()
  devices = jax.devices()
  program, step = foreground(devices, n)
  placed = [s.stage.devices for s in program.stages]
  always = set.intersection(*map(set, placed))
  mine = {i: devices[i] for i in range(n) if i not in always and devices[i].process_index == me}
  runners, job, gap_ms, pieces = {}, None, 0.0, []
  if mine:
    bg_model = build_model("gpt2_small", seed=1, **BG_GPT2)
    runners = build_runners(bg_model, "gpt2_small", [], optax.sgd(0.01, momentum=0.9),
                            args.background_batch, mine)
    first = next(iter(runners))
    pieces = measured_pieces(runners[first], steps=PROFILE_STEPS)
    for r in list(runners.values())[1:]:
      measured_pieces(r, steps=1)
    job = job_of_runner(runners[first], "gpt2_small", pieces, 0.0)
    gap_ms = piece_gap_ms(runners[first])
    for r in runners.values():
      r.steps = 0
  share = process_cap(1.0, placed, devices)
  own = [i for i, d in enumerate(devices) if d.process_index == me]
  rows = [one_cap(cap, share, step, runners, job, args.alone, args.steps, gap_ms, n, own)
          for cap in args.caps]
  threads = pinned.thread_cores()
  out = {"process": me, "core": core, "devices": sorted(i for i, d in enumerate(devices)
                                                         if d.process_index == me),
         "background_devices": sorted(runners), "profile_ms": [float(p) for p in pieces],
         "piece_gap_ms": gap_ms, "background_step_ms": job.step_ms if job else None,
         "rows": rows, "threads": threads, "confined": pinned.confined_to(core, threads),
         "cpu_over_wall": (time.process_time() - cpu0) / (time.perf_counter() - wall0)}
  out["timers"] = step.timers
  Path(args.worker_out).write_text(json.dumps(out, default=str))


# --- launcher: N pinned workers, then one table -----------------------------------------------


def merge(results: list[dict]) -> list[dict]:
  """One row per cap from every process's rows (process 0's clock for the foreground)."""
  rows = []
  for c, r0 in enumerate(results[0]["rows"]):
    per = [res["rows"][c] for res in results]
    alone = statistics.fmean(r0["alone_ms"])
    with_bg = statistics.fmean(r0["with_ms"])
    sim = [r for r in per if "simulated_alone_ms" in r]
    sim_alone = sim[0]["simulated_alone_ms"] if sim else alone
    row = {"cap": r0["cap"], "measured_slowdown": with_bg / alone - 1.0,
           "background_samples_per_s": sum(r["background_samples_per_s"] for r in per),
           "simulated_slowdown": sum(r["simulated_added_ms"] for r in sim) / sim_alone,
           "simulated_background_samples_per_s": sum(r["simulated_samples_per_s"] for r in sim),
           "measured_alone_step_ms": alone, "measured_step_ms": with_bg,
           # robust to other load on the machine: process 0 runs only the foreground
           "foreground_cpu_ms_alone": statistics.fmean(r0["cpu_ms_alone"]),
           "foreground_cpu_ms_with": statistics.fmean(r0["cpu_ms_with"]),
           "background_steps_per_iteration": sum(r["background_steps"] for r in per)
           / len(r0["with_ms"]),
           "simulated_background_steps_per_iteration": sum(
               r["simulated_steps_per_iteration"] for r in sim),
           "simulated_alone_step_ms": sim_alone,
           "background_steps": sum(r["background_steps"] for r in per),
           "pieces_run": sum(r["pieces_run"] for r in per),
           "pieces_refused": sum(r["pieces_refused"] for r in per),
           "measured_piece_ms_per_s": sum(r["piece_ms"] / r["active_s"] for r in per
                                          if r["active_s"] > 0),
           "simulated_piece_ms_per_s": sum(r["simulated_piece_ms_per_s"] for r in sim),
           "measured_over_profiled": [r.get("measured_over_profiled") for r in sim],
           "usable_fraction_at_end": [r.get("usable_fraction_at_end") for r in sim],
           "simulated_usable_fraction_at_end": [r.get("simulated_usable_fraction_at_end")
                                                for r in sim],
           "tightened": [r.get("tightened") for r in sim],
           "simulated_tightened": [r.get("simulated_tightened") for r in sim],
           "per_process": per}
    rows.append(row)
  return rows


def table(rows: list[dict]) -> str:
  lines = [f"{'cap':>6} | {'alone ms':>8} | {'meas. slowdown':>14} | {'sim. slowdown':>13} | "
           f"{'meas. bg/s':>10} | {'sim. bg/s':>9} | {'bg steps/it meas.':>17} | "
           f"{'sim.':>5} | {'fg CPU ms alone -> with':>23}"]
  for r in rows:
    lines.append(
        f"{r['cap']:>6} | {r['measured_alone_step_ms']:8.1f} | {r['measured_slowdown']:+14.1%} | "
        f"{r['simulated_slowdown']:+13.1%} | {r['background_samples_per_s']:10.1f} | "
        f"{r['simulated_background_samples_per_s']:9.1f} | "
        f"{r['background_steps_per_iteration']:17.1f} | "
        f"{r['simulated_background_steps_per_iteration']:5.1f} | "
        f"{r['foreground_cpu_ms_alone']:10.1f} -> {r['foreground_cpu_ms_with']:9.1f}")
  return "\n".join(lines)


def launch(args) -> int:
  from dp_jax.base.errors import UserError
  from dp_jax.runtime import pinned

  try:
    cores = pinned.cores_for(args.processes) if args.processes else pinned.cores_for(
        len(os.sched_getaffinity(0)))
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  n = len(cores)
  if n < 2:
    print("error: the bench needs at least 2 cores (one busy, one idle device)", file=sys.stderr)
    return 2
  print(f"{n} processes, one CPU device each, pinned to cores {pinned.cores_text(cores)}; "
        f"caps {args.caps}, {args.alone} alone + {args.steps} steps per cap", flush=True)
  with tempfile.TemporaryDirectory(prefix="bench_multiplex.") as tmp:
    outs = [Path(tmp) / f"result_{i}.json" for i in range(n)]
    argv = [str(Path(__file__).resolve()), "--worker", "--processes", str(n), "--alone",
            str(args.alone), "--steps", str(args.steps), "--background-batch",
            str(args.background_batch), "--caps", *map(str, args.caps)]
    procs = pinned.start(argv + ["--worker-out", str(Path(tmp) / "result_{process}.json")], n,
                         tmp, cores, cwd=ROOT)
    codes = pinned.wait(procs, args.timeout)
    if any(codes):
      for i, c in enumerate(codes):
        if c:
          log = (Path(tmp) / f"process_{i}.log").read_text().strip().splitlines()
          print(f"process {i} failed (exit {c}): {log[-1] if log else 'no output'}",
                file=sys.stderr)
          if os.environ.get("BENCH_SHOW_LOGS"):
            print("\n".join(log[-40:]), file=sys.stderr)
      return 1
    results = [json.loads(p.read_text()) for p in outs]
    if os.environ.get("BENCH_TIMERS"):
      Path(os.environ["BENCH_TIMERS"]).write_text(json.dumps([r.pop("timers") for r in results]))
    for r in results:
      r.pop("timers", None)
    if os.environ.get("BENCH_DECISIONS"):
      Path(os.environ["BENCH_DECISIONS"]).write_text(json.dumps(
          [[row.pop("decisions", None) for row in r["rows"]] for r in results]))
  for res in results:
    busy = ", ".join(f"{k.split('/')[0]} {v['cpu_s']:.1f}s" for k, v in res["threads"].items())
    print(f"process {res['process']} (core {res['core']}, devices {res['devices']}, background "
          f"on {res['background_devices']}): threads confined to its core: {res['confined']}; "
          f"CPU/wall {res['cpu_over_wall']:.2f}; busy threads: {busy}")
    if res["background_step_ms"]:
      print(f"  background gpt2_small x{args.background_batch}: {len(res['profile_ms'])} pieces, "
            f"{res['background_step_ms']:.1f} ms per step, {res['piece_gap_ms']:.2f} host ms "
            "per piece (measured on its core)")
  rows = merge(results)
  print(table(rows))
  if args.out is not None:
    out = [{**{k: r[k] for k in KEYS}, "cap": r["cap"] if math.isfinite(r["cap"]) else "inf",
            "details": {k: v for k, v in r.items() if k not in KEYS}} for r in rows]
    for o in out:
      o["details"]["processes"] = [{k: v for k, v in p.items() if k != "rows"} for p in results]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from dp_jax.base.jsonfile import dumps

    args.out.write_text(dumps(out))
    print(f"wrote {args.out}")
  return 0


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--caps", nargs="+", type=float, default=[0.05, 0.1, 0.25, math.inf])
  ap.add_argument("--alone", type=int, default=10,
                  help="alone steps per cap (first two skipped; the rest give the windows and "
                  "the feedback's noise)")
  ap.add_argument("--steps", type=int, default=20, help="steps with the job per cap")
  ap.add_argument("--processes", type=int, default=0, help="pinned processes (0: one per core)")
  ap.add_argument("--timeout", type=float, default=900, help="seconds before the run is ended")
  ap.add_argument("--background-batch", type=int, default=BG_BATCH,
                  help="background batch per idle device (larger: longer pieces)")
  ap.add_argument("--out", type=Path, default=None, help="write the rows as a JSON list")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.alone < 3 or args.steps < 1 or args.background_batch < 1:
    sys.exit("error: --alone must be >= 3, --steps >= 1 and --background-batch >= 1")
  if args.worker:
    args.worker_out = args.worker_out.format(process=os.environ["DP_JAX_PROCESS_ID"])
    worker(args)
  else:
    sys.exit(launch(args))


if __name__ == "__main__":
  main()
