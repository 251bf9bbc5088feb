"""transfer.move: the same values on the target sharding, in one process and across two."""

import jax
import numpy as np
from jax.sharding import NamedSharding
from mp_launch import logs, start, wait

from dp_jax.runtime import mesh as meshlib
from dp_jax.runtime import transfer

MP_WORKER = str(__import__("pathlib").Path(__file__).with_name("mp_worker.py"))


def test_move_in_one_process_is_device_put():
  devs = jax.devices()
  x = jax.device_put(np.arange(16.0).reshape(8, 2),
                     meshlib.batch_sharding(meshlib.stage_mesh(devs[:4])))
  dst = meshlib.replicated(meshlib.stage_mesh(devs[6:]))
  y = transfer.move({"a": x}, dst)["a"]
  assert isinstance(y.sharding, NamedSharding) and y.sharding == dst
  np.testing.assert_array_equal(transfer.local_value(y, dst), np.arange(16.0).reshape(8, 2))


def test_moves_across_two_processes_deliver_the_same_values(tmp_path):
  """Batch and replicated moves between device sets on one process, the other, and both.

  The same workers also check that every process runs process 0's plan (train.py).
  """
  procs = start([MP_WORKER, "transfer", str(tmp_path / "out.npz")], 2, 4, tmp_path)
  codes = wait(procs, timeout=240)
  assert codes == [0, 0], logs(tmp_path, 2)
  out = dict(np.load(tmp_path / "out.npz"))
  assert out.pop("agreed_batch") == 8, "process 0's plan and batch (each process asserts it)"
  expected = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  assert len(out) == 6
  for key, value in out.items():
    np.testing.assert_array_equal(value, expected, err_msg=key)
