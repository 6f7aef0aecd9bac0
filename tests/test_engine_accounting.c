/* The engine, accounting: bytes held per rank by category against DESIGN.md's table plus the
   declared buffers; bytes moved per step against the paper's volumes; the stage-3 gather
   pool's bound and that nothing non-persistent stays gathered after a step. */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

/* The arena's elements for cfg c (docs/engine.md): max_live_numel, or the default: the
   largest group M beside (2 + depth) of the second largest M2 (stage 2: 2), at least
   2 M + depth M2 when that is at most 2^24; at most P (+ P - Pp at stage 3). */
static size_t expected_arena(const ec_cfg *c, const ec_result *r)
{
    size_t M = r->max_group, M2 = r->max_group2, P = r->plan_total, Pp = r->persist_total;
    size_t d = c->stage < 3 ? 0 : c->prefetch == 0 ? 1 : (c->prefetch < 0 ? 0 : (size_t)c->prefetch);
    size_t live = c->max_live, all = c->stage == 3 ? P + (P - Pp) : P;
    if (live == 0) {
        live = M + (2 + d) * M2;
        if (2 * M + d * M2 <= ((size_t)1 << 24) && 2 * M + d * M2 > live) live = 2 * M + d * M2;
    }
    return live < all ? live : all;
}

/* Expected bytes per category for cfg c, from the plan sizes in r (see docs/engine.md). */
static void expected_bytes(const ec_cfg *c, const ec_result *r, size_t out[ZERO_MEM_COUNT])
{
    size_t N = (size_t)c->world, P = r->plan_total, S = r->plan_shard_total, M = r->max_group;
    size_t Pp = r->persist_total;
    zero_dtype cdt = c->comm_dtype ? c->comm_dtype : c->dtype;
    size_t p = zero_dtype_size(c->dtype), cb = zero_dtype_size(cdt);
    int accum = c->accum ? c->accum : 1;
    int alias = c->stage <= 1 && accum == 1 && cdt == c->dtype;
    memset(out, 0, ZERO_MEM_COUNT * sizeof out[0]);
    out[ZERO_MEM_PARAM] = (c->stage < 3 ? P : (S - Pp / N) + Pp) * p;
    if (c->stage == 0) out[ZERO_MEM_GRAD] = P * p + (alias ? 0 : P * cb);
    else if (c->stage == 1) out[ZERO_MEM_GRAD] = P * p + (alias ? 0 : S * cb);
    else out[ZERO_MEM_GRAD] = S * cb;
    out[ZERO_MEM_MASTER] = out[ZERO_MEM_MOMENT1] = out[ZERO_MEM_MOMENT2] =
        4 * (c->stage == 0 ? P : S);
    if (cdt != c->dtype) { /* the staging bucket: N x b, b = min(R / N, M / N), at least 1 */
        size_t R = c->bucket == 0 ? r->max_group2 : c->bucket == (size_t)-1 ? M : c->bucket;
        size_t b = R / N;
        if (b > M / N) b = M / N;
        if (b < 1) b = 1;
        out[ZERO_MEM_BUCKET] = N * b * cb;
    }
    if (c->stage == 2) out[ZERO_MEM_BUCKET] += expected_arena(c, r) * p;
    if (c->stage == 3) out[ZERO_MEM_GATHER] = expected_arena(c, r) * p;
    out[ZERO_MEM_SCRATCH] = 64;
}

ZT_TEST(memory_matches_formula)
{
    static const int worlds[] = {1, 2, 3, 4, 8};
    int wi, st, var;
    if (!zt_quick()) printf("  model states per rank (bytes), P = plan total, fp16, accum 1:\n");
    for (wi = 0; wi < 5; wi++)
        for (st = 0; st <= 3; st++)
            for (var = 0; var < 4; var++) {
                ec_cfg c;
                ec_result *r;
                size_t want[ZERO_MEM_COUNT];
                int k, rk;
                ec_cfg_init(&c, st, worlds[wi], ZERO_F16, var == 1 ? 3 : 1, 1);
                if (var == 2) {
                    c.comm_dtype = ZERO_F32;
                    c.persist = 20;
                    c.bucket = 700;
                    c.prefetch = 2;
                }
                if (var == 3) { /* "no limit": the pools hold what can ever be used */
                    c.bucket = (size_t)-1;
                    c.max_live = (size_t)-1;
                }
                r = ec_run(&c);
                ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
                expected_bytes(&c, r, want);
                for (rk = 0; rk < c.world; rk++)
                    for (k = 0; k < ZERO_MEM_COUNT; k++) {
                        ZT_CHECKF(r->mem[rk].bytes[k] == want[k],
                                  "N=%d stage %d var %d rank %d %s: %zu bytes, formula %zu",
                                  c.world, st, var, rk, zero_mem_category_name((zero_mem_category)k),
                                  r->mem[rk].bytes[k], want[k]);
                        ZT_CHECK(r->mem[rk].peak_bytes[k] == r->mem[rk].bytes[k]);
                    }
                if (var == 0) {
                    /* The paper's model states (K = 12): exactly, with no declared extras. */
                    double P = (double)r->plan_total, N = c.world, paper;
                    const size_t *b = r->mem[0].bytes;
                    double states = (double)(b[ZERO_MEM_PARAM] + b[ZERO_MEM_GRAD] +
                                             b[ZERO_MEM_MASTER] + b[ZERO_MEM_MOMENT1] +
                                             b[ZERO_MEM_MOMENT2]);
                    paper = st == 0   ? 16 * P
                            : st == 1 ? 4 * P + 12 * P / N
                            : st == 2 ? 2 * P + 14 * P / N
                                      : 16 * P / N;
                    ZT_CHECKF(states == paper, "N=%d stage %d: model states %.0f, paper %.0f",
                              c.world, st, states, paper);
                    if (!zt_quick() && c.world == 4)
                        printf("    N=4 stage %d: P=%zu measured %.0f paper %.0f, + buckets %zu "
                               "gather %zu scratch %zu\n",
                               st, r->plan_total, states, paper, b[ZERO_MEM_BUCKET],
                               b[ZERO_MEM_GATHER], b[ZERO_MEM_SCRATCH]);
                }
                ec_result_free(r);
            }
}

ZT_TEST(traffic_matches_paper)
{
    static const int worlds[] = {1, 2, 3, 4, 8};
    int wi, st, var, s, rk;
    for (wi = 0; wi < 5; wi++)
        for (st = 0; st <= 3; st++)
            for (var = 0; var < 3; var++) {
                ec_cfg c;
                ec_result *r;
                double N, f, P, Pp, a, want_ag, want_rs, want_ar;
                zero_dtype cdt;
                ec_cfg_init(&c, st, worlds[wi], ZERO_F16, var == 1 ? 3 : 1, 3);
                if (var == 2) {
                    c.comm_dtype = ZERO_F32;
                    c.persist = 20;
                }
                cdt = c.comm_dtype ? c.comm_dtype : c.dtype;
                r = ec_run(&c);
                ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
                N = c.world;
                f = (N - 1) / N;
                P = (double)r->plan_total;
                Pp = (double)r->persist_total;
                a = c.accum;
                want_ag = st == 0 ? 0 : st < 3 ? P * f : 2 * (P - Pp) * f * a + Pp * f;
                want_rs = st == 0 ? 0 : P * f * a;
                want_ar = st == 0 ? 2 * P * f * a : 0;
                for (rk = 0; rk < c.world; rk++)
                    for (s = 0; s < c.steps; s++) {
                        const zero_traffic *t = &r->traffic_last[rk][s];
                        ZT_CHECKF(t->numel[ZERO_COLL_ALL_GATHER] == want_ag &&
                                      t->numel[ZERO_COLL_REDUCE_SCATTER] == want_rs &&
                                      t->numel[ZERO_COLL_ALL_REDUCE] == want_ar,
                                  "N=%d stage %d var %d rank %d step %d: ag %.1f rs %.1f ar %.1f, "
                                  "formula %.1f %.1f %.1f",
                                  c.world, st, var, rk, s, t->numel[ZERO_COLL_ALL_GATHER],
                                  t->numel[ZERO_COLL_REDUCE_SCATTER], t->numel[ZERO_COLL_ALL_REDUCE],
                                  want_ag, want_rs, want_ar);
                        ZT_CHECK(t->bytes[ZERO_COLL_ALL_GATHER] == want_ag * 2);
                        ZT_CHECK(t->bytes[ZERO_COLL_REDUCE_SCATTER] ==
                                 want_rs * (double)zero_dtype_size(cdt));
                        ZT_CHECK(t->bytes[ZERO_COLL_ALL_REDUCE] ==
                                 want_ar * (double)zero_dtype_size(cdt));
                        /* two control all-reduces per step: the inf flag and the norm */
                        ZT_CHECK(t->calls[ZERO_COLL_CONTROL] == 2);
                        ZT_CHECK(t->numel[ZERO_COLL_CONTROL] == 4 * f);
                        if (var == 0)
                            ZT_CHECKF(zero_traffic_payload_numel(t) == (st < 3 ? 2 : 3) * P * f,
                                      "paper volume: stage %d N=%d: %.1f vs %.1f", st, c.world,
                                      zero_traffic_payload_numel(t), (st < 3 ? 2 : 3) * P * f);
                    }
                ec_result_free(r);
            }
}

/* A model of 12 layer groups of similar size, so the pool matters. */
static void many_groups(ec_cfg *c)
{
    int t;
    c->ntensors = 13;
    for (t = 0; t < 12; t++) {
        c->sizes[t] = 90 + (size_t)(t * 7) % 23;
        c->groups[t] = t;
        c->flags[t] = 0;
    }
    c->sizes[12] = 3;
    c->groups[12] = 11;
    c->flags[12] = ZERO_TENSOR_NO_DECAY;
}

ZT_TEST(stage3_gather_bounds)
{
    static const int depths[] = {-1, 1, 2, 3};
    static const size_t arenas[] = {2, 3, 4, 6}; /* in groups of 128 */
    int di, si, rk;
    for (di = 0; di < 4; di++)
        for (si = 0; si < 4; si++) {
            ec_cfg c;
            ec_result *r;
            size_t slot;
            int G = 12, steps = 3, accum = 2;
            ec_cfg_init(&c, 3, 4, ZERO_BF16, accum, steps);
            many_groups(&c);
            c.prefetch = depths[di];
            slot = 128; /* every group pads to 128 at N=4, align 16 (max 112 used + 3) */
            c.max_live = arenas[si] * slot + 17;
            r = ec_run(&c);
            ZT_CHECKF(r->rc == ZERO_OK, "depth %d arena %zu: %s", depths[di], arenas[si], r->err);
            if (r->rc != ZERO_OK) {
                ec_result_free(r);
                continue;
            }
            ZT_CHECK(r->max_np_group == slot);
            for (rk = 0; rk < c.world; rk++) {
                const zero_gather_stats *g = &r->gstats[rk];
                ZT_CHECK(g->limit_numel == c.max_live);
                ZT_CHECKF(g->peak_live_numel <= g->limit_numel, "peak %zu limit %zu",
                          g->peak_live_numel, g->limit_numel);
                ZT_CHECK(g->live_numel == 0 && g->live_groups == 0 && g->grad_live_numel == 0);
                /* Forward and backward use every group once per micro-step: one all-gather
                   per use; prefetches follow the recorded order and leave room for the
                   gradient buffers it asks for, so none is wasted. */
                ZT_CHECKF(g->gathers == (uint64_t)(2 * G * accum * steps) && g->prefetch_wasted == 0 &&
                              g->evictions == 0,
                          "depth %d arena %zu: gathers %llu wasted %llu", depths[di], arenas[si],
                          (unsigned long long)g->gathers, (unsigned long long)g->prefetch_wasted);
                ZT_CHECK(g->prefetches == g->prefetch_hits);
                ZT_CHECK(g->trace_records == 1 && g->trace_len == 3 * G);
                if (depths[di] < 0) ZT_CHECK(g->prefetches == 0);
                else if (arenas[si] >= 3) ZT_CHECKF(g->prefetches > 0, "depth %d arena %zu: no prefetch",
                                                    depths[di], arenas[si]);
            }
            ZT_CHECK(r->live_after_step_max == 0);
            ec_result_free(r);
        }
}

int main(void)
{
    ZT_RUN(memory_matches_formula);
    ZT_RUN(traffic_matches_paper);
    ZT_RUN(stage3_gather_bounds);
    return zt_summary();
}
