"""Importing DeepPool's A100 tables onto LayerGraphs: coverage, totals, blocks, clear errors."""

import pytest
from profile_ref_graphs import inception_v3, resnet, vgg16, wide_resnet101_2

from dp_jax.base.errors import UserError
from dp_jax.layer_times.deeppool_import import DEFAULT_DATA_DIR, import_deeppool_a100
from dp_jax.layer_times.deeppool_rows import parse_file


@pytest.fixture(scope="module")
def vgg():
  """The zoo's VGG16 graph (abstract: nothing allocated)."""
  from dp_jax.models.trace import trace_graph
  from dp_jax.models.zoo import build_model

  g = trace_graph(build_model("vgg16", abstract=True), "vgg16")
  return g, *import_deeppool_a100(g)


def test_vgg16_covers_every_layer_at_batches_1_to_32(vgg):
  g, table, rep = vgg
  assert rep.unmatched == [] and set(rep.matched) == set(g.names)
  assert table.source == "imported" and table.device == "A100-SXM4-40GB"
  for name in g.names:
    for b in range(1, 33):
      t = table.lookup(name, b)
      assert t.fwd_ms > 0 and t.bwd_ms > 0
      assert t.interpolated == (b not in (1, 2, 3, 4, 6, 8, 16, 32))


def test_vgg16_total_at_32_matches_deeppool_sum(vgg):
  _, table, _ = vgg
  assert table.iteration_ms(32) == pytest.approx(53.734, rel=0.15)
  assert table.iteration_ms(1) == pytest.approx(5.529, rel=0.15)


def test_vgg16_conv_backward_taken_from_relu_row(vgg):
  _, table, rep = vgg
  conv, relu = table.lookup("features.2", 32), table.lookup("features.3", 32)
  assert conv.bwd_ms > conv.fwd_ms  # 6.75 ms moved from the ReLU row
  assert relu.bwd_ms == pytest.approx(1.5 * relu.fwd_ms)
  assert list(rep.estimated) == ["classifier.4"]  # no ReLU after the last linear carries its bwd


def test_wrn_blocks_split_and_sum_to_rows():
  g = wide_resnet101_2()
  table, rep = import_deeppool_a100(g)
  assert rep.unmatched == []
  assert len(rep.groups) == 33
  rows = [r for r in parse_file(DEFAULT_DATA_DIR / "A100_wrn.prof")
          if r.kind == "ResnetBottleneck" and r.batch == 8]
  first = rep.groups[0]
  assert [n.split(".")[-1] for n in first] == ["conv1", "conv2", "conv3", "downsample", "add"]
  assert sum(table.lookup(n, 8).total_ms for n in first) == pytest.approx(rows[0].total_ms,
                                                                          rel=1e-3)
  assert table.iteration_ms(32) == pytest.approx(103.8, rel=0.01)
  assert any("0.2% median" in n for n in rep.notes)  # wrnLayerGpuProfileA100V2.txt agrees


def test_inception_uses_both_files():
  g = inception_v3()
  table, rep = import_deeppool_a100(g)
  from_txt = {n for n, f in rep.sources.items() if f.endswith(".txt")}
  kinds = {g.node(n).kind for n in from_txt}
  assert kinds == {"concat", "avgpool", "flatten", "linear"}
  assert rep.unmatched == []
  assert table.batches("fc") == [1, 2, 4, 8, 16, 32, 64]  # batches the .prof can calibrate


def test_resnet50_reports_unmatched_adds():
  g = resnet()
  _, rep = import_deeppool_a100(g)
  assert rep.unmatched == [n for n in g.names if g.node(n).kind == "add"]
  assert rep.sources["conv1"].endswith("#RESNET152")


def test_resnet50_adds_are_filled_from_the_calibrated_analytic_model_and_marked():
  g = resnet()
  table, rep = import_deeppool_a100(g)
  adds = [n for n in g.names if g.node(n).kind == "add"]
  assert rep.filled == adds and table.missing(list(g.names)) == []
  assert sorted(table.meta["estimated_layers"]) == sorted(adds)
  matched_batches = set(table.batches("conv1"))
  for n in adds:
    assert set(table.batches(n)) >= matched_batches
    per_batch = [sum(table.layers[n][b]) for b in table.batches(n)]
    assert all(0 < x < y for x, y in zip(per_batch, per_batch[1:], strict=False))
  # an elementwise add costs less than the 3x3 convolution beside it at every batch
  for b in matched_batches:
    assert sum(table.layers["layer1.0.add"][b]) < sum(table.layers["layer1.0.conv2"][b])


def test_hand_built_vgg16_matches_too():
  _, rep = import_deeppool_a100(vgg16())
  assert rep.unmatched == []


def test_32px_graph_matches_nothing():
  _, rep = import_deeppool_a100(vgg16(image_size=32, num_classes=10))
  assert "features.0" in rep.unmatched


def test_missing_dir_is_one_line(tmp_path):
  with pytest.raises(UserError) as e:
    import_deeppool_a100(vgg16(), tmp_path / "nope")
  assert "not found" in str(e.value) and "\n" not in str(e.value)
