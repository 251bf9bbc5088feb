"""The orchestrator's replay (the simulated background samples/s the apps report) runs on what
the run measured: each piece's measured time and the host time between pieces, not the profile
timed alone before the foreground started (issue: at background batch 8 the simulated samples/s
were 3.5-5x the measured; beside the foreground the pieces ran 0.7-1.7x their profile here).

The runtime's hook, dispatch thread and gate on a fake clock in lockstep with a fake runner
whose pieces take ACTUAL_MS (not the profile) and whose host time after a piece is longer than
the profiled switch the policy charges; the replay on the hook must predict the measured
samples/s within TOLERANCE, where a replay on the profile and the profiled switch does not.
"""

import numpy as np
import pytest
from test_multiplex_agreement import (
  ACTUAL_MS,
  CALLS,
  PROFILE_MS,
  SWITCH_MS,
  lockstep,
)

from dp_jax.orchestrator.replay import measured_pieces, replay
from dp_jax.simulator.measured import fill_measured

STEPS = 40
PROFILED_SWITCH_MS = 0.5  # what the policy charges; the fake runner's host time is SWITCH_MS
TOLERANCE = 0.10  # |simulated / measured - 1| on the fake (whole steps against fractional ones)


def run(cap: float):
  return lockstep(cap, steps=STEPS, batch=4, switch_ms=PROFILED_SWITCH_MS)[0]


@pytest.mark.parametrize("cap", [0.05, 0.25])
def test_the_replay_runs_the_measured_pieces_and_host_time_and_predicts_the_run(cap):
  hook = run(cap)
  pieces, gap = measured_pieces(hook)
  ran = [k for k in range(len(PROFILE_MS)) if hook.stats.piece_times_ms.get(k)]
  assert len(ran) == len(PROFILE_MS)
  np.testing.assert_allclose(pieces, ACTUAL_MS)
  assert gap == pytest.approx(SWITCH_MS)
  measured = hook.stats.samples_per_s
  assert measured > 0
  simulated = replay(hook, 2, STEPS)["simulated_background_samples_per_s"]
  on_profile = fill_measured(CALLS, 2, hook.job, cap=cap, iterations=STEPS,
                             switch_ms=PROFILED_SWITCH_MS, alone_steps_ms=hook.alone_steps_ms)
  profile_sps = float(on_profile.bg_steps.sum()) * 4 / float(on_profile.iteration_ms.sum()) * 1e3
  assert simulated / measured == pytest.approx(1.0, abs=TOLERANCE)
  assert abs(profile_sps / measured - 1.0) > TOLERANCE
