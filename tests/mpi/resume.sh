#!/usr/bin/env bash
# Checkpoints and offload over the MPI comm: a run saved under mpirun and resumed under
# mpirun (another stage; with and without the optimizer offloaded to the CPU or NVMe) ends
# with the same "params checksum" as the straight threads run of the same total steps, and
# a checkpoint saved by the threads run resumes under mpirun the same way. Run by
# make test-mpi; prints one zt summary line like the C tests.
set -u
cd "$(dirname "$0")/../.."
MPIRUN=${MPIRUN:-mpirun}
MPIRUN_FLAGS=${MPIRUN_FLAGS:---oversubscribe --bind-to none}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0; failed=0
# the demo's "params checksum: X", or the offload demo's "(params checksum X / Y)" when X = Y
sum_of() { printf '%s\n' "$1" | sed -n -e 's/^params checksum: \([0-9a-f]\{16\}\)$/\1/p' \
             -e 's/.*(params checksum \([0-9a-f]\{16\}\) \/ \1)$/\1/p' | tail -n 1; }
check() { # label expected output exit
  local got; got=$(sum_of "$3")
  if [ "$4" -eq 0 ] && [ -n "$2" ] && [ "$got" = "$2" ]; then
    echo "ok   $1: $got"; passed=$((passed + 1))
  else
    echo "FAIL $1: expected '$2', got '$got' (exit $4)"; printf '%s\n' "$3" | tail -n 5
    failed=$((failed + 1))
  fi
}
n=2; args="--ranks $n --accum 2 --dtype f16"
ref=$(sum_of "$(build/train_mlp $args --steps 24 2>&1)")
# shellcheck disable=SC2086
# (a run this short may exit 1 for "the loss did not fall to half": the manifest tells)
out=$($MPIRUN $MPIRUN_FLAGS -np $n build/train_mlp_mpi $args --stage 2 --steps 12 --save "$tmp/mpi" 2>&1)
[ -f "$tmp/mpi/zero.manifest" ] || { echo "FAIL save under mpirun"; printf '%s\n' "$out" | tail -n 5; failed=$((failed + 1)); }
for off in "" "--offload-optimizer cpu" "--offload-optimizer nvme --nvme-path $tmp"; do
  # shellcheck disable=SC2086
  out=$($MPIRUN $MPIRUN_FLAGS -np $n build/train_mlp_mpi $args --stage 3 --steps 24 --resume "$tmp/mpi" $off 2>&1)
  check "mpi save (stage 2) -> mpi resume (stage 3) ${off:-no offload}" "$ref" "$out" $?
done
# a resume that silently started from scratch would also match the straight run: a
# checkpoint trained at another lr (saved with it, restored by load) must change the result,
# the same way for the threads and the MPI resume
# shellcheck disable=SC2086
out=$($MPIRUN $MPIRUN_FLAGS -np $n build/train_mlp_mpi $args --lr 0.01 --stage 0 --steps 12 --save "$tmp/lr" 2>&1)
alt=$(sum_of "$(build/train_mlp $args --stage 2 --steps 24 --resume "$tmp/lr" 2>&1)")
if [ -n "$alt" ] && [ "$alt" != "$ref" ]; then
  echo "ok   a checkpoint trained at lr 0.01 changes the result: $alt != $ref"; passed=$((passed + 1))
else
  echo "FAIL the lr-0.01 checkpoint: '$alt' vs straight '$ref'"; failed=$((failed + 1))
fi
# shellcheck disable=SC2086
out=$($MPIRUN $MPIRUN_FLAGS -np $n build/train_mlp_mpi $args --stage 3 --steps 24 --resume "$tmp/lr" --offload-optimizer cpu 2>&1)
check "mpi resume of the lr-0.01 checkpoint (stage 3, offload cpu) = threads resume" "$alt" "$out" $?
out=$(build/train_mlp $args --stage 1 --steps 12 --save "$tmp/threads" 2>&1)
[ -f "$tmp/threads/zero.manifest" ] || { echo "FAIL save by the threads run"; failed=$((failed + 1)); }
# shellcheck disable=SC2086
out=$($MPIRUN $MPIRUN_FLAGS -np $n build/train_mlp_mpi $args --stage 1 --steps 24 --resume "$tmp/threads" 2>&1)
check "threads save (stage 1) -> mpi resume (stage 1)" "$ref" "$out" $?
echo "zt: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
