/* zero_engine_allreduce: the user's values all-reduced through the engine's comm. Sums equal
   a rank-order reference computed here in the same dtype, bit for bit, on every rank; max
   equals the largest; at N = 1..4, fp32 and fp64, counts around the 64-byte chunk; the
   traffic goes to ZERO_COLL_USER and leaves the engine's payload counters (the paper's
   formulas) unchanged; a rank calling it where another calls an engine collective gets an
   error, not a hang; bad arguments change nothing. */
#include "zero.h"
#include "tests/zt.h"

#include <math.h>
#include <string.h>

#define MAXR 4
#define MAXN 40

typedef struct actx {
    int world;
    zero_dtype dt;
    int count;
    zero_op op;
    double got[MAXR][MAXN]; /* each rank's result, as double */
    zero_result r[MAXR];
    zero_traffic before[MAXR], after[MAXR];
    int variant; /* mismatch tests */
} actx;

/* rank r's value i: not exactly representable sums, so the order matters */
static double value(int rank, int i) { return 0.1 * (rank + 1) + 1.0 / (3.0 + i) + (rank % 2 ? 1e-9 : -1e5); }

static zero_result mk(zero_comm *comm, zero_device **dev, zero_engine **e)
{
    zero_engine_desc d;
    zero_result r = zero_host_device_create(NULL, dev);
    if (r) return r;
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = *dev;
    d.comm = comm;
    if ((r = zero_engine_create(&d, e))) return r;
    if ((r = zero_engine_add_tensor(*e, "w0", 100, 0, 0, NULL))) return r;
    if ((r = zero_engine_add_tensor(*e, "w1", 60, 1, 0, NULL))) return r;
    return zero_engine_commit(*e);
}

static zero_result reduce_rank(int rank, zero_comm *comm, void *user)
{
    actx *c = (actx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    float f[MAXN];
    double d[MAXN];
    int i;
    zero_result r = mk(comm, &dev, &e);
    for (i = 0; i < c->count; i++) f[i] = (float)value(rank, i), d[i] = value(rank, i);
    if (!r) r = zero_engine_traffic(e, NULL, &c->before[rank]);
    if (!r) r = zero_engine_allreduce(e, c->dt == ZERO_F32 ? (void *)f : (void *)d, (size_t)c->count, c->dt, c->op);
    if (!r) r = zero_engine_traffic(e, NULL, &c->after[rank]);
    for (i = 0; i < c->count; i++) c->got[rank][i] = c->dt == ZERO_F32 ? (double)f[i] : d[i];
    c->r[rank] = r;
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(sums_and_maxes_equal_the_rank_order_reference)
{
    static const int counts[] = {1, 3, 8, 15, 16, 17, 40};
    int w, t, k, o;
    for (w = 1; w <= MAXR; w++)
        for (t = 0; t < 2; t++)
            for (k = 0; k < (int)(sizeof counts / sizeof counts[0]); k++)
                for (o = 0; o < 2; o++) {
                    actx c;
                    int i, rk;
                    size_t es;
                    double chunks;
                    memset(&c, 0, sizeof c);
                    c.world = w, c.dt = t ? ZERO_F64 : ZERO_F32, c.count = counts[k];
                    c.op = o ? ZERO_OP_MAX : ZERO_OP_SUM;
                    ZT_CHECKF(zero_local_run(w, reduce_rank, &c) == ZERO_OK, "N %d: %s", w, zero_last_error());
                    for (i = 0; i < c.count; i++) {
                        double ref;
                        if (c.dt == ZERO_F32) {
                            float s = (float)value(0, i);
                            for (rk = 1; rk < w; rk++) {
                                float v = (float)value(rk, i);
                                s = o ? (v > s ? v : s) : s + v;
                            }
                            ref = s;
                        } else {
                            double s = value(0, i);
                            for (rk = 1; rk < w; rk++) s = o ? fmax(s, value(rk, i)) : s + value(rk, i);
                            ref = s;
                        }
                        for (rk = 0; rk < w; rk++)
                            ZT_CHECKF(c.got[rk][i] == ref, "N %d %s count %d op %d: rank %d value %d: %.17g vs %.17g", w,
                                      zero_dtype_name(c.dt), c.count, o, rk, i, c.got[rk][i], ref);
                    }
                    /* traffic: counted under USER only, one collective per 64 bytes */
                    es = zero_dtype_size(c.dt);
                    chunks = ceil((double)c.count * (double)es / 64.0);
                    for (rk = 0; rk < w; rk++) {
                        zero_traffic *a = &c.after[rk], *b = &c.before[rk];
                        ZT_CHECK(a->calls[ZERO_COLL_USER] - b->calls[ZERO_COLL_USER] == (uint64_t)chunks);
                        ZT_CHECK(fabs(a->numel[ZERO_COLL_USER] - b->numel[ZERO_COLL_USER] -
                                      2.0 * c.count * (w - 1) / (double)w) <= 1e-9 * c.count);
                        ZT_CHECK(zero_traffic_payload_numel(a) == zero_traffic_payload_numel(b));
                        ZT_CHECK(a->calls[ZERO_COLL_CONTROL] == b->calls[ZERO_COLL_CONTROL]);
                    }
                }
}

/* One micro-step (gather/release forward, gather/grads/release/ready backward) and a step;
   with_user: an allreduce between the micro-step and the step, and after the step. */
static zero_result train_rank(int rank, zero_comm *comm, void *user)
{
    actx *c = (actx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_result r = mk(comm, &dev, &e);
    double loss = rank + 0.5;
    void *p, *g;
    int k;
    for (k = 0; k < 2 && !r; k++) {
        r = zero_engine_gather(e, k, &p);
        if (!r) r = zero_engine_release(e, k);
    }
    for (k = 1; k >= 0 && !r; k--) {
        r = zero_engine_gather(e, k, &p);
        if (!r) r = zero_engine_grads(e, k, &g);
        if (!r) ((uint16_t *)g)[1] = zero_f32_to_f16(0.25f * (rank + 1));
        if (!r) r = zero_engine_release(e, k);
        if (!r) r = zero_engine_grads_ready(e, k);
    }
    if (!r && c->variant) r = zero_engine_allreduce(e, &loss, 1, ZERO_F64, ZERO_OP_SUM);
    if (!r) r = zero_engine_step(e, NULL);
    if (!r && c->variant) r = zero_engine_allreduce(e, &loss, 1, ZERO_F64, ZERO_OP_SUM);
    if (!r) r = zero_engine_traffic(e, &c->after[rank], NULL);
    c->got[rank][0] = loss;
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(the_engine_traffic_is_the_same_with_user_reductions)
{
    actx a, b;
    int k;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    b.variant = 1;
    ZT_CHECK(zero_local_run(3, train_rank, &a) == ZERO_OK);
    ZT_CHECKF(zero_local_run(3, train_rank, &b) == ZERO_OK, "%s", zero_last_error());
    for (k = 0; k < ZERO_COLL_USER; k++) {
        ZT_CHECKF(a.after[0].numel[k] == b.after[0].numel[k], "%s", zero_coll_name((zero_coll)k));
        ZT_CHECKF(a.after[0].calls[k] == b.after[0].calls[k], "%s", zero_coll_name((zero_coll)k));
    }
    /* the last step's window ends with its step(): the reduction after it is the next one's */
    ZT_CHECK(a.after[0].calls[ZERO_COLL_USER] == 0 && b.after[0].calls[ZERO_COLL_USER] == 1);
    ZT_CHECK(b.got[0][0] == (0.5 + 1.5 + 2.5) * 3 && b.got[2][0] == b.got[0][0]);
    ZT_CHECK(strcmp(zero_coll_name(ZERO_COLL_USER), "user") == 0);
    ZT_CHECK(strcmp(zero_comm_role_name(ZERO_ROLE_USER), "user") == 0);
}

/* variant 1: rank 0 all-reduces one float (max) where rank 1 steps (whose first collective is
   the inf/NaN flag: one float, max); variant 2: the ranks' counts differ. */
static zero_result mismatch_rank(int rank, zero_comm *comm, void *user)
{
    actx *c = (actx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_result r = mk(comm, &dev, &e);
    float v[2] = {1.0f, 2.0f};
    void *p, *g;
    int k;
    for (k = 0; k < 2 && !r; k++) {
        r = zero_engine_gather(e, k, &p);
        if (!r) r = zero_engine_release(e, k);
    }
    for (k = 1; k >= 0 && !r; k--) {
        r = zero_engine_gather(e, k, &p);
        if (!r) r = zero_engine_grads(e, k, &g);
        if (!r) r = zero_engine_release(e, k);
        if (!r) r = zero_engine_grads_ready(e, k);
    }
    if (!r) {
        if (c->variant == 1) r = rank == 0 ? zero_engine_allreduce(e, v, 1, ZERO_F32, ZERO_OP_MAX) : zero_engine_step(e, NULL);
        else r = zero_engine_allreduce(e, v, rank == 0 ? 1 : 2, ZERO_F32, ZERO_OP_SUM);
    }
    c->r[rank] = r;
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(a_mismatch_with_an_engine_collective_is_an_error_not_a_hang)
{
    int v;
    for (v = 1; v <= 2; v++) {
        actx c;
        zero_local_desc d;
        double t0 = zt_now_ms();
        memset(&c, 0, sizeof c);
        memset(&d, 0, sizeof d);
        c.variant = v;
        d.world = 2;
        d.timeout_ms = 20000;
        ZT_CHECK(zero_local_run_desc(&d, mismatch_rank, &c) != ZERO_OK);
        ZT_CHECKF(c.r[0] == ZERO_ERROR_MISMATCH && c.r[1] == ZERO_ERROR_MISMATCH, "variant %d: %s / %s", v,
                  zero_result_string(c.r[0]), zero_result_string(c.r[1]));
        ZT_CHECKF(zt_now_ms() - t0 < 10000, "variant %d took %.0f ms (no timeout wait)", v, zt_now_ms() - t0);
    }
}

/* Ranks that pass different counts, dtypes or ops: every rank gets ZERO_ERROR_MISMATCH at
   once and no rank's buffer changes. The counts sit at every boundary of the 64-byte pieces
   (the old code summed one rank's extra piece into a peer's next call and returned OK). */
typedef struct dctx {
    int world;
    size_t count[MAXR];
    zero_dtype dt[MAXR];
    zero_op op[MAXR];
    zero_result r[MAXR], next[MAXR];
    int changed[MAXR];
    char msg[MAXR][512];
} dctx;

static zero_result differ_rank(int rank, zero_comm *comm, void *user)
{
    dctx *c = (dctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    double d[MAXN], d0[MAXN];
    float f[MAXN], f0[MAXN];
    int i;
    zero_result r = mk(comm, &dev, &e);
    for (i = 0; i < MAXN; i++) f0[i] = f[i] = (float)value(rank, i), d0[i] = d[i] = value(rank, i);
    if (!r) {
        r = zero_engine_allreduce(e, c->dt[rank] == ZERO_F32 ? (void *)f : (void *)d, c->count[rank],
                                  c->dt[rank], c->op[rank]);
        snprintf(c->msg[rank], sizeof c->msg[rank], "%s", zero_last_error());
        c->r[rank] = r;
        /* a second call (equal on every rank) cannot receive a left-over piece of the first */
        c->next[rank] = zero_engine_allreduce(e, d, 1, ZERO_F64, ZERO_OP_SUM);
        c->changed[rank] = memcmp(f, f0, sizeof f) != 0 || memcmp(d, d0, sizeof d) != 0;
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

static void differ_case(dctx *c, const char *what)
{
    zero_local_desc d;
    double t0 = zt_now_ms();
    int rk;
    memset(&d, 0, sizeof d);
    d.world = c->world;
    d.timeout_ms = 20000;
    (void)zero_local_run_desc(&d, differ_rank, c);
    for (rk = 0; rk < c->world; rk++) {
        ZT_CHECKF(c->r[rk] == ZERO_ERROR_MISMATCH, "%s: rank %d got %s (%s)", what, rk,
                  zero_result_string(c->r[rk]), c->msg[rk]);
        ZT_CHECKF(!c->changed[rk], "%s: rank %d's values changed", what, rk);
        ZT_CHECKF(c->next[rk] != ZERO_OK, "%s: rank %d: the engine is broken after a mismatch", what, rk);
    }
    ZT_CHECKF(zt_now_ms() - t0 < 10000, "%s took %.0f ms (no timeout wait)", what, zt_now_ms() - t0);
}

ZT_TEST(different_counts_dtypes_or_ops_are_a_mismatch_on_every_rank)
{
    int t, i, j, w;
    char what[128];
    for (t = 0; t < 2; t++) {
        zero_dtype dt = t ? ZERO_F64 : ZERO_F32;
        size_t per = 64 / zero_dtype_size(dt);
        size_t counts[9];
        counts[0] = 0, counts[1] = 1, counts[2] = per - 1, counts[3] = per, counts[4] = per + 1;
        counts[5] = 2 * per - 1, counts[6] = 2 * per, counts[7] = 2 * per + 1, counts[8] = MAXN;
        for (i = 0; i < 9; i++)
            for (j = 0; j < 9; j++) {
                dctx c;
                if (counts[i] == counts[j]) continue;
                for (w = 2; w <= 3; w++) {
                    int rk;
                    memset(&c, 0, sizeof c);
                    c.world = w;
                    for (rk = 0; rk < w; rk++) c.dt[rk] = dt, c.op[rk] = ZERO_OP_SUM, c.count[rk] = counts[i];
                    c.count[w - 1] = counts[j]; /* the last rank differs */
                    snprintf(what, sizeof what, "N %d %s counts %zu / %zu", w, zero_dtype_name(dt), counts[i],
                             counts[j]);
                    differ_case(&c, what);
                }
            }
    }
    for (i = 0; i < 9; i++) { /* same count, different dtype or op */
        static const size_t counts[] = {0, 1, 7, 8, 9, 15, 16, 17, MAXN};
        dctx c;
        memset(&c, 0, sizeof c);
        c.world = 2;
        c.count[0] = c.count[1] = counts[i];
        c.dt[0] = ZERO_F32, c.dt[1] = ZERO_F64;
        snprintf(what, sizeof what, "count %zu f32 / f64", counts[i]);
        differ_case(&c, what);
        memset(&c, 0, sizeof c);
        c.world = 2;
        c.count[0] = c.count[1] = counts[i];
        c.dt[0] = c.dt[1] = ZERO_F64;
        c.op[0] = ZERO_OP_SUM, c.op[1] = ZERO_OP_MAX;
        snprintf(what, sizeof what, "count %zu sum / max", counts[i]);
        differ_case(&c, what);
    }
}

static zero_result args_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    float v = 1.0f;
    uint16_t h = 0;
    zero_result r = zero_host_device_create(NULL, &dev), *got = (zero_result *)user + 8 * rank;
    memset(&d, 0, sizeof d);
    d.device = dev;
    d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    if (!r) r = zero_engine_add_tensor(e, "w", 10, 0, 0, NULL);
    got[0] = zero_engine_allreduce(e, &v, 1, ZERO_F32, ZERO_OP_SUM); /* before commit */
    if (!r) r = zero_engine_commit(e);
    got[1] = zero_engine_allreduce(e, NULL, 1, ZERO_F32, ZERO_OP_SUM);
    got[2] = zero_engine_allreduce(e, &h, 1, ZERO_F16, ZERO_OP_SUM);
    got[3] = zero_engine_allreduce(e, &v, 1, ZERO_F32, (zero_op)7);
    got[4] = zero_engine_allreduce(NULL, &v, 1, ZERO_F32, ZERO_OP_SUM);
    got[5] = zero_engine_allreduce(e, NULL, 0, ZERO_F32, ZERO_OP_SUM); /* nothing to do */
    got[6] = zero_engine_allreduce(e, &v, 1, ZERO_F32, ZERO_OP_SUM);   /* still usable */
    if (got[6] == ZERO_OK && v != 2.0f) got[6] = ZERO_ERROR_MISMATCH;
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(bad_arguments_are_errors_and_the_engine_stays_usable)
{
    zero_result got[16];
    int rk;
    memset(got, 0, sizeof got);
    ZT_CHECK(zero_local_run(2, args_rank, got) == ZERO_OK);
    for (rk = 0; rk < 2; rk++) {
        zero_result *g = got + 8 * rk;
        ZT_CHECK(g[0] == ZERO_ERROR_INVALID_STATE);
        ZT_CHECK(g[1] == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(g[2] == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(g[3] == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(g[4] == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(g[5] == ZERO_OK);
        ZT_CHECKF(g[6] == ZERO_OK, "%s", zero_result_string(g[6]));
    }
}

int main(void)
{
    ZT_RUN(sums_and_maxes_equal_the_rank_order_reference);
    ZT_RUN(the_engine_traffic_is_the_same_with_user_reductions);
    ZT_RUN(a_mismatch_with_an_engine_collective_is_an_error_not_a_hang);
    ZT_RUN(different_counts_dtypes_or_ops_are_a_mismatch_on_every_rank);
    ZT_RUN(bad_arguments_are_errors_and_the_engine_stays_usable);
    return zt_summary();
}
