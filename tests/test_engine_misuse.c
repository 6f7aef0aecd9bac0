/* The engine, misuse: every wrong call returns an error and leaves the engine usable (or,
   after a failed commit or collective, cleanly destroyable); ranks that registered different
   tensors all get MISMATCH at commit, none hangs. */
#define _XOPEN_SOURCE 700 /* zero.h is linked (build/zero_impl.o); zt_fail: tests/zt_private.h */
#include "zero.h"
#include "tests/zt.h"
#include "tests/zt_private.h"
#include "tests/engine_common.h"

#define MAXR 4
typedef struct mctx {
    zero_result got[MAXR][16]; /* per rank, per probe */
    int variant;
} mctx;

static zero_result mk_engine(zero_comm *comm, zero_device **dev, zero_engine **e, int stage,
                             int accum)
{
    zero_engine_desc d;
    zero_result r = zero_host_device_create(NULL, dev);
    if (r) return r;
    memset(&d, 0, sizeof d);
    d.stage = stage;
    d.accum_steps = accum;
    d.device = *dev;
    d.comm = comm;
    return zero_engine_create(&d, e);
}

/* One full micro-step of a 2-group model (groups 0, 1): forward and backward. */
static zero_result micro_step(zero_engine *e)
{
    void *p, *g;
    zero_result r;
    int k;
    for (k = 0; k < 2; k++) {
        if ((r = zero_engine_gather(e, k, &p))) return r;
        if ((r = zero_engine_release(e, k))) return r;
    }
    for (k = 1; k >= 0; k--) {
        if ((r = zero_engine_gather(e, k, &p))) return r;
        if ((r = zero_engine_grads(e, k, &g))) return r;
        ((uint16_t *)g)[0] = zero_f32_to_f16(100.0f); /* one element of the first tensor */
        if ((r = zero_engine_release(e, k))) return r;
        if ((r = zero_engine_grads_ready(e, k))) return r;
    }
    return ZERO_OK;
}

static zero_result add_model(zero_engine *e)
{
    zero_result r = zero_engine_add_tensor(e, "w0", 33, 0, 0, NULL);
    if (!r) r = zero_engine_add_tensor(e, "b0", 3, 0, ZERO_TENSOR_NO_DECAY, NULL);
    if (!r) r = zero_engine_add_tensor(e, "w1", 50, 1, 0, NULL);
    return r;
}

/* Probes, in order; the rank function records each result. */
static zero_result misuse_rank(int rank, zero_comm *comm, void *user)
{
    mctx *m = (mctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_step_info info;
    void *p;
    int stage = m->variant; /* 0..3 */
    zero_result *got = m->got[rank];
    zero_result r = mk_engine(comm, &dev, &e, stage, 3);
    if (r) goto out;
    got[0] = zero_engine_gather(e, 0, &p);      /* before commit */
    got[1] = zero_engine_step(e, &info);        /* before commit */
    if ((r = add_model(e))) goto out;
    if ((r = zero_engine_commit(e))) goto out;
    got[2] = zero_engine_add_tensor(e, "late", 10, 0, 0, NULL); /* after commit */
    got[3] = zero_engine_commit(e);                              /* twice */
    got[4] = zero_engine_gather(e, 7, &p);                       /* unknown group */
    got[5] = zero_engine_gather(e, -1, &p);
    if ((r = zero_engine_gather(e, 1, &p))) goto out;
    if ((r = zero_engine_release(e, 1))) goto out;
    got[6] = zero_engine_release(e, 1);                          /* released twice */
    got[7] = zero_engine_set_lr(e, NAN);
    got[8] = zero_engine_step(e, &info);                         /* before any gradient */
    got[9] = zero_engine_grads_ready(e, 0);                      /* no grads buffer */
    if ((r = micro_step(e))) goto out;
    if ((r = micro_step(e))) goto out;
    got[10] = zero_engine_step(e, &info);                        /* 2 of 3 micro-steps */
    if ((r = micro_step(e))) goto out;
    got[11] = zero_engine_grads(e, 0, &p);                       /* a 4th micro-step */
    if ((r = zero_engine_gather(e, 0, &p))) goto out;
    got[12] = zero_engine_step(e, &info);                        /* still gathered */
    if ((r = zero_engine_release(e, 0))) goto out;
    /* The engine is still usable: the step runs, and a second full step too. */
    if ((r = zero_engine_step(e, &info))) goto out;
    if (info.step != 1) r = ZERO_ERROR_INVALID_STATE;
    if (!r) r = micro_step(e);
    if (!r) r = micro_step(e);
    if (!r) r = micro_step(e);
    if (!r) r = zero_engine_step(e, &info);
    if (!r && info.step != 2) r = ZERO_ERROR_INVALID_STATE;
out:
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(misuse_returns_errors_and_engine_stays_usable)
{
    int st, rk;
    for (st = 0; st <= 3; st++) {
        mctx m;
        zero_result r;
        memset(&m, 0, sizeof m);
        m.variant = st;
        r = zero_local_run(2, misuse_rank, &m);
        ZT_CHECKF(r == ZERO_OK, "stage %d: %s: %s", st, zero_result_string(r), zero_last_error());
        for (rk = 0; rk < 2; rk++) {
            zero_result *g = m.got[rk];
            ZT_CHECK(g[0] == ZERO_ERROR_INVALID_STATE && g[1] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECK(g[2] == ZERO_ERROR_INVALID_STATE && g[3] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECK(g[4] == ZERO_ERROR_NOT_FOUND && g[5] == ZERO_ERROR_NOT_FOUND);
            ZT_CHECK(g[6] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECK(g[7] == ZERO_ERROR_INVALID_ARGUMENT);
            ZT_CHECK(g[8] == ZERO_ERROR_INVALID_STATE && g[9] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECKF(g[10] == ZERO_ERROR_INVALID_STATE, "%d", g[10]);
            ZT_CHECK(g[11] == ZERO_ERROR_INVALID_STATE && g[12] == ZERO_ERROR_INVALID_STATE);
        }
    }
}

ZT_TEST(bad_descriptors)
{
    zero_device *dev = NULL;
    zero_local_group *grp = NULL;
    zero_comm *comm = NULL;
    zero_engine *e = (zero_engine *)&e;
    zero_engine_desc d;
    zero_local_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.world = 1;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    ZT_CHECK(zero_local_group_create(&ld, &grp) == ZERO_OK);
    ZT_CHECK(zero_local_comm_create(grp, 0, &comm) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.device = dev;
    d.comm = comm;
    d.adam.lr = NAN;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT && e == NULL);
    ZT_CHECK(strstr(zero_last_error(), "lr") != NULL);
    d.adam.lr = 0;
    d.stage = 4;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.stage = 1;
    d.param_dtype = ZERO_F64;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.param_dtype = ZERO_F16;
    d.clip_norm = -1;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.clip_norm = 0;
    d.accum_steps = -2;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.accum_steps = 0;
    d.comm = NULL;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.comm = comm;
    d.scaler.factor = 0.5f;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.scaler.factor = 0;
    ZT_CHECK(zero_engine_create(NULL, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_create(&d, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    /* a valid one; bad registrations; an empty commit */
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_add_tensor(e, "x", 0, 0, 0, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_add_tensor(e, "x", 5, -1, 0, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_add_tensor(e, "x", 5, 0, 8u, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_add_tensor(e, NULL, 5, 0, 0, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_add_tensor(e, "x", 5, 0, 0, NULL) == ZERO_OK);
    ZT_CHECK(zero_engine_add_tensor(e, "x", 5, 0, 0, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_set_lr(e, -1.0f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_set_lr(e, INFINITY) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_set_lr(e, 0.01f) == ZERO_OK);
    ZT_CHECK(zero_engine_plan(e) == NULL);
    zero_engine_destroy(e);
    e = NULL;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_commit(e) == ZERO_ERROR_INVALID_STATE); /* nothing registered */
    ZT_CHECK(zero_engine_step(e, NULL) == ZERO_ERROR_INVALID_STATE);   /* broken now */
    zero_engine_destroy(e);
    zero_engine_destroy(NULL);
    zero_comm_destroy(comm);
    zero_local_group_destroy(grp);
    zero_device_destroy(dev);
}

/* Ranks that disagree: every rank returns an error from commit, never hangs. */
typedef struct mm {
    int variant;
    zero_result got[8];
} mm;

static zero_result mismatch_rank(int rank, zero_comm *comm, void *user)
{
    mm *m = (mm *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = zero_host_device_create(NULL, &dev);
    memset(&d, 0, sizeof d);
    d.stage = (m->variant == 2 && rank == 2) ? 2 : 3;
    d.device = dev;
    d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    if (!r) r = zero_engine_add_tensor(e, "a", 40, 0, 0, NULL);
    if (!r) {
        if (m->variant == 0) /* a different size on rank 1 */
            r = zero_engine_add_tensor(e, "b", rank == 1 ? 61 : 60, 1, 0, NULL);
        else if (m->variant == 1) /* a group id gap on rank 1: its plan does not commit */
            r = zero_engine_add_tensor(e, "b", 60, rank == 1 ? 2 : 1, 0, NULL);
        else if (m->variant == 3) /* a different weight-decay flag on rank 0 */
            r = zero_engine_add_tensor(e, "b", 60, 1, rank == 0 ? ZERO_TENSOR_NO_DECAY : 0, NULL);
        else
            r = zero_engine_add_tensor(e, "b", 60, 1, 0, NULL);
    }
    if (!r) {
        m->got[rank] = zero_engine_commit(e);
        /* the failed engine refuses work and destroys cleanly */
        if (m->got[rank] != ZERO_OK && zero_engine_step(e, NULL) != ZERO_ERROR_INVALID_STATE)
            r = ZERO_ERROR_INVALID_STATE;
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(mismatched_ranks_fail_at_commit)
{
    int v, rk;
    for (v = 0; v < 4; v++) {
        mm m;
        zero_result r;
        memset(&m, 0, sizeof m);
        m.variant = v;
        r = zero_local_run(3, mismatch_rank, &m);
        ZT_CHECKF(r == ZERO_OK, "variant %d: %s", v, zero_last_error());
        for (rk = 0; rk < 3; rk++) {
            zero_result want = (v == 1 && rk == 1) ? ZERO_ERROR_INVALID_ARGUMENT : ZERO_ERROR_MISMATCH;
            ZT_CHECKF(m.got[rk] == want, "variant %d rank %d: %s", v, rk,
                      zero_result_string(m.got[rk]));
        }
    }
}

/* A stage-3 group larger than max_live_numel: INVALID_ARGUMENT on every rank. The pool full
   of groups in use: INVALID_STATE, and the engine goes on. Buckets all held: INVALID_STATE. */
static zero_result pool_rank(int rank, zero_comm *comm, void *user)
{
    mm *m = (mm *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    void *p, *g;
    zero_result r = zero_host_device_create(NULL, &dev);
    int k;
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = dev;
    d.comm = comm;
    d.max_live_numel = m->variant == 0 ? 50 : 2 * 64;
    d.prefetch_depth = -1;
    if (!r) r = zero_engine_create(&d, &e);
    for (k = 0; k < 4 && !r; k++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", k);
        r = zero_engine_add_tensor(e, name, 60, k, 0, NULL);
    }
    if (r) goto out;
    m->got[rank] = zero_engine_commit(e);
    if (m->variant == 0 || m->got[rank]) goto out;
    /* 64-element groups (N=2, align 16), 2 slots */
    if ((r = zero_engine_gather(e, 0, &p)) || (r = zero_engine_gather(e, 1, &p))) goto out;
    m->got[4 + rank] = zero_engine_gather(e, 2, &p);
    if ((r = zero_engine_release(e, 0)) || (r = zero_engine_gather(e, 2, &p))) goto out;
    if ((r = zero_engine_release(e, 1)) || (r = zero_engine_release(e, 2))) goto out;
    /* 2 bucket slots: a third group's gradients before either is ready */
    if ((r = zero_engine_grads(e, 3, &g)) || (r = zero_engine_grads(e, 2, &g))) goto out;
    m->got[6 + rank] = zero_engine_grads(e, 1, &g);
out:
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(stage3_pool_limits)
{
    mm m;
    zero_result r;
    memset(&m, 0, sizeof m);
    m.variant = 0;
    r = zero_local_run(2, pool_rank, &m);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(m.got[0] == ZERO_ERROR_INVALID_ARGUMENT && m.got[1] == ZERO_ERROR_INVALID_ARGUMENT);
    memset(&m, 0, sizeof m);
    m.variant = 1;
    r = zero_local_run(2, pool_rank, &m);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(m.got[0] == ZERO_OK && m.got[1] == ZERO_OK);
    ZT_CHECK(m.got[4] == ZERO_ERROR_INVALID_STATE && m.got[5] == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(m.got[6] == ZERO_ERROR_INVALID_STATE && m.got[7] == ZERO_ERROR_INVALID_STATE);
}

/* A collective that fails half way (the n-th collective of every rank returns COMM): the
   call reports it, the engine refuses further work, destroy frees everything (ASan). */
ZT_TEST(failed_collective_leaves_engine_destroyable)
{
    int n, st;
    for (st = 0; st <= 3; st++)
        for (n = 0; n < 12; n++) {
            ec_cfg c;
            ec_result *r;
            ec_cfg_init(&c, st, 2, ZERO_F16, 2, 2);
            c.wrap_ops = &ec_wrap_ops;
            ec_wrap_reset(n);
            r = ec_run(&c);
            ZT_CHECKF(r->rc == ZERO_ERROR_COMM, "stage %d fail at %d: %s", st, n,
                      zero_result_string(r->rc));
            ZT_CHECKF(strstr(r->err, "injected") != NULL, "detail kept: %s", r->err);
            /* a failure inside group_start..group_end still closes the group (NCCL's is per
               thread and would otherwise launch its calls on freed buffers) */
            ZT_CHECKF(!ec_wrap_in_group[0] && !ec_wrap_in_group[1],
                      "stage %d fail at %d: a comm group was left open", st, n);
            ec_result_free(r);
        }
    ec_wrap_reset(-1);
}

int main(void)
{
    ZT_RUN(misuse_returns_errors_and_engine_stays_usable);
    ZT_RUN(bad_descriptors);
    ZT_RUN(mismatched_ranks_fail_at_commit);
    ZT_RUN(stage3_pool_limits);
    ZT_RUN(failed_collective_leaves_engine_destroyable);
    return zt_summary();
}
