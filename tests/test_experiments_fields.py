"""experiments/fields.py: identity columns from a config, ratios, markdown cells and pivots."""

import math

from dp_jax.report.compare import GPU_VALIDATED_TOLERANCE, VALIDATED_TOLERANCE
from experiments.fields import (
  basis_line,
  data_parallel_label,
  gpu_change,
  limit_label,
  median_gpu_change,
  memory_need,
  number,
  pivot,
  plan_identity,
  ratio,
  tally,
  times,
  tolerance,
)


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
  assert gpu_change(0.123) == "1.14x less" and gpu_change("x") == "-"
  assert gpu_change(-11.54) == "12.5x more"  # not "-1154%"
  assert limit_label(2.0) == "2" and limit_label(1.5) == "1.5" and limit_label(math.inf) == "inf"


def test_pivot_is_a_markdown_table_with_dashes_for_missing_cells():
  rows = [{"m": "a", "g": 1, "v": "x"}, {"m": "a", "g": 2, "v": "y"}, {"m": "b", "g": 1, "v": "z"}]
  text = pivot(rows, row_key="m", row_header="model", value=lambda r: r["v"],
               cols=[(f"G={g}", lambda r, g=g: r["g"] == g) for g in (1, 2)])
  assert text.splitlines() == ["| model | G=1 | G=2 |", "|---|---|---|", "| a | x | y |",
                               "| b | z | - |"]


def test_an_unrecorded_tolerance_is_the_validated_one_of_the_cells_device():
  assert tolerance({"device": "A100-SXM4-40GB"}) == GPU_VALIDATED_TOLERANCE
  assert tolerance({"config": {"cluster": {"device": "H100-SXM5-80GB"}}}) == GPU_VALIDATED_TOLERANCE
  assert tolerance({"device": "cpu"}) == tolerance({}) == VALIDATED_TOLERANCE
  assert tolerance({"device": "A100-SXM4-40GB", "comparison_tolerance": 0.01}) == 0.01


def test_a_plan_that_is_data_parallelism_is_counted_as_such_not_judged():
  rows = [{"speedup": 1.5, "comparison_tolerance": 0.05},
          {"speedup": 1.0, "comparison_tolerance": 0.05},
          {"speedup": 1.3, "comparison_tolerance": 0.05, "plan_data_parallel_devices": 8}]
  assert data_parallel_label(rows[2]) == "DP on 8" and data_parallel_label(rows[0]) is None
  assert tally(rows, "speedup") == "1 ahead, 1 tie, 0 behind, 1 is DP"
  assert tally(rows[:2], "speedup") == "1 ahead, 1 tie, 0 behind"


def test_basis_saving_and_memory_need_are_read_from_the_rows():
  rows = [{"basis": "bf16 gradients; calibrated A100 profile; A=2"},
          {"basis": "bf16 gradients; calibrated A100 profile; A=2"}, {"basis": "x; A=inf"}]
  assert basis_line(rows) == ("Verdicts rest on: `bf16 gradients; calibrated A100 profile; A=2`, "
                              "`x; A=inf`.")
  assert "not recorded" in basis_line([{}])
  assert (median_gpu_change([{"s": 0.1}, {"s": 0.3}, {"s": None}], "s")
          == "median 1.25x less over 2 cells")  # saved 20%: 0.8 of the baseline's GPU time
  assert median_gpu_change([{}], "s") == "not recorded"
  assert memory_need("no plan fits in 40 GB per device: device 0 needs 40.37 GB; largest layer "
                     "there is 'h.0'") == (40.37, 40.0)
  assert memory_need("layer 'h.0' does not fit in 80 GB per device on dgx_h100 at any device "
                     "count: it needs 91.50 GB (params+grads+optimizer 1.00 GB)") == (91.5, 80.0)
  assert memory_need("num_devices (64) is larger than global_batch (32)") is None
