"""Columns of a simulate-app cell, shared by the cluster_throughput and network studies."""

from __future__ import annotations

import json
from pathlib import Path

from dp_jax.simulator.metrics import matched_data_parallel
from experiments.aggregate import Row
from experiments.fields import (
  PLAN_BASIS,
  PLAN_IDENTITY,
  data_parallel_label,
  judge,
  judged,
  number,
  pick,
  plan_identity,
  ratio,
  tolerance,
  unlimited,
  verdict_columns,
)

IDENTITY = (*PLAN_IDENTITY, "background", "background_batch", "slowdown_cap")
RESULTS = (*PLAN_BASIS, "alone_iteration_ms", "iteration_ms", "data_parallel_iteration_ms",
           "speedup_vs_data_parallel_alone", "speedup_vs_data_parallel", "gpu_ms",
           "alone_idle_fraction", "idle_fraction", "samples_per_s", "background_samples_per_s",
           "background_samples_per_s_in_windows", "background_samples_per_s_on_free_devices",
           "cluster_samples_per_s", "data_parallel_samples_per_s",
           "cluster_throughput_vs_data_parallel", "best_data_parallel_devices",
           "best_data_parallel_iteration_ms", "best_data_parallel_cluster_samples_per_s",
           "cluster_throughput_vs_best_data_parallel", "matched_data_parallel_devices",
           "matched_data_parallel_iteration_ms", "matched_data_parallel_cluster_samples_per_s",
           "cluster_throughput_vs_matched_data_parallel", "cheapest_data_parallel_devices",
           "cheapest_data_parallel_gpu_ms", "gpu_time_saving_vs_cheapest_data_parallel",
           "gpu_time_saving_vs_data_parallel", "max_slowdown", "timeline_vs_planner",
           "foreground_memory_peak_gb", "background_memory_gb")
DERIVED = ("speedup_vs_best_data_parallel",)
# Every ratio the simulated studies report, judged with the cell's tolerance
# (dp_jax/report/compare.py).
COMPARED = ("cluster_throughput_vs_matched_data_parallel", "speedup_vs_best_data_parallel",
            "cluster_throughput_vs_best_data_parallel", "speedup_vs_data_parallel",
            "cluster_throughput_vs_data_parallel")
VERDICTS = ("comparison_tolerance", *verdict_columns(COMPARED))
TIMING = ("planning_s", "simulation_s")


def derive(row: Row) -> Row:
  """Identity and background settings from the config, metrics from the simulate summary; the
  matched baseline recomputed from the cell's frontier with its tolerance (one definition:
  dp_jax/simulator/metrics.py), every ratio with its margin and verdict."""
  cfg = row["config"]
  bg = cfg.get("background") or {}
  cap = unlimited(bg["slowdown_cap"]) if "slowdown_cap" in bg else None
  out = {**plan_identity(cfg), "background": bg.get("name"),
         "background_batch": bg.get("batch_per_device"), "slowdown_cap": cap,
         **pick(row, RESULTS),
         "speedup_vs_best_data_parallel": ratio(row.get("best_data_parallel_iteration_ms"),
                                                row.get("iteration_ms")),
         "comparison_tolerance": tolerance(row),
         "data_parallel_frontier": data_parallel_frontier(row)}
  it, cluster = number(out["iteration_ms"]), number(out["cluster_samples_per_s"])
  if out["data_parallel_frontier"] and it and cluster:
    matched = matched_data_parallel(out["data_parallel_frontier"], it, cluster,
                                    out["comparison_tolerance"])
    out.update({k: v for k, v in matched.items() if k in RESULTS})
  return out


def finish(rows: list[Row]) -> list[Row]:
  """Every ratio with its margin and verdict at the cell's tolerance (also for rows read back
  from a committed CSV)."""
  return [{**r, **judge(r, COMPARED)} for r in rows]


def data_parallel_frontier(row: Row) -> list[dict] | None:
  """The cell's data-parallel-plus-background frontier (its metrics.json), for figures only."""
  path = Path(row.get("dir") or "") / "metrics.json"
  if not row.get("dir") or not path.is_file():
    return None
  return json.loads(path.read_text()).get("data_parallel_frontier")


MATCHED = "cluster / (matched DP + BG)"
FOREGROUND_FAIR = "foreground / fastest DP on <= G"


def fair_points(r: Row) -> list[tuple[str, float | None]]:
  """The fair comparison of a simulated cell: the cluster throughput against the matched
  baseline, and what it costs the foreground against the fastest data parallelism on <= G;
  nothing for a plan that is data parallelism (no burst plan to judge; ratio_gaps says so)."""
  dp = data_parallel_label(r) is not None
  return [(MATCHED, None if dp else r.get("cluster_throughput_vs_matched_data_parallel")),
          (FOREGROUND_FAIR, None if dp else r.get("speedup_vs_best_data_parallel"))]


def secondary_points(r: Row) -> list[tuple[str, float | None]]:
  """The other baselines (secondary: each gives the burst job devices or time the fair one does
  not): data parallelism on its fastest d plus background, and data parallelism on all G."""
  dp = data_parallel_label(r) is not None
  return [(name, None if dp else r.get(key)) for name, key in (
      ("cluster / (fastest DP + BG)", "cluster_throughput_vs_best_data_parallel"),
      ("foreground / DP on all G", "speedup_vs_data_parallel"),
      ("cluster / DP alone on all G", "cluster_throughput_vs_data_parallel"))]


def plan_is_data_parallel(r: Row) -> list[tuple[str, str]]:
  """A cell with no point on the secondary figure: its plan is data parallelism."""
  return [("cluster / DP alone on all G", why) for _, why in ratio_gaps(r)
          if data_parallel_label(r) is not None]


def ratio_gaps(r: Row) -> list[tuple[str, str]]:
  """Why a cell has no point on the fair figure: its plan is data parallelism, or no data
  parallelism on d <= G is within the tolerance of its foreground (no matched baseline)."""
  if data_parallel_label(r) is not None:
    return [(MATCHED, "the plan is data parallelism (no burst plan to judge)")]
  if number(r.get("cluster_throughput_vs_matched_data_parallel")) is None:
    return [(MATCHED, "no DP on d <= G within the tolerance of the burst foreground "
                      "(no matched baseline)")]
  return []


def ratio_style(label: str) -> dict:
  """One fixed colour per ratio, the same in every figure; the fair baseline drawn boldest."""
  colors = {MATCHED: "tab:red", FOREGROUND_FAIR: "tab:purple",
            "cluster / (fastest DP + BG)": "tab:green", "foreground / DP on all G": "tab:blue",
            "cluster / DP alone on all G": "tab:orange"}
  return {"color": colors[label], "lw": 2.2 if label == MATCHED else 1.4}


RATIO_AXIS = "burst / baseline (x; above 1: burst better)"


def matched_label(r: Row) -> str:
  """Cluster throughput / (matched DP + BG) with its verdict and that DP's device count, or
  'none within tolerance' (no DP on d <= G has its foreground within the tolerance)."""
  d = r.get("matched_data_parallel_devices")
  if d is None:  # cells that predate the tolerance band had "at least as fast" instead
    return "none as fast" if r.get("comparison_tolerance") is None else "none within tolerance"
  return f"{judged(r, 'cluster_throughput_vs_matched_data_parallel')} @{d}"
