/* test_quant_engine.c - ZeRO++'s quantized collectives in the engine (quantized_weights =
   qwZ, quantized_gradients = qgZ) at N = 4 and 8 on the local comm:
   - qwZ: every forward value within the int8 bound of the exact value, per block of every
     rank's shard, for f32, f16 and bf16; the backward's gathers exact (the run's state equals
     the exact run's, the synthetic gradients being functions of the backward's values);
   - qgZ: the same bits every run and at stages 1, 2 and 3; Adam's first moment after one
     step within the derived bound of the exact run's (int4 and int8), for tensor sizes of
     every remainder mod 2N; an inf in one rank's gradient still skips the step;
   - the traffic counters: the quantized bytes exactly as the formula;
   - offload cpu, accumulation and a checkpoint saved with qwZ + qgZ loaded into a flat run;
   - the combinations that make no sense refused with a message. */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

#include <stdlib.h>
#include <unistd.h>

static const zero_dtype dts[3] = {ZERO_F32, ZERO_F16, ZERO_BF16};

static void q_cfg(ec_cfg *c, int stage, int world, zero_dtype dt, int accum, int steps)
{
    ec_cfg_init(c, stage, world, dt, accum, steps);
}

/* Packed bytes of n elements, by the documented layout (independent of zero_quant_bytes). */
static double packed(size_t n, int bits, size_t block)
{
    size_t nb = (n + block - 1) / block, b = 4 * nb + (bits == 8 ? n : (n + 1) / 2);
    return (double)((b + 3) / 4 * 4);
}

ZT_TEST(qwz_forward_within_bound_backward_exact)
{
    int w, d;
    for (w = 4; w <= 8; w += 4)
        for (d = 0; d < 3; d++) {
            ec_cfg c;
            ec_qw_stats st;
            ec_result *q, *x;
            char why[160];
            memset(&st, 0, sizeof st);
            pthread_mutex_init(&st.mu, NULL);
            q_cfg(&c, 3, w, dts[d], 1, 3);
            c.quant_w = 1;
            c.quant_block = 16; /* several blocks per shard, tails included */
            c.qw_stats = &st;
            q = ec_run(&c);
            c.quant_w = 0;
            c.qw_stats = NULL;
            x = ec_run(&c);
            ZT_CHECKF(q->rc == ZERO_OK && x->rc == ZERO_OK, "%s %s", q->err, x->err);
            ZT_CHECKF(st.blocks > 0 && st.bad_blocks == 0, "N %d %s: %ld of %ld blocks out of bound", w,
                      zero_dtype_name(dts[d]), st.bad_blocks, st.blocks);
            /* lossy (measured): some forward values differ; in fp32 by at most half a scale
               (f16 / bf16 add their own rounding, within the bound checked above) */
            ZT_CHECKF(st.differing > 0 && (dts[d] != ZERO_F32 || st.max_err_over_scale <= 0.5 + 1e-3),
                      "N %d %s: %ld differ, worst %g scales", w, zero_dtype_name(dts[d]), st.differing,
                      st.max_err_over_scale);
            if (q->rc == ZERO_OK && x->rc == ZERO_OK)
                ZT_CHECKF(ec_same_state(&c, q, x, why, sizeof why) && q->params_agree,
                          "N %d %s: backward not exact: %s", w, zero_dtype_name(dts[d]), why);
            ec_result_free(q);
            ec_result_free(x);
            pthread_mutex_destroy(&st.mu);
        }
}

/* Deeper prefetch with accumulation: a group prefetched at the end of one micro-step for the
   next one's forward still gets an exact backward (the state equals the exact run's). */
ZT_TEST(qwz_prefetch_accumulation_backward_exact)
{
    int depth;
    for (depth = 1; depth <= 3; depth++) {
        ec_cfg c;
        ec_qw_stats st;
        ec_result *q, *x;
        char why[160];
        memset(&st, 0, sizeof st);
        pthread_mutex_init(&st.mu, NULL);
        q_cfg(&c, 3, 4, ZERO_BF16, 3, 3);
        c.prefetch = depth;
        c.quant_w = 1;
        c.qw_stats = &st;
        q = ec_run(&c);
        c.quant_w = 0;
        c.qw_stats = NULL;
        x = ec_run(&c);
        ZT_CHECKF(q->rc == ZERO_OK && x->rc == ZERO_OK, "%s %s", q->err, x->err);
        ZT_CHECKF(st.bad_blocks == 0 && st.differing > 0, "depth %d: %ld bad blocks, %ld differ", depth,
                  st.bad_blocks, st.differing);
        if (q->rc == ZERO_OK && x->rc == ZERO_OK)
            ZT_CHECKF(ec_same_state(&c, q, x, why, sizeof why), "depth %d: backward not exact: %s", depth, why);
        ec_result_free(q);
        ec_result_free(x);
        pthread_mutex_destroy(&st.mu);
    }
}

/* The same bits every run and at stages 1, 2, 3 (int4 and int8, accumulation 1 and 2). */
ZT_TEST(qgz_deterministic_stages_identical)
{
    int w, bits, acc;
    for (w = 4; w <= 8; w += 4)
        for (bits = 4; bits <= 8; bits += 4)
            for (acc = 1; acc <= 2; acc++) {
                ec_result *r[4];
                ec_cfg c;
                char why[160];
                int s;
                for (s = 1; s <= 3; s++) {
                    q_cfg(&c, s, w, bits == 4 ? ZERO_BF16 : ZERO_F16, acc, 3);
                    c.quant_g = 1;
                    c.quant_bits = bits;
                    r[s] = ec_run(&c);
                    ZT_CHECKF(r[s]->rc == ZERO_OK, "stage %d: %s", s, r[s]->err);
                }
                r[0] = ec_run(&c); /* stage 3 again */
                if (r[1]->rc == ZERO_OK && r[2]->rc == ZERO_OK && r[3]->rc == ZERO_OK) {
                    ZT_CHECKF(ec_same_state(&c, r[1], r[2], why, sizeof why), "N %d int%d accum %d stage 1 vs 2: %s",
                              w, bits, acc, why);
                    ZT_CHECKF(ec_same_state(&c, r[2], r[3], why, sizeof why), "N %d int%d accum %d stage 2 vs 3: %s",
                              w, bits, acc, why);
                    ZT_CHECKF(r[0]->rc == ZERO_OK && ec_same_state(&c, r[3], r[0], why, sizeof why),
                              "N %d int%d accum %d rerun: %s", w, bits, acc, why);
                }
                for (s = 0; s < 4; s++) ec_result_free(r[s]);
            }
}

/* One step, fp32, on N ranks of R a node (0 = one node), with tensor sizes of every
   remainder mod 2N: qgZ at 'bits' against the exact run, every m within bound (plus 1e-6
   relative for fp32 roundings), some m differ (lossy), params agree across ranks. Prints the
   worst error and how many exceed flat_bound (the one-quantization bound). */
static void qgz_m_within(int N, int R, int bits, double bound, double flat_bound)
{
    ec_cfg c;
    ec_result *q, *x;
    int t;
    double worst = 0.0;
    long differ = 0, bad = 0, over_flat = 0;
    q_cfg(&c, 2, N, ZERO_F32, 1, 1);
    c.ranks_per_node = R;
    c.ntensors = 2 * N;
    for (t = 0; t < c.ntensors; t++) {
        c.sizes[t] = (size_t)(3 * 2 * N + t); /* remainder t mod 2N */
        c.groups[t] = t / 2;
        c.flags[t] = 0;
    }
    c.quant_block = 8;
    x = ec_run(&c);
    c.quant_g = 1;
    c.quant_bits = bits;
    q = ec_run(&c);
    ZT_CHECKF(q->rc == ZERO_OK && x->rc == ZERO_OK, "%s %s", q->err, x->err);
    if (q->rc == ZERO_OK && x->rc == ZERO_OK) {
        ZT_CHECK(q->params_agree);
        for (t = 0; t < c.ntensors; t++) {
            size_t i;
            for (i = 0; i < c.sizes[t]; i++) {
                double e = fabs((double)q->m[t][i] - (double)x->m[t][i]);
                if (e > bound + 1e-6 * fabs((double)x->m[t][i])) bad++;
                over_flat += e > flat_bound;
                if (e > worst) worst = e;
                differ += e != 0.0;
            }
        }
        ZT_CHECKF(bad == 0 && differ > 0, "N %d R %d int%d: %ld beyond %g (worst %g), %ld differ", N, R,
                  bits, bad, bound, worst, differ);
        printf("  N %d R %d int%d: worst |m_q - m| %.3g, bound %.3g (%ld above the flat bound)\n", N,
               R ? R : N, bits, worst, bound, over_flat);
    }
    ec_result_free(q);
    ec_result_free(x);
}

/* One step, fp32: Adam's m = (1 - beta1) g with g the mean of the ranks' gradients. With qgZ
   each rank's block is off by at most s_r (1/2 + 2^-16), s_r <= G / Q (G bounds |gradient|),
   so |m_q - m_exact| <= (1 - beta1) G / Q (1/2 + 2^-16) plus fp32 roundings. Tensor sizes
   take every remainder mod 2N. Also: lossy (some m differ), and params agree across ranks. */
ZT_TEST(qgz_close_to_exact_every_remainder)
{
    int w, bits;
    for (w = 4; w <= 8; w += 4)
        for (bits = 4; bits <= 8; bits += 4) {
            int Q = bits == 8 ? 127 : 7;
            double flat = 0.1 * 0.026 / Q * (0.5 + ldexp(1.0, -16)) + 1e-8; /* G = 0.026 */
            qgz_m_within(w, 0, bits, flat, flat);
        }
}

/* An inf in one rank's fp16 gradient at step 1: the step is skipped on every rank (the
   non-finite block dequantizes to NaN, the scaler sees it), as in the exact run. */
ZT_TEST(qgz_overflow_reaches_the_scaler)
{
    int R;
    for (R = 4; R >= 2; R -= 2) { /* flat (one node), then two-level (2 nodes x 2) */
        ec_cfg c;
        ec_result *q;
        int rk;
        q_cfg(&c, 2, 4, ZERO_F16, 1, 3);
        c.ranks_per_node = R;
        c.quant_g = 1;
        c.fault_steps[0] = 1;
        c.nfault = 1;
        c.fault_rank = 2;
        c.fault_inf = 1;
        q = ec_run(&c);
        ZT_CHECKF(q->rc == ZERO_OK, "%s", q->err);
        for (rk = 0; rk < 4 && q->rc == ZERO_OK; rk++)
            ZT_CHECKF(!q->info[rk][0].skipped && q->info[rk][1].skipped && !q->info[rk][2].skipped,
                      "R %d rank %d: skipped %d %d %d", R, rk, q->info[rk][0].skipped,
                      q->info[rk][1].skipped, q->info[rk][2].skipped);
        ec_result_free(q);
    }
}

/* The traffic counters against the formula: per micro-step and non-persistent group g (stage
   3), one quantized forward gather (P8(S_g) (N-1) bytes) and one exact backward gather
   (S_g x 2 (N-1)); qgZ's reduce-scatter Pbits(S_g) (N-1) bytes; the element counts as in the
   exact run. */
ZT_TEST(traffic_formula)
{
    int w;
    for (w = 4; w <= 8; w += 4) {
        ec_cfg c;
        ec_result *q, *x;
        zero_plan *plan = NULL;
        double ag = 0.0, rs = 0.0;
        int t, g, rk, accum = 2;
        size_t block = 32;
        q_cfg(&c, 3, w, ZERO_BF16, accum, 2);
        ZT_CHECK(zero_plan_create(&plan, NULL) == ZERO_OK);
        for (t = 0; t < c.ntensors; t++) {
            char name[16];
            int id;
            snprintf(name, sizeof name, "t%d", t);
            ZT_CHECK(zero_plan_add(plan, name, c.sizes[t], c.groups[t], &id) == ZERO_OK);
        }
        ZT_CHECK(zero_plan_commit(plan, w, ZERO_DEFAULT_ALIGN_NUMEL, 0) == ZERO_OK);
        for (g = 0; g < zero_plan_num_groups(plan); g++) {
            zero_group_info gi;
            zero_plan_group(plan, g, &gi);
            ag += accum * (packed(gi.shard_numel, 8, block) + 2.0 * (double)gi.shard_numel) * (w - 1);
            rs += accum * packed(gi.shard_numel, 4, block) * (w - 1);
        }
        zero_plan_destroy(plan);
        x = ec_run(&c);
        c.quant_w = c.quant_g = 1;
        c.quant_block = block;
        q = ec_run(&c);
        ZT_CHECKF(q->rc == ZERO_OK && x->rc == ZERO_OK, "%s %s", q->err, x->err);
        for (rk = 0; rk < w && q->rc == ZERO_OK && x->rc == ZERO_OK; rk++) {
            const zero_traffic *a = &q->traffic_last[rk][1], *b = &x->traffic_last[rk][1];
            ZT_CHECKF(a->bytes[ZERO_COLL_ALL_GATHER] == ag, "N %d rank %d: all-gather %.0f bytes, formula %.0f",
                      w, rk, a->bytes[ZERO_COLL_ALL_GATHER], ag);
            ZT_CHECKF(a->bytes[ZERO_COLL_REDUCE_SCATTER] == rs,
                      "N %d rank %d: reduce-scatter %.0f bytes, formula %.0f", w, rk,
                      a->bytes[ZERO_COLL_REDUCE_SCATTER], rs);
            ZT_CHECK(a->numel[ZERO_COLL_ALL_GATHER] == b->numel[ZERO_COLL_ALL_GATHER]);
            ZT_CHECK(a->numel[ZERO_COLL_REDUCE_SCATTER] == b->numel[ZERO_COLL_REDUCE_SCATTER]);
            if (rk == 0)
                printf("  N %d: all-gather %.0f -> %.0f bytes, reduce-scatter %.0f -> %.0f bytes per step\n", w,
                       b->bytes[ZERO_COLL_ALL_GATHER], a->bytes[ZERO_COLL_ALL_GATHER],
                       b->bytes[ZERO_COLL_REDUCE_SCATTER], a->bytes[ZERO_COLL_REDUCE_SCATTER]);
        }
        ec_result_free(q);
        ec_result_free(x);
    }
}


/* ---- hierarchical qgZ (quantized_gradient_levels = 2, ZeRO++'s two-level scheme) -------- */

/* The multi-node topologies: (N, R) with 1 < R < N. */
static const int hier_cases[][2] = {{4, 2}, {8, 2}, {8, 4}};
#define HIER_NCASES ((int)(sizeof hier_cases / sizeof hier_cases[0]))

/* The same bits every run and at stages 1, 2, 3; and not the flat scheme's bits (the
   default on several nodes is the two-level one: a second quantization changes values). */
ZT_TEST(qgz_hier_deterministic_stages_identical)
{
    int k, bits;
    for (k = 0; k < HIER_NCASES; k++)
        for (bits = 4; bits <= 8; bits += 4) {
            int N = hier_cases[k][0], R = hier_cases[k][1], s, acc = bits == 4 ? 2 : 1;
            ec_result *r[5];
            ec_cfg c;
            char why[160];
            for (s = 1; s <= 3; s++) {
                q_cfg(&c, s, N, bits == 4 ? ZERO_BF16 : ZERO_F16, acc, 3);
                c.ranks_per_node = R;
                c.quant_g = 1;
                c.quant_bits = bits;
                r[s] = ec_run(&c);
                ZT_CHECKF(r[s]->rc == ZERO_OK, "stage %d: %s", s, r[s]->err);
            }
            r[0] = ec_run(&c); /* stage 3 again */
            c.quant_levels = 1;
            r[4] = ec_run(&c); /* the flat scheme on the same topology */
            if (r[0]->rc == ZERO_OK && r[1]->rc == ZERO_OK && r[2]->rc == ZERO_OK && r[3]->rc == ZERO_OK &&
                r[4]->rc == ZERO_OK) {
                ZT_CHECKF(ec_same_state(&c, r[1], r[2], why, sizeof why), "N %d R %d int%d: stage 1 vs 2: %s",
                          N, R, bits, why);
                ZT_CHECKF(ec_same_state(&c, r[2], r[3], why, sizeof why), "N %d R %d int%d: stage 2 vs 3: %s",
                          N, R, bits, why);
                ZT_CHECKF(ec_same_state(&c, r[3], r[0], why, sizeof why), "N %d R %d int%d: rerun: %s", N, R,
                          bits, why);
                ZT_CHECKF(r[3]->params_agree, "N %d R %d: ranks disagree", N, R);
                ZT_CHECKF(!ec_same_state(&c, r[3], r[4], why, sizeof why),
                          "N %d R %d int%d: the two-level run equals the flat one", N, R, bits);
            }
            for (s = 0; s < 5; s++) ec_result_free(r[s]);
        }
}

/* R = 1 and R = N: one of the two levels is empty, and the two-level setting (explicit or
   the default) is the flat scheme: the same bits and the same counters. */
ZT_TEST(qgz_hier_degenerate_is_flat)
{
    int R, lv;
    for (R = 1; R <= 4; R += 3) {
        ec_result *flat, *r;
        ec_cfg c;
        char why[160];
        q_cfg(&c, 3, 4, ZERO_BF16, 2, 2);
        c.ranks_per_node = R;
        c.quant_g = 1;
        c.quant_levels = 1;
        flat = ec_run(&c);
        ZT_CHECKF(flat->rc == ZERO_OK, "%s", flat->err);
        for (lv = 0; lv <= 2; lv += 2) {
            int rk;
            c.quant_levels = lv;
            r = ec_run(&c);
            ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
            if (r->rc == ZERO_OK && flat->rc == ZERO_OK) {
                ZT_CHECKF(ec_same_state(&c, flat, r, why, sizeof why), "R %d levels %d: %s", R, lv, why);
                for (rk = 0; rk < 4; rk++) {
                    const zero_traffic *a = &r->traffic_last[rk][1], *b = &flat->traffic_last[rk][1];
                    ZT_CHECK(a->calls[ZERO_COLL_REDUCE_SCATTER] == b->calls[ZERO_COLL_REDUCE_SCATTER] &&
                             a->intra_bytes[ZERO_COLL_REDUCE_SCATTER] == b->intra_bytes[ZERO_COLL_REDUCE_SCATTER] &&
                             a->inter_bytes[ZERO_COLL_REDUCE_SCATTER] == b->inter_bytes[ZERO_COLL_REDUCE_SCATTER]);
                }
            }
            ec_result_free(r);
        }
        ec_result_free(flat);
    }
}

/* One step, fp32, tensor sizes of every remainder mod 2N. The derived bound: rank i's block
   comes back within s_i (1/2 + 2^-16), s_i <= G / Q (G bounds |gradient|), so a node's fp32
   partial sum is off by R G / Q (1/2 + 2^-16) and bounded by R G (1 + (1/2 + 2^-16) / Q);
   its re-quantization adds at most that bound / Q (1/2 + 2^-16). Over the M = N / R nodes
   and after the mean (/ N): |m_q - m_exact| <= (1 - beta1) G / Q (1/2 + 2^-16)
   (2 + (1/2 + 2^-16) / Q): the flat bound times 2 + (1/2 + 2^-16) / Q (2.07 at int4, 2.004
   at int8), plus fp32 roundings. */
ZT_TEST(qgz_hier_close_to_exact_every_remainder)
{
    int k, bits;
    for (k = 0; k < HIER_NCASES; k++)
        for (bits = 4; bits <= 8; bits += 4) {
            int Q = bits == 8 ? 127 : 7;
            double G = 0.026, h = 0.5 + ldexp(1.0, -16);
            qgz_m_within(hier_cases[k][0], hier_cases[k][1], bits, 0.1 * G / Q * h * (2.0 + h / Q) + 1e-8,
                         0.1 * G / Q * h + 1e-8);
        }
}

/* The counters, every rank, at A = 2 (stage 3, qgZ only): per micro-step and group of shard
   n, the node's all_to_all moves (R - 1) M P(n) bytes inside the node and the cross-node one
   (M - 1) P(n) between nodes, M = N / R; the flat scheme's (N - R) P(n) between nodes is R
   times that; the element counts are the exact run's, the calls twice the flat run's. And the
   device memory: the flat run's plus 4 bytes per element of the largest shard (the fp32
   partial sum, docs/engine.md "Memory"). */
ZT_TEST(qgz_hier_traffic_formula)
{
    int k;
    for (k = 0; k < HIER_NCASES; k++) {
        int N = hier_cases[k][0], R = hier_cases[k][1], M = N / R, t, g, rk, accum = 2;
        ec_cfg c;
        ec_result *h, *f, *x;
        zero_plan *plan = NULL;
        double intra = 0.0, inter = 0.0;
        size_t block = 32;
        q_cfg(&c, 3, N, ZERO_BF16, accum, 2);
        c.ranks_per_node = R;
        ZT_CHECK(zero_plan_create(&plan, NULL) == ZERO_OK);
        for (t = 0; t < c.ntensors; t++) {
            char name[16];
            snprintf(name, sizeof name, "t%d", t);
            ZT_CHECK(zero_plan_add(plan, name, c.sizes[t], c.groups[t], NULL) == ZERO_OK);
        }
        ZT_CHECK(zero_plan_commit(plan, N, ZERO_DEFAULT_ALIGN_NUMEL, 0) == ZERO_OK);
        for (g = 0; g < zero_plan_num_groups(plan); g++) {
            zero_group_info gi;
            zero_plan_group(plan, g, &gi);
            intra += accum * packed(gi.shard_numel, 4, block) * (R - 1) * M;
            inter += accum * packed(gi.shard_numel, 4, block) * (M - 1);
        }
        zero_plan_destroy(plan);
        x = ec_run(&c);
        c.quant_g = 1;
        c.quant_block = block;
        h = ec_run(&c);
        c.quant_levels = 1;
        f = ec_run(&c);
        ZT_CHECKF(h->rc == ZERO_OK && f->rc == ZERO_OK && x->rc == ZERO_OK, "%s %s %s", h->err, f->err, x->err);
        for (rk = 0; rk < N && h->rc == ZERO_OK && f->rc == ZERO_OK && x->rc == ZERO_OK; rk++) {
            const zero_traffic *a = &h->traffic_last[rk][1], *b = &f->traffic_last[rk][1],
                               *e = &x->traffic_last[rk][1];
            ZT_CHECKF(a->intra_bytes[ZERO_COLL_REDUCE_SCATTER] == intra &&
                      a->inter_bytes[ZERO_COLL_REDUCE_SCATTER] == inter &&
                      a->bytes[ZERO_COLL_REDUCE_SCATTER] == intra + inter,
                      "N %d R %d rank %d: intra %.0f inter %.0f, formula %.0f %.0f", N, R, rk,
                      a->intra_bytes[ZERO_COLL_REDUCE_SCATTER], a->inter_bytes[ZERO_COLL_REDUCE_SCATTER], intra,
                      inter);
            ZT_CHECKF(b->inter_bytes[ZERO_COLL_REDUCE_SCATTER] == R * inter,
                      "N %d R %d rank %d: flat between nodes %.0f, want R x %.0f", N, R, rk,
                      b->inter_bytes[ZERO_COLL_REDUCE_SCATTER], inter);
            ZT_CHECK(a->numel[ZERO_COLL_REDUCE_SCATTER] == e->numel[ZERO_COLL_REDUCE_SCATTER]);
            ZT_CHECK(a->calls[ZERO_COLL_REDUCE_SCATTER] == 2 * b->calls[ZERO_COLL_REDUCE_SCATTER]);
            /* memory: the quantized blocks' buffer grows by the fp32 partial sum of the
               largest shard, nothing else moves */
            ZT_CHECKF(h->mem[rk].bytes[ZERO_MEM_BUCKET] ==
                          f->mem[rk].bytes[ZERO_MEM_BUCKET] + 4 * (h->max_group / (size_t)N) &&
                          h->mem[rk].total_bytes == f->mem[rk].total_bytes + 4 * (h->max_group / (size_t)N),
                      "N %d R %d rank %d: bucket bytes %zu, flat %zu, largest shard %zu", N, R, rk,
                      h->mem[rk].bytes[ZERO_MEM_BUCKET], f->mem[rk].bytes[ZERO_MEM_BUCKET],
                      h->max_group / (size_t)N);
            if (rk == 0)
                printf("  N %d R %d: reduce-scatter between nodes %.0f bytes per step (flat qgZ %.0f, exact "
                       "%.0f), inside %.0f\n", N, R, a->inter_bytes[ZERO_COLL_REDUCE_SCATTER],
                       b->inter_bytes[ZERO_COLL_REDUCE_SCATTER], e->inter_bytes[ZERO_COLL_REDUCE_SCATTER],
                       a->intra_bytes[ZERO_COLL_REDUCE_SCATTER]);
        }
        ec_result_free(h);
        ec_result_free(f);
        ec_result_free(x);
    }
}

/* Two-level qgZ with offload cpu (optimizer; params at stage 3) and accumulation equals the
   same run without offload, bit for bit, at stages 2 and 3. */
ZT_TEST(qgz_hier_offload_cpu_accumulation)
{
    int s;
    for (s = 2; s <= 3; s++) {
        ec_cfg c;
        ec_result *a, *b;
        char why[160];
        q_cfg(&c, s, 8, ZERO_F16, 2, 3);
        c.ranks_per_node = 4;
        c.quant_g = 1;
        c.quant_w = s == 3;
        a = ec_run(&c);
        c.offload_opt = ZERO_OFFLOAD_CPU;
        if (s == 3) c.offload_param = ZERO_OFFLOAD_CPU;
        b = ec_run(&c);
        ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s %s", a->err, b->err);
        if (a->rc == ZERO_OK && b->rc == ZERO_OK)
            ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "stage %d offload: %s", s, why);
        ec_result_free(a);
        ec_result_free(b);
    }
}

/* qwZ + qgZ with offload cpu and accumulation: the offloaded run equals the plain one. */
ZT_TEST(offload_cpu_accumulation)
{
    ec_cfg c;
    ec_result *a, *b;
    char why[160];
    q_cfg(&c, 3, 4, ZERO_F16, 2, 3);
    c.quant_w = c.quant_g = 1;
    a = ec_run(&c);
    c.offload_opt = ZERO_OFFLOAD_CPU;
    c.offload_param = ZERO_OFFLOAD_CPU;
    b = ec_run(&c);
    ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s %s", a->err, b->err);
    if (a->rc == ZERO_OK && b->rc == ZERO_OK)
        ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "offload: %s", why);
    ec_result_free(a);
    ec_result_free(b);
}

/* A checkpoint saved by a qwZ + qgZ run (qgZ two-level, 2 nodes x 2) holds its exact master
   state and loads into a flat (unquantized, one node) run, which reads back the same bits. */
ZT_TEST(checkpoint_into_flat_run)
{
    char dir[] = "/tmp/zero_quant_XXXXXX";
    ec_cfg c;
    ec_job a, b;
    ec_result *saved, *loaded;
    char why[160];
    if (!mkdtemp(dir)) ZT_SKIP("mkdtemp failed");
    q_cfg(&c, 3, 4, ZERO_BF16, 2, 2);
    c.quant_w = c.quant_g = 1;
    c.ranks_per_node = 2; /* qgZ two-level (2 nodes x 2) */
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.first = 0;
    a.last = 2;
    a.save_dir = dir;
    saved = ec_run_job(&c, &a);
    c.quant_w = c.quant_g = 0;
    c.ranks_per_node = 0;
    c.stage = 2;
    b.first = b.last = 2;
    b.load_dir = dir;
    loaded = ec_run_job(&c, &b);
    ZT_CHECKF(saved->rc == ZERO_OK && loaded->rc == ZERO_OK, "%s %s", saved->err, loaded->err);
    if (saved->rc == ZERO_OK && loaded->rc == ZERO_OK)
        ZT_CHECKF(ec_same_state(&c, saved, loaded, why, sizeof why), "loaded: %s", why);
    ec_result_free(saved);
    ec_result_free(loaded);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ZT_CHECK(system(cmd) == 0);
    }
}

/* A comm without all_to_all (a wrapper of the local comm that hides it). */
static zero_comm_ops no_a2a_ops;

static zero_result refuse_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_comm hidden;
    int *fails = (int *)user;
    (void)rank;
    if (zero_host_device_create(NULL, &dev) != ZERO_OK) return ZERO_ERROR_DEVICE;
#define REFUSE(setup, code, needle)                                                          \
    do {                                                                                     \
        memset(&d, 0, sizeof d);                                                             \
        d.device = dev;                                                                      \
        d.comm = comm;                                                                       \
        setup;                                                                               \
        if (zero_engine_create(&d, &e) != (code) || e != NULL ||                             \
            !strstr(zero_last_error(), needle)) {                                            \
            fprintf(stderr, "  not refused as expected: %s (%s)\n", #setup, zero_last_error()); \
            (*fails)++;                                                                      \
        }                                                                                    \
        zero_engine_destroy(e);                                                              \
        e = NULL;                                                                            \
    } while (0)
    REFUSE((d.stage = 2, d.quantized_weights = 1), ZERO_ERROR_INVALID_ARGUMENT, "needs stage 3");
    REFUSE((d.stage = 0, d.quantized_gradients = 1), ZERO_ERROR_INVALID_ARGUMENT, "stage 1, 2 or 3");
    REFUSE((d.stage = 2, d.quantized_gradients = 1, d.grad_comm_dtype = ZERO_F32),
           ZERO_ERROR_INVALID_ARGUMENT, "grad_comm_dtype");
    REFUSE((d.stage = 2, d.quantized_gradients = 1, d.quantized_gradient_bits = 2),
           ZERO_ERROR_INVALID_ARGUMENT, "quantized_gradient_bits");
    REFUSE((d.stage = 3, d.quantized_weights = 1, d.quant_block_numel = 7),
           ZERO_ERROR_INVALID_ARGUMENT, "quant_block_numel");
    REFUSE((d.stage = 3, d.quantized_weights = 2), ZERO_ERROR_INVALID_ARGUMENT, "quantized_weights");
    REFUSE((d.stage = 2, d.quantized_gradients = 1, d.quantized_gradient_levels = 3),
           ZERO_ERROR_INVALID_ARGUMENT, "quantized_gradient_levels");
    hidden = *comm;
    no_a2a_ops = *comm->ops;
    no_a2a_ops.all_to_all = NULL;
    hidden.ops = &no_a2a_ops;
    REFUSE((d.stage = 2, d.quantized_gradients = 1, d.comm = &hidden), ZERO_ERROR_UNSUPPORTED,
           "all_to_all");
#undef REFUSE
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* On 2 nodes x 2, a comm without split: the default (two-level) qgZ is refused naming the
   way out, and quantized_gradient_levels = 1 is accepted. */
static zero_result no_split_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_comm hidden = *comm;
    zero_comm_ops ops = *comm->ops;
    int *fails = (int *)user + rank, lv;
    if (zero_host_device_create(NULL, &dev) != ZERO_OK) return ZERO_ERROR_DEVICE;
    ops.split = NULL;
    hidden.ops = &ops;
    for (lv = 0; lv <= 1; lv++) {
        zero_result r;
        memset(&d, 0, sizeof d);
        d.device = dev;
        d.comm = &hidden;
        d.stage = 2;
        d.ranks_per_node = 2;
        d.quantized_gradients = 1;
        d.quantized_gradient_levels = lv;
        r = zero_engine_create(&d, &e);
        if (lv == 0 && (r != ZERO_ERROR_UNSUPPORTED || e || !strstr(zero_last_error(), "quantized_gradient_levels = 1")))
            (*fails)++;
        if (lv == 1 && (r != ZERO_OK || !e)) (*fails)++;
        zero_engine_destroy(e);
        e = NULL;
    }
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(refused_combinations)
{
    int fails = 0;
    ZT_CHECK(zero_local_run(1, refuse_rank, &fails) == ZERO_OK);
    ZT_CHECKF(fails == 0, "%d combinations not refused", fails);
    {
        int per[4] = {0, 0, 0, 0};
        ZT_CHECK(zero_local_run(4, no_split_rank, per) == ZERO_OK);
        ZT_CHECKF(per[0] + per[1] + per[2] + per[3] == 0,
                  "the comm without split not handled as documented (%d %d %d %d)", per[0], per[1],
                  per[2], per[3]);
    }
}

/* Two ranks that disagree on a quantization setting: commit fails with MISMATCH on both,
   naming it (case 0: qwZ on one rank only; 1: qgZ int4 against int8; 2: the block size;
   3: qgZ on one rank only, which the resolved levels name). */
static int qmis_case;
static void qmis_desc(int rank, zero_engine_desc *d)
{
    d->stage = 3;
    d->param_dtype = ZERO_BF16;
    d->quantized_weights = qmis_case == 0 ? rank : 1;
    d->quantized_gradients = qmis_case == 3 ? rank : 1;
    d->quantized_gradient_bits = qmis_case == 1 && rank == 1 ? 8 : 4;
    d->quant_block_numel = qmis_case == 2 && rank == 1 ? 128 : 0;
}

ZT_TEST(ranks_with_different_quantization_mismatch)
{
    static const char *const named[] = {"quantized_weights", "quantized_gradient_bits", "quant_block_numel",
                                        "quantized_gradient"};
    char msg[400];
    for (qmis_case = 0; qmis_case < 4; qmis_case++) {
        ZT_CHECKF(ec_commit_disagreeing(2, qmis_desc, msg, sizeof msg) == ZERO_ERROR_MISMATCH, "case %d: %s",
                  qmis_case, msg);
        ZT_CHECKF(strstr(msg, named[qmis_case]) != NULL, "case %d: %s", qmis_case, msg);
    }
}

/* The estimator's traffic (zero_estimate_compute with the quantized fields) against the
   engine's counters on rank 0: equal for a model of one group (every tensor in group 0), and
   for the default model of G groups below the engine's by at most 8 (G - 1) bytes per
   quantized transfer to a peer (each group rounds its blocks and 4-byte tail up). Flat and
   two-level qgZ, int4 and int8, qwZ alone, with hpZ, with accumulation, stages 1-3. */
ZT_TEST(estimator_quantized_traffic)
{
    /* stage, N, R, hpz, qwZ, qgZ, bits, levels, accum, block */
    static const int cases[][10] = {
        {3, 4, 4, 0, 1, 0, 0, 0, 1, 0},  {3, 4, 4, 0, 1, 0, 0, 0, 2, 32}, {1, 4, 4, 0, 0, 1, 4, 0, 2, 16},
        {2, 4, 2, 0, 0, 1, 8, 1, 1, 32}, {3, 4, 2, 0, 0, 1, 4, 2, 2, 0},  {3, 8, 4, 0, 1, 1, 4, 0, 2, 32},
        {3, 8, 4, 2, 1, 1, 4, 0, 2, 16}, {3, 4, 2, 2, 1, 1, 8, 1, 1, 0},  {2, 8, 2, 0, 0, 1, 8, 2, 1, 64}};
    int k, one;
    for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++)
        for (one = 1; one >= 0; one--) {
            const int *v = cases[k];
            int N = v[1], R = v[2], A = v[8], t, m;
            ec_cfg c;
            ec_result *res;
            zero_estimate_desc d;
            zero_estimate e;
            double b = 0.0, in = 0.0, out = 0.0, transfers = 0.0, slack;
            q_cfg(&c, v[0], N, ZERO_BF16, A, 2);
            c.ranks_per_node = R;
            c.hpz = v[3];
            c.quant_w = v[4];
            c.quant_g = v[5];
            c.quant_bits = v[6];
            c.quant_levels = v[7];
            c.quant_block = (size_t)v[9];
            if (one)
                for (t = 0; t < c.ntensors; t++) c.groups[t] = 0;
            res = ec_run(&c);
            ZT_CHECKF(res->rc == ZERO_OK, "case %d: %s", k, res->err);
            if (res->rc != ZERO_OK) {
                ec_result_free(res);
                continue;
            }
            memset(&d, 0, sizeof d);
            d.params = res->plan_total;
            d.ranks = N;
            d.stage = v[0];
            d.ranks_per_node = R;
            d.hpz_partition_size = v[3];
            d.accum_steps = A;
            d.quantized_weights = v[4];
            d.quantized_gradients = v[5];
            d.quantized_gradient_bits = v[6];
            d.quantized_gradient_levels = v[7];
            d.quant_block_numel = (uint64_t)v[9];
            ZT_CHECKF(zero_estimate_compute(&d, &e) == ZERO_OK, "case %d: %s", k, zero_last_error());
            for (m = 0; m < ZERO_COLL_CONTROL; m++) {
                const zero_traffic *tr = &res->traffic_last[0][c.steps - 1];
                b += tr->bytes[m];
                in += tr->intra_bytes[m];
                out += tr->inter_bytes[m];
            }
            if (v[4]) transfers += (v[3] ? 1.0 : A) * (N - 1);
            if (v[5]) /* two-level where 1 < R < N and levels != 1 */
                transfers += A * (v[7] != 1 && R > 1 && R < N ? (R - 1) * (N / R) + N / R - 1 : N - 1);
            slack = one ? 0.0 : 8.0 * (res->ngroups - 1) * transfers;
            ZT_CHECK(one ? res->ngroups == 1 : res->ngroups > 1);
            ZT_CHECKF(b - e.step_bytes >= -1e-6 && b - e.step_bytes <= slack + 1e-6 &&
                          in - e.step_intra_bytes >= -1e-6 && in - e.step_intra_bytes <= slack + 1e-6 &&
                          out - e.step_inter_bytes >= -1e-6 && out - e.step_inter_bytes <= slack + 1e-6,
                      "case %d (%s): estimator %.17g / %.17g / %.17g, measured %.17g / %.17g / %.17g, "
                      "allowed %.0f above", k, one ? "one group" : "groups", e.step_bytes,
                      e.step_intra_bytes, e.step_inter_bytes, b, in, out, slack);
            ec_result_free(res);
        }
}

/* The estimator refuses the quantized fields where the engine does (or where it does not
   model them), naming the field. */
ZT_TEST(estimator_quantized_refusals)
{
    zero_estimate_desc d, x;
    zero_estimate e;
    memset(&d, 0, sizeof d);
    d.params = 1000000;
    d.ranks = 8;
    d.stage = 3;
    d.ranks_per_node = 4;
    x = d;
    x.quantized_weights = 1;
    x.stage = 2; /* qwZ: stage 3 only */
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "quantized_weights") != NULL);
    x = d;
    x.quantized_gradients = 1;
    x.stage = 0; /* qgZ: stages 1-3 */
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    x.stage = 3;
    x.mics_shard_size = 4; /* not with MiCS */
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    x.mics_shard_size = 0;
    x.frozen = 10; /* not modelled with frozen params */
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    x.frozen = 0;
    x.quantized_gradient_bits = 2;
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "quantized_gradient_bits") != NULL);
    x.quantized_gradient_bits = 8;
    x.quant_block_numel = 3; /* odd */
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    x.quant_block_numel = 0;
    x.quantized_gradient_levels = 3;
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    x.quantized_gradient_levels = 2;
    ZT_CHECKF(zero_estimate_compute(&x, &e) == ZERO_OK, "%s", zero_last_error());
    x.quantized_weights = 2;
    ZT_CHECK(zero_estimate_compute(&x, &e) == ZERO_ERROR_INVALID_ARGUMENT);
}

int main(void)
{
    ZT_RUN(qwz_forward_within_bound_backward_exact);
    ZT_RUN(qwz_prefetch_accumulation_backward_exact);
    ZT_RUN(qgz_deterministic_stages_identical);
    ZT_RUN(qgz_close_to_exact_every_remainder);
    ZT_RUN(qgz_overflow_reaches_the_scaler);
    ZT_RUN(traffic_formula);
    ZT_RUN(qgz_hier_deterministic_stages_identical);
    ZT_RUN(qgz_hier_degenerate_is_flat);
    ZT_RUN(qgz_hier_close_to_exact_every_remainder);
    ZT_RUN(qgz_hier_traffic_formula);
    ZT_RUN(qgz_hier_offload_cpu_accumulation);
    ZT_RUN(offload_cpu_accumulation);
    ZT_RUN(checkpoint_into_flat_run);
    ZT_RUN(refused_combinations);
    ZT_RUN(ranks_with_different_quantization_mismatch);
    ZT_RUN(estimator_quantized_traffic);
    ZT_RUN(estimator_quantized_refusals);
    return zt_summary();
}
