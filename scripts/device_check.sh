#!/usr/bin/env bash
# One prepared check for a machine with a GPU (docs/validation.md, "On a GPU"):
#   scripts/device_check.sh [--dry-run] [--list] [--out DIR]
# 1. scripts/bench_device.py: matmul FLOP/s, memory bandwidth, dispatch overhead of the device;
# 2. scripts/device_compare.py: every zoo model's per-layer times at per-device batches 1..64
#    measured there, against the analytic model and DeepPool's A100 tables;
# 3. python -m dp_jax.validate for vgg16 and GPT-2 on every device there (predicted vs measured);
# 4. scripts/bench_runtime.py: the runtime's per-stage overhead there.
# Everything goes to results/device/<device name>/ (or --out), each step's output to logs/. --dry-run runs the same steps on
# the CPU at toy sizes into results/local/device_dry_run/ (what the tests run); --list only
# prints the commands.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
dry=""; list=""; out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --list) list=1; shift ;;
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    *) echo "usage: scripts/device_check.sh [--dry-run] [--list] [--out DIR]" >&2; exit 2 ;;
  esac
done
export WANDB_MODE="${WANDB_MODE:-offline}" WANDB_SILENT="${WANDB_SILENT:-true}"
if [ -n "$dry" ]; then
  export JAX_PLATFORMS=cpu
  name="cpu_dry_run"; out="${out:-results/local/device_dry_run}"
  models="vgg16,gpt2_small"; compare_args=(--tiny --max-batch 2)
  vgg=(model=vgg16 model.image_size=32 batch_size=8)
  gpt=(model=gpt2 model.n_layer=1 model.d_model=32 model.n_head=2 model.seq_len=8
       model.vocab_size=64 batch_size=8)
  val=(validate.plans=1 local.steps=1 local.warmup=1 local.profile_repeats=1 local.profile_passes=1
       local.profile_cuts=1 "validate.amplification_limits=[2.0]" logger=disabled)
  bench=(--steps 2 --splits 1,2)
else
  name="$("$PY" -c 'import jax; d = jax.devices()[0]; print(d.device_kind if d.platform != "cpu" else "cpu")' | tr ' /' '__')"
  [ "$name" != "cpu" ] || echo "warning: no GPU found; the check runs on the CPU" >&2
  out="${out:-results/device/$name}"
  models="$("$PY" -c 'from dp_jax.models.zoo import MODEL_NAMES; print(",".join(MODEL_NAMES))')"
  compare_args=(--max-batch 64 --dtype bfloat16)
  vgg=(model=vgg16 batch_size=64 model.dtype=bfloat16 cluster=dgx_h200)
  gpt=(model=gpt2 batch_size=32 model.dtype=bfloat16 cluster=dgx_h200)
  val=(validate.plans=9 local.steps=10)
  bench=(--model gpt2_small --steps 50)
fi
steps=(
  "$PY scripts/bench_device.py > $out/bench_device.json"
  "$PY scripts/device_compare.py --out $out/layers --models $models ${compare_args[*]}"
  "$PY -m dp_jax.validate ${vgg[*]} ${val[*]} hydra.run.dir=$out/validate_vgg16"
  "$PY -m dp_jax.validate ${gpt[*]} ${val[*]} hydra.run.dir=$out/validate_gpt2"
  "$PY scripts/bench_runtime.py ${bench[*]} --out $out/bench_runtime.json"
)
echo "device: $name -> $out"
if [ -n "$list" ]; then printf '%s\n' "${steps[@]}"; exit 0; fi
mkdir -p "$out/logs"
start=$(date +%s)
i=0
for s in "${steps[@]}"; do
  i=$((i + 1))
  echo "== $s"
  if ! bash -c "$s" > "$out/logs/step$i.log" 2>&1; then
    tail -20 "$out/logs/step$i.log" >&2
    echo "step $i failed (log: $out/logs/step$i.log): $s" >&2
    exit 1
  fi
  grep -v -e "donated buffers" -e "See an explanation" -e "warnings.warn" "$out/logs/step$i.log" \
    | tail -8 || true
done
echo "device check done in $(( $(date +%s) - start )) s: $out"
