/* Compile test: the implementation file includes libc headers before zero.h, as
   real programs do. Under -std=c99/c11 the C library then hides POSIX (zero.h's request for
   it comes too late), and the build used to fail on an implicit pthread_condattr_setclock
   (an error by default on GCC 14 and Clang 16). The Makefile builds this with
   -Werror=implicit-function-declaration, gcc and clang, c99 and c11, and runs it: a 2-rank
   local comm exercises the monotonic clock and the condition variable's clock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define ZERO_IMPLEMENTATION
#include "zero.h"

static zero_result rank_fn(int rank, zero_comm *comm, void *user)
{
    float x[3];
    int i;
    (void)user;
    for (i = 0; i < 3; i++) x[i] = (float)(rank + 1);
    if (comm->ops->all_reduce(comm, x, x, 3, ZERO_F32, ZERO_OP_SUM, NULL) != ZERO_OK) return ZERO_ERROR_COMM;
    return x[0] == 3.0f && x[2] == 3.0f ? ZERO_OK : ZERO_ERROR_MISMATCH;
}

int main(void)
{
    zero_local_desc d;
    zero_result r;
    memset(&d, 0, sizeof d);
    d.world = 2;
    d.timeout_ms = 10000;
    r = zero_local_run_desc(&d, rank_fn, NULL);
    if (r != ZERO_OK) {
        printf("compile_first: %s: %s\n", zero_result_string(r), zero_last_error());
        return EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
}
