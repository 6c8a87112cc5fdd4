#!/usr/bin/env bash
# One device call: install unimatmul and this plugin (their entry points must exist), then
# measure first-time tuning per product with an empty Triton cache, compiled at prepare
# ("serial") and ahead ("ahead"): scripts/first_tune.py. Results under $OUT:
#   OUT=first-tune-out bash plugins/unimatmul-triton/scripts/first_tune.sh
set -uo pipefail
OUT=${OUT:-$PWD/first-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../../.."

. scripts/gpu_install.sh
. scripts/gpu_install_triton.sh
nproc | sed 's/^/cpus: /' | tee -a "$OUT/env.log"
python3 plugins/unimatmul-triton/scripts/first_tune.py ${FIRST_TUNE_MODES:+--modes "$FIRST_TUNE_MODES"} 2>&1 | tee "$OUT/first-tune.log"
