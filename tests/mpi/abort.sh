#!/usr/bin/env bash
# zero_mpi_desc.abort_on_timeout: a rank that times out calls MPI_Abort, so mpirun ends the
# whole job (non-zero exit) within about the timeout instead of any rank hanging. Run by
# make test-mpi (after the wrappers are built); prints one zt summary line.
set -u
cd "$(dirname "$0")/../.."
MPIRUN=${MPIRUN:-mpirun}
MPIRUN_FLAGS=${MPIRUN_FLAGS:---oversubscribe --bind-to none}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t0=$(date +%s)
# shellcheck disable=SC2086
out=$(timeout 60 $MPIRUN $MPIRUN_FLAGS -np 2 build/mpi/test_mpi_comm --abort-probe 2>&1); rc=$?
dt=$(( $(date +%s) - t0 ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s\n' "$out" | grep -q 'calling MPI_Abort (abort_on_timeout)' &&
   ! printf '%s\n' "$out" | grep -q 'rank 0 returned' && [ $dt -lt 30 ]; then
  echo "ok   abort_on_timeout: the job ended (exit $rc) after ${dt} s"
  echo "zt: 1 passed, 0 failed, 0 skipped"
else
  echo "FAIL abort_on_timeout: exit $rc after ${dt} s"; printf '%s\n' "$out" | tail -n 8
  echo "zt: 0 passed, 1 failed, 0 skipped"; exit 1
fi
