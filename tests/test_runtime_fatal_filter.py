"""fatal_filter: JAX's fatal coordination-service report becomes one line; the rest passes.

The reports below were recorded from JAX 0.12 on this machine: 2 processes on CPU, one killed
with SIGKILL (the coordinator's service sees it stop; the other, when the coordinator died).
"""
# ruff: noqa: E501 - the recorded reports keep JAX's long lines verbatim

import os
import subprocess
import sys
import textwrap

from mp_launch import REPO

from dp_jax.runtime import fatal_filter
from dp_jax.runtime.fatal_filter import HOLD_S, Condenser

PEER_DIED = b"""\
E1130 10:51:03.768578   23871 coordination_service.cc:1518] [9584124124805669001] Use error polling to propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='']
=== Source Location Trace: ===
external/xla+/xla/pjrt/distributed/coordination/coordination_service.cc:232

E1130 10:51:03.771399   23884 coordination_service_agent.cc:288] Polled an error from coordination service (this can be an error from this or another task).
""", b"""\
F1130 10:51:03.771784   23884 client.h:86] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died; see the other task logs for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):
1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.

RPC: /xla.coordination.CoordinationService/PollForError [type.googleapis.com/tensorflow.CoordinationServiceError='']
=== Source Location Trace: ===
external/xla+/xla/pjrt/distributed/coordination/coordination_service_error_util.cc:64

*** Check failure stack trace: ***
    @     0x7f73a42f81b4  absl::lts_20260526::log_internal::LogMessage::SendToLog()
    @     0x7f73a10d08c4  xla::CoordinationServiceAgent::SetError()
""", b"""\
Fatal Python error: Aborted

Thread 0x00007f73 (most recent call first):
  File "/x/train_loop.py", line 12 in train
"""

COORDINATOR_DIED = b"""\
E1130 10:51:09.128922   24170 coordination_service_agent.cc:288] Polled an error from coordination service (this can be an error from this or another task).
F1130 10:51:09.129120   24170 client.h:86] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died; see the other task logs for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted unexpectedly or this task is experiencing network issues. Check earlier logs from 1) this task, 2) the leader (usually slice 0 task 0), and 3) cluster scheduler to debug further.
Additional GRPC error information from remote target coordination_service while calling /xla.coordination.CoordinationService/PollForError:
:UNAVAILABLE:Stream removed (Socket closed)
=== Source Location Trace: ===
external/xla+/xla/pjrt/distributed/coordination/coordination_service_error_util.cc:64

"""

NOBODY_JOINED = b"""\
F1130 11:08:10.659082    7822 client.h:86] Terminating process because the JAX distributed service detected fatal errors. This most likely indicates that another task died; see the other task logs for more details. Disable Python buffering, i.e. `python -u`, to be sure to see all the previous output. absl::Status: DEADLINE_EXCEEDED: Deadline Exceeded

RPC: /xla.coordination.CoordinationService/RegisterTask
=== Source Location Trace: ===
external/xla+/xla/pjrt/distributed/coordination/coordination_service_error_util.cc:64

*** Check failure stack trace: ***
    @     0x7fd54ded022e  xla::CoordinationServiceAgent::Connect()
"""

HINT = "rerun the same command to resume from the last checkpoint"


def _run(chunks, who="process 0 of 2", step=0.01):
  """Feed chunks one clock step apart, then close; return everything shown."""
  c = Condenser(who, 10, "localhost:1234")
  out, now = b"", 0.0
  for chunk in chunks:
    out += c.feed(chunk, now)
    now += step
  return (out + c.tick(now) + c.close()).decode()


def test_a_dead_peer_report_becomes_one_line_after_the_ordinary_output():
  out = _run([b"step 1\n", b"step 2\n", *PEER_DIED])
  assert out.splitlines() == [
      "step 1", "step 2",
      f"error: process 0 of 2: process 1 stopped sending heartbeats (heartbeat timeout 10 s); "
      f"{HINT}"]


def test_a_dead_coordinator_report_names_its_address():
  out = _run([b"loss 0.5\n", COORDINATOR_DIED], who="process 1 of 2")
  assert out.splitlines() == [
      "loss 0.5",
      "error: process 1 of 2: the coordinator (process 0 at localhost:1234) stopped answering: "
      f"it died, or the network failed; {HINT}"]


def test_peers_that_never_joined_get_their_own_advice():
  out = _run([b"process 0 of 2: waiting for the other processes\n", NOBODY_JOINED])
  assert out.splitlines()[1] == (
      "error: process 0 of 2: the other processes did not join coordinator localhost:1234 in "
      "time; start every process, or raise runtime.distributed.initialization_timeout_s")


def test_the_line_is_shown_as_soon_as_the_report_is_complete():
  c = Condenser("process 0 of 2", 10, "h:1")
  assert c.feed(PEER_DIED[0], 0.0) == b""
  line = c.feed(PEER_DIED[1], 0.01)
  assert line.startswith(b"error: process 0 of 2: process 1 stopped") and line.count(b"\n") == 1
  assert c.feed(PEER_DIED[2], 0.02) + c.close() == b"", "the abort noise after it is dropped"


def test_this_processs_own_error_line_is_kept_inside_the_one_line():
  gloo = b"error: UNKNOWN: Gloo all-reduce failed: Connection closed by peer [127.0.0.1]:13008\n"
  (line,) = _run([gloo, *PEER_DIED]).splitlines()
  assert line.startswith("error: process 0 of 2: process 1 stopped sending heartbeats")
  assert "(this process had failed just before: UNKNOWN: Gloo all-reduce failed" in line
  assert line.endswith(HINT)


def test_held_lines_come_out_unchanged_when_no_report_follows():
  jax_error = b"E1130 10:00:00.000001   1 some_file.cc:12] a JAX error that is not fatal\nmore\n"
  c = Condenser("process 0 of 2", 10, "h:1")
  assert c.feed(jax_error, 0.0) == b""
  assert c.tick(HOLD_S - 0.1) == b""
  assert c.tick(HOLD_S + 0.1) == jax_error
  assert c.feed(b"after\n", HOLD_S + 0.2) == b"after\n"
  own = b"error: batch_size=3 must be >= 4\n"
  assert c.feed(own, 10.0) == b"" and c.close() == own, "released when stderr ends"


def test_ordinary_bytes_pass_unchanged_and_unfinished_lines_after_a_moment():
  c = Condenser("process 0 of 2", 10, "h:1")
  assert c.feed(b"a\nb\n\xff\n", 0.0) == b"a\nb\n\xff\n"
  assert c.feed(b"\rprogress 50%", 1.0) == b""
  assert c.tick(1.5) == b"\rprogress 50%"
  assert c.feed(b" done\n", 2.0) == b" done\n"


def test_control_messages_rename_and_finish_and_never_show():
  c = Condenser("this process", 10, "auto")
  assert c.feed(fatal_filter.CONTROL + b"who=process 3 of 4\n", 0.0) == b""
  assert c.feed(COORDINATOR_DIED, 0.1).startswith(
      b"error: process 3 of 4: the coordinator (process 0) stopped answering")
  c = Condenser("p", 10, "h:1")
  assert c.feed(b"x\n" + fatal_filter.CONTROL + b"finish\nlate\n", 0.0) == b"x\n"
  assert c.finished and c.close() == b""


def test_install_condenses_a_report_even_when_the_process_aborts(tmp_path):
  """A real process: filter installed, output, JAX's report on fd 2, then SIGABRT."""
  script = tmp_path / "job.py"
  script.write_text(textwrap.dedent(f"""
      import os, sys
      from dp_jax.runtime import fatal_filter
      assert fatal_filter.install("process 0 of 2", 10, "localhost:1234")
      print("before", file=sys.stderr, flush=True)
      for chunk in {list(PEER_DIED)!r}:
        os.write(2, chunk)
      os.abort()
      """))
  result = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
  assert result.returncode == -6
  lines = result.stderr.decode().splitlines()
  assert lines[0] == "before" and len(lines) == 2, result.stderr
  assert lines[1].startswith("error: process 0 of 2: process 1 stopped sending heartbeats")


def test_install_passes_output_through_and_ends_with_the_process(tmp_path):
  script = tmp_path / "job.py"
  script.write_text(textwrap.dedent("""
      import sys
      from dp_jax.runtime import fatal_filter
      assert fatal_filter.install("process 0 of 2", 10, "localhost:1234")
      print("one", file=sys.stderr)
      print("error: something the user can fix", file=sys.stderr)
      sys.exit(2)
      """))
  result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
  assert result.returncode == 2
  assert result.stderr == "one\nerror: something the user can fix\n"
