/* test_hier.c - beyond one node (issue 26): the topology (zero_engine_desc.ranks_per_node:
   explicit, from the launcher's environment, refused when it does not divide the world,
   MISMATCH when ranks disagree), sub-communicators (zero_comm_split on the local comm: the
   groups, their ranks by key, reductions in their own rank order bit for bit against a
   reference, nested splits, color < 0, a comm without split), and the traffic counters
   split into intra- and inter-node bytes: on every rank and step equal to the attribution
   of docs/engine.md computed from the flat totals, the totals unchanged by the topology,
   and the state bits unchanged, at N = 4 and 8 with R = 2 and 4, stages 0-3. */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

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
            ec_result_free(flat);
            ec_result_free(hier);
        }
}

int main(void)
{
    ZT_RUN(split_local);
    ZT_RUN(split_unsupported);
    ZT_RUN(ranks_per_node_resolve);
    ZT_RUN(ranks_per_node_mismatch);
    ZT_RUN(traffic_split_flat);
    return zt_summary();
}
