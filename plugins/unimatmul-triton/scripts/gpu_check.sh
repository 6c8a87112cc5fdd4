#!/usr/bin/env bash
# One device call: install unimatmul and this plugin (their entry points must exist), then
# run scripts/gpu_check.py (benchmark, tuning cost, host time, tests, conformance) within
# BUDGET_S seconds. Results under $OUT. Run from anywhere:
#   OUT=gpu-check-out BUDGET_S=420 bash plugins/unimatmul-triton/scripts/gpu_check.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
BUDGET_S=${BUDGET_S:-420}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.."

. scripts/gpu_install.sh
. scripts/gpu_install_triton.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee -a "$OUT/env.log"
python3 plugins/unimatmul-triton/scripts/gpu_check.py --budget-s "$BUDGET_S" ${TRITON_SKIP:+--skip "$TRITON_SKIP"} ${TRITON_PARTS:+--parts "$TRITON_PARTS"} 2>&1 | tee "$OUT/gpu-check.log"
