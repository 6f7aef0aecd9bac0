#!/usr/bin/env bash
# The GPT-2 example under mpirun: mpirun -np N build/train_gpt2_mpi prints the same losses
# (the --log CSV, every digit) and "params checksum" as build/train_gpt2 with N threads, at
# stages 0-3 (the demo mode, which also checks that its stages agree), fp32 and bf16; and a
# run saved by threads at step 6 and resumed under mpirun (another stage) ends where the
# straight run ends; --batch 6 on 2 processes is accepted. Run by make test-mpi; prints one zt summary line like the C tests.
set -u
cd "$(dirname "$0")/../.."
MPIRUN=${MPIRUN:-mpirun}
MPIRUN_FLAGS=${MPIRUN_FLAGS:---oversubscribe --bind-to none}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
passed=0; failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zt-gpt2-mpi.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
M="--layers 2 --heads 2 --channels 32 --seq 16 --batch 4 --steps 12 --sample 0 --val-batches 1"
sum_of() { sed -n 's/^params checksum: \([0-9a-f]\{16\}\)$/\1/p' "$1" | tail -n 1; }
check() { # name, threads output, mpi output, threads csv, mpi csv
  a=$(sum_of "$2"); b=$(sum_of "$3")
  if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$4" "$5" && [ "$agree" = 1 ]; then echo "ok   $1: threads $a = mpi $b"; passed=$((passed + 1))
  else echo "FAIL $1: threads '$a', mpi '$b'"; tail -n 5 "$3"; failed=$((failed + 1)); fi
}
for n in 2 4; do
  for dt in f32 bf16; do
    build/train_gpt2 $M --ranks "$n" --dtype $dt --log "$tmp/t.csv" > "$tmp/t.out" 2>&1
    # shellcheck disable=SC2086
    $MPIRUN $MPIRUN_FLAGS -np "$n" build/train_gpt2_mpi $M --dtype $dt --log "$tmp/m.csv" > "$tmp/m.out" 2>&1
    agree=1; grep -q "stages 0-3: identical" "$tmp/m.out" || agree=0
    check "N=$n $dt stages 0-3" "$tmp/t.out" "$tmp/m.out" "$tmp/t.csv" "$tmp/m.csv"
  done
done
# --batch 6 on 2 processes without --ranks: checked against mpirun's world, not the default
# --ranks 4 (it was refused)
M6=${M/--batch 4/--batch 6}
build/train_gpt2 $M6 --ranks 2 --stage 2 --log "$tmp/t.csv" > "$tmp/t.out" 2>&1
# shellcheck disable=SC2086
$MPIRUN $MPIRUN_FLAGS -np 2 build/train_gpt2_mpi $M6 --stage 2 --log "$tmp/m.csv" > "$tmp/m.out" 2>&1
agree=1
check "N=2 --batch 6 without --ranks" "$tmp/t.out" "$tmp/m.out" "$tmp/t.csv" "$tmp/m.csv"
# threads save at step 6 (stage 1), mpirun resumes (stage 3) = the straight threads run
build/train_gpt2 $M --ranks 2 --stage 3 --log "$tmp/s.csv" > "$tmp/s.out" 2>&1
build/train_gpt2 $M --ranks 2 --stage 1 --stop-at 6 --save "$tmp/ck" > /dev/null 2>&1
# shellcheck disable=SC2086
$MPIRUN $MPIRUN_FLAGS -np 2 build/train_gpt2_mpi $M --stage 3 --resume "$tmp/ck" --log "$tmp/r.csv" > "$tmp/r.out" 2>&1
tail -n 6 "$tmp/s.csv" > "$tmp/s6.csv"; tail -n 6 "$tmp/r.csv" > "$tmp/r6.csv"; agree=1
check "threads save (stage 1, step 6) -> mpi resume (stage 3)" "$tmp/s.out" "$tmp/r.out" "$tmp/s6.csv" "$tmp/r6.csv"
echo "zt: $passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
