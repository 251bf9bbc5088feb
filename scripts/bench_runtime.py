"""Runtime overhead: data parallelism split into k stages on the same devices vs one fused jit.

    .venv/bin/python scripts/bench_runtime.py                     # tiny GPT-2, B=32, k=1,4,all
    .venv/bin/python scripts/bench_runtime.py --batch 128         # (results/runtime/, README)
    .venv/bin/python scripts/bench_runtime.py --model vgg16 --image-size 32 --steps 5
    [--devices N] [--splits 1,4,0] [--out bench_runtime.json]

(a) one jax.jit of the whole step (batch sharded over the devices, params replicated);
(b_k) the runtime executing data parallelism cut into k stages (k=0: one stage per layer), all
on the same devices: plan device i of stage j is jax.devices()[i mod G], so every stage runs on
the same mesh devices and activations do not move; what (b_k) adds to (a) is the runtime's own
cost of stage boundaries (host dispatch of a forward and a backward program per stage, the
cotangent plumbing, the optimizer update per stage, fusion XLA cannot do across programs);
(c_k) k stages alternating between all G devices and the first device alone (--alternate k), so
every boundary moves activations between device sets, as most burst plans' boundaries do.
All runs take turns in one process (drift hits all alike); in a turn a run takes
--runs-per-turn steps in a row and only the last is timed, so every timed step follows a step of
its own, as in training (dp_jax.measurement.plan_timing.turns; a step right after another
program's is up to 20% slower here, docs/validation.md); medians. Prints (b_k)/(a)
and the overhead per added stage, (b_k - b_1) / (k - 1), in microseconds. Devices default to
one per core (dp_jax.runtime.local_devices).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dp_jax.runtime import local_devices  # noqa: E402  (imports no JAX)


def parse_args():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="gpt2_small")
  ap.add_argument("--image-size", type=int, default=32)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--devices", type=int, default=None, help="default: one per core")
  ap.add_argument("--splits", default="1,4,0", help="stage counts k (0: one per layer)")
  ap.add_argument("--alternate", type=int, default=4,
                  help="(c_k): k stages alternating between all devices and the first (0: none)")
  ap.add_argument("--runs-per-turn", type=int, default=2,
                  help="steps of a run in a row per round, the last one timed (1: alternate)")
  ap.add_argument("--out", default=None)
  return ap.parse_args()


def main() -> None:
  args = parse_args()
  local_devices.set_host_device_count(args.devices or local_devices.cpu_cores())
  import jax
  import optax

  from dp_jax.measurement.plan_timing import stepper, timed, turns
  from dp_jax.models.zoo import build_model
  from dp_jax.planner.contract import Plan, check_plan, staged_data_parallel_plan
  from dp_jax.runtime import data as datalib
  from dp_jax.runtime import mesh as meshlib
  from dp_jax.runtime.fused import fused_step
  from dp_jax.runtime.stages import structure_graph

  def fresh():
    if args.model.startswith("gpt2"):  # the tiny CPU GPT-2 of conf/experiment/small_model
      return build_model(args.model, n_layer=2, d_model=64, n_head=2, seq_len=32,
                         vocab_size=512)
    return build_model(args.model, image_size=args.image_size, num_classes=10)

  devices = local_devices.timing_devices(args.devices)
  g = len(devices)
  graph = structure_graph(fresh(), args.model)
  opt = optax.sgd(0.01, momentum=0.9)

  def split_plan(k: int, alternate: bool = False) -> Plan:
    plan = staged_data_parallel_plan(graph, k, g, global_batch=args.batch, alternate=alternate)
    return check_plan(plan, graph, available_devices=plan["num_devices"])

  def fused_stepper():
    mesh = meshlib.stage_mesh(devices)
    model = fresh()
    step, state = fused_step(model, opt, mesh)
    src = datalib.synthetic(model, seed=0)
    x, y = datalib.batch_at(src, 0, args.batch, meshlib.batch_sharding(mesh),
                            meshlib.batch_sharding(mesh))
    box = [state]

    def one():
      loss, *new = step(*box[0], x, y)
      box[0] = tuple(new)
      jax.block_until_ready((loss, box[0]))

    return one

  ks = [int(k) for k in args.splits.split(",")]
  runs = [("a", fused_stepper(), 1)]
  for k in ks:
    plan = split_plan(k)
    one, stages = stepper(fresh(), graph, plan, devices * (plan.num_devices // g), opt)
    runs.append((f"b_{k or 'all'}", one, stages))
  if args.alternate > 1 and g > 1:
    plan = split_plan(args.alternate, alternate=True)
    one, stages = stepper(fresh(), graph, plan, devices * (plan.num_devices // g), opt)
    runs.append((f"c_{args.alternate}", one, stages))
  samples = turns([timed(one) for _, one, _ in runs], args.steps,
                  runs_per_turn=args.runs_per_turn, warmup=2)  # the first run compiles
  times = {name: [ms for ms, _ in s] for (name, _, _), s in zip(runs, samples, strict=True)}
  med = {name: statistics.median(v) for name, v in times.items()}
  size = "tiny" if args.model.startswith("gpt2") else f"{args.image_size}x{args.image_size}"
  print(f"{args.model} {size}, B={args.batch}, {g} {jax.default_backend()} devices "
        f"({local_devices.cpu_cores()} cores), {args.steps} rounds, each step timed after "
        f"{args.runs_per_turn - 1} of its own (median ms per step, measured)")
  print(f"(a)   fused jit data parallel: {med['a']:9.2f} ms")
  base = next((name for name, _, s in runs if s == 1 and name != "a"), None)
  rows = {}
  for name, _, stages in runs[1:]:
    ratio = med[name] / med["a"]
    per = ((med[name] - med[base]) / (stages - 1) * 1e3) if base and stages > 1 else None
    rows[name] = {"stages": stages, "median_ms": med[name], "ratio_to_fused": ratio,
                  "overhead_us_per_added_stage": per}
    extra = f", {per:8.0f} us per added stage" if per is not None else ""
    print(f"({name:5s}) runtime, {stages:3d} stage(s):  {med[name]:9.2f} ms  "
          f"({name})/(a) = {ratio:.3f}{extra}")
  if args.out:
    Path(args.out).write_text(json.dumps(
        {"model": args.model, "batch": args.batch, "devices": g,
         "cores": local_devices.cpu_cores(), "steps": args.steps,
         "runs_per_turn": args.runs_per_turn, "fused_ms": med["a"],
         "runs": rows, "step_ms": times}, indent=1))


if __name__ == "__main__":
  main()
