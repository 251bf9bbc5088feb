"""Test session set-up: 8 CPU devices, offline W&B and caches in one temporary folder.

This module runs in the pytest-xdist controller before it starts its workers, and the workers
and every app subprocess inherit its environment: the session's caches are shared by all of them.
"""

import os
import shutil
import tempfile

# Must happen before jax is imported anywhere in the test session: 8 CPU devices, and XLA's
# backend (LLVM) optimisation off unless XLA_FLAGS sets a level. The suite checks what programs
# compute, not how fast: the same HLO programs run, only their machine code is less optimised,
# and compiling is much of the suite's time (the default tier takes about 15% less wall time).
# Apps and worker processes the tests start keep the level (tests/apps.py). The tests that
# compare wall-clock times (marker `timing`) compile as users' programs do: .ci/run gives them
# XLA's default level, 3.
_FLAGS = os.environ.get("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in _FLAGS:
  _FLAGS += " --xla_force_host_platform_device_count=8"
if "--xla_backend_optimization_level" not in _FLAGS:
  _FLAGS += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _FLAGS.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")

# The folder is made by the first process that loads this module (the controller) and removed
# when that process ends; a worker finds it in its environment.
_SESSION = "DP_JAX_TEST_SESSION_DIR"
_OWNER = _SESSION not in os.environ
if _OWNER:
  os.environ[_SESSION] = tempfile.mkdtemp(prefix="dp_jax_tests_")
_ROOT = os.environ[_SESSION]
os.environ.setdefault("WANDB_DIR", os.path.join(_ROOT, "wandb"))
# One persistent XLA compilation cache for the session (in-process and app subprocesses alike):
# the suite compiles the same small programs many times.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# One disk cache of traced model graphs: apps run in temporary folders would otherwise each
# trace the model again (with JAX) into their own .cache/dp_jax/graphs.
os.environ.setdefault("DP_JAX_GRAPH_CACHE", os.path.join(_ROOT, "graphs"))
for _d in ("wandb", "xla", "graphs"):
  os.makedirs(os.path.join(_ROOT, _d), exist_ok=True)


def pytest_unconfigure(config):
  if _OWNER and not hasattr(config, "workerinput"):
    shutil.rmtree(_ROOT, ignore_errors=True)

