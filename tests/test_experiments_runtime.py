"""experiments/runtime.py: step times are compared only where each device has a core."""

from experiments.runtime import add_speedup, headline, shares_cores


def cell(plan, g, step_ms, cores=2, processes=1):
  return {"model": "gpt2_small", "plan": plan, "background": "none", "num_devices": g,
          "global_batch": 32, "status": "ok", "median_step_ms": step_ms, "cpu_cores": cores,
          "processes": processes}


def test_more_devices_than_cores_in_one_process_share_cores():
  assert shares_cores(cell("burst", 8, 1.0))
  assert not shares_cores(cell("burst", 2, 1.0))
  assert not shares_cores(cell("burst", 8, 1.0, cores=8))
  assert not shares_cores(cell("burst", 8, 1.0, processes=8))  # pinned: a core each
  assert not shares_cores(cell("burst", 8, 1.0, cores=None))  # accelerators: no cores recorded


def test_no_speedup_is_given_for_cells_whose_devices_share_cores():
  rows = add_speedup([cell("data_parallel", 8, 200.0), cell("burst", 8, 100.0),
                      cell("data_parallel", 2, 30.0), cell("burst", 2, 20.0)])
  by = {(r["plan"], r["num_devices"]): r for r in rows}
  assert by["burst", 8]["speedup_vs_data_parallel"] is None
  assert by["burst", 2]["speedup_vs_data_parallel"] == 1.5
  table = headline(rows)
  assert "100.0 (shared cores)" in table and "200.0 (shared cores)" in table
  assert "20.0 (1.50x ahead)" in table and "2.00x" not in table
  assert by["burst", 2]["speedup_vs_data_parallel_verdict"] == "ahead"
  assert by["burst", 8]["speedup_vs_data_parallel_verdict"] is None
