"""Background jobs in the idle windows of the foreground's devices, under the shared policy."""

from dp_jax.multiplex import BackgroundJob
from dp_jax.orchestrator.background import DeviceRunner, build_runners, job_of_runner
from dp_jax.orchestrator.launch import alone_steps, measure, start_background
from dp_jax.orchestrator.scheduler import (
  BackgroundScheduler,
  BackgroundStats,
  idle_by_stage,
  load_checkpoint,
  make_background_hook,
)

__all__ = ["BackgroundJob", "BackgroundScheduler", "BackgroundStats", "DeviceRunner",
           "alone_steps", "build_runners", "idle_by_stage", "job_of_runner", "load_checkpoint",
           "make_background_hook", "measure", "start_background"]
