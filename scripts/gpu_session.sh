#!/usr/bin/env bash
# One device call for several parts, installed once, each part under its own time limit:
#   bash scripts/gpu_session.sh tests triton fp8        (then: hf confirm ...)
# Parts:
#   tests    every GPU test of the main package (cuBLASLt, torch routing, conformance, fp8)
#   triton   the Triton plugin: decode benchmark, tuning cost, host time, tests, conformance
#   fp8      the fp8 products of real fp8 checkpoints (Llama-3.1, Qwen3-FP8, DeepSeek-V3; row-wise,
#            per-tensor and block-scaled) against torch._scaled_mm; FP8_ARGS="--quick" runs the
#            fp8 tests, the older benchmark and the fp8 stack instead
#   moe      mixture-of-experts: grouped GEMMs of four MoE configs against torch._grouped_mm
#            (benchmarks/moe_bench.py, MOE_BENCH_ARGS), and two HF MoE models routing off vs on (MOE_S;
#            MOE_HF=0 leaves them out; MOE_HF_ARGS, default --max-rounds 31: rounds until each
#            row's ratio is resolved)
#   moedeep  the HF MoE model (Qwen3-30B-A3B's config) with more of its layers (MOEDEEP_LAYERS, default
#            16 of 48), compiled generate at batch 1 and 16, routing off vs on (benchmarks/hf_models.py
#            --layers): the same rows with the layers' GEMMs a larger part of a step than at 4 layers;
#            MOEDEEP_ARGS go to hf_models.py (e.g. --off-decode grouped), its folder is moedeep$MOEDEEP_TAG
#   moeprefill  the HF MoE model (Qwen3-30B-A3B's config, 4 layers) in eager prefill, routing off vs on,
#            in MOEPREFILL_RUNS processes (default 3) at batches MOEPREFILL_BATCHES (default 1); a row
#            that comes out below 0.995x is profiled in the same run (host and device time per product)
#   fill     a grouped bucket's best candidates against torch._grouped_mm across the bucket's fill
#            (benchmarks/grouped_fill.py, FILL_S, FILL_ARGS)
#   hf       the Hugging Face model benchmark (routing off vs on)
#   confirm  host time per call and the confirmation window's cost (scripts/gpu_confirm.py); committed in benchmarks/results/host-time/
#   conformance  the full conformance matrix of one backend (CONFORMANCE_BACKEND, default triton)
#   pytest   the tests PYTEST_ARGS names (e.g. one file and -k), under PYTEST_S
#   decode-lab  a GEMV shaped like the weight-read kernel against the plugin's, torch and the
#            read kernel on decode shapes (plugins/unimatmul-triton/scripts/decode_lab.py)
#   bench    the H200 GEMM benchmark against torch.matmul (benchmarks/gpu_bench.py, BENCH_ARGS)
#   tunemodel  tune --model llama-3-8b --budget 10 against a budget-free tune, empty Triton caches
#            (benchmarks/tune_model_budget.py, TUNEMODEL_S)
#   tuneprofile  where tune --model's time goes: cProfile, empty then warm Triton cache
#            (benchmarks/tune_profile.py, TUNEPROFILE_S, TUNEPROFILE_ARGS)
#   phaseturns  tune_phases.py (a warm tune's time, phase by phase) of the copy at PHASETURNS_BEFORE
#            (a package folder for PYTHONPATH) and of this checkout, in turns (PHASETURNS_TURNS, default 2)
#   agreement  do two tuning runs agree? 16 model products, AGREEMENT_RUNS runs (benchmarks/tune_agreement.py)
#   models   PyTorch decoder stacks off vs routed, per-call overhead, buckets and TunableOp
#            (benchmarks/torch_models.py, MODEL_ARGS)
# Every part writes under $SESSION/<part>; at the end everything is packed into
# $OUT/session.tar.gz (one file back from the device) and each part's summary is printed.
# Budgets (seconds) can be set per part: TESTS_S, TRITON_S, FP8_S, HF_S, CONFIRM_S, BENCH_S, MODELS_S; FP8_ARGS
# (default --skip-tests --parts kernels,models), FP8_ENV (VAR=VALUE words set for the fp8 part only) and HF_ARGS (e.g. --rows REGEX) go to those parts' scripts.
# TRITON_SKIP (e.g. decode,conformance) skips parts of the Triton check; TESTS_ARGS go to pytest.
# Carry .whl (nvmath-python) with the call.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-$PWD/.gpu-out}  # what comes back: one packed file
SESSION=/tmp/unimatmul-session
rm -rf "$SESSION"; mkdir -p "$SESSION" "$RESULTS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
started=$SECONDS
OUT=$SESSION
. scripts/gpu_install.sh  # (a sourced script: OUT set for it stays set)
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e plugins/unimatmul-triton >>"$SESSION/install.log" 2>&1 \
    || echo "triton plugin: editable install failed (see install.log)"
export GPU_INSTALLED_AT=$PWD  # the parts' own scripts source gpu_install.sh: not again
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$SESSION/env.log"

part() {  # part NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    mkdir -p "$SESSION/$name"
    echo "== $name (limit ${limit}s, at $((SECONDS - started))s)"
    local t0=$SECONDS
    OUT=$SESSION/$name timeout --kill-after=10 "$limit" "$@" >"$SESSION/$name/console.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0))s" | tee -a "$SESSION/parts.log"
    # Packed after every part: a call cut short still brings back what finished.
    tar -czf "$RESULTS/session.tar.gz" -C "$SESSION" . 2>/dev/null
}

# The GPU-only test files (the cuBLASLt backend's, fp8's).
GPU_TESTS="tests/backends/cuda/test_cuda_backend_gpu.py tests/backends/cuda/test_cuda_fp8_gpu.py"

for name in "$@"; do
    case $name in
    tests)
        part tests "${TESTS_S:-200}" python3 -m pytest $GPU_TESTS tests/torch tests/conformance/test_gpu.py \
            tests/test_layout.py tests/tuning/test_confirm.py tests/tuning/test_harness_rounds_device.py -q -rs -p no:cacheprovider --timeout=120 -m "not slow" ${TESTS_ARGS:-} ;;
    triton)
        part triton "${TRITON_S:-270}" env BUDGET_S=$(( ${TRITON_S:-270} - 30 )) bash plugins/unimatmul-triton/scripts/gpu_check.sh ;;
    fp8)
        part fp8 "${FP8_S:-200}" env ${FP8_ENV:-} BENCH_BUDGET_S=$(( ${FP8_S:-200} - 50 )) bash scripts/gpu_fp8.sh ${FP8_ARGS:---skip-tests --parts kernels,models} ;;
    moe)
        part moe "${MOE_S:-420}" env MOE_S="${MOE_S:-420}" bash -c '
            python3 benchmarks/moe_bench.py --out "$OUT/moe-h200" --budget-s $(( MOE_S / 2 )) ${MOE_BENCH_ARGS:-}
            [ "${MOE_HF:-1}" = 0 ] || python3 benchmarks/hf_models.py --gpu --name moe --out "$OUT/hf-moe" --models ${MOE_MODELS:-qwen3-30b-a3b,mixtral-8x7b} \
                --variants eager --time-limit $(( MOE_S / 3 )) ${MOE_HF_ARGS:---max-rounds 31}' ;;
    moedeep)
        part "moedeep${MOEDEEP_TAG:-}" "${MOEDEEP_S:-440}" python3 benchmarks/hf_models.py --gpu --name moe-deep \
            --out "$SESSION/moedeep${MOEDEEP_TAG:-}" --models qwen3-30b-a3b --variants compiled --phases generate \
            --layers "${MOEDEEP_LAYERS:-16}" --max-rounds 11 --time-limit $(( ${MOEDEEP_S:-440} - 20 )) ${MOEDEEP_ARGS:-} ;;
    moeprefill)
        part moeprefill "${MOEPREFILL_S:-240}" env RUNS="${MOEPREFILL_RUNS:-3}" BATCHES="${MOEPREFILL_BATCHES:-1}" bash -c '
            for run in $(seq "$RUNS"); do
                python3 benchmarks/hf_models.py --gpu --name moe --out "$OUT/run-$run" --models qwen3-30b-a3b \
                    --variants eager --phases prefill --batches "$BATCHES" --time-limit 95 --max-rounds 61 \
                    --profile-below 0.995 | tail -n 12
            done' ;;
    fill)
        part fill "${FILL_S:-200}" python3 benchmarks/grouped_fill.py --out "$SESSION/fill" \
            --budget-s $(( ${FILL_S:-200} - 60 )) ${FILL_ARGS:-} ;;
    hf)
        part hf "${HF_S:-330}" env HF_TIME_LIMIT=$(( ${HF_S:-330} - 40 )) bash scripts/gpu_hf.sh ${HF_ARGS:-} ;;
    conformance)
        part conformance "${CONFORMANCE_S:-240}" python3 -m unimatmul conformance --backend "${CONFORMANCE_BACKEND:-triton}" \
            --device cuda:0 --json "$SESSION/conformance/report.json" ;;
    pytest)
        part pytest "${PYTEST_S:-120}" python3 -m pytest -q -rs -p no:cacheprovider --timeout=120 ${PYTEST_ARGS:-$GPU_TESTS} ;;
    decode-lab)
        part decode-lab "${DECODE_LAB_S:-240}" python3 plugins/unimatmul-triton/scripts/decode_lab.py \
            --budget-s $(( ${DECODE_LAB_S:-240} - 20 )) ${DECODE_LAB_ARGS:-} ;;
    bench)
        part bench "${BENCH_S:-360}" python3 benchmarks/gpu_bench.py --out "$SESSION/bench" --suite full \
            --budget-s $(( ${BENCH_S:-360} - 60 )) ${BENCH_ARGS:-} ;;
    models)
        part models "${MODELS_S:-540}" env MODEL_ARGS="${MODEL_ARGS:-}" bash -c '
            c=/tmp/unimatmul-torch-cache.msgpack; o=$OUT
            python3 benchmarks/torch_models.py --device cuda --sections overhead --out "$o/overhead" --cache "$c"
            python3 benchmarks/torch_models.py --device cuda --sections models --modes off,routed,routed-py \
                ${MODEL_ARGS:-} --out "$o/torch" --cache "$c"
            python3 benchmarks/torch_models.py --device cuda --sections buckets --out "$o/buckets" \
                --cache /tmp/unimatmul-bucket-cache.msgpack
            PYTORCH_TUNABLEOP_FILENAME=/tmp/tunableop_results%d.csv python3 benchmarks/torch_models.py \
                --device cuda --sections models --modes off,tunableop --no-graphs ${MODEL_ARGS:-} \
                --out "$o/tunableop" --cache "$c"' ;;
    tunemodel)
        part tunemodel "${TUNEMODEL_S:-240}" python3 benchmarks/tune_model_budget.py --model llama-3-8b \
            --device cuda --budget 10 --out "$SESSION/tunemodel" ;;
    tuneprofile)
        part tuneprofile "${TUNEPROFILE_S:-150}" python3 benchmarks/tune_profile.py --device cuda \
            --out "$SESSION/tuneprofile" ${TUNEPROFILE_ARGS:-} ;;
    phaseturns)
        part phaseturns "${PHASETURNS_S:-240}" env BEFORE="${PHASETURNS_BEFORE:-}" TURNS="${PHASETURNS_TURNS:-2}" ARGS="${PHASETURNS_ARGS:-}" bash -c '
            # the Triton cache filled once, then the copy at $BEFORE and this checkout in turns
            python3 benchmarks/tune_phases.py --device cuda --out "$OUT/warm-up" $ARGS >/dev/null
            for turn in $(seq "$TURNS"); do
                [ -z "$BEFORE" ] || (cd benchmarks && PYTHONPATH="$BEFORE" python3 -c "import unimatmul; print(\"before:\", unimatmul.__file__)")
                [ -z "$BEFORE" ] || PYTHONPATH="$BEFORE" python3 benchmarks/tune_phases.py --device cuda \
                    --out "$OUT/before-$turn" $ARGS | tail -n 30
                python3 benchmarks/tune_phases.py --device cuda --out "$OUT/now-$turn" $ARGS | tail -n 30
            done' ;;
    agreement)
        part agreement "${AGREEMENT_S:-240}" python3 benchmarks/tune_agreement.py --device cuda \
            --runs "${AGREEMENT_RUNS:-4}" --out "$SESSION/agreement" ;;
    confirm)
        part confirm "${CONFIRM_S:-200}" env UNIMATMUL_CACHE=/tmp/unimatmul-confirm-cache.msgpack python3 scripts/gpu_confirm.py ;;
    *) echo "unknown part $name" ;;
    esac
done
tar -czf "$RESULTS/session.tar.gz" -C "$SESSION" . 2>/dev/null
ls -la "$RESULTS"
for name in "$@"; do
    echo "==================== $name"
    tail -n 25 "$SESSION/$name/console.log" 2>/dev/null
done
cat "$SESSION/parts.log"
