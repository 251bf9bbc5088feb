"""Import DeepPool's measured A100 layer times onto a LayerGraph's layers (see docs/cost_model.md).

Rules, in order:
- Rows pair with layers by signature (kind, parameters, input dims; our HWC read as CHW).
  The k-th layer with a signature takes the k-th row with it in each per-batch block.
- Each layer takes all its rows from the first source of the model's recipe that has its
  signature (sources are not mixed within a layer: they were timed differently).
- In-place ReLU rows hold the backward of the conv/linear before them: moved back first
  (deeppool_rows.move_relu_backward). A layer with a fused ReLU (conv2d, activation "relu")
  also takes the ReLU row that follows its own row.
- *.txt rows give forward+backward only: split 1/3 forward, 2/3 backward (1/2, 1/2 for the
  layer reading the model input), the FLOP convention of analytic.py.
- A ResnetBottleneck row covers a whole fork/join block: its forward (backward) time is split
  over the block's layers in proportion to their analytic forward (backward) time on the A100
  (analytic.A100_VGG16_FIT, fitted on VGG16 alone, so no WRN number feeds its own split).
- A conv2d/linear whose backward the file records as 0 (DeepPool's last linear has no ReLU
  after it to carry its backward) gets 2x (1x for the first layer) its forward, and the
  MatchReport lists it under `estimated`.
- A layer the tables lack (ResNet-50's residual `add`s) is filled from the analytic A100 model
  calibrated on this import's matched layers: analytic time x the median of imported /
  analytic over every (layer, batch) of the same class (matrix or elementwise); a model with
  no matched layer at all (GPT-2) gets the analytic A100 model as fitted on VGG16. The
  MatchReport lists it under `filled` and the profile's meta under `estimated_layers`.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.devices import get_device
from dp_jax.layer_times import analytic
from dp_jax.layer_times.deeppool_match import (
  Signature,
  bottleneck_blocks,
  chw,
  node_signature,
  row_signature,
)
from dp_jax.layer_times.deeppool_rows import Row, move_relu_backward, parse_file
from dp_jax.layer_times.table import ProfileTable

# The tables ship inside the package (MIT licence and provenance beside them).
DEFAULT_DATA_DIR = Path(str(resources.files("dp_jax.layer_times") / "data" / "deeppool_a100"))
DEVICE, DTYPE = "A100-SXM4-40GB", "mixed fp16"
RELU_BWD_FACTOR = 1.5
ZERO_BWD_MS = 0.001  # the files' resolution (1 us): a backward at or below it was not recorded
MIN_SHARED = 3  # rows two sources must share at a batch before one is calibrated to the other

Source = tuple[str, str | None]  # (file name, section marker or None for the whole file)

RECIPES: dict[str, tuple[Source, ...]] = {
    "vgg16": (("A100_vgg.prof", None),),
    "wide_resnet101_2": (("A100_wrn.prof", None),),
    "inception_v3": (("A100_inception.prof", None), ("inceptionLayerGpuProfileA100.txt", None)),
    # ResNet-50's convs have the same shapes as ResNet-152's (the RESNET152 section); its
    # head (global pool, flatten, 2048->1000 linear) is the same op as WRN's head.
    "resnet50": (("resnetLayerGpuProfileA100V2.txt", "RESNET152"), ("A100_wrn.prof", None)),
    # DeepPool's ViT (dp_jax/models/vit.py): every layer has its row at batches 1-128.
    "vit": (("vitLayerGpuProfileA100.txt", None),),
}
DEFAULT_RECIPE: tuple[Source, ...] = (
    ("A100_vgg.prof", None), ("A100_wrn.prof", None), ("A100_inception.prof", None),
    ("inceptionLayerGpuProfileA100.txt", None), ("wrnLayerGpuProfileA100V2.txt", None),
    ("vggLayerGpuProfileA100.txt", None), ("resnetLayerGpuProfileA100V2.txt", None),
    ("vitLayerGpuProfileA100.txt", None))
CROSS_CHECKS: dict[str, tuple[str, str]] = {
    "wide_resnet101_2": ("A100_wrn.prof", "wrnLayerGpuProfileA100V2.txt"),
    "inception_v3": ("A100_inception.prof", "inceptionLayerGpuProfileA100.txt"),
}


@dataclass(frozen=True)
class MatchReport:
  """Which DeepPool row each layer took, and what could not be matched."""

  matched: dict[str, str]  # layer -> row key, batch written [b]
  unmatched: list[str]
  sources: dict[str, str] = field(default_factory=dict)  # layer -> file
  estimated: dict[str, list[int]] = field(default_factory=dict)  # layer -> batches (bwd guessed)
  notes: list[str] = field(default_factory=list)
  groups: list[list[str]] = field(default_factory=list)  # layers sharing one row (a block)
  filled: list[str] = field(default_factory=list)  # not in the tables: analytic, calibrated


@dataclass
class _Source:
  name: str
  blocks: dict[int, list[Row]]  # batch -> rows in file order
  index: dict[Signature, dict[int, list[int]]]  # signature -> batch -> positions in blocks[b]


def _load(data_dir: Path, src: Source) -> _Source:
  file, section = src
  rows = parse_file(data_dir / file)
  if section is not None:
    rows = [r for r in rows if r.section == section]
    if not rows:
      raise UserError(f"{file} has no section '#{section}'; fix the import recipe")
  blocks: dict[int, list[Row]] = defaultdict(list)
  for r in rows:
    blocks[r.batch].append(r)
  blocks = {b: move_relu_backward(rs, RELU_BWD_FACTOR) for b, rs in blocks.items()}
  index: dict[Signature, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
  for b, rs in blocks.items():
    for i, r in enumerate(rs):
      sig = row_signature(r)
      if sig is not None:
        index[sig][b].append(i)
  name = file if section is None else f"{file}#{section}"
  return _Source(name, dict(blocks), index)


def _split(row: Row, first: bool) -> tuple[float, float]:
  """(fwd, bwd) ms of a row; a total-only row splits by the FLOP convention."""
  if row.fwd_ms is not None and row.bwd_ms is not None:
    return row.fwd_ms, row.bwd_ms
  fwd_share = 0.5 if first else 1 / 3
  return row.total_ms * fwd_share, row.total_ms * (1 - fwd_share)


def _fused_relu(node: LayerNode, rows: list[Row], i: int) -> Row | None:
  """The ReLU row right after row i when the layer fuses its ReLU."""
  if node.kind != "conv2d" or node.attrs.get("activation") != "relu" or i + 1 >= len(rows):
    return None
  nxt = rows[i + 1]
  if nxt.kind == "ReLU2d" and tuple(nxt.dims) == chw(node.out_shape):
    return nxt
  return None


def _resolve(data_dir: str | Path | None) -> Path:
  path = Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR
  if not path.is_dir():
    raise UserError(f"DeepPool A100 profile folder not found: {path}; leave profile.data_dir "
                    "unset to use the tables shipped in dp_jax, or point it at a folder of them")
  return path


def import_deeppool_a100(graph: LayerGraph, data_dir: str | Path | None = None, *,
                         recipe: tuple[Source, ...] | None = None
                         ) -> tuple[ProfileTable, MatchReport]:
  """DeepPool's A100 timings mapped onto `graph`'s layers, and a report of what matched."""
  path = _resolve(data_dir)
  recipe = recipe or RECIPES.get(graph.model, DEFAULT_RECIPE)
  sources = [_load(path, s) for s in recipe]
  scale = {s.name: _calibration(sources[0], s) if i else None for i, s in enumerate(sources)}
  layers: dict[str, dict[int, tuple[float, float]]] = {}
  matched: dict[str, str] = {}
  from_file: dict[str, str] = {}
  estimated: dict[str, list[int]] = {}
  used: dict[tuple[str, Signature], int] = defaultdict(int)
  groups: list[list[str]] = []

  def pick(sig: Signature) -> tuple[_Source, int] | None:
    for src in sources:
      if sig in src.index:
        k = used[(src.name, sig)]
        used[(src.name, sig)] += 1
        return src, k
    return None

  # 1. whole residual blocks
  a100 = get_device(DEVICE)
  for _blk, sig, names in bottleneck_blocks(graph):
    hit = pick(sig)
    if hit is None:
      continue
    src, k = hit
    costs = [analytic.layer_cost(graph, graph.node(n), DTYPE) for n in names]
    for b, pos in src.index[sig].items():
      row = src.blocks[b][pos[min(k, len(pos) - 1)]]
      fwd, bwd = _split(row, first=False)
      t = [analytic.layer_times_ms(c, a100, DTYPE, b, analytic.A100_VGG16_FIT) for c in costs]
      tf, tb = sum(x[0] for x in t), sum(x[1] for x in t)
      for n, (f, w) in zip(names, t, strict=True):
        layers.setdefault(n, {})[b] = (fwd * f / tf, bwd * w / tb)
    for n in names:
      matched[n] = row.template
      from_file[n] = src.name
    groups.append(list(names))

  # 2. single layers
  for node in graph.nodes:
    if node.name in matched:
      continue
    sig = node_signature(graph, node)
    hit = pick(sig) if sig is not None else None
    if hit is None:
      continue
    src, k = hit
    first = not node.inputs
    factors = scale[src.name]
    rows = {}
    for b, pos in src.index[sig].items():
      if factors is not None and b not in factors:
        continue  # no common rows at this batch to put it on the primary's timing method
      i = pos[min(k, len(pos) - 1)]
      row = src.blocks[b][i]
      fwd, bwd = _split(row, first)
      relu = _fused_relu(node, src.blocks[b], i)
      if relu is not None:
        rf, rb = _split(relu, False)
        fwd, bwd = fwd + rf, bwd + rb
      if factors is not None:
        fwd, bwd = fwd * factors[b], bwd * factors[b]
      if node.kind in ("conv2d", "linear") and bwd <= ZERO_BWD_MS:
        bwd = fwd * (1.0 if first else 2.0)
        estimated.setdefault(node.name, []).append(b)
      rows[b] = (fwd, bwd)
    layers[node.name] = rows
    matched[node.name] = src.blocks[b][i].template
    from_file[node.name] = src.name

  unmatched = [n for n in graph.names if n not in matched]
  filled = _fill_from_analytic(graph, layers, unmatched)
  notes = _cross_check(path, graph.model)
  for name, f in scale.items():
    if f is not None and any(v == name for v in from_file.values()):
      notes.append(f"rows from {name} scaled to {sources[0].name}'s timing by batch: " +
                   ", ".join(f"{b}: x{v:.2f}" for b, v in sorted(f.items())))
  table = ProfileTable(
      model=graph.model, device=DEVICE, dtype=DTYPE, source="imported", layers=layers,
      meta={"data_dir": str(path), "recipe": [s[0] + (f"#{s[1]}" if s[1] else "") for s in recipe],
            "relu_bwd_factor": RELU_BWD_FACTOR, "txt_split": "1/3 fwd, 2/3 bwd",
            "block_split": "analytic (A100_VGG16_FIT roofline)", "unmatched": unmatched,
            "calibration": {k: v for k, v in scale.items() if v is not None},
            "estimated_bwd": {n: sorted(b) for n, b in estimated.items()},
            "estimated_layers": {n: FILL_METHOD for n in filled}})
  for n in estimated:
    estimated[n].sort()
  return table, MatchReport(matched, unmatched, from_file, estimated, notes, groups, filled)


FILL_METHOD = "analytic A100 (A100_VGG16_FIT) x median imported/analytic of matched layers"
NO_MATCH_BATCHES = [2 ** i for i in range(11)]  # a model the tables lack entirely: 1..1024



def _fill_from_analytic(graph: LayerGraph, layers: dict[str, dict[int, tuple[float, float]]],
                        names: list[str]) -> list[str]:
  """Fill `names` in `layers` from the calibrated analytic model; returns the names filled."""
  if not names:
    return []
  a100 = get_device(DEVICE)

  def times(name: str, b: int) -> tuple[float, float]:
    cost = analytic.layer_cost(graph, graph.node(name), DTYPE)
    return analytic.layer_times_ms(cost, a100, DTYPE, b, analytic.A100_VGG16_FIT)

  def matrix(name: str) -> bool:  # whether its work runs on the matrix units
    return analytic.layer_cost(graph, graph.node(name), DTYPE).matrix

  ratios: dict[bool, list[float]] = {True: [], False: []}
  for n, rows in layers.items():
    for b, (f, w) in rows.items():
      predicted = sum(times(n, b))
      if predicted > 0 and f + w > 0:
        ratios[matrix(n)].append((f + w) / predicted)
  batches = sorted({b for rows in layers.values() for b in rows}) or NO_MATCH_BATCHES
  for n in names:
    k = statistics.median(ratios[matrix(n)] or ratios[not matrix(n)] or [1.0])
    layers[n] = {b: (times(n, b)[0] * k, times(n, b)[1] * k) for b in batches}
  return list(names)


def _pair_ratios(a: _Source, b: _Source) -> dict[int, list[float]]:
  """Per batch: total(a) / total(b) over the rows both sources time (same signature, order)."""
  out: dict[int, list[float]] = defaultdict(list)
  for sig, per_batch in a.index.items():
    for batch, pos in per_batch.items():
      for ia, ib in zip(pos, b.index.get(sig, {}).get(batch, []), strict=False):
        ta, tb = a.blocks[batch][ia].total_ms, b.blocks[batch][ib].total_ms
        if ta > 0 and tb > 0:
          out[batch].append(ta / tb)
  return dict(out)


def _calibration(primary: _Source, other: _Source) -> dict[int, float] | None:
  """Per-batch factor that puts `other`'s times on `primary`'s timing method, or None.

  DeepPool's *.txt files were mostly timed differently from its *.prof files (a per-layer
  floor of ~0.1-0.3 ms at small batches); where two sources time at least MIN_SHARED common
  layers at a batch, rows taken from the second are scaled by the median ratio at that batch.
  """
  ratios = {b: r for b, r in _pair_ratios(primary, other).items() if len(r) >= MIN_SHARED}
  if not ratios:
    return None
  return {b: statistics.median(r) for b, r in ratios.items()}


def _cross_check(path: Path, model: str) -> list[str]:
  """One line comparing the totals of two files that time the same layers, if configured."""
  pair = CROSS_CHECKS.get(model)
  if pair is None:
    return []
  a, b = (_load(path, (f, None)) for f in pair)
  diffs = [abs(1 / r - 1) for rs in _pair_ratios(a, b).values() for r in rs]
  if not diffs:
    return [f"{pair[0]} and {pair[1]} share no rows"]
  return [f"{pair[1]} vs {pair[0]}: {len(diffs)} shared rows, total time differs by "
          f"{100 * statistics.median(diffs):.1f}% median, {100 * max(diffs):.1f}% worst"]
