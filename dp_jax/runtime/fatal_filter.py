"""One stderr line instead of JAX's fatal report when a peer of a multi-process job dies.

JAX's coordination service aborts the survivors of a dead peer from a C++ thread (LOG(FATAL),
SIGABRT) with a multi-line report, and JAX 0.12 has no public hook to intercept it.
install() therefore routes this process's fd 2 through a small filter process (this file run
as a script, stdlib only; it outlives the abort) that passes every byte through unchanged,
except that it replaces JAX's fatal report, the error lines just before it and the abort noise
after it with one `error: ...` line. Lines that may precede such a report (JAX's own error
lines, dp_jax's `error:` line) are held back briefly and released unchanged if none follows.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import signal
import subprocess
import sys
import time

FATAL_MARK = b"Terminating process because the JAX distributed service detected fatal errors"
GLOG_ERROR = re.compile(rb"^E\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")
OWN_ERROR = b"error: "
CONTROL = b"\x00dp_jax:"  # in-band messages from install()'s process; never shown
REPORT_ENDS = (b"*** Check failure stack trace", b"=== Source Location Trace")
HOLD_S = 3.0  # how long a JAX error line waits for a fatal report before it is shown
PARTIAL_S = 0.2  # an unfinished line is shown after this long
MAX_REPORT = 1 << 16
RESUME_HINT = "rerun the same command to resume from the last checkpoint"


def summarize(report: str, heartbeat_s: float, coordinator: str) -> str:
  """What JAX's fatal report says happened, and what to do, in a few words."""
  status = report.split("absl::Status:", 1)[-1]
  rpc = re.search(r"RPC: \S*/(\w+)", status)
  for end in ("RPC:", "=== Source Location Trace", "*** Check failure"):
    status = status.split(end, 1)[0]
  at = f" {coordinator}" if coordinator and coordinator != "auto" else ""
  if rpc and rpc.group(1) == "RegisterTask":
    return (f"the other processes did not join coordinator{at} in time; start every process, "
            "or raise runtime.distributed.initialization_timeout_s")
  if "stopped sending heartbeats" in status:
    ids = re.findall(r"^\s*(?:/job:[^/\s]+/replica:\d+/task:)?(\d+)\s*$",
                     status.split("heartbeats", 1)[1], re.M)
    who = f"process {ids[0]}" if len(ids) == 1 else f"processes {', '.join(ids) or '?'}"
    reason = f"{who} stopped sending heartbeats (heartbeat timeout {heartbeat_s:g} s)"
  elif "Failed to send RPC to coordination service" in status or "leader task" in status:
    where = f" at{at}" if at else ""
    reason = f"the coordinator (process 0{where}) stopped answering: it died, or the network failed"
  else:
    first = next((ln.strip() for ln in status.splitlines() if ln.strip()), "no details")
    reason = f"the JAX distributed service stopped this process: {first[:200]}"
  return f"{reason}; {RESUME_HINT}"


class Condenser:
  """The filter's state: feed() stderr bytes, get back what to show now."""

  def __init__(self, who: str, heartbeat_s: float, coordinator: str) -> None:
    self.who, self.heartbeat_s, self.coordinator = who, heartbeat_s, coordinator
    self.partial, self.partial_since = b"", 0.0  # an unfinished line
    self.held: list[bytes] = []  # lines that may precede a fatal report
    self.hold_until: float | None = None
    self.own_errors: list[bytes] = []  # dp_jax `error:` lines among the held ones
    self.report: bytes | None = None  # JAX's fatal report, once it began
    self.report_at = 0.0
    self.said = False
    self.finished = False  # install()'s process said it is done

  def feed(self, data: bytes, now: float) -> bytes:
    """Take bytes written to stderr; return the bytes to show now."""
    lines = (self.partial + data).split(b"\n")
    if lines[1:] or not self.partial:
      self.partial_since = now  # a new unfinished line starts
    self.partial = lines.pop()
    out = [self._line(ln + b"\n", now) for ln in lines if not self.finished]
    if self.finished:
      self.partial = b""
    return b"".join(out) + self.tick(now)

  def tick(self, now: float) -> bytes:
    """What is due by now: the one line, held lines past their time, an old unfinished line."""
    if self.report is not None:
      done = any(end in self.report for end in REPORT_ENDS)
      if not self.said and (done or now - self.report_at >= PARTIAL_S):
        return self._say()
      return b""
    out = b""
    if self.hold_until is not None and now >= self.hold_until:
      out, self.held, self.own_errors, self.hold_until = b"".join(self.held), [], [], None
    if self.partial and self.hold_until is None and now - self.partial_since >= PARTIAL_S:
      out, self.partial = out + self.partial, b""
    return out

  def close(self) -> bytes:
    """Everything still due when stderr ends."""
    if self.report is not None:
      return b"" if self.said else self._say()
    out = b"".join(self.held) + self.partial
    self.held, self.partial, self.hold_until = [], b"", None
    return out

  def _line(self, line: bytes, now: float) -> bytes:
    if line.startswith(CONTROL):
      key, _, value = line[len(CONTROL):].rstrip(b"\n").partition(b"=")
      if key == b"who":
        self.who = value.decode(errors="replace")
      elif key == b"finish":
        self.finished = True
      return b""
    if self.report is not None:
      self.report = (self.report + line)[:MAX_REPORT]
      return b""
    if FATAL_MARK in line:
      self.report, self.report_at = line, now
      return b""
    own = line.startswith(OWN_ERROR)
    if self.hold_until is None and not own and not GLOG_ERROR.match(line):
      return line
    self.held.append(line)
    wait = HOLD_S + (self.heartbeat_s if own else 0.0)  # a peer's death shows within the timeout
    self.hold_until = max(self.hold_until or 0.0, now + wait)
    if own:
      self.own_errors.append(line)
    return b""

  def _say(self) -> bytes:
    self.said = True
    reason, _, hint = summarize(self.report.decode(errors="replace"), self.heartbeat_s,
                                self.coordinator).partition("; ")
    line = f"error: {self.who}: {reason}"
    if self.own_errors:
      first = self.own_errors[0].decode(errors="replace")[len(OWN_ERROR):].strip()
      line += f" (this process had failed just before: {first[:300]})"
    return f"{line}; {hint}\n".encode()


# --- the filter process ---------------------------------------------------------------------


def run_filter(who: str, heartbeat_s: float, coordinator: str, parent: int) -> None:
  """Copy stdin to stderr through a Condenser until stdin ends or the parent is gone."""
  for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)  # the parent decides; we end when it is gone
  c = Condenser(who, heartbeat_s, coordinator)
  while not c.finished:
    if select.select([0], [], [], 0.1)[0]:
      data = os.read(0, 1 << 16)
      if not data:
        break
      _show(c.feed(data, time.monotonic()))
    elif os.getppid() != parent:
      _drain(c)
      break
    else:
      _show(c.tick(time.monotonic()))
  _show(c.close())


def _drain(c: Condenser) -> None:
  os.set_blocking(0, False)
  try:
    while data := os.read(0, 1 << 16):
      _show(c.feed(data, time.monotonic()))
  except BlockingIOError:
    pass


def _show(data: bytes) -> None:
  try:
    while data:
      data = data[os.write(2, data):]
  except OSError:  # nobody reads our stderr any more
    sys.exit(0)


# --- install() in the job's process ---------------------------------------------------------

_filter: dict = {}  # the running filter: {"proc": Popen, "saved_fd": int}


def install(who: str, heartbeat_s: float, coordinator: str) -> bool:
  """Route this process's fd 2 through the filter process; return whether it runs."""
  if _filter:
    return True
  try:
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
  except OSError:  # no stderr to filter
    return False
  try:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), who, str(heartbeat_s),
         coordinator, str(os.getpid())], stdin=read_fd, close_fds=True)
  except OSError:
    for fd in (saved, read_fd, write_fd):
      os.close(fd)
    return False
  os.close(read_fd)
  os.dup2(write_fd, 2)
  os.close(write_fd)
  _filter.update(proc=proc, saved_fd=saved)
  atexit.register(_finish)  # before jax's own exit hooks are registered, so it runs after them
  return True


def set_identity(who: str) -> None:
  """Name this process in the filter's line (once known, e.g. after joining under SLURM)."""
  _control(b"who=" + who.encode())


def _control(message: bytes) -> None:
  if _filter:
    sys.stderr.flush()
    os.write(2, CONTROL + message + b"\n")


def _finish() -> None:
  """At exit: leave the job (a dead peer shows here too), then let the filter drain and end."""
  if not _filter:
    return
  jax = sys.modules.get("jax")
  if jax is not None and jax.distributed.is_initialized():
    try:
      jax.distributed.shutdown()
    except Exception:  # noqa: BLE001 - exiting anyway; a dead peer is reported by the filter
      pass
  _control(b"finish")
  os.dup2(_filter["saved_fd"], 2)
  os.close(_filter["saved_fd"])
  try:
    _filter["proc"].wait(timeout=5)
  except subprocess.TimeoutExpired:
    pass
  _filter.clear()


if __name__ == "__main__":
  run_filter(sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
