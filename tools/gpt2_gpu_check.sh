#!/usr/bin/env bash
# tools/gpt2_gpu_check.sh - examples/train_gpt2.cu (GPU) against PyTorch and against
# examples/train_gpt2.c (CPU).
#
# First, where $PYTHON has torch and transformers (tools/torch_venv.sh DIR makes such a venv;
# PYTHON=DIR/bin/python), tests/gpt2_reference.py with --exe build/cuda/train_gpt2: every
# check make test-gpt2 makes of the CPU example (step-0 logits and loss within 1e-5, fp32
# within 1e-4 of PyTorch at 1 and 4 ranks and stages 0-3 bit-identical, bf16/fp16 within the
# derived bound of PyTorch's emulation, the export into GPT2LMHeadModel, save at 50 and
# resume to 100 bit for bit), made of the GPU example (4 ranks: threads on one GPU; the
# mpirun checks are skipped). Its counts join this script's.
#
# Then, for each dtype (f32, bf16, f16) it trains the CPU example once (stage 0) and the CUDA
# example at stages 0, 1, 2 and 3, all with the same flags: the same initial values (the
# seed, or INIT=FILE.safetensors, e.g. the one tests/gpt2_reference.py writes), the same
# data, ranks, batches and schedule. It checks:
#   - the GPU stages 0-3 log bit-identical losses (the loss column, as text) and say so;
#   - every step's GPU loss is within TOL_<dtype> relative of the CPU's.
# Then one run without --ranks (one process over NCCL, rank 0 of 1) against the CPU at 1
# rank.
#
# Tolerances. f32: 1e-4 relative per step, the bound both examples keep against PyTorch's
# fp32 run (docs/gpt2.md). bf16/f16: both examples compute in fp32 on params rounded to the
# 16-bit dtype, so their runs differ only by fp32 summation order amplified through the
# param rounding; docs/gpt2.md derives the bound each keeps against PyTorch's emulation of
# that precision, |dL| <= 2 u K(s) L(s) + 1e-4 L(s). Without PyTorch's K(s) here the
# defaults are fixed relative bounds (TOL_BF16=2e-2, TOL_F16=5e-3), meant to be replaced by
# twice the documented bound's largest value once a GPU run has measured it.
#
# Environment: PYTHON (python3), REF_FLAGS (more flags for gpt2_reference.py, e.g. --quick),
# STEPS (50), RANKS (2), BATCH (8), OUT (build/gpt2-gpu-check), INIT, DATA, TOL_F32,
# TOL_BF16, TOL_F16, EXTRA (more flags for both examples).
# Without a GPU it prints a skip line and exits 0. Ends with "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
STEPS=${STEPS:-50}
RANKS=${RANKS:-2}
BATCH=${BATCH:-8}
OUT=${OUT:-build/gpt2-gpu-check}
TOL_F32=${TOL_F32:-1e-4}
TOL_BF16=${TOL_BF16:-2e-2}
TOL_F16=${TOL_F16:-5e-3}
CPU=build/train_gpt2
GPU=build/cuda/train_gpt2
PYTHON=${PYTHON:-python3}
passed=0 failed=0 skipped=0

ok() { echo "ok   $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }

if ! make --no-print-directory "$CPU" "$GPU" build/zero-ckpt >/dev/null; then
    echo "gpt2_gpu_check: build failed (make $CPU $GPU build/zero-ckpt)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
if ! { nvidia-smi -L >/dev/null 2>&1 || { ! command -v nvidia-smi >/dev/null 2>&1 && ls /dev/nvidia[0-9]* >/dev/null 2>&1; }; }; then
    echo "  skip: no GPU visible"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
mkdir -p "$OUT"

# ---- the PyTorch reference, against the GPU example ----
if "$PYTHON" -c 'import torch, transformers, safetensors, numpy' >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    "$PYTHON" tests/gpt2_reference.py --exe "$GPU" --mpi-exe /nonexistent --work "$OUT/reference" ${REF_FLAGS:-} \
        >"$OUT/reference.txt" 2>&1
    grep -E '^(ok|FAIL|skip) ' "$OUT/reference.txt" | sed 's/^/reference: /'
    counts=$(tail -n 1 "$OUT/reference.txt")
    if [[ $counts =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
        passed=$((passed + BASH_REMATCH[1])) failed=$((failed + BASH_REMATCH[2])) skipped=$((skipped + BASH_REMATCH[3]))
    else
        bad "reference: tests/gpt2_reference.py did not finish ($OUT/reference.txt)"
    fi
else
    echo "skip reference: $PYTHON has no torch/transformers (tools/torch_venv.sh DIR; PYTHON=DIR/bin/python)"
    skipped=$((skipped + 1))
fi

# ---- the GPU example against the CPU example ----
common=(--steps "$STEPS" --batch "$BATCH" --val-every 0 --sample 0 --log-every 10)
[ -n "${INIT:-}" ] && common+=(--init "$INIT")
[ -n "${DATA:-}" ] && common+=(--data "$DATA")
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && common+=($EXTRA)

# max over steps of |b - a| / |a| for the loss column (2) of two --log files; exit 1 when
# the files' steps differ, or the maximum exceeds tol
compare() { # a.csv b.csv tol
    awk -F, -v tol="$3" '
        NR == FNR { if (FNR > 1) { a[$1] = $2; na++ } next }
        FNR > 1 { if (!($1 in a)) { missing = 1; next }
                  d = $2 - a[$1]; if (d < 0) d = -d
                  r = a[$1] < 0 ? -a[$1] : a[$1]; r = r > 0 ? d / r : d
                  if (r > m || r != r) m = r; n++ }
        END { printf "max rel diff %.3g over %d steps (tol %s)", m, n, tol
              exit (missing || n == 0 || n != na || !(m <= tol)) }' "$1" "$2"
}

run() { # log stdout-file command...
    local log=$1 txt=$2
    shift 2
    "$@" --log "$log" >"$txt" 2>&1
}

for dt in f32 bf16 f16; do
    case $dt in f32) tol=$TOL_F32 ;; bf16) tol=$TOL_BF16 ;; f16) tol=$TOL_F16 ;; esac
    cpu_log=$OUT/cpu-$dt.csv
    if ! run "$cpu_log" "$OUT/cpu-$dt.txt" "$CPU" --stage 0 --ranks "$RANKS" --dtype "$dt" "${common[@]}"; then
        bad "$dt: the CPU example failed ($OUT/cpu-$dt.txt)"
        continue
    fi
    for st in 0 1 2 3; do
        gpu_log=$OUT/gpu-$dt-stage$st.csv
        if ! run "$gpu_log" "$OUT/gpu-$dt-stage$st.txt" "$GPU" --stage "$st" --ranks "$RANKS" --dtype "$dt" "${common[@]}"; then
            bad "$dt stage $st: the CUDA example failed ($OUT/gpu-$dt-stage$st.txt)"
            continue
        fi
        if [ "$st" -gt 0 ]; then
            if cmp -s <(cut -d, -f2 "$OUT/gpu-$dt-stage0.csv") <(cut -d, -f2 "$gpu_log") &&
                [ "$(grep '^params checksum' "$OUT/gpu-$dt-stage0.txt")" = "$(grep '^params checksum' "$OUT/gpu-$dt-stage$st.txt")" ]; then
                ok "$dt: GPU stage $st = stage 0, every loss and the final params bit for bit"
            else
                bad "$dt: GPU stage $st differs from stage 0 ($gpu_log)"
            fi
        fi
        if msg=$(compare "$cpu_log" "$gpu_log" "$tol"); then
            ok "$dt stage $st: GPU vs CPU: $msg"
        else
            bad "$dt stage $st: GPU vs CPU: $msg"
        fi
    done
done

# one process over NCCL (no --ranks: rank 0 of 1), bf16 at stage 3, against the CPU at 1 rank
if run "$OUT/cpu-nccl.csv" "$OUT/cpu-nccl.txt" "$CPU" --stage 3 --ranks 1 --dtype bf16 "${common[@]}" &&
    run "$OUT/gpu-nccl.csv" "$OUT/gpu-nccl.txt" "$GPU" --stage 3 --dtype bf16 "${common[@]}"; then
    if msg=$(compare "$OUT/cpu-nccl.csv" "$OUT/gpu-nccl.csv" "$TOL_BF16"); then
        ok "bf16 stage 3, NCCL (1 process): GPU vs CPU: $msg"
    else
        bad "bf16 stage 3, NCCL (1 process): GPU vs CPU: $msg"
    fi
else
    bad "bf16 stage 3, NCCL (1 process): a run failed ($OUT/gpu-nccl.txt, $OUT/cpu-nccl.txt)"
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
