"""One process per core: core assignment, worker environment, pinning and its per-thread check."""

import json
import os
import threading

import pytest

from dp_jax.base.errors import UserError
from dp_jax.runtime import pinned
from dp_jax.runtime.local_devices import HOST_DEVICES_FLAG

CORES = sorted(os.sched_getaffinity(0))

CHILD = """
import json, os, sys, threading
from dp_jax.runtime import pinned
core = pinned.check_pinned()
worked, done = threading.Event(), threading.Event()
def spin():  # a fixed amount of work however loaded the core is, then alive until sampled
  x = 0
  while x < 3_000_000:
    x += 1
  worked.set(); done.wait()
t = threading.Thread(target=spin, name="spinner"); t.start(); worked.wait()
threads = pinned.thread_cores()
done.set(); t.join()
print(json.dumps({"core": core, "spinner": t.native_id, "affinity": sorted(os.sched_getaffinity(0)),
                  "process": os.environ["DP_JAX_PROCESS_ID"], "threads": threads,
                  "confined": pinned.confined_to(core, threads)}))
"""


def test_each_process_gets_its_own_core_and_too_many_is_one_line_error():
  assert pinned.cores_for(2, [3, 1, 5]) == [1, 3]
  with pytest.raises(UserError, match="3 pinned processes need 3 cores, but only 2"):
    pinned.cores_for(3, [0, 1])
  with pytest.raises(UserError, match="positive integer"):
    pinned.cores_for(0, [0, 1])


def test_worker_env_has_one_cpu_device_and_the_coordinator():
  env = pinned.worker_env(1, 2, 1234, {"XLA_FLAGS": f"--foo {HOST_DEVICES_FLAG}=8", "A": "b"})
  assert env["XLA_FLAGS"] == f"--foo {HOST_DEVICES_FLAG}=1"
  assert env["JAX_PLATFORMS"] == "cpu" and env["A"] == "b"
  assert (env["DP_JAX_COORDINATOR_ADDRESS"], env["DP_JAX_NUM_PROCESSES"],
          env["DP_JAX_PROCESS_ID"]) == ("localhost:1234", "2", "1")


def test_started_processes_run_pinned_and_every_busy_thread_stays_on_its_core(tmp_path):
  n = min(2, len(CORES))
  cores = pinned.cores_for(n)
  procs = pinned.start(["-c", CHILD], n, tmp_path, cores,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert pinned.wait(procs, timeout_s=60) == [0] * n
  for i in range(n):
    out = json.loads((tmp_path / f"process_{i}.log").read_text().strip().splitlines()[-1])
    assert out["core"] == cores[i] and out["affinity"] == [cores[i]]
    assert out["process"] == str(i)
    assert any(k.endswith(f"/{out['spinner']}") for k in out["threads"]), out["threads"]
    assert out["confined"] and all(v["allowed"] == [cores[i]] for v in out["threads"].values())


def test_check_pinned_refuses_a_process_that_may_use_several_cores():
  if len(CORES) < 2:
    pytest.skip("needs 2 cores")
  with pytest.raises(UserError, match=r"may run on \d+ cores"):
    pinned.check_pinned()


def test_confined_to_sees_a_thread_that_ran_elsewhere():
  ok = {"a/1": {"allowed": [1], "last_core": 1, "cpu_s": 1.0}}
  assert pinned.confined_to(1, ok)
  assert not pinned.confined_to(1, {**ok, "b/2": {"allowed": [0, 1], "last_core": 1}})
  assert not pinned.confined_to(1, {**ok, "b/2": {"allowed": [1], "last_core": 0}})


def test_thread_cores_lists_this_process_threads_with_their_cores():
  done = threading.Event()

  def spin():
    x = 0
    while not done.is_set():
      x += 1

  t = threading.Thread(target=spin, name="busy-one")
  t.start()
  threading.Event().wait(0.3)
  threads = pinned.thread_cores(share=0.0)
  done.set()
  t.join()
  assert any(k.endswith(f"/{t.native_id}") for k in threads)
  assert all(set(v["allowed"]) <= set(CORES) for v in threads.values())
