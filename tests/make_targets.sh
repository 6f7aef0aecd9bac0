#!/usr/bin/env bash
# What the GPU targets compile on a machine without a GPU, read from make's dry run with a
# stand-in nvcc (a path no recipe may name unless it compiles CUDA): make test-cuda,
# sanitize-cuda and bench-cuda probe for a GPU and say they skipped without running nvcc;
# make mpi compiles no CUDA file (make cuda does); make test names test_cuda_host exactly
# when nvcc is present. Run by make test; prints one zt summary line like the C tests.
set -u
cd "$(dirname "$0")/.."
unset MAKEFLAGS MFLAGS MAKELEVEL
passed=0; failed=0; skipped=0
ok()   { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zt-make.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
for tool in nvcc mpicc cc; do # stand-ins: log the call, build nothing
  printf '#!/bin/sh\necho "$*" >> %s/%s.log\nexit 0\n' "$tmp" "$tool" > "$tmp/fake-$tool"; chmod +x "$tmp/fake-$tool"
done
fakes="NVCC=$tmp/fake-nvcc MPICC=$tmp/fake-mpicc MPIRUN=true CC=$tmp/fake-cc"
gpu=0
if nvidia-smi -L >/dev/null 2>&1 || { ! command -v nvidia-smi >/dev/null 2>&1 && ls /dev/nvidia[0-9]* >/dev/null 2>&1; }; then gpu=1; fi

for t in test-cuda sanitize-cuda bench-cuda; do
  if [ $gpu -eq 1 ]; then echo "skip $t without a GPU: a GPU is visible here"; skipped=$((skipped + 1)); continue; fi
  rm -f "$tmp/nvcc.log"
  # shellcheck disable=SC2086
  out=$(make -B --no-print-directory "$t" $fakes 2>&1)
  if [ -s "$tmp/nvcc.log" ]; then fail "$t runs nvcc although no GPU is visible ($(wc -l < "$tmp/nvcc.log") calls)"
  elif ! printf '%s\n' "$out" | grep -q "^$t: skipped: no GPU visible"; then fail "$t: no skip line: $out"
  else ok "$t: a skip line, nvcc not run"; fi
done

rm -f "$tmp/nvcc.log" "$tmp/mpicc.log"
# shellcheck disable=SC2086
out=$(make -B --no-print-directory mpi $fakes 2>&1)
if [ -s "$tmp/nvcc.log" ]; then fail "make mpi runs nvcc unasked: $(head -n 1 "$tmp/nvcc.log")"
elif ! grep -q "train_mlp_mpi" "$tmp/mpicc.log" 2>/dev/null; then fail "make mpi builds no MPI program: $out"
else ok "make mpi compiles no CUDA file"; fi

rm -f "$tmp/nvcc.log"
# shellcheck disable=SC2086
make -B --no-print-directory cuda $fakes >/dev/null 2>&1
if grep -q nccl_mpi_build "$tmp/nvcc.log" 2>/dev/null; then ok "make cuda compiles the MPI+NCCL build (mpicc present)"
else fail "make cuda does not build tests/mpi/nccl_mpi_build.cu"; fi

fake=$tmp/fake-nvcc
with=$(make -n --no-print-directory test NVCC="$fake" 2>&1 | grep "tests/run.sh")
without=$(make -n --no-print-directory test NVCC= 2>&1 | grep "tests/run.sh")
if printf '%s\n' "$with" | grep -q "build/cuda/test_cuda_host" && ! printf '%s\n' "$without" | grep -q "test_cuda_host"; then
  ok "make test runs build/cuda/test_cuda_host when nvcc is present, not without"
else fail "make test and test_cuda_host: with nvcc '$with', without '$without'"; fi

echo "zt: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
