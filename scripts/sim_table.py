"""Results table of docs/simulator.md: burst plans with background fill vs data parallelism.

    .venv/bin/python scripts/sim_table.py [--models vgg16 ...] [--devices 8 16 32 64] [--batch 32]
                                          [--sensitivity] [--out outputs/sim_table]

DeepPool's measured A100 tables (profile source deeppool_a100), a100_nvlink_8 for G=8 and
dgx_a100 above; planner: burst, amplification limit 2 (conf/planner/burst.yaml); background:
same_family at batch 8, cap 10% (conf/background/same_family.yaml). The planner needs G <= B, so
a G larger than the batch runs at B = G (marked). Writes table.md and table.csv under --out.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import yaml

from dp_jax.base.checks import build
from dp_jax.hardware.cluster import ClusterConfig

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["model", "G", "B", "cluster", "burst ms", "DP ms", "FG speed-up vs DP",
           "idle alone", "FG ms with BG", "BG samples/s", "of which in FG windows",
           "cluster / DP", "cluster / (fastest DP + BG)", "cluster / (matched DP + BG)",
           "timeline vs planner"]


def _cfg(group: str, name: str) -> dict:
  return yaml.safe_load((REPO / "conf" / group / f"{name}.yaml").read_text())


def run_one(graph, profile, model: str, g: int, b: int, *, cap=0.1, switch_us=None,
            policy="fit", amp=2.0, flat=False, precision="fp32"):
  from dp_jax.planner import make_plan
  from dp_jax.simulator.engine import simulate
  from dp_jax.simulator.job import background_job
  from dp_jax.simulator.metrics import metrics

  name = "a100_nvlink_8" if g <= 8 else "dgx_a100"
  spec = _cfg("cluster", name)
  if flat:  # the old pricing: one ring through one NIC at line rate (dp_jax/hardware/cluster.py)
    spec.update(collectives="flat")
    name += " (flat)"
  cluster = build(ClusterConfig, spec)
  plan = make_plan(graph, profile, cluster, num_devices=g, global_batch=b,
                   amplification_limit=amp, gradient_precision=precision)
  job = background_job(graph, profile, cluster, 8, gradient_precision=precision)
  sim = simulate(graph, profile, cluster, plan, job=job, cap=cap, policy=policy,
                 switch_ms=None if switch_us is None else switch_us / 1e3)
  return name, metrics(sim)


def row(name: str, m: dict, marked: bool) -> list:
  return [m["model"], m["num_devices"], f"{m['global_batch']}{'*' if marked else ''}", name,
          f"{m['alone_iteration_ms']:.2f}", f"{m['data_parallel_iteration_ms']:.2f}",
          judged(m, "speedup_vs_data_parallel_alone"), f"{m['alone_idle_fraction']:.0%}",
          f"{m['iteration_ms']:.2f}", f"{m['background_samples_per_s']:,.0f}",
          f"{m['background_samples_per_s_in_windows']:,.0f}",
          judged(m, "cluster_throughput_vs_data_parallel"),
          judged(m, "cluster_throughput_vs_best_data_parallel"), matched(m),
          f"{m['timeline_vs_planner']:+.2%}"]


def matched(m: dict) -> str:
  """Cluster throughput over the matched-speed baseline, with its device count."""
  d = m.get("matched_data_parallel_devices")
  if d is None:
    return "no DP as fast"
  return f"{judged(m, 'cluster_throughput_vs_matched_data_parallel')} @{d}"


def judged(m: dict, ratio: str) -> str:
  """'1.18x ahead': a ratio with its verdict (dp_jax/report/compare.py)."""
  return f"{m[ratio]:.2f}x {m[ratio + '_verdict']}"


def markdown(columns: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", nargs="+",
                  default=["vgg16", "resnet50", "wide_resnet101_2", "inception_v3"])
  ap.add_argument("--devices", nargs="+", type=int, default=[8, 16, 32, 64])
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--sensitivity", action="store_true",
                  help="also vary cap and switch cost at the largest G <= batch")
  ap.add_argument("--flat", action="store_true",
                  help="the old flat pricing: every collective one ring through one link at line "
                       "rate (cluster.collectives=flat), for comparison")
  ap.add_argument("--gradient-precision", default="fp32", choices=["fp32", "bf16"],
                  help="the gradients' all-reduce precision (planner.gradient_precision)")
  ap.add_argument("--out", default="outputs/sim_table")
  args = ap.parse_args()

  from dp_jax.layer_times.deeppool_import import import_deeppool_a100
  from dp_jax.models.zoo import ModelConfig

  rows, notes, sens = [], [], []
  for model in args.models:
    graph = build(ModelConfig, _cfg("model", model)).graph()
    profile, report = import_deeppool_a100(graph)
    notes.append(f"{model}: {len(report.matched)} of {len(graph.nodes)} layers matched"
                 + (f"; missing: {', '.join(report.unmatched)}" if report.unmatched else "")
                 + (f"; backward estimated from forward: {', '.join(report.estimated)}"
                    if report.estimated else "")
                 )
    for g in args.devices:
      b = max(args.batch, g)
      name, m = run_one(graph, profile, model, g, b, flat=args.flat,
                        precision=args.gradient_precision)
      rows.append(row(name, m, b != args.batch))
      print(markdown(COLUMNS, rows[-1:]).splitlines()[-1], file=sys.stderr)
    if args.sensitivity:
      g = max(d for d in args.devices if d <= args.batch)
      for cap, switch, policy in [(0.1, None, "fit"), (0.0, None, "fit"), (0.1, 0, "fit"),
                                  (0.1, 50, "fit"), (0.1, 500, "fit"), (0.25, None, "fit"),
                                  (float("inf"), None, "fit")]:
        _, m = run_one(graph, profile, model, g, args.batch, cap=cap, switch_us=switch,
                       policy=policy, flat=args.flat, precision=args.gradient_precision)
        sens.append([model, g, f"{cap:.0%}", "5 (default)" if switch is None else switch, policy,
                     f"{m['max_slowdown']:.1%}", f"{m['background_samples_per_s']:,.0f}",
                     judged(m, "cluster_throughput_vs_data_parallel")])
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  with (out / "table.csv").open("w", newline="") as f:
    csv.writer(f).writerows([COLUMNS, *rows])
  text = markdown(COLUMNS, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
  if sens:
    text += "\n\n" + markdown(["model", "G", "cap", "switch us", "policy", "max slowdown",
                               "BG samples/s", "cluster / DP"], sens)
  (out / "table.md").write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  main()
