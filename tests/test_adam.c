/* Host Adam/AdamW: against a double-precision reference with a derived error bound, bit
   identity across SIMD paths, thread counts and positions, the param output, the
   per-step constants, and every error path. */
#include "zero.h"
#include "tests/zt.h"
#include "tests/zt_private.h"

#include <float.h>

#define EPS32 (1.0 / 16777216.0) /* 2^-24: the relative error of one fp32 rounding */
#define TINY32 1.4e-45           /* the absolute error of a rounding in the subnormal range */

static zero_simd g_paths[3];
static int g_num_paths;

static void find_paths(void)
{
    zero_simd best = zero_simd_detect();
    g_num_paths = 0;
    g_paths[g_num_paths++] = ZERO_SIMD_PORTABLE;
    if (best >= ZERO_SIMD_AVX2) g_paths[g_num_paths++] = ZERO_SIMD_AVX2;
    if (best >= ZERO_SIMD_AVX512) g_paths[g_num_paths++] = ZERO_SIMD_AVX512;
}

/* ---- test data ---------------------------------------------------------------------------- */

/* A range with its own buffers. grad is stored in grad_dtype; gval holds the exact values
   the kernel reads (after fp16/bf16 rounding), for the reference. */
typedef struct bufs {
    size_t n;
    float *master, *m, *v, *gval;
    void *grad, *param;
    zero_dtype grad_dtype, param_dtype;
} bufs;

static void bufs_alloc(bufs *b, size_t n, zero_dtype gd, zero_dtype pd)
{
    b->n = n;
    b->master = (float *)calloc(n + 1, sizeof(float));
    b->m = (float *)calloc(n + 1, sizeof(float));
    b->v = (float *)calloc(n + 1, sizeof(float));
    b->gval = (float *)calloc(n + 1, sizeof(float));
    b->grad = calloc(n + 1, zero_dtype_size(gd));
    b->param = pd ? calloc(n + 1, zero_dtype_size(pd)) : NULL;
    b->grad_dtype = gd;
    b->param_dtype = pd;
}

static void bufs_free(bufs *b)
{
    free(b->master);
    free(b->m);
    free(b->v);
    free(b->gval);
    free(b->grad);
    free(b->param);
}

static zero_adam_range bufs_range(const bufs *b)
{
    zero_adam_range r;
    memset(&r, 0, sizeof r);
    r.numel = b->n;
    r.master = b->master;
    r.m = b->m;
    r.v = b->v;
    r.grad = b->grad;
    r.grad_dtype = b->grad_dtype;
    r.param = b->param;
    r.param_dtype = b->param_dtype;
    return r;
}

static long g_elems, g_loose; /* element-steps checked, and those with a wide bound */

static double uni(double lo, double hi) { return lo + (hi - lo) * zt_uniform(); }

/* Sets gradient i to about x (rounded to the grad dtype) and records the exact value. */
static void set_grad(bufs *b, size_t i, float x)
{
    switch (b->grad_dtype) {
    case ZERO_F16:
        ((uint16_t *)b->grad)[i] = zero_f32_to_f16(x);
        b->gval[i] = zero_f16_to_f32(((uint16_t *)b->grad)[i]);
        break;
    case ZERO_BF16:
        ((uint16_t *)b->grad)[i] = zero_f32_to_bf16(x);
        b->gval[i] = zero_bf16_to_f32(((uint16_t *)b->grad)[i]);
        break;
    default:
        ((float *)b->grad)[i] = x;
        b->gval[i] = x;
        break;
    }
}

/* Random state: masters in (-1, 1); moments zero (fresh) or mid-training values. Gradients
   of magnitude up to gscale, with about 1 in 16 exactly zero. */
static void fill_state(bufs *b, int fresh)
{
    size_t i;
    for (i = 0; i < b->n; i++) {
        b->master[i] = (float)uni(-1, 1);
        b->m[i] = fresh ? 0.0f : (float)uni(-0.01, 0.01);
        b->v[i] = fresh ? 0.0f : (float)uni(0, 1e-4);
    }
}

static void fill_grads(bufs *b, double gscale)
{
    size_t i;
    for (i = 0; i < b->n; i++)
        set_grad(b, i, zt_rand64() % 16 == 0 ? 0.0f : (float)(uni(-1, 1) * gscale));
}

/* ---- the double-precision reference, with a first-order bound on the fp32 error -------- */

/* Each fp32 operation rounds once: |fl(x) - x| <= EPS32 |x| (+ TINY32 near zero). The bound
   below adds, operation by operation, that rounding (on the exact value) and the inherited
   errors of the operands times the operation's partial derivatives, so e_p, e_m, e_v bound
   |fp32 state - exact state| to first order. The coefficients are fp32 roundings of the
   exact ones (one more EPS32 on step_size, inv_sqrt_bc2 and decay). The test asserts
   |fp32 - reference| <= 2 * bound: the factor 2 covers the second-order terms (products
   of two EPS32-sized errors, < 1e-13 relative here). */
typedef struct ref {
    double p, m, v;
    double ep, em, ev;
    double mag; /* sum over steps of |p| + |update|: what the bound should be small against */
} ref;

typedef struct ref_coefs {
    double b1, b2, eps, step, ibc2, lw, l2; /* lw: AdamW's lr * wd */
} ref_coefs;

static ref_coefs ref_coefs_make(const zero_adam_desc *d, double wd, int64_t t)
{
    ref_coefs c;
    double lr = d->lr;
    c.b1 = d->beta1;
    c.b2 = d->beta2;
    c.eps = d->eps;
    c.step = lr / (1.0 - pow(c.b1, (double)t));
    c.ibc2 = 1.0 / sqrt(1.0 - pow(c.b2, (double)t));
    c.lw = d->mode == ZERO_ADAM ? 0.0 : lr * wd;
    c.l2 = d->mode == ZERO_ADAM ? wd : 0.0;
    return c;
}

static void ref_step(ref *s, double graw, double grad_mul, const ref_coefs *c)
{
    double g, eg, t1, et1, t2, et2, mm, em, vv, ev, sq, esq, den, eden, q, eq, pp, epp, pn, ep;
    double a1;
    g = graw * grad_mul;
    eg = EPS32 * fabs(g) + TINY32;
    if (c->l2 != 0.0) {
        g = c->l2 * s->p + g;
        eg = EPS32 * fabs(g) + TINY32 + c->l2 * s->ep + eg;
    }
    a1 = (1.0 - c->b1) * (g - s->m); /* w * fl(g - m), w = fl(1 - beta1) */
    mm = s->m + a1;                  /* the lerp m + w (g - m): one fma */
    /* the fma's rounding, the inherited errors (dm/dm = beta1, dm/dg = 1 - beta1), the
       rounding of g - m and the fp32 rounding of 1 - beta1 (each EPS32 |a1|) */
    em = EPS32 * fabs(mm) + TINY32 + c->b1 * s->em + (1.0 - c->b1) * eg + EPS32 * fabs(a1) +
         (1.0 - c->b1) * TINY32 + EPS32 * fabs(a1);
    t1 = (1.0 - c->b2) * g;
    et1 = EPS32 * fabs(t1) + TINY32 + (1.0 - c->b2) * eg + EPS32 * fabs(t1) /* 1 - beta2 */;
    t2 = t1 * g;
    et2 = EPS32 * fabs(t2) + TINY32 + fabs(g) * et1 + fabs(t1) * eg;
    vv = c->b2 * s->v + t2;
    ev = EPS32 * fabs(vv) + TINY32 + c->b2 * s->ev + et2 + EPS32 * c->b2 * s->v /* beta2 */;
    sq = sqrt(vv);
    /* sqrt(v + e) - sqrt(v) <= min(e / (2 sqrt v), sqrt e) */
    esq = EPS32 * sq + TINY32 + (sq > 0 ? fmin(ev / (2 * sq), sqrt(ev)) : sqrt(ev));
    den = sq * c->ibc2 + c->eps;
    eden = EPS32 * den + TINY32 + c->ibc2 * esq + EPS32 * c->ibc2 * sq + EPS32 * c->eps;
    q = mm / den;
    eq = EPS32 * fabs(q) + TINY32 + em / den + fabs(mm) * eden / (den * den);
    pp = s->p - c->lw * s->p; /* fmaf(-lw, p, p): one rounding, and -lw rounded to fp32 */
    epp = EPS32 * fabs(pp) + TINY32 + fabs(1.0 - c->lw) * s->ep + EPS32 * c->lw * fabs(s->p);
    pn = pp - c->step * q;
    ep = EPS32 * fabs(pn) + TINY32 + c->step * eq + EPS32 * c->step * fabs(q) + epp;
    s->p = pn;
    s->m = mm;
    s->v = vv;
    s->ep = ep;
    s->mag += fabs(pn) + c->step * fabs(q);
    s->em = em;
    s->ev = ev;
}

/* ---- reference comparisons -------------------------------------------------------------- */

static void param_matches_master(const bufs *b, const char *what)
{
    size_t i;
    if (!b->param) return;
    for (i = 0; i < b->n; i++) {
        int ok;
        if (b->param_dtype == ZERO_F16)
            ok = ((uint16_t *)b->param)[i] == zero_f32_to_f16(b->master[i]);
        else if (b->param_dtype == ZERO_BF16)
            ok = ((uint16_t *)b->param)[i] == zero_f32_to_bf16(b->master[i]);
        else
            ok = memcmp((float *)b->param + i, b->master + i, sizeof(float)) == 0;
        if (!ok) {
            ZT_CHECKF(0, "%s: param %zu is not the rounded master", what, i);
            return;
        }
    }
}

/* Runs 'steps' steps of one configuration on one path and compares every element with the
   reference after every step. Returns the largest error / bound ratio seen. */
static double run_against_reference(size_t n, zero_dtype gd, zero_dtype pd, zero_adam_mode mode,
                                    float wd, float grad_mul, zero_simd path, int threads,
                                    int fresh, int steps, unsigned long long seed)
{
    bufs b;
    ref *rs;
    zero_adam_desc in, d;
    size_t i;
    int t;
    double worst = 0;
    char what[160];
    snprintf(what, sizeof what, "n=%zu grad=%s param=%s %s wd=%g mul=%g %s threads=%d", n,
             zero_dtype_name(gd), pd ? zero_dtype_name(pd) : "none",
             mode == ZERO_ADAM ? "adam" : "adamw", (double)wd, (double)grad_mul,
             zero_simd_name(path), threads);
    zt_seed(seed);
    memset(&in, 0, sizeof in);
    in.mode = mode;
    in.lr = 0.01;
    in.weight_decay = wd;
    ZT_CHECK(zero_adam_desc_resolve(&d, &in) == ZERO_OK);
    bufs_alloc(&b, n, gd, pd);
    rs = (ref *)calloc(n + 1, sizeof(ref));
    fill_state(&b, fresh);
    for (i = 0; i < n; i++) {
        rs[i].p = b.master[i];
        rs[i].m = b.m[i];
        rs[i].v = b.v[i];
    }
    for (t = 1; t <= steps; t++) {
        zero_adam_coefs c;
        zero_adam_range r = bufs_range(&b);
        ref_coefs rc = ref_coefs_make(&d, wd, t);
        int bad = 0;
        fill_grads(&b, 1.0 / grad_mul);
        ZT_CHECK(zero_adam_coefs_make(&c, &d, wd, t) == ZERO_OK);
        ZT_CHECKF(zero_adam_host(&r, &c, grad_mul, path, threads) == ZERO_OK, "%s: %s", what,
                  zero_last_error());
        for (i = 0; i < n; i++) {
            double dp, dm, dv;
            ref_step(&rs[i], b.gval[i], grad_mul, &rc);
            dp = fabs((double)b.master[i] - rs[i].p);
            dm = fabs((double)b.m[i] - rs[i].m);
            dv = fabs((double)b.v[i] - rs[i].v);
            if (!(dp <= 2 * rs[i].ep && dm <= 2 * rs[i].em && dv <= 2 * rs[i].ev)) {
                if (bad++ < 3)
                    ZT_CHECKF(0, "%s step %d elem %zu: p %.9g vs %.9g (bound %.3g), m %.9g vs "
                                 "%.9g (%.3g), v %.9g vs %.9g (%.3g)",
                              what, t, i, (double)b.master[i], rs[i].p, 2 * rs[i].ep,
                              (double)b.m[i], rs[i].m, 2 * rs[i].em, (double)b.v[i], rs[i].v,
                              2 * rs[i].ev);
            }
            if (rs[i].ep > 0 && dp / rs[i].ep > worst) worst = dp / rs[i].ep;
            /* how often the bound is more than 32 roundings of the magnitudes involved
               (the master and the updates so far): legitimately so where the gradient
               cancels (Adam's wd * p + g), rarely otherwise */
            g_elems++;
            if (rs[i].ep > 32 * EPS32 * rs[i].mag + 1e-37) g_loose++;
        }
        param_matches_master(&b, what);
    }
    free(rs);
    bufs_free(&b);
    return worst;
}

ZT_TEST(matches_double_reference_small_sizes)
{
    static const size_t sizes[] = {1, 7, 15, 16, 17, 22};
    static const zero_dtype gds[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    static const zero_dtype pds[] = {(zero_dtype)0, ZERO_F32, ZERO_F16, ZERO_BF16};
    static const float muls[] = {1.0f, 0.3f, 1.0f / 1024};
    size_t s;
    int gi, mode, wdi, mi, p, k = 0;
    double worst = 0, w;
    find_paths();
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (gi = 0; gi < 3; gi++)
            for (mode = ZERO_ADAMW; mode <= ZERO_ADAM; mode++)
                for (wdi = 0; wdi < 2; wdi++)
                    for (mi = 0; mi < 3; mi++)
                        for (p = 0; p < g_num_paths; p++, k++) {
                            w = run_against_reference(sizes[s], gds[gi], pds[k % 4],
                                                      (zero_adam_mode)mode, wdi ? 0.1f : 0.0f,
                                                      muls[mi], g_paths[p], 1, k % 2, 5,
                                                      1000 + (unsigned long long)k);
                            if (w > worst) worst = w;
                        }
    printf("  %d configurations x 5 steps; largest error / bound = %.3f; bound wider than "
           "32 roundings: %ld of %ld\n",
           k, worst, g_loose, g_elems);
    /* the bound is tight enough to mean something: errors reach a good part of it, and it
       is wide only where cancellation makes it so */
    ZT_CHECK(worst > 0.1);
    ZT_CHECK(g_loose * 100 < g_elems);
}

ZT_TEST(matches_double_reference_1m)
{
    int p;
    double w;
    if (zt_quick()) ZT_SKIP("ZT_QUICK: 1M elements skipped");
    find_paths();
    g_elems = g_loose = 0;
    for (p = 0; p < g_num_paths; p++) {
        w = run_against_reference((size_t)1 << 20, ZERO_F16, ZERO_F16, ZERO_ADAMW, 0.01f,
                                  1.0f / 1024, g_paths[p], 2, 1, 3, 77);
        printf("  1M fp16 AdamW on %s: largest error / bound = %.3f\n",
               zero_simd_name(g_paths[p]), w);
        ZT_CHECK(w > 0.1);
        w = run_against_reference((size_t)1 << 20, ZERO_BF16, ZERO_BF16, ZERO_ADAM, 0.01f, 1.0f,
                                  g_paths[p], 3, 0, 2, 78);
        ZT_CHECK(w > 0.1);
    }
    ZT_CHECKF(g_loose * 1000 < g_elems, "%ld of %ld", g_loose, g_elems);
}

/* ---- bit identity --------------------------------------------------------------------------- */

/* Copies b's state and grads into a fresh bufs of the same shape. */
static void bufs_copy(bufs *dst, const bufs *src)
{
    bufs_alloc(dst, src->n, src->grad_dtype, src->param_dtype);
    memcpy(dst->master, src->master, src->n * sizeof(float));
    memcpy(dst->m, src->m, src->n * sizeof(float));
    memcpy(dst->v, src->v, src->n * sizeof(float));
    memcpy(dst->grad, src->grad, src->n * zero_dtype_size(src->grad_dtype));
}

static int bufs_same(const bufs *a, const bufs *b, size_t a0, size_t b0, size_t n)
{
    size_t ps = a->param_dtype ? zero_dtype_size(a->param_dtype) : 0;
    return memcmp(a->master + a0, b->master + b0, n * sizeof(float)) == 0 &&
           memcmp(a->m + a0, b->m + b0, n * sizeof(float)) == 0 &&
           memcmp(a->v + a0, b->v + b0, n * sizeof(float)) == 0 &&
           (!ps || memcmp((char *)a->param + a0 * ps, (char *)b->param + b0 * ps, n * ps) == 0);
}

static void make_coefs(zero_adam_coefs *c, zero_adam_mode mode, float wd, int64_t t)
{
    zero_adam_desc d;
    memset(&d, 0, sizeof d);
    d.mode = mode;
    d.lr = 3e-3;
    d.weight_decay = wd;
    zero_adam_coefs_make(c, &d, wd, t);
}

ZT_TEST(paths_and_thread_counts_give_identical_bits)
{
    static const zero_dtype gds[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    static const zero_dtype pds[] = {(zero_dtype)0, ZERO_F32, ZERO_F16, ZERO_BF16};
    size_t n = zt_quick() ? 3001 : 100003;
    int gi, pi, p, th;
    find_paths();
    zt_seed(5);
    for (gi = 0; gi < 3; gi++)
        for (pi = 0; pi < 4; pi++) {
            bufs base, first;
            zero_adam_coefs c;
            int have_first = 0;
            bufs_alloc(&base, n, gds[gi], pds[pi]);
            fill_state(&base, 0);
            fill_grads(&base, 100.0);
            make_coefs(&c, pi % 2 ? ZERO_ADAM : ZERO_ADAMW, 0.05f, 3 + gi);
            for (p = 0; p < g_num_paths; p++)
                for (th = 1; th <= 4; th++) {
                    bufs b;
                    zero_adam_range r;
                    memset(&r, 0, sizeof r);
                    bufs_copy(&b, &base);
                    r = bufs_range(&b);
                    ZT_CHECK(zero_adam_host(&r, &c, 0.01f, g_paths[p], th) == ZERO_OK);
                    if (!have_first) {
                        first = b;
                        have_first = 1;
                        continue;
                    }
                    ZT_CHECKF(bufs_same(&first, &b, 0, 0, n), "grad %s param %s: %s threads %d",
                              zero_dtype_name(gds[gi]), zero_dtype_name(pds[pi]),
                              zero_simd_name(g_paths[p]), th);
                    bufs_free(&b);
                }
            {
                /* AUTO is one of the above */
                bufs b;
                zero_adam_range r;
                memset(&r, 0, sizeof r);
                bufs_copy(&b, &base);
                r = bufs_range(&b);
                ZT_CHECK(zero_adam_host(&r, &c, 0.01f, ZERO_SIMD_AUTO, 0) == ZERO_OK);
                ZT_CHECK(bufs_same(&first, &b, 0, 0, n));
                bufs_free(&b);
            }
            bufs_free(&first);
            bufs_free(&base);
        }
}

ZT_TEST(element_update_does_not_depend_on_its_offset)
{
    const size_t len = 40, pad = 23;
    size_t o, i;
    int p, k;
    find_paths();
    for (k = 0; k < 3; k++) { /* grad f32/f16/bf16, param none/f16/bf16 */
        zero_dtype gd = k == 0 ? ZERO_F32 : k == 1 ? ZERO_F16 : ZERO_BF16;
        zero_dtype pd = k == 0 ? (zero_dtype)0 : k == 1 ? ZERO_F16 : ZERO_BF16;
        bufs data, at0;
        zero_adam_coefs c;
        zt_seed(100 + (unsigned long long)k);
        bufs_alloc(&data, len, gd, pd);
        fill_state(&data, 0);
        fill_grads(&data, 10.0);
        make_coefs(&c, ZERO_ADAMW, 0.1f, 7);
        at0.n = 0;
        for (p = 0; p < g_num_paths; p++)
            for (o = 0; o <= 17; o++) {
                bufs big;
                zero_adam_range r;
                memset(&r, 0, sizeof r);
                bufs_alloc(&big, o + len + pad, gd, pd);
                fill_state(&big, 0);
                fill_grads(&big, 10.0); /* filler around the data */
                for (i = 0; i < len; i++) {
                    big.master[o + i] = data.master[i];
                    big.m[o + i] = data.m[i];
                    big.v[o + i] = data.v[i];
                    memcpy((char *)big.grad + (o + i) * zero_dtype_size(gd),
                           (char *)data.grad + i * zero_dtype_size(gd), zero_dtype_size(gd));
                }
                r = bufs_range(&big);
                ZT_CHECK(zero_adam_host(&r, &c, 0.5f, g_paths[p], 1) == ZERO_OK);
                if (at0.n == 0) {
                    at0 = big; /* portable, offset 0: the reference */
                    continue;
                }
                ZT_CHECKF(bufs_same(&at0, &big, 0, o, len), "%s offset %zu grad %s",
                          zero_simd_name(g_paths[p]), o, zero_dtype_name(gd));
                bufs_free(&big);
            }
        bufs_free(&at0);
        bufs_free(&data);
    }
}

ZT_TEST(nonfinite_gradients_give_nan_on_every_path)
{
    /* The engine skips such steps; here only: no path hides a NaN/inf. (NaN payloads are
       not promised equal across paths, finite results are.) */
    float g[20];
    int p;
    size_t i;
    zero_adam_coefs c;
    find_paths();
    make_coefs(&c, ZERO_ADAMW, 0.0f, 1);
    for (p = 0; p < g_num_paths; p++) {
        float mast[20], m[20], v[20];
        zero_adam_range r;
        memset(&r, 0, sizeof r);
        for (i = 0; i < 20; i++) {
            g[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
            mast[i] = 1;
            m[i] = 0;
            v[i] = 0;
        }
        memset(&r, 0, sizeof r);
        r.numel = 20;
        r.master = mast;
        r.m = m;
        r.v = v;
        r.grad = g;
        r.grad_dtype = ZERO_F32;
        ZT_CHECK(zero_adam_host(&r, &c, 1.0f, g_paths[p], 1) == ZERO_OK);
        for (i = 0; i < 20; i++) ZT_CHECKF(isnan(mast[i]), "%s elem %zu", zero_simd_name(g_paths[p]), i);
    }
}

/* The param copy from 16 elements a step (a bf16 pair rounded together, 6 operations a
   vector with a NaN-free fast path) and from streaming stores (forced here at any size; by
   default only past the last-level cache): whatever the alignment of the copy, the thread
   count and the path, each param is its master converted by the scalar function, and the
   streamed run has the same bits as the ordinary one. Zero grads and moments and no decay
   leave the masters as set (but -0 and inf), so the edge cases of the rounding are hit:
   ties either way, the carry into the exponent, overflow to inf, subnormals, NaNs. */
static uint32_t param_bits(const void *param, zero_dtype pd, size_t i)
{
    if (pd == ZERO_F32) {
        uint32_t u;
        memcpy(&u, (const float *)param + i, 4);
        return u;
    }
    return ((const uint16_t *)param)[i];
}

static uint32_t master_converted(float x, zero_dtype pd)
{
    uint32_t u;
    if (pd == ZERO_F16) return zero_f32_to_f16(x);
    if (pd == ZERO_BF16) return zero_f32_to_bf16(x);
    memcpy(&u, &x, 4);
    return u;
}

ZT_TEST(param_copy_is_the_master_converted_streamed_or_not)
{
    static const uint32_t edges[] = {
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, /* ties: down, up (both signs) */
        0x3f808001u, 0x3f807fffu, 0x3fffffffu, 0x3f7fffffu, /* above, below a tie; carries */
        0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, /* overflow to inf, or not */
        0x00008000u, 0x00018000u, 0x80018000u, 0x00007fffu, /* subnormal ties, below one */
        0x00000001u, 0x807fffffu, 0x00800000u, 0x80000000u, /* least, largest subnormal */
        0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, /* inf, NaNs (quiet, signalling) */
        0xffffffffu, 0x7fbfffffu, 0x477fe000u, 0x477ff000u, /* NaNs; fp16 overflow edges */
        0x33000000u, 0x33000001u, 0x387fc000u, 0x38800000u  /* fp16 subnormal edges */
    };
    static const zero_dtype pds[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    const size_t n = 301, nedges = sizeof edges / sizeof edges[0];
    float *m0 = (float *)malloc(n * sizeof(float)), *mast = (float *)malloc(n * sizeof(float));
    float *m = (float *)calloc(n, sizeof(float)), *v = (float *)calloc(n, sizeof(float));
    float *g = (float *)calloc(n, sizeof(float)), *ref = (float *)malloc(n * sizeof(float));
    unsigned char *raw = (unsigned char *)malloc(n * 4 + 64 + 18 * 4), *ref_param = (unsigned char *)malloc(n * 4);
    size_t i;
    int p, pi, stream, off, th, runs = 0;
    zero_adam_coefs c;
    ZT_CHECK(m0 && mast && m && v && g && ref && raw && ref_param);
    if (!(m0 && mast && m && v && g && ref && raw && ref_param)) goto done;
    find_paths();
    make_coefs(&c, ZERO_ADAMW, 0.0f, 1);
    zt_seed(31);
    for (i = 0; i < n; i++) {
        uint32_t u = i < 2 * nedges ? edges[i % nedges] : (uint32_t)zt_rand64();
        memcpy(&m0[i], &u, 4);
    }
    for (p = 0; p < g_num_paths; p++)
        for (pi = 0; pi < 3; pi++) {
            size_t ps = zero_dtype_size(pds[pi]);
            for (stream = 0; stream <= 1; stream++)
                for (off = 0; off <= 17; off++)
                    for (th = 1; th <= 3; th += 2) {
                        /* the copy starts off elements past a 64-byte boundary */
                        unsigned char *param = raw + (64 - (uintptr_t)raw % 64) + (size_t)off * ps;
                        zero_adam_range r;
                        memset(&r, 0, sizeof r);
                        memcpy(mast, m0, n * sizeof(float));
                        memset(m, 0, n * sizeof(float));
                        memset(v, 0, n * sizeof(float));
                        memset(param, 0xa5, n * ps);
                        r.numel = n;
                        r.master = mast;
                        r.m = m;
                        r.v = v;
                        r.grad = g;
                        r.grad_dtype = ZERO_F32;
                        r.param = param;
                        r.param_dtype = pds[pi];
                        zt_set_adam_stream_bytes(stream ? 1 : 0);
                        ZT_CHECK(zero_adam_host(&r, &c, 1.0f, g_paths[p], th) == ZERO_OK);
                        zt_set_adam_stream_bytes(0);
                        for (i = 0; i < n; i++)
                            if (param_bits(param, pds[pi], i) != master_converted(mast[i], pds[pi])) break;
                        ZT_CHECKF(i == n, "%s param %s stream %d offset %d threads %d: element %zu "
                                  "master 0x%08x (was 0x%08x) param 0x%x, converted 0x%x",
                                  zero_simd_name(g_paths[p]), zero_dtype_name(pds[pi]), stream, off, th,
                                  i, i < n ? (unsigned)master_converted(mast[i], ZERO_F32) : 0u,
                                  i < n ? (unsigned)master_converted(m0[i], ZERO_F32) : 0u,
                                  i < n ? (unsigned)param_bits(param, pds[pi], i) : 0u,
                                  i < n ? (unsigned)master_converted(mast[i], pds[pi]) : 0u);
                        if (stream == 0 && off == 0 && th == 1) { /* this path's reference */
                            memcpy(ref, mast, n * sizeof(float));
                            memcpy(ref_param, param, n * ps);
                        } else {
                            ZT_CHECKF(memcmp(ref, mast, n * sizeof(float)) == 0 &&
                                          memcmp(ref_param, param, n * ps) == 0,
                                      "%s param %s stream %d offset %d threads %d: other bits",
                                      zero_simd_name(g_paths[p]), zero_dtype_name(pds[pi]), stream, off, th);
                        }
                        runs++;
                    }
        }
    printf("  %d runs x %zu elements (%zu edge patterns)\n", runs, n, nedges);
done:
    free(m0);
    free(mast);
    free(m);
    free(v);
    free(g);
    free(ref);
    free(raw);
    free(ref_param);
}

/* Streaming stores on real updates: every path with the copy streamed (forced) gives the
   bits of the portable loop, at any thread count. */
ZT_TEST(streamed_param_copy_gives_identical_bits)
{
    static const zero_dtype gds[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    static const zero_dtype pds[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    size_t n = zt_quick() ? 3001 : 40009;
    int gi, pi, p, th;
    find_paths();
    zt_seed(6);
    for (gi = 0; gi < 3; gi++)
        for (pi = 0; pi < 3; pi++) {
            bufs base, first;
            zero_adam_coefs c;
            zero_adam_range r;
            bufs_alloc(&base, n, gds[gi], pds[pi]);
            fill_state(&base, 0);
            fill_grads(&base, 100.0);
            make_coefs(&c, pi % 2 ? ZERO_ADAM : ZERO_ADAMW, 0.05f, 3 + gi);
            bufs_copy(&first, &base);
            r = bufs_range(&first);
            ZT_CHECK(zero_adam_host(&r, &c, 0.01f, ZERO_SIMD_PORTABLE, 1) == ZERO_OK);
            for (p = 0; p < g_num_paths; p++)
                for (th = 1; th <= 3; th++) {
                    bufs b;
                    bufs_copy(&b, &base);
                    r = bufs_range(&b);
                    zt_set_adam_stream_bytes(1);
                    ZT_CHECK(zero_adam_host(&r, &c, 0.01f, g_paths[p], th) == ZERO_OK);
                    zt_set_adam_stream_bytes(0);
                    ZT_CHECKF(bufs_same(&first, &b, 0, 0, n), "grad %s param %s: %s threads %d",
                              zero_dtype_name(gds[gi]), zero_dtype_name(pds[pi]),
                              zero_simd_name(g_paths[p]), th);
                    bufs_free(&b);
                }
            bufs_free(&first);
            bufs_free(&base);
        }
}

/* ---- coefficients ---------------------------------------------------------------------------- */

ZT_TEST(coefs_are_the_double_formulas_rounded_once)
{
    static const int64_t steps[] = {1, 2, 3, 10, 100, 1000, 12345, 1000000, 1000000000};
    static const double lrs[] = {1e-3, 3e-4, 0.1};
    size_t s, l;
    int mode;
    for (mode = ZERO_ADAMW; mode <= ZERO_ADAM; mode++)
        for (l = 0; l < 3; l++)
            for (s = 0; s < sizeof steps / sizeof steps[0]; s++) {
                zero_adam_desc d;
                zero_adam_coefs c;
                double t = (double)steps[s], lr = lrs[l], b1 = 0.8, b2 = 0.95, wd = 0.1;
                memset(&d, 0, sizeof d);
                d.mode = (zero_adam_mode)mode;
                d.lr = lrs[l];
                d.beta1 = 0.8;
                d.beta2 = 0.95;
                d.eps = 1e-6;
                d.weight_decay = 0.5; /* the per-tensor value below wins */
                ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.1, steps[s]) == ZERO_OK);
                ZT_CHECK(c.beta1 == (float)0.8 && c.beta2 == (float)0.95 && c.eps == (float)1e-6);
                /* 1 - beta from the double beta, not from the fp32 one */
                ZT_CHECK(c.one_minus_beta1 == (float)(1.0 - b1));
                ZT_CHECK(c.one_minus_beta2 == (float)(1.0 - b2));
                ZT_CHECK(c.one_minus_beta2 != (float)(1.0 - (double)(float)b2));
                ZT_CHECKF(c.step_size == (float)(lr / (1.0 - pow(b1, t))), "step %lld",
                          (long long)steps[s]);
                ZT_CHECK(c.inv_sqrt_bc2 == (float)(1.0 / sqrt(1.0 - pow(b2, t))));
                if (mode == ZERO_ADAMW) {
                    ZT_CHECK(c.neg_lr_wd == (float)-(lr * wd) && c.l2 == 0.0f);
                } else {
                    ZT_CHECK(c.neg_lr_wd == 0.0f && c.l2 == (float)0.1);
                }
            }
    {
        /* step 1 with the defaults: bias corrections 1 - 0.9 and 1 - 0.999 in double */
        zero_adam_desc d;
        zero_adam_coefs c;
        ZT_CHECK(zero_adam_desc_resolve(&d, NULL) == ZERO_OK);
        ZT_CHECK(d.mode == ZERO_ADAMW && d.lr == 1e-3 && d.beta1 == 0.9 && d.beta2 == 0.999 &&
                 d.eps == 1e-8 && d.weight_decay == 0.0);
        ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.0, 1) == ZERO_OK);
        ZT_CHECK(c.step_size == (float)(1e-3 / (1.0 - 0.9)));
        ZT_CHECK(c.inv_sqrt_bc2 == (float)(1.0 / sqrt(1.0 - 0.999)));
        ZT_CHECK(c.one_minus_beta2 == 1e-3f);
        ZT_CHECK(c.neg_lr_wd == 0.0f && c.l2 == 0.0f);
    }
}

/* ---- errors ------------------------------------------------------------------------------------ */

ZT_TEST(desc_and_coefs_errors_name_the_field)
{
    static const struct {
        const char *field;
        zero_adam_desc d;
    } bad[] = {
        {"lr", {ZERO_ADAMW, -1e-3f, 0, 0, 0, 0}},
        {"lr", {ZERO_ADAMW, NAN, 0, 0, 0, 0}},
        {"lr", {ZERO_ADAMW, INFINITY, 0, 0, 0, 0}},
        {"beta1", {ZERO_ADAMW, 0, 1.0f, 0, 0, 0}},
        {"beta1", {ZERO_ADAMW, 0, -0.5f, 0, 0, 0}},
        {"beta1", {ZERO_ADAMW, 0, NAN, 0, 0, 0}},
        {"beta2", {ZERO_ADAMW, 0, 0, 1.5f, 0, 0}},
        {"eps", {ZERO_ADAMW, 0, 0, 0, -1e-8f, 0}},
        {"eps", {ZERO_ADAMW, 0, 0, 0, INFINITY, 0}},
        {"weight_decay", {ZERO_ADAM, 0, 0, 0, 0, -0.1f}},
        {"weight_decay", {ZERO_ADAM, 0, 0, 0, 0, NAN}},
        {"mode", {(zero_adam_mode)9, 0, 0, 0, 0, 0}},
    };
    /* valid doubles whose fp32 constants are not usable */
    static const zero_adam_desc bad32[] = {
        {ZERO_ADAMW, 0, 1.0 - 1e-9, 0, 0, 0}, /* beta1 rounds to 1.0f */
        {ZERO_ADAMW, 0, 0, 1.0 - 1e-10, 0, 0},
        {ZERO_ADAMW, 0, 0, 0, 1e-60, 0},       /* eps rounds to 0.0f   */
    };
    size_t i;
    zero_adam_desc out, before;
    zero_adam_coefs c, cbefore;
    memset(&out, 0x5a, sizeof out);
    before = out;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ZT_CHECKF(zero_adam_desc_resolve(&out, &bad[i].d) == ZERO_ERROR_INVALID_ARGUMENT,
                  "case %zu", i);
        ZT_CHECKF(strstr(zero_last_error(), bad[i].field) != NULL, "case %zu: %s", i,
                  zero_last_error());
        ZT_CHECK(memcmp(&out, &before, sizeof out) == 0);
        ZT_CHECK(zero_adam_coefs_make(&c, &bad[i].d, 0.0f, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    }
    for (i = 0; i < sizeof bad32 / sizeof bad32[0]; i++) {
        ZT_CHECK(zero_adam_desc_resolve(&out, &bad32[i]) == ZERO_OK);
        ZT_CHECKF(zero_adam_coefs_make(&c, &bad32[i], 0.0, 1) == ZERO_ERROR_INVALID_ARGUMENT,
                  "fp32 case %zu", i);
        ZT_CHECK(strstr(zero_last_error(), "fp32") != NULL);
    }
    ZT_CHECK(zero_adam_desc_resolve(NULL, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_adam_desc_resolve(&out, NULL) == ZERO_OK);
    memset(&c, 0x33, sizeof c);
    cbefore = c;
    ZT_CHECK(zero_adam_coefs_make(&c, &out, 0.0f, 0) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "step") != NULL);
    ZT_CHECK(zero_adam_coefs_make(&c, &out, 0.0f, -5) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_adam_coefs_make(&c, &out, -1.0f, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "weight_decay") != NULL);
    ZT_CHECK(zero_adam_coefs_make(&c, &out, NAN, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_adam_coefs_make(&c, NULL, 0.0f, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_adam_coefs_make(NULL, &out, 0.0f, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(memcmp(&c, &cbefore, sizeof c) == 0);
    {
        zero_adam_desc huge = out; /* lr / (1 - beta1) past FLT_MAX */
        huge.lr = FLT_MAX;
        ZT_CHECK(zero_adam_coefs_make(&c, &huge, 0.0f, 1) == ZERO_ERROR_INVALID_ARGUMENT);
        huge = out; /* AdamW's lr * wd past FLT_MAX */
        huge.lr = 1e20;
        ZT_CHECK(zero_adam_coefs_make(&c, &huge, 0.0, 1) == ZERO_OK);
        ZT_CHECK(zero_adam_coefs_make(&c, &huge, 1e20, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    }
}

ZT_TEST(host_errors_write_nothing)
{
    float master[8] = {1, 2, 3, 4, 5, 6, 7, 8}, m[8] = {0}, v[8] = {0}, g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    float m0[8];
    uint16_t ph[8] = {0};
    zero_adam_range r, ok;
    zero_adam_coefs c;
    memset(&r, 0, sizeof r);
    make_coefs(&c, ZERO_ADAMW, 0.0f, 1);
    memset(&ok, 0, sizeof ok);
    ok.numel = 8;
    ok.master = master;
    ok.m = m;
    ok.v = v;
    ok.grad = g;
    ok.grad_dtype = ZERO_F32;
    ok.param = ph;
    ok.param_dtype = ZERO_F16;
    memcpy(m0, master, sizeof m0);
#define HOST_ERR(expr, code)                                                                 \
    do {                                                                                     \
        zero_result r_ = (expr);                                                             \
        ZT_CHECKF(r_ == (code), "%s: %d", #expr, (int)r_);                                   \
        ZT_CHECK(zero_last_error()[0] != '\0');                                              \
        ZT_CHECK(memcmp(master, m0, sizeof m0) == 0 && ph[0] == 0 && m[0] == 0);            \
    } while (0)
    HOST_ERR(zero_adam_host(NULL, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    HOST_ERR(zero_adam_host(&ok, NULL, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    r = ok;
    r.master = NULL;
    HOST_ERR(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "master") != NULL);
    r = ok;
    r.v = NULL;
    HOST_ERR(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    r = ok;
    r.grad = NULL;
    HOST_ERR(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    r = ok;
    r.grad_dtype = ZERO_F64;
    HOST_ERR(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "grad_dtype") != NULL);
    r.grad_dtype = (zero_dtype)17;
    HOST_ERR(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    r.grad_dtype = ZERO_DTYPE_DEFAULT;
    HOST_ERR(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    r = ok;
    r.param_dtype = ZERO_F64;
    HOST_ERR(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1), ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "param_dtype") != NULL);
    HOST_ERR(zero_adam_host(&ok, &c, 1.0f, (zero_simd)9, 1), ZERO_ERROR_INVALID_ARGUMENT);
    HOST_ERR(zero_adam_host(&ok, &c, 1.0f, ZERO_SIMD_AUTO, -1), ZERO_ERROR_INVALID_ARGUMENT);
    /* ZERO_SIMD lowers what detect says, not what the CPU can: only without it does a
       detected path below AVX-512 mean the CPU lacks it */
    if (zero_simd_detect() < ZERO_SIMD_AVX512 && !getenv("ZERO_SIMD"))
        HOST_ERR(zero_adam_host(&ok, &c, 1.0f, ZERO_SIMD_AVX512, 1), ZERO_ERROR_UNSUPPORTED);
#undef HOST_ERR
    /* numel 0: NULL pointers are fine and nothing happens */
    memset(&r, 0, sizeof r);
    r.grad_dtype = ZERO_F16;
    ZT_CHECK(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 4) == ZERO_OK);
    /* param NULL: its dtype is not looked at */
    r = ok;
    r.param = NULL;
    r.param_dtype = (zero_dtype)99;
    ZT_CHECK(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1) == ZERO_OK);
    ZT_CHECK(ph[0] == 0 && master[0] != 1.0f);
    /* many threads on a few elements: still every element, once */
    {
        float a[5] = {1, 1, 1, 1, 1}, am[5] = {0}, av[5] = {0}, ag[5] = {1, 1, 1, 1, 1};
        zero_adam_range s;
        size_t i;
        memset(&s, 0, sizeof s);
        s.numel = 5;
        s.master = a;
        s.m = am;
        s.v = av;
        s.grad = ag;
        s.grad_dtype = ZERO_F32;
        ZT_CHECK(zero_adam_host(&s, &c, 1.0f, ZERO_SIMD_AUTO, 1000) == ZERO_OK);
        for (i = 0; i < 5; i++) ZT_CHECK(am[i] == c.one_minus_beta1 && a[i] < 1.0f);
    }
}

/* ---- fidelity to a float64 AdamW -------------------------------------------------------------- */

/* Distance in units of the last place of the fp32 value nearest 'ref'. */
static double ulps(float got, double ref)
{
    float r = (float)ref;
    double ulp = (double)nextafterf(fabsf(r), INFINITY) - (double)fabsf(r);
    return fabs((double)got - ref) / ulp;
}

/* Adam's second moment at the default beta2 = 0.999 after T steps from v = 0, against a
   float64 AdamW with beta2 exactly 0.999. Bound: each step adds at most four roundings of
   2^-24 of v (the product (1 - beta2) g, its product with g, the multiply-add, and the
   fp32 1 - beta2 itself), and the fp32 beta2 = 0.999 (1 + d), |d| < 1.3e-8, scales a term
   of age a by (1 + d)^a: relative error <= T * (4 * 2^-24 + 2.7e-8), 2 ulp per 2^-24 (the
   2.7e-8 is beta1 = 0.9's; m, which cancels, is measured against its terms' magnitude). With 1 - beta2 taken from the float 0.99900001 (the old desc), v was off by
   1.3e-5 relative, about 220 ulp, from the first step: far outside the bound. */
ZT_TEST(v_at_beta2_0999_is_within_a_few_ulp_of_float64)
{
    const int T = 10;
    size_t n = zt_quick() ? 1000 : 20000, i;
    bufs b;
    double *rm, *rv, *ra, worst_v = 0, worst_m = 0, bound;
    zero_adam_desc d;
    int t;
    zt_seed(42);
    ZT_CHECK(zero_adam_desc_resolve(&d, NULL) == ZERO_OK); /* beta1 0.9, beta2 0.999 */
    bufs_alloc(&b, n, ZERO_F32, (zero_dtype)0);
    rm = (double *)calloc(n, sizeof(double));
    rv = (double *)calloc(n, sizeof(double));
    ra = (double *)calloc(n, sizeof(double)); /* m's terms in magnitude: m cancels, v does not */
    for (i = 0; i < n; i++) b.master[i] = (float)uni(-1, 1);
    for (t = 1; t <= T; t++) {
        zero_adam_coefs c;
        zero_adam_range r = bufs_range(&b);
        for (i = 0; i < n; i++) set_grad(&b, i, (float)(uni(0.1, 1) * (zt_rand64() & 1 ? 1 : -1)));
        ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.0, t) == ZERO_OK);
        ZT_CHECK(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1) == ZERO_OK);
        for (i = 0; i < n; i++) {
            double g = b.gval[i];
            rm[i] = 0.9 * rm[i] + (1.0 - 0.9) * g;
            ra[i] = 0.9 * ra[i] + (1.0 - 0.9) * fabs(g);
            rv[i] = 0.999 * rv[i] + (1.0 - 0.999) * g * g;
        }
    }
    for (i = 0; i < n; i++) {
        /* m: in units of 2^-24 of its terms' magnitude (beta1 = 0.9f is off by 2.7e-8) */
        double uv = ulps(b.v[i], rv[i]), um = fabs((double)b.m[i] - rm[i]) / (ra[i] * EPS32);
        if (uv > worst_v) worst_v = uv;
        if (um > worst_m) worst_m = um;
    }
    bound = 2.0 * T * (4.0 + 2.7e-8 * 16777216.0);
    printf("  after %d steps at beta2 = 0.999: v within %.2f ulp, m within %.2f x 2^-24 of float64 "
           "(bound %.1f ulp)\n", T, worst_v, worst_m, bound);
    ZT_CHECKF(worst_v <= bound, "v: %.2f ulp", worst_v);
    ZT_CHECKF(worst_m <= bound, "m: %.2f ulp", worst_m);
    free(rm);
    free(rv);
    free(ra);
    bufs_free(&b);
}

/* AdamW's decay p - lr*wd*p is rounded once (fmaf with -lr*wd in fp32): with zero gradient
   and moments, the update is exactly that, so each master must be within half an ulp (plus
   the fp32 rounding of lr*wd, < lr*wd ulp) of the float64 p * (1 - lr*wd), on every path.
   The old form, p * (float)(1 - lr*wd), quantises the factor (by up to 3e-8 absolute,
   +19% of lr*wd at 1e-7) and misses this bound: checked below, so the test can fail. */
ZT_TEST(small_weight_decay_is_rounded_once)
{
    static const double lws[] = {1e-5, 1e-6, 1e-7, 1e-8};
    size_t n = zt_quick() ? 2001 : 20001, i, k;
    int p;
    find_paths();
    zt_seed(7);
    for (k = 0; k < sizeof lws / sizeof lws[0]; k++)
        for (p = 0; p < g_num_paths; p++) {
            bufs b;
            float *p0 = (float *)malloc(n * sizeof(float));
            zero_adam_desc d;
            zero_adam_coefs c;
            zero_adam_range r;
            double lr = 1e-3, wd = lws[k] / lr, worst = 0, worst_old = 0;
            memset(&r, 0, sizeof r);
            memset(&d, 0, sizeof d);
            d.mode = ZERO_ADAMW;
            d.lr = lr;
            d.weight_decay = wd;
            bufs_alloc(&b, n, ZERO_F32, ZERO_F32);
            for (i = 0; i < n; i++) { /* magnitudes from 2^-20 to 2^20, both signs */
                p0[i] = (float)(ldexp(uni(1, 2), (int)(zt_rand64() % 41) - 20) *
                                (zt_rand64() & 1 ? 1 : -1));
                b.master[i] = p0[i];
                set_grad(&b, i, 0.0f);
            }
            ZT_CHECK(zero_adam_coefs_make(&c, &d, wd, 1) == ZERO_OK);
            r = bufs_range(&b);
            ZT_CHECK(zero_adam_host(&r, &c, 1.0f, g_paths[p], 1) == ZERO_OK);
            for (i = 0; i < n; i++) {
                double ref = (double)p0[i] * (1.0 - lr * wd);
                double u = ulps(b.master[i], ref);
                double uo = ulps(p0[i] * (float)(1.0 - lr * wd), ref);
                if (u > worst) worst = u;
                if (uo > worst_old) worst_old = uo;
            }
            ZT_CHECKF(worst <= 0.5 + lws[k] + 1e-9, "lr*wd = %g on %s: %.4f ulp from float64",
                      lws[k], zero_simd_name(g_paths[p]), worst);
            if (lws[k] == 1e-6 || lws[k] == 1e-7)
                ZT_CHECKF(worst_old > 0.5 + lws[k] + 1e-9, "lr*wd = %g: quantised factor %.4f ulp",
                          lws[k], worst_old);
            if (p == 0)
                printf("  lr*wd = %g: decay within %.4f ulp of float64 (a quantised factor: %.4f)\n",
                       lws[k], worst, worst_old);
            free(p0);
            bufs_free(&b);
        }
}

/* ---- m in torch's lerp form ------------------------------------------------------------------ */

/* a + b rounded once to float, to nearest even, for doubles a, b: s = a + b and its exact
   error e (Knuth's two-sum); s rounds to the right float unless it sits exactly on a
   midpoint between two floats, where the sign of e decides (s + e lies within half a
   double ulp of s, and every float midpoint is a double). */
static float sum_rounded_once(double a, double b)
{
    double s = a + b, bb = s - a, e = (a - (s - bb)) + (b - bb), lo, hi;
    float f = (float)s;
    if ((double)f == s) return f;
    lo = (double)f < s ? (double)f : (double)nextafterf(f, -INFINITY);
    hi = (double)f > s ? (double)f : (double)nextafterf(f, INFINITY);
    if (s - lo == hi - s && e != 0.0) return (float)(e > 0 ? hi : lo);
    return f;
}

/* torch's Adam updates m as exp_avg.lerp_(grad, 1 - beta1): m + w (g - m) with w the fp32
   1 - beta1 and g - m an fp32 difference, one multiply-add (its vectorised lerp is an fma
   for weights below 0.5). Every path's m must be that value rounded once, computed here in
   double with an exact rounding step (no fmaf); the previous form fmaf(beta1, m, w g) is
   checked to differ, so the test can fail. */
ZT_TEST(m_is_torchs_lerp_rounded_once)
{
    static const zero_dtype gds[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    size_t n = zt_quick() ? 4001 : 40001, i;
    int p, k, t;
    find_paths();
    for (k = 0; k < 3; k++)
        for (p = 0; p < g_num_paths; p++) {
            bufs b;
            float *m0 = (float *)malloc(n * sizeof(float));
            zero_adam_desc d;
            long bad = 0, old_differs = 0;
            zt_seed(11 + (unsigned long long)k);
            ZT_CHECK(zero_adam_desc_resolve(&d, NULL) == ZERO_OK);
            bufs_alloc(&b, n, gds[k], ZERO_F16);
            fill_state(&b, 0);
            for (t = 1; t <= 3; t++) {
                zero_adam_coefs c;
                zero_adam_range r = bufs_range(&b);
                fill_grads(&b, t == 2 ? 1e-3 : 1.0);
                memcpy(m0, b.m, n * sizeof(float));
                ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.0, t) == ZERO_OK);
                ZT_CHECK(zero_adam_host(&r, &c, 1.0f, g_paths[p], 1) == ZERO_OK);
                for (i = 0; i < n; i++) {
                    float diff = b.gval[i] - m0[i];
                    float want = sum_rounded_once((double)m0[i],
                                                  (double)c.one_minus_beta1 * (double)diff);
                    float old = fmaf(c.beta1, m0[i], c.one_minus_beta1 * b.gval[i]);
                    if (memcmp(&want, &b.m[i], sizeof want) != 0 && bad++ < 3)
                        ZT_CHECKF(0, "grad %s %s step %d elem %zu: m %.9g, lerp %.9g",
                                  zero_dtype_name(gds[k]), zero_simd_name(g_paths[p]), t, i,
                                  (double)b.m[i], (double)want);
                    old_differs += old != want;
                }
            }
            ZT_CHECKF(old_differs > 0, "the old form never differed: the test cannot tell");
            if (k == 0 && p == 0)
                printf("  m is the lerp rounded once on every path; fmaf(beta1, m, (1-beta1) g) "
                       "differs in %.1f%% of element-steps\n",
                       100.0 * (double)old_differs / (3.0 * (double)n));
            free(m0);
            bufs_free(&b);
        }
}

/* p against a float64 AdamW (betas, eps, lr, decay exact doubles) over T steps: the mean
   distance in ulp, with m in the lerp form (every path) and in the previous form
   fmaf(beta1, m, (1 - beta1) g) (the scalar expression, reproduced here). The lerp form's
   m has one rounding of g - m and one of the fma, where the previous form carries the fp32
   beta1's 2.7e-8 relative error into every step: its mean must be lower. */
ZT_TEST(p_mean_error_against_float64_lerp_below_previous_form)
{
    const int T = 20;
    size_t n = zt_quick() ? 20000 : 200000, i;
    bufs b;
    float *op, *om, *ov;
    double *rp, *rm, *rv, sum_new = 0, sum_old = 0;
    zero_adam_desc d;
    int t;
    zt_seed(5);
    memset(&d, 0, sizeof d);
    d.weight_decay = 0.01;
    ZT_CHECK(zero_adam_desc_resolve(&d, &d) == ZERO_OK); /* lr 1e-3, 0.9, 0.999, 1e-8 */
    bufs_alloc(&b, n, ZERO_F32, (zero_dtype)0);
    op = (float *)malloc(n * sizeof(float));
    om = (float *)calloc(n, sizeof(float));
    ov = (float *)calloc(n, sizeof(float));
    rp = (double *)malloc(n * sizeof(double));
    rm = (double *)calloc(n, sizeof(double));
    rv = (double *)calloc(n, sizeof(double));
    for (i = 0; i < n; i++) rp[i] = op[i] = b.master[i] = (float)uni(-1, 1);
    for (t = 1; t <= T; t++) {
        zero_adam_coefs c;
        zero_adam_range r = bufs_range(&b);
        double bc1 = 1.0 - pow(0.9, t), bc2 = 1.0 - pow(0.999, t);
        for (i = 0; i < n; i++) set_grad(&b, i, (float)uni(-1, 1));
        ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.01, t) == ZERO_OK);
        ZT_CHECK(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1) == ZERO_OK);
        for (i = 0; i < n; i++) {
            double g = b.gval[i];
            float mm, vv, den;
            rm[i] = 0.9 * rm[i] + 0.1 * g;
            rv[i] = 0.999 * rv[i] + 0.001 * g * g;
            rp[i] = rp[i] * (1.0 - 1e-3 * 0.01) -
                    1e-3 / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + 1e-8);
            /* the previous form: zero_adam_update with the old m */
            mm = fmaf(c.beta1, om[i], c.one_minus_beta1 * b.gval[i]);
            vv = fmaf(c.beta2, ov[i], (c.one_minus_beta2 * b.gval[i]) * b.gval[i]);
            den = fmaf(sqrtf(vv), c.inv_sqrt_bc2, c.eps);
            op[i] = fmaf(-c.step_size, mm / den, fmaf(c.neg_lr_wd, op[i], op[i]));
            om[i] = mm;
            ov[i] = vv;
        }
    }
    for (i = 0; i < n; i++) {
        sum_new += ulps(b.master[i], rp[i]);
        sum_old += ulps(op[i], rp[i]);
    }
    printf("  p after %d steps: mean %.3f ulp from float64 with the lerp m, %.3f with the "
           "previous form\n", T, sum_new / (double)n, sum_old / (double)n);
    ZT_CHECKF(sum_new < sum_old, "lerp %.3f ulp, previous %.3f", sum_new / (double)n,
              sum_old / (double)n);
    free(op);
    free(om);
    free(ov);
    free(rp);
    free(rm);
    free(rv);
    bufs_free(&b);
}

int main(void)
{
    find_paths();
    printf("  paths tested:");
    {
        int p;
        for (p = 0; p < g_num_paths; p++) printf(" %s", zero_simd_name(g_paths[p]));
    }
    printf("\n");
    ZT_RUN(matches_double_reference_small_sizes);
    ZT_RUN(matches_double_reference_1m);
    ZT_RUN(paths_and_thread_counts_give_identical_bits);
    ZT_RUN(element_update_does_not_depend_on_its_offset);
    ZT_RUN(nonfinite_gradients_give_nan_on_every_path);
    ZT_RUN(param_copy_is_the_master_converted_streamed_or_not);
    ZT_RUN(streamed_param_copy_gives_identical_bits);
    ZT_RUN(coefs_are_the_double_formulas_rounded_once);
    ZT_RUN(desc_and_coefs_errors_name_the_field);
    ZT_RUN(host_errors_write_nothing);
    ZT_RUN(v_at_beta2_0999_is_within_a_few_ulp_of_float64);
    ZT_RUN(small_weight_decay_is_rounded_once);
    ZT_RUN(m_is_torchs_lerp_rounded_once);
    ZT_RUN(p_mean_error_against_float64_lerp_below_previous_form);
    return zt_summary();
}
