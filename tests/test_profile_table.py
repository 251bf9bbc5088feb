"""ProfileTable: exact at profiled batches, interpolation flagged, clear errors for bad input."""

import json

import pytest

from dp_jax.base.errors import UserError
from dp_jax.layer_times.table import MissingProfileError, ProfileTable


def _table():
  return ProfileTable("m", "cpu", "float32", "measured",
                      {"a": {1: (1.0, 2.0), 4: (2.0, 4.0), 16: (8.0, 16.0)}})


def test_exact_at_profiled_points():
  t = _table()
  for b, (f, w) in t.layers["a"].items():
    got = t.lookup("a", b)
    assert (got.fwd_ms, got.bwd_ms, got.interpolated) == (f, w, False)


def test_interpolation_is_flagged_and_loglog():
  t = _table()
  got = t.lookup("a", 2)
  assert got.interpolated
  assert got.fwd_ms == pytest.approx(2 ** 0.5)  # halfway between 1 and 4 on a log scale
  assert t.lookup("a", 32).interpolated  # extrapolation too


def test_missing_layer_names_it():
  with pytest.raises(MissingProfileError) as e:
    _table().lookup("conv9", 4)
  assert "'conv9'" in str(e.value) and "\n" not in str(e.value)


def test_roundtrip_json(tmp_path):
  t = _table()
  back = ProfileTable.load(t.save(tmp_path / "p.json"))
  assert back.layers == t.layers and back.source == "measured"


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.pop("device"), "missing required field 'device'"),
    (lambda d: d.update(layers=[]), "field 'layers' has type list"),
    (lambda d: d["layers"]["a"]["1"].pop("bwd_ms"), "missing field 'bwd_ms'"),
    (lambda d: d["layers"]["a"]["1"].update(fwd_ms="fast"), "field 'fwd_ms' has type str"),
    (lambda d: d["layers"]["a"].update(x={"fwd_ms": 1, "bwd_ms": 1}), "batch key 'x'"),
    (lambda d: d.update(source="guessed"), "source 'guessed' is unknown"),
])
def test_malformed_json_is_one_line(tmp_path, mutate, words):
  d = _table().to_json()
  mutate(d)
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(d))
  with pytest.raises(UserError) as e:
    ProfileTable.load(path)
  assert words in str(e.value) and "\n" not in str(e.value)


def test_negative_time_rejected():
  with pytest.raises(UserError, match="invalid timing"):
    ProfileTable("m", "cpu", "float32", "measured", {"a": {1: (-1.0, 0.0)}})
