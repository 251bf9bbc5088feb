#!/usr/bin/env bash
# Set up (if needed) and run the test suite; extra arguments go to pytest (e.g. -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WANDB_MODE=offline
exec .venv/bin/python -m pytest "$@"
