"""Planner wall time per model and job size: python scripts/bench_planner.py [--quick].

Graphs come from the model zoo (dp_jax.models.registry.build_model + dp_jax.trace.trace_graph)
and timings from the analytic roofline profile (dp_jax.profile.analytic); where those are not
importable, synthetic graphs of the same size (dp_jax.planner.synthetic) stand in. Prints, per
model, G = 8 ... 1024 with B = G and B = 32 (where G <= 32), and B = G = 960 with all 28
divisors of 960 as candidate counts.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from dp_jax.cluster import load_cluster
from dp_jax.errors import UserError
from dp_jax.planner import make_plan
from dp_jax.planner.options import PlanOptions, candidate_counts

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("resnet50", "inception_v3", "wide_resnet101_2", "gpt2")
BATCHES = [2 ** k for k in range(11)] + [3, 5, 15, 30, 60, 120, 240, 480, 960]


def load_graph(name: str, synthetic_only: bool = False):
  """(graph, profile, where they came from) for a zoo model, synthetic if the zoo is missing."""
  try:
    if synthetic_only:
      raise ImportError("--synthetic", name="the zoo (--synthetic)")
    from dp_jax.models.registry import MODEL_NAMES, build_model
    from dp_jax.profile.analytic import analytic_profile
    from dp_jax.trace import trace_graph

    zoo = name if name in MODEL_NAMES else f"{name}_small"
    graph = trace_graph(build_model(zoo, abstract=True), zoo)
    return graph, analytic_profile(graph, "A100-SXM4-40GB", "bfloat16", BATCHES), "zoo+analytic"
  except ImportError as e:
    from dp_jax.planner import synthetic

    make = {"inception_v3": synthetic.inception_like,
            "wide_resnet101_2": lambda: synthetic.resnet_like(blocks=(3, 4, 23, 3), width=128)}
    graph = make.get(name, synthetic.resnet_like)()
    return graph, synthetic.analytic_profile(graph, BATCHES), f"synthetic ({e.name} missing)"


def cases(quick: bool):
  sizes = [8, 64, 1024] if quick else [2 ** k for k in range(3, 11)]
  for g in sizes:
    yield g, g, "divisors"
    if g <= 32 and g != 32:
      yield g, 32, "divisors"
  yield 960, 960, "divisors"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", nargs="*", default=list(MODELS))
  parser.add_argument("--cluster", default=str(ROOT / "conf/cluster/dgx_a100.yaml"))
  parser.add_argument("--quick", action="store_true", help="G in {8, 64, 1024} and 960 only")
  parser.add_argument("--synthetic", action="store_true",
                      help="use the synthetic ResNet/Inception-sized graphs, not the zoo")
  args = parser.parse_args()
  cluster = load_cluster(yaml.safe_load(Path(args.cluster).read_text()))
  print(f"cluster {cluster.name}; times are wall seconds of make_plan on this machine")
  print(f"{'model':18} {'layers':>6} {'G':>5} {'B':>5} {'counts':>6} {'seconds':>8} "
        f"{'iter_ms':>9} {'dp_iter_ms':>10} {'gpu_ms':>10} {'dp_gpu_ms':>10}")
  for name in args.models:
    graph, profile, source = load_graph(name, args.synthetic)
    print(f"# {name}: {len(graph.nodes)} layers, {len(graph.fork_join_blocks())} fork/join "
          f"blocks, from {source}")
    for g, b, counts in cases(args.quick):
      n = len(candidate_counts(PlanOptions(num_devices=g, global_batch=b, device_counts=counts)))
      start = time.perf_counter()
      try:
        plan = make_plan(graph, profile, cluster, num_devices=g, global_batch=b,
                         device_counts=counts)
      except UserError as e:
        print(f"{name:18} {len(graph.nodes):6} {g:5} {b:5} {n:6}  skipped: {e}")
        continue
      seconds = time.perf_counter() - start
      p = plan.predicted
      print(f"{name:18} {len(graph.nodes):6} {g:5} {b:5} {n:6} {seconds:8.3f} "
            f"{p['iteration_ms']:9.2f} {p['data_parallel_iteration_ms']:10.2f} "
            f"{p['gpu_ms']:10.0f} {p['data_parallel_gpu_ms']:10.0f}")


if __name__ == "__main__":
  main()
