"""DeepPool row parsing: both file formats, bare feature dims, totals skipped, bad rows named."""

import pytest

from dp_jax.base.errors import UserError
from dp_jax.layer_times.deeppool_rows import move_relu_backward, parse_file, parse_line

CONV = 'conv2d{"in_channels":3,"kernel_size":3,"out_channels":64,"padding":1,"stride":1}'
RELU = 'ReLU2d{"inplace":true,"kernel_size":1,"padding":0,"stride":1}'


def test_prof_row():
  r = parse_line(f"   {CONV}[32][3,224,224]   1.088      1087         3", "A100_vgg.prof", 7)
  assert (r.kind, r.batch, r.dims) == ("conv2d", 32, (3, 224, 224))
  assert r.fwd_ms == pytest.approx(1.087) and r.bwd_ms == pytest.approx(0.003)
  assert r.params["out_channels"] == 64
  assert r.template == f"{CONV}[b][3,224,224]"


def test_txt_row_takes_median_and_bare_features():
  line = 'linear{"bias":true,"in_features":25088,"out_features":4096}[32]25088  1.9  1.8  2.0 2.1'
  r = parse_line(line, "vggLayerGpuProfileA100.txt", 3)
  assert r.dims == (25088,) and r.total_ms == 1.8 and r.fwd_ms is None
  r2 = parse_line('linear{"bias":true}[128][512]   0.032   0.031', "vit.txt", 1)
  assert r2.dims == (512,) and r2.total_ms == 0.031


@pytest.mark.parametrize("line", ["", "   SUM(avg)  53.734", "sum:   49.98",
                                  "    #config  avg(ms)    p50     p90     p99",
                                  "SUM(avg)  25.191  27.22(NoSync)"])
def test_totals_and_headers_skipped(line):
  assert parse_line(line, "x.prof", 1) is None


def test_malformed_row_names_file_and_line():
  with pytest.raises(UserError) as e:
    parse_line(f"{CONV}[32][3,224,224]  1.0  2.0", "A100_vgg.prof", 12)
  assert "A100_vgg.prof:12" in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(UserError, match="cannot parse row"):
    parse_line("conv2d[32] fast", "x.txt", 3)


def test_relu_backward_moves_to_conv(tmp_path):
  p = tmp_path / "t.prof"
  p.write_text(f"{CONV}[2][3,8,8] 0.3 100 1\n{RELU}[2][64,8,8] 0.9 10 800\n")
  conv, relu = move_relu_backward(parse_file(p))
  assert relu.bwd_ms == pytest.approx(0.015)  # 1.5 x its forward
  assert conv.bwd_ms == pytest.approx(0.001 + 0.8 - 0.015)
  assert conv.bwd_ms + relu.bwd_ms == pytest.approx(0.801)


def test_sections_recorded(tmp_path):
  p = tmp_path / "r.txt"
  p.write_text(f"{CONV}[1][3,8,8] 1 1 1 1\n\n#RESNET152\n{CONV}[1][3,8,8] 2 2 2 2\n")
  assert [r.section for r in parse_file(p)] == ["", "RESNET152"]


def test_missing_file():
  with pytest.raises(UserError, match="not found"):
    parse_file("/nonexistent/A100_vgg.prof")
