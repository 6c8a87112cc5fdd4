#!/usr/bin/env bash
# One device call for fp8 (scaled GEMMs): install unimatmul (its entry points),
# then scripts/gpu_fp8.py runs the fp8 GPU tests, the benchmark against torch._scaled_mm
# and the fp8 linear stack, and prints its summary table last. Results under $OUT.
#   bash scripts/gpu_fp8.sh            # about 5 minutes on one H200
#   BENCH_BUDGET_S=60 bash scripts/gpu_fp8.sh --quick
set -uo pipefail
OUT=${OUT:-/tmp/unimatmul-fp8-out}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
# The native kernels serve torch._scaled_mm at the CUDA key (UNIMATMUL_TORCH_NATIVE=0: the
# Python kernel only, as before they did).
cd "$(dirname "$0")/.."
. scripts/gpu_install.sh
. scripts/gpu_install_triton.sh  # the Triton fp8 kernels are candidates too
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.log"
python3 scripts/gpu_fp8.py --out "$OUT" --budget-s "${BENCH_BUDGET_S:-150}" "$@"
