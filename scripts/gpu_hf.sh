#!/usr/bin/env bash
# One device call: the Hugging Face model benchmark on the GPU machine (about 6 minutes
# on an H200). Installs unimatmul for its entry points, then runs
# benchmarks/hf_models.py --gpu under a time limit; results (JSON, table, plot where
# matplotlib imports) and the log go to $OUT/hf-h200/, and the table is printed last.
# A row where routing comes out below 0.98x is profiled per product in the same run.
# Extra arguments go to hf_models.py (e.g. --rows 'gpt2/generate' --profile).
# HF_TIME_LIMIT (seconds, default 330) bounds the benchmark itself.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.gpu-out}  # the GPU machine sets $OUT; .gpu-out/ is git-ignored
mkdir -p "$OUT/hf-h200"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
. scripts/gpu_install.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$OUT/env.log"
python3 -c "import transformers; print('transformers', transformers.__version__)" | tee -a "$OUT/env.log"
python3 benchmarks/hf_models.py --gpu --name h200 --out "$OUT/hf-h200" --time-limit "${HF_TIME_LIMIT:-330}" \
    --profile-below 0.98 --profile-steps 2 "$@" \
    2>&1 | tee "$OUT/hf-h200/run.log" | grep -v -i "warn"
