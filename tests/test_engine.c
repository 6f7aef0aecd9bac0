/* The engine, numerics: stages 0-3 bit-identical; agreement with one rank on the whole
   batch; global norm and clipping; a non-finite gradient skips the step on every rank; the
   loss-scale sequence. (Accounting: test_engine_accounting.c; misuse: test_engine_misuse.c.) */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

static const char *dt_name(zero_dtype d) { return zero_dtype_name(d); }

ZT_TEST(stages_bit_identical)
{
    static const int worlds_full[] = {1, 2, 3, 4, 8}, worlds_quick[] = {1, 3, 4};
    const int *worlds = zt_quick() ? worlds_quick : worlds_full;
    int nw = zt_quick() ? 3 : 5, wi, di, ai;
    const zero_dtype dts[] = {ZERO_F16, ZERO_BF16};
    const int accums[] = {1, 3};
    for (wi = 0; wi < nw; wi++)
        for (di = 0; di < 2; di++)
            for (ai = 0; ai < 2; ai++) {
                ec_cfg c;
                char label[96];
                ec_cfg_init(&c, 0, worlds[wi], dts[di], accums[ai], 10);
                c.persist = 20; /* stage 3: group 2 (13 elements) stays whole */
                c.max_live = 0; /* default pool */
                c.clip = 0.5f;  /* the norm is ~0.3..0.6: clipping on some steps */
                snprintf(label, sizeof label, "N=%d %s accum=%d", worlds[wi], dt_name(dts[di]),
                         accums[ai]);
                ec_check_stages_identical(&c, label);
            }
}

/* Other settings keep the equality: fp32 gradient communication, fused buckets through
   group calls, deeper prefetch with a tight pool, no persistence. */
ZT_TEST(stages_bit_identical_variants)
{
    ec_cfg c;
    ec_cfg_init(&c, 0, 3, ZERO_F16, 3, 10);
    c.comm_dtype = ZERO_F32;
    ec_check_stages_identical(&c, "N=3 f16 comm f32 accum=3");

    ec_cfg_init(&c, 0, 4, ZERO_BF16, 1, 10);
    c.comm_dtype = ZERO_F32;
    c.persist = 20;
    ec_check_stages_identical(&c, "N=4 bf16 comm f32 accum=1");

    ec_cfg_init(&c, 0, 4, ZERO_F16, 2, 10);
    c.bucket = 1000; /* several groups per flush, in one group call */
    c.wrap_ops = &ec_wrap_ops;
    ec_wrap_reset(-1);
    ec_check_stages_identical(&c, "N=4 f16 bucket=1000 grouped");
    ZT_CHECKF(ec_wrap_group_calls > 0 && ec_wrap_grouped_colls > 0,
              "group calls %d, grouped collectives %d", ec_wrap_group_calls,
              ec_wrap_grouped_colls);

    ec_cfg_init(&c, 0, 2, ZERO_F16, 1, 10);
    c.prefetch = 2;
    c.max_live = 3 * 256; /* 3 slots of the largest group (256 padded) */
    ec_check_stages_identical(&c, "N=2 f16 prefetch=2 tight pool");

    ec_cfg_init(&c, 0, 3, ZERO_F32, 2, 10);
    ec_check_stages_identical(&c, "N=3 f32 accum=2");
}

ZT_TEST(deterministic_run_after_run)
{
    ec_cfg c;
    ec_result *a, *b;
    char why[160];
    ec_cfg_init(&c, 3, 4, ZERO_F16, 2, 8);
    a = ec_run(&c);
    b = ec_run(&c);
    ZT_CHECK(a->rc == ZERO_OK && b->rc == ZERO_OK);
    ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "%s", why);
    ec_result_free(a);
    ec_result_free(b);
}

/* N ranks each computing its own gradient, averaged by the engine, against one rank that
   computes the mean of the same N gradients itself (in double, rounded once to the dtype).

   Tolerance. The two runs differ only in where rounding happens: the N-rank run rounds
   each rank's scaled gradient to the dtype (relative error <= u, u = 2^-11 for fp16, 2^-8
   for bf16) and the rank-order sum once more (<= u); the one-rank run rounds the mean once.
   Every synthetic gradient is positive (>= 0.005 - 0.002 |p|), so the reduced gradient
   differs by at most ~3u relative. Adam's update m/sqrt(v) is invariant to a common scale,
   and a relative gradient error delta changes it by at most ~2 delta, so each step moves a
   master weight by at most lr * 6u more or less; over T steps (errors add, and params feed
   back into the gradients only through the 0.002 p term) |delta master| <= T * lr * 6u.
   We allow twice that, plus one fp32 ulp of the weights (~6e-8). Params compare within
   one dtype ulp of the master difference. */
ZT_TEST(matches_single_rank_whole_batch)
{
    const zero_dtype dts[] = {ZERO_F16, ZERO_BF16};
    int di, wi;
    static const int worlds[] = {2, 4, 8};
    for (di = 0; di < 2; di++)
        for (wi = 0; wi < (zt_quick() ? 2 : 3); wi++) {
            ec_cfg c, c1;
            ec_result *rn, *r1;
            int t, T = 10;
            double u = dts[di] == ZERO_F16 ? 1.0 / 2048 : 1.0 / 256;
            double tol, worst = 0.0;
            ec_cfg_init(&c, 2, worlds[wi], dts[di], 2, T);
            c1 = c;
            c1.world = 1;
            c1.virt_world = worlds[wi];
            rn = ec_run(&c);
            r1 = ec_run(&c1);
            ZT_CHECKF(rn->rc == ZERO_OK && r1->rc == ZERO_OK, "%s / %s", rn->err, r1->err);
            tol = 2.0 * T * c.lr * 6.0 * u + 6e-8;
            for (t = 0; t < c.ntensors; t++) {
                size_t i;
                for (i = 0; i < c.sizes[t]; i++) {
                    double d = fabs((double)rn->master[t][i] - (double)r1->master[t][i]);
                    if (d > worst) worst = d;
                }
            }
            ZT_CHECKF(worst <= tol, "N=%d %s: max |master difference| %.3g > tolerance %.3g",
                      worlds[wi], dt_name(dts[di]), worst, tol);
            if (!zt_quick())
                printf("  N=%d %s: max |master(N ranks) - master(1 rank)| = %.3g (tolerance %.3g)\n",
                       worlds[wi], dt_name(dts[di]), worst, tol);
            ec_result_free(rn);
            ec_result_free(r1);
        }
}

/* The global norm of step 1 against a double-precision reference computed here from the
   same per-rank gradients (rounded to fp16 exactly as the ranks write them), summed in
   double. The engine's sum is rounded once per element to fp16 (relative <= u = 2^-11), so
   the norms agree within u relative; we allow 2u. Then clipping at a quarter of the norm:
   clip_coef = clip / (norm + 1e-6), grad_mul = coef / (scale * N), and Adam's first moment
   after one step is (1 - beta1) * g * grad_mul (fp32 arithmetic on the fp16 sum: within 2u
   relative of the double reference). */
ZT_TEST(grad_norm_and_clip)
{
    ec_cfg c;
    ec_result *r;
    int st;
    for (st = 0; st <= 3; st += 3) {
        int N = 3, t, rk;
        double sumsq = 0.0, norm_ref, scale, u = 1.0 / 2048, clip, coef, worst_m = 0.0;
        double *avg[EC_MAX_T];
        ec_cfg_init(&c, st, N, ZERO_F16, 1, 1);
        r = ec_run(&c);
        ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
        scale = r->info[0][0].loss_scale;
        for (t = 0; t < c.ntensors; t++) {
            size_t i;
            avg[t] = (double *)calloc(c.sizes[t], sizeof(double));
            for (i = 0; i < c.sizes[t]; i++) {
                float p = zero_f16_to_f32(zero_f32_to_f16(ec_init_value(t, i)));
                double s = 0.0;
                for (rk = 0; rk < N; rk++)
                    s += zero_f16_to_f32(
                        zero_f32_to_f16((float)(ec_synth_grad(p, rk, 0, 0, i, t) * scale)));
                avg[t][i] = s / (scale * N);
                sumsq += avg[t][i] * avg[t][i];
            }
        }
        norm_ref = sqrt(sumsq);
        for (rk = 0; rk < N; rk++) {
            double got = r->info[rk][0].grad_norm;
            ZT_CHECKF(fabs(got - norm_ref) <= 2 * u * norm_ref,
                      "stage %d rank %d: norm %.9g, reference %.9g", st, rk, got, norm_ref);
            ZT_CHECK(r->info[rk][0].clip_coef == 1.0f);
            ZT_CHECKF(r->info[rk][0].grad_mul == (float)(1.0 / (scale * N)), "grad_mul %.9g",
                      (double)r->info[rk][0].grad_mul);
        }
        ec_result_free(r);

        clip = norm_ref / 4;
        c.clip = (float)clip;
        r = ec_run(&c);
        ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
        coef = (double)(c.clip / (r->info[0][0].grad_norm + 1e-6f));
        for (rk = 0; rk < N; rk++) {
            ZT_CHECKF(r->info[rk][0].clip_coef == (float)coef, "coef %.9g vs %.9g",
                      (double)r->info[rk][0].clip_coef, coef);
            ZT_CHECKF(fabs(r->info[rk][0].grad_mul - coef / (scale * N)) <=
                          1e-6 * coef / (scale * N),
                      "grad_mul %.9g vs %.9g", (double)r->info[rk][0].grad_mul,
                      coef / (scale * N));
        }
        for (t = 0; t < c.ntensors; t++) {
            size_t i;
            for (i = 0; i < c.sizes[t]; i++) {
                double want = 0.1 * avg[t][i] * coef;
                double d = fabs(r->m[t][i] - want) / fabs(want);
                if (d > worst_m) worst_m = d;
            }
            free(avg[t]);
        }
        ZT_CHECKF(worst_m <= 2 * u, "stage %d: m after a clipped step: relative error %.3g", st,
                  worst_m);
        ec_result_free(r);
    }
}

/* A NaN (or inf) in one rank's gradient: every rank skips, and the state after the skipped
   step is bit for bit the state before it (a run one step shorter), step count included. */
ZT_TEST(nonfinite_skips_on_every_rank)
{
    int st, kind;
    for (st = 0; st <= 3; st++)
        for (kind = 0; kind < 2; kind++) {
            ec_cfg c, cs;
            ec_result *a, *b;
            char why[160];
            int rk;
            ec_cfg_init(&c, st, 3, kind ? ZERO_BF16 : ZERO_F16, 2, 3);
            c.fault_steps[0] = 2;
            c.nfault = 1;
            c.fault_rank = 1;
            c.fault_inf = kind;
            cs = c;
            cs.steps = 2;
            cs.nfault = 0;
            a = ec_run(&c);
            b = ec_run(&cs);
            ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s / %s", a->err, b->err);
            for (rk = 0; rk < 3; rk++) {
                ZT_CHECKF(a->info[rk][2].skipped == 1, "stage %d rank %d not skipped", st, rk);
                ZT_CHECK(a->info[rk][2].step == 2);
                ZT_CHECK(a->info[rk][2].grad_norm == -1.0f);
                ZT_CHECK(a->info[rk][1].skipped == 0);
            }
            ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "stage %d %s: %s", st,
                      kind ? "inf" : "nan", why);
            ec_result_free(a);
            ec_result_free(b);
        }
}

/* DeepSpeed's DynamicLossScaler.update_scale as of 0.17.1, written here from its
   description (names as in DeepSpeed), independent of zero_scaler: the reference below. */
typedef struct ds_scaler {
    double cur_scale, scale_factor, min_scale;
    long cur_iter, last_overflow_iter, scale_window;
    int delayed_shift, cur_hysteresis, consecutive_hysteresis;
} ds_scaler;

static void ds_update_scale(ds_scaler *d, int overflow)
{
    if (overflow) {
        if (d->delayed_shift == 1 || d->cur_hysteresis == 1)
            d->cur_scale = d->cur_scale / d->scale_factor > d->min_scale
                               ? d->cur_scale / d->scale_factor
                               : d->min_scale;
        else
            d->cur_hysteresis -= 1;
        d->last_overflow_iter = d->cur_iter;
    } else {
        long stable_interval = d->cur_iter - d->last_overflow_iter - 1;
        if (d->consecutive_hysteresis) d->cur_hysteresis = d->delayed_shift;
        if (stable_interval > 0 && stable_interval % d->scale_window == 0) {
            if (!d->consecutive_hysteresis) d->cur_hysteresis = d->delayed_shift;
            d->cur_scale *= d->scale_factor;
        }
    }
    d->cur_iter += 1;
}

/* Planned overflows against DeepSpeed's rule (the reimplementation above fed the same
   pattern), and the rule itself on the first steps: window 3, hysteresis 2, init 2^10. */
ZT_TEST(loss_scale_sequence)
{
    static const int pattern[] = {1, 2, 3, 7, 8, 12};
    ec_cfg c;
    ec_result *r;
    ds_scaler sc;
    int s, i, skipped = 0;
    ec_cfg_init(&c, 2, 2, ZERO_F16, 1, 16);
    c.init_scale = 1024.0f;
    c.window = 3;
    c.hysteresis = 2;
    c.fault_rank = 1;
    c.fault_inf = 1;
    for (i = 0; i < 6; i++) c.fault_steps[i] = pattern[i];
    c.nfault = 6;
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    memset(&sc, 0, sizeof sc);
    sc.cur_scale = 1024.0;
    sc.scale_factor = 2.0;
    sc.min_scale = 1.0;
    sc.last_overflow_iter = -1;
    sc.scale_window = 3;
    sc.delayed_shift = sc.cur_hysteresis = 2;
    for (s = 0; s < c.steps; s++) {
        int ov = ec_is_fault(&c, s);
        ZT_CHECKF(r->loss_scale_before[s] == sc.cur_scale, "step %d: scale %g, rule %g", s,
                  (double)r->loss_scale_before[s], sc.cur_scale);
        ZT_CHECKF(r->info[0][s].loss_scale == sc.cur_scale, "step %d", s);
        ZT_CHECKF(r->info[1][s].skipped == ov, "step %d: skipped %d", s, r->info[1][s].skipped);
        ds_update_scale(&sc, ov);
        ZT_CHECKF(r->info[0][s].next_loss_scale == sc.cur_scale, "step %d: next %g, rule %g", s,
                  (double)r->info[0][s].next_loss_scale, sc.cur_scale);
        skipped += ov;
    }
    ZT_CHECK(r->info[0][c.steps - 1].step == c.steps - skipped);
    /* By hand: step 0 good; step 1 overflow absorbed by hysteresis; step 2 overflow halves. */
    ZT_CHECK(r->loss_scale_before[0] == 1024.0f && r->loss_scale_before[2] == 1024.0f);
    ZT_CHECK(r->loss_scale_before[3] == 512.0f);
    ec_result_free(r);

    /* bf16 needs no scaling: scale 1 throughout. */
    ec_cfg_init(&c, 1, 2, ZERO_BF16, 1, 3);
    r = ec_run(&c);
    ZT_CHECK(r->rc == ZERO_OK && r->info[0][2].loss_scale == 1.0f);
    ec_result_free(r);
}

int main(void)
{
    ZT_RUN(stages_bit_identical);
    ZT_RUN(stages_bit_identical_variants);
    ZT_RUN(deterministic_run_after_run);
    ZT_RUN(matches_single_rank_whole_batch);
    ZT_RUN(grad_norm_and_clip);
    ZT_RUN(nonfinite_skips_on_every_rank);
    ZT_RUN(loss_scale_sequence);
    return zt_summary();
}
