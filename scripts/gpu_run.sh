#!/usr/bin/env bash
# One device call: install unimatmul (so its entry points exist), run the GPU tests and the
# H200 benchmark, and leave logs and results under $OUT.
#   scripts/gpu_run.sh probe   # short: a subset of the GPU tests and three benchmark shapes
#   scripts/gpu_run.sh full    # every GPU test and the full benchmark
# nvmath-python comes from the carried .whl/ (see the run command in benchmarks/results/README.md).
set -uo pipefail
mode=${1:-full}
OUT=${OUT:-/tmp/unimatmul-out}
BUDGET=${BENCH_BUDGET_S:-300}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# TunableOp writes its results file at exit: keep it out of the checkout.
export PYTORCH_TUNABLEOP_FILENAME=${PYTORCH_TUNABLEOP_FILENAME:-/tmp/tunableop_results%d.csv}
cd "$(dirname "$0")/.."

. scripts/gpu_install.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.log"

tests=(tests/gpu tests/backends/test_lt_driver.py tests/backends/test_lt_driver_layout.py tests/backends/test_cuda_backend.py)
if [ "$mode" = probe ]; then
    python3 -m pytest "${tests[@]}" -q -rs -p no:cacheprovider -s \
        -k "bf16-aligned or 1024x1025 or f16-TN or bias-gelu or identity or entry_point or stream or graph or not gpu" \
        2>&1 | tee "$OUT/gpu-tests.log" | tail -40
    python3 benchmarks/gpu_bench.py --out "$OUT" --suite probe --budget-s 40 --exhaustive 1 2>&1 | tee "$OUT/bench.log" | tail -40
else
    python3 -m pytest "${tests[@]}" -q -rs -p no:cacheprovider -s 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
    python3 benchmarks/gpu_bench.py --out "$OUT" --suite full --budget-s "$BUDGET" 2>&1 | tee "$OUT/bench.log" | tail -60
fi
