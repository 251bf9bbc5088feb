"""Network: how the burst gain changes as the inter-node link bandwidth falls.

    scripts/reproduce.sh network      # sweep + aggregation into results/network/
    # which runs, in .venv (S: a timestamped sweep folder):
    python -m dp_jax.simulate -m +experiment=network hydra.sweep.dir=multirun/network/S
    python -m experiments.network multirun/network/S --out results/network

Simulate app, the calibrated GPU profile (mixed bf16; scripts/validate_published.py), dgx_a100
(8 A100 per node on NVLink at
300 GB/s) with the per-GPU inter-node bandwidth overridden: 300 GB/s (NVLink-class, a flat
network as DeepPool's planner assumed), 100, 50 (InfiniBand NDR), 25 (HDR, the dgx_a100
default), 12.5 (100 GbE) and 1.25 GB/s (10 GbE); inter-node latency stays at the spec's
(20 us, plus 10.75 us per doubling of the nodes spanned). The five models at G=32 B=32 (four
nodes) and G=B=256, amplification limit 2 and inf, background `same_family` under a 10%
slowdown cap.

It shows, fair comparison first, the cluster throughput (foreground + background) against the
matched baseline (the best data parallelism plus background over every d <= G whose foreground
is within the comparison tolerance of the burst foreground; "none within tolerance": no d is),
then the foreground gain over data parallelism on its fastest d <= G devices and on all G, as
the NICs slow down, each with its verdict (a margin within +-tolerance is a tie;
dp_jax/report/compare.py). inter_node_bandwidth_GBps is per NIC, 8 NICs per node, rail-aligned
collectives (docs/cost_model.md). All numbers are simulated.
"""

from __future__ import annotations

import sys
from pathlib import Path

from experiments import plots, simulated
from experiments.aggregate import Row, Study, main
from experiments.fields import data_parallel_label, judged, limit_label, pivot, tolerance

LINK = ("inter_node_bandwidth_GBps", "inter_node_latency_us")


def derive(row: Row) -> Row:
  """The simulated columns plus the cell's inter-node link."""
  cluster = row["config"].get("cluster") or {}
  return {**simulated.derive(row), **{k: cluster.get(k) for k in LINK}}


def figures(rows: list[Row], out: Path) -> list[Path]:
  """Per A, against inter-node bandwidth, per G and model: the fair comparison (cluster
  throughput against the matched baseline, the foreground against the fastest DP on <= G),
  then the other baselines in a secondary figure."""
  paths = []
  for a in sorted({r["amplification_limit"] for r in rows}):
    sub = [r for r in rows if r["amplification_limit"] == a]
    common = dict(panel_row="num_devices", panel_col="model", x="inter_node_bandwidth_GBps",
                  logx=10, xlabel="inter-node bandwidth per GPU (GB/s)",
                  ylabel=simulated.RATIO_AXIS, style=simulated.ratio_style, reference=1.0,
                  band=tolerance(sub[0]), sharey=True,
                  absent="no cell: it failed (README.md, Failed cells)")
    paths.append(plots.grid(
        sub, out / f"network_A{limit_label(a)}.png", points=simulated.fair_points, logy=False,
        gaps=simulated.ratio_gaps, **common,
        title=f"simulated, the fair comparison: burst (A={limit_label(a)}) + background against "
              "the matched data parallelism + background as links slow down",
        caption=f"the other baselines: network_A{limit_label(a)}_secondary"))
    paths.append(plots.grid(
        sub, out / f"network_A{limit_label(a)}_secondary.png", points=simulated.secondary_points,
        gaps=simulated.plan_is_data_parallel, **common,
        title=f"simulated, secondary baselines (not the fair comparison: "
              f"network_A{limit_label(a)}): burst (A={limit_label(a)}) + background against data "
              "parallelism on its fastest d + background and alone on all G"))
  return paths


def headline(rows: list[Row]) -> str:
  """Per A and (G, B): foreground speed-up (cluster / DP) for each bandwidth."""
  bands = sorted({r["inter_node_bandwidth_GBps"] for r in rows}, reverse=True)
  parts = []
  for a in sorted({r["amplification_limit"] for r in rows}):
    for g, b in sorted({(r["num_devices"], r["global_batch"]) for r in rows}):
      sub = [r for r in rows if (r["amplification_limit"], r["num_devices"],
                                 r["global_batch"]) == (a, g, b)]
      if not sub:
        continue
      cols = [(f"{bw:g} GB/s", lambda r, bw=bw: r["inter_node_bandwidth_GBps"] == bw)
              for bw in bands]
      parts.append(f"### A={limit_label(a)}, G={g}, B={b}: cluster throughput / matched DP + "
                   "background @ its devices; foreground speed-up over data parallelism on its "
                   "fastest d <= G devices / on all G; DP on d: the plan is data parallelism "
                   "(simulated)\n\n" + pivot(
                       sub, row_key="model", cols=cols, row_header="model",
                       value=lambda r: data_parallel_label(r) or (
                           f"{simulated.matched_label(r)}; "
                           f"{judged(r, 'speedup_vs_best_data_parallel')} / "
                           f"{judged(r, 'speedup_vs_data_parallel')}")))
  return "\n".join(parts)


STUDY = Study(name="network", app="simulate", doc=__doc__,
              columns=(*simulated.IDENTITY, *LINK, *simulated.RESULTS, *simulated.DERIVED,
                       *simulated.VERDICTS),
              timing=simulated.TIMING, finish=simulated.finish, derive=derive,
              figures=figures, headline=headline,
              kind="simulated", fits=("cluster_samples_per_s",))

if __name__ == "__main__":
  sys.exit(main(STUDY))
