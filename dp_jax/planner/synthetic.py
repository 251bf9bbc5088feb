"""Synthetic layer graphs, profiles and clusters for planner tests and benchmarks (no JAX, no
model zoo)."""

from __future__ import annotations

import numpy as np

from dp_jax.graph.layer_graph import LayerGraph, LayerNode
from dp_jax.hardware.cluster import ClusterConfig
from dp_jax.layer_times.table import ProfileTable

# A synthetic cluster's links: collectives at line rate, no latency growth with the nodes
# spanned, no program or boundary terms, the update at the device's datasheet bandwidth; its
# numbers are invented (what_if: not checked against a datasheet). A real cluster states each of
# these with its source (conf/cluster/).
IDEAL_LINKS = dict(intra_node_bus_efficiency=1.0, inter_node_bus_efficiency=1.0,
                   inter_node_latency_per_doubling_us=0.0, program_launch_us=0.0,
                   stage_boundary_us=0.0, update_memory_GBps=0.0, what_if=True)


def cluster(*args, **kw) -> ClusterConfig:
  """A ClusterConfig (its fields, positional or by name) with IDEAL_LINKS where not given."""
  return ClusterConfig(*args, **{**IDEAL_LINKS, **kw})


class _Builder:
  """Appends nodes with shapes and parameter sizes in the style of a CNN trace."""

  def __init__(self, rng: np.random.Generator):
    self.nodes: list[LayerNode] = []
    self.rng = rng

  def add(self, name, kind, inputs, channels, hw, params=0):
    out = channels * hw * hw
    self.nodes.append(LayerNode(
        name=name, kind=kind, inputs=tuple(i for i in inputs if i is not None),
        params=int(params), param_bytes=4 * int(params),
        out_shape=(hw, hw, channels), out_bytes_per_sample=2 * out,
        flops_per_sample=float(2 * params * hw * hw if kind == "conv" else out)))
    return name

  def conv_bn_relu(self, prefix, src, cin, cout, hw, k=3, relu=True):
    x = self.add(f"{prefix}.conv", "conv", [src], cout, hw, params=k * k * cin * cout)
    x = self.add(f"{prefix}.bn", "batch_norm", [x], cout, hw, params=2 * cout)
    return self.add(f"{prefix}.relu", "relu", [x], cout, hw) if relu else x

  def graph(self, model):
    return LayerGraph(model=model, input_shape=(224, 224, 3), input_dtype="float32",
                      nodes=tuple(self.nodes))


def resnet_like(blocks=(3, 4, 6, 3), width=64, seed=0) -> LayerGraph:
  """Bottleneck ResNet: identity or downsample shortcuts joined by an add (ResNet-50 sized)."""
  b = _Builder(np.random.default_rng(seed))
  x = b.conv_bn_relu("stem", None, 3, width, 112, k=7)
  x = b.add("stem.pool", "max_pool", [x], width, 56)
  cin, hw = width, 56
  for stage, n in enumerate(blocks):
    mid = width * 2 ** stage
    cout = mid * 4
    for i in range(n):
      p = f"layer{stage + 1}.{i}"
      hw_out = hw // 2 if (i == 0 and stage > 0) else hw
      y = b.conv_bn_relu(f"{p}.a", x, cin, mid, hw_out, k=1)
      y = b.conv_bn_relu(f"{p}.b", y, mid, mid, hw_out)
      y = b.conv_bn_relu(f"{p}.c", y, mid, cout, hw_out, k=1, relu=False)
      short = x
      if i == 0:
        short = b.conv_bn_relu(f"{p}.down", x, cin, cout, hw_out, k=1, relu=False)
      y = b.add(f"{p}.add", "add", [y, short], cout, hw_out)
      x = b.add(f"{p}.out", "relu", [y], cout, hw_out)
      cin, hw = cout, hw_out
  x = b.add("pool", "avg_pool", [x], cin, 1)
  b.add("fc", "dense", [x], 1000, 1, params=cin * 1000 + 1000)
  return b.graph("resnet_like")


def inception_like(modules=11, seed=0) -> LayerGraph:
  """Inception-v3 sized: 4-branch modules, some with a nested fork inside a branch."""
  b = _Builder(np.random.default_rng(seed))
  x = b.conv_bn_relu("stem.0", None, 3, 32, 149)
  for i, (cin, cout, hw) in enumerate([(32, 32, 147), (32, 64, 147), (64, 80, 73), (80, 192, 71)]):
    x = b.conv_bn_relu(f"stem.{i + 1}", x, cin, cout, hw)
  x = b.add("stem.pool", "max_pool", [x], 192, 35)
  cin, hw = 192, 35
  for m in range(modules):
    if m in (3, 8):
      hw = max(hw // 2, 8)
    p, c = f"mixed{m}", max(cin // 4, 32)
    ends = [b.conv_bn_relu(f"{p}.b1", x, cin, c, hw, k=1)]
    y = b.conv_bn_relu(f"{p}.b2.0", x, cin, c, hw, k=1)
    ends.append(b.conv_bn_relu(f"{p}.b2.1", y, c, c, hw, k=5))
    y = b.conv_bn_relu(f"{p}.b3.0", x, cin, c, hw, k=1)
    y = b.conv_bn_relu(f"{p}.b3.1", y, c, c, hw)
    if m >= 9:  # Inception-E: a nested fork inside the branch
      u = b.conv_bn_relu(f"{p}.b3.2a", y, c, c, hw)
      v = b.conv_bn_relu(f"{p}.b3.2b", y, c, c, hw)
      y = b.add(f"{p}.b3.cat", "concat", [u, v], 2 * c, hw)
    else:
      y = b.conv_bn_relu(f"{p}.b3.2", y, c, c, hw)
    ends.append(y)
    y = b.add(f"{p}.b4.pool", "avg_pool", [x], cin, hw)
    ends.append(b.conv_bn_relu(f"{p}.b4.1", y, cin, c, hw, k=1))
    cin = sum(b.nodes[[n.name for n in b.nodes].index(e)].out_shape[-1] for e in ends)
    x = b.add(f"{p}.cat", "concat", ends, cin, hw)
  x = b.add("pool", "avg_pool", [x], cin, 1)
  b.add("fc", "dense", [x], 1000, 1, params=cin * 1000 + 1000)
  return b.graph("inception_like")


def analytic_profile(graph: LayerGraph, batches, *, tflops=100.0, overhead_ms=0.02,
                     hbm_GBps=1500.0, device="synthetic") -> ProfileTable:
  """Roofline-style timings: overhead + max(FLOPs / peak, bytes / HBM); backward = 2 x forward."""
  layers = {}
  for n in graph.nodes:
    rows = {}
    for bsz in batches:
      compute = 3 * n.flops_per_sample * bsz / (tflops * 1e9)  # fwd + 2x bwd FLOPs, in ms
      memory = (3 * n.out_bytes_per_sample * bsz + n.param_bytes) / (hbm_GBps * 1e6)
      fwd = overhead_ms + max(compute, memory) / 3
      rows[int(bsz)] = (fwd, 2 * fwd)
    layers[n.name] = rows
  return ProfileTable(model=graph.model, device=device, dtype="bfloat16", source="analytic",
                      layers=layers, meta={"note": "synthetic roofline profile"})


def linear_profile(graph: LayerGraph, batches, rng: np.random.Generator) -> ProfileTable:
  """Random per-layer timings t(b) = a + c b (forward; backward a random multiple)."""
  layers = {}
  for n in graph.nodes:
    a, c, r = rng.uniform(0.01, 1.0), rng.uniform(0.0, 0.2), rng.uniform(1.0, 2.5)
    layers[n.name] = {int(bsz): (a + c * bsz, r * (a + c * bsz)) for bsz in batches}
  return ProfileTable(model=graph.model, device="synthetic", dtype="float32", source="analytic",
                      layers=layers)


def random_layer(rng: np.random.Generator, nodes: list[LayerNode], inputs) -> str:
  """Append a synthetic layer with random parameters and output size; its name."""
  params = int(rng.integers(0, 3)) * int(rng.integers(1, 10**6))
  nodes.append(LayerNode(name=f"n{len(nodes)}", kind="synthetic", inputs=tuple(inputs),
                         params=params, param_bytes=4 * params,
                         out_bytes_per_sample=int(rng.integers(1, 10**5))))
  return nodes[-1].name


def random_series_parallel(rng: np.random.Generator, max_layers: int = 8) -> LayerGraph:
  """A random series-parallel graph: chains with (nested) fork/join blocks, identity branches."""
  nodes: list[LayerNode] = []

  def node(inputs):
    return random_layer(rng, nodes, inputs)

  def chain(src, depth, allow_empty):
    cur = src
    for step in range(int(rng.integers(0 if allow_empty else 1, 3))):
      left = max_layers - len(nodes)
      if left <= 0:
        break
      if (step > 0 or depth == 0) and depth < 2 and left >= 4 and rng.random() < 0.4:
        ends, identity = [], False
        for _ in range(int(rng.integers(2, 4))):
          end = chain(cur, depth + 1, not identity)
          identity |= end == cur
          ends.append(end)
        cur = node(list(dict.fromkeys(ends)))
      else:
        cur = node([cur])
    return cur

  chain(node([]), 0, True)
  return LayerGraph(model="random_sp", input_shape=(1,), input_dtype="float32",
                    nodes=tuple(nodes))
