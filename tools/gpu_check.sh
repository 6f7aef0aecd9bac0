#!/usr/bin/env bash
# tools/gpu_check.sh - the GPU verification run, in one command, for the first machine with
# a GPU. Nothing in zero_cuda.h or zero_nccl.h has run on a GPU before this script.
#
#   tools/gpu_check.sh [--dry-run] [--keep-going] [OUTPUT_DIR]
#
# OUTPUT_DIR (default: $OUT if set, else gpu-check-<UTC date>) receives one log per step
# (NN-name.log), env.txt (the versions) and summary.txt (one line per step: ok, FAIL or
# skip, seconds, log). The script stops at the first hard failure with a non-zero exit
# status (--keep-going runs every step and fails at the end instead). Without a GPU it
# stops at the probe (exit 2) after writing env.txt; --dry-run lists the steps and runs
# nothing. Knobs (environment): STEPS (train_gpu steps per run, default 200),
# GPT2_ARGS (extra arguments for build/cuda/train_gpt2, if it exists), BENCH_PARAMS
# (bench/torch_adamw.py --params, default 256M), STEP_TIMEOUT (seconds a step may take,
# default 3600: a hang is a failure), BUILD (the programs' directory, default build/cuda),
# MAKE (default make), PYTHON.
#
# Steps: probe; environment (GPU, driver, nvcc, compute-sanitizer, torch and
# torch.cuda.nccl.version(), nccl.h and libnccl); make cuda (warnings are errors);
# make test-cuda; compute-sanitizer memcheck, racecheck and synccheck over every GPU test
# program; test_nccl at 1, 2 and 4 ranks (ranks share a GPU on NCCL >= 2.30 with
# NCCL_MULTI_RANK_GPU_ENABLE=1; on fewer GPUs and older NCCL the multi-rank cases say why
# they skip; on NCCL >= 2.30 a skip is a failure) with its timeout cases (a rank that
# never joins: TIMEOUT from zero_nccl_wait, from a stream sync the watchdog ends, and
# after a first collective); that NCCL saw NCCL_RUNTIME_CONNECT=0 (set by
# zero_nccl_create); make bench-cuda; bench/torch_adamw.py
# against torch's fused AdamW; train_gpu at stages 0-3 (and under torchrun on 2 GPUs when
# there are 2); train_gpt2 at stages 0-3 when examples/train_gpt2.cu exists.
set -u
cd "$(dirname "$0")/.."

dry=0 keep=0 out=""
for a in "$@"; do
    case "$a" in
    --dry-run) dry=1 ;;
    --keep-going) keep=1 ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $a (--dry-run, --keep-going, OUTPUT_DIR)" >&2; exit 64 ;;
    *) out=$a ;;
    esac
done
[ -n "$out" ] || out=${OUT:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}
MAKE=${MAKE:-make}
PYTHON=${PYTHON:-python3}
STEPS=${STEPS:-200}
BENCH_PARAMS=${BENCH_PARAMS:-256M}
GPT2_ARGS=${GPT2_ARGS:-}
STEP_TIMEOUT=${STEP_TIMEOUT:-3600}
BUILD=${BUILD:-build/cuda} # where make cuda puts the programs

# ---- the steps: name, command (run by bash -c), hard (1) or soft (0) ----
names=() cmds=() hard=()
step() { names+=("$1"); cmds+=("$2"); hard+=("$3"); }

step env "true" 1 # written by write_env, before the probe
step probe "gpu_probe" 1
step make-cuda "$MAKE cuda" 1
step test-cuda "$MAKE test-cuda" 1
for tool in memcheck racecheck synccheck; do
    step "sanitize-$tool" "sanitize $tool" 1
done
step test-nccl "test_nccl_ranks" 1
step nccl-connect-at-init "connect_at_init" 0
step bench-cuda "$MAKE bench-cuda" 1
step bench-torch-adamw "torch_adamw" 0
for s in 0 1 2 3; do
    step "train-gpu-stage$s" "$BUILD/train_gpu --stage $s --steps $STEPS" 1
done
step train-gpu-torchrun "train_gpu_torchrun" 0
for s in 0 1 2 3; do
    step "train-gpt2-stage$s" "train_gpt2 $s" 1
done

if [ "$dry" = 1 ]; then
    echo "gpu_check: the steps (hard: stops the run on failure), logs under $out:"
    for i in "${!names[@]}"; do
        printf '  %02d %-24s %-4s %s\n' "$i" "${names[$i]}" "$([ "${hard[$i]}" = 1 ] && echo hard || echo soft)" "${cmds[$i]}"
    done
    exit 0
fi

# ---- helpers the steps call (exported to bash -c) ----
gpu_count() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L 2>/dev/null | grep -c '^GPU '
    else
        ls /dev/nvidia[0-9]* 2>/dev/null | wc -l
    fi
}
gpu_probe() {
    local n
    n=$(gpu_count)
    if [ "${n:-0}" -lt 1 ]; then
        echo "gpu_check: no GPU visible (nvidia-smi -L lists none, or no /dev/nvidiaN): nothing to"
        echo "check on this machine. Run tools/gpu_check.sh where a GPU is; --dry-run lists the steps."
        return 2
    fi
    echo "gpu_check: $n GPU(s) visible"
    nvidia-smi -L
}
sanitize() { # sanitize TOOL: compute-sanitizer --tool TOOL over every GPU test program
    local cs t rc=0
    cs=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null)
    [ -n "$cs" ] || { echo "compute-sanitizer not found (set PATH or CUDA_HOME)"; return 1; }
    for t in $BUILD/test_*; do
        [ -x "$t" ] || continue
        echo "== $1 $t"
        ZT_QUICK=1 "$cs" --tool "$1" --error-exitcode 99 "$t" || { echo "FAIL: $1 $t"; rc=1; }
    done
    return $rc
}
test_nccl_ranks() { # every case; on NCCL >= 2.30 the 2- and 4-rank cases must not skip
    local log rc v
    log=$(mktemp)
    NCCL_DEBUG=WARN NCCL_MULTI_RANK_GPU_ENABLE=1 $BUILD/test_nccl 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    v=$(sed -n 's/^  NCCL \([0-9]*\), .*/\1/p' "$log" | head -1)
    if [ $rc -eq 0 ] && [ "${v:-0}" -ge 23000 ] && grep -q 'ranks need' "$log"; then
        echo "FAIL: NCCL $v >= 2.30, yet multi-rank cases skipped"; rc=1
    fi
    rm -f "$log"
    return $rc
}
connect_at_init() { # NCCL's own report of the variable zero_nccl_create sets
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV,INIT $BUILD/train_gpu --steps 5 2>&1 | tee /dev/stderr |
        grep -q 'NCCL_RUNTIME_CONNECT set by environment to 0' ||
        { echo "NCCL did not report NCCL_RUNTIME_CONNECT=0 (NCCL < 2.22 connects at init anyway)"; return 1; }
}
torch_adamw() {
    "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null
    case $? in
    0) "$PYTHON" bench/torch_adamw.py --params "$BENCH_PARAMS" --bench "$BUILD/bench_cuda_adam" ;;
    3) echo "skip: torch cannot see a GPU"; return 77 ;;
    *) echo "skip: no torch for $PYTHON"; return 77 ;;
    esac
}
train_gpu_torchrun() {
    if [ "$(gpu_count)" -lt 2 ]; then echo "skip: one GPU"; return 77; fi
    command -v torchrun >/dev/null 2>&1 || { echo "skip: no torchrun"; return 77; }
    local s
    for s in 0 1 2 3; do
        echo "== torchrun 2 ranks, stage $s"
        torchrun --standalone --nproc-per-node=2 --no-python $BUILD/train_gpu --stage "$s" --steps "$STEPS" || return 1
    done
}
train_gpt2() { # train_gpt2 STAGE
    [ -f examples/train_gpt2.cu ] || { echo "skip: no examples/train_gpt2.cu"; return 77; }
    [ -x $BUILD/train_gpt2 ] || { echo "$BUILD/train_gpt2 missing after make cuda"; return 1; }
    # shellcheck disable=SC2086
    $BUILD/train_gpt2 --stage "$1" $GPT2_ARGS
}
write_env() {
    {
        echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
        echo "host: $(uname -a)"
        echo "commit: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
        echo "--- GPU and driver"
        if command -v nvidia-smi >/dev/null 2>&1; then
            nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv 2>&1
            nvidia-smi 2>&1 | sed -n '1,4p'
        else
            echo "nvidia-smi: not found"
        fi
        echo "--- nvcc"
        (command -v nvcc >/dev/null && nvcc --version) 2>&1 ||
            ("${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version) 2>&1 || echo "nvcc: not found"
        echo "--- compute-sanitizer"
        (compute-sanitizer --version || "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" --version) 2>&1 | head -3
        echo "--- NCCL (the build's)"
        $MAKE -s --no-print-directory print-nccl 2>&1
        for h in $($MAKE -s --no-print-directory print-nccl 2>/dev/null | sed -n 's/^NCCL_HOME=//p')/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h; do
            [ -f "$h" ] && echo "$h: $(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$h" | awk '{printf "%s ", $3}')"
        done
        (ldconfig -p 2>/dev/null | grep libnccl) || true
        echo "NCCL_RUNTIME_CONNECT=${NCCL_RUNTIME_CONNECT-(unset)} NCCL_MULTI_RANK_GPU_ENABLE=${NCCL_MULTI_RANK_GPU_ENABLE-(unset)}"
        echo "--- torch"
        "$PYTHON" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("torch.cuda.nccl.version()", torch.cuda.nccl.version() if torch.cuda.is_available() else "(no GPU)")' 2>&1
        true # a missing tool is a line in env.txt, not a failure
    } >"$out/env.txt" 2>&1
}
export -f gpu_count gpu_probe sanitize test_nccl_ranks connect_at_init torch_adamw train_gpu_torchrun train_gpt2
export MAKE PYTHON STEPS BENCH_PARAMS GPT2_ARGS BUILD

mkdir -p "$out" || { echo "gpu_check: cannot create $out" >&2; exit 1; }
summary=$out/summary.txt
: >"$summary"
first_fail=""
echo "gpu_check: logs under $out"
for i in "${!names[@]}"; do
    name=${names[$i]} log=$(printf '%s/%02d-%s.log' "$out" "$i" "${names[$i]}")
    t0=$(date +%s)
    if [ "$name" = env ]; then
        write_env; rc=$?; cp "$out/env.txt" "$log"
    else
        echo "\$ ${cmds[$i]}" >"$log"
        timeout "$STEP_TIMEOUT" bash -c "${cmds[$i]}" >>"$log" 2>&1
        rc=$?
        [ $rc -ne 124 ] || echo "gpu_check: timed out after $STEP_TIMEOUT s" >>"$log"
    fi
    secs=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then status=ok
    elif [ $rc -eq 77 ]; then status=skip
    else status=FAIL; fi
    line=$(printf '%-24s %-4s %5ss  %s' "$name" "$status" "$secs" "$log")
    echo "$line" | tee -a "$summary"
    if [ "$status" = skip ]; then sed -n '2p' "$log" | sed 's/^/    /'; fi
    if [ "$name" = probe ] && [ $rc -ne 0 ]; then
        sed -n '2,3p' "$log"
        echo "summary: stopped at the GPU probe" >>"$summary"
        exit 2
    fi
    if [ "$status" = FAIL ]; then
        tail -n 15 "$log" | sed 's/^/    /'
        [ -n "$first_fail" ] || first_fail=$name
        if [ "${hard[$i]}" = 1 ] && [ "$keep" = 0 ]; then
            echo "summary: FAILED at $name (hard); later steps not run" >>"$summary"
            echo "gpu_check: FAILED at $name; see $log and $summary"
            exit 1
        fi
    fi
done
if [ -n "$first_fail" ]; then
    echo "summary: FAILED (first: $first_fail)" >>"$summary"
    echo "gpu_check: FAILED (first: $first_fail); see $summary"
    exit 1
fi
echo "summary: every step ok or skipped" >>"$summary"
echo "gpu_check: done; record the results (docs/BENCHMARKS.md, docs/cuda.md, docs/nccl.md, README's GPU status)"
