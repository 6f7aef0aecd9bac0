#!/usr/bin/env bash
# The threads run (build/train_mlp) and the MPI run (mpirun -np N build/train_mlp_mpi) of
# the same N, dtype, accumulation and steps end with the same "params checksum" line, at
# every stage (each program also checks that its four stages agree). Run by make test-mpi;
# prints one zt summary line like the C tests.
set -u
cd "$(dirname "$0")/../.."
MPIRUN=${MPIRUN:-mpirun}
MPIRUN_FLAGS=${MPIRUN_FLAGS:---oversubscribe --bind-to none}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
passed=0; failed=0
sum_of() { printf '%s\n' "$1" | sed -n 's/^params checksum: \([0-9a-f]\{16\}\)$/\1/p' | tail -n 1; }
for n in ${MPI_NP:-2 3 4}; do
  for dt in f16 bf16; do
    args="--steps 30 --accum 2 --dtype $dt"
    t=$(build/train_mlp --ranks "$n" $args 2>&1); trc=$?
    # shellcheck disable=SC2086
    m=$($MPIRUN $MPIRUN_FLAGS -np "$n" build/train_mlp_mpi $args 2>&1); mrc=$?
    a=$(sum_of "$t"); b=$(sum_of "$m")
    if [ $trc -eq 0 ] && [ $mrc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then
      echo "ok   checksum N=$n $dt accum 2: threads $a = mpi $b"; passed=$((passed + 1))
    else
      echo "FAIL checksum N=$n $dt: threads '$a' (exit $trc), mpi '$b' (exit $mrc)"
      printf '%s\n' "$m" | tail -n 5
      failed=$((failed + 1))
    fi
  done
done
# the checksum sees the values: one more step changes it
a=$(sum_of "$(build/train_mlp --ranks 2 --steps 30 --accum 2 --stage 0 2>&1)")
b=$(sum_of "$(build/train_mlp --ranks 2 --steps 31 --accum 2 --stage 0 2>&1)")
if [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ]; then
  echo "ok   checksum changes with the params: 30 steps $a, 31 steps $b"; passed=$((passed + 1))
else
  echo "FAIL checksum 30 vs 31 steps: '$a' '$b'"; failed=$((failed + 1))
fi
echo "zt: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
