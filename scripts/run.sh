#!/usr/bin/env bash
# Set up (if needed) and run the main job on its default config; arguments are Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WANDB_MODE="${WANDB_MODE:-offline}"
exec .venv/bin/python -m dp_jax.pipeline "$@"
