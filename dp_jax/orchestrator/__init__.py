"""Background jobs on the devices the foreground's current stage leaves idle (issue 6, item 4)."""

from dp_jax.orchestrator.background import BackgroundJob, build_job
from dp_jax.orchestrator.launch import alone_steps, measure, start_background
from dp_jax.orchestrator.scheduler import (
  BackgroundScheduler,
  BackgroundStats,
  idle_by_stage,
  make_background_hook,
)

__all__ = ["BackgroundJob", "BackgroundScheduler", "BackgroundStats", "alone_steps",
           "build_job", "idle_by_stage", "make_background_hook", "measure", "start_background"]
