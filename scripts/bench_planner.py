"""Planner wall time per model and job size: python scripts/bench_planner.py [--quick].

Graphs come from the model zoo (dp_jax.models.zoo.build_model + dp_jax.models.trace.trace_graph)
and timings from the calibrated GPU profile of the cluster's device in mixed bf16
(dp_jax.layer_times.calibrated, the default profile on GPU clusters); where those are not
importable, synthetic graphs of the same size (dp_jax.planner.synthetic) stand in. Prints, per
model, make_plan's wall and CPU seconds with samples only and with the joint (count x
sharding) search (planner.sharding=[samples,weights]) side by side: G = 8 ... 1024 with
B = G and B = 32 (where G < 32), B = G = 960 with all 28 divisors of 960 as candidate
counts, and B = G = 16,384 (samples only; the cluster's node count raised to hold it).
Then the joint search at G = B = 1024 against its target (JOINT_LIMIT s for every model; the
slowest model named), and the plan app's process wall time (ResNet-50, G = B = 1024, graph
JSON given, W&B off, no chart) against `python -c "import jax"`, the median ratio of --repeats
pairs run in turn (scripts/bench_app_start.py: the default plan app's start-up). `gap`: the
(joint, else samples) plan's gap to the search's lower bound (plan JSON `optimality`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
import time
from pathlib import Path

from bench_app_start import app_ratio, line

from dp_jax.base.errors import UserError
from dp_jax.hardware.cluster import named_cluster
from dp_jax.planner import make_plan
from dp_jax.planner.options import PlanOptions, candidate_counts

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("vgg16", "resnet50", "wide_resnet50_2", "wide_resnet101_2", "inception_v3",
          "gpt2_small", "gpt2_medium")
BATCHES = [2 ** k for k in range(15)] + [3, 5, 15, 30, 60, 120, 240, 480, 960]
JOINT = ("samples", "weights")
LARGE = 16384  # samples only
APP_LIMIT = 2.5  # the plan app's wall time may be at most this many `import jax`
JOINT_G = 1024  # the joint search at G = B = JOINT_G ...
JOINT_LIMIT = 1.0  # ... takes at most this many wall seconds for every model
PROFILE_DTYPE = "mixed bf16"


def load_graph(name: str, device: str, synthetic_only: bool = False):
  """(graph, profile, where they came from) for a zoo model on `device` (the calibrated
  profile), synthetic if the zoo is missing."""
  try:
    if synthetic_only:
      raise ImportError("--synthetic", name="the zoo (--synthetic)")
    # Imported here: the zoo and the tracer import JAX; without them the synthetic graphs stand in.
    from dp_jax.layer_times.calibrated import calibrated_profile
    from dp_jax.models.trace import trace_graph
    from dp_jax.models.zoo import MODEL_NAMES, build_model

    zoo = name if name in MODEL_NAMES else f"{name}_small"
    graph = trace_graph(build_model(zoo, abstract=True), zoo)
    profile = calibrated_profile(graph, device, PROFILE_DTYPE, BATCHES)
    return graph, profile, f"zoo+calibrated ({device}, {PROFILE_DTYPE})"
  except ImportError as e:
    from dp_jax.planner import synthetic

    make = {"inception_v3": synthetic.inception_like,
            "wide_resnet101_2": lambda: synthetic.resnet_like(blocks=(3, 4, 23, 3), width=128)}
    graph = make.get(name, synthetic.resnet_like)()
    return graph, synthetic.analytic_profile(graph, BATCHES), f"synthetic ({e.name} missing)"


def cases(quick: bool):
  """(G, B, device_counts, joint too)."""
  sizes = [8, 64, 1024] if quick else [2 ** k for k in range(3, 11)]
  for g in sizes:
    yield g, g, "divisors", True
    if g < 32:
      yield g, 32, "divisors", True
  yield 960, 960, "divisors", True
  yield LARGE, LARGE, "divisors", False


def timed_plan(graph, profile, cluster, g, b, counts, sharding):
  """((wall s, CPU s), plan) of make_plan, or (None, the error)."""
  start, cpu = time.perf_counter(), time.process_time()
  try:
    plan = make_plan(graph, profile, cluster, num_devices=g, global_batch=b,
                     device_counts=counts, sharding=sharding, amplification_limit=math.inf)
  except UserError as e:
    return None, str(e)
  return (time.perf_counter() - start, time.process_time() - cpu), plan


def app_wall_time(graph, repeats: int) -> None:
  """The plan app on a known graph against `python -c "import jax"`, run in turn, the ratio
  taken pair by pair (bench_app_start.py)."""
  with tempfile.TemporaryDirectory() as tmp:
    path = graph.save(Path(tmp) / "graph.json")
    r = app_ratio(f"graph={path} cluster=dgx_a100 cluster.num_devices=1024 batch_size=1024 "
                  f"logger=disabled chart=false out={tmp}/plan.json", repeats, Path(tmp))
  verdict = "ok" if statistics.median(r["wall"]) <= APP_LIMIT else f"over {APP_LIMIT}x"
  print(f"plan app (resnet50, G = B = 1024, graph JSON, logger=disabled chart=false) / python -c "
        f"'import jax': wall {line(r['wall'])}, cpu {line(r['cpu'])} ({verdict}, limit "
        f"{APP_LIMIT}x); median of {repeats} pairs [range]")


def joint_summary(seconds: dict[str, float | None]) -> None:
  """The joint search at G = B = JOINT_G against JOINT_LIMIT: every model, the slowest named."""
  label = f"joint search (planner.sharding=[samples,weights]) at G = B = {JOINT_G}"
  if not seconds:
    print(f"{label}: not run (no model reached G = {JOINT_G})")
    return
  failed = sorted(name for name, s in seconds.items() if s is None)
  timed = {name: s for name, s in seconds.items() if s is not None}
  over = sorted(name for name, s in timed.items() if s >= JOINT_LIMIT)
  if timed:
    worst = max(timed, key=timed.__getitem__)
    verdict = (f"over the target: {', '.join(over)}" if over
               else f"ok: every timed model under {JOINT_LIMIT:g} s")
    print(f"{label}: worst {worst} {timed[worst]:.3f} s wall against the {JOINT_LIMIT:g} s "
          f"target ({verdict}; {len(timed)} models: "
          + ", ".join(f"{n} {s:.3f} s" for n, s in timed.items()) + ")")
  if failed:
    print(f"{label}: no plan for {', '.join(failed)} (see their rows)")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", nargs="*", default=list(MODELS))
  parser.add_argument("--cluster", default=str(ROOT / "conf/cluster/dgx_a100.yaml"))
  parser.add_argument("--quick", action="store_true", help="G in {8, 64, 1024}, 960, 16384")
  parser.add_argument("--synthetic", action="store_true",
                      help="use the synthetic ResNet/Inception-sized graphs, not the zoo")
  parser.add_argument("--repeats", type=int, default=3, help="runs per app wall time")
  parser.add_argument("--no-app", action="store_true", help="skip the plan app's wall time")
  args = parser.parse_args()
  base = named_cluster(args.cluster)
  print(f"cluster {base.name}; seconds of make_plan on this machine, wall and CPU (samples: "
        f"planner.sharding=[samples]; joint: [samples,weights]); measured")
  print(f"{'model':18} {'layers':>6} {'G':>6} {'B':>6} {'counts':>6} {'samples_s':>9} "
        f"{'cpu_s':>6} {'joint_s':>8} {'cpu_s':>6} {'iter_ms':>9} {'joint_ms':>9} "
        f"{'dp_iter_ms':>10} {'gap':>6}")
  resnet, joint_at_target = None, {}
  for name in args.models:
    graph, profile, source = load_graph(name, base.device, args.synthetic)
    resnet = graph if name == "resnet50" else resnet
    print(f"# {name}: {len(graph.nodes)} layers, {len(graph.fork_join_blocks())} fork/join "
          f"blocks, from {source}")
    for g, b, counts, joint in cases(args.quick):
      cluster = base
      if g > base.pod_devices:
        cluster = dataclasses.replace(base, num_nodes=-(-g // base.devices_per_node))
      n = len(candidate_counts(PlanOptions(num_devices=g, global_batch=b, device_counts=counts,
                                           amplification_limit=math.inf)))
      head = f"{name:18} {len(graph.nodes):6} {g:6} {b:6} {n:6}"
      seconds, plan = timed_plan(graph, profile, cluster, g, b, counts, ("samples",))
      if seconds is None:
        print(f"{head}  skipped: {plan}")
        if g == b == JOINT_G and joint:
          joint_at_target[name] = None
        continue
      j_seconds, j_plan = (timed_plan(graph, profile, cluster, g, b, counts, JOINT) if joint
                           else (None, None))
      j_s = (f"{j_seconds[0]:8.3f} {j_seconds[1]:6.3f}" if j_seconds is not None
             else f"{'-':>8} {'-':>6}")
      j_ms = f"{j_plan.predicted['iteration_ms']:9.2f}" if j_seconds is not None else f"{'-':>9}"
      if g == b == JOINT_G and joint:
        joint_at_target[name] = j_seconds[0] if j_seconds is not None else None
      p, gap = plan.predicted, (j_plan if j_seconds else plan).extra["optimality"]["gap"]
      print(f"{head} {seconds[0]:9.3f} {seconds[1]:6.3f} {j_s} {p['iteration_ms']:9.2f} {j_ms} "
            f"{p['data_parallel_iteration_ms']:10.2f} {gap:6.1%}")
  joint_summary(joint_at_target)
  if not args.no_app:
    app_wall_time(resnet if resnet is not None
                  else load_graph("resnet50", base.device, args.synthetic)[0], args.repeats)


if __name__ == "__main__":
  main()
