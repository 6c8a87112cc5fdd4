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
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e plugins/unimatmul-triton >>"$OUT/install.log" 2>&1; then
    # Offline without setuptools: a hand-made dist-info gives the plugin its entry point.
    site=$(mktemp -d)
    mkdir -p "$site/unimatmul_triton-0.1.0.dist-info"
    ln -sfn "$PWD/plugins/unimatmul-triton/src/unimatmul_triton" "$site/unimatmul_triton"
    ln -sfn "$PWD/conformance/unimatmul_conformance" "$site/unimatmul_conformance"
    printf 'Metadata-Version: 2.1\nName: unimatmul-triton\nVersion: 0.1.0\n' >"$site/unimatmul_triton-0.1.0.dist-info/METADATA"
    printf '[unimatmul]\ntriton = unimatmul_triton\n' >"$site/unimatmul_triton-0.1.0.dist-info/entry_points.txt"
    export PYTHONPATH="$site:${PYTHONPATH:-}"
    echo "plugin editable install failed; using a hand-made dist-info" | tee -a "$OUT/install.log"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee -a "$OUT/env.log"
python3 plugins/unimatmul-triton/scripts/gpu_check.py --budget-s "$BUDGET_S" ${TRITON_SKIP:+--skip "$TRITON_SKIP"} ${TRITON_PARTS:+--parts "$TRITON_PARTS"} 2>&1 | tee "$OUT/gpu-check.log"
