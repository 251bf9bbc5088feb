#!/usr/bin/env bash
# Run a study's Hydra multirun and aggregate it into CSV, PNG figures and a markdown table.
#   scripts/reproduce.sh <study> [--quick] [--out DIR] [--sweep DIR] [extra Hydra overrides...]
# Studies: strong_scaling amplification cluster_throughput network weight_sharding runtime
# time_to_accuracy validation where_burst_pays (experiments/studies.py; experiments/<study>.py).
# --quick runs conf/experiment/<study>_quick.yaml (a reduced grid). Outputs: --out, default
# results/<study>/ for a full study and results/local/<study>_quick/ for --quick. The sweep
# itself goes to --sweep, default multirun/<overlay>/<timestamp>/ (one folder per cell:
# config.json, provenance.json, status.json, the W&B offline run; sweep.log: the apps' output).
# Python: .venv/bin/python, after scripts/setup.sh makes or updates .venv (so this can be the
# first command of a fresh clone); PYTHON=/path/to/python runs another interpreter that has the
# locked dependencies instead (no setup).
set -euo pipefail
here="$PWD"
abs() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
cd "$(dirname "$0")/.."
usage() {
  echo "usage: scripts/reproduce.sh <study> [--quick] [--out DIR] [--sweep DIR] [overrides...]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
study="$1"; shift
quick=""; out=""; sweep_dir=""; extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --out) [ $# -ge 2 ] || usage; out="$(abs "$2")"; shift 2 ;;
    --out=*) out="$(abs "${1#--out=}")"; shift ;;
    --sweep) [ $# -ge 2 ] || usage; sweep_dir="$(abs "$2")"; shift 2 ;;
    --sweep=*) sweep_dir="$(abs "${1#--sweep=}")"; shift ;;
    -h|--help) usage ;;
    *) extra+=("$1"); shift ;;
  esac
done
if [ -n "${PYTHON:-}" ]; then
  case "$PYTHON" in */*) PY="$(abs "$PYTHON")" ;; *) PY="$PYTHON" ;; esac
else
  bash scripts/setup.sh >&2
  PY=.venv/bin/python
fi
studies_rc=0
app="$("$PY" -m experiments.studies "$study")" || studies_rc=$?
if [ "$studies_rc" -eq 2 ]; then exit 2; fi  # an unknown study: its error line is printed
if [ "$studies_rc" -ne 0 ]; then
  echo "error: $PY cannot run experiments.studies (exit $studies_rc); PYTHON must name a python" \
    "with dp_jax's locked dependencies (unset it: scripts/setup.sh makes .venv)" >&2
  exit 1
fi
overlay="$study${quick:+_quick}"
out="${out:-$([ -n "$quick" ] && echo "results/local/${study}_quick" || echo "results/$study")}"
sweep_dir="${sweep_dir:-multirun/$overlay/$(date +%Y-%m-%d_%H-%M-%S)}"
export WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT="${WANDB_SILENT:-true}"
start=$(date +%s)
mkdir -p "$sweep_dir"
log="$sweep_dir/sweep.log"
echo "sweep: python -m dp_jax.$app -m +experiment=$overlay hydra.sweep.dir=$sweep_dir ${extra[*]:-}"
swept=0
"$PY" -m "dp_jax.$app" -m "+experiment=$overlay" "hydra.sweep.dir=$sweep_dir" ${extra[@]+"${extra[@]}"} \
  > "$log" 2>&1 || swept=$?
if [ "$swept" -ne 0 ] && ! ls "$sweep_dir"/*/status.json >/dev/null 2>&1; then
  echo "sweep failed before any cell ran; see $log" >&2; tail -5 "$log" >&2; exit 1
fi
echo "sweep done in $(( $(date +%s) - start )) s: $sweep_dir (log: $log)"
"$PY" -m "experiments.$study" "$sweep_dir" --out "$out"  # failed cells are listed there
echo "total $(( $(date +%s) - start )) s"
if [ "$swept" -ne 0 ]; then
  echo "error: some cells of the sweep failed (listed in $out and at the end of $log)" >&2
  exit 1
fi
