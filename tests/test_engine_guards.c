/* The debug mode's cross-rank check of zero_engine_set_tensor: ranks of the local comm are
   threads, and a static buffer in the rank function is shared by all of them (or a rank
   initialises differently). With debug_guards on, the next step compares a hash of each
   tensor's values across ranks: different values are MISMATCH on every rank, naming the
   tensor; the same values train as without the check. */
#define _XOPEN_SOURCE 700 /* zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "tests/zt.h"


typedef struct guard_run {
    int stage, guards, differ; /* differ: rank 1 sets another value in tensor 'b0' */
    zero_result rc[2];
    char err[2][512];
    float param[2];
} guard_run;

static zero_result guard_rank(int rank, zero_comm *comm, void *user)
{
    guard_run *G = (guard_run *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_step_info info;
    float w[64], b[8];
    int ids[2], i, g;
    zero_result r = zero_host_device_create(NULL, &dev);
    memset(&d, 0, sizeof d);
    d.stage = G->stage;
    d.param_dtype = ZERO_F32;
    d.device = dev;
    d.comm = comm;
    d.adam.lr = 1e-2;
    d.debug_guards = G->guards ? 1 : -1;
    if (!r) r = zero_engine_create(&d, &e);
    if (!r) r = zero_engine_add_tensor(e, "w0", 64, 0, 0, &ids[0]);
    if (!r) r = zero_engine_add_tensor(e, "b0", 8, 1, ZERO_TENSOR_NO_DECAY, &ids[1]);
    if (!r) r = zero_engine_commit(e);
    for (i = 0; i < 64; i++) w[i] = 0.01f * (float)(i % 7);
    for (i = 0; i < 8; i++) b[i] = G->differ && rank == 1 && i == 3 ? 0.5f : 0.25f;
    if (!r) r = zero_engine_set_tensor(e, ids[0], w);
    if (!r) r = zero_engine_set_tensor(e, ids[1], b);
    for (g = 0; g < 2 && !r; g++) {
        void *p, *dg;
        size_t n = g ? 8 : 64;
        r = zero_engine_gather(e, g, &p);
        if (!r) r = zero_engine_grads(e, g, &dg);
        for (i = 0; !r && i < (int)n; i++) ((float *)dg)[i] = ((const float *)p)[i];
        if (!r) r = zero_engine_release(e, g);
        if (!r) r = zero_engine_grads_ready(e, g);
    }
    if (!r) r = zero_engine_step(e, &info);
    if (!r) {
        zero_range own;
        float all[8];
        memset(&own, 0, sizeof own);
        r = zero_engine_read_tensor(e, ids[1], ZERO_STATE_MASTER, all, &own);
        G->param[rank] = own.numel ? all[own.offset] : 0.0f;
    }
    G->rc[rank] = r;
    snprintf(G->err[rank], sizeof G->err[rank], "%s", r ? zero_last_error() : "");
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(guards_compare_set_tensor_across_ranks)
{
    int stage, k;
    for (stage = 0; stage <= 3; stage++) {
        guard_run G;
        memset(&G, 0, sizeof G);
        G.stage = stage, G.guards = 1, G.differ = 1;
        zero_local_run(2, guard_rank, &G);
        for (k = 0; k < 2; k++)
            ZT_CHECKF(G.rc[k] == ZERO_ERROR_MISMATCH && strstr(G.err[k], "tensor 1 ('b0')") &&
                          strstr(G.err[k], "static buffer"),
                      "stage %d rank %d: %s: %s", stage, k, zero_result_string(G.rc[k]), G.err[k]);
        memset(&G, 0, sizeof G); /* the same values: trains */
        G.stage = stage, G.guards = 1;
        zero_local_run(2, guard_rank, &G);
        for (k = 0; k < 2; k++) ZT_CHECKF(G.rc[k] == ZERO_OK, "stage %d rank %d: %s", stage, k, G.err[k]);
        memset(&G, 0, sizeof G); /* without guards nothing is compared (the documented cost) */
        G.stage = stage, G.differ = 1;
        zero_local_run(2, guard_rank, &G);
        for (k = 0; k < 2; k++) ZT_CHECKF(G.rc[k] == ZERO_OK, "stage %d rank %d: %s", stage, k, G.err[k]);
    }
}

int main(void)
{
    ZT_RUN(guards_compare_set_tensor_across_ranks);
    return zt_summary();
}
