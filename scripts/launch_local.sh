#!/usr/bin/env bash
# Try multi-process training without a cluster: N processes of `python -m dp_jax.train` on this
# machine, joined by jax.distributed on a free localhost port, the CPU devices split evenly.
#
#   scripts/launch_local.sh <n_processes> [train overrides...] [validate_against_single=true]
#
# runtime.num_devices (default 4 per process) is the job's total device count. Process 0
# prints to this terminal; process i > 0 writes <launch log folder>/process_<i>.out (shown if it
# fails). Ctrl-C or SIGTERM ends every process. validate_against_single=true then reruns the
# same job in one process on as many devices and prints the largest loss difference.
set -euo pipefail

if [[ $# -lt 1 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 <n_processes> [train overrides...] [validate_against_single=true]" >&2
  exit 2
fi
n="$1"; shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$py" ]] || py="$(command -v python3)"

validate=false
overrides=()
devices=""
for arg in "$@"; do
  case "$arg" in
    validate_against_single=true) validate=true ;;
    validate_against_single=*) ;;
    runtime.num_devices=*) devices="${arg#*=}"; overrides+=("$arg") ;;
    *) overrides+=("$arg") ;;
  esac
done
if [[ -z "$devices" ]]; then
  devices=$((4 * n))
  overrides+=("runtime.num_devices=$devices")
fi
if (( devices % n )); then
  echo "error: runtime.num_devices=$devices must split evenly over $n processes" >&2
  exit 2
fi

port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')"
logs="$(mktemp -d "${TMPDIR:-/tmp}/dp_jax_launch.XXXXXX")"
echo "launching $n processes x $((devices / n)) CPU devices, coordinator localhost:$port; logs: $logs"

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" JAX_PLATFORMS=cpu
export DP_JAX_COORDINATOR_ADDRESS="localhost:$port" DP_JAX_NUM_PROCESSES="$n"
pids=()
for ((i = 0; i < n; i++)); do
  if (( i == 0 )); then
    DP_JAX_PROCESS_ID=0 "$py" -m dp_jax.train "${overrides[@]}" > >(tee "$logs/process_0.out") 2>&1 &
  else
    DP_JAX_PROCESS_ID=$i "$py" -m dp_jax.train "${overrides[@]}" >"$logs/process_$i.out" 2>&1 &
  fi
  pids+=("$!")
done

stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap 'stop; exit 143' INT TERM

status=0
for ((i = 0; i < n; i++)); do
  if ! wait "${pids[$i]}"; then
    status=1
    reason="$(grep -m1 -E '^error: |Terminating process because|absl::Status: ' \
      "$logs/process_$i.out" | cut -c1-300 || true)"
    echo "process $i failed: ${reason:-see $logs/process_$i.out}" >&2
  fi
done
if (( status )); then exit 1; fi

if [[ "$validate" == true ]]; then
  run_dir="$(sed -n 's/.*outputs: \(.*\)$/\1/p' "$logs/process_0.out" | tail -n 1)"
  if [[ -z "$run_dir" ]]; then
    echo "error: could not find the run folder in process 0's output" >&2
    exit 1
  fi
  unset DP_JAX_COORDINATOR_ADDRESS DP_JAX_NUM_PROCESSES
  echo "validating: the same job in one process on $devices devices ($run_dir/single_process)"
  "$py" -m dp_jax.train "${overrides[@]}" logger=disabled runtime.progress=false \
    "hydra.run.dir=$run_dir/single_process" >"$logs/single_process.out" 2>&1 || {
    echo "error: the single-process run failed; see $logs/single_process.out" >&2
    exit 1
  }
  "$py" - "$run_dir/metrics.jsonl" "$run_dir/single_process/metrics.jsonl" <<'EOF'
import json
import sys

multi, single = ([json.loads(line)["loss"] for line in open(p) if line.strip()] for p in sys.argv[1:])
if len(multi) != len(single) or not multi:
  sys.exit(f"error: {len(multi)} multi-process steps vs {len(single)} single-process steps")
print(f"max loss difference vs single process: {max(abs(a - b) for a, b in zip(multi, single)):.3g}")
EOF
fi
