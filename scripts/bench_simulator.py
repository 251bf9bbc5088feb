"""Time one simulated iteration of resnet50 (224x224) on 1024 devices with background fill.

    .venv/bin/python scripts/bench_simulator.py [--model resnet50] [--devices 1024]
                                                [--batch 1024] [--repeats 5]

Graph: dp_jax.models.zoo (traced once, not timed); profile: analytic A100 roofline; cluster:
dgx_a100.
Prints planning time and simulation time separately; the target is simulation < 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import yaml

from dp_jax.base.checks import build
from dp_jax.hardware.cluster import named_cluster

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="resnet50", help="a conf/model/<name>.yaml")
  ap.add_argument("--devices", type=int, default=1024)
  ap.add_argument("--batch", type=int, default=1024)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--amplification-limit", type=float, default=2.0)
  args = ap.parse_args()

  from dp_jax.layer_times.analytic import analytic_profile
  from dp_jax.layer_times.sources import profile_batches
  from dp_jax.models.zoo import ModelConfig
  from dp_jax.planner import make_plan
  from dp_jax.simulator.engine import simulate
  from dp_jax.simulator.job import background_job
  from dp_jax.simulator.metrics import metrics

  t = time.perf_counter()
  spec = yaml.safe_load((REPO / "conf/model" / f"{args.model}.yaml").read_text())
  graph = build(ModelConfig, spec).graph()
  trace_s = time.perf_counter() - t
  cluster = named_cluster("dgx_a100")
  profile = analytic_profile(graph, cluster.device, "bfloat16", profile_batches(args.batch, 8))
  t = time.perf_counter()
  plan = make_plan(graph, profile, cluster, num_devices=args.devices, global_batch=args.batch,
                   amplification_limit=args.amplification_limit)
  plan_s = time.perf_counter() - t
  job = background_job(graph, profile, cluster, 8)
  times = []
  for _ in range(args.repeats):
    t = time.perf_counter()
    sim = simulate(graph, profile, cluster, plan, job=job)
    m = metrics(sim)
    times.append(time.perf_counter() - t)
  print(f"{args.model} {spec.get('image_size')}px, B={args.batch}, G={args.devices}, analytic "
        f"A100, dgx_a100: {len(graph.nodes)} layers, {len(sim.timeline.tasks)} tasks, "
        f"{len(sim.classes)} device groups, {len(sim.windows)} idle windows")
  print(f"trace (not timed) {trace_s:.2f} s; planning {plan_s:.3f} s")
  print(f"simulation (timeline + background fill + metrics, {m['simulated_iterations']} "
        f"iterations): median {statistics.median(times):.3f} s, max {max(times):.3f} s "
        f"over {args.repeats} runs ({'OK' if max(times) < 1 else 'OVER'} the 1 s target)")
  print(f"alone {m['alone_iteration_ms']:.2f} ms, with background {m['iteration_ms']:.2f} ms, "
        f"background {m['background_samples_per_s']:.0f} samples/s, cluster "
        f"{m['cluster_throughput_vs_data_parallel']:.2f}x data parallel")


if __name__ == "__main__":
  main()
