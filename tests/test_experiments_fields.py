"""experiments/fields.py: identity columns from a config, ratios, markdown cells and pivots."""

import math

from experiments.fields import limit_label, number, percent, pivot, plan_identity, ratio, times


def test_plan_identity_reads_the_config():
  cfg = {"model": {"name": "vgg16"}, "cluster": {"name": "dgx_a100", "device": "A100",
                                                 "num_devices": 8},
         "planner": {"amplification_limit": math.inf}, "batch_size": 32}
  assert plan_identity(cfg) == {"model": "vgg16", "cluster": "dgx_a100", "device": "A100",
                                "num_devices": 8, "global_batch": 32,
                                "amplification_limit": math.inf}
  assert plan_identity({})["model"] is None


def test_numbers_and_labels():
  assert number("2.5") == 2.5 and number(None) is None and number(math.inf) is None
  assert ratio(3, 2) == 1.5 and ratio(1, 0) is None and ratio(None, 2) is None
  assert times(1.234) == "1.23x" and times(None) == "-"
  assert percent(0.123) == "12%" and percent("x") == "-"
  assert limit_label(2.0) == "2" and limit_label(1.5) == "1.5" and limit_label(math.inf) == "inf"


def test_pivot_is_a_markdown_table_with_dashes_for_missing_cells():
  rows = [{"m": "a", "g": 1, "v": "x"}, {"m": "a", "g": 2, "v": "y"}, {"m": "b", "g": 1, "v": "z"}]
  text = pivot(rows, row_key="m", row_header="model", value=lambda r: r["v"],
               cols=[(f"G={g}", lambda r, g=g: r["g"] == g) for g in (1, 2)])
  assert text.splitlines() == ["| model | G=1 | G=2 |", "|---|---|---|", "| a | x | y |",
                               "| b | z | - |"]
