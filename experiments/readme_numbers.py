"""The README's numbers, computed from the one place each comes from; rewrites generated blocks.

    python -m experiments.readme_numbers [--check] [FILE ...]
    # FILE: README.md and docs/validation.md by default

A generated block is the text between `<!--experiments/readme_numbers.py:NAME-->` and
`<!--/numbers-->` (one word each: README.md counts its words); NAME picks its renderer (BLOCKS).
Text outside the markers is left as it is. Sources: the tolerances from
dp_jax/report/compare.py; the GPU model against published rows from
dp_jax/published/anchors.py (what scripts/validate_published.py prints); the local validation
from results/validation/ (validation.csv, the study's aggregate, and <model>_validation.csv, its
plans); predicted and simulated rows from the plan and simulate apps' own library calls on the
configs their README commands compose. `--check` writes nothing and exits 1 with one line naming
the first line that differs.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from dp_jax.published.anchors import CHECKS, held_out, report
from dp_jax.report.agreement import summary
from dp_jax.report.compare import (
  GPU_TOLERANCE_LARGE_BATCH,
  GPU_TOLERANCE_SMALL_BATCH,
  VALIDATED_TOLERANCE,
)

ROOT = Path(__file__).resolve().parents[1]
FILES = ("README.md", "docs/validation.md")
VALIDATION = ROOT / "results" / "validation"
START = "<!--experiments/readme_numbers.py:{name}-->"
END = "<!--/numbers-->"
_BEFORE, _AFTER = START.split("{name}")
BLOCK = re.compile(rf"({re.escape(_BEFORE)}(\w+){re.escape(_AFTER)}\n)(.*?)({re.escape(END)})",
                   re.S)
WIDTH = 99

LABELS = {"vgg16": "VGG16", "resnet50": "ResNet-50", "wide_resnet101_2": "WRN-101-2",
          "inception_v3": "Inception-v3", "vit": "ViT (DeepPool's)",
          "gpt2": "GPT-2 small (1024 tokens)"}
CELL_LABELS = {"vgg16_32": "VGG16 32x32", "gpt2_tiny": "tiny GPT-2"}
OPTIMIZERS = {"momentum": "momentum SGD", "sgd": "SGD"}

# The headline table's commands: each row's overrides are what its command names.
BF16 = "planner.gradient_precision=bf16"
SERVER = ("cluster=a100_nvlink_8", "planner.amplification_limit=inf")
DGX_32 = ("cluster=dgx_a100", "cluster.num_devices=32", "planner.amplification_limit=inf")
SIM_32 = ("cluster=dgx_a100", "cluster.num_devices=32", "background=same_family")
SIM_SERVER = ("background=same_family",)
PLANNED_32 = ("vgg16", "resnet50", "wide_resnet101_2", "inception_v3", "vit", "gpt2")
SIMULATED = ("resnet50", "inception_v3", "wide_resnet101_2")
SIMULATED_SERVER = ("vgg16", "resnet50", "inception_v3", "wide_resnet101_2")


# --- sources --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
  """A plan app run's summary (its status.json), with the plan and graph behind it."""

  summary: dict[str, Any]
  plan: Any
  graph: Any
  optimizer: str


@cache
def planned(*overrides: str) -> Planned:
  """What `python -m dp_jax.plan overrides...` plans and summarizes (no files written)."""
  from dp_jax import plan as plan_app  # the app's config: only for the predicted rows
  from dp_jax.cli.hydra_app import app_config
  from dp_jax.report.plan_report import plan_summary

  cfg = app_config(plan_app.main, list(overrides))
  made = plan_app.make(cfg)
  return Planned(plan_summary(made.plan, made.fair, Path("plan.json")), made.plan, made.graph,
                 cfg.planner.optimizer)


@cache
def simulated(*overrides: str) -> dict[str, Any]:
  """The metrics `python -m dp_jax.simulate overrides...` computes (no files written)."""
  from dp_jax import simulate as sim_app  # the app's config: only for the simulated rows
  from dp_jax.cli.hydra_app import app_config

  cfg = app_config(sim_app.main, list(overrides))
  if cfg.background.model is not None:
    raise ValueError("a background job of another model is not rendered here")
  return sim_app.simulated(cfg).metrics


@dataclass(frozen=True)
class Published:
  """The GPU model against published rows: (check, regime) -> median of group medians, each
  regime's tolerance, and the absolute error (median of group medians, over `groups`)."""

  checks: dict[tuple[str, str], float | None]
  tolerances: dict[str, float]
  absolute: float
  groups: int


def published() -> Published:
  """scripts/validate_published.py's numbers (dp_jax/published/anchors.py): each relative
  check's median of group medians per regime, each regime's tolerance, and the absolute
  held-out error (framework-dependent)."""
  rep = report()
  checks = {}
  for check in CHECKS:
    for regime, tol in rep.tolerances.items():
      groups = tol.by_check(check)
      checks[check, regime] = statistics.median(g.median for g in groups) if groups else None
  h = held_out(rep.absolute)
  return Published(checks, {r: t.value for r, t in rep.tolerances.items()}, h.group_median,
                   h.groups)


@dataclass(frozen=True)
class Validated:
  """One model's local validation: its cell's error summary."""

  label: str
  model: str
  plans: int
  median: float
  worst: float
  spearman: float | None
  median_ratio: float


def local_validation(folder: Path = VALIDATION) -> list[Validated]:
  """The validation study's per-model summaries (results/validation/validation.csv, ok cells)."""
  out = []
  with (folder / "validation.csv").open() as f:
    for row in csv.DictReader(f):
      if row["status"] != "ok":
        continue
      cell = re.search(r"validation_cell=(\S+)", row["cell"])
      name = cell.group(1) if cell else row["model"]
      spearman = row["spearman"]
      out.append(Validated(CELL_LABELS.get(name, name), row["model"], int(row["plans"]),
                           float(row["median_abs_pct_error"]), float(row["max_abs_pct_error"]),
                           float(spearman) if spearman else None, float(row["median_ratio"])))
  return out


def all_plans_median(folder: Path = VALIDATION) -> tuple[int, float]:
  """(plans, median |error| %) over every plan of the local validation (<model>_validation.csv):
  what the CPU tolerance is (dp_jax/report/compare.py)."""
  predicted, measured = [], []
  for v in local_validation(folder):
    with (folder / f"{v.model}_validation.csv").open() as f:
      for row in csv.DictReader(f):
        predicted.append(float(row["predicted_ms"]))
        measured.append(float(row["measured_ms"]))
  s = summary(predicted, measured)
  return int(s["plans"]), float(s["median_abs_pct_error"])


# --- words ----------------------------------------------------------------------------------


def paragraph(text: str, indent: str = "") -> list[str]:
  """Text wrapped at WIDTH; continuation lines indented by `indent` (a bullet's two spaces)."""
  return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_long_words=False,
                       break_on_hyphens=False)


def pct(x: float) -> str:
  """0.076 -> '7.6%'."""
  return f"{x:.1%}"


def basis_parts(basis: str) -> tuple[str, str, str]:
  """'fp32 gradients; calibrated ... profile; A=inf; ties within ...' -> its (gradients,
  profile, A) parts."""
  gradients, profile, limit = basis.split("; ")[:3]
  return gradients, profile, limit


def only(values: Iterable[str], what: str) -> str:
  """The one value all of `values` share (a ValueError naming `what` when they differ)."""
  distinct = sorted(set(values))
  if len(distinct) != 1:
    raise ValueError(f"the rows differ in {what}: {', '.join(distinct)}")
  return distinct[0]


def plan_pair(fp32: dict[str, Any], bf16: dict[str, Any]) -> str:
  """A row's fp32 and bf16 plan summaries in words; one clause when both plans are data
  parallelism on the same d, the fastest and on every device."""
  d = fp32["plan_data_parallel_devices"]
  plain = [d == s["plan_data_parallel_devices"] == s["best_data_parallel_devices"]
           == s["num_devices"] for s in (fp32, bf16)]
  if d is not None and all(plain):
    return (f"the plan is data parallelism on {d} ({fp32['iteration_ms']:.2f} ms; bf16 "
            f"{bf16['iteration_ms']:.2f} ms)")
  return f"{plan_outcome(fp32)}; bf16: {plan_outcome(bf16, fp32)}"


def plan_outcome(s: dict[str, Any], same_as: dict[str, Any] | None = None) -> str:
  """A plan summary in words: the plan is data parallelism, or burst vs the fastest DP.
  same_as: the fp32 row's summary when this is its bf16 twin (shorter words)."""
  d, best = s["plan_data_parallel_devices"], s["best_data_parallel_devices"]
  if d is not None:
    if same_as is not None and same_as["plan_data_parallel_devices"] == d:
      return f"the same ({s['iteration_ms']:.2f} ms)"
    text = f"the plan is data parallelism on {d} ({s['iteration_ms']:.2f} ms"
    if d != best:
      text += (f"; fastest DP, on {best}: {s['best_data_parallel_iteration_ms']:.2f} ms, "
               f"{s['speedup_vs_best_data_parallel']:.2f}x, "
               f"{s['speedup_vs_best_data_parallel_verdict']}")
    if d != s["num_devices"]:
      text += f"; DP on all {s['num_devices']}: {s['data_parallel_iteration_ms']:.2f} ms"
    return text + ")"
  where = ("" if same_as is not None and same_as["plan_data_parallel_devices"] is None
           and same_as["best_data_parallel_devices"] == best else f" (DP on {best})")
  return (f"{s['iteration_ms']:.2f} vs {s['best_data_parallel_iteration_ms']:.2f} ms{where}: "
          f"{s['speedup_vs_best_data_parallel']:.2f}x, "
          f"{s['speedup_vs_best_data_parallel_verdict']}")


def foreground(m: dict[str, Any], versus: str = " vs the fastest DP") -> str:
  """A simulation's foreground against the fastest DP, or that the plan is DP on d."""
  d = m["plan_data_parallel_devices"]
  if d is not None:
    return f"the plan is data parallelism on {d}"
  return (f"foreground {m['speedup_vs_best_data_parallel_alone']:.2f}x "
          f"({m['speedup_vs_best_data_parallel_alone_verdict']}){versus}")


def cluster_throughput(m: dict[str, Any]) -> str:
  """A simulation's cluster throughput against the matched baseline (or DP alone on all G when
  no data parallelism is as fast as the foreground)."""
  d = m.get("matched_data_parallel_devices")
  if d is None:
    return (f"no matched baseline; cluster throughput vs DP alone on all "
            f"{m['num_devices']}: {m['cluster_throughput_vs_data_parallel']:.2f}x, "
            f"{m['cluster_throughput_vs_data_parallel_verdict']}")
  return (f"cluster throughput vs matched DP on {d} + background "
          f"{m['cluster_throughput_vs_matched_data_parallel']:.2f}x, "
          f"{m['cluster_throughput_vs_matched_data_parallel_verdict']}")


def short_foreground(m: dict[str, Any]) -> str:
  d = m["plan_data_parallel_devices"]
  return (f"DP on {d}" if d is not None else
          f"{m['speedup_vs_best_data_parallel_alone']:.2f}x "
          f"{m['speedup_vs_best_data_parallel_alone_verdict']}")


def short_cluster(m: dict[str, Any], devices: bool) -> str:
  d = m.get("matched_data_parallel_devices")
  if d is None:
    return (f"no matched DP ({m['cluster_throughput_vs_data_parallel']:.2f}x vs DP on all "
            f"{m['num_devices']})")
  text = (f"{m['cluster_throughput_vs_matched_data_parallel']:.2f}x "
          f"{m['cluster_throughput_vs_matched_data_parallel_verdict']}")
  return f"{text} (DP on {d})" if devices else text


def offloaded_parameters(p: Planned) -> str:
  """', its layers holding 124 M of its 138 M parameters run on 1 device instead of being
  all-reduced over 32' (empty when every layer with parameters is on all devices)."""
  g = p.plan.num_devices
  params = {n.name: n.params for n in p.graph.nodes}
  narrow = [lp for lp in p.plan.layers if len(lp.devices) < g and params.get(lp.name)]
  if not narrow:
    return ""
  counts = sorted({len(lp.devices) for lp in narrow})
  on = " or ".join(str(c) for c in counts)
  held = sum(params[lp.name] for lp in narrow) / 1e6
  return (f": {held:.0f} M of its {sum(params.values()) / 1e6:.0f} M "
          f"parameters run on {on} device{'s' if counts != [1] else ''}, not all-reduced "
          f"over {g}")


# --- the blocks -----------------------------------------------------------------------------


class Facts:
  """Every number the blocks quote; the cheap ones read on first use, the predicted and
  simulated ones planned on first use."""

  @cached_property
  def tolerances(self) -> tuple[float, float, float]:
    """(GPU at per-GPU batch <= 8, GPU above, CPU) tolerance of verdicts."""
    return GPU_TOLERANCE_SMALL_BATCH, GPU_TOLERANCE_LARGE_BATCH, VALIDATED_TOLERANCE

  @cached_property
  def published(self) -> Published:
    return published()

  @cached_property
  def validation(self) -> list[Validated]:
    return local_validation()

  @cached_property
  def all_plans(self) -> tuple[int, float]:
    return all_plans_median()

  def plan(self, model: str, base: tuple[str, ...], bf16: bool = False) -> Planned:
    return planned(f"model={model}", *base, *((BF16,) if bf16 else ()))

  def sim(self, model: str, base: tuple[str, ...], bf16: bool = False) -> dict[str, Any]:
    return simulated(f"model={model}", *base, *((BF16,) if bf16 else ()))


Part = Callable[[Facts], list[str]]


def tolerance_paragraph(f: Facts) -> list[str]:
  small, large, cpu = f.tolerances
  return paragraph(
      "Numbers are **predicted** (the cost model), **simulated** or **measured** (a run here). "
      "Comparisons lead with the fair baseline: the fastest data parallelism (DP) on d <= G "
      "devices; with background jobs, the **matched** baseline (the best DP on d plus "
      "background on G - d, over every d whose foreground is within the tolerance of burst's). "
      "A margin inside the validated error is a **tie** (`dp_jax/report/compare.py`): on GPUs "
      f"**{pct(small)}** at per-GPU batches B / G of 8 or less and **{pct(large)}** above, "
      "each the median over independent groups of relative checks against published "
      "measurements (scaling between two scales of one table, small-batch step time, all-reduce "
      "bus bandwidth: `scripts/validate_published.py`; no GPU was lent to this work, so GPU "
      f"verdicts rest on those rows alone); on this machine's CPU {pct(cpu)}.")


def planned_bullet(f: Facts) -> list[str]:
  """Which zoo models' burst plans beat the fastest DP on 32 DGX A100 GPUs, and the rest."""
  rows = {m: (f.plan(m, DGX_32), f.plan(m, DGX_32, bf16=True)) for m in PLANNED_32}
  first = rows[PLANNED_32[0]][0]
  _, profile, limit = basis_parts(first.summary["basis"])
  head = (f"On {first.summary['num_devices']} DGX A100 GPUs ({profile}, {limit}, "
          f"B={first.summary['global_batch']})")

  def verdict(p: Planned) -> str:
    s = p.summary
    return "dp" if s["plan_data_parallel_devices"] is not None else \
        s["speedup_vs_best_data_parallel_verdict"]

  sentences = []
  for m, (fp32, bf16) in rows.items():
    if "ahead" not in (verdict(fp32), verdict(bf16)):
      continue
    pair = [(p.summary["speedup_vs_best_data_parallel"], verdict(p)) for p in (fp32, bf16)]
    if {v for _, v in pair} == {"ahead"}:
      beyond = pct(fp32.summary["comparison_tolerance"])
      by = (f"by {pair[0][0]:.2f}x with fp32 gradients and {pair[1][0]:.2f}x with bf16 "
            f"(ahead beyond {beyond})")
    else:
      by = " and ".join(f"{r:.2f}x ({v}) with {g}" for (r, v), g in
                        zip(pair, ("fp32 gradients", "bf16"), strict=True))
      by = f"by {by}"
    sentences.append(f"{LABELS[m]}'s fastest burst plan beats data parallelism {by}"
                     f"{offloaded_parameters(fp32)}.")
  g = first.summary["num_devices"]
  rest = [m for m, pair in rows.items() if "ahead" not in {verdict(p) for p in pair}]
  behind = [m for m in rest if "behind" in {verdict(p) for p in rows[m]}]
  level = [m for m in rest if m not in behind]
  tail = []
  if level:
    kinds = frozenset(verdict(p) for m in level for p in rows[m])
    relation = {frozenset({"tie", "dp"}): "tie with, or are,", frozenset({"tie"}): "tie with",
                frozenset({"dp"}): "are"}[kinds]
    subject = ("The other zoo models" if sentences else "The zoo models") if not behind else \
        ", ".join(LABELS[m] for m in level)
    tail.append(f"{subject} {relation} the fastest data parallelism on <= {g} devices.")
  if behind:
    tail.append(f"{', '.join(LABELS[m] for m in behind)} {'is' if len(behind) == 1 else 'are'}"
                " behind it with some gradient precision.")
  return paragraph(" ".join([f"- {head}", *sentences, *tail]), indent="  ")


def simulated_bullet(f: Facts) -> list[str]:
  """Where the burst foreground is behind the fastest DP with background jobs, and how the
  cluster throughput compares with the matched baseline and with DP alone on all G."""
  sims = {m: f.sim(m, SIM_32) for m in ("vgg16", *SIMULATED)}
  every = [*sims.values(), f.sim("vgg16", SIM_32, bf16=True)]
  gradients, _, limit = basis_parts(only((m["basis"] for m in sims.values()), "basis"))
  behind = [m for m, s in sims.items() if s["plan_data_parallel_devices"] is None
            and s["speedup_vs_best_data_parallel_alone_verdict"] == "behind"]
  g = every[0]["num_devices"]
  alone = [m["cluster_throughput_vs_data_parallel"] for m in every]
  span = f"{min(alone):.1f}-{max(alone):.1f}x"
  head = f"- With background jobs (simulated; {gradients}, {limit})"
  if not behind:
    return paragraph(f"{head} no burst foreground is behind the fastest data parallelism; "
                     f"against DP alone on all {g} the cluster throughput reads {span}.",
                     indent="  ")
  fg = " and ".join(f"{LABELS[m]} ({sims[m]['speedup_vs_best_data_parallel_alone']:.2f}x)"
                    for m in behind)
  verdicts = {sims[m].get("cluster_throughput_vs_matched_data_parallel_verdict") for m in behind}
  verbs = {"tie": "ties", "ahead": "beats", "behind": "trails"}
  if len(verdicts) == 1 and None not in verdicts:
    ratios = ", ".join(f"{sims[m]['cluster_throughput_vs_matched_data_parallel']:.2f}x"
                       for m in behind)
    cluster = f"cluster throughput {verbs[verdicts.pop()]} the matched baseline ({ratios})"
  else:
    cluster = "cluster throughput against the matched baseline reads " + ", ".join(
        short_cluster(sims[m], devices=True) for m in behind)
  return paragraph(
      f"{head} the burst foreground is behind the fastest data parallelism for {fg} while "
      f"{cluster}; against DP alone on all {g} it reads {span}, mostly devices the burst plan "
      "leaves idle, which DP on fewer devices lends as well.", indent="  ")


def validation_bullet(f: Facts) -> list[str]:
  p, local = f.published, f.validation
  c = p.checks
  medians = " and ".join(f"{pct(v.median / 100)} ({v.label}, {v.plans} plans)" for v in local)
  return paragraph(
      "- Against published GPU measurements (median of group medians; docs/validation.md): "
      f"scaling between two scales of a table within {pct(c['scaling', 'large'])}, all-reduce "
      f"bus bandwidth from 1 MiB within {pct(c['allreduce', 'small'])}; the step time at "
      f"per-GPU batches of 8 or less misses by {pct(c['small_batch', 'small'])} "
      f"({pct(c['small_batch', 'large'])} above), so a small-batch verdict whose margin comes "
      "from layer compute rests on a weak model. On the local devices it predicted measured "
      f"step times within a median {medians}.", indent="  ")


def blank(f: Facts) -> list[str]:
  return [""]


def headline_caption(f: Facts) -> list[str]:
  """What every verdict of the table rests on: profile, gradients, A, B, optimizer."""
  plans = [f.plan("vgg16", SERVER), *(f.plan(m, DGX_32) for m in PLANNED_32)]
  sims = [f.sim(m, SIM_32) for m in ("vgg16", *SIMULATED)]
  plan_parts = [basis_parts(p.summary["basis"]) for p in plans]
  sim_parts = [basis_parts(m["basis"]) for m in sims]
  profile = only((x[1] for x in plan_parts + sim_parts), "profile")
  gradients = only((x[0] for x in plan_parts + sim_parts), "gradient precision")
  a_plans = only((x[2] for x in plan_parts), "A")
  a_sims = only((x[2] for x in sim_parts), "A")
  batch = only((str(p.summary["global_batch"]) for p in plans), "B")
  optimizer = only((OPTIMIZERS.get(p.optimizer, p.optimizer) for p in plans), "optimizer")
  return paragraph(
      f"Verdicts rest on the {profile}, {gradients} (bf16 where named), {a_plans} (plans) or "
      f"{a_sims} (simulated), B={batch}, {optimizer}; one command per row. Ties: within the GPU "
      f"tolerance of the per-GPU batch B / G, {pct(f.tolerances[0])} at 8 or less (every row "
      f"here), {pct(f.tolerances[1])} above.")


def table_head(f: Facts) -> list[str]:
  return ["| what | result | command |", "| --- | --- | --- |"]


def planned_rows(f: Facts) -> list[str]:
  """The predicted rows: VGG16 on one server, then every zoo model on 32 DGX A100 GPUs."""
  server = (f.plan("vgg16", SERVER).summary, f.plan("vgg16", SERVER, bf16=True).summary)
  plan = "python -m dp_jax.plan"
  rows = [f"| VGG16, one 8-GPU NVLink server, fastest plan | predicted: {plan_pair(*server)}"
          f" | `{plan} model=vgg16 "
          f"{' '.join(SERVER)}` (+ `{BF16}`) |"]
  for i, m in enumerate(PLANNED_32):
    fp32, bf16 = f.plan(m, DGX_32).summary, f.plan(m, DGX_32, bf16=True).summary
    what = (f"{LABELS[m]}, {fp32['num_devices']} DGX A100 GPUs, fastest plan" if i == 0 else
            f"{LABELS[m]}, the same")
    result = plan_pair(fp32, bf16)
    command = (f"`{plan} model={m} {' '.join(DGX_32)}` (+ `{BF16}`)" if i == 0 else
               f"the same with `model={m}`" if i == 1 else f"`model={m}`")
    rows.append(f"| {what} | {'predicted: ' if i == 0 else ''}{result} | {command} |")
  return rows


def simulated_rows(f: Facts) -> list[str]:
  """The simulated rows at A=2 with a background job of the same model."""
  vgg, vgg_bf16 = f.sim("vgg16", SIM_32), f.sim("vgg16", SIM_32, bf16=True)
  limit = basis_parts(vgg["basis"])[2]
  sim = "python -m dp_jax.simulate"
  first = (f"| VGG16, {vgg['num_devices']} GPUs, {limit}, background same model at batch "
           f"{vgg['background_batch']}, cap {vgg['slowdown_cap']:.0%} | simulated: "
           f"{foreground(vgg)}; {cluster_throughput(vgg)}; bf16: {foreground(vgg_bf16, '')}, "
           f"{cluster_throughput(vgg_bf16)} | `{sim} model=vgg16 {' '.join(SIM_32)}` |")
  same = [f.sim(m, SIM_32) for m in SIMULATED]
  second = (f"| {' / '.join(LABELS[m] for m in SIMULATED)}, the same | simulated: foreground vs "
            f"fastest DP {' / '.join(short_foreground(m) for m in same)}; cluster throughput vs "
            f"matched DP + background {' / '.join(short_cluster(m, True) for m in same)} | the "
            "same with each `model=` |")
  server = [f.sim(m, SIM_SERVER) for m in SIMULATED_SERVER]
  third = (f"| one {server[0]['num_devices']}-GPU server, {limit}, background: "
           f"{' / '.join(LABELS[m] for m in SIMULATED_SERVER)} | simulated vs matched DP + "
           f"background: {' / '.join(short_cluster(m, False) for m in server)} | "
           f"`{sim} model=vgg16 {' '.join(SIM_SERVER)}` (and each `model=`) |")
  return [first, second, third]


def published_row(f: Facts) -> list[str]:
  p, c = f.published, f.published.checks
  return [f"| GPU model vs published measurements | relative checks, median of group medians "
          f"(per-GPU batch <= 8 / > 8): scaling {pct(c['scaling', 'small'])} / "
          f"{pct(c['scaling', 'large'])}, small-batch step time "
          f"{pct(c['small_batch', 'small'])} / {pct(c['small_batch', 'large'])}, all-reduce "
          f"{pct(c['allreduce', 'small'])}; tolerance {pct(p.tolerances['small'])} / "
          f"{pct(p.tolerances['large'])}; absolute throughput {pct(p.absolute)} "
          f"(framework-dependent, {p.groups} groups) | `python scripts/validate_published.py` |"]


def local_row(f: Facts) -> list[str]:
  local = f.validation
  errors = ", ".join(f"{pct(v.median / 100)} ({v.label}, {v.plans} plans; max "
                     f"{pct(v.worst / 100)})" for v in local)
  ranks = ", ".join("-" if v.spearman is None else f"{v.spearman:.2f}" for v in local)
  return [f"| cost model vs the runtime, local devices (one per core) | measured: median error "
          f"{errors}; Spearman {ranks} | `scripts/reproduce.sh validation` |"]


def validation_results(f: Facts) -> list[str]:
  """docs/validation.md: the committed local validation, per model and over every plan."""
  local = f.validation
  per_model = "; ".join(
      f"{v.label}, {v.plans} plans: median error {pct(v.median / 100)}, max "
      f"{pct(v.worst / 100)}, Spearman {'-' if v.spearman is None else f'{v.spearman:.2f}'}, "
      f"median predicted / measured {v.median_ratio:.2f}" for v in local)
  plans, median = f.all_plans
  return paragraph(f"{per_model}. Over the {plans} plans the median |error| is "
                   f"{pct(median / 100)} (`dp_jax.report.compare.VALIDATED_TOLERANCE` "
                   f"{pct(f.tolerances[2])}, the CPU's validated tolerance).")


def published_table(f: Facts) -> list[str]:
  """docs/validation.md: each relative check's median of group medians per regime, and each
  regime's tolerance (scripts/validate_published.py's last lines)."""
  p = f.published
  rep_groups = report().tolerances
  titles = {"scaling": "(a) scaling between two scales of a table",
            "small_batch": "(b) small-batch step time, leave-one-model-out",
            "allreduce": "(c) all-reduce bus bandwidth from 1 MiB"}

  def cell(check: str, regime: str) -> str:
    n = len(rep_groups[regime].by_check(check))
    value = p.checks[check, regime]
    return "-" if value is None else f"{pct(value)} ({n} group{'s' if n != 1 else ''})"

  rows = [f"| {titles[c]} | {cell(c, 'small')} | {cell(c, 'large')} |" for c in CHECKS]
  counts = {r: len(t.groups) for r, t in rep_groups.items()}
  return ["| check | per-GPU batch <= 8 | per-GPU batch > 8 |", "| --- | --- | --- |", *rows,
          f"| **GPU tolerance** (median of all group medians) | **{pct(p.tolerances['small'])}**"
          f" ({counts['small']} groups) | **{pct(p.tolerances['large'])}** ({counts['large']} "
          "groups) |"]


def where_burst_pays_bullet(f: Facts) -> list[str]:
  """The where_burst_pays study's answer (results/where_burst_pays/, read from its CSV)."""
  from experiments import where_burst_pays
  from experiments.aggregate import load_csv, ok
  folder = ROOT / "results" / "where_burst_pays"
  rows = ok(load_csv(where_burst_pays.STUDY, folder)[0])
  return paragraph("- Today's models ([where_burst_pays](results/where_burst_pays/)): "
                   + where_burst_pays.brief(rows), "  ")


# Each block's parts in order; CHEAP: the parts that need no planning (read from files).
BLOCKS: dict[str, tuple[Part, ...]] = {
    "finds": (tolerance_paragraph, blank, planned_bullet, simulated_bullet, validation_bullet,
              where_burst_pays_bullet),
    "headline": (headline_caption, blank, table_head, planned_rows, simulated_rows,
                 published_row, local_row),
    "validation": (validation_results,),
    "published": (published_table,),
}
CHEAP = (tolerance_paragraph, blank, validation_bullet, where_burst_pays_bullet, table_head,
         published_row, local_row, validation_results, published_table)


def render_block(name: str, facts: Facts) -> str:
  """The text between a block's markers (ending in a newline)."""
  if name not in BLOCKS:
    raise ValueError(f"unknown generated block '{name}' (known: {', '.join(BLOCKS)})")
  return "".join(line + "\n" for part in BLOCKS[name] for line in part(facts))


def block_names(text: str) -> list[str]:
  """The names of the generated blocks in `text`, in order."""
  return [m.group(2) for m in BLOCK.finditer(text)]


def blocks(text: str) -> dict[str, str]:
  """Each generated block's current text by name."""
  return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def rewrite(text: str, facts: Facts) -> str:
  """`text` with every generated block rendered anew; the rest as it was."""
  return BLOCK.sub(lambda m: m.group(1) + render_block(m.group(2), facts) + m.group(4), text)


def stale_line(text: str, facts: Facts) -> tuple[int, str] | None:
  """(1-based line number, its text) of the first generated line of `text` that differs from
  what would be written, or None. Parts render in order, so none past the first difference:
  an edited number in a cheap part is found without planning anything."""
  for m in BLOCK.finditer(text):
    first = text.count("\n", 0, m.start(3)) + 1
    current = m.group(3).splitlines()
    i = 0
    for part in BLOCKS.get(m.group(2), ()):
      for line in part(facts):
        if i >= len(current) or current[i] != line:
          return first + i, current[i] if i < len(current) else m.group(4)
        i += 1
    if i < len(current):
      return first + i, current[i] if i < len(current) else m.group(4)
  return None


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--check", action="store_true",
                  help="write nothing; exit 1 when a file differs from what would be written")
  ap.add_argument("files", nargs="*", type=Path,
                  help=f"files with generated blocks (default: {' '.join(FILES)})")
  args = ap.parse_args(argv)
  paths = args.files or [ROOT / f for f in FILES]
  facts, t0 = Facts(), time.perf_counter()
  for path in paths:
    text = path.read_text()
    if not block_names(text):
      print(f"error: {path} has no generated block ({START.format(name='NAME')} ... {END})",
            file=sys.stderr)
      return 2
    unknown = [n for n in block_names(text) if n not in BLOCKS]
    if unknown:
      print(f"error: {path}: unknown generated block '{unknown[0]}' (known: "
            f"{', '.join(BLOCKS)})", file=sys.stderr)
      return 2
    if args.check:
      stale = stale_line(text, facts)
      if stale:
        print(f"{path}:{stale[0]}: differs from what experiments/readme_numbers.py writes "
              f"(run python -m experiments.readme_numbers): {stale[1].strip()[:120]}",
              file=sys.stderr)
        return 1
    elif (new := rewrite(text, facts)) != text:
      path.write_text(new)
      print(f"rewrote {path}")
  print(f"{'checked' if args.check else 'rendered'} {len(paths)} file(s) in "
        f"{time.perf_counter() - t0:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
