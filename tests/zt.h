/* zt.h - the test harness of zero's test programs: a few macros, one summary line.

   ZT_TEST(name) { ... ZT_CHECK(cond); ZT_CHECKF(cond, "fmt", ...); ZT_SKIP("why"); }
   int main(void) { ZT_RUN(name); ...; return zt_summary(); }

   A test passes when none of its checks failed. zt_summary() prints
   "zt: N passed, N failed, N skipped" (tests/run.sh adds these up) and returns the
   exit code. Set ZT_QUICK=1 for smaller sizes (the sanitizer build does). */
#ifndef ZT_H
#define ZT_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int zt_passed, zt_failed, zt_skipped;
static int zt_cur_failures, zt_cur_skipped;
static const char *zt_cur_name;

#define ZT_TEST(name) static void name(void)

#define ZT_CHECKF(cond, ...)                                                                  \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            if (zt_cur_failures < 10) {                                                      \
                fprintf(stderr, "  %s:%d: %s: check failed: %s: ", __FILE__, __LINE__,       \
                        zt_cur_name, #cond);                                                 \
                fprintf(stderr, __VA_ARGS__);                                                \
                fputc('\n', stderr);                                                         \
            }                                                                                \
            zt_cur_failures++;                                                               \
        }                                                                                    \
    } while (0)

#define ZT_CHECK(cond) ZT_CHECKF(cond, "%s", "")

/* Marks the running test skipped and leaves it. */
#define ZT_SKIP(why)                                                                         \
    do {                                                                                     \
        printf("  skip %s: %s\n", zt_cur_name, why);                                         \
        zt_cur_skipped = 1;                                                                  \
        return;                                                                              \
    } while (0)

#define ZT_RUN(fn)                                                                           \
    do {                                                                                     \
        zt_cur_name = #fn;                                                                   \
        zt_cur_failures = 0;                                                                 \
        zt_cur_skipped = 0;                                                                  \
        fn();                                                                                \
        if (zt_cur_failures) {                                                               \
            zt_failed++;                                                                     \
            printf("FAIL %s (%d failed checks)\n", #fn, zt_cur_failures);                    \
        } else if (zt_cur_skipped) {                                                         \
            zt_skipped++;                                                                    \
        } else {                                                                             \
            zt_passed++;                                                                     \
            printf("ok   %s\n", #fn);                                                        \
        }                                                                                    \
        fflush(stdout);                                                                      \
    } while (0)

/* 1 when ZT_QUICK is set: tests shrink their sizes (sanitizer runs). */
static inline int zt_quick(void)
{
    const char *q = getenv("ZT_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* 1 when ZT_LONG is set (make test-long, which CI runs): the stress cases run at their long
   sizes; make test runs them short. */
static inline int zt_long(void)
{
    const char *q = getenv("ZT_LONG");
    return q && *q && strcmp(q, "0") != 0;
}

/* A small deterministic generator (splitmix64), so failures reproduce. */
static unsigned long long zt_rng_state = 0x9e3779b97f4a7c15ull;
static inline unsigned long long zt_rand64(void)
{
    unsigned long long z = (zt_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline void zt_seed(unsigned long long s) { zt_rng_state = s; }
/* uniform in [0, 1) */
static inline double zt_uniform(void) { return (double)(zt_rand64() >> 11) * (1.0 / 9007199254740992.0); }

/* Milliseconds on the monotonic clock (timeouts, elapsed times). */
static inline double zt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Sleeps ms milliseconds, resuming when a signal interrupts. */
static inline void zt_sleep_ms(int ms)
{
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline int zt_summary(void)
{
    printf("zt: %d passed, %d failed, %d skipped\n", zt_passed, zt_failed, zt_skipped);
    return zt_failed ? 1 : 0;
}
#endif
