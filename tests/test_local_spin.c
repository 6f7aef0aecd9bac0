/* The local comm's spin-then-sleep rendezvous: spinning changes the cost of a
   sync point, never its semantics. With long spins forced (spin_us up to 1 s, where the
   machine has a core per rank), against the same calls with spinning off:
   - results are bit-identical (sums in rank order) over many back-to-back collectives of
     every kind, in place and not;
   - a disagreement is still MISMATCH on every rank, and the group stays usable;
   - a rank that never arrives still times out within the timeout (the spin is clamped to
     a quarter of it), with the missing rank named;
   - zero_local_abort() ends a spin at once (COMM), far sooner than the spin budget;
   - the spin is off when ranks outnumber the cores (checked through the timing-free
     path: results only). */
#define _XOPEN_SOURCE 700 /* POSIX names (mkdtemp, pwrite): zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "tests/zt.h"
#include <unistd.h>

typedef struct spin_ctx {
    int iters;
    float out[4][64];
    uint16_t gat[4][4 * 16];
    zero_result rc[4];
    double ms[4];
    char err[4][512];
    int mode; /* 0: results, 1: mismatch, 2: timeout, 3: abort */
    int timeout_ms;
} spin_ctx;

static zero_result spin_rank(int rank, zero_comm *comm, void *user)
{
    spin_ctx *x = (spin_ctx *)user;
    zero_result r = ZERO_OK;
    int it, i, w = comm->world;
    if (x->mode == 0) {
        float a[64], b[64];
        uint16_t h[16];
        for (i = 0; i < 64; i++) x->out[rank][i] = 0.0f;
        for (it = 0; it < x->iters && r == ZERO_OK; it++) {
            for (i = 0; i < 64; i++) a[i] = 0.001f * (float)((i * 13 + rank * 7 + it) % 101) - 0.05f;
            for (i = 0; i < 16; i++) h[i] = zero_f32_to_f16(a[i]);
            r = comm->ops->all_reduce(comm, a, a, 64, ZERO_F32, ZERO_OP_SUM, NULL); /* in place */
            if (r == ZERO_OK) r = comm->ops->reduce_scatter(comm, a, b, 64 / w, ZERO_F32, ZERO_OP_MAX, NULL);
            if (r == ZERO_OK) r = comm->ops->all_gather(comm, h, x->gat[rank], 16, ZERO_F16, NULL);
            if (r == ZERO_OK) r = comm->ops->broadcast(comm, a, 64, ZERO_F32, it % w, NULL);
            if (r == ZERO_OK && it % 7 == 0) r = comm->ops->barrier(comm);
            for (i = 0; i < 64 && r == ZERO_OK; i++) x->out[rank][i] += a[i] + (i < 64 / w ? b[i] : 0.0f);
        }
        x->rc[rank] = r;
        return r;
    }
    if (x->mode == 1) {
        float a[16] = {0};
        x->rc[rank] = comm->ops->all_reduce(comm, a, a, rank == 1 ? 8 : 16, ZERO_F32, ZERO_OP_SUM, NULL);
        snprintf(x->err[rank], sizeof x->err[rank], "%s", zero_last_error());
        /* usable after */
        return comm->ops->all_reduce(comm, a, a, 16, ZERO_F32, ZERO_OP_SUM, NULL);
    }
    if (x->mode == 2) {
        if (rank == 1) {
            zt_sleep_ms(3 * x->timeout_ms);
            return ZERO_OK;
        }
    } else if (rank == 1) { /* mode 3: abort while rank 0 spins */
        zt_sleep_ms(30);
        return zero_local_abort(comm);
    }
    {
        double t0 = zt_now_ms();
        x->rc[0] = comm->ops->barrier(comm);
        x->ms[0] = zt_now_ms() - t0;
        snprintf(x->err[0], sizeof x->err[0], "%s", zero_last_error());
    }
    return ZERO_OK;
}

static void run(spin_ctx *x, int world, int spin_us, int timeout_ms)
{
    zero_local_desc d;
    memset(&d, 0, sizeof d);
    d.world = world;
    d.spin_us = spin_us;
    d.timeout_ms = timeout_ms;
    x->timeout_ms = timeout_ms;
    (void)zero_local_run_desc(&d, spin_rank, x);
}

ZT_TEST(spin_results_equal_sleep_results)
{
    static const int worlds[] = {1, 2, 4};
    static const int spins[] = {1000000, 1, 50};
    int wi, si, r;
    for (wi = 0; wi < 3; wi++) {
        static spin_ctx ref, got;
        memset(&ref, 0, sizeof ref);
        ref.iters = zt_long() ? 2000 : 200; /* make test-long: the long run */
        run(&ref, worlds[wi], -1, 20000);
        for (r = 0; r < worlds[wi]; r++) ZT_CHECK(ref.rc[r] == ZERO_OK);
        for (si = 0; si < 3; si++) {
            memset(&got, 0, sizeof got);
            got.iters = ref.iters;
            run(&got, worlds[wi], spins[si], 20000);
            for (r = 0; r < worlds[wi]; r++) {
                ZT_CHECKF(got.rc[r] == ZERO_OK, "N=%d spin %d rank %d", worlds[wi], spins[si], r);
                ZT_CHECKF(memcmp(got.out[r], ref.out[r], sizeof got.out[r]) == 0 &&
                              memcmp(got.gat[r], ref.gat[r], sizeof got.gat[r]) == 0,
                          "N=%d spin %d rank %d: results differ from the sleeping rendezvous",
                          worlds[wi], spins[si], r);
            }
        }
    }
}

ZT_TEST(spin_keeps_mismatch)
{
    spin_ctx x;
    int r;
    memset(&x, 0, sizeof x);
    x.mode = 1;
    run(&x, 2, 1000000, 20000);
    for (r = 0; r < 2; r++)
        ZT_CHECKF(x.rc[r] == ZERO_ERROR_MISMATCH && strstr(x.err[r], "numel 8") != NULL, "rank %d: %s",
                  r, x.err[r]);
}

ZT_TEST(spin_keeps_timeout)
{
    spin_ctx x;
    int timeout = zt_quick() ? 1000 : 300;
    memset(&x, 0, sizeof x);
    x.mode = 2;
    run(&x, 2, 1000000, timeout); /* asks for a 1 s spin: clamped below the timeout */
    ZT_CHECKF(x.rc[0] == ZERO_ERROR_TIMEOUT, "%s: %s", zero_result_string(x.rc[0]), x.err[0]);
    ZT_CHECKF(strstr(x.err[0], "waiting for rank(s) 1") != NULL, "%s", x.err[0]);
    ZT_CHECKF(x.ms[0] >= 0.9 * timeout && x.ms[0] < 2.5 * timeout, "timeout %d ms took %.0f ms",
              timeout, x.ms[0]);
}

ZT_TEST(spin_ends_on_abort)
{
    spin_ctx x;
    memset(&x, 0, sizeof x);
    x.mode = 3;
    run(&x, 2, 1000000, 20000); /* spin budget 1 s; the peer aborts after 30 ms */
    ZT_CHECKF(x.rc[0] == ZERO_ERROR_COMM, "%s: %s", zero_result_string(x.rc[0]), x.err[0]);
    ZT_CHECKF(x.ms[0] < 900.0, "abort took %.0f ms to end the wait", x.ms[0]);
    if (sysconf(_SC_NPROCESSORS_ONLN) >= 2) /* the spin ran: it ended on the abort */
        ZT_CHECKF(strstr(x.err[0], "zero_local_abort") != NULL, "%s", x.err[0]);
}

int main(void)
{
    ZT_RUN(spin_results_equal_sleep_results);
    ZT_RUN(spin_keeps_mismatch);
    ZT_RUN(spin_keeps_timeout);
    ZT_RUN(spin_ends_on_abort);
    return zt_summary();
}
