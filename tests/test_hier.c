/* test_hier.c - beyond one node (issue 26): the topology (zero_engine_desc.ranks_per_node:
   explicit, from the launcher's environment, refused when it does not divide the world,
   MISMATCH when ranks disagree), sub-communicators (zero_comm_split on the local comm: the
   groups, their ranks by key, reductions in their own rank order bit for bit against a
   reference, nested splits, color < 0, a comm without split), and the traffic counters
   split into intra- and inter-node bytes: on every rank and step equal to the attribution
   of docs/engine.md computed from the flat totals, the totals unchanged by the topology,
   and the state bits unchanged, at N = 4 and 8 with R = 2 and 4, stages 0-3. */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup, mkdtemp */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h> /* rmdir */

/* ---- zero_comm_split on the local comm ---------------------------------------------------- */

typedef struct sp_ctx {
    int world, R;
    int bad[EC_MAX_RANKS];
    char why[EC_MAX_RANKS][160];
} sp_ctx;

#define SP_BAD(ctx, rank, ...)                                                              \
    do {                                                                                     \
        if (!(ctx)->bad[rank]) snprintf((ctx)->why[rank], sizeof (ctx)->why[rank], __VA_ARGS__); \
        (ctx)->bad[rank] = 1;                                                                \
    } while (0)

static float sp_value(int rank, size_t i) { return (float)(0.1 + 0.37 * rank + 1e-3 * (double)i) / 3.0f; }

static zero_result sp_rank(int rank, zero_comm *comm, void *user)
{
    sp_ctx *ctx = (sp_ctx *)user;
    zero_comm *node = NULL, *cross = NULL, *rev = NULL, *none = NULL, *sub2 = NULL;
    zero_result r;
    int R = ctx->R, N = ctx->world, q;
    float in[5], out[5];
    size_t i;
    /* intra-node groups: ranks [k R, (k + 1) R), ranked by their rank */
    r = zero_comm_split(comm, rank / R, rank, &node);
    if (r != ZERO_OK) return r;
    if (!node || node->world != R || node->rank != rank % R)
        SP_BAD(ctx, rank, "node comm: world %d rank %d", node ? node->world : -1, node ? node->rank : -1);
    /* cross-node groups: ranks with the same place in their node, ranked by node */
    r = zero_comm_split(comm, rank % R, rank / R, &cross);
    if (r != ZERO_OK) return r;
    if (!cross || cross->world != N / R || cross->rank != rank / R)
        SP_BAD(ctx, rank, "cross comm: world %d rank %d", cross ? cross->world : -1,
               cross ? cross->rank : -1);
    /* keys reverse the order: rank 0 of the new comm is the highest parent rank */
    r = zero_comm_split(comm, 0, N - rank, &rev);
    if (r != ZERO_OK) return r;
    if (!rev || rev->world != N || rev->rank != N - 1 - rank)
        SP_BAD(ctx, rank, "reversed comm: rank %d", rev ? rev->rank : -1);
    /* color < 0 on odd ranks: no comm there */
    r = zero_comm_split(comm, rank % 2 ? -1 : 7, 0, &none);
    if (r != ZERO_OK) return r;
    if ((rank % 2) != (none == NULL)) SP_BAD(ctx, rank, "color < 0 gave a comm (or 7 none)");
    /* sums in the child's rank order (reference: the same order, fp32, one rounding) */
    for (i = 0; i < 5; i++) in[i] = sp_value(rank, i);
    r = rev->ops->all_reduce(rev, in, out, 5, ZERO_F32, ZERO_OP_SUM, NULL);
    if (r != ZERO_OK) return r;
    for (i = 0; i < 5; i++) {
        float acc = sp_value(N - 1, i);
        for (q = N - 2; q >= 0; q--) acc += sp_value(q, i);
        if (memcmp(&acc, &out[i], 4)) SP_BAD(ctx, rank, "reversed sum element %zu", i);
    }
    r = node->ops->all_reduce(node, in, out, 5, ZERO_F32, ZERO_OP_SUM, NULL);
    if (r != ZERO_OK) return r;
    for (i = 0; i < 5; i++) {
        int b = rank / R * R;
        float acc = sp_value(b, i);
        for (q = b + 1; q < b + R; q++) acc += sp_value(q, i);
        if (memcmp(&acc, &out[i], 4)) SP_BAD(ctx, rank, "node sum element %zu", i);
    }
    /* a split of a split, then the parent destroyed before the child */
    r = zero_comm_split(node, node->rank % 2, 0, &sub2);
    if (r != ZERO_OK) return r;
    if (!sub2 || sub2->world != (R + 1 - node->rank % 2) / 2)
        SP_BAD(ctx, rank, "nested comm world %d", sub2 ? sub2->world : -1);
    zero_comm_destroy(node);
    r = sub2->ops->all_gather(sub2, in, out, 1, ZERO_F32, NULL);
    if (r != ZERO_OK) return r;
    if (memcmp(&out[sub2->rank], &in[0], 4)) SP_BAD(ctx, rank, "nested all_gather");
    r = cross->ops->barrier(cross);
    zero_comm_destroy(sub2);
    zero_comm_destroy(cross);
    zero_comm_destroy(rev);
    zero_comm_destroy(none);
    return r;
}

ZT_TEST(split_local)
{
    static const int cases[][2] = {{4, 2}, {8, 2}, {8, 4}, {4, 4}, {4, 1}};
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sp_ctx ctx;
        zero_result r;
        int q;
        memset(&ctx, 0, sizeof ctx);
        ctx.world = cases[k][0];
        ctx.R = cases[k][1];
        r = zero_local_run(ctx.world, sp_rank, &ctx);
        ZT_CHECKF(r == ZERO_OK, "N=%d R=%d: %s", ctx.world, ctx.R, zero_last_error());
        for (q = 0; q < ctx.world; q++)
            ZT_CHECKF(!ctx.bad[q], "N=%d R=%d rank %d: %s", ctx.world, ctx.R, q, ctx.why[q]);
    }
}

/* A comm whose backend has no split: zero_comm_split says UNSUPPORTED naming it. */
static zero_result sp_none_rank(int rank, zero_comm *comm, void *user)
{
    zero_comm_ops ops = *comm->ops;
    zero_comm wrapped = *comm;
    zero_comm *out = (zero_comm *)&ops; /* must be set to NULL */
    zero_result r;
    (void)rank;
    ops.split = NULL;
    ops.name = "nosplit";
    wrapped.ops = &ops;
    r = zero_comm_split(&wrapped, 0, 0, &out);
    *(int *)user += r == ZERO_ERROR_UNSUPPORTED && out == NULL &&
                    strstr(zero_last_error(), "nosplit") != NULL;
    return ZERO_OK;
}

ZT_TEST(split_unsupported)
{
    int ok = 0;
    ZT_CHECK(zero_local_run(1, sp_none_rank, &ok) == ZERO_OK);
    ZT_CHECK(ok == 1);
    ZT_CHECK(zero_comm_split(NULL, 0, 0, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
}

/* ---- ranks_per_node ---------------------------------------------------------------------- */

typedef struct rpn_ctx {
    int rpn;          /* the descriptor's value */
    zero_result got;  /* rank 0's create result */
    int resolved;     /* rank 0's resolved value */
} rpn_ctx;

static zero_result rpn_rank(int rank, zero_comm *comm, void *user)
{
    rpn_ctx *c = (rpn_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d, got;
    zero_result r = zero_host_device_create(NULL, &dev);
    if (r != ZERO_OK) return r;
    memset(&d, 0, sizeof d);
    d.stage = 2;
    d.device = dev;
    d.comm = comm;
    d.ranks_per_node = c->rpn;
    r = zero_engine_create(&d, &e);
    if (rank == 0) {
        c->got = r;
        if (r == ZERO_OK && zero_engine_get_desc(e, &got) == ZERO_OK) c->resolved = got.ranks_per_node;
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

static int rpn_resolve(int world, int rpn, zero_result *res)
{
    rpn_ctx c;
    memset(&c, 0, sizeof c);
    c.rpn = rpn;
    c.resolved = -1;
    if (zero_local_run(world, rpn_rank, &c) != ZERO_OK) return -2;
    *res = c.got;
    return c.resolved;
}

ZT_TEST(ranks_per_node_resolve)
{
    zero_result r;
    static const char *const vars[3] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                        "SLURM_NTASKS_PER_NODE"};
    char *saved[3];
    int i;
    for (i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        saved[i] = v ? strdup(v) : NULL;
        unsetenv(vars[i]);
    }
    ZT_CHECK(rpn_resolve(4, 0, &r) == 4 && r == ZERO_OK); /* none set: one node */
    ZT_CHECK(rpn_resolve(4, 2, &r) == 2 && r == ZERO_OK);
    ZT_CHECK(rpn_resolve(8, 4, &r) == 4 && r == ZERO_OK);
    ZT_CHECK(rpn_resolve(4, 3, &r) == -1 && r == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(rpn_resolve(4, 8, &r) == -1 && r == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(rpn_resolve(4, -1, &r) == -1 && r == ZERO_ERROR_INVALID_ARGUMENT);
    /* the launcher's environment, in its order of precedence */
    setenv("SLURM_NTASKS_PER_NODE", "2(x2)", 1);
    ZT_CHECK(rpn_resolve(4, 0, &r) == 2);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
    ZT_CHECK(rpn_resolve(4, 0, &r) == 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    ZT_CHECK(rpn_resolve(8, 0, &r) == 4);
    ZT_CHECK(rpn_resolve(8, 2, &r) == 2); /* explicit wins */
    setenv("LOCAL_WORLD_SIZE", "3", 1);  /* does not divide 8: the world is one node */
    ZT_CHECK(rpn_resolve(8, 0, &r) == 8);
    setenv("LOCAL_WORLD_SIZE", "16", 1); /* more than the world */
    ZT_CHECK(rpn_resolve(8, 0, &r) == 8);
    for (i = 0; i < 3; i++) {
        if (saved[i]) setenv(vars[i], saved[i], 1);
        else unsetenv(vars[i]);
        free(saved[i]);
    }
}

ZT_TEST(ranks_per_node_mismatch)
{
    ec_cfg c;
    ec_result *res;
    ec_cfg_init(&c, 1, 4, ZERO_F32, 1, 1);
    c.ranks_per_node = 2;
    c.rpn_rank[3] = 4; /* rank 3 thinks the world is one node */
    res = ec_run(&c);
    ZT_CHECKF(res->rc == ZERO_ERROR_MISMATCH, "%s", res->err);
    ZT_CHECKF(strstr(res->err, "ranks_per_node") != NULL, "%s", res->err);
    ec_result_free(res);
}

/* ---- traffic split ----------------------------------------------------------------------- */

/* The estimator's traffic per step (zero_estimate.step_*) for the run's Psi (its plan's
   padded numel) against rank 0's measured payload of the last step. */
static void est_check(const ec_cfg *c, const ec_result *res, int S, int R)
{
    zero_estimate_desc d;
    zero_estimate e;
    const zero_traffic *t = &res->traffic_last[0][c->steps - 1];
    double b = 0, in = 0, out = 0;
    int k;
    memset(&d, 0, sizeof d);
    d.params = res->plan_total;
    d.ranks = c->world;
    d.stage = c->stage;
    d.param_bytes = (int)zero_dtype_size(c->dtype);
    d.grad_bytes = (int)zero_dtype_size(c->comm_dtype ? c->comm_dtype : c->dtype);
    d.ranks_per_node = R;
    d.mics_shard_size = S;
    d.accum_steps = c->accum;
    ZT_CHECKF(zero_estimate_compute(&d, &e) == ZERO_OK, "%s", zero_last_error());
    for (k = 0; k < ZERO_COLL_CONTROL; k++) {
        b += t->bytes[k];
        in += t->intra_bytes[k];
        out += t->inter_bytes[k];
    }
    ZT_CHECKF(fabs(e.step_bytes - b) <= 1e-9 * b + 1e-6 && fabs(e.step_intra_bytes - in) <= 1e-9 * b + 1e-6 &&
                  fabs(e.step_inter_bytes - out) <= 1e-9 * b + 1e-6,
              "N=%d S=%d R=%d stage %d: estimator %.17g / %.17g / %.17g, measured %.17g / %.17g / %.17g",
              c->world, S, R, c->stage, e.step_bytes, e.step_intra_bytes, e.step_inter_bytes, b, in, out);
}

/* Relative closeness for sums of doubles that round differently (2 T / N is not always an
   integer, so the split's sum may differ from the total in the last bits). */
static int close_rel(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(b) + 1.0); }

ZT_TEST(traffic_split_flat)
{
    static const int cases[][2] = {{4, 2}, {8, 2}, {8, 4}, {4, 1}};
    size_t k;
    int stage;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (stage = 0; stage <= 3; stage++) {
            int N = cases[k][0], R = cases[k][1], rk, s, kind;
            ec_cfg c;
            ec_result *flat, *hier;
            char why[160];
            ec_cfg_init(&c, stage, N, ZERO_BF16, 2, 3);
            c.comm_dtype = ZERO_F32;
            flat = ec_run(&c);
            c.ranks_per_node = R;
            hier = ec_run(&c);
            ZT_CHECKF(flat->rc == ZERO_OK && hier->rc == ZERO_OK, "%s %s", flat->err, hier->err);
            ZT_CHECKF(ec_same_state(&c, flat, hier, why, sizeof why), "N=%d R=%d stage %d: %s", N, R,
                      stage, why);
            for (rk = 0; rk < N; rk++)
                for (s = 0; s < c.steps; s++)
                    for (kind = 0; kind < ZERO_COLL_COUNT; kind++) {
                        const zero_traffic *f = &flat->traffic_last[rk][s], *h = &hier->traffic_last[rk][s];
                        double b = f->bytes[kind];
                        /* totals: the same numbers as the flat run */
                        ZT_CHECK(h->calls[kind] == f->calls[kind] && h->bytes[kind] == b &&
                                 h->numel[kind] == f->numel[kind]);
                        /* flat: everything on one node */
                        ZT_CHECK(f->intra_bytes[kind] == b && f->inter_bytes[kind] == 0.0);
                        /* R - 1 of the N - 1 peers share the node */
                        ZT_CHECKF(close_rel(h->intra_bytes[kind], b * (R - 1) / (N - 1)) &&
                                      close_rel(h->inter_bytes[kind], b * (N - R) / (N - 1)),
                                  "N=%d R=%d stage %d rank %d step %d %s: intra %.17g inter %.17g "
                                  "of %.17g", N, R, stage, rk, s, zero_coll_name((zero_coll)kind),
                                  h->intra_bytes[kind], h->inter_bytes[kind], b);
                    }
            /* the paper's per-step payload between nodes at stage 1-2 (no accumulation
               effects on the count: each micro-step reduces), by formula from the plan */
            if (stage == 1 || stage == 2) {
                const zero_traffic *h = &hier->traffic_last[N - 1][c.steps - 1];
                double P = (double)hier->plan_total;
                double rs = c.accum * P * (N - R) / N * 4.0; /* f32 gradients */
                double ag = P * (N - R) / N * 2.0;           /* bf16 params   */
                ZT_CHECKF(close_rel(h->inter_bytes[ZERO_COLL_REDUCE_SCATTER], rs) &&
                              close_rel(h->inter_bytes[ZERO_COLL_ALL_GATHER], ag),
                          "N=%d R=%d stage %d: inter rs %.17g (formula %.17g) ag %.17g (%.17g)", N,
                          R, stage, h->inter_bytes[ZERO_COLL_REDUCE_SCATTER], rs,
                          h->inter_bytes[ZERO_COLL_ALL_GATHER], ag);
            }
            if (hier->rc == ZERO_OK) est_check(&c, hier, 0, R);
            ec_result_free(flat);
            ec_result_free(hier);
        }
}

/* ---- MiCS (mics_shard_size) ---------------------------------------------------------------- */

/* The MiCS cases: (N, S, R). */
static const int mics_cases[][3] = {{4, 2, 2}, {4, 2, 1}, {8, 2, 4}, {8, 4, 2}, {8, 4, 4}, {8, 2, 2}};
#define MICS_NCASES ((int)(sizeof mics_cases / sizeof mics_cases[0]))

static void mics_cfg(ec_cfg *c, int stage, int N, int S, int R, zero_dtype dt, int accum, int steps)
{
    ec_cfg_init(c, stage, N, dt, accum, steps);
    c->mics = S;
    c->ranks_per_node = R;
    c->lr = 1e-2f;
}

/* Stages 1-3 are bit-identical to each other at the same (N, S); replicas hold the same
   params (params_agree). */
ZT_TEST(mics_stages_identical)
{
    int k, st;
    for (k = 0; k < MICS_NCASES; k++) {
        ec_cfg c;
        ec_result *ref = NULL;
        for (st = 1; st <= 3; st++) {
            ec_result *res;
            char why[160];
            mics_cfg(&c, st, mics_cases[k][0], mics_cases[k][1], mics_cases[k][2], ZERO_BF16, 2, 3);
            c.comm_dtype = k % 2 ? ZERO_F32 : ZERO_DTYPE_DEFAULT;
            res = ec_run(&c);
            ZT_CHECKF(res->rc == ZERO_OK, "case %d stage %d: %s", k, st, res->err);
            ZT_CHECKF(res->params_agree, "case %d stage %d: replicas hold different params", k, st);
            if (!ref) {
                ref = res;
                continue;
            }
            ZT_CHECKF(ec_same_state(&c, ref, res, why, sizeof why), "N=%d S=%d R=%d stage %d vs 1: %s",
                      mics_cases[k][0], mics_cases[k][1], mics_cases[k][2], st, why);
            ec_result_free(res);
        }
        ec_result_free(ref);
    }
}

/* The reference: a flat run whose comm sums each reduce-scatter in MiCS's documented order
   (inside each group of S consecutive ranks in rank order, fp32, rounded to the dtype; then
   over the groups in order, fp32, rounded), written here from the all-gathered inputs. */
static int hr_S;

static zero_comm *hr_inner(zero_comm *c) { return ((ec_wrap *)c->impl)->inner; }
static void hr_destroy(zero_comm *c) { (void)c; }
static zero_result hr_ag(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, void *q)
{
    return hr_inner(c)->ops->all_gather(hr_inner(c), s, r, n, d, q);
}
static zero_result hr_ar(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, zero_op op, void *q)
{
    return hr_inner(c)->ops->all_reduce(hr_inner(c), s, r, n, d, op, q);
}
static zero_result hr_bc(zero_comm *c, void *b, size_t n, zero_dtype d, int root, void *q)
{
    return hr_inner(c)->ops->broadcast(hr_inner(c), b, n, d, root, q);
}
static zero_result hr_barrier(zero_comm *c) { return hr_inner(c)->ops->barrier(hr_inner(c)); }
static float hr_load(const unsigned char *p, zero_dtype d, size_t i)
{
    float x;
    zero_convert(&x, ZERO_F32, p + i * zero_dtype_size(d), d, 1, ZERO_SIMD_PORTABLE);
    return x;
}
static float hr_round(float x, zero_dtype d)
{
    unsigned char b[4];
    float y;
    zero_convert(b, d, &x, ZERO_F32, 1, ZERO_SIMD_PORTABLE);
    zero_convert(&y, ZERO_F32, b, d, 1, ZERO_SIMD_PORTABLE);
    return y;
}
static zero_result hr_rs(zero_comm *c, const void *send, void *recv, size_t n, zero_dtype d,
                         zero_op op, void *q)
{
    zero_comm *in = hr_inner(c);
    int N = in->world, S = hr_S, j, k;
    size_t es = zero_dtype_size(d), i, whole = (size_t)N * n;
    unsigned char *all = (unsigned char *)malloc(whole * (size_t)N * es + 1);
    zero_result r;
    if (!all || op != ZERO_OP_SUM) {
        free(all);
        return ZERO_ERROR_OUT_OF_MEMORY;
    }
    r = in->ops->all_gather(in, send, all, whole, d, q); /* every rank's whole input */
    for (i = 0; i < n && r == ZERO_OK; i++) {
        size_t at = (size_t)in->rank * n + i;
        float total = 0.0f;
        for (j = 0; j < N / S; j++) {
            float acc = hr_load(all + (size_t)(j * S) * whole * es, d, at), part;
            for (k = j * S + 1; k < (j + 1) * S; k++) acc += hr_load(all + (size_t)k * whole * es, d, at);
            part = hr_round(acc, d);
            total = j == 0 ? part : total + part;
        }
        total = hr_round(total, d);
        zero_convert((unsigned char *)recv + i * es, d, &total, ZERO_F32, 1, ZERO_SIMD_PORTABLE);
    }
    free(all);
    return r;
}
static zero_comm_ops hr_ops = {"mics-reference", hr_destroy, hr_ag, hr_rs, hr_ar, hr_bc, hr_barrier,
                               NULL, NULL, NULL, NULL};

ZT_TEST(mics_equals_reference)
{
    static const zero_dtype dts[] = {ZERO_F32, ZERO_BF16, ZERO_F16};
    int k, st, d;
    for (k = 0; k < MICS_NCASES; k++)
        for (d = 0; d < 3; d++)
            for (st = 1; st <= 3; st += 2) {
                ec_cfg c, f;
                ec_result *got, *ref;
                char why[160];
                mics_cfg(&c, st, mics_cases[k][0], mics_cases[k][1], mics_cases[k][2], dts[d], 1, 3);
                got = ec_run(&c);
                f = c;
                f.mics = 0;
                f.stage = 2;
                f.wrap_ops = &hr_ops;
                hr_S = c.mics;
                ref = ec_run(&f);
                ZT_CHECKF(got->rc == ZERO_OK && ref->rc == ZERO_OK, "%s / %s", got->err, ref->err);
                ZT_CHECKF(ec_same_state(&c, ref, got, why, sizeof why),
                          "N=%d S=%d R=%d %s stage %d vs the reference: %s", c.world, c.mics,
                          c.ranks_per_node, zero_dtype_name(dts[d]), st, why);
                ec_result_free(got);
                ec_result_free(ref);
            }
}

/* Memory per rank: exactly the flat run's at N = S, every category, now and at peak, on
   the device and (offload cpu) the host tier. */
ZT_TEST(mics_memory_is_flat_at_S)
{
    int k, st, off;
    for (k = 0; k < MICS_NCASES; k++)
        for (st = 1; st <= 3; st++)
            for (off = 0; off <= 1; off++) {
                int N = mics_cases[k][0], S = mics_cases[k][1], rk;
                ec_cfg c, f;
                ec_result *got, *ref;
                mics_cfg(&c, st, N, S, mics_cases[k][2], ZERO_BF16, 2, 1);
                if (off) c.offload_opt = ZERO_OFFLOAD_CPU;
                f = c;
                f.mics = 0;
                f.world = S;
                f.ranks_per_node = 0;
                got = ec_run(&c);
                ref = ec_run(&f);
                ZT_CHECKF(got->rc == ZERO_OK && ref->rc == ZERO_OK, "%s / %s", got->err, ref->err);
                for (rk = 0; rk < N && got->rc == ZERO_OK && ref->rc == ZERO_OK; rk++) {
                    ZT_CHECKF(memcmp(&got->mem[rk], &ref->mem[rk % S], sizeof got->mem[rk]) == 0,
                              "N=%d S=%d stage %d offload %d rank %d: device %zu bytes vs flat at S %zu",
                              N, S, st, off, rk, got->mem[rk].total_bytes, ref->mem[rk % S].total_bytes);
                    ZT_CHECKF(memcmp(&got->host_mem[rk], &ref->host_mem[rk % S], sizeof got->host_mem[rk]) == 0,
                              "N=%d S=%d stage %d offload %d rank %d: host %zu vs %zu", N, S, st, off, rk,
                              got->host_mem[rk].total_bytes, ref->host_mem[rk % S].total_bytes);
                }
                ec_result_free(got);
                ec_result_free(ref);
            }
}

/* Peers of rank on its node among count ranks first + i stride (nodes of R). */
static int peers_on_node(int rank, int R, int first, int stride, int count)
{
    int i, n = 0;
    for (i = 0; i < count; i++) {
        int q = first + i * stride;
        if (q != rank && q / R == rank / R) n++;
    }
    return n;
}

/* Traffic per step on every rank = the MiCS formulas: inside the group A P (S-1)/S
   reduce-scattered (comm dtype) and P (S-1)/S all-gathered (stage 1-2; stage 3: 2 A per
   micro-step), across the replicas one all-reduce of the P / S shard: 2 (P/S) (G-1)/G,
   G = N / S; each split by the peers on the node. */
ZT_TEST(mics_traffic_formulas)
{
    int k, st;
    for (k = 0; k < MICS_NCASES; k++)
        for (st = 1; st <= 3; st++) {
            int N = mics_cases[k][0], S = mics_cases[k][1], R = mics_cases[k][2], G = N / S, rk, s;
            ec_cfg c;
            ec_result *got;
            double P, cs = 4.0, ps = 2.0, A = 2.0;
            mics_cfg(&c, st, N, S, R, ZERO_BF16, 2, 2);
            c.comm_dtype = ZERO_F32;
            got = ec_run(&c);
            ZT_CHECKF(got->rc == ZERO_OK, "%s", got->err);
            if (got->rc != ZERO_OK) {
                ec_result_free(got);
                continue;
            }
            P = (double)got->plan_total;
            for (rk = 0; rk < N; rk++)
                for (s = 0; s < c.steps; s++) {
                    const zero_traffic *t = &got->traffic_last[rk][s];
                    int ss = peers_on_node(rk, R, rk / S * S, 1, S);
                    int rs_ = peers_on_node(rk, R, rk % S, S, G);
                    double ag_units = st == 3 ? 2.0 * A : 1.0; /* P / S per unit */
                    double rs_b = A * P / S * cs, ag_b = ag_units * P / S * ps, ar_u = 2.0 * P / S / G * cs;
                    ZT_CHECKF(close_rel(t->bytes[ZERO_COLL_REDUCE_SCATTER], rs_b * (S - 1)) &&
                                  close_rel(t->intra_bytes[ZERO_COLL_REDUCE_SCATTER], rs_b * ss) &&
                                  close_rel(t->inter_bytes[ZERO_COLL_REDUCE_SCATTER], rs_b * (S - 1 - ss)),
                              "N=%d S=%d R=%d stage %d rank %d step %d: reduce-scatter %.17g / %.17g / %.17g",
                              N, S, R, st, rk, s, t->bytes[ZERO_COLL_REDUCE_SCATTER],
                              t->intra_bytes[ZERO_COLL_REDUCE_SCATTER], t->inter_bytes[ZERO_COLL_REDUCE_SCATTER]);
                    ZT_CHECKF(close_rel(t->bytes[ZERO_COLL_ALL_GATHER], ag_b * (S - 1)) &&
                                  close_rel(t->intra_bytes[ZERO_COLL_ALL_GATHER], ag_b * ss) &&
                                  close_rel(t->inter_bytes[ZERO_COLL_ALL_GATHER], ag_b * (S - 1 - ss)),
                              "N=%d S=%d R=%d stage %d rank %d step %d: all-gather %.17g / %.17g / %.17g",
                              N, S, R, st, rk, s, t->bytes[ZERO_COLL_ALL_GATHER],
                              t->intra_bytes[ZERO_COLL_ALL_GATHER], t->inter_bytes[ZERO_COLL_ALL_GATHER]);
                    ZT_CHECKF(close_rel(t->bytes[ZERO_COLL_ALL_REDUCE], ar_u * (G - 1)) &&
                                  close_rel(t->intra_bytes[ZERO_COLL_ALL_REDUCE], ar_u * rs_) &&
                                  close_rel(t->inter_bytes[ZERO_COLL_ALL_REDUCE], ar_u * (G - 1 - rs_)),
                              "N=%d S=%d R=%d stage %d rank %d step %d: all-reduce %.17g / %.17g / %.17g",
                              N, S, R, st, rk, s, t->bytes[ZERO_COLL_ALL_REDUCE],
                              t->intra_bytes[ZERO_COLL_ALL_REDUCE], t->inter_bytes[ZERO_COLL_ALL_REDUCE]);
                }
            est_check(&c, got, S, R);
            ec_result_free(got);
        }
}

/* Offload cpu (and at stage 3 the params on the host too): the same bits as without. */
ZT_TEST(mics_offload_cpu)
{
    int st, k;
    for (k = 0; k < MICS_NCASES; k += 2)
        for (st = 1; st <= 3; st++) {
            ec_cfg c;
            ec_result *a, *b;
            char why[160];
            mics_cfg(&c, st, mics_cases[k][0], mics_cases[k][1], mics_cases[k][2], ZERO_BF16, 2, 3);
            a = ec_run(&c);
            c.offload_opt = ZERO_OFFLOAD_CPU;
            if (st == 3) c.offload_param = ZERO_OFFLOAD_CPU;
            b = ec_run(&c);
            ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s / %s", a->err, b->err);
            ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "case %d stage %d offload: %s", k, st, why);
            ec_result_free(a);
            ec_result_free(b);
        }
}

/* The checkpoint in dir (saved after step 2 of c's run) resumed to step 4 equals the run
   without a pause; then saved and dir are gone. */
static void resume_equals_straight(const ec_cfg *c, const char *dir, ec_result *saved)
{
    ec_job jl;
    ec_result *straight = ec_run(c), *resumed;
    char why[512];
    memset(&jl, 0, sizeof jl);
    jl.load_dir = dir;
    jl.first = 2;
    jl.last = 4;
    resumed = ec_run_job(c, &jl);
    ZT_CHECKF(straight->rc == ZERO_OK && resumed->rc == ZERO_OK, "%s / %s", straight->err, resumed->err);
    ZT_CHECKF(ec_same_state(c, straight, resumed, why, sizeof why), "resumed vs straight: %s", why);
    ec_result_free(straight);
    ec_result_free(resumed);
    ec_result_free(saved);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
}

/* Checkpoints: a MiCS run saved after 2 steps loads bit for bit into a flat run (N = 2 and
   4, stages 1 and 3) and into another topology (N = 8, S = 4, R = 4); resuming MiCS from it
   equals the straight 4-step MiCS run. */
ZT_TEST(mics_checkpoint)
{
    char dir[] = "/tmp/zero_hier_XXXXXX";
    ec_cfg c, l;
    ec_job js, jl;
    ec_result *saved, *loaded;
    char why[160];
    static const int loads[][4] = {{2, 0, 0, 1}, {4, 0, 0, 3}, {8, 4, 4, 2}, {4, 2, 2, 3}};
    size_t i;
    if (!mkdtemp(dir)) ZT_SKIP("mkdtemp failed");
    mics_cfg(&c, 2, 4, 2, 2, ZERO_BF16, 2, 4);
    memset(&js, 0, sizeof js);
    js.save_dir = dir;
    js.first = 0;
    js.last = 2;
    saved = ec_run_job(&c, &js);
    ZT_CHECKF(saved->rc == ZERO_OK, "%s", saved->err);
    for (i = 0; i < sizeof loads / sizeof loads[0] && saved->rc == ZERO_OK; i++) {
        l = c;
        l.world = loads[i][0];
        l.mics = loads[i][1];
        l.ranks_per_node = loads[i][2];
        l.stage = loads[i][3];
        memset(&jl, 0, sizeof jl);
        jl.load_dir = dir;
        jl.first = jl.last = 2;
        loaded = ec_run_job(&l, &jl);
        ZT_CHECKF(loaded->rc == ZERO_OK, "load %zu: %s", i, loaded->err);
        ZT_CHECKF(ec_same_state(&c, saved, loaded, why, sizeof why), "load into N=%d S=%d stage %d: %s",
                  l.world, l.mics, l.stage, why);
        ec_result_free(loaded);
    }
    resume_equals_straight(&c, dir, saved);
}

/* zero_engine_create with a descriptor (its device and comm filled in on each rank) on N
   local ranks; nosplit: a comm without split. Rank 0's result and message. */
typedef struct create_ctx {
    zero_engine_desc d;
    int nosplit;
    zero_result got;
    char msg[480];
} create_ctx;

static zero_result create_rank(int rank, zero_comm *comm, void *user)
{
    create_ctx *m = (create_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d = m->d;
    zero_comm_ops ops = *comm->ops;
    zero_comm wrapped = *comm;
    zero_result r = zero_host_device_create(NULL, &dev);
    if (r != ZERO_OK) return r;
    ops.split = NULL;
    wrapped.ops = &ops;
    d.device = dev;
    d.comm = m->nosplit ? &wrapped : comm;
    r = zero_engine_create(&d, &e);
    if (rank == 0) {
        m->got = r;
        snprintf(m->msg, sizeof m->msg, "%s", zero_last_error());
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

static zero_result create_try(int world, const zero_engine_desc *d, int nosplit, char *msg, size_t n)
{
    create_ctx m;
    memset(&m, 0, sizeof m);
    m.d = *d;
    m.nosplit = nosplit;
    if (zero_local_run(world, create_rank, &m) != ZERO_OK) return ZERO_ERROR_COMM;
    snprintf(msg, n, "%s", m.msg);
    return m.got;
}

/* Refused: stage 0, a size that does not divide N, NVMe tiers, a comm without split;
   ranks that disagree: MISMATCH naming mics_shard_size. */
static zero_result mr_try(int stage, int mics, int nvme, int nosplit, char *msg, size_t n)
{
    zero_engine_desc d;
    memset(&d, 0, sizeof d);
    d.stage = stage;
    d.mics_shard_size = mics;
    if (nvme) {
        d.offload_optimizer = ZERO_OFFLOAD_NVME;
        d.nvme_path = "/tmp";
    }
    return create_try(4, &d, nosplit, msg, n);
}

ZT_TEST(mics_refused)
{
    char msg[400];
    ec_cfg c;
    ec_result *res;
    ZT_CHECK(mr_try(0, 2, 0, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT && strstr(msg, "stage 0"));
    ZT_CHECK(mr_try(2, 3, 0, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT && strstr(msg, "mics_shard_size"));
    ZT_CHECK(mr_try(2, 2, 1, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT && strstr(msg, "NVMe"));
    ZT_CHECK(mr_try(2, 2, 0, 1, msg, sizeof msg) == ZERO_ERROR_UNSUPPORTED && strstr(msg, "split"));
    ZT_CHECK(mr_try(2, 4, 0, 1, msg, sizeof msg) == ZERO_OK); /* S = N is flat: no split needed */
    ZT_CHECK(mr_try(0, 0, 0, 1, msg, sizeof msg) == ZERO_OK);
    mics_cfg(&c, 1, 4, 2, 2, ZERO_BF16, 1, 1); /* stage 1: no arena size that differs first */
    c.mics_rank[1] = 4; /* rank 1: flat */
    res = ec_run(&c);
    ZT_CHECKF(res->rc == ZERO_ERROR_MISMATCH && strstr(res->err, "mics_shard_size"), "%s", res->err);
    ec_result_free(res);
}

/* ---- hpZ (hpz_partition_size) --------------------------------------------------------------- */

/* The hpZ cases: (N, R, S), S dividing R. */
static const int hpz_cases[][3] = {{4, 2, 2}, {4, 4, 2}, {8, 2, 2}, {8, 4, 4}, {8, 4, 2}};
#define HPZ_NCASES ((int)(sizeof hpz_cases / sizeof hpz_cases[0]))

static void hpz_cfg(ec_cfg *c, int k, zero_dtype dt, int accum, int steps)
{
    ec_cfg_init(c, 3, hpz_cases[k][0], dt, accum, steps);
    c->ranks_per_node = hpz_cases[k][1];
    c->hpz = hpz_cases[k][2];
    c->lr = 1e-2f;
}

/* hpZ is exact: the same bits as plain stage 3 at the same N (the backward's gradients are
   computed from the gathered params, so a wrong secondary part shows), with accumulation,
   every dtype, prefetch depths, persistent groups, and offload cpu (optimizer and params). */
ZT_TEST(hpz_equals_stage3)
{
    static const zero_dtype dts[] = {ZERO_BF16, ZERO_F16, ZERO_F32};
    int k, v;
    for (k = 0; k < HPZ_NCASES; k++)
        for (v = 0; v < 4; v++) {
            ec_cfg c;
            ec_result *a, *b;
            char why[160];
            hpz_cfg(&c, k, dts[v < 3 ? v : 0], 2, 3);
            if (v == 1) c.prefetch = 2;
            if (v == 2) c.prefetch = -1;
            if (v == 3) { /* persistent groups stay whole: no secondary part */
                c.persist = 40;
                c.offload_opt = ZERO_OFFLOAD_CPU;
                c.offload_param = ZERO_OFFLOAD_CPU;
            }
            if (v == 0 && k == 0) c.comm_dtype = ZERO_F32;
            b = ec_run(&c);
            c.hpz = 0;
            c.ranks_per_node = 0;
            a = ec_run(&c);
            ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s / %s", a->err, b->err);
            ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "N=%d R=%d S=%d variant %d: %s",
                      hpz_cases[k][0], hpz_cases[k][1], hpz_cases[k][2], v, why);
            ZT_CHECK(b->params_agree);
            ec_result_free(a);
            ec_result_free(b);
        }
}


/* hpZ with offload_optimizer = nvme (accepted: the optimizer tier never touches the param
   gathers; offload_param = nvme is refused) equals plain stage 3 with the same offload, bit
   for bit, with accumulation, params on the device and on the cpu tier. */
ZT_TEST(hpz_nvme_optimizer_equals_stage3)
{
    char dir[] = "/tmp/zero_hpz_nvme_XXXXXX";
    int k, op;
    if (!mkdtemp(dir)) ZT_SKIP("mkdtemp failed");
    for (k = 0; k < HPZ_NCASES; k += 3)
        for (op = 0; op <= 1; op++) {
            ec_cfg c;
            ec_result *a, *b;
            char why[160];
            hpz_cfg(&c, k, ZERO_BF16, 2, 3);
            c.offload_opt = ZERO_OFFLOAD_NVME;
            c.offload_param = op ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
            c.nvme_path = dir;
            b = ec_run(&c);
            c.hpz = 0;
            a = ec_run(&c);
            ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s / %s", a->err, b->err);
            if (a->rc == ZERO_OK && b->rc == ZERO_OK)
                ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "N=%d R=%d S=%d params %s: %s",
                          hpz_cases[k][0], hpz_cases[k][1], hpz_cases[k][2], op ? "cpu" : "device", why);
            ZT_CHECK(b->params_agree);
            ec_result_free(a);
            ec_result_free(b);
        }
    rmdir(dir);
}

/* Memory per rank: the plain stage-3 run's in every category, now and at peak, on the device
   and the host tier, plus the secondary parts as params: (numel / S) p for each partitioned
   group; and the estimator's device params (p Psi / N + p Psi / S) equal the engine's. */
ZT_TEST(hpz_memory)
{
    int k, off;
    for (k = 0; k < HPZ_NCASES; k++)
        for (off = 0; off <= 1; off++) {
            int N = hpz_cases[k][0], S = hpz_cases[k][2], rk, cat;
            ec_cfg c;
            ec_result *got, *ref;
            size_t extra;
            hpz_cfg(&c, k, ZERO_BF16, 2, 1);
            if (off) c.offload_opt = c.offload_param = ZERO_OFFLOAD_CPU;
            got = ec_run(&c);
            c.hpz = 0;
            ref = ec_run(&c);
            ZT_CHECKF(got->rc == ZERO_OK && ref->rc == ZERO_OK, "%s / %s", got->err, ref->err);
            if (got->rc != ZERO_OK || ref->rc != ZERO_OK) {
                ec_result_free(got);
                ec_result_free(ref);
                continue;
            }
            extra = (got->plan_total - got->persist_total) / (size_t)S * 2;
            for (rk = 0; rk < N; rk++) {
                const zero_engine_memory *g = &got->mem[rk], *f = &ref->mem[rk];
                for (cat = 0; cat < ZERO_MEM_COUNT; cat++) {
                    size_t add = cat == ZERO_MEM_PARAM ? extra : 0;
                    ZT_CHECKF(g->bytes[cat] == f->bytes[cat] + add &&
                                  g->peak_bytes[cat] == f->peak_bytes[cat] + add,
                              "N=%d S=%d offload %d rank %d %s: %zu (peak %zu), plain %zu + %zu",
                              N, S, off, rk, zero_mem_category_name((zero_mem_category)cat),
                              g->bytes[cat], g->peak_bytes[cat], f->bytes[cat], add);
                }
                ZT_CHECK(g->total_bytes == f->total_bytes + extra &&
                         g->peak_total_bytes == f->peak_total_bytes + extra);
                ZT_CHECK(memcmp(&got->host_mem[rk], &ref->host_mem[rk], sizeof got->host_mem[rk]) == 0);
            }
            if (got->persist_total == 0) { /* the estimator's formula */
                zero_estimate_desc d;
                zero_estimate e;
                memset(&d, 0, sizeof d);
                d.params = got->plan_total;
                d.ranks = N;
                d.stage = 3;
                d.ranks_per_node = hpz_cases[k][1];
                d.hpz_partition_size = S;
                d.offload = off;
                d.offload_optimizer = off ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
                d.offload_param = off ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
                ZT_CHECKF(zero_estimate_compute(&d, &e) == ZERO_OK, "%s", zero_last_error());
                ZT_CHECKF(e.params_bytes == got->mem[0].bytes[ZERO_MEM_PARAM],
                          "N=%d S=%d offload %d: estimator params %llu, engine %zu", N, S, off,
                          (unsigned long long)e.params_bytes, got->mem[0].bytes[ZERO_MEM_PARAM]);
            }
            ec_result_free(got);
            ec_result_free(ref);
        }
}

/* The estimator's traffic per step against rank 0's measured payload (hpZ). */
static void est_check_hpz(const ec_cfg *c, const ec_result *res)
{
    zero_estimate_desc d;
    zero_estimate e;
    const zero_traffic *t = &res->traffic_last[0][c->steps - 1];
    double b = 0, in = 0, out = 0;
    int k;
    memset(&d, 0, sizeof d);
    d.params = res->plan_total;
    d.ranks = c->world;
    d.stage = 3;
    d.param_bytes = (int)zero_dtype_size(c->dtype);
    d.grad_bytes = (int)zero_dtype_size(c->comm_dtype ? c->comm_dtype : c->dtype);
    d.ranks_per_node = c->ranks_per_node;
    d.hpz_partition_size = c->hpz;
    d.accum_steps = c->accum;
    ZT_CHECKF(zero_estimate_compute(&d, &e) == ZERO_OK, "%s", zero_last_error());
    for (k = 0; k < ZERO_COLL_CONTROL; k++) {
        b += t->bytes[k];
        in += t->intra_bytes[k];
        out += t->inter_bytes[k];
    }
    ZT_CHECKF(fabs(e.step_bytes - b) <= 1e-9 * b + 1e-6 && fabs(e.step_intra_bytes - in) <= 1e-9 * b + 1e-6 &&
                  fabs(e.step_inter_bytes - out) <= 1e-9 * b + 1e-6,
              "N=%d S=%d R=%d: estimator %.17g / %.17g / %.17g, measured %.17g / %.17g / %.17g",
              c->world, c->hpz, c->ranks_per_node, e.step_bytes, e.step_intra_bytes,
              e.step_inter_bytes, b, in, out);
}

/* Traffic per step on every rank = the hpZ formulas: the gradients' reduce-scatter as plain
   stage 3 (A P g (N-1)/N, split by the node); the params all-gathered once over the N ranks
   (P p (N-1)/N: (R-1)/(N-1) of it inside the node) and 2 A - 1 times over the S ranks of the
   node (P p (S-1)/S each, all inside). Between nodes: (A g + p) P (N-R)/N, against plain
   stage 3's (A g + 2 A p) P (N-R)/N. */
ZT_TEST(hpz_traffic_formulas)
{
    int k, acc;
    for (k = 0; k < HPZ_NCASES; k++)
        for (acc = 1; acc <= 2; acc++) {
            int N = hpz_cases[k][0], R = hpz_cases[k][1], S = hpz_cases[k][2], rk, s;
            ec_cfg c;
            ec_result *got;
            double P, cs = 4.0, ps = 2.0, A = acc;
            hpz_cfg(&c, k, ZERO_BF16, acc, 2);
            c.comm_dtype = ZERO_F32;
            got = ec_run(&c);
            ZT_CHECKF(got->rc == ZERO_OK, "%s", got->err);
            if (got->rc != ZERO_OK) {
                ec_result_free(got);
                continue;
            }
            P = (double)got->plan_total;
            for (rk = 0; rk < N; rk++)
                for (s = 0; s < c.steps; s++) {
                    const zero_traffic *t = &got->traffic_last[rk][s];
                    double rs_u = A * P / N * cs, ag_u = P / N * ps, hz_u = (2 * A - 1) * P / S * ps;
                    ZT_CHECKF(close_rel(t->bytes[ZERO_COLL_REDUCE_SCATTER], rs_u * (N - 1)) &&
                                  close_rel(t->intra_bytes[ZERO_COLL_REDUCE_SCATTER], rs_u * (R - 1)) &&
                                  close_rel(t->inter_bytes[ZERO_COLL_REDUCE_SCATTER], rs_u * (N - R)),
                              "N=%d R=%d S=%d A=%d rank %d step %d: reduce-scatter %.17g / %.17g / %.17g",
                              N, R, S, acc, rk, s, t->bytes[ZERO_COLL_REDUCE_SCATTER],
                              t->intra_bytes[ZERO_COLL_REDUCE_SCATTER], t->inter_bytes[ZERO_COLL_REDUCE_SCATTER]);
                    ZT_CHECKF(close_rel(t->bytes[ZERO_COLL_ALL_GATHER], ag_u * (N - 1) + hz_u * (S - 1)) &&
                                  close_rel(t->intra_bytes[ZERO_COLL_ALL_GATHER], ag_u * (R - 1) + hz_u * (S - 1)) &&
                                  close_rel(t->inter_bytes[ZERO_COLL_ALL_GATHER], ag_u * (N - R)),
                              "N=%d R=%d S=%d A=%d rank %d step %d: all-gather %.17g / %.17g / %.17g",
                              N, R, S, acc, rk, s, t->bytes[ZERO_COLL_ALL_GATHER],
                              t->intra_bytes[ZERO_COLL_ALL_GATHER], t->inter_bytes[ZERO_COLL_ALL_GATHER]);
                    ZT_CHECK(t->bytes[ZERO_COLL_ALL_REDUCE] == 0.0);
                    ZT_CHECK(t->calls[ZERO_COLL_ALL_GATHER] == (uint64_t)(2 * acc * got->ngroups));
                }
            est_check_hpz(&c, got);
            ec_result_free(got);
        }
}

/* ZeRO++ in full: hpZ with qgZ is exact against qgZ alone (hpZ changes only the gathers);
   with qwZ the backward reads the forward's (dequantized) values, bit for bit; and qwZ + hpZ
   + qgZ move between nodes exactly the packed forward gather and the packed gradient blocks:
   P8(n) (N - R) + A P4(n) (N / R - 1) per group of shard n with qgZ's two-level scheme (the
   default), P8(n) (N - R) + A P4(n) (N - R) with the flat one, against plain stage 3's
   (2 A p n + A g n) (N - R) (the paper's 3 M -> 0.75 M: docs/engine.md). */
ZT_TEST(hpz_with_quantized)
{
    int k;
    for (k = 0; k < HPZ_NCASES; k += 2) {
        int N = hpz_cases[k][0], R = hpz_cases[k][1], rk;
        ec_cfg c;
        ec_result *a, *b, *bf;
        ec_qw_stats st;
        char why[160];
        /* qgZ: hpZ on top changes no bit */
        hpz_cfg(&c, k, ZERO_BF16, 2, 2);
        c.quant_g = 1;
        b = ec_run(&c);
        c.hpz = 0;
        a = ec_run(&c);
        ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s / %s", a->err, b->err);
        ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "N=%d qgZ + hpZ vs qgZ: %s", N, why);
        ec_result_free(a);
        ec_result_free(b);
        /* qwZ + hpZ: the backward's params are the forward's exactly */
        memset(&st, 0, sizeof st);
        pthread_mutex_init(&st.mu, NULL);
        hpz_cfg(&c, k, ZERO_BF16, 1, 2);
        c.quant_w = 1;
        c.quant_block = 16;
        c.qw_stats = &st;
        b = ec_run(&c);
        ZT_CHECKF(b->rc == ZERO_OK, "%s", b->err);
        ZT_CHECKF(st.blocks > 0 && st.differing == 0, "N=%d qwZ + hpZ: %ld of the backward's values "
                  "differ from the forward's", N, st.differing);
        pthread_mutex_destroy(&st.mu);
        ec_result_free(b);
        /* the full configuration's bytes between nodes (qgZ two-level, the default, and flat) */
        hpz_cfg(&c, k, ZERO_BF16, 2, 2);
        c.quant_w = c.quant_g = 1;
        b = ec_run(&c);
        c.quant_levels = 1;
        bf = ec_run(&c);
        c.quant_levels = 0;
        c.quant_w = c.quant_g = 0;
        c.hpz = 0;
        a = ec_run(&c);
        ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK && bf->rc == ZERO_OK, "%s / %s / %s", a->err,
                  b->err, bf->err);
        if (a->rc == ZERO_OK && b->rc == ZERO_OK && bf->rc == ZERO_OK) {
            size_t p8 = 0, p4 = 0, n = 0;
            double want = 0.0, want_flat = 0.0, plain = 0.0;
            int g;
            /* the default model's groups, laid out by a plan as the engine does */
            zero_plan *plan = NULL;
            ZT_CHECK(zero_plan_create(&plan, NULL) == ZERO_OK);
            for (g = 0; g < c.ntensors; g++) {
                char nm[16];
                snprintf(nm, sizeof nm, "t%d", g);
                ZT_CHECK(zero_plan_add(plan, nm, c.sizes[g], c.groups[g], NULL) == ZERO_OK);
            }
            ZT_CHECK(zero_plan_commit(plan, N, 0, 0) == ZERO_OK);
            for (g = 0; g < zero_plan_num_groups(plan); g++) {
                zero_group_info gi;
                zero_plan_group(plan, g, &gi);
                n = gi.shard_numel;
                ZT_CHECK(zero_quant_bytes(n, 8, 0, &p8) == ZERO_OK && zero_quant_bytes(n, 4, 0, &p4) == ZERO_OK);
                want += (double)p8 * (N - R) + 2.0 * (double)p4 * (N / R - 1);
                want_flat += ((double)p8 + 2.0 * (double)p4) * (N - R);
                plain += (2.0 * 2.0 * 2.0 * (double)n + 2.0 * 2.0 * (double)n) * (N - R);
            }
            zero_plan_destroy(plan);
            for (rk = 0; rk < N; rk++) {
                const zero_traffic *t = &b->traffic_last[rk][1], *f = &a->traffic_last[rk][1];
                const zero_traffic *tf = &bf->traffic_last[rk][1];
                double got = t->inter_bytes[ZERO_COLL_ALL_GATHER] + t->inter_bytes[ZERO_COLL_REDUCE_SCATTER];
                double gf = tf->inter_bytes[ZERO_COLL_ALL_GATHER] + tf->inter_bytes[ZERO_COLL_REDUCE_SCATTER];
                double fl = f->inter_bytes[ZERO_COLL_ALL_GATHER] + f->inter_bytes[ZERO_COLL_REDUCE_SCATTER];
                ZT_CHECKF(close_rel(got, want) && close_rel(gf, want_flat) && close_rel(fl, plain),
                          "N=%d R=%d rank %d: between nodes %.17g (formula %.17g), with flat qgZ %.17g "
                          "(%.17g), plain %.17g (%.17g)", N, R, rk, got, want, gf, want_flat, fl, plain);
            }
        }
        ec_result_free(a);
        ec_result_free(b);
        ec_result_free(bf);
    }
}

/* Checkpoints: an hpZ run saved after 2 steps loads bit for bit into plain stage 3 (N = 4
   and 2), stage 1 and another hpZ topology (N = 8, R = S = 4); resuming hpZ from it equals the
   straight 4-step hpZ run (the load makes the secondary parts stale). */
ZT_TEST(hpz_checkpoint)
{
    char dir[] = "/tmp/zero_hpz_XXXXXX";
    ec_cfg c, l;
    ec_job js, jl;
    ec_result *saved, *loaded;
    char why[160];
    static const int loads[][4] = {{4, 0, 0, 3}, {2, 0, 0, 3}, {4, 0, 0, 1}, {8, 4, 4, 3}};
    size_t i;
    if (!mkdtemp(dir)) ZT_SKIP("mkdtemp failed");
    hpz_cfg(&c, 0, ZERO_BF16, 2, 4);
    c.offload_opt = ZERO_OFFLOAD_CPU;
    memset(&js, 0, sizeof js);
    js.save_dir = dir;
    js.first = 0;
    js.last = 2;
    saved = ec_run_job(&c, &js);
    ZT_CHECKF(saved->rc == ZERO_OK, "%s", saved->err);
    for (i = 0; i < sizeof loads / sizeof loads[0] && saved->rc == ZERO_OK; i++) {
        l = c;
        l.world = loads[i][0];
        l.ranks_per_node = loads[i][1];
        l.hpz = loads[i][2];
        l.stage = loads[i][3];
        l.offload_opt = ZERO_OFFLOAD_NONE;
        memset(&jl, 0, sizeof jl);
        jl.load_dir = dir;
        jl.first = jl.last = 2;
        loaded = ec_run_job(&l, &jl);
        ZT_CHECKF(loaded->rc == ZERO_OK, "load %zu: %s", i, loaded->err);
        ZT_CHECKF(ec_same_state(&c, saved, loaded, why, sizeof why), "load into N=%d S=%d stage %d: %s",
                  l.world, l.hpz, l.stage, why);
        ec_result_free(loaded);
    }
    resume_equals_straight(&c, dir, saved);
}

/* offload_states / reload_states between steps: the secondary parts leave the device with
   the params and come back bit for bit (the run equals the plain stage-3 run). */
ZT_TEST(hpz_offload_states)
{
    ec_cfg c;
    ec_result *a, *b;
    char why[160];
    hpz_cfg(&c, 0, ZERO_BF16, 1, 3);
    c.states_what = ZERO_STATES_ALL;
    c.states_tier = ZERO_OFFLOAD_CPU;
    c.states_at = 1;
    b = ec_run(&c);
    c.hpz = 0;
    a = ec_run(&c);
    ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s / %s", a->err, b->err);
    ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "%s", why);
    /* between the calls the device holds nothing more than the plain run's */
    ZT_CHECKF(b->states_mem[0][1][0].bytes[ZERO_MEM_PARAM] == a->states_mem[0][1][0].bytes[ZERO_MEM_PARAM],
              "params on the device while offloaded: %zu vs plain %zu",
              b->states_mem[0][1][0].bytes[ZERO_MEM_PARAM], a->states_mem[0][1][0].bytes[ZERO_MEM_PARAM]);
    ec_result_free(a);
    ec_result_free(b);
}

/* Refused, each with its reason; ranks that disagree: MISMATCH naming hpz_partition_size. */
static zero_result hr2_try(int world, int stage, int hpz, int rpn, int mics, int nvme_param,
                           int nosplit, char *msg, size_t n)
{
    zero_engine_desc d;
    memset(&d, 0, sizeof d);
    d.stage = stage;
    d.hpz_partition_size = hpz;
    d.ranks_per_node = rpn;
    d.mics_shard_size = mics;
    if (nvme_param) {
        d.offload_optimizer = ZERO_OFFLOAD_NVME;
        d.offload_param = ZERO_OFFLOAD_NVME;
        d.nvme_path = "/tmp";
    }
    return create_try(world, &d, nosplit, msg, n);
}

ZT_TEST(hpz_refused)
{
    char msg[480];
    ec_cfg c;
    ec_result *res;
    ZT_CHECKF(hr2_try(4, 2, 2, 2, 0, 0, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT &&
                  strstr(msg, "stage 2"), "%s", msg);
    ZT_CHECKF(hr2_try(8, 3, 4, 2, 0, 0, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT &&
                  strstr(msg, "ranks_per_node = 2"), "%s", msg);
    ZT_CHECKF(hr2_try(8, 3, 3, 4, 0, 0, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT, "%s", msg);
    ZT_CHECKF(hr2_try(4, 3, -1, 2, 0, 0, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT, "%s", msg);
    ZT_CHECKF(hr2_try(4, 3, 2, 2, 2, 0, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT &&
                  strstr(msg, "MiCS"), "%s", msg);
    ZT_CHECKF(hr2_try(4, 3, 2, 2, 0, 1, 0, msg, sizeof msg) == ZERO_ERROR_INVALID_ARGUMENT &&
                  strstr(msg, "nvme"), "%s", msg);
    ZT_CHECKF(hr2_try(4, 3, 2, 2, 0, 0, 1, msg, sizeof msg) == ZERO_ERROR_UNSUPPORTED &&
                  strstr(msg, "split"), "%s", msg);
    /* off: 1 (DeepSpeed's default) and N need no split; the world as one node allows S | N */
    ZT_CHECK(hr2_try(4, 3, 1, 2, 0, 0, 1, msg, sizeof msg) == ZERO_OK);
    ZT_CHECK(hr2_try(4, 3, 4, 0, 0, 0, 1, msg, sizeof msg) == ZERO_OK);
    ZT_CHECK(hr2_try(4, 3, 2, 0, 0, 0, 0, msg, sizeof msg) == ZERO_OK);
    hpz_cfg(&c, 0, ZERO_BF16, 1, 1);
    c.hpz_rank[1] = 1; /* rank 1: off */
    res = ec_run(&c);
    ZT_CHECKF(res->rc == ZERO_ERROR_MISMATCH && strstr(res->err, "hpz_partition_size"), "%s", res->err);
    ec_result_free(res);
    {   /* the estimator refuses the same */
        zero_estimate_desc d;
        zero_estimate e;
        memset(&d, 0, sizeof d);
        d.params = 1000;
        d.ranks = 8;
        d.ranks_per_node = 2;
        d.stage = 3;
        d.hpz_partition_size = 4;
        ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
        d.hpz_partition_size = 2;
        d.stage = 2;
        ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
        d.stage = 3;
        ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
    }
}

/* The params change between gathers: after a forward pass with hpZ (secondary parts valid),
   a load of a checkpoint saved after step 1, and later a set_tensor of tensor 0, must make
   the parts stale (else the next gathers read the old values): the run equals plain stage 3
   doing the same, bit for bit. */
typedef struct hs_job {
    ec_ctx ctx; /* first */
    const char *dir;
} hs_job;

static zero_result hs_rank(int rank, zero_comm *comm, void *user)
{
    hs_job *job = (hs_job *)user;
    const ec_cfg *c = job->ctx.cfg;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T], t, s;
    float *tmp = (float *)malloc(4096 * sizeof(float));
    ec_engine_desc(c, &d);
    EC_TRY(tmp ? zero_host_device_create(NULL, &dev) : ZERO_ERROR_OUT_OF_MEMORY);
    d.device = dev;
    d.comm = comm;
    EC_TRY(zero_engine_create(&d, &e));
    EC_TRY(ec_add_tensors(e, c, ids));
    EC_TRY(zero_engine_commit(e));
    EC_TRY(ec_set_init(e, c, ids, tmp));
    for (s = 0; s < 4; s++) {
        if (s >= 2) /* a forward pass first: every secondary part valid */
            EC_TRY(ec_forward(e, zero_plan_num_groups(zero_engine_plan(e))));
        if (s == 2) EC_TRY(zero_engine_load(e, job->dir)); /* back to after step 1 */
        if (s == 3) { /* new values for tensor 0 */
            size_t i;
            for (i = 0; i < c->sizes[0]; i++) tmp[i] = 0.25f - 0.001f * (float)i;
            EC_TRY(zero_engine_set_tensor(e, ids[0], tmp));
        }
        EC_TRY(ec_micro_steps(c, e, ids, rank, s, zero_engine_loss_scale(e)));
        EC_TRY(zero_engine_step(e, NULL));
        if (s == 0) EC_TRY(zero_engine_save(e, job->dir));
    }
    for (t = 0; t < c->ntensors; t++) EC_TRY(ec_read_states(e, &job->ctx, rank, t, ids[t]));
done:
    if (r != ZERO_OK && rank == 0)
        snprintf(job->ctx.res->err, sizeof job->ctx.res->err, "%s", zero_last_error());
    free(tmp);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(hpz_params_change_between_gathers)
{
    char d1[] = "/tmp/zero_hpz_a_XXXXXX", d2[] = "/tmp/zero_hpz_b_XXXXXX", cmd[128];
    ec_cfg c;
    hs_job j1, j2;
    ec_result *a, *b;
    char why[160];
    if (!mkdtemp(d1) || !mkdtemp(d2)) ZT_SKIP("mkdtemp failed");
    hpz_cfg(&c, 0, ZERO_BF16, 2, 4);
    memset(&j1, 0, sizeof j1);
    j1.dir = d1;
    b = ec_run_with(&c, &j1.ctx, hs_rank, &j1);
    c.hpz = 0;
    memset(&j2, 0, sizeof j2);
    j2.dir = d2;
    a = ec_run_with(&c, &j2.ctx, hs_rank, &j2);
    ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s / %s", a->err, b->err);
    ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "%s", why);
    ec_result_free(a);
    ec_result_free(b);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", d1, d2);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s, %s\n", d1, d2);
}

int main(void)
{
    ZT_RUN(split_local);
    ZT_RUN(split_unsupported);
    ZT_RUN(ranks_per_node_resolve);
    ZT_RUN(ranks_per_node_mismatch);
    ZT_RUN(traffic_split_flat);
    ZT_RUN(mics_refused);
    ZT_RUN(mics_stages_identical);
    ZT_RUN(mics_equals_reference);
    ZT_RUN(mics_memory_is_flat_at_S);
    ZT_RUN(mics_traffic_formulas);
    ZT_RUN(mics_offload_cpu);
    ZT_RUN(mics_checkpoint);
    ZT_RUN(hpz_refused);
    ZT_RUN(hpz_equals_stage3);
    ZT_RUN(hpz_nvme_optimizer_equals_stage3);
    ZT_RUN(hpz_memory);
    ZT_RUN(hpz_traffic_formulas);
    ZT_RUN(hpz_with_quantized);
    ZT_RUN(hpz_checkpoint);
    ZT_RUN(hpz_offload_states);
    ZT_RUN(hpz_params_change_between_gathers);
    return zt_summary();
}
