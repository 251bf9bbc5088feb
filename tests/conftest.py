"""Test session set-up: 8 CPU devices, offline W&B in a temporary folder."""

import os
import tempfile

# Must happen before jax is imported anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_DIR", tempfile.mkdtemp(prefix="dp_jax_wandb_"))
os.environ.setdefault("WANDB_SILENT", "true")
# One persistent XLA compilation cache for the session (in-process and app subprocesses alike):
# the suite compiles the same small programs many times.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="dp_jax_xla_cache_"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
