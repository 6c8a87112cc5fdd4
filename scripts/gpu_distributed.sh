#!/usr/bin/env bash
# One device call on a machine with two GPUs (the nvidia-h200-x2 kind), under 5 minutes:
#   1. the distributed tests (tests/tuning/test_distributed.py): the 2-rank tensor-parallel stack with routing
#      on cuda:0 and cuda:1 over NCCL (identical choices on both ranks), and the CPU/gloo
#      tests that can run there;
#   2. the benchmark: 200 bf16 problems tuned by `unimatmul tune` under torchrun on 1 GPU
#      and on 2 GPUs; efficiency (speedup / 2) of the tuning phase must be >= 0.9.
# Results and logs go under $OUT:
#   scripts/gpu_distributed.sh            # then read $OUT/summary.txt
# The benchmark's JSON and table ($OUT/bench/distributed-tune-cuda.*) are committed in
# benchmarks/results/distributed/.
set -uo pipefail
OUT=${OUT:-/tmp/unimatmul-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on the shared machines (the ranks inherit these).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_TUNABLEOP_FILENAME=${PYTORCH_TUNABLEOP_FILENAME:-/tmp/tunableop_results%d.csv}
cd "$(dirname "$0")/.."
. scripts/gpu_install.sh
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv | tee -a "$OUT/env.log"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
status=0

echo "== distributed tests ($gpus GPUs)" | tee "$OUT/summary.txt"
timeout 120 python3 -m pytest tests/tuning/test_distributed.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -15
test_rc=${PIPESTATUS[0]}
tail -3 "$OUT/tests.log" >>"$OUT/summary.txt"
[ "$test_rc" = 0 ] || status=1

echo "== 200 problems, 1 GPU vs 2 GPUs" | tee -a "$OUT/summary.txt"
if [ "$gpus" -ge 2 ]; then
    timeout 160 python3 benchmarks/distributed_tune.py --device cuda --suite gpu200 --ranks 1,2 \
        --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -12
    bench_rc=${PIPESTATUS[0]}
    cat "$OUT/bench/distributed-tune-cuda.md" >>"$OUT/summary.txt" 2>/dev/null
    [ "$bench_rc" = 0 ] || status=1
else
    echo "skipped: $gpus GPU(s) here, the benchmark needs 2" | tee -a "$OUT/summary.txt"
    status=1
fi
echo "exit $status" | tee -a "$OUT/summary.txt"
exit $status
