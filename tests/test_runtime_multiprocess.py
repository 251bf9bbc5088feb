"""A burst plan across 2 processes x 4 CPU devices trains like one process on 8 devices.

Stages on 8, 4 (2 devices of each process), 1 (process 1) and 1 (process 0) device(s); GPT-2's
tied embedding crosses from the 8-device stage to process 0 and its gradient comes back.
About two minutes on 2 shared cores, so `slow`; the default suite runs the smaller
cross-process transfer test in test_runtime_transfer.py.
"""

from pathlib import Path

import jax
import numpy as np
import pytest
from mp_launch import logs, start, wait
from mp_layouts import train_multiprocess_layout
from runtime_helpers import batches, make_model, run_plan, sgd

MP_WORKER = str(Path(__file__).with_name("mp_worker.py"))
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-6  # test_runtime_exact.py's tolerances for this GPT-2


@pytest.mark.slow
def test_burst_plan_across_two_processes_matches_one_process(tmp_path):
  procs = start([MP_WORKER, "train", str(tmp_path / "out.npz")], 2, 4, tmp_path)
  assert wait(procs, timeout=600) == [0, 0], logs(tmp_path, 2)
  out = np.load(tmp_path / "out.npz")
  model = make_model("gpt2")
  losses, program, state = run_plan(model, "gpt2", train_multiprocess_layout,
                                    batches(model, 8, 3), sgd())
  assert sorted({len(s.stage.devices) for s in program.stages}) == [1, 4, 8]
  np.testing.assert_allclose(out["losses"], losses, rtol=LOSS_RTOL)
  assert losses[0] != losses[-1], "the model should train"
  for layer, params in state["params"].items():
    for key, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
      np.testing.assert_allclose(out[f"{layer}{jax.tree_util.keystr(key)}"], np.asarray(leaf),
                                 rtol=0, atol=PARAM_ATOL, err_msg=layer)
