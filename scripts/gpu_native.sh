#!/usr/bin/env bash
# One device call for the native routing kernels (unimatmul/torch/_native.cpp): build
# them for CUDA, run the torch and GPU tests with both kernel sets, and measure. STAGES
# picks what runs (default: all of build,tests,overhead,models,buckets,tunableop).
# Results and logs go under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/unimatmul-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export UNIMATMUL_CACHE=/tmp/unimatmul-native-cache.msgpack
STAGES=${STAGES:-build,tests,overhead,models,buckets,tunableop}
cd "$(dirname "$0")/.."
. scripts/gpu_install.sh
has() { [[ ",$STAGES," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$OUT/env.log"

if has build; then
    echo "== native build (CUDA)"
    python3 - <<'PY' 2>&1 | tee -a "$OUT/env.log"
import time
from unimatmul.torch import native
t = time.perf_counter()
ok = native.load(True)
print("native CUDA build:", ok, native.failure(True) or "", f"{time.perf_counter() - t:.1f} s")
PY
fi

if has tests; then
    echo "== tests: torch routing (both kernel sets), native, GPU"
    timeout 300 python3 -m pytest tests/torch tests/gpu -q -rs -p no:cacheprovider \
        2>&1 | tee "$OUT/gpu-tests.log" | tail -15
fi

if has overhead; then
    echo "== per-call overhead"
    timeout 150 python3 benchmarks/torch_models.py --device cuda --sections overhead \
        --out "$OUT/overhead" --cache /tmp/unimatmul-torch-cache.msgpack 2>&1 | tail -3
fi

if has models; then
    echo "== models: off, routed (native), routed-py"
    timeout 330 python3 benchmarks/torch_models.py --device cuda --sections models \
        --modes off,routed,routed-py ${MODEL_ARGS:-} \
        --out "$OUT/torch" --cache /tmp/unimatmul-torch-cache.msgpack 2>&1 | tail -3
fi

if has buckets; then
    echo "== buckets on the GPU"
    timeout 200 python3 benchmarks/torch_models.py --device cuda --sections buckets \
        --out "$OUT/buckets" --cache /tmp/unimatmul-bucket-cache.msgpack 2>&1 | tail -3
fi

if has profile; then
    echo "== profile: llama decode batch 1, off vs routed"
    timeout 150 python3 benchmarks/profile_decode.py --out "$OUT/profile-llama-decode1.json" 2>&1 | tail -25
fi

if has tunableop; then
    # A process of its own: TunableOp broke the CUDA context on the Llama block before.
    echo "== models: TunableOp"
    export PYTORCH_TUNABLEOP_FILENAME=/tmp/tunableop_results%d.csv
    timeout 200 python3 benchmarks/torch_models.py --device cuda --sections models \
        --modes off,tunableop --no-graphs ${MODEL_ARGS:-} \
        --out "$OUT/tunableop" --cache /tmp/unimatmul-torch-cache.msgpack 2>&1 | tail -5
fi
# Few files come back well: the result folders travel as one archive.
rm -f "$OUT"/*/cache.msgpack
dirs=$(cd "$OUT" && ls -d */ 2>/dev/null | tr -d /)
[ -n "$dirs" ] && tar czf "$OUT/results.tgz" -C "$OUT" $dirs && (cd "$OUT" && rm -rf $dirs)
ls -la "$OUT"
