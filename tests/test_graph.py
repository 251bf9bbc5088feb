"""LayerGraph: topological order, series-parallel decomposition, fork/join blocks, JSON."""

import json

import pytest

from dp_jax.base.errors import UserError
from dp_jax.graph.layer_graph import Chain, LayerGraph, LayerNode, Parallel


def N(name, *inputs, kind="conv2d", **kw):
  return LayerNode(name, kind, tuple(inputs), **kw)


def toy_graph():
  """stem -> residual block (identity shortcut) -> inception-like module with a nested fork."""
  return LayerGraph("toy", (32, 32, 3), "float32", (
      N("stem"), N("b.c1", "stem"), N("b.c2", "b.c1"), N("b.add", "b.c2", "stem", kind="add"),
      N("m.a", "b.add"), N("m.b", "b.add"), N("m.b.x", "m.b"), N("m.b.y", "m.b"),
      N("m.b.cat", "m.b.x", "m.b.y", kind="concat"), N("m.cat", "m.a", "m.b.cat", kind="concat"),
      N("fc", "m.cat", kind="linear", params=10, param_bytes=40)))


def test_decompose_finds_nested_series_parallel_structure():
  chain = toy_graph().decompose()
  assert chain.items[0] == "stem"
  block = chain.items[1]
  assert isinstance(block, Parallel) and (block.fork, block.join) == ("stem", "b.add")
  assert block.branches == (Chain(("b.c1", "b.c2")), Chain(()))  # identity shortcut is empty
  module = chain.items[3]
  assert (module.fork, module.join) == ("b.add", "m.cat")
  inner = module.branches[1].items[1]
  assert isinstance(inner, Parallel) and inner.join == "m.b.cat"
  assert chain.items[-2:] == ("m.cat", "fc")


def test_fork_join_blocks_lists_every_block_outermost_first():
  blocks = toy_graph().fork_join_blocks()
  assert [(b.fork, b.join) for b in blocks] == [("stem", "b.add"), ("b.add", "m.cat"),
                                               ("m.b", "m.b.cat")]
  assert blocks[1].branches == (("m.a",), ("m.b", "m.b.x", "m.b.y", "m.b.cat"))


def test_json_round_trip_is_exact():
  g = toy_graph()
  g2 = LayerGraph.from_json(json.loads(json.dumps(g.to_json())))
  assert g2 == g
  assert g2.fork_join_blocks() == g.fork_join_blocks()
  assert g.to_json()["totals"]["params"] == 10


def test_from_json_sorts_nodes_topologically():
  d = toy_graph().to_json()
  d["nodes"] = list(reversed(d["nodes"]))
  g = LayerGraph.from_json(d)
  assert sorted(g.names) == sorted(toy_graph().names)
  position = {name: i for i, name in enumerate(g.names)}
  assert all(position[p] < position[n.name] for n in g.nodes for p in n.inputs)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["nodes"][0].update(inputs=["fc"]), "cycle"),
    (lambda d: d["nodes"][1].pop("param_bytes"), "missing required field 'param_bytes'"),
    (lambda d: d["nodes"][1].update(param_bytes="big"), "expected int"),
    (lambda d: d["nodes"][2].update(inputs=["ghost"]), "'ghost', which is not a layer"),
    (lambda d: d["nodes"].append(dict(d["nodes"][1])), "duplicate layer name"),
    (lambda d: d.pop("nodes"), "missing required field 'nodes'"),
])
def test_bad_graph_json_gives_one_clear_line(mutate, message):
  d = toy_graph().to_json()
  mutate(d)
  with pytest.raises(UserError, match=message) as info:
    LayerGraph.from_json(d)
  assert "\n" not in str(info.value)


def test_load_reports_malformed_json(tmp_path):
  p = tmp_path / "g.json"
  p.write_text("{not json")
  with pytest.raises(UserError, match="not valid JSON"):
    LayerGraph.load(p)
  with pytest.raises(UserError, match="not found"):
    LayerGraph.load(tmp_path / "missing.json")


def test_non_series_parallel_graph_is_rejected():
  # b reads a and c's branch crosses into the other branch's join: not series-parallel.
  nodes = (N("s"), N("a", "s"), N("b", "s"), N("c", "a", "b", kind="add"),
           N("d", "a", "c", kind="add"))
  with pytest.raises(UserError, match="series-parallel"):
    LayerGraph("bad", (1,), "float32", nodes).decompose()


def test_single_source_and_sink_required():
  with pytest.raises(UserError, match="exactly one output"):
    LayerGraph("two_sinks", (1,), "float32", (N("s"), N("a", "s"), N("b", "s")))
