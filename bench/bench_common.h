/* bench/bench_common.h: what the CPU benchmarks share. Include after zero.h (whose
   implementation selects the POSIX names, clock_gettime among them). */
#ifndef ZERO_BENCH_COMMON_H
#define ZERO_BENCH_COMMON_H

#include <time.h>

/* Seconds on the monotonic clock (differences of two calls time an interval). */
static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#endif
