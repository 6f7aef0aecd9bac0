/* bf16 optimizer states (zero_engine_desc.optimizer_dtype = ZERO_BF16): the stochastic
   rounding (exact for representable values, unbiased, the probability of rounding up exactly
   the dropped fraction), the Adam element against a float64 reference that rounds with the
   same random bits, every host path and thread count and range split giving the same bits,
   and in the engine: stages 0-3 bit-identical at N = 1..4, offload (cpu) identical to the
   plain run, memory exact against the 2 + 2 + 6 bytes formula, validation, the commit's
   agreement across ranks, and checkpoints across state dtypes. */
#define _XOPEN_SOURCE 700 /* POSIX names (mkdtemp): zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/nvme_dir.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- the rounding ---------------------------------------------------------------------- */

/* A bf16 value (every finite pattern) never moves, whatever the random bits. */
ZT_TEST(sr_is_exact_for_representable_values)
{
    static const uint32_t rs[] = {0, 1, 0x7fff, 0x8000, 0xfffe, 0xffff, 0x12345678};
    uint32_t h;
    size_t k;
    long bad = 0;
    for (h = 0; h < 0x10000u; h++) {
        uint32_t x = h << 16;
        if ((x & 0x7fffffffu) > 0x7f800000u) continue; /* NaN: below */
        for (k = 0; k < sizeof rs / sizeof rs[0]; k++)
            bad += zero_bf16_bits_sr(x, rs[k]) != (uint16_t)h;
    }
    ZT_CHECKF(bad == 0, "%ld representable values moved", bad);
    /* NaN stays NaN (quiet), inf stays inf */
    ZT_CHECK((zero_bf16_bits_sr(0x7f800001u, 0xffffu) & 0x7fffu) > 0x7f80u);
    ZT_CHECK(zero_bf16_bits_sr(0x7f800000u, 0xffffu) == 0x7f80u);
    ZT_CHECK(zero_bf16_bits_sr(0xff800000u, 0xffffu) == 0xff80u);
}

/* Over all 65536 values of the random bits, x = a + f (b - a) (f = dropped / 65536) rounds
   up exactly dropped times: the probability of rounding up is f, so E[round(x)] = x exactly
   for uniform random bits (positive and negative, normal and subnormal, at binade edges). */
ZT_TEST(sr_rounds_up_with_exactly_the_dropped_fraction)
{
    static const uint32_t xs[] = {0x3f800001u, 0x3f80ffffu, 0x3f808000u, 0x3fffffffu, 0xbf801234u,
                                  0x00001234u, 0x807fffffu, 0x7f7fffffu, 0x42c8abcdu};
    size_t k;
    for (k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        uint32_t x = xs[k], r, up = 0, dropped = x & 0xffffu;
        for (r = 0; r < 0x10000u; r++) {
            uint16_t y = zero_bf16_bits_sr(x, r);
            if (y == (uint16_t)(x >> 16) + 1u) up++;
            else ZT_CHECKF(y == (uint16_t)(x >> 16), "x %08x r %u: %04x", x, r, y);
        }
        ZT_CHECKF(up == dropped, "x %08x: rounds up %u times of 65536, dropped bits %u", x, up,
                  dropped);
    }
}

/* With the library's RNG bits: the mean of K rounded values is within the Hoeffding bound
   of x: |mean - x| <= t (b - a), t = sqrt(ln(2 / delta) / (2 K)), delta = 1e-9 (each
   rounding is a or b, an independent draw if the bits are uniform). Also each bit of the
   three 16-bit fields is set about half the time (same bound). */
ZT_TEST(sr_with_the_rng_is_unbiased)
{
    const long K = zt_quick() ? 1L << 14 : 1L << 17;
    const double t = sqrt(log(2.0 / 1e-9) / (2.0 * (double)K));
    static const float xs[] = {1.0f + 1.0f / 1024.0f, -3.14159265f, 1e-3f, 0.1f, 12345.678f, 7e-39f};
    size_t k;
    int bit;
    long ones[48] = {0};
    uint64_t key = zero_sr_key(42, 7);
    long i;
    for (i = 0; i < K; i++) {
        uint64_t b = zero_sr_bits(key, (uint64_t)i);
        for (bit = 0; bit < 48; bit++) ones[bit] += (long)((b >> bit) & 1u);
    }
    for (bit = 0; bit < 48; bit++)
        ZT_CHECKF(fabs((double)ones[bit] / (double)K - 0.5) <= t, "bit %d set %ld of %ld", bit,
                  ones[bit], K);
    for (k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        uint32_t x = f32_bits(xs[k]);
        double a = (double)from_bits(x & 0xffff0000u), b = (double)from_bits((x & 0xffff0000u) + 0x10000u);
        double sum = 0;
        int field;
        for (field = 0; field < 3; field++) {
            sum = 0;
            for (i = 0; i < K; i++) {
                uint64_t bits = zero_sr_bits(key, (uint64_t)i);
                sum += (double)zero_bf16_bits_to_f32(zero_bf16_bits_sr(x, (uint32_t)(bits >> (16 * field))));
            }
            ZT_CHECKF(fabs(sum / (double)K - (double)xs[k]) <= t * fabs(b - a),
                      "x %.9g field %d: mean %.12g, bound %.3g", (double)xs[k], field,
                      sum / (double)K, t * fabs(b - a));
        }
    }
    /* the key depends on the seed and the step */
    ZT_CHECK(zero_sr_key(1, 1) != zero_sr_key(2, 1));
    ZT_CHECK(zero_sr_key(1, 1) != zero_sr_key(1, 2));
}

/* ---- the Adam element ------------------------------------------------------------------ */

/* The float64 reference of one element: the update in double from the widened states, then
   each result rounded to bf16 with the same 16 random bits: round up (away from zero) when
   r >= 65536 (1 - f), f the fraction of the way from the truncated value to the next. */
static uint16_t ref_sr(double x, uint32_t r16)
{
    float xf = (float)x; /* only to find the bracketing bf16 pair */
    uint32_t lo = f32_bits(xf) & 0xffff0000u;
    double a = (double)from_bits(lo), b = (double)from_bits(lo + 0x10000u), f;
    if (fabs(x) < fabs(a)) { /* xf rounded away from zero past a bf16 value: step back */
        lo -= 0x10000u;
        b = a;
        a = (double)from_bits(lo);
    }
    f = (x - a) / (b - a);
    return (uint16_t)((lo >> 16) + ((double)(r16 & 0xffffu) >= 65536.0 * (1.0 - f) ? 1u : 0u));
}

ZT_TEST(adam_bf16_matches_float64_with_the_same_rounding)
{
    const size_t n = zt_quick() ? 4000 : 40000;
    uint16_t *p = (uint16_t *)malloc(n * 2), *m = (uint16_t *)malloc(n * 2), *v = (uint16_t *)malloc(n * 2);
    float *g = (float *)malloc(n * 4);
    zero_adam_desc d;
    zero_adam_coefs c;
    int mode, step;
    long differ = 0, total = 0, far = 0;
    for (mode = 1; mode <= 2; mode++) {
        size_t i;
        for (i = 0; i < n; i++) {
            p[i] = zero_f32_to_bf16((float)sin(0.37 * (double)i));
            m[i] = zero_f32_to_bf16((float)(1e-3 * cos(0.11 * (double)i)));
            v[i] = zero_f32_to_bf16((float)(1e-6 * (1.5 + sin(0.05 * (double)i))));
        }
        memset(&d, 0, sizeof d);
        d.mode = (zero_adam_mode)mode;
        d.lr = 1e-3;
        d.weight_decay = 0.1;
        for (step = 1; step <= 5; step++) {
            uint64_t key = zero_sr_key(99, step);
            zero_adam_range r;
            double b1 = 0.9, b2 = 0.999, eps = 1e-8, lr = 1e-3, wd = 0.1;
            double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
            uint16_t *rp = (uint16_t *)malloc(n * 2), *rm = (uint16_t *)malloc(n * 2), *rv = (uint16_t *)malloc(n * 2);
            for (i = 0; i < n; i++) g[i] = (float)(1e-2 * sin(0.71 * (double)i + step));
            /* the reference from the states before the step */
            for (i = 0; i < n; i++) {
                double pp = zero_bf16_to_f32(p[i]), mm = zero_bf16_to_f32(m[i]), vv = zero_bf16_to_f32(v[i]);
                double gg = (double)g[i] * 0.5; /* grad_mul */
                uint64_t bits = zero_sr_bits(key, 1000 + i);
                if (mode == ZERO_ADAM) gg += wd * pp;
                mm = b1 * mm + (1 - b1) * gg;
                vv = b2 * vv + (1 - b2) * gg * gg;
                if (mode == ZERO_ADAMW) pp -= lr * wd * pp;
                pp -= lr / bc1 * mm / (sqrt(vv) / sqrt(bc2) + eps);
                rp[i] = ref_sr(pp, (uint32_t)bits);
                rm[i] = ref_sr(mm, (uint32_t)(bits >> 16));
                rv[i] = ref_sr(vv, (uint32_t)(bits >> 32));
            }
            ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.1, step) == ZERO_OK);
            memset(&r, 0, sizeof r);
            r.numel = n;
            r.master = (float *)(void *)p;
            r.m = (float *)(void *)m;
            r.v = (float *)(void *)v;
            r.grad = g;
            r.grad_dtype = ZERO_F32;
            r.state_dtype = ZERO_BF16;
            r.sr_key = key;
            r.sr_index = 1000;
            ZT_CHECK(zero_adam_host(&r, &c, 0.5f, ZERO_SIMD_AUTO, 2) == ZERO_OK);
            for (i = 0; i < n; i++) {
                const uint16_t got[3] = {p[i], m[i], v[i]}, want[3] = {rp[i], rm[i], rv[i]};
                int k;
                for (k = 0; k < 3; k++) {
                    int dd = (int)(got[k] & 0x7fffu) - (int)(want[k] & 0x7fffu);
                    total++;
                    if (got[k] != want[k]) differ++;
                    /* fp32 and float64 differ by ~1e-7 relative: at most the neighbouring
                       value, when the fraction sits on the rounding threshold */
                    if (dd > 1 || dd < -1 || ((got[k] ^ want[k]) & 0x8000u)) far++;
                }
            }
            free(rp);
            free(rm);
            free(rv);
        }
    }
    ZT_CHECKF(far == 0, "%ld of %ld values more than one bf16 step from the float64 reference", far, total);
    /* a decision flips only when f is within ~2^-16 of the threshold's r/65536: rare */
    ZT_CHECKF(differ * 200 <= total, "%ld of %ld values differ from the reference", differ, total);
    free(p);
    free(m);
    free(v);
    free(g);
}

/* Every simd path and thread count gives the same bits, and so does a range cut in two
   pieces with their sr_index (the counter is the element's global index, not its offset). */
ZT_TEST(adam_bf16_paths_threads_and_splits_agree)
{
    static const zero_simd paths[] = {ZERO_SIMD_PORTABLE, ZERO_SIMD_AVX2, ZERO_SIMD_AVX512};
    const size_t n = 3001;
    uint16_t base[3][3001], ref[3][3001], w[3][3001], par[3001], parref[3001];
    uint16_t g[3001];
    zero_adam_desc d;
    zero_adam_coefs c;
    size_t i;
    int p, th, first = 1;
    memset(&d, 0, sizeof d);
    ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.01, 3) == ZERO_OK);
    for (i = 0; i < n; i++) {
        base[0][i] = zero_f32_to_bf16((float)cos(0.3 * (double)i));
        base[1][i] = zero_f32_to_bf16((float)(1e-2 * sin((double)i)));
        base[2][i] = zero_f32_to_bf16((float)(1e-4 * (1.1 + sin(0.2 * (double)i))));
        g[i] = zero_f32_to_f16((float)(0.05 * sin(0.9 * (double)i)));
    }
    for (p = 0; p < 3; p++) {
        if (paths[p] > zero_simd_detect()) continue;
        for (th = 1; th <= 4; th++) {
            size_t cut;
            for (cut = 0; cut <= n; cut += th == 1 ? 1000 : n + 1) {
                zero_adam_range r;
                memcpy(w, base, sizeof w);
                memset(&r, 0, sizeof r);
                r.grad_dtype = ZERO_F16;
                r.param_dtype = ZERO_F16;
                r.state_dtype = ZERO_BF16;
                r.sr_key = zero_sr_key(5, 3);
                /* [0, cut) then [cut, n) */
                r.numel = cut;
                r.master = (float *)(void *)w[0];
                r.m = (float *)(void *)w[1];
                r.v = (float *)(void *)w[2];
                r.grad = g;
                r.param = par;
                r.sr_index = 77;
                ZT_CHECK(zero_adam_host(&r, &c, 1.0f, paths[p], th) == ZERO_OK);
                r.numel = n - cut;
                r.master = (float *)(void *)(w[0] + cut);
                r.m = (float *)(void *)(w[1] + cut);
                r.v = (float *)(void *)(w[2] + cut);
                r.grad = g + cut;
                r.param = par + cut;
                r.sr_index = 77 + cut;
                ZT_CHECK(zero_adam_host(&r, &c, 1.0f, paths[p], th) == ZERO_OK);
                if (first) {
                    memcpy(ref, w, sizeof ref);
                    memcpy(parref, par, sizeof parref);
                    first = 0;
                }
                ZT_CHECKF(!memcmp(ref, w, sizeof ref) && !memcmp(par, parref, sizeof par),
                          "path %d threads %d cut %zu differs", p, th, cut);
            }
        }
    }
    /* the param is the stored master, rounded to the param dtype */
    for (i = 0; i < n; i++)
        ZT_CHECK(parref[i] == zero_f32_to_f16(zero_bf16_to_f32(ref[0][i])));
    /* a bad state dtype is refused and writes nothing */
    {
        zero_adam_range r;
        memcpy(w, base, sizeof w);
        memset(&r, 0, sizeof r);
        r.numel = n;
        r.master = (float *)(void *)w[0];
        r.m = (float *)(void *)w[1];
        r.v = (float *)(void *)w[2];
        r.grad = g;
        r.grad_dtype = ZERO_F16;
        r.state_dtype = ZERO_F16;
        ZT_CHECK(zero_adam_host(&r, &c, 1.0f, ZERO_SIMD_AUTO, 1) == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(!memcmp(w, base, sizeof w));
    }
}

/* ---- the engine ------------------------------------------------------------------------ */

static void bf16_cfg(ec_cfg *c, int world, zero_dtype dt, int accum, int steps)
{
    ec_cfg_init(c, 0, world, dt, accum, steps);
    c->opt_dtype = ZERO_BF16;
    c->opt_seed = 0x1234;
    c->lr = 3e-3f; /* updates big enough to move bf16 masters */
}

/* Each vector path (AVX2: 8 lanes, the RNG on 64-bit lanes) against the portable element
   loop, for every gradient and param dtype, states with NaN, inf, signed zeros, subnormals
   and values next to the largest bf16, counters crossing 2^32 (sr_index), and lengths that
   leave every possible tail. */
ZT_TEST(adam_bf16_vector_paths_match_the_loop_on_every_dtype_and_edge)
{
    static const zero_simd paths[] = {ZERO_SIMD_AVX2, ZERO_SIMD_AVX512};
    static const zero_dtype gds[] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    static const zero_dtype pds[] = {ZERO_DTYPE_DEFAULT, ZERO_F32, ZERO_F16, ZERO_BF16};
    static const uint16_t edges[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f7f,
                                     0xff7f, 0x0001, 0x8001, 0x007f, 0x3f80, 0x7f01};
    enum { N = 203 };
    uint16_t st[3][N], ref[3][N], w[3][N];
    float gf[N], pref[N], pw[N];
    uint16_t gh[N];
    zero_adam_desc d;
    zero_adam_coefs c;
    size_t i, n;
    int p, gi, pi, tested = 0;
    memset(&d, 0, sizeof d);
    d.weight_decay = 0.01;
    ZT_CHECK(zero_adam_coefs_make(&c, &d, 0.01, 7) == ZERO_OK);
    for (i = 0; i < N; i++) {
        uint32_t h = (uint32_t)zero_sr_mix(i + 1);
        st[0][i] = zero_f32_to_bf16((float)(3.0 * sin(0.7 * (double)i)));
        st[1][i] = zero_f32_to_bf16((float)(1e-2 * cos((double)i)));
        st[2][i] = zero_f32_to_bf16((float)(1e-5 * (1.5 + sin(0.3 * (double)i))));
        if (i % 7 == 3) st[h % 3][i] = edges[(h >> 8) % (sizeof edges / sizeof edges[0])];
        gf[i] = (float)(0.1 * sin(1.3 * (double)i));
        if (i % 29 == 5) gf[i] = i % 2 ? INFINITY : NAN;
        if (i % 31 == 7) gf[i] = 3e38f;
    }
    for (p = 0; p < 2; p++) {
        if (paths[p] > zero_simd_detect()) continue;
        for (gi = 0; gi < 3; gi++)
            for (pi = 0; pi < 4; pi++)
                for (n = N - 8; n <= N; n++) {
                    zero_adam_range r;
                    int pass;
                    for (i = 0; i < N; i++)
                        gh[i] = gds[gi] == ZERO_F16 ? zero_f32_to_f16(gf[i]) : zero_f32_to_bf16(gf[i]);
                    for (pass = 0; pass < 2; pass++) {
                        uint16_t(*dst)[N] = pass ? w : ref;
                        float *pd = pass ? pw : pref;
                        memcpy(dst, st, sizeof st);
                        memset(pd, 0, sizeof pw);
                        memset(&r, 0, sizeof r);
                        r.numel = n;
                        r.grad_dtype = gds[gi];
                        r.grad = gds[gi] == ZERO_F32 ? (const void *)gf : (const void *)gh;
                        r.param_dtype = pds[pi] == ZERO_DTYPE_DEFAULT ? ZERO_F32 : pds[pi];
                        r.param = pds[pi] == ZERO_DTYPE_DEFAULT ? NULL : (void *)pd;
                        r.state_dtype = ZERO_BF16;
                        r.master = (float *)(void *)dst[0];
                        r.m = (float *)(void *)dst[1];
                        r.v = (float *)(void *)dst[2];
                        r.sr_key = zero_sr_key(11, 7);
                        r.sr_index = 0xfffffff0ull + n;
                        ZT_CHECK(zero_adam_host(&r, &c, 0.75f, pass ? paths[p] : ZERO_SIMD_PORTABLE, 1) == ZERO_OK);
                    }
                    ZT_CHECKF(!memcmp(ref, w, sizeof ref) && !memcmp(pref, pw, sizeof pw),
                              "%s differs from the loop: grad %s, param %s, n %zu",
                              zero_simd_name(paths[p]), zero_dtype_name(gds[gi]),
                              zero_dtype_name(pds[pi]), n);
                    tested++;
                }
    }
    if (!tested) ZT_SKIP("no vector path on this CPU");
}

/* Stages 0-3 give the same bits at every N, fp16 and bf16 params, with accumulation and
   clipping; and the run is not the fp32-state run (the states are bf16 values). */
ZT_TEST(engine_stages_identical_at_every_n)
{
    int w, dt;
    for (w = 1; w <= 4; w++)
        for (dt = 0; dt < 2; dt++) {
            ec_cfg c;
            char label[96];
            bf16_cfg(&c, w, dt ? ZERO_BF16 : ZERO_F16, dt ? 2 : 1, zt_quick() ? 2 : 4);
            c.clip = dt ? 0.05f : 0.0f;
            snprintf(label, sizeof label, "bf16 states N %d %s", w, dt ? "bf16" : "fp16");
            ec_check_stages_identical(&c, label);
        }
    {   /* every stored master, m, v is a bf16 value; another seed gives other bits */
        ec_cfg c;
        ec_result *a, *b;
        char why[160];
        int t, all_bf16 = 1;
        bf16_cfg(&c, 2, ZERO_F16, 1, 3);
        c.stage = 2;
        a = ec_run(&c);
        c.opt_seed = 0x1235;
        b = ec_run(&c);
        ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "%s %s", a->err, b->err);
        if (a->rc == ZERO_OK && b->rc == ZERO_OK) {
            for (t = 0; t < c.ntensors; t++) {
                size_t i;
                for (i = 0; i < c.sizes[t]; i++)
                    all_bf16 &= (f32_bits(a->master[t][i]) & 0xffffu) == 0 &&
                                (f32_bits(a->m[t][i]) & 0xffffu) == 0 && (f32_bits(a->v[t][i]) & 0xffffu) == 0;
            }
            ZT_CHECK(all_bf16);
            ZT_CHECK(!ec_same_state(&c, a, b, why, sizeof why));
        }
        ec_result_free(a);
        ec_result_free(b);
    }
}

/* The offloaded optimizer (host tier, host Adam over tiles smaller than a shard) gives the
   plain run's bits, stages 1-3, N 1-4. */
ZT_TEST(engine_offload_identical_to_plain)
{
    int st, w;
    for (st = 1; st <= 3; st++)
        for (w = 1; w <= 4; w += zt_quick() ? 3 : 1) {
            ec_cfg c;
            ec_result *ref, *off;
            char why[160];
            bf16_cfg(&c, w, ZERO_F16, 2, 3);
            c.stage = st;
            ref = ec_run(&c);
            c.offload_opt = ZERO_OFFLOAD_CPU;
            c.offload_param = st == 3 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
            c.sub_group = 31;
            c.host_threads = 2;
            off = ec_run(&c);
            ZT_CHECKF(ref->rc == ZERO_OK && off->rc == ZERO_OK, "stage %d N %d: %s %s", st, w,
                      ref->err, off->err);
            if (ref->rc == ZERO_OK && off->rc == ZERO_OK)
                ZT_CHECKF(ec_same_state(&c, ref, off, why, sizeof why), "stage %d N %d: %s", st, w, why);
            ec_result_free(ref);
            ec_result_free(off);
        }
}

/* Master, m and v take 2 bytes per trained element (stage 0: whole; stages 1-3: the shard)
   on the device, or in the host tier when offloaded: exactly half the fp32 run's. */
ZT_TEST(engine_memory_is_the_formula)
{
    int st;
    for (st = 0; st <= 3; st++) {
        int off;
        for (off = 0; off <= (st > 0); off++) {
            ec_cfg c;
            ec_result *a, *b;
            bf16_cfg(&c, 3, ZERO_F16, 1, 1);
            c.stage = st;
            if (off) c.offload_opt = ZERO_OFFLOAD_CPU;
            a = ec_run(&c);
            c.opt_dtype = ZERO_F32;
            b = ec_run(&c);
            ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "stage %d: %s %s", st, a->err, b->err);
            if (a->rc == ZERO_OK && b->rc == ZERO_OK) {
                size_t numel = st == 0 ? a->plan_total : a->plan_shard_total;
                const zero_engine_memory *ma = off ? &a->host_mem[1] : &a->mem[1];
                const zero_engine_memory *mb = off ? &b->host_mem[1] : &b->mem[1];
                int k;
                for (k = ZERO_MEM_MASTER; k <= ZERO_MEM_MOMENT2; k++) {
                    ZT_CHECKF(ma->bytes[k] == 2 * numel, "stage %d off %d cat %d: %zu bytes, formula %zu",
                              st, off, k, ma->bytes[k], 2 * numel);
                    ZT_CHECKF(mb->bytes[k] == 4 * numel, "stage %d off %d cat %d: fp32 %zu, formula %zu",
                              st, off, k, mb->bytes[k], 4 * numel);
                }
                ZT_CHECK(ma->total_bytes + 6 * numel == mb->total_bytes);
            }
            ec_result_free(a);
            ec_result_free(b);
        }
    }
}

/* ---- validation and agreement ---- */

typedef struct mm_ctx {
    zero_result rc[4];
    char err[4][400];
    int which; /* 0: dtype differs on rank 1; 1: seed differs */
} mm_ctx;

static zero_result mm_rank(int rank, zero_comm *comm, void *user)
{
    mm_ctx *X = (mm_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    int id;
    memset(&d, 0, sizeof d);
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    d.stage = 1;
    d.device = dev;
    d.comm = comm;
    d.optimizer_dtype = ZERO_BF16;
    if (rank == 1 && X->which == 0) d.optimizer_dtype = ZERO_F32;
    if (rank == 1 && X->which == 1) d.optimizer_seed = 7;
    r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "w", 100, 0, 0, &id);
    if (r == ZERO_OK) r = zero_engine_commit(e);
    X->rc[rank] = r;
    snprintf(X->err[rank], sizeof X->err[rank], "%s", r == ZERO_OK ? "" : zero_last_error());
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

static int g_valid_failures;

static zero_result valid_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    int before = zt_cur_failures;
    (void)rank;
    (void)user;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.device = dev;
    d.comm = comm;
    d.stage = 1;
    d.optimizer_dtype = ZERO_F16;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "optimizer_dtype") != NULL);
    d.optimizer_dtype = ZERO_BF16;
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.nvme_path = "/tmp";
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_UNSUPPORTED);
    ZT_CHECK(strstr(zero_last_error(), "nvme") != NULL);
    d.offload_optimizer = ZERO_OFFLOAD_CPU;
    d.nvme_path = NULL;
    d.offload_optimizer_ratio = 0.5;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_UNSUPPORTED);
    ZT_CHECK(strstr(zero_last_error(), "offload_optimizer_ratio") != NULL);
    d.offload_optimizer_ratio = 0;
    d.offload_optimizer = ZERO_OFFLOAD_NONE;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    if (e) {
        zero_engine_desc got;
        ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK);
        ZT_CHECK(got.optimizer_dtype == ZERO_BF16);
        zero_engine_destroy(e);
        e = NULL;
    }
    d.optimizer_dtype = ZERO_DTYPE_DEFAULT;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    if (e) {
        zero_engine_desc got;
        ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK);
        ZT_CHECK(got.optimizer_dtype == ZERO_F32);
        zero_engine_destroy(e);
    }
    zero_device_destroy(dev);
    g_valid_failures = zt_cur_failures - before;
    return ZERO_OK;
}

ZT_TEST(settings_validated_and_agreed)
{
    int which;
    ZT_CHECK(zero_local_run(1, valid_rank, NULL) == ZERO_OK);
    ZT_CHECK(g_valid_failures == 0);
    for (which = 0; which < 2; which++) {
        mm_ctx X;
        int rk;
        memset(&X, 0, sizeof X);
        X.which = which;
        ZT_CHECK(zero_local_run(3, mm_rank, &X) == ZERO_OK);
        for (rk = 0; rk < 3; rk++) {
            ZT_CHECKF(X.rc[rk] == ZERO_ERROR_MISMATCH, "which %d rank %d: %d %s", which, rk,
                      (int)X.rc[rk], X.err[rk]);
            ZT_CHECKF(strstr(X.err[rk], which ? "optimizer_seed" : "optimizer_dtype") != NULL,
                      "which %d rank %d: %s", which, rk, X.err[rk]);
        }
    }
}

/* ---- checkpoints ---- */

static zero_result ck_train(zero_engine *e, const ec_cfg *c, const int *ids, int rank, int s0, int s1)
{
    zero_result r = ZERO_OK;
    int s;
    for (s = s0; s < s1 && r == ZERO_OK; s++) {
        float scale = zero_engine_loss_scale(e);
        r = ec_micro_steps(c, e, ids, rank, s, scale);
        if (r == ZERO_OK) r = zero_engine_step(e, NULL);
    }
    return r;
}

typedef struct ck_ctx {
    ec_ctx base;
    const char *ckdir;
    int split;
    zero_dtype save_dt, load_dt;
    int save_stage, load_stage;
    zero_offload_device save_off, load_off;
    ec_result *at_split; /* the loaded engine's states right after the load */
    ec_ctx split_ctx;
} ck_ctx;

/* Engine A (save settings) trains [0, split) and saves; engine B (load settings) loads,
   its states go to at_split, then it trains the rest into the result. */
static zero_result ck_rank(int rank, zero_comm *comm, void *user)
{
    ck_ctx *X = (ck_ctx *)user;
    const ec_cfg *c = X->base.cfg;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T], t, phase;
    float tmp[512];
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    for (phase = 0; phase < 2 && r == ZERO_OK; phase++) {
        ec_cfg cc = *c;
        cc.stage = phase ? X->load_stage : X->save_stage;
        cc.opt_dtype = phase ? X->load_dt : X->save_dt;
        cc.offload_opt = phase ? X->load_off : X->save_off;
        ec_engine_desc(&cc, &d);
        d.device = dev;
        d.comm = comm;
        r = zero_engine_create(&d, &e);
        if (r == ZERO_OK) r = ec_add_tensors(e, &cc, ids);
        if (r == ZERO_OK) r = zero_engine_commit(e);
        if (r != ZERO_OK) break;
        if (phase == 0) {
            r = ec_set_init(e, &cc, ids, tmp);
            if (r == ZERO_OK) r = ck_train(e, &cc, ids, rank, 0, X->split);
            if (r == ZERO_OK) r = zero_engine_save(e, X->ckdir);
        } else {
            r = zero_engine_load(e, X->ckdir);
            for (t = 0; t < c->ntensors && r == ZERO_OK; t++) r = ec_read_states(e, &X->split_ctx, rank, t, ids[t]);
            if (r == ZERO_OK) r = ck_train(e, &cc, ids, rank, X->split, c->steps);
            for (t = 0; t < c->ntensors && r == ZERO_OK; t++) r = ec_read_states(e, &X->base, rank, t, ids[t]);
        }
        zero_engine_destroy(e);
        e = NULL;
    }
    if (r != ZERO_OK && rank == 0) snprintf(X->base.res->err, sizeof X->base.res->err, "%s", zero_last_error());
    zero_device_destroy(dev);
    return r;
}

static ec_result *ck_result_new(const ec_cfg *c)
{
    ec_result *res = (ec_result *)calloc(1, sizeof *res);
    int t;
    res->params_agree = 1;
    for (t = 0; t < c->ntensors; t++) {
        res->master[t] = (float *)calloc(c->sizes[t], 4);
        res->m[t] = (float *)calloc(c->sizes[t], 4);
        res->v[t] = (float *)calloc(c->sizes[t], 4);
        res->param[t] = (unsigned char *)malloc(c->sizes[t] * 4);
        memset(res->param[t], 0xff, c->sizes[t] * 4);
    }
    return res;
}

/* bf16 -> bf16 (another stage, offload or not): the run continues bit-identically to the
   run without a checkpoint. bf16 -> fp32: the loaded states are the bf16 values, exactly.
   fp32 -> bf16: the loaded states are the fp32 values rounded to nearest even. */
ZT_TEST(checkpoints_across_state_dtypes)
{
    static char dirbuf[256];
    const char *dir = nd_make_dir(dirbuf, sizeof dirbuf, "bf16ck");
    char ckdir[300], cmd[400];
    int ci;
    static const int combos[][6] = {
        /* save dtype (1 = bf16), load dtype, save stage, load stage, save offload, load offload */
        {1, 1, 1, 3, 0, 0}, {1, 1, 2, 0, 1, 0}, {1, 1, 3, 2, 0, 1}, {1, 0, 2, 2, 0, 0}, {0, 1, 3, 1, 0, 0},
    };
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    for (ci = 0; ci < (int)(sizeof combos / sizeof combos[0]); ci++) {
        ec_cfg c;
        ck_ctx X;
        ec_result *ref, *mid, *got;
        char why[160];
        int t;
        bf16_cfg(&c, 2, ZERO_F16, 1, 4);
        c.opt_dtype = combos[ci][0] ? ZERO_BF16 : ZERO_F32;
        c.stage = combos[ci][2];
        c.steps = 2;
        mid = ec_run(&c); /* the saved state */
        c.steps = 4;
        ref = ec_run(&c); /* the run without a checkpoint */
        memset(&X, 0, sizeof X);
        X.ckdir = ckdir;
        X.split = 2;
        X.save_dt = combos[ci][0] ? ZERO_BF16 : ZERO_F32;
        X.load_dt = combos[ci][1] ? ZERO_BF16 : ZERO_F32;
        X.save_stage = combos[ci][2];
        X.load_stage = combos[ci][3];
        X.save_off = combos[ci][4] ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
        X.load_off = combos[ci][5] ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
        X.at_split = ck_result_new(&c);
        X.split_ctx.cfg = &c;
        X.split_ctx.res = X.at_split;
        pthread_mutex_init(&X.split_ctx.mu, NULL);
        for (t = 0; t < c.ntensors; t++) {
            int rk;
            for (rk = 0; rk < c.world; rk++) X.split_ctx.param_rank[rk][t] = (unsigned char *)calloc(c.sizes[t], 4);
        }
        got = ec_run_with(&c, &X.base, ck_rank, &X);
        ZT_CHECKF(ref->rc == ZERO_OK && mid->rc == ZERO_OK && got->rc == ZERO_OK, "combo %d: %s", ci, got->err);
        if (ref->rc == ZERO_OK && mid->rc == ZERO_OK && got->rc == ZERO_OK) {
            if (X.save_dt == X.load_dt) {
                ZT_CHECKF(ec_same_state(&c, ref, got, why, sizeof why), "combo %d: %s", ci, why);
            } else {
                int bad = 0;
                for (t = 0; t < c.ntensors; t++) {
                    size_t i;
                    for (i = 0; i < c.sizes[t]; i++) {
                        const float *src[3] = {mid->master[t], mid->m[t], mid->v[t]};
                        const float *dst[3] = {X.at_split->master[t], X.at_split->m[t], X.at_split->v[t]};
                        int k;
                        for (k = 0; k < 3; k++) {
                            float want = X.load_dt == ZERO_F32 ? src[k][i]
                                                               : zero_bf16_to_f32(zero_f32_to_bf16(src[k][i]));
                            bad += f32_bits(dst[k][i]) != f32_bits(want);
                        }
                    }
                }
                ZT_CHECKF(bad == 0, "combo %d: %d states not the converted saved values", ci, bad);
            }
        }
        pthread_mutex_destroy(&X.split_ctx.mu);
        for (t = 0; t < c.ntensors; t++) {
            int rk;
            for (rk = 0; rk < c.world; rk++) free(X.split_ctx.param_rank[rk][t]);
        }
        ec_result_free(X.at_split);
        ec_result_free(ref);
        ec_result_free(mid);
        ec_result_free(got);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

int main(void)
{
    ZT_RUN(sr_is_exact_for_representable_values);
    ZT_RUN(sr_rounds_up_with_exactly_the_dropped_fraction);
    ZT_RUN(sr_with_the_rng_is_unbiased);
    ZT_RUN(adam_bf16_matches_float64_with_the_same_rounding);
    ZT_RUN(adam_bf16_paths_threads_and_splits_agree);
    ZT_RUN(adam_bf16_vector_paths_match_the_loop_on_every_dtype_and_edge);
    ZT_RUN(engine_stages_identical_at_every_n);
    ZT_RUN(engine_offload_identical_to_plain);
    ZT_RUN(engine_memory_is_the_formula);
    ZT_RUN(settings_validated_and_agreed);
    ZT_RUN(checkpoints_across_state_dtypes);
    return zt_summary();
}
