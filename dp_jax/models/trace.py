"""trace_graph: a GraphModel's layers as a LayerGraph, with shapes, params and XLA costs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.models.base import GraphModel, LayerSpec

# Costs are per-sample marginals: cost(batch 2) - cost(batch 1) of the layer's forward,
# from XLA's cost analysis of the lowered (unoptimized, unfused) HLO. Fixed per-step
# traffic such as reading the weights is thereby excluded; it is in param_bytes. Saved
# activations likewise: residual bytes of the forward-with-residuals at batch 2 minus batch 1
# (the weights a backward also keeps do not grow with the batch).
COST_BATCHES = (1, 2)
_IN_SHAPE_KINDS = frozenset({"conv2d", "maxpool", "avgpool", "relu", "flatten", "add", "concat"})


# What every model provides (docs/extending.md, "The protocol: GraphModel")
PROTOCOL = {"input_spec": "input_spec(batch): a jax.ShapeDtypeStruct of a batch of inputs",
            "label_spec": "label_spec(batch): a jax.ShapeDtypeStruct of its labels",
            "layer_specs": "layer_specs(): its LayerSpecs in topological order (or a `layers` "
                           "sequence)"}


def check_protocol(model: GraphModel, model_name: str) -> None:
  """A one-line UserError naming the method of `model`'s class that is missing or returns the
  wrong kind of value (instead of a bare NotImplementedError later)."""
  cls = f"{type(model).__module__}.{type(model).__qualname__}"
  for method, want in PROTOCOL.items():
    args = () if method == "layer_specs" else (1,)
    try:
      got = getattr(model, method)(*args)
    except NotImplementedError:
      raise UserError(f"model {model_name}: {cls} does not define {want}; see "
                      "docs/extending.md") from None
    if method == "layer_specs":
      ok = isinstance(got, list | tuple) and got and all(isinstance(s, LayerSpec) for s in got)
    else:
      ok = isinstance(got, jax.ShapeDtypeStruct) and got.shape[:1] == (1,)
    if not ok:
      raise UserError(f"model {model_name}: {cls}.{method} returned {_short(got)}; it must "
                      f"be {want}, batch first (docs/extending.md)")


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def trace_graph(model: GraphModel, model_name: str) -> LayerGraph:
  """Trace every layer of `model` abstractly (works on nnx.eval_shape models too)."""
  specs = model.layer_specs()
  b1, b2 = COST_BATCHES
  x1, x2 = model.input_spec(b1), model.input_spec(b2)
  outs: dict[int, dict[str, jax.ShapeDtypeStruct]] = {b1: {}, b2: {}}
  counted: set[int] = set()  # ids of Params already owned by an earlier layer (ties)
  cache: dict[Any, tuple] = {}
  nodes = []
  for s in specs:
    ins = {b: [outs[b][p] for p in s.inputs] if s.inputs else [x] for b, x in ((b1, x1), (b2, x2))}
    (o1, c1), (o2, c2) = _lower_layer(s.module, ins[b1], ins[b2], cache)
    saved = max(0, c2["saved"] - c1["saved"]) // (b2 - b1)
    w1, w2 = c1["work"], c2["work"]
    outs[b1][s.name], outs[b2][s.name] = o1, o2
    params, param_bytes = _own_params(s.module, counted)
    in_shape = ins[b1][0].shape[1:]
    nodes.append(LayerNode(
        name=s.name, kind=s.kind, inputs=s.inputs, params=params, param_bytes=param_bytes,
        out_shape=tuple(o1.shape[1:]),
        out_bytes_per_sample=int(np.prod(o1.shape[1:], dtype=np.int64)) * o1.dtype.itemsize,
        flops_per_sample=max(0.0, c2["flops"] - c1["flops"]) / (b2 - b1),
        bytes_accessed_per_sample=max(0.0, c2["bytes"] - c1["bytes"]) / (b2 - b1),
        attrs=node_attrs(s, in_shape), saved_bytes_per_sample=int(saved),
        matmul_flops_per_sample=max(0.0, w2.matmul - w1.matmul) / (b2 - b1),
        conv_flops_per_sample=max(0.0, w2.conv - w1.conv) / (b2 - b1),
        gathered_param_bytes=w2.gathered_param_bytes,
        gemm=w2.gemm_per_sample(b2)))
  return LayerGraph(
      model=model_name, input_shape=tuple(x1.shape[1:]), input_dtype=str(x1.dtype),
      nodes=tuple(nodes),
      meta={"config": dict(getattr(model, "config", {})),
            "cost_source": "xla_cost_analysis(lowered)", "cost_batches": list(COST_BATCHES),
            "saved_source": "residuals of jax.vjp (the forward-with-residuals outputs)",
            "work_source": WORK_SOURCE})


def node_attrs(s: LayerSpec, in_shape: tuple[int, ...]) -> dict[str, Any]:
  """The spec's attrs plus what needs shapes: in_shape, a global pool's kernel size."""
  attrs = dict(s.attrs)
  if s.kind in _IN_SHAPE_KINDS:
    attrs["in_shape"] = [int(d) for d in in_shape]
  if s.kind in ("maxpool", "avgpool") and attrs.get("global"):
    attrs["kernel_size"] = [int(d) for d in in_shape[:2]]
  return attrs


def _lower_layer(module: nnx.Module, ins1: list, ins2: list, cache: dict):
  """(out ShapeDtypeStruct, {flops, bytes}) of the layer's forward at both cost batches."""
  graphdef, state = nnx.split(module)
  state_sds = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
  key = (graphdef, _avals(state_sds), _avals(ins1), _avals(ins2))
  if key not in cache:
    fn = jax.jit(lambda st, *xs: nnx.merge(graphdef, st)(*xs))
    pairs = []
    for ins in (ins1, ins2):
      out, cost = _lowered_cost(fn.lower(state_sds, *ins))
      work = traced_work(jax.make_jaxpr(lambda st, *xs: nnx.merge(graphdef, st)(*xs))(
          state_sds, *ins), len(jax.tree.leaves(state_sds)))
      pairs.append((out, {**cost, "saved": residual_bytes(graphdef, state_sds, ins),
                          "work": work}))
    cache[key] = tuple(pairs)
  return cache[key]


# What a node's matrix work is read from: the layer's jaxpr (matrix products, convolutions and
# the parameters it only gathers), so that a price never depends on the layer's label.
WORK_SOURCE = "jaxpr: dot_general, conv_general_dilated, gathered parameters"


@dataclass(frozen=True)
class Work:
  """A layer's forward work read from its jaxpr: FLOPs of its matrix products and of its
  convolutions (a multiply-add counts 2, as XLA's cost analysis), the bytes of the parameters
  it only gathers rows of (an embedding table: a step reads the gathered rows, not the table),
  and the largest matrix operation's output (rows, columns)."""

  matmul: float = 0.0
  conv: float = 0.0
  gathered_param_bytes: int = 0
  largest: tuple[float, tuple[int, ...]] = (0.0, ())  # (flops, output shape)

  def gemm_per_sample(self, batch: int) -> tuple[int, int] | None:
    """(output rows per sample, output columns) of the largest matrix operation."""
    flops, shape = self.largest
    if not flops or not shape:
      return None
    rows = int(np.prod(shape[:-1], dtype=np.int64)) // batch
    return max(1, rows), int(shape[-1])


def traced_work(closed, num_params: int) -> Work:
  """The Work of a layer's ClosedJaxpr whose first `num_params` inputs are its parameters."""
  jaxpr = closed.jaxpr
  uses: dict[Any, set[str]] = {v: set() for v in jaxpr.invars[:num_params]}
  totals = {"matmul": 0.0, "conv": 0.0}
  largest = [0.0, ()]

  def walk(j, scale: float, params: dict) -> None:
    """`params`: this jaxpr's variables that are a layer parameter -> that parameter."""
    for e in j.eqns:
      name = e.primitive.name
      subs = _sub_jaxprs(e)
      for k, v in enumerate(e.invars):
        if _is_var(v) and v in params and not subs:
          uses[params[v]].add("gather" if name == "gather" and k == 0 else name)
      flops = 0.0
      if name == "dot_general":
        (lc, _), _ = e.params["dimension_numbers"]
        k = int(np.prod([e.invars[0].aval.shape[d] for d in lc], dtype=np.int64))
        flops = 2.0 * _size(e.outvars[0].aval.shape) * k
        totals["matmul"] += scale * flops
      elif name == "conv_general_dilated":
        rhs = e.invars[1].aval.shape
        out_feature = e.params["dimension_numbers"].rhs_spec[0]
        flops = 2.0 * _size(e.outvars[0].aval.shape) * _size(rhs) / rhs[out_feature]
        totals["conv"] += scale * flops
      if flops * scale > largest[0]:
        largest[:] = [flops * scale, tuple(e.outvars[0].aval.shape)]
      for sub, times in subs:
        inner = {}
        if len(sub.invars) == len(e.invars):  # a call: its inputs are the equation's
          inner = {i: params[o] for o, i in zip(e.invars, sub.invars, strict=True)
                   if _is_var(o) and o in params}
        else:  # another calling convention: a parameter it reads counts as used by it
          for v in e.invars:
            if _is_var(v) and v in params:
              uses[params[v]].add(name)
        walk(sub, scale * times, inner)

  walk(jaxpr, 1.0, {v: v for v in uses})
  gathered = sum(_size(v.aval.shape) * np.dtype(v.aval.dtype).itemsize
                 for v, u in uses.items() if u == {"gather"})
  return Work(totals["matmul"], totals["conv"], int(gathered), (largest[0], largest[1]))


def _sub_jaxprs(eqn) -> list[tuple[Any, float]]:
  """The jaxprs an equation runs (pjit, checkpoint, custom_jvp/vjp, cond branches, scan bodies)
  and how many times each runs (a scan's length; a cond's branches are counted once, the
  costliest being unknown: each at 1)."""
  times = float(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else 1.0
  out = []
  for value in eqn.params.values():
    for v in value if isinstance(value, (list, tuple)) else (value,):
      inner = getattr(v, "jaxpr", v)
      if hasattr(inner, "eqns"):
        out.append((inner, times))
  return out


def _is_var(v) -> bool:
  """A jaxpr variable (literals, constants folded into the equation, are not hashable)."""
  return type(v).__name__ != "Literal"


def _size(shape) -> int:
  return int(np.prod(shape, dtype=np.int64)) if shape else 1


def forward_with_residuals(graphdef):
  """(state, *inputs) -> the residuals jax.vjp keeps for the layer's backward (a pytree)."""
  def fwd(st, *xs):
    return jax.vjp(lambda st, *xs: nnx.merge(graphdef, st)(*xs), st, *xs)[1]

  return fwd


def residual_bytes(graphdef, state_sds, ins: list) -> int:
  """Bytes of the residuals the layer's forward-with-residuals program outputs (abstract: the
  same as that program's compiled output size, which tests/test_trace.py checks)."""
  leaves = jax.tree.leaves(jax.eval_shape(forward_with_residuals(graphdef), state_sds, *ins))
  return int(sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
                 for x in leaves))


def _lowered_cost(lowered) -> tuple[jax.ShapeDtypeStruct, dict[str, float]]:
  out = lowered.out_info
  if not isinstance(out, jax.ShapeDtypeStruct):
    raise TypeError(f"a layer must return one array, got {jax.tree.structure(out)}")
  cost = lowered.cost_analysis()
  if not cost:  # some backends only analyse compiled executables
    cost = lowered.compile().cost_analysis()
  if isinstance(cost, list | tuple):
    cost = cost[0]
  return out, {"flops": float(cost.get("flops", 0.0)),
               "bytes": float(cost.get("bytes accessed", 0.0))}


def _avals(tree) -> tuple:
  leaves, treedef = jax.tree.flatten(tree)
  return (treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves))


def _own_params(module: nnx.Module, counted: set[int]) -> tuple[int, int]:
  """Count and bytes of the layer's nnx.Params not already owned by an earlier layer."""
  n = nbytes = 0
  for _, node in nnx.iter_graph(module):
    if isinstance(node, nnx.Param) and id(node) not in counted:
      counted.add(id(node))
      size = int(np.prod(node.shape, dtype=np.int64))
      n += size
      nbytes += size * np.dtype(node.dtype).itemsize
  return n, nbytes
