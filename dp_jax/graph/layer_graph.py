"""LayerGraph: the planner's view of a model, a DAG of layers (pure Python, no JAX)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import read_json, write_json

GRAPH_SCHEMA = "dp_jax.graph/1"


@dataclass(frozen=True)
class LayerNode:
  """One planner-visible layer: what it consumes, what it produces, what it costs."""

  name: str
  kind: str
  inputs: tuple[str, ...] = ()  # producer node names; () means the model's input
  params: int = 0
  param_bytes: int = 0
  out_shape: tuple[int, ...] = ()  # per sample
  out_bytes_per_sample: int = 0
  flops_per_sample: float = 0.0  # forward FLOPs per sample, from XLA's cost analysis
  bytes_accessed_per_sample: float = 0.0  # forward HBM bytes per sample, from XLA's cost analysis
  attrs: Mapping[str, Any] = field(default_factory=dict)  # kind-specific (see docs)
  saved_bytes_per_sample: int = 0  # activations kept for backward, per sample (XLA residuals)
  # What of the forward FLOPs are matrix products and convolutions (the layer's jaxpr: work
  # that runs on matrix units, whatever the layer is called); the bytes of parameters it only
  # gathers rows of (an embedding table); its largest matrix operation's (rows per sample,
  # columns). A graph traced by dp_jax records them (meta "work_source").
  matmul_flops_per_sample: float = 0.0
  conv_flops_per_sample: float = 0.0
  gathered_param_bytes: int = 0
  gemm: tuple[int, int] | None = None

  def to_json(self) -> dict[str, Any]:
    d = asdict(self)
    d["inputs"] = list(self.inputs)
    d["out_shape"] = list(self.out_shape)
    d["attrs"] = dict(self.attrs)
    d["gemm"] = None if self.gemm is None else list(self.gemm)
    return d


_NODE_FIELDS = {
    "name": str, "kind": str, "inputs": list, "params": int, "param_bytes": int,
    "out_shape": list, "out_bytes_per_sample": int, "flops_per_sample": (int, float),
    "bytes_accessed_per_sample": (int, float), "attrs": dict, "saved_bytes_per_sample": int,
    "matmul_flops_per_sample": (int, float), "conv_flops_per_sample": (int, float),
    "gathered_param_bytes": int, "gemm": (list, type(None)),
}
_REQUIRED_NODE_FIELDS = ("name", "kind", "inputs", "param_bytes", "out_bytes_per_sample")
_COUNT_FIELDS = ("params", "param_bytes", "out_bytes_per_sample", "flops_per_sample",
                 "bytes_accessed_per_sample", "saved_bytes_per_sample",
                 "matmul_flops_per_sample", "conv_flops_per_sample",
                 "gathered_param_bytes")  # finite, >= 0


def _node_from_json(d: Any, where: str) -> LayerNode:
  if not isinstance(d, dict):
    raise UserError(f"{where}: a node must be a JSON object, got {type(d).__name__}")
  for key in _REQUIRED_NODE_FIELDS:
    if key not in d:
      raise UserError(f"{where}: node is missing required field '{key}'")
  for key, value in d.items():
    want = _NODE_FIELDS.get(key)
    if want is None:
      raise UserError(f"{where}: unknown node field '{key}' (valid: {', '.join(_NODE_FIELDS)})")
    if isinstance(value, bool) or not isinstance(value, want):
      raise UserError(f"{where}: field '{key}' has type {type(value).__name__}, "
                      f"expected {getattr(want, '__name__', 'number')}")
  name = d["name"]
  if not all(isinstance(p, str) for p in d["inputs"]):
    raise UserError(f"{where}: node '{name}' field 'inputs' must list layer names")
  for key in _COUNT_FIELDS:
    value = d.get(key, 0)
    if not (math.isfinite(value) and value >= 0):
      raise UserError(f"{where}: node '{name}' field '{key}' is {value!r}; it must be a finite "
                      "number >= 0")
  shape = d.get("out_shape", [])
  if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape):
    raise UserError(f"{where}: node '{name}' field 'out_shape' is {shape!r}; it must list "
                    "positive integer sizes")
  return LayerNode(
      name=d["name"], kind=d["kind"], inputs=tuple(d["inputs"]),
      params=int(d.get("params", 0)), param_bytes=int(d["param_bytes"]),
      out_shape=tuple(d.get("out_shape", ())), out_bytes_per_sample=int(d["out_bytes_per_sample"]),
      flops_per_sample=float(d.get("flops_per_sample", 0.0)),
      bytes_accessed_per_sample=float(d.get("bytes_accessed_per_sample", 0.0)),
      attrs=dict(d.get("attrs", {})),
      saved_bytes_per_sample=int(d.get("saved_bytes_per_sample", 0)),
      matmul_flops_per_sample=float(d.get("matmul_flops_per_sample", 0.0)),
      conv_flops_per_sample=float(d.get("conv_flops_per_sample", 0.0)),
      gathered_param_bytes=int(d.get("gathered_param_bytes", 0)),
      gemm=_gemm(d.get("gemm"), where, name))


def _gemm(value: Any, where: str, name: str) -> tuple[int, int] | None:
  if value is None:
    return None
  if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                for v in value):
    raise UserError(f"{where}: node '{name}' field 'gemm' is {value!r}; it must be [rows per "
                    "sample, columns] of positive integers, or null")
  return int(value[0]), int(value[1])


@dataclass(frozen=True)
class Chain:
  """A series of items run one after another: node names and Parallel blocks."""

  items: tuple[str | Parallel, ...]


@dataclass(frozen=True)
class Parallel:
  """Branches between a fork node (the item before) and a join node (the item after)."""

  fork: str
  join: str
  branches: tuple[Chain, ...]  # an empty Chain is an identity path (e.g. a residual shortcut)


@dataclass(frozen=True)
class ForkJoinBlock:
  """A fork node, its join node and the nodes on each branch between them (flattened)."""

  fork: str
  join: str
  branches: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class LayerGraph:
  """A model as a DAG of LayerNodes in topological order, with one source and one sink."""

  model: str
  input_shape: tuple[int, ...]  # per sample
  input_dtype: str
  nodes: tuple[LayerNode, ...]
  meta: Mapping[str, Any] = field(default_factory=dict)

  def __post_init__(self):
    _validate(self)

  # --- structure -------------------------------------------------------------------------

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(n.name for n in self.nodes)

  def node(self, name: str) -> LayerNode:
    try:
      return self._index()[name]
    except KeyError:
      raise UserError(f"graph of {self.model} has no layer '{name}'") from None

  def _index(self) -> dict[str, LayerNode]:
    cache = self.__dict__.get("_index_cache")
    if cache is None:
      cache = {n.name: n for n in self.nodes}
      object.__setattr__(self, "_index_cache", cache)
    return cache

  def successors(self, name: str) -> tuple[str, ...]:
    cache = self.__dict__.get("_succ_cache")
    if cache is None:
      cache = {n.name: [] for n in self.nodes}
      for n in self.nodes:
        for p in dict.fromkeys(n.inputs):
          cache[p].append(n.name)
      cache = {k: tuple(v) for k, v in cache.items()}
      object.__setattr__(self, "_succ_cache", cache)
    return cache[name]

  def predecessors(self, name: str) -> tuple[str, ...]:
    return self.node(name).inputs

  def edges(self) -> list[tuple[str, str]]:
    return [(p, n.name) for n in self.nodes for p in n.inputs]

  @property
  def source(self) -> str:
    return self.nodes[0].name

  @property
  def sink(self) -> str:
    return self.nodes[-1].name

  def decompose(self) -> Chain:
    """Series-parallel decomposition: the whole graph as a Chain of nodes and Parallel blocks."""
    cache = self.__dict__.get("_sp_cache")
    if cache is None:
      ipdom = _immediate_post_dominators(self)
      cache = _chain_from(self, self.source, None, ipdom)
      object.__setattr__(self, "_sp_cache", cache)
    return cache

  def fork_join_blocks(self) -> list[ForkJoinBlock]:
    """Every fork/join block (nested ones included), outermost first, in graph order."""
    blocks: list[ForkJoinBlock] = []

    def visit(chain: Chain):
      for item in chain.items:
        if isinstance(item, Parallel):
          blocks.append(ForkJoinBlock(item.fork, item.join,
                                      tuple(tuple(flat_layers(b)) for b in item.branches)))
          for b in item.branches:
            visit(b)

    visit(self.decompose())
    return blocks

  # --- totals ----------------------------------------------------------------------------

  @property
  def total_params(self) -> int:
    return sum(n.params for n in self.nodes)

  @property
  def total_param_bytes(self) -> int:
    return sum(n.param_bytes for n in self.nodes)

  @property
  def total_flops_per_sample(self) -> float:
    return sum(n.flops_per_sample for n in self.nodes)

  # --- JSON ------------------------------------------------------------------------------

  def to_json(self) -> dict[str, Any]:
    return {
        "schema": GRAPH_SCHEMA, "model": self.model, "input_shape": list(self.input_shape),
        "input_dtype": self.input_dtype, "meta": dict(self.meta),
        "nodes": [n.to_json() for n in self.nodes],
        "edges": [list(e) for e in self.edges()],
        "fork_join_blocks": [
            {"fork": b.fork, "join": b.join, "branches": [list(br) for br in b.branches]}
            for b in self.fork_join_blocks()],
        "totals": {"params": self.total_params, "param_bytes": self.total_param_bytes,
                   "flops_per_sample": self.total_flops_per_sample},
    }

  @classmethod
  def from_json(cls, d: Any, where: str = "graph") -> LayerGraph:
    if not isinstance(d, dict):
      raise UserError(f"{where}: expected a JSON object with 'nodes', got {type(d).__name__}")
    schema = d.get("schema", GRAPH_SCHEMA)
    if schema != GRAPH_SCHEMA:
      raise UserError(f"{where}: schema '{schema}' is not supported (expected '{GRAPH_SCHEMA}')")
    for key in ("model", "nodes"):
      if key not in d:
        raise UserError(f"{where}: missing required field '{key}'")
    if not isinstance(d["nodes"], list) or not d["nodes"]:
      raise UserError(f"{where}: 'nodes' must be a non-empty list")
    shape = d.get("input_shape", [])
    if not (isinstance(shape, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape)):
      raise UserError(f"{where}: field 'input_shape' is {shape!r}; it must list positive "
                      "integer sizes (per sample)")
    nodes = [_node_from_json(n, f"{where}: nodes[{i}]") for i, n in enumerate(d["nodes"])]
    return cls(model=str(d["model"]), input_shape=tuple(d.get("input_shape", ())),
               input_dtype=str(d.get("input_dtype", "float32")),
               nodes=tuple(topological_sort(nodes, where)), meta=dict(d.get("meta", {})))

  def save(self, path: str | Path) -> Path:
    return write_json(path, self.to_json())

  @classmethod
  def load(cls, path: str | Path) -> LayerGraph:
    return cls.from_json(read_json(path, "graph"), where=str(path))


def topological_sort(nodes: Sequence[LayerNode], where: str = "graph") -> list[LayerNode]:
  """Nodes in a stable topological order (ties keep the given order); cycles are an error."""
  by_name: dict[str, LayerNode] = {}
  for n in nodes:
    if n.name in by_name:
      raise UserError(f"{where}: duplicate layer name '{n.name}'")
    by_name[n.name] = n
  for n in nodes:
    for p in n.inputs:
      if p not in by_name:
        raise UserError(f"{where}: layer '{n.name}' reads '{p}', which is not a layer of the graph")
  order_index = {n.name: i for i, n in enumerate(nodes)}
  indegree = {n.name: len(set(n.inputs)) for n in nodes}
  consumers: dict[str, list[str]] = {n.name: [] for n in nodes}
  for n in nodes:
    for p in set(n.inputs):
      consumers[p].append(n.name)
  ready = [(order_index[name], name) for name, deg in indegree.items() if deg == 0]
  heapq.heapify(ready)
  out: list[LayerNode] = []
  while ready:
    _, name = heapq.heappop(ready)
    out.append(by_name[name])
    for c in consumers[name]:
      indegree[c] -= 1
      if indegree[c] == 0:
        heapq.heappush(ready, (order_index[c], c))
  if len(out) != len(nodes):
    stuck = sorted(name for name, deg in indegree.items() if deg > 0)
    raise UserError(f"{where}: the layer graph has a cycle through {', '.join(stuck[:5])}"
                    f"{' ...' if len(stuck) > 5 else ''}; a model graph must be acyclic")
  return out


def _validate(g: LayerGraph) -> None:
  if not g.nodes:
    raise UserError(f"graph of {g.model} has no layers")
  ordered = topological_sort(g.nodes, f"graph of {g.model}")
  if [n.name for n in ordered] != [n.name for n in g.nodes]:
    raise UserError(f"graph of {g.model}: nodes are not in topological order")
  sources = [n.name for n in g.nodes if not n.inputs]
  if len(sources) != 1:
    raise UserError(f"graph of {g.model} must have exactly one layer reading the model input, "
                    f"found {len(sources)}: {', '.join(sources)}")
  consumed = {p for n in g.nodes for p in n.inputs}
  sinks = [n.name for n in g.nodes if n.name not in consumed]
  if len(sinks) != 1:
    raise UserError(f"graph of {g.model} must have exactly one output layer, "
                    f"found {len(sinks)}: {', '.join(sinks)}")


def _immediate_post_dominators(g: LayerGraph) -> dict[str, str | None]:
  """Immediate post-dominator of every node (None for the sink); Cooper-Harvey-Kennedy."""
  names = g.names
  rank = {name: i for i, name in enumerate(names)}  # topological rank; sink is last
  ipdom: dict[str, str | None] = {g.sink: g.sink}

  def intersect(a: str, b: str) -> str:
    while a != b:
      while rank[a] < rank[b]:
        a = ipdom[a]  # type: ignore[assignment]
      while rank[b] < rank[a]:
        b = ipdom[b]  # type: ignore[assignment]
    return a

  for name in reversed(names[:-1]):  # successors always come later in topological order
    succ = g.successors(name)
    current = succ[0]
    for s in succ[1:]:
      current = intersect(current, s)
    ipdom[name] = current
  ipdom[g.sink] = None
  return ipdom


def _chain_from(g: LayerGraph, start: str, stop: str | None, ipdom) -> Chain:
  """The Chain from `start` up to (not including) `stop`."""
  items: list[str | Parallel] = []
  current: str | None = start
  while current is not None and current != stop:
    if len(g.predecessors(current)) > 1 and items and not isinstance(items[-1], Parallel):
      raise UserError(f"graph of {g.model} is not series-parallel at '{current}': "
                      "a join must close the fork that opened its branches")
    items.append(current)
    succ = g.successors(current)
    if not succ:
      break
    if len(succ) == 1:
      nxt = succ[0]
      if len(g.predecessors(nxt)) > 1 and nxt != stop:
        # nxt joins branches; it is reached here only from inside a branch
        raise UserError(f"graph of {g.model} is not series-parallel: branch ending at "
                        f"'{current}' joins '{nxt}' outside its own fork/join block")
      current = nxt
      continue
    join = ipdom[current]
    if join is None:
      raise UserError(f"graph of {g.model}: fork at '{current}' never joins")
    if join == stop:
      raise UserError(f"graph of {g.model} is not series-parallel: fork at '{current}' joins "
                      f"directly into '{join}', which closes an outer block; give the inner "
                      "branches their own join layer")
    branches = []
    for s in succ:
      branches.append(Chain(()) if s == join else _chain_from(g, s, join, ipdom))
    seen: set[str] = set()
    for b in branches:
      flat = set(flat_layers(b))
      if flat & seen:
        raise UserError(f"graph of {g.model} is not series-parallel: branches of fork "
                        f"'{current}' share layers {sorted(flat & seen)[:3]}")
      seen |= flat
    expected = set(g.predecessors(join))
    ends = {_last(b) or current for b in branches}
    if ends != expected:
      raise UserError(f"graph of {g.model} is not series-parallel: join '{join}' reads "
                      f"{sorted(expected)} but the branches of fork '{current}' end at "
                      f"{sorted(ends)}")
    items.append(Parallel(current, join, tuple(branches)))
    current = join
  return Chain(tuple(items))


def flat_layers(item: Chain | Parallel) -> Iterable[str]:
  """Layers of a chain (or of a block's branches) in series-parallel order: a topological order
  in which each branch runs in full before the next."""
  if isinstance(item, Parallel):
    for branch in item.branches:
      yield from flat_layers(branch)
    return
  for it in item.items:
    if isinstance(it, Parallel):
      yield from flat_layers(it)
    else:
      yield it


def _last(chain: Chain) -> str | None:
  if not chain.items:
    return None
  last = chain.items[-1]
  assert isinstance(last, str), "a chain never ends in a Parallel block"
  return last
