#!/usr/bin/env bash
# tools/gpu_check.sh without a GPU: its syntax (bash -n), the step list of --dry-run, the
# stop at the GPU probe (exit 2, a clear message, env.txt and summary.txt written), and the
# stop at the first hard failure (a fake nvidia-smi that lists a GPU, a fake make whose
# "cuda" target fails: exit 1, later steps not run; --keep-going runs them and still fails).
# Fake tools and no programs (BUILD points nowhere): nothing touches a GPU. Ends with a "zt: N passed, N failed, N skipped" line.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { # check NAME CONDITION-STATUS DETAIL
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "  ok: $1"
    else fail=$((fail + 1)); echo "  FAIL: $1"; [ -n "${3:-}" ] && printf '%s\n' "$3" | sed 's/^/    /'; fi
}
bash -n tools/gpu_check.sh
check "bash -n" $?

out=$(bash tools/gpu_check.sh --dry-run 2>&1)
missing=""
for s in env probe make-cuda test-cuda sanitize-memcheck sanitize-racecheck sanitize-synccheck \
         test-nccl nccl-connect-at-init bench-cuda bench-torch-adamw train-gpu-stage0 train-gpu-stage3 \
         train-gpu-torchrun train-gpt2-stage0 train-gpt2-stage3; do
    grep -q " $s " <<<"$out" || missing="$missing $s"
done
check "--dry-run lists every step" "$([ -z "$missing" ] && echo 0 || echo 1)" "missing:$missing"$'\n'"$out"

mkdir -p "$tmp/nogpu" "$tmp/gpu"
printf '#!/bin/sh\nexit 0\n' >"$tmp/nogpu/nvidia-smi"               # lists no GPU
printf '#!/bin/sh\necho "GPU 0: Fake GPU (UUID: GPU-0)"\n' >"$tmp/gpu/nvidia-smi"
printf '#!/bin/sh\nfor a; do [ "$a" = cuda ] && { echo "fake make: cuda fails"; exit 2; }; done\nexit 0\n' >"$tmp/fakemake"
chmod +x "$tmp/nogpu/nvidia-smi" "$tmp/gpu/nvidia-smi" "$tmp/fakemake"

out=$(PATH="$tmp/nogpu:$PATH" PYTHON=false bash tools/gpu_check.sh "$tmp/o1" 2>&1); rc=$?
check "no GPU: exit 2 at the probe" "$([ $rc -eq 2 ] && echo 0 || echo 1)" "rc=$rc"$'\n'"$out"
check "no GPU: the message says so" "$(grep -q 'no GPU visible' <<<"$out"; echo $?)" "$out"
check "no GPU: env.txt and summary.txt written, stopped at the probe" \
    "$([ -s "$tmp/o1/env.txt" ] && grep -q 'stopped at the GPU probe' "$tmp/o1/summary.txt" && echo 0 || echo 1)"
check "no GPU: no step after the probe ran" "$([ ! -e "$tmp/o1/02-make-cuda.log" ] && echo 0 || echo 1)"

out=$(PATH="$tmp/gpu:$PATH" MAKE="$tmp/fakemake" PYTHON=false bash tools/gpu_check.sh "$tmp/o2" 2>&1); rc=$?
check "first hard failure: exit 1" "$([ $rc -eq 1 ] && echo 0 || echo 1)" "rc=$rc"$'\n'"$out"
check "first hard failure: named in summary.txt, nothing after it ran" \
    "$(grep -q 'FAILED at make-cuda' "$tmp/o2/summary.txt" && [ ! -e "$tmp/o2/03-test-cuda.log" ] && echo 0 || echo 1)" \
    "$(cat "$tmp/o2/summary.txt" 2>&1)"

out=$(PATH="$tmp/gpu:$PATH" MAKE="$tmp/fakemake" PYTHON=false STEP_TIMEOUT=60 BUILD="$tmp/nobuild" \
      bash tools/gpu_check.sh --keep-going "$tmp/o3" 2>&1); rc=$?
check "--keep-going: every step has a log, exit 1, first failure named" \
    "$([ $rc -eq 1 ] && [ -e "$tmp/o3/19-train-gpt2-stage3.log" ] && grep -q 'first: make-cuda' "$tmp/o3/summary.txt" && echo 0 || echo 1)" \
    "rc=$rc"$'\n'"$(cat "$tmp/o3/summary.txt" 2>&1)"

echo "zt: $pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
