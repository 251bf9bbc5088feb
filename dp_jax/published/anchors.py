"""Published measurements the GPU model answers to: the anchors table, each row's prediction, the
held-out error and the fit of the calibrated profile.

A training row is predicted by the planner's own evaluation (dp_jax/planner/evaluate.py) of the
row's model on its cluster, every layer on all its GPUs (data parallelism; with tensor
parallelism m, the transformer blocks split by heads and the logits by vocabulary on a (G/m, m)
mesh), under the calibrated profile (dp_jax/layer_times/calibrated.py) and the row's setup; an
all-reduce row by the cluster's collective model (dp_jax/hardware/cluster.py). The figure is
converted to
the row's unit. Nothing here is fitted to a held-out row: fit_calibration reads the fit rows only.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dp_jax.base.checks import build
from dp_jax.base.errors import UserError
from dp_jax.hardware.cluster import allreduce_ms, named_cluster
from dp_jax.hardware.devices import get_device
from dp_jax.layer_times.analytic import analytic_profile, layer_times_ms
from dp_jax.layer_times.calibrated import (
  CALIBRATION,
  Calibration,
  calibrated_profile,
  layer_model,
  precision_class,
)
from dp_jax.layer_times.deeppool_import import import_deeppool_a100
from dp_jax.layer_times.sources import profile_batches
from dp_jax.models.zoo import ModelConfig
from dp_jax.planner import evaluate_plan
from dp_jax.planner.sharding import Strategy, splits_for

ANCHORS_FILE = Path(__file__).resolve().parent / "anchors.yaml"
SCHEMA = "dp_jax.anchors/2"
ROLES = ("fit", "held_out", "not_modelled")
UNITS = ("images/s", "sequences/s", "tflops_per_device", "ms_per_iteration", "tokens/s/gpu")
SETUP_KEYS = ("optimizer", "gradient_precision", "overlap_allreduce", "batch_norm", "recompute",
              "state")
RECOMPUTE = (False, True, "alternate")  # none, every layer, every second transformer block
STATES = ("replicated", "optimizer", "full")  # a layer's state over its data-parallel GPUs
REGIMES = ("small", "large")
SMALL_BATCH_MAX = 8  # per-GPU batch of the small regime (<= 8)


def regime_of(per_device_batch: float) -> str:
  """'small' for a per-GPU batch of SMALL_BATCH_MAX or less, else 'large'."""
  return "small" if per_device_batch <= SMALL_BATCH_MAX else "large"


@dataclass(frozen=True)
class Anchor:
  """One published training measurement and the setup the model reproduces it with."""

  id: str
  role: str
  why: str
  group: tuple[str, str, str]  # (model, hardware, source table)
  regime: str
  source: str
  hardware: str
  measured: float
  unit: str
  cluster: str = "dgx_a100"
  device: str | None = None
  gpus: int = 1
  model: Mapping[str, Any] | None = None  # a model config (zoo name -> {"name": ...})
  precision: str = "mixed fp16"
  batch_per_device: int | None = None
  global_batch: int | None = None
  accumulation: int = 1  # micro-batches per optimizer step (one all-reduce, one update)
  tensor_parallel: int = 1
  setup: Mapping[str, Any] = field(default_factory=dict)
  flops: str | None = None
  scaling_only: bool = False  # a fit benchmark at another scale: judged by the scaling check only

  @property
  def kind(self) -> str:
    return "training"

  @property
  def batch(self) -> int:
    """The global batch B of one micro-batch (every GPU's samples)."""
    return self.global_batch or self.gpus * int(self.batch_per_device or 0)

  @property
  def per_device_batch(self) -> float:
    """Samples per GPU and micro-batch (per data-parallel replica under tensor parallelism)."""
    return self.batch * self.tensor_parallel / self.gpus


@dataclass(frozen=True)
class ScalingPair:
  """(a) Two scales of one published table: the per-GPU efficiency of `scaled` over `base`."""

  id: str
  role: str
  base: Anchor
  scaled: Anchor
  group: tuple[str, str, str]
  regime: str

  @property
  def published(self) -> float:
    """(throughput(G) / G) / (throughput(G0) / G0), as published."""
    return _per_gpu(self.scaled, self.scaled.measured) / _per_gpu(self.base, self.base.measured)


@dataclass(frozen=True)
class Curve:
  """(c) Published all-reduce bus bandwidth (GB/s) at message sizes (bytes) on one setup."""

  id: str
  role: str
  why: str
  group: tuple[str, str, str]
  source: str
  hardware: str
  cluster: str
  nodes: int
  gpus_per_node: int
  nics_per_node: int
  points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class SmallBatchTable:
  """(b) One DeepPool per-layer A100 table: the model it times, its batches and reference."""

  id: str
  role: str
  model: str
  table: str
  group: tuple[str, str, str]
  batches: tuple[int, ...]
  reference: int


@dataclass(frozen=True)
class Published:
  """The whole table: absolute rows, scaling pairs, all-reduce curves, small-batch tables and
  the small-batch shape's grid."""

  rows: tuple[Anchor, ...]
  scaling: tuple[ScalingPair, ...]
  allreduce: tuple[Curve, ...]
  small_batch: tuple[SmallBatchTable, ...]
  grid: Mapping[str, tuple[float, ...]]


PER_GPU_UNITS = ("tokens/s/gpu", "tflops_per_device")  # already per GPU


def _per_gpu(anchor: Anchor, value: float) -> float:
  """A throughput per GPU (images/s or sequences/s over the row's GPUs; tokens/s/gpu as is)."""
  return value if anchor.unit in PER_GPU_UNITS else value / anchor.gpus


def load_anchors(path: str | Path = ANCHORS_FILE) -> list[Anchor]:
  """The table's absolute training rows, checked (one-line errors naming the row)."""
  return list(load_published(path).rows)


@cache
def _load_cached(path: str) -> Published:
  return _load(Path(path))


def load_published(path: str | Path = ANCHORS_FILE) -> Published:
  """Every section of the table, checked: one-line errors naming the row."""
  return _load_cached(str(Path(path).resolve()))


def _load(path: Path) -> Published:
  try:
    data = yaml.safe_load(path.read_text())
  except (OSError, yaml.YAMLError) as e:
    raise UserError(f"{path}: cannot read the published-anchors table ({e})") from None
  if not isinstance(data, dict) or data.get("schema") != SCHEMA:
    raise UserError(f"{path}: not a published-anchors table (schema {SCHEMA})")
  models, setups = data.get("models") or {}, data.get("setups") or {}
  rows, seen = [], set()
  for raw in data.get("rows") or []:
    anchor = _anchor(path, dict(raw), models, setups)
    if anchor.id in seen:
      raise UserError(f"{path}: row {anchor.id} appears twice")
    seen.add(anchor.id)
    rows.append(anchor)
  by_id = {a.id: a for a in rows}
  scaling = tuple(_pair(path, dict(raw), by_id) for raw in data.get("scaling") or [])
  curves = tuple(_curve(path, dict(raw)) for raw in data.get("allreduce") or [])
  sb = data.get("small_batch") or {}
  tables = tuple(_small_batch(path, dict(raw)) for raw in sb.get("tables") or [])
  grid = {k: tuple(float(x) for x in v) for k, v in (sb.get("grid") or {}).items()}
  ids = [x.id for x in (*rows, *scaling, *curves, *tables)]
  dup = sorted({i for i in ids if ids.count(i) > 1})
  if dup:
    raise UserError(f"{path}: id {dup[0]} appears twice")
  return Published(tuple(rows), scaling, curves, tables, grid)


def _common(path: Path, rid: str, row: Mapping[str, Any]) -> tuple[str, tuple[str, str, str]]:
  """The checked role and group of any entry."""
  role, group = row.get("role"), row.get("group")
  if role not in ROLES:
    raise UserError(f"{path}: row {rid}: role must be one of {', '.join(ROLES)}")
  if not (isinstance(group, list) and len(group) == 3 and all(isinstance(g, str) for g in group)):
    raise UserError(f"{path}: row {rid}: group must be [model, hardware, source table]")
  return role, (group[0], group[1], group[2])


def _anchor(path: Path, row: dict, models: Mapping, setups: Mapping) -> Anchor:
  rid = row.get("id", "?")
  row["role"], row["group"] = _common(path, rid, row)
  if not row.get("why"):
    raise UserError(f"{path}: row {rid}: every row says why it has its role (why: ...)")
  model = row.get("model")
  if isinstance(model, str):
    row["model"] = dict(models[model]) if model in models else {"name": model}
  setup = row.get("setup") or {}
  if isinstance(setup, str):
    if setup not in setups:
      raise UserError(f"{path}: row {rid} names setup '{setup}', which the table lacks")
    setup = setups[setup]
  unknown = sorted(set(setup) - set(SETUP_KEYS))
  if unknown:
    raise UserError(f"{path}: row {rid}: unknown setup key {unknown[0]}")
  if setup.get("recompute", False) not in RECOMPUTE:
    raise UserError(f"{path}: row {rid}: recompute must be one of true, false, alternate")
  if setup.get("state", "replicated") not in STATES:
    raise UserError(f"{path}: row {rid}: state must be one of {', '.join(STATES)}")
  row["setup"] = dict(setup)
  try:
    anchor = Anchor(**row)
  except TypeError as e:
    raise UserError(f"{path}: row {rid}: {e}") from None
  if anchor.unit not in UNITS:
    raise UserError(f"{path}: row {rid}: unit must be one of {', '.join(UNITS)}")
  if not (isinstance(anchor.measured, (int, float)) and anchor.measured > 0):
    raise UserError(f"{path}: row {rid}: measured must be a positive number")
  if not (isinstance(anchor.accumulation, int) and anchor.accumulation >= 1):
    raise UserError(f"{path}: row {rid}: accumulation must be an integer >= 1")
  if anchor.role != "not_modelled" and anchor.regime != regime_of(anchor.per_device_batch):
    raise UserError(f"{path}: row {rid}: regime {anchor.regime} but its per-GPU batch is "
                    f"{anchor.per_device_batch:g} (small: <= {SMALL_BATCH_MAX})")
  return anchor


def _pair(path: Path, row: dict, rows: Mapping[str, Anchor]) -> ScalingPair:
  rid = row.get("id", "?")
  role, group = _common(path, rid, row)
  base, scaled = rows.get(row.get("base")), rows.get(row.get("scaled"))
  if base is None or scaled is None:
    raise UserError(f"{path}: scaling pair {rid}: base and scaled must name rows of the table")
  if (base.group != group or scaled.group != group or base.unit != scaled.unit
          or base.precision != scaled.precision or base.gpus >= scaled.gpus
          or base.per_device_batch != scaled.per_device_batch):
    raise UserError(f"{path}: scaling pair {rid}: two scales of one table (same group, unit, "
                    "precision and per-GPU batch, base on fewer GPUs)")
  if row.get("regime") != scaled.regime:
    raise UserError(f"{path}: scaling pair {rid}: regime must be its rows' ({scaled.regime})")
  return ScalingPair(rid, role, base, scaled, group, scaled.regime)


def _curve(path: Path, row: dict) -> Curve:
  rid = row.get("id", "?")
  row["role"], row["group"] = _common(path, rid, row)
  points = row.get("points") or []
  if not points or not all(isinstance(p, list) and len(p) == 2 and p[0] > 0 and p[1] > 0
                           for p in points):
    raise UserError(f"{path}: all-reduce row {rid}: points must be [[bytes, busbw GB/s], ...]")
  row["points"] = tuple((float(b), float(v)) for b, v in points)
  try:
    return Curve(**row)
  except TypeError as e:
    raise UserError(f"{path}: all-reduce row {rid}: {e}") from None


def _small_batch(path: Path, row: dict) -> SmallBatchTable:
  rid = row.get("id", "?")
  row["role"], row["group"] = _common(path, rid, row)
  row["batches"] = tuple(int(b) for b in row.get("batches") or [])
  if not row["batches"] or max(row["batches"]) >= int(row.get("reference", 0)):
    raise UserError(f"{path}: small-batch table {rid}: batches below its reference batch")
  try:
    return SmallBatchTable(**row)
  except TypeError as e:
    raise UserError(f"{path}: small-batch table {rid}: {e}") from None


# --- predictions ----------------------------------------------------------------------------


PROFILE_SOURCES = ("calibrated", "analytic", "deeppool_a100")


def predict(anchor: Anchor, calibration: Calibration = CALIBRATION,
            source: str = "calibrated") -> float:
  """The model's figure for one row, in the row's unit (`source`: the profile, one of
  PROFILE_SOURCES)."""
  ms = step_ms(anchor, calibration, source)
  samples = anchor.batch * anchor.accumulation
  if anchor.unit in ("images/s", "sequences/s"):
    return samples / ms * 1e3
  if anchor.unit == "ms_per_iteration":
    return ms
  if anchor.unit == "tokens/s/gpu":
    return samples * (anchor.model or {})["seq_len"] / (ms / 1e3) / anchor.gpus
  return model_flops(anchor) / (ms / 1e3) / anchor.gpus / 1e12


def step_ms(anchor: Anchor, calibration: Calibration = CALIBRATION,
            source: str = "calibrated") -> float:
  """One optimizer step of the row: its accumulation's micro-batches (forward and backward
  each), one gradient all-reduce and one update."""
  return accumulated_ms(evaluation(anchor, calibration, source), anchor.accumulation)


def accumulated_ms(ev, accumulation: int) -> float:
  """A step of `accumulation` micro-batches from one micro-batch's evaluation: every
  micro-batch's compute (update and all-reduce excluded) and stage terms, then the all-reduce
  exposed after the last backward and the update, once."""
  sync = sum(st.sync_ms for st in ev.stages)
  return accumulation * (ev.iteration_ms - ev.update_ms - sync) + sync + ev.update_ms


def iteration_ms(anchor: Anchor, calibration: Calibration = CALIBRATION,
                 source: str = "calibrated") -> float:
  """One micro-batch under the planner's evaluation, every layer on all the row's GPUs."""
  return float(evaluation(anchor, calibration, source).iteration_ms)


def evaluation(anchor: Anchor, calibration: Calibration = CALIBRATION,
               source: str = "calibrated"):
  """The planner's evaluation of one micro-batch of the row's model, every layer on all its
  GPUs (data parallelism; with tensor parallelism m, the transformer blocks split by heads and
  the logits by vocabulary on a (G/m, m) mesh)."""
  graph = _graph(anchor)
  g, b, m = anchor.gpus, anchor.batch, int(anchor.tensor_parallel)
  if g > b:
    raise UserError(f"anchor {anchor.id}: {g} GPUs on {b} samples; a plan gives every device "
                    "a sample (mark the row not_modelled)")
  profile = row_profile(anchor, graph, source, calibration)
  setup = dict(anchor.setup)
  if "state" in setup:  # a per-layer Strategy on every layer (docs/cost_model.md)
    return evaluate_plan(graph, profile, _cluster(anchor), {n: (0, g) for n in graph.names},
                         global_batch=b, num_devices=g, shardings=strategies(anchor, graph),
                         check_memory=False, **{k: v for k, v in setup.items()
                                                if k not in ("state", "recompute")})
  if setup.pop("recompute", False):
    profile = with_recomputation(profile)
  shardings = {}
  if m > 1:
    for node in graph.nodes:
      if node.kind == "transformer_block":
        shardings[node.name] = (m, "heads")
      elif node.kind == "lm_head":
        shardings[node.name] = (m, "out")
  return evaluate_plan(graph, profile, _cluster(anchor), {n: (0, g) for n in graph.names},
                       global_batch=b, num_devices=g, shardings=shardings, check_memory=False,
                       **setup)


BLOCK_KINDS = ("transformer_block", "gqa_attention", "swiglu_mlp", "moe_router", "moe_experts")
HEADS_KINDS = ("transformer_block", "gqa_attention", "swiglu_mlp")


def block_index(name: str) -> int | None:
  """The transformer block a layer belongs to ('layers.3.mlp' -> 3; None outside blocks)."""
  parts = name.split(".")
  return int(parts[1]) if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit() else None


def strategies(anchor: Anchor, graph) -> dict[str, Strategy]:
  """The strategy the row ran, one Strategy per layer, every layer on all its GPUs: with tensor
  parallelism m, the blocks' attention and MLP split by heads and the logits by vocabulary on a
  (G/m, m) mesh (the rest split samples over all G); the setup's state on every layer with
  parameters and a data axis of 2 or more; recompute on every block's layers (true) or on every
  second block's (alternate: blocks 1, 3, 5, ..., torchtitan's selective_ac_option '2')."""
  g, m = anchor.gpus, int(anchor.tensor_parallel)
  state, rc = anchor.setup.get("state", "replicated"), anchor.setup.get("recompute", False)
  out = {}
  for node in graph.nodes:
    mm, split = 1, "samples"
    if m > 1 and node.kind in HEADS_KINDS and "heads" in splits_for(node, m):
      mm, split = m, "heads"
    elif m > 1 and node.kind == "lm_head" and "out" in splits_for(node, m):
      mm, split = m, "out"
    block = block_index(node.name) if node.kind in BLOCK_KINDS else None
    recompute = block is not None and (rc is True or (rc == "alternate" and block % 2 == 1))
    st = state if node.params and g // mm > 1 else "replicated"
    out[node.name] = Strategy(mm, split, st, recompute)
  return out


def row_profile(anchor: Anchor, graph, source: str = "calibrated",
                calibration: Calibration = CALIBRATION):
  """The row's per-layer times from profile `source` (DeepPool's tables: A100-SXM4-40GB's,
  whatever the row's A100)."""

  device, batches = anchor.device or _cluster(anchor).device, profile_batches(anchor.batch)
  if source == "calibrated":
    return calibrated_profile(graph, device, anchor.precision, batches, calibration)
  if source == "analytic":
    return analytic_profile(graph, device, anchor.precision, batches)
  if source == "deeppool_a100":
    return import_deeppool_a100(graph)[0]
  raise UserError(f"profile source '{source}' is not one of {', '.join(PROFILE_SOURCES)}")


def with_recomputation(profile):
  """The profile with one more forward pass inside every backward pass (activation
  recomputation, as the measured run did)."""
  layers = {n: {b: (f, w + f) for b, (f, w) in rows.items()} for n, rows in profile.layers.items()}
  return dataclasses.replace(profile, layers=layers)


def model_flops(anchor: Anchor) -> float:
  """FLOPs per iteration by the source's own count (anchor.flops)."""
  cfg = anchor.model or {}
  b, s, l, h, v = (anchor.batch, cfg["seq_len"], cfg["n_layer"], cfg["d_model"],
                   cfg["vocab_size"])
  if anchor.flops == "megatron_2021":  # Narayanan et al. 2021, eq. (3): recomputation included
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
  if anchor.flops == "megatron_core":  # Megatron-Core num_floating_point_operations (GPT)
    return 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
  raise UserError(f"anchor {anchor.id}: unknown flops count '{anchor.flops}'")


def busbw_GBps(curve: Curve, size_bytes: float) -> float:
  """nccl-tests' bus bandwidth of the modelled all-reduce of size_bytes on the curve's setup:
  2(n-1)/n x bytes / the collective model's time (dp_jax/hardware/cluster.py, allreduce_ms)."""
  base = _cluster_spec(curve.cluster)
  spec = dataclasses.replace(base, num_nodes=curve.nodes, devices_per_node=curve.gpus_per_node,
                             nics_per_node=curve.nics_per_node)
  n = curve.nodes * curve.gpus_per_node
  ms = float(allreduce_ms(spec, size_bytes, 0, n))
  return 2 * (n - 1) / n * size_bytes / (ms * 1e6)


def _cluster(anchor: Anchor):
  """The row's cluster with its device (memory from the datasheet) and enough nodes."""
  base = _cluster_spec(anchor.cluster)
  device = anchor.device or base.device
  nodes = max(base.num_nodes, math.ceil(anchor.gpus / base.devices_per_node))
  return dataclasses.replace(base, device=device, num_nodes=nodes,
                             memory_gb_per_device=get_device(device).memory_gb)


@cache
def _cluster_spec(name: str):
  return named_cluster(name)


def _graph(anchor: Anchor):
  return build(ModelConfig, dict(anchor.model or {})).graph()


# --- errors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
  anchor: Anchor
  predicted: float | None  # None: not modelled

  @property
  def ratio(self) -> float | None:
    return None if self.predicted is None else self.predicted / self.anchor.measured

  @property
  def error(self) -> float | None:
    return None if self.ratio is None else abs(self.ratio - 1)


def results(anchors: Iterable[Anchor] | None = None,
            calibration: Calibration = CALIBRATION) -> list[Result]:
  """Every row predicted (not_modelled rows: no prediction)."""
  rows = load_anchors() if anchors is None else list(anchors)
  return [Result(a, None if a.role == "not_modelled" else _predicted(a, calibration))
          for a in rows]


_PREDICTED: dict[str, float] = {}  # repr(row) -> its prediction under CALIBRATION


def _predicted(anchor: Anchor, calibration: Calibration) -> float:
  """predict(anchor), remembered under CALIBRATION (a row is in several scaling pairs)."""
  if calibration is not CALIBRATION:
    return predict(anchor, calibration)
  key = repr(anchor)
  if key not in _PREDICTED:
    _PREDICTED[key] = predict(anchor)
  return _PREDICTED[key]


@dataclass(frozen=True)
class HeldOut:
  """The absolute held-out error (step throughput, depending on each framework's kernels): over
  the held-out rows the scaling check alone does not judge; training_*: the same rows (kept
  for callers that distinguished all-reduce rows, which are the all-reduce check's now)."""

  median: float
  worst: float
  rows: int
  training_median: float
  training_rows: int
  group_median: float  # the median of the groups' medians
  groups: int


def held_out(rows: Iterable[Result]) -> HeldOut:
  held = [r for r in rows if r.anchor.role == "held_out" and not r.anchor.scaling_only]
  if not held:
    raise UserError("the anchors table has no held-out row")
  errors = [r.error for r in held]
  by_group: dict[tuple[str, str, str], list[float]] = {}
  for r in held:
    by_group.setdefault(r.anchor.group, []).append(r.error)
  medians = [statistics.median(v) for v in by_group.values()]
  m = statistics.median(errors)
  return HeldOut(m, max(errors), len(errors), m, len(errors), statistics.median(medians),
                 len(medians))


# --- the relative checks --------------------------------------------------------------------

CHECKS = ("scaling", "small_batch", "allreduce")
CHECK_TITLES = {
    "scaling": "(a) per-GPU scaling efficiency between two scales of one published table",
    "small_batch": "(b) step time at per-GPU batch b over the table's reference batch, "
                   "leave-one-model-out over DeepPool's A100 per-layer tables",
    "allreduce": "(c) all-reduce bus bandwidth against message size (nccl-tests, from 1 MiB)",
}
BOTH = "both"  # an all-reduce point: it prices every plan, whatever its per-GPU batch
MIN_ALLREDUCE_BYTES = 2**20


@dataclass(frozen=True)
class Judged:
  """One held-out number of a relative check: published and predicted."""

  check: str
  id: str
  group: tuple[str, str, str]
  regime: str  # small, large, or both
  published: float
  predicted: float

  @property
  def ratio(self) -> float:
    return self.predicted / self.published

  @property
  def error(self) -> float:
    return abs(self.ratio - 1)


def scaling_checks(table: Published | None = None) -> list[Judged]:
  """(a) every held-out pair: the per-GPU efficiency of its larger scale over its smaller,
  predicted (the calibrated profile, the collective model, the row's setup) and published."""
  table = load_published() if table is None else table
  out = []
  for pair in table.scaling:
    if pair.role != "held_out":
      continue
    predicted = (_per_gpu(pair.scaled, _predicted(pair.scaled, CALIBRATION))
                 / _per_gpu(pair.base, _predicted(pair.base, CALIBRATION)))
    out.append(Judged("scaling", pair.id, pair.group, pair.regime, pair.published, predicted))
  return out


def allreduce_checks(table: Published | None = None, min_bytes: float = MIN_ALLREDUCE_BYTES
                     ) -> list[Judged]:
  """(c) every held-out all-reduce point from min_bytes up: bus bandwidth, predicted and
  published."""
  table = load_published() if table is None else table
  out = []
  for c in table.allreduce:
    if c.role != "held_out":
      continue
    for size, busbw in c.points:
      if size >= min_bytes:
        out.append(Judged("allreduce", f"{c.id}@{_size(size)}", c.group, BOTH, busbw,
                          busbw_GBps(c, size)))
  return out


def _size(nbytes: float) -> str:
  """'1MiB', '32MiB', '8GiB'."""
  return f"{nbytes / 2**30:g}GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g}MiB"


# (b): the small-batch shape fitted on the other tables, judged on the one left out

SMALL_BATCH_DEVICE, SMALL_BATCH_DTYPE = "A100-SXM4-40GB", "mixed fp16"


@dataclass(frozen=True)
class _Table:
  """One DeepPool table on its model: the layers it times, their calibrated roofline costs and
  knobs, and the table's step time (forward + backward over those layers) per batch."""

  spec: SmallBatchTable
  costs: tuple  # (LayerCost, AnalyticParams) per layer
  measured: Mapping[int, float]


@cache
def _small_batch_table(spec: SmallBatchTable) -> _Table:
  graph = ModelConfig.named(spec.model).graph()
  imported, report = import_deeppool_a100(graph)
  layers = [n for n in graph.names if n in report.matched and n not in report.filled]
  batches = (*spec.batches, spec.reference)
  missing = [b for b in batches if any(b not in imported.batches(n) for n in layers)]
  if missing:
    raise UserError(f"small-batch table {spec.id}: DeepPool's table lacks batch {missing[0]}")
  measured = {b: sum(imported.lookup(n, b).total_ms for n in layers) for b in batches}
  costs = tuple(layer_model(graph, graph.node(n), SMALL_BATCH_DTYPE) for n in layers)
  return _Table(spec, costs, measured)


def _shape_ms(t: _Table, batch: int, tile: float, overhead_us: float) -> float:
  """The calibrated profile's step time over the table's layers at `batch` under a shape."""
  device = get_device(SMALL_BATCH_DEVICE)
  total = 0.0
  for cost, params in t.costs:
    knobs = dataclasses.replace(params, tile=int(tile), kernel_overhead_us=float(overhead_us))
    total += sum(layer_times_ms(cost, device, SMALL_BATCH_DTYPE, batch, knobs))
  return total


def _ratios(t: _Table, tile: float, overhead_us: float) -> dict[int, tuple[float, float]]:
  """batch -> (predicted, published) step time over the reference batch's."""
  ref = _shape_ms(t, t.spec.reference, tile, overhead_us)
  return {b: (_shape_ms(t, b, tile, overhead_us) / ref,
              t.measured[b] / t.measured[t.spec.reference]) for b in t.spec.batches}


@dataclass(frozen=True)
class Fold:
  """One leave-one-model-out fold: the table judged, and the shape fitted on the others."""

  left_out: str
  tile: int
  kernel_overhead_us: float
  fit_error: float  # mean |log(predicted / published)| over the other tables' batches


def small_batch_checks(table: Published | None = None) -> tuple[list[Judged], list[Fold]]:
  """(b) for every held-out table: the small-batch shape (tile, per-kernel cost) that fits
  the other tables best on the grid, and the left-out table's ratios under it."""
  table = load_published() if table is None else table
  tables = [_small_batch_table(t) for t in table.small_batch]
  grid = [(tile, us) for tile in table.grid["tile"] for us in table.grid["kernel_overhead_us"]]
  logs = {(t.spec.id, g): [abs(math.log(p / m)) for p, m in _ratios(t, *g).values()]
          for t in tables for g in grid}
  judged, folds = [], []
  for t in tables:
    if t.spec.role != "held_out":
      continue
    others = [o for o in tables if o is not t]

    def fit_error(g, others=others) -> float:
      errs = [e for o in others for e in logs[(o.spec.id, g)]]
      return sum(errs) / len(errs)

    best = min(grid, key=fit_error)
    folds.append(Fold(t.spec.id, int(best[0]), float(best[1]), fit_error(best)))
    for b, (predicted, published) in _ratios(t, *best).items():
      judged.append(Judged("small_batch", f"{t.spec.id}@b={b}", t.spec.group, regime_of(b),
                           published, predicted))
  return judged, folds


# --- the tolerance of each regime -----------------------------------------------------------


@dataclass(frozen=True)
class GroupError:
  check: str
  group: tuple[str, str, str]
  median: float
  points: int


@dataclass(frozen=True)
class RegimeTolerance:
  """A regime's tolerance: the median of its groups' median errors over the three checks."""

  regime: str
  value: float
  groups: tuple[GroupError, ...]

  def by_check(self, check: str) -> list[GroupError]:
    return [g for g in self.groups if g.check == check]


def regime_tolerance(judged: Iterable[Judged], regime: str) -> RegimeTolerance:
  """The median over groups of each group's median |error|, the group's points restricted to
  `regime` (all-reduce points count in both)."""
  by: dict[tuple[str, tuple[str, str, str]], list[float]] = {}
  for j in judged:
    if j.regime in (regime, BOTH):
      by.setdefault((j.check, j.group), []).append(j.error)
  if not by:
    raise UserError(f"no held-out group judges the {regime} regime")
  groups = tuple(GroupError(c, g, statistics.median(v), len(v)) for (c, g), v in by.items())
  return RegimeTolerance(regime, statistics.median(g.median for g in groups), groups)


@dataclass(frozen=True)
class Report:
  """Everything scripts/validate_published.py prints."""

  absolute: list[Result]
  judged: list[Judged]
  folds: list[Fold]
  tolerances: Mapping[str, RegimeTolerance]

  def check(self, check: str) -> list[Judged]:
    return [j for j in self.judged if j.check == check]


def report(table: Published | None = None) -> Report:
  """The absolute rows, the three relative checks and each regime's tolerance."""
  table = load_published() if table is None else table
  small, folds = small_batch_checks(table)
  judged = scaling_checks(table) + small + allreduce_checks(table)
  return Report(results(table.rows), judged, folds,
                {r: regime_tolerance(judged, r) for r in REGIMES})


# --- the fit --------------------------------------------------------------------------------


def fit_calibration(anchors: Iterable[Anchor] | None = None, rounds: int = 2) -> Calibration:
  """The calibrated profile's efficiencies solved on the fit rows alone: per precision, the
  convolution efficiency on the convolution row, then the matrix efficiency on the matrix row,
  `rounds` times (each row barely depends on the other class)."""
  fit = [a for a in (load_anchors() if anchors is None else anchors)
         if a.role == "fit" and a.kind == "training"]
  eff = dict(CALIBRATION.efficiency)
  for _ in range(rounds):
    for a in fit:
      key = f"{_fit_class(a)}/{precision_class(a.precision)}"

      def figure(x: float, a=a, key=key) -> float:
        cal = dataclasses.replace(CALIBRATION, efficiency={**eff, key: x})
        return predict(a, cal)

      eff[key] = _solve(figure, a.measured)
  return dataclasses.replace(CALIBRATION, efficiency={k: round(v, 4) for k, v in eff.items()},
                             fitted_on=tuple(a.id for a in fit))


def _fit_class(anchor: Anchor) -> str:
  """The operation class a fit row calibrates (its `why` names it)."""
  return "conv" if anchor.why.startswith("convolution") else "matrix"


def _solve(figure, target: float, lo: float = 0.01, hi: float = 1.0) -> float:
  """The efficiency at which the (increasing) figure meets the target (bisection)."""
  if figure(hi) < target:
    raise UserError(f"a fit row needs {target:g} but the model reaches {figure(hi):g} at 100% "
                    "of the peak: the roofline cannot represent it")
  for _ in range(40):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if figure(mid) < target else (lo, mid)
  return (lo + hi) / 2
