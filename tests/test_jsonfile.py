"""The project's JSON files are strict JSON: no NaN or Infinity, one-line errors on read."""

import json
import math

import pytest

from dp_jax.base.errors import UserError
from dp_jax.base.jsonfile import dumps, read_json, write_json


def test_non_finite_floats_become_null_and_the_text_is_strict_json(tmp_path):
  path = write_json(tmp_path / "a" / "x.json", {"loss": math.nan, "xs": (1.5, math.inf),
                                                "nested": {"y": -math.inf}})
  text = path.read_text()
  assert "NaN" not in text and "Infinity" not in text
  assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
      "loss": None, "xs": [1.5, None], "nested": {"y": None}}


def test_other_objects_are_written_as_their_string():
  assert json.loads(dumps({"p": tmp_path_like()})) == {"p": "somewhere"}


def tmp_path_like():
  class Named:
    def __str__(self):
      return "somewhere"

  return Named()


def test_malformed_file_is_one_line(tmp_path):
  (tmp_path / "bad.json").write_text("{")
  with pytest.raises(UserError) as e:
    read_json(tmp_path / "bad.json", "plan")
  assert "not valid JSON" in str(e.value) and "\n" not in str(e.value)
