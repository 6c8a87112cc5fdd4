#!/usr/bin/env bash
# One device call for the harness's checks (the `harness` branch): the GPU tests, the core
# tests (CPU, but on a quiet 16-core host), the cuBLASLt conformance report under the
# element-wise bound, and scripts/gpu_harness_check.py (headroom of real kernels under the
# bound, wrong kernels on CUDA arrays, tuning time and confidence, tuning memory).
# At most 8 files come back from $OUT: env.log, install.log, gpu-tests.log,
# core-tests.log, conformance-cublaslt.txt, conformance-cublaslt.json, harness-gpu.json,
# harness-gpu.md.
set -uo pipefail
OUT=${OUT:-/tmp/unimatmul-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTORCH_TUNABLEOP_FILENAME=${PYTORCH_TUNABLEOP_FILENAME:-/tmp/tunableop_results%d.csv}
export UNIMATMUL_CACHE=/tmp/unimatmul-harness-cache.msgpack
cd "$(dirname "$0")/.."
. scripts/gpu_install.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.log"

echo "== GPU tests"
timeout 170 python3 -m pytest tests/gpu tests/torch/test_routing_gpu.py tests/conformance -q -rs \
    -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -25

echo "== core tests (the harness's own, on this host's CPU)"
timeout 110 python3 -m pytest tests/core -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/core-tests.log" | tail -15

echo "== conformance, cublaslt, full matrix, element-wise bound"
timeout 100 python3 -m unimatmul.cli conformance --backend cublaslt --device cuda:0 \
    --json "$OUT/conformance-cublaslt.json" >"$OUT/conformance-cublaslt.txt" 2>&1
echo "exit $?" >>"$OUT/conformance-cublaslt.txt"
tail -15 "$OUT/conformance-cublaslt.txt"

echo "== harness checks"
timeout 200 python3 scripts/gpu_harness_check.py --out "$OUT" --device cuda:0 --budget-s 170 2>&1 | tail -60
ls -la "$OUT"
