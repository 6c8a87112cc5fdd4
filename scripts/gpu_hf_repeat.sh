#!/usr/bin/env bash
# One device call: scripts/gpu_hf_repeat.py for one model in each state, each in a process of
# its own (a device-side assert loses the CUDA context). Output under $OUT/repeat/.
#   MODEL=qwen2-1.5b BATCH=16 CALLS=25 STATES="off routed alternate" bash scripts/gpu_hf_repeat.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.gpu-out}
mkdir -p "$OUT/repeat"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
. scripts/gpu_install.sh >/dev/null
for spec in ${RUNS:-"${MODEL:-qwen2-1.5b}:alternate"}; do
    model=${spec%%:*}; rest=${spec#*:}; state=${rest%%:*}; extra=""
    [ "$rest" != "$state" ] && extra="--${rest#*:}"
    name="$model-b${BATCH:-16}-$state${extra:+-nogc}"
    echo "== $name"
    timeout "${PART_S:-150}" python3 scripts/gpu_hf_repeat.py --model "$model" --batch "${BATCH:-16}" \
        --state "$state" --calls "${CALLS:-25}" $extra >"$OUT/repeat/$name.jsonl" 2>"$OUT/repeat/$name.err"
    echo "exit $?"
    grep -c '"error"' "$OUT/repeat/$name.jsonl"
    tail -n 3 "$OUT/repeat/$name.jsonl"
    grep -v -i warn "$OUT/repeat/$name.err" | grep -i "error\|assert" | sort | uniq -c | head -5
done
