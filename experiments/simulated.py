"""Columns of a simulate-app cell, shared by the cluster_throughput and network studies."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.fields import PLAN_IDENTITY, pick, plan_identity, ratio, times, unlimited
from experiments.report import Row

IDENTITY = (*PLAN_IDENTITY, "background", "background_batch", "slowdown_cap")
RESULTS = ("alone_iteration_ms", "iteration_ms", "data_parallel_iteration_ms",
           "speedup_vs_data_parallel_alone", "speedup_vs_data_parallel", "gpu_ms",
           "alone_idle_fraction", "idle_fraction", "samples_per_s", "background_samples_per_s",
           "background_samples_per_s_in_windows", "background_samples_per_s_on_free_devices",
           "cluster_samples_per_s", "data_parallel_samples_per_s",
           "cluster_throughput_vs_data_parallel", "best_data_parallel_devices",
           "best_data_parallel_iteration_ms", "best_data_parallel_cluster_samples_per_s",
           "cluster_throughput_vs_best_data_parallel", "matched_data_parallel_devices",
           "matched_data_parallel_iteration_ms", "matched_data_parallel_cluster_samples_per_s",
           "cluster_throughput_vs_matched_data_parallel", "max_slowdown", "timeline_vs_planner",
           "foreground_memory_peak_gb", "background_memory_gb")
DERIVED = ("speedup_vs_best_data_parallel",)
TIMING = ("planning_s", "simulation_s")


def derive(row: Row) -> Row:
  """Identity and background settings from the config, metrics from the simulate summary."""
  cfg = row["config"]
  bg = cfg.get("background") or {}
  cap = unlimited(bg["slowdown_cap"]) if "slowdown_cap" in bg else None
  return {**plan_identity(cfg), "background": bg.get("name"),
          "background_batch": bg.get("batch_per_device"), "slowdown_cap": cap,
          **pick(row, RESULTS),
          "speedup_vs_best_data_parallel": ratio(row.get("best_data_parallel_iteration_ms"),
                                                 row.get("iteration_ms")),
          "data_parallel_frontier": data_parallel_frontier(row)}


def data_parallel_frontier(row: Row) -> list[dict] | None:
  """The cell's data-parallel-plus-background frontier (its metrics.json), for figures only."""
  path = Path(row.get("dir") or "") / "metrics.json"
  if not row.get("dir") or not path.is_file():
    return None
  return json.loads(path.read_text()).get("data_parallel_frontier")


def ratio_points(r: Row) -> list[tuple[str, float | None]]:
  """The four ratios to data parallelism a simulated cell is judged by."""
  return [("foreground speed-up vs DP", r["speedup_vs_data_parallel"]),
          ("foreground speed-up vs best DP", r["speedup_vs_best_data_parallel"]),
          ("cluster / DP", r["cluster_throughput_vs_data_parallel"]),
          ("cluster / (best DP + BG)", r["cluster_throughput_vs_best_data_parallel"]),
          ("cluster / (matched DP + BG)", r.get("cluster_throughput_vs_matched_data_parallel"))]


def ratio_style(label: str) -> dict:
  """One fixed colour per ratio, the same in every figure."""
  colors = {"foreground speed-up vs DP": "tab:blue", "cluster / DP": "tab:orange",
            "foreground speed-up vs best DP": "tab:purple",
            "cluster / (best DP + BG)": "tab:green", "cluster / (matched DP + BG)": "tab:red"}
  return {"color": colors[label]}


def matched_label(r: Row) -> str:
  """Cluster throughput / (matched DP + BG) and that DP's device count, or 'none as fast'."""
  d = r.get("matched_data_parallel_devices")
  if d is None:
    return "none as fast"
  return f"{times(r['cluster_throughput_vs_matched_data_parallel'])} @{d}"
