#!/usr/bin/env bash
# One device call for what the other scripts do not cover: every GPU test (cuBLASLt,
# torch routing, conformance meta-tests), the cuBLASLt conformance report, host time per
# cached call, and the PyTorch model benchmark. Results and logs go under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/unimatmul-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTORCH_TUNABLEOP_FILENAME=${PYTORCH_TUNABLEOP_FILENAME:-/tmp/tunableop_results%d.csv}
export UNIMATMUL_CACHE=/tmp/unimatmul-final-cache.msgpack
cd "$(dirname "$0")/.."
. scripts/gpu_install.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.log"

echo "== GPU tests"
timeout 150 python3 -m pytest tests/gpu tests/torch/test_routing_gpu.py tests/conformance -q -rs \
    -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -25

echo "== conformance, cublaslt, full matrix"
timeout 120 python3 -m unimatmul.cli conformance --backend cublaslt --device cuda:0 \
    --json "$OUT/conformance-cublaslt.json" >"$OUT/conformance-cublaslt.txt" 2>&1
echo "exit $?" >>"$OUT/conformance-cublaslt.txt"
tail -15 "$OUT/conformance-cublaslt.txt"

echo "== host time per cached call"
timeout 90 python3 benchmarks/gpu_bench.py --out "$OUT" --suite host 2>&1 | tail -5

if [ "${FINAL_TORCH_MODELS:-1}" = 1 ]; then
    echo "== PyTorch models"
    timeout 200 python3 benchmarks/torch_models.py --device cuda --out "$OUT/torch" \
        --cache /tmp/unimatmul-torch-cache.msgpack 2>&1 | tee "$OUT/torch-models.log" | tail -30
fi
ls -la "$OUT"
