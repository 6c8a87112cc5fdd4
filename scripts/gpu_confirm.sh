#!/usr/bin/env bash
# Issue #13 on the GPU machine in one call (about 4 minutes): build the native routing
# kernels for CUDA, run the torch tests there (routing, confirmation windows with CUDA
# events and graph capture, the API's native table; not the slow build test), then
# scripts/gpu_confirm.py (the API's host time per call, GPT-2 routed against off and
# the windows' own cost, a profile per product). Under $OUT: env.log, install.log,
# gpu-tests.log, gpu-confirm.json.
#
#     bash scripts/gpu_confirm.sh
set -uo pipefail
OUT=${OUT:-/tmp/unimatmul-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export UNIMATMUL_CACHE=/tmp/unimatmul-confirm-cache.msgpack
rm -f "$UNIMATMUL_CACHE"*
cd "$(dirname "$0")/.."
. scripts/gpu_install.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$OUT/env.log"

echo "== native build (CUDA)"
python3 - <<'PY' 2>&1 | tee -a "$OUT/env.log"
import time
from unimatmul.torch import native
t = time.perf_counter()
ok = native.load(True)
print("native CUDA build:", ok, native.failure(True) or "", f"{time.perf_counter() - t:.1f} s")
PY

echo "== tests: torch routing and windows on the GPU, the confirmation unit tests"
timeout 170 python3 -m pytest tests/torch tests/core/test_confirm.py -q -rs -p no:cacheprovider -m "not slow" \
    2>&1 | tee "$OUT/gpu-tests.log" | tail -15

echo "== measurements"
timeout 240 python3 scripts/gpu_confirm.py 2>&1 | tail -40
