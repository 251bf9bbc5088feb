#!/usr/bin/env bash
# Set up (if needed) and run the test suite; extra arguments go to pytest (e.g. -m slow).
# Tests run in DP_JAX_TEST_WORKERS parallel pytest-xdist workers (default 2: CI's cores); an idle
# worker takes tests queued for the other (worksteal), so one long test does not leave a core idle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WANDB_MODE=offline
exec .venv/bin/python -m pytest -n "${DP_JAX_TEST_WORKERS:-2}" --dist worksteal "$@"
