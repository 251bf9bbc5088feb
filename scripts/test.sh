#!/usr/bin/env bash
# Set up (if needed) and run the test suite; extra arguments go to pytest (e.g. -m slow).
# Tests run in DP_JAX_TEST_WORKERS parallel pytest-xdist workers (default 2: CI's cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WANDB_MODE=offline
exec .venv/bin/python -m pytest -n "${DP_JAX_TEST_WORKERS:-2}" "$@"
