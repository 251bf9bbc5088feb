"""The best uniform strategy: one setting for every layer, priced by the same cost model.

The baseline today's training runs use (Megatron-LM, NeMo, FSDP recipes) gives every layer the
same devices and the same recipe: data parallelism of size dp, a tensor-parallel degree tp, the
training state replicated or sharded as ZeRO-1 / FSDP, activations recomputed or not, and an
expert-parallel degree ep for the MoE experts. A uniform setting here is that recipe on the
first G' <= G devices of the job (G' a candidate count, options.candidate_counts):

- tp: one model-axis size m for every layer; each layer takes the split it allows at m
  (sharding.splits_for; heads for attention, MLP and blocks, then out, then in: embeddings'
  heads and linear layers), and a layer that allows none at m splits its samples over all G'
  devices, as Megatron replicates its norms;
- ep: each MoE experts layer split `experts` over ep devices (ep: 1 or a divisor of n_expert
  that divides G'), independent of tp;
- state: replicated, optimizer (ZeRO-1) or full (FSDP) for every layer with parameters and a
  data axis of 2 or more devices;
- recompute: none, or all: every layer whose recomputation keeps fewer bytes (its saved
  activations exceed its input; recomputing the others saves nothing and costs a forward).

Which of these the search may use follows the planner's options, so the baseline searches the
same space of per-layer choices as the burst planner, with one choice for all layers:
planner.sharding `weights` allows tp > 1, `state` the sharded states, `experts` ep > 1;
planner.recompute none / choose / all allows none / both / all.

Each setting is priced by planner.evaluate (the one layer time, stage terms and all-reduce) and
must fit: memory.device_bytes within the device's memory (the same per-device peak the burst
plan is held to). Settings are pruned by memory first (their peak summed over the layers'
distinct contents, pricing.signature), then the ones that fit are evaluated in the order of
the sum of their layers' times (a lower bound on the iteration: the all-reduce and stage terms
only add) until that bound exceeds the best iteration found. best_uniform runs that search over
all candidate counts; uniform_frontier runs it on each count alone (count -> the fastest setting
on exactly that many devices: the trade-off between speed and devices the simulator's matched
uniform baseline reads, docs/simulator.md). Pure Python and numpy: no JAX.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dp_jax.graph.layer_graph import LayerNode
from dp_jax.planner import memory, pricing
from dp_jax.planner.costs import CostModel, Placement
from dp_jax.planner.evaluate import Evaluation, evaluate
from dp_jax.planner.sharded import Strategy
from dp_jax.planner.sharding import splits_for

# The split a layer takes at a uniform tensor-parallel degree, first allowed first.
TP_SPLITS = ("heads", "out", "in")
RECOMPUTE = {"none": (False,), "choose": (False, True), "all": (True,)}
STATE_NAMES = {"replicated": "replicated", "optimizer": "ZeRO-1", "full": "FSDP"}


@dataclass(frozen=True)
class Setting:
  """One uniform recipe: every layer on devices [0, devices), tensor-parallel degree tp,
  expert-parallel degree ep, state and recompute as the module docstring says."""

  devices: int
  tp: int = 1
  ep: int = 1
  state: str = "replicated"
  recompute: bool = False

  @property
  def dp(self) -> int:
    """The data-parallel size of the layers split tp ways (devices / tp)."""
    return self.devices // self.tp

  def describe(self) -> str:
    """'dp 8 x tp 8, FSDP, recompute, on 64 devices' (ep where above 1)."""
    parts = [f"dp {self.dp} x tp {self.tp}" if self.tp > 1 else f"dp {self.dp}"]
    if self.ep > 1:
      parts[0] += f", ep {self.ep}"
    parts.append(STATE_NAMES[self.state])
    if self.recompute:
      parts.append("recompute")
    return f"{', '.join(parts)}, on {self.devices} device{'s' if self.devices != 1 else ''}"


@dataclass(frozen=True)
class Uniform:
  """The search's answer: the fastest uniform setting that fits (None where none does, `reason`
  saying why), its evaluation, its strategies (layer -> Strategy, the layers that are not
  PLAIN) and per-device peak; how many settings were priced and fitted."""

  setting: Setting | None
  evaluation: Evaluation | None
  shardings: Mapping[str, Strategy] = field(default_factory=dict)
  peak_bytes: float = 0.0
  capacity_bytes: float = 0.0
  settings: int = 0
  fitting: int = 0
  seconds: float = 0.0
  reason: str | None = None
  least: Setting | None = None  # the setting that needs the least memory
  least_bytes: float = 0.0

  def to_json(self) -> dict[str, Any]:
    """The plan's record (extra["uniform"]): settings, times, peak memory per device."""
    gb = memory.GB
    head: dict[str, Any] = {"settings_priced": self.settings, "settings_fit": self.fitting,
                            "seconds": self.seconds,
                            "memory_capacity_gb": self.capacity_bytes / gb}
    if self.setting is None:
      least = None if self.least is None else self.least.describe()
      return {"fits": False, "reason": self.reason, "least_memory_setting": least,
              "least_memory_gb": self.least_bytes / gb, **head}
    s, ev = self.setting, self.evaluation
    return {"fits": True, "devices": s.devices, "dp": s.dp, "tp": s.tp, "ep": s.ep,
            "state": s.state, "recompute": "all" if s.recompute else "none",
            "describe": s.describe(), "iteration_ms": ev.iteration_ms, "gpu_ms": ev.gpu_ms,
            "memory_peak_gb": self.peak_bytes / gb, **head}


def layer_strategy(node: LayerNode, setting: Setting, saves: bool) -> Strategy:
  """The strategy of `node` under the uniform setting (`saves`: recomputing it keeps fewer
  bytes, so a recomputing setting recomputes it)."""
  g = setting.devices
  m, split = 1, "samples"
  if node.kind == "moe_experts":
    if setting.ep > 1 and "experts" in splits_for(node, setting.ep):
      m, split = setting.ep, "experts"
  elif setting.tp > 1:
    allowed = splits_for(node, setting.tp)
    split = next((s for s in TP_SPLITS if s in allowed), "samples")
    m = setting.tp if split != "samples" else 1
  state = setting.state if node.params > 0 and g // m >= 2 else "replicated"
  return Strategy(m, split, state, bool(setting.recompute and saves))


def tp_degrees(model: CostModel, count: int) -> tuple[int, ...]:
  """Tensor-parallel degrees on `count` devices: 1, and each divisor m >= 2 of count at which
  some layer splits its weights (TP_SPLITS)."""
  nodes = _kinds(model)
  return (1, *(m for m in _divisors(count)
               if any(s in TP_SPLITS for n in nodes for s in splits_for(n, m))))


def ep_degrees(model: CostModel, count: int) -> tuple[int, ...]:
  """Expert-parallel degrees on `count` devices: 1, and each divisor of count that divides
  every MoE experts layer's n_expert."""
  experts = [n for n in _kinds(model) if n.kind == "moe_experts"]
  if not experts:
    return (1,)
  return (1, *(m for m in _divisors(count)
               if all("experts" in splits_for(n, m) for n in experts)))


def settings(model: CostModel, counts: Iterable[int] | None = None) -> Iterator[Setting]:
  """Every uniform setting the planner's options allow on `counts` (default: the candidate
  counts)."""
  opts = model.options
  states = ("replicated", "optimizer", "full") if "state" in opts.sharding else ("replicated",)
  for count in (int(c) for c in (model.counts if counts is None else counts)):
    tps = tp_degrees(model, count) if "weights" in opts.sharding else (1,)
    eps = ep_degrees(model, count) if "experts" in opts.sharding else (1,)
    for tp in tps:
      for ep in eps:
        for state in states if count >= 2 else ("replicated",):
          for rc in RECOMPUTE[opts.recompute]:
            yield Setting(count, tp, ep, state, rc)


def strategies(model: CostModel, setting: Setting) -> dict[str, Strategy]:
  """Layer -> Strategy of the layers of the setting that are not PLAIN."""
  saves = _saves(model)
  out = {}
  for node in model.graph.nodes:
    s = layer_strategy(node, setting, saves[node.name])
    if not s.plain:
      out[node.name] = s
  return out


def peak_bytes(model: CostModel, setting: Setting,
               per: tuple[Strategy, ...] | None = None) -> float:
  """A device's peak under the setting (every device of [0, devices) holds every layer): what
  the layers keep through the step plus the largest transient need of one of them
  (memory.device_bytes' sum, over the layers' distinct contents times their number). `per`:
  the strategy of each content (_per_content), when the caller has it."""
  per = _per_content(model, setting) if per is None else per
  memo = pricing.memo(model)
  kept, transient = 0.0, 0.0
  for (row, (name, times)), s in zip(_contents(model).items(), per, strict=True):
    key = ("uniform need", row, setting.devices, s)
    hit = memo.get(key)
    if hit is None:
      hit = memo[key] = (memory.layer_need(model, name, setting.devices, s),
                         memory.transient_need(model, name, setting.devices, s))
    kept += times * hit[0]
    transient = max(transient, hit[1])
  return kept + transient


def compute_ms(model: CostModel, setting: Setting,
               per: tuple[Strategy, ...] | None = None) -> float:
  """The sum of the layers' times under the setting (pricing.layer_time's total, over the
  layers' distinct contents times their number): a lower bound on its iteration (its one
  stage adds the exposed all-reduce and the stage terms)."""
  per = _per_content(model, setting) if per is None else per
  p = (0, setting.devices)
  return sum(times * pricing.layer_ms(model, name, p, None if s.plain else s)[0]
             for (name, times), s in zip(_contents(model).values(), per, strict=True))


def best_uniform(model: CostModel) -> Uniform:
  """The fastest uniform setting that fits in memory (least GPU time, then fewest devices on a
  tie), or none with the reason and the least memory any setting needs."""
  return search(model)


def uniform_frontier(model: CostModel) -> dict[int, Uniform]:
  """Candidate count d -> the fastest uniform setting on exactly d devices that fits (search
  on d alone), ascending; the counts where none fits are left out. Its fastest entry is
  best_uniform's setting."""
  out = {}
  for count in (int(c) for c in model.counts):
    u = search(model, (count,))
    if u.setting is not None:
      out[count] = u
  return out


def search(model: CostModel, counts: tuple[int, ...] | None = None) -> Uniform:
  """The fastest uniform setting on `counts` (default: every candidate count) that fits in
  memory (least GPU time, then fewest devices on a tie), or none with the reason and the least
  memory any setting needs."""
  start = time.perf_counter()
  cap = memory.capacity_bytes(model)
  check = model.options.check_memory
  least: tuple[float, Setting] | None = None
  seen: set = set()
  survivors: list[tuple[float, Setting, float]] = []  # (compute bound, setting, peak)
  for setting in settings(model, counts):
    per = _per_content(model, setting)
    key = (setting.devices, per)
    if key in seen:  # a setting no layer can tell from one already priced
      continue
    seen.add(key)
    need = peak_bytes(model, setting, per)
    if least is None or need < least[0]:
      least = (need, setting)
    if check and need > cap * (1 + 1e-9):
      continue
    survivors.append((compute_ms(model, setting, per), setting, need))
  survivors.sort(key=lambda x: (x[0], x[1].devices))
  evaluated: dict[Setting, tuple[Evaluation, dict[str, Strategy]]] = {}
  rejected: set[Setting] = set()
  while True:
    best: tuple[tuple[float, float, int], Setting] | None = None
    for bound, setting, _ in survivors:
      if setting in rejected:
        continue
      if best is not None and bound > best[0][0]:  # its layers alone take longer than the best
        break
      if setting not in evaluated:
        shards = strategies(model, setting)
        evaluated[setting] = (evaluate(model, _assignment(model, setting.devices), shards),
                              shards)
      ev = evaluated[setting][0]
      rank = (ev.iteration_ms, ev.gpu_ms, setting.devices)
      if best is None or rank < best[0]:
        best = (rank, setting)
    if best is None or not check or memory.fits(
        model, _assignment(model, best[1].devices), evaluated[best[1]][1]):
      break
    rejected.add(best[1])  # over by float rounding: the exact per-device check decides
  seconds = time.perf_counter() - start
  least_bytes, least_setting = (float(least[0]), least[1]) if least is not None else (0.0, None)
  priced, fitting = len(seen), len(survivors) - len(rejected)
  if best is None:
    need = least_bytes / memory.GB
    where = (f"<= {model.options.num_devices}" if counts is None
             else "/".join(str(c) for c in counts))
    reason = (f"no uniform strategy of {model.graph.model} on {where} devices fits in "
              f"{cap / memory.GB:g} GB per device: the least memory one "
              f"({least_setting.describe() if least_setting else 'none'}) needs {need:.2f} GB")
    return Uniform(None, None, {}, 0.0, cap, priced, 0, seconds, reason, least_setting,
                   least_bytes)
  setting = best[1]
  ev, shards = evaluated[setting]
  peak = float(memory.device_bytes(model, _assignment(model, setting.devices), shards).max())
  return Uniform(setting, ev, shards, peak, cap, priced, fitting, seconds, None, least_setting,
                 least_bytes)


def _per_content(model: CostModel, setting: Setting) -> tuple[Strategy, ...]:
  """The setting's strategy of each distinct content (_contents' order)."""
  saves = _saves(model)
  return tuple(layer_strategy(model.graph.node(name), setting, saves[name])
               for name, _ in _contents(model).values())


def _assignment(model: CostModel, count: int) -> dict[str, Placement]:
  return {n: (0, count) for n in model.names}


def _kinds(model: CostModel) -> list[LayerNode]:
  """One node per distinct content (the layers a uniform setting can tell apart)."""
  return [model.graph.node(name) for name, _ in _contents(model).values()]


def _contents(model: CostModel) -> dict[int, tuple[str, int]]:
  """pricing.signature row -> (a layer of that content, how many layers have it)."""
  m = pricing.memo(model)
  hit = m.get("uniform contents")
  if hit is None:
    hit = {}
    for name in model.names:
      row = pricing.signature(model, name)
      first, times = hit.get(row, (name, 0))
      hit[row] = (first, times + 1)
    m["uniform contents"] = hit
  return hit


def _saves(model: CostModel) -> dict[str, bool]:
  """Layer -> whether recomputing it keeps fewer bytes (its saved activations exceed its
  input; a split layer keeps them whole or in shares, never less than its input)."""
  m = pricing.memo(model)
  hit = m.get("uniform saves")
  if hit is None:
    hit = m["uniform saves"] = {n: bool(model.saved_bytes[model.row[n]]
                                        > model.in_bytes[model.row[n]]) for n in model.names}
  return hit


def _divisors(count: int) -> tuple[int, ...]:
  """The divisors m >= 2 of count, ascending."""
  return tuple(m for m in range(2, count + 1) if count % m == 0)
