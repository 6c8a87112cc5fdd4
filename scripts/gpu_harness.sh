#!/usr/bin/env bash
# One device call for the harness's checks (the `harness` branch): the GPU tests, the core
# tests (CPU, on a quiet 16-core host), the cuBLASLt conformance report under the
# element-wise bound, scripts/gpu_harness_check.py (headroom of real kernels under the
# bound, wrong kernels on CUDA arrays, tuning time and confidence, tuning memory) and the
# small-problem tuning cost on this host's CPU. At most 8 files come back from $OUT:
# env.log, install.log, tests.log (tests and the conformance summary),
# conformance-cublaslt.json, harness-gpu.json, harness-gpu.md,
# tune-cost-small-gpuhost.json, tune-cost-small-gpuhost.md.
set -uo pipefail
OUT=${OUT:-/tmp/unimatmul-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTORCH_TUNABLEOP_FILENAME=${PYTORCH_TUNABLEOP_FILENAME:-/tmp/tunableop_results%d.csv}
export UNIMATMUL_CACHE=/tmp/unimatmul-harness-cache.msgpack
cd "$(dirname "$0")/.."
. scripts/gpu_install.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.log"
LOG="$OUT/tests.log"

echo "== GPU tests" | tee -a "$LOG"
timeout 150 python3 -m pytest tests/gpu tests/torch/test_routing_gpu.py tests/conformance -q -rs \
    -p no:cacheprovider 2>&1 | tee -a "$LOG" | tail -25

echo "== core tests (the harness's own, on this host's CPU)" | tee -a "$LOG"
timeout 80 python3 -m pytest tests/core -q -rs -p no:cacheprovider 2>&1 | tee -a "$LOG" | tail -15

echo "== conformance, cublaslt, full matrix, element-wise bound" | tee -a "$LOG"
timeout 80 python3 -m unimatmul.cli conformance --backend cublaslt --device cuda:0 \
    --json "$OUT/conformance-cublaslt.json" 2>&1 | tail -20 | tee -a "$LOG"

echo "== harness checks" | tee -a "$LOG"
timeout 150 python3 scripts/gpu_harness_check.py --out "$OUT" --device cuda:0 --budget-s 120 2>&1 | tail -60

echo "== small-problem tuning cost on this host's CPU" | tee -a "$LOG"
UNIMATMUL_TORCH_NATIVE=0 timeout 50 python3 benchmarks/tune_cost_small.py --repeat 3 --label gpuhost \
    --out "$OUT" 2>&1 | grep -v Warning | tail -5 | tee -a "$LOG"
ls -la "$OUT"
