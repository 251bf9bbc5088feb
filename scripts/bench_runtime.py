"""Runtime overhead on 8 CPU devices: fused jit vs the runtime on data-parallel and burst plans.

    .venv/bin/python scripts/bench_runtime.py [--model vgg16] [--image-size 32] [--batch 32]
        [--steps 5] [--burst planner|layout] [--out bench_runtime.json]
    .venv/bin/python scripts/bench_runtime.py --model gpt2_small --steps 20   # tiny GPT-2

(a) one jax.jit of the whole step (batch sharded over 8 devices, params replicated),
(b) the runtime executing the data-parallel plan, (c) the runtime executing a burst plan
(the planner's for local_cpu with the analytic cpu profile, or, if that uses a single device
count or --burst layout is given, a fixed layout: first third of the layers on 8 devices,
second third on 4, the rest on 2 and the output layer on 1). Prints median step times and the
ratios (b)/(a) and (c)/(a). The 8 devices share this machine's cores: the ratios measure
runtime overhead (dispatch, transfers, stage boundaries), not burst-parallel speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import optax  # noqa: E402

from dp_jax.models.registry import build_model  # noqa: E402
from dp_jax.runtime import data as datalib  # noqa: E402
from dp_jax.runtime import mesh as meshlib  # noqa: E402
from dp_jax.runtime.functional import split_layers  # noqa: E402
from dp_jax.runtime.fused import fused_step  # noqa: E402
from dp_jax.runtime.plan_check import check_plan  # noqa: E402
from dp_jax.runtime.plans import data_parallel_layout_plan, layout_plan  # noqa: E402
from dp_jax.runtime.stages import structure_graph  # noqa: E402
from dp_jax.runtime.step import build_program, init_state, train_step  # noqa: E402

G = 8


def fused_stepper(model, opt, x, y):
  """One call = one fused data-parallel step; returns what to wait for."""
  mesh = meshlib.stage_mesh(jax.devices()[:G])
  step, state = fused_step(model, opt, mesh)
  xs = jax.device_put(x, meshlib.batch_sharding(mesh))
  ys = jax.device_put(y, meshlib.batch_sharding(mesh))
  box = [state]

  def one():
    loss, *new = step(*box[0], xs, ys)
    box[0] = tuple(new)
    return loss, box[0]

  return one


def runtime_stepper(model, graph, plan, opt, x, y):
  """One call = one runtime step under `plan`; returns (stepper, number of stages)."""
  defs, params, stats = split_layers(model)
  program = build_program(graph, defs, check_plan(plan, graph, available_devices=G), opt,
                          jax.devices()[:G])
  box = [init_state(program, params, stats, opt)]
  xs = jax.device_put(x, program.input_stage.batch)
  ys = jax.device_put(y, program.last_stage.batch)

  def one():
    box[0], loss = train_step(program, box[0], xs, ys)
    return loss, box[0]

  return one, len(program.stages)


def interleaved(steppers, steps: int) -> list[list[float]]:
  """Milliseconds per step of each stepper, one step of each per round (drift cancels)."""
  for one in steppers:
    jax.block_until_ready(one())  # compile
  out: list[list[float]] = [[] for _ in steppers]
  for _ in range(steps):
    for times, one in zip(out, steppers, strict=True):
      t0 = time.perf_counter()
      jax.block_until_ready(one())
      times.append((time.perf_counter() - t0) * 1e3)
  return out


def burst_plan(model_name: str, model, graph, batch: int, how: str) -> tuple[dict, str]:
  if how == "planner":
    try:
      import yaml

      from dp_jax.cluster import load_cluster
      from dp_jax.planner import make_plan
      from dp_jax.profile.analytic import analytic_profile
      from dp_jax.profile.sources import profile_batches
      from dp_jax.trace import trace_graph

      conf = Path(__file__).resolve().parents[1] / "conf" / "cluster" / "local_cpu.yaml"
      cluster = load_cluster(yaml.safe_load(conf.read_text()))
      traced = trace_graph(model, model_name)
      profile = analytic_profile(traced, cluster.device, "float32", profile_batches(batch))
      plan = make_plan(traced, profile, cluster, num_devices=G, global_batch=batch,
                       amplification_limit=2.0).to_json()
      if len({len(layer["devices"]) for layer in plan["layers"]}) > 1:
        return plan, "planner (local_cpu, analytic cpu profile, amplification limit 2)"
    except ImportError as e:
      print(f"planner unavailable ({e}); using the fixed layout")
  names = graph.names
  n = len(names)

  def devices(name: str) -> range:
    i = names.index(name)
    return range(8) if i < n // 3 else range(4) if i < 2 * n // 3 else range(2) if i < n - 1 \
        else range(1)

  return layout_plan(graph, devices, global_batch=batch, num_devices=G), "fixed layout 8/4/2/1"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="vgg16")
  ap.add_argument("--image-size", type=int, default=32)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--burst", choices=("planner", "layout"), default="planner")
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  def fresh():
    if args.model.startswith("gpt2"):  # the tiny CPU config of conf/model/gpt2.yaml
      return build_model(args.model, n_layer=2, d_model=64, n_head=2, seq_len=32,
                         vocab_size=256)
    return build_model(args.model, image_size=args.image_size, num_classes=10)

  model = fresh()
  graph = structure_graph(model, args.model)
  src = datalib.synthetic(model, seed=0)
  one = meshlib.replicated(meshlib.stage_mesh(jax.devices()[:1]))
  x, y = datalib.batch_at(src, 0, args.batch, one, one)
  opt = optax.sgd(0.01, momentum=0.9)
  size = "tiny" if args.model.startswith("gpt2") else f"{args.image_size}x{args.image_size}"
  print(f"{args.model} {size}, B={args.batch}, {G} CPU devices, "
        f"{args.steps} interleaved rounds (median)")
  dp = data_parallel_layout_plan(graph, global_batch=args.batch, num_devices=G)
  plan, how = burst_plan(args.model, fresh(), graph, args.batch, args.burst)
  run_b, nb = runtime_stepper(fresh(), graph, dp, opt, x, y)
  run_c, nc = runtime_stepper(fresh(), graph, plan, opt, x, y)
  a, b, c = interleaved([fused_stepper(fresh(), opt, x, y), run_b, run_c], args.steps)
  counts = sorted({len(layer["devices"]) for layer in plan["layers"]}, reverse=True)
  print(f"(a) fused jit data parallel:     {statistics.median(a):9.1f} ms")
  print(f"(b) runtime, data-parallel plan: {statistics.median(b):9.1f} ms ({nb} stage)")
  print(f"(c) runtime, burst plan:         {statistics.median(c):9.1f} ms ({nc} stages, device "
        f"counts {counts}, {how})")
  ma, mb, mc = (statistics.median(v) for v in (a, b, c))
  print(f"(b)/(a) = {mb / ma:.3f}   (c)/(a) = {mc / ma:.3f}")
  if args.out:
    Path(args.out).write_text(json.dumps(
        {"model": args.model, "image_size": args.image_size, "batch": args.batch,
         "fused_ms": a, "runtime_dp_ms": b, "runtime_burst_ms": c, "burst_plan": how,
         "burst_stages": nc, "ratio_dp": mb / ma, "ratio_burst": mc / ma}, indent=1))


if __name__ == "__main__":
  main()
