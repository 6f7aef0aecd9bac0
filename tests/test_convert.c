/* fp32 <-> fp16 / bf16 / fp64: the scalar functions against references written here from
   the IEEE definitions (decoders with ldexp on integers, rounding in exact double
   arithmetic), and every SIMD path against the portable one, bit for bit. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "tests/zt.h"

#include <float.h>

/* ---- references ---- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}
static double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* A binary format: p = significand bits including the implicit one, emin = exponent of the
   least normal, maxfin = the largest finite value. */
typedef struct fmt {
    int ebits, mbits, p, emin;
    double maxfin;
} fmt;
static const fmt F16 = {5, 10, 11, -14, 65504.0};
static const fmt BF16 = {8, 7, 8, -126, 0.0}; /* maxfin filled in main: (2 - 2^-7) 2^127 */
static fmt BF16v;
static const fmt F32 = {8, 23, 24, -126, (double)FLT_MAX};

/* The value of a non-NaN pattern of f, straight from the definition. */
static double ref_decode(const fmt *f, uint32_t h, int *is_nan)
{
    uint32_t sign = h >> (f->ebits + f->mbits), e = (h >> f->mbits) & ((1u << f->ebits) - 1u);
    uint32_t m = h & ((1u << f->mbits) - 1u);
    int bias = (1 << (f->ebits - 1)) - 1;
    double v;
    *is_nan = 0;
    if (e == (1u << f->ebits) - 1u) {
        if (m) {
            *is_nan = 1;
            return 0.0;
        }
        v = HUGE_VAL;
    } else if (e == 0) {
        v = ldexp((double)m, 1 - bias - f->mbits);
    } else {
        v = ldexp((double)((1u << f->mbits) + m), (int)e - bias - f->mbits);
    }
    return sign ? -v : v;
}

/* x rounded to nearest even in format f (unbounded exponent, then overflow to inf), as a
   double. Every step is exact in double for the inputs used here (x is an fp32 or fp64
   value and the scaling is by powers of two). */
static double ref_round(const fmt *f, double x)
{
    double ax = fabs(x), ulp, q, fl, frac, r;
    int e;
    if (ax == 0.0 || isinf(ax)) return x;
    frexp(ax, &e); /* ax = s * 2^e, s in [0.5, 1): exponent of the leading bit is e - 1 */
    if (e - 1 < f->emin) e = f->emin + 1; /* subnormal range: fixed quantum */
    ulp = ldexp(1.0, e - f->p);
    q = ax / ulp;
    fl = floor(q);
    frac = q - fl;
    if (frac > 0.5 || (frac == 0.5 && fmod(fl, 2.0) == 1.0)) fl += 1.0;
    r = fl * ulp;
    if (r > f->maxfin) r = HUGE_VAL;
    return x < 0 ? -r : r;
}

/* Checks that h (a pattern of f) is exactly the correctly rounded x. */
static int ok_round(const fmt *f, double x, uint32_t h)
{
    int nan;
    double want = ref_round(f, x), got = ref_decode(f, h, &nan);
    if (nan) return 0;
    return got == want && !signbit(got) == !signbit(want);
}

/* The NaN rules (see the conversion section of zero.h). */
static uint16_t nan_f32_to_f16(uint32_t x) { return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu)); }
static uint16_t nan_f32_to_bf16(uint32_t x) { return (uint16_t)((x >> 16) | 0x40u); }

static int is_nan32(uint32_t x) { return (x & 0x7fffffffu) > 0x7f800000u; }

/* Edge fp32 inputs for a format: every value, every midpoint and their neighbours, plus
   specials. Returns the count written to out (capacity cap). */
static size_t edges_for(const fmt *f, float *out, size_t cap)
{
    size_t n = 0;
    uint32_t h, top = ((1u << f->ebits) - 1u) << f->mbits; /* +inf pattern */
    static const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                        0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0xff800001u,
                                        0xffc00000u, 0xffffffffu, 0x7fa00000u, 0x7f802000u,
                                        0x7f801fffu, 0x7fbfffffu, 0xff9fe001u, 0x00000001u,
                                        0x80000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu,
                                        0xff7fffffu, 0x33000000u, 0x33000001u, 0x32ffffffu,
                                        0x477ff000u, 0x477fefffu, 0x477ff001u, 0x7f7f8000u,
                                        0x7f7f7fffu, 0x7f7f8001u, 0x3f800000u, 0x38800000u,
                                        0x387fe000u, 0x387fffffu, 0x33c00000u};
    size_t i;
    for (i = 0; i < sizeof specials / sizeof specials[0] && n < cap; i++) out[n++] = u2f(specials[i]);
    for (h = 0; h < top && n + 10 <= cap; h++) {
        int nan;
        double lo = ref_decode(f, h, &nan), hi;
        float mid;
        if (h + 1 < top) hi = ref_decode(f, h + 1, &nan);
        else hi = ldexp(1.0, (1 << (f->ebits - 1))); /* 2^(emax + 1): where inf begins */
        mid = (float)((lo + hi) / 2); /* exact: one more significand bit */
        out[n++] = (float)lo;
        out[n++] = nextafterf((float)lo, INFINITY);
        out[n++] = mid;
        out[n++] = nextafterf(mid, 0.0f);
        out[n++] = nextafterf(mid, INFINITY);
        out[n++] = -(float)lo;
        out[n++] = -mid;
        out[n++] = -nextafterf(mid, 0.0f);
        out[n++] = -nextafterf(mid, INFINITY);
        if (h > 0) out[n++] = nextafterf((float)lo, 0.0f);
    }
    return n;
}

static size_t n_random(void) { return zt_quick() ? 200000 : 4000000; }

/* ---- scalar ---- */

ZT_TEST(f16_decode_all_65536)
{
    uint32_t i;
    for (i = 0; i < 65536; i++) {
        int nan;
        double want = ref_decode(&F16, i, &nan);
        float got = zero_f16_to_f32((uint16_t)i);
        uint32_t g = f2u(got);
        if (nan) {
            uint32_t exp = ((i & 0x8000u) << 16) | 0x7fc00000u | ((i & 0x3ffu) << 13);
            ZT_CHECKF(g == exp, "f16 %04x -> %08x, want quiet NaN %08x", i, g, exp);
        } else {
            ZT_CHECKF((double)got == want && !signbit(got) == !signbit(want),
                      "f16 %04x -> %a, want %a", i, (double)got, want);
        }
    }
}

ZT_TEST(f16_round_trip_all_65536)
{
    uint32_t i;
    for (i = 0; i < 65536; i++) {
        uint16_t back = zero_f32_to_f16(zero_f16_to_f32((uint16_t)i));
        int nan = (i & 0x7c00u) == 0x7c00u && (i & 0x3ffu);
        if (nan) {
            ZT_CHECKF(back == (i | 0x200u), "NaN %04x -> %04x, want %04x (quiet)", i, back,
                      i | 0x200u);
        } else {
            ZT_CHECKF(back == i, "%04x -> %04x", i, back);
        }
    }
}

ZT_TEST(bf16_decode_and_round_trip_all_65536)
{
    uint32_t i;
    for (i = 0; i < 65536; i++) {
        int nan;
        double want = ref_decode(&BF16v, i, &nan);
        float got = zero_bf16_to_f32((uint16_t)i);
        uint16_t back = zero_f32_to_bf16(got);
        if (nan) {
            ZT_CHECKF(f2u(got) == ((i << 16) | 0x400000u), "bf16 %04x -> %08x", i, f2u(got));
            ZT_CHECKF(back == (i | 0x40u), "NaN %04x -> %04x", i, back);
        } else {
            ZT_CHECKF((double)got == want && !signbit(got) == !signbit(want),
                      "bf16 %04x -> %a, want %a", i, (double)got, want);
            ZT_CHECKF(back == i, "%04x -> %04x", i, back);
        }
    }
}

static void check_f32_to_16(float x, int *fails)
{
    uint32_t u = f2u(x);
    uint16_t h = zero_f32_to_f16(x), b = zero_f32_to_bf16(x);
    if (is_nan32(u)) {
        if (h != nan_f32_to_f16(u) || b != nan_f32_to_bf16(u)) {
            if ((*fails)++ < 10)
                fprintf(stderr, "  NaN %08x -> f16 %04x (want %04x), bf16 %04x (want %04x)\n", u,
                        h, nan_f32_to_f16(u), b, nan_f32_to_bf16(u));
        }
        return;
    }
    if (!ok_round(&F16, (double)x, h) || !ok_round(&BF16v, (double)x, b)) {
        if ((*fails)++ < 10)
            fprintf(stderr, "  %08x (%a) -> f16 %04x, bf16 %04x; want %a, %a\n", u, (double)x, h, b,
                    ref_round(&F16, x), ref_round(&BF16v, x));
    }
}

ZT_TEST(f32_to_f16_bf16_edges)
{
    static float e16[800000], eb[800000];
    size_t n16 = edges_for(&F16, e16, 800000), nb = edges_for(&BF16v, eb, 800000), i;
    int fails = 0;
    ZT_CHECKF(n16 > 9 * 0x7c00 && nb > 9 * 0x7f80, "edges %zu %zu", n16, nb);
    for (i = 0; i < n16; i++) check_f32_to_16(e16[i], &fails);
    for (i = 0; i < nb; i++) check_f32_to_16(eb[i], &fails);
    ZT_CHECKF(fails == 0, "%d edge inputs wrong", fails);
}

ZT_TEST(f32_to_f16_bf16_named_cases)
{
    /* ties both ways, overflow threshold, subnormal halfway, NaN payloads, zeros, infs */
    ZT_CHECK(zero_f32_to_f16(1.0f) == 0x3c00);
    ZT_CHECK(zero_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);                 /* tie -> even 0   */
    ZT_CHECK(zero_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);             /* tie -> even 2   */
    ZT_CHECK(zero_f32_to_f16(nextafterf(1.0f + 0x1p-11f, 2.0f)) == 0x3c01); /* above tie    */
    ZT_CHECK(zero_f32_to_f16(65504.0f) == 0x7bff);
    ZT_CHECK(zero_f32_to_f16(nextafterf(65520.0f, 0.0f)) == 0x7bff);
    ZT_CHECK(zero_f32_to_f16(65520.0f) == 0x7c00);
    ZT_CHECK(zero_f32_to_f16(-65520.0f) == 0xfc00);
    ZT_CHECK(zero_f32_to_f16(FLT_MAX) == 0x7c00);
    ZT_CHECK(zero_f32_to_f16(0x1p-24f) == 0x0001);
    ZT_CHECK(zero_f32_to_f16(0x1p-25f) == 0x0000);                   /* tie -> 0     */
    ZT_CHECK(zero_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001);
    ZT_CHECK(zero_f32_to_f16(-0x1p-25f) == 0x8000);
    ZT_CHECK(zero_f32_to_f16(3 * 0x1p-25f) == 0x0002);               /* tie -> even 2 */
    ZT_CHECK(zero_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400);        /* tie rounds up to normal */
    ZT_CHECK(zero_f32_to_f16(0.0f) == 0x0000 && zero_f32_to_f16(-0.0f) == 0x8000);
    ZT_CHECK(zero_f32_to_f16(INFINITY) == 0x7c00 && zero_f32_to_f16(-INFINITY) == 0xfc00);
    ZT_CHECK(zero_f32_to_f16(u2f(0x7f800001u)) == 0x7e00);           /* sNaN quieted */
    ZT_CHECK(zero_f32_to_f16(u2f(0xff802000u)) == 0xfe01);
    ZT_CHECK(zero_f32_to_f16(u2f(0x7fffffffu)) == 0x7fff);
    ZT_CHECK(zero_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);            /* tie -> even */
    ZT_CHECK(zero_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);
    ZT_CHECK(zero_f32_to_bf16(u2f(0x7f7f8000u)) == 0x7f80);          /* overflow tie -> inf */
    ZT_CHECK(zero_f32_to_bf16(u2f(0x7f7f7fffu)) == 0x7f7f);
    ZT_CHECK(zero_f32_to_bf16(u2f(0x00008000u)) == 0x0000);          /* subnormal tie -> 0 */
    ZT_CHECK(zero_f32_to_bf16(u2f(0x00018000u)) == 0x0002);
    ZT_CHECK(zero_f32_to_bf16(u2f(0x7f800001u)) == 0x7fc0);
    ZT_CHECK(zero_f32_to_bf16(u2f(0xffff0000u)) == 0xffff);
    ZT_CHECK(zero_bf16_to_f32(0x7f81) == u2f(0x7fc10000u) || isnan(zero_bf16_to_f32(0x7f81)));
    ZT_CHECK(f2u(zero_bf16_to_f32(0x7f81)) == 0x7fc10000u);
    ZT_CHECK(f2u(zero_f16_to_f32(0x7c01)) == 0x7fc02000u);
}

ZT_TEST(f32_to_f16_bf16_random_patterns)
{
    size_t n = n_random(), i;
    int fails = 0;
    zt_seed(42);
    for (i = 0; i < n; i++) {
        uint64_t r = zt_rand64();
        check_f32_to_16(u2f((uint32_t)r), &fails);
        /* concentrate on the range where fp16 rounding happens: exponents 2^-26 .. 2^17 */
        check_f32_to_16(u2f(((uint32_t)(r >> 32) & 0x807fffffu) |
                            ((uint32_t)(101 + (r >> 24) % 44) << 23)), &fails);
    }
    ZT_CHECKF(fails == 0, "%d of %zu random inputs wrong", fails, 2 * n);
}

/* ---- fp64 ---- */

ZT_TEST(f64_pairs_against_references)
{
    size_t n = zt_quick() ? 100000 : 1000000, i;
    int fails = 0;
    zt_seed(7);
    for (i = 0; i < n; i++) {
        uint64_t r = zt_rand64();
        double x;
        float f32;
        uint16_t h, b;
        if (i & 1) r = (r & 0x800fffffffffffffull) | ((uint64_t)(990 + (r >> 52) % 60) << 52);
        else if (i & 2) r = (r & 0x800fffffffffffffull) | ((uint64_t)(860 + (r >> 52) % 330) << 52);
        x = u2d(r);
        ZT_CHECK(zero_convert(&f32, ZERO_F32, &x, ZERO_F64, 1, ZERO_SIMD_AUTO) == ZERO_OK);
        ZT_CHECK(zero_convert(&h, ZERO_F16, &x, ZERO_F64, 1, ZERO_SIMD_AUTO) == ZERO_OK);
        ZT_CHECK(zero_convert(&b, ZERO_BF16, &x, ZERO_F64, 1, ZERO_SIMD_AUTO) == ZERO_OK);
        if (isnan(x)) {
            uint32_t want32 = (uint32_t)(r >> 32 & 0x80000000u) | 0x7fc00000u | (uint32_t)((r >> 29) & 0x7fffffu);
            uint16_t want16 = (uint16_t)((r >> 48 & 0x8000u) | 0x7e00u | ((r >> 42) & 0x3ffu));
            uint16_t wantb = (uint16_t)((r >> 48 & 0x8000u) | 0x7fc0u | ((r >> 45) & 0x7fu));
            if (f2u(f32) != want32 || h != want16 || b != wantb) fails++;
            continue;
        }
        /* fp32: C's conversion rounds to nearest even in the default environment */
        if (f2u(f32) != f2u((float)x)) fails++;
        if (!ok_round(&F16, x, h) || !ok_round(&BF16v, x, b)) {
            if (fails++ < 10) fprintf(stderr, "  %a -> f16 %04x bf16 %04x\n", x, h, b);
        }
    }
    ZT_CHECKF(fails == 0, "%d of %zu wrong", fails, n);
    {
        /* one rounding, not two: 1 + 2^-11 + 2^-40 is above the fp16 tie at 1 + 2^-11, but
           through fp32 it would land on the tie and go to even (1.0). */
        double x = 1.0 + 0x1p-11 + 0x1p-40, y = 1.0 + 0x1p-8 + 0x1p-40;
        uint16_t h, b;
        zero_convert(&h, ZERO_F16, &x, ZERO_F64, 1, ZERO_SIMD_AUTO);
        zero_convert(&b, ZERO_BF16, &y, ZERO_F64, 1, ZERO_SIMD_AUTO);
        ZT_CHECKF(h == 0x3c01, "%04x", h);
        ZT_CHECKF(b == 0x3f81, "%04x", b);
    }
}

ZT_TEST(widening_to_f64_is_exact)
{
    uint32_t i;
    int fails = 0;
    for (i = 0; i < 65536; i++) {
        uint16_t v = (uint16_t)i;
        double a, b;
        zero_convert(&a, ZERO_F64, &v, ZERO_F16, 1, ZERO_SIMD_AUTO);
        zero_convert(&b, ZERO_F64, &v, ZERO_BF16, 1, ZERO_SIMD_AUTO);
        if (d2u(a) != d2u((double)zero_f16_to_f32(v)) && !isnan(a)) fails++;
        if (d2u(b) != d2u((double)zero_bf16_to_f32(v)) && !isnan(b)) fails++;
        if (isnan(a) && d2u(a) != (((uint64_t)(i >> 15) << 63) | 0x7ff8000000000000ull | ((uint64_t)(i & 0x3ffu) << 42))) fails++;
        if (isnan(b) && d2u(b) != (((uint64_t)(i >> 15) << 63) | 0x7ff8000000000000ull | ((uint64_t)(i & 0x7fu) << 45))) fails++;
    }
    zt_seed(9);
    for (i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)zt_rand64();
        float f = u2f(u);
        double d;
        if (i < 4) u = i == 0 ? 1u : i == 1 ? 0x807fffffu : i == 2 ? 0x7f800001u : 0xff800000u;
        f = u2f(u);
        zero_convert(&d, ZERO_F64, &f, ZERO_F32, 1, ZERO_SIMD_AUTO);
        if (is_nan32(u)) {
            if (d2u(d) != (((uint64_t)(u >> 31) << 63) | 0x7ff8000000000000ull | ((uint64_t)(u & 0x7fffffu) << 29))) fails++;
        } else {
            int nan;
            if (d != ref_decode(&F32, u, &nan) || !signbit(d) != !signbit(f)) fails++;
        }
    }
    ZT_CHECKF(fails == 0, "%d wrong", fails);
}

/* ---- bulk: every path, every pair, odd lengths, misaligned pointers ---- */

static const zero_dtype dtypes[4] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64};

/* Fills n elements of dtype dt at p (any alignment) with random and edge bit patterns. */
static void fill_bits(unsigned char *p, zero_dtype dt, size_t n)
{
    size_t i, sz = zero_dtype_size(dt);
    static const uint32_t e32[] = {0x7f800001u, 0xffc00000u, 0x477ff000u, 0x477fefffu, 0x33000000u,
                                   0x33000001u, 0x7f7f8000u, 0x00008000u, 0x3f808000u, 0x3f818000u,
                                   0x80000000u, 0x7f800000u, 0x387fe000u, 0x3f801000u, 0x3f803000u};
    for (i = 0; i < n; i++) {
        uint64_t r = zt_rand64();
        if (dt == ZERO_F32) {
            uint32_t u = (uint32_t)r;
            if (r >> 60 == 0) u = e32[(r >> 32) % (sizeof e32 / sizeof e32[0])];
            else if (r >> 62 == 1) u = (u & 0x807fffffu) | ((uint32_t)(101 + (r >> 40) % 44) << 23);
            memcpy(p + 4 * i, &u, 4);
        } else if (dt == ZERO_F64) {
            if (r >> 62 == 1) r = (r & 0x800fffffffffffffull) | ((uint64_t)(990 + (r >> 40) % 60) << 52);
            memcpy(p + 8 * i, &r, 8);
        } else {
            uint16_t u = (uint16_t)r;
            memcpy(p + sz * i, &u, 2);
        }
    }
}

/* The expected result of element i converted from st to dt, as bits in out (8 bytes). */
static void expect_elem(const unsigned char *s, zero_dtype st, zero_dtype dt, size_t i, unsigned char *out)
{
    float f = 0.0f;
    uint16_t h;
    if (st == dt) {
        memcpy(out, s + i * zero_dtype_size(st), zero_dtype_size(st));
        return;
    }
    if (st == ZERO_F64 || dt == ZERO_F64) { /* checked against references above */
        zero_convert(out, dt, s + i * zero_dtype_size(st), st, 1, ZERO_SIMD_PORTABLE);
        return;
    }
    if (st == ZERO_F32) memcpy(&f, s + 4 * i, 4);
    else {
        memcpy(&h, s + 2 * i, 2);
        f = st == ZERO_F16 ? zero_f16_to_f32(h) : zero_bf16_to_f32(h);
    }
    if (dt == ZERO_F32) memcpy(out, &f, 4);
    else {
        h = dt == ZERO_F16 ? zero_f32_to_f16(f) : zero_f32_to_bf16(f);
        memcpy(out, &h, 2);
    }
}

static int check_bulk(zero_dtype dt, zero_dtype st, size_t n, size_t soff, size_t doff,
                      zero_simd simd)
{
    size_t ds = zero_dtype_size(dt), ss = zero_dtype_size(st), i, guard = 24;
    unsigned char *sbuf = (unsigned char *)malloc(n * ss + 16);
    unsigned char *dbuf = (unsigned char *)malloc(n * ds + 16 + 2 * guard);
    unsigned char *s = sbuf + soff, *d = dbuf + guard + doff;
    int bad = 0;
    memset(sbuf, 0x5a, n * ss + 16);
    fill_bits(s, st, n);
    memset(dbuf, 0xa5, n * ds + 16 + 2 * guard);
    if (zero_convert(d, dt, s, st, n, simd) != ZERO_OK) bad++;
    for (i = 0; i < n && bad < 5; i++) {
        unsigned char want[8];
        expect_elem(s, st, dt, i, want);
        if (memcmp(want, d + i * ds, ds) != 0) {
            bad++;
            fprintf(stderr, "  %s<-%s n=%zu offs %zu/%zu %s: element %zu differs\n",
                    zero_dtype_name(dt), zero_dtype_name(st), n, soff, doff, zero_simd_name(simd), i);
        }
    }
    for (i = 0; i < guard + doff; i++)
        if (dbuf[i] != 0xa5) bad++;
    for (i = 0; i < guard; i++)
        if (d[n * ds + i] != 0xa5) bad++;
    free(sbuf);
    free(dbuf);
    return bad;
}

ZT_TEST(bulk_every_path_pair_length_alignment)
{
    zero_simd paths[4] = {ZERO_SIMD_PORTABLE, ZERO_SIMD_AVX2, ZERO_SIMD_AVX512, ZERO_SIMD_AUTO};
    zero_simd best = zero_simd_detect();
    int p, a, b, bad = 0, tried = 0;
    size_t n, off;
    zt_seed(11);
    for (p = 0; p < 4; p++) {
        if (paths[p] != ZERO_SIMD_AUTO && paths[p] > best) {
            printf("  (path %s not supported here: not tested)\n", zero_simd_name(paths[p]));
            continue;
        }
        for (a = 0; a < 4; a++)
            for (b = 0; b < 4; b++) {
                for (n = 0; n <= 70; n++) {
                    off = n % 4; /* byte offsets 0..3 on both sides, varied with n */
                    bad += check_bulk(dtypes[a], dtypes[b], n, off, (off * 3 + n / 4) % 4, paths[p]);
                    tried++;
                }
                bad += check_bulk(dtypes[a], dtypes[b], zt_quick() ? 20011 : 200003, 1, 3, paths[p]);
            }
    }
    ZT_CHECKF(bad == 0 && tried > 0, "%d mismatches", bad);
}

ZT_TEST(simd_paths_identical_on_edges)
{
    /* the vector paths against the portable one on every edge and NaN input, both ways */
    static float e[800000];
    static uint16_t want[800000], got[800000];
    static float wf[65536], gf[65536];
    static uint16_t all[65536];
    size_t n = edges_for(&F16, e, 400000), i;
    int p, k;
    n += edges_for(&BF16v, e + n, 400000);
    for (i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    for (p = ZERO_SIMD_AVX2; p <= ZERO_SIMD_AVX512; p++) {
        if ((zero_simd)p > zero_simd_detect()) continue;
        for (k = 0; k < 2; k++) {
            zero_dtype h = k ? ZERO_BF16 : ZERO_F16;
            zero_convert(want, h, e, ZERO_F32, n, ZERO_SIMD_PORTABLE);
            zero_convert(got, h, e, ZERO_F32, n, (zero_simd)p);
            ZT_CHECKF(memcmp(want, got, n * 2) == 0, "%s f32->%s", zero_simd_name((zero_simd)p), zero_dtype_name(h));
            zero_convert(wf, ZERO_F32, all, h, 65536, ZERO_SIMD_PORTABLE);
            zero_convert(gf, ZERO_F32, all, h, 65536, (zero_simd)p);
            ZT_CHECKF(memcmp(wf, gf, sizeof wf) == 0, "%s %s->f32", zero_simd_name((zero_simd)p), zero_dtype_name(h));
        }
    }
}

/* f32 -> bf16 on every path against the scalar function, for every one of the 65536 high
   halves (every sign, exponent, NaN and infinity) with the low halves that decide the
   rounding: 0, 1, just below, at and just above the tie, and all ones (a NaN whose payload
   sits only in the low half must stay NaN). */
ZT_TEST(bf16_rounding_every_high_half_every_path)
{
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    enum { NL = sizeof lows / sizeof lows[0] };
    static float x[65536 * NL];
    static uint16_t want[65536 * NL], got[65536 * NL];
    size_t i, n = 65536 * NL;
    int p;
    for (i = 0; i < n; i++) x[i] = u2f((uint32_t)(i / NL) << 16 | lows[i % NL]);
    for (i = 0; i < n; i++) want[i] = zero_f32_to_bf16(x[i]);
    for (p = ZERO_SIMD_PORTABLE; p <= (int)zero_simd_detect(); p++) {
        size_t bad = 0, first = 0;
        memset(got, 0, sizeof got);
        ZT_CHECK(zero_convert(got, ZERO_BF16, x, ZERO_F32, n, (zero_simd)p) == ZERO_OK);
        for (i = 0; i < n; i++)
            if (got[i] != want[i] && bad++ == 0) first = i;
        ZT_CHECKF(bad == 0, "%s: %zu of %zu differ, first %08x -> %04x (want %04x)", zero_simd_name((zero_simd)p),
                  bad, n, f2u(x[first]), got[first], want[first]);
    }
}

#ifdef ZERO__X86_SIMD
ZT_TEST(simd_ignores_ftz_daz)
{
    /* A program built with -ffast-math runs with FTZ and DAZ set; the results must not
       change (the scalar path is integer-only; F16C and the bf16 integer path ignore them). */
    static float e[400000], wf[65536], gf[65536];
    static uint16_t want[400000], got[400000], all[65536];
    size_t n = edges_for(&F16, e, 400000), i;
    unsigned csr = _mm_getcsr();
    int p, k;
    for (i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    for (k = 0; k < 2; k++) {
        zero_dtype h = k ? ZERO_BF16 : ZERO_F16;
        zero_convert(want, h, e, ZERO_F32, n, ZERO_SIMD_PORTABLE);
        zero_convert(wf, ZERO_F32, all, h, 65536, ZERO_SIMD_PORTABLE);
        for (p = ZERO_SIMD_PORTABLE; p <= (int)zero_simd_detect(); p++) {
            _mm_setcsr(csr | 0x8040u); /* FTZ | DAZ */
            zero_convert(got, h, e, ZERO_F32, n, (zero_simd)p);
            zero_convert(gf, ZERO_F32, all, h, 65536, (zero_simd)p);
            _mm_setcsr(csr);
            ZT_CHECKF(memcmp(want, got, n * 2) == 0, "%s f32->%s", zero_simd_name((zero_simd)p), zero_dtype_name(h));
            ZT_CHECKF(memcmp(wf, gf, sizeof wf) == 0, "%s %s->f32", zero_simd_name((zero_simd)p), zero_dtype_name(h));
        }
    }
}

/* The fixed-name helpers other kernels use; 0 when they match the scalar functions. */
ZERO__AVX2 static int helpers_avx2(const uint16_t *h, const uint16_t *b, const float *f)
{
    float t[8];
    uint16_t oh[8], ob[8];
    int i, bad = 0;
    _mm256_storeu_ps(t, zero__f16x8_to_f32_avx2(h));
    for (i = 0; i < 8; i++) bad += f2u(t[i]) != f2u(zero_f16_to_f32(h[i]));
    _mm256_storeu_ps(t, zero__bf16x8_to_f32_avx2(b));
    for (i = 0; i < 8; i++) bad += f2u(t[i]) != f2u(zero_bf16_to_f32(b[i]));
    zero__f32_to_f16x8_avx2(oh, _mm256_loadu_ps(f));
    zero__f32_to_bf16x8_avx2(ob, _mm256_loadu_ps(f));
    for (i = 0; i < 8; i++) bad += oh[i] != zero_f32_to_f16(f[i]) || ob[i] != zero_f32_to_bf16(f[i]);
    return bad;
}

ZERO__AVX512 static int helpers_avx512(const uint16_t *h, const uint16_t *b, const float *f)
{
    float t[16];
    uint16_t oh[16], ob[16];
    int i, bad = 0;
    _mm512_storeu_ps(t, zero__f16x16_to_f32_avx512(h));
    for (i = 0; i < 16; i++) bad += f2u(t[i]) != f2u(zero_f16_to_f32(h[i]));
    _mm512_storeu_ps(t, zero__bf16x16_to_f32_avx512(b));
    for (i = 0; i < 16; i++) bad += f2u(t[i]) != f2u(zero_bf16_to_f32(b[i]));
    zero__f32_to_f16x16_avx512(oh, _mm512_loadu_ps(f));
    zero__f32_to_bf16x16_avx512(ob, _mm512_loadu_ps(f));
    for (i = 0; i < 16; i++) bad += oh[i] != zero_f32_to_f16(f[i]) || ob[i] != zero_f32_to_bf16(f[i]);
    return bad;
}

ZT_TEST(shared_helpers_match_scalar)
{
    uint16_t h[16], b[16];
    float f[16];
    int i, j, bad = 0, ran = 0;
    zt_seed(5);
    for (j = 0; j < 20000; j++) {
        for (i = 0; i < 16; i++) {
            uint32_t u = (uint32_t)zt_rand64();
            h[i] = (uint16_t)u;
            b[i] = (uint16_t)(u >> 16);
            f[i] = u2f((uint32_t)zt_rand64());
            if (j & 1) f[i] = u2f((f2u(f[i]) & 0x807fffffu) | ((uint32_t)(101 + u % 44) << 23));
        }
        if (zero_simd_detect() >= ZERO_SIMD_AVX2) bad += helpers_avx2(h, b, f), ran = 1;
        if (zero_simd_detect() >= ZERO_SIMD_AVX512) bad += helpers_avx512(h, b, f);
    }
    if (!ran) ZT_SKIP("no AVX2 on this CPU");
    ZT_CHECKF(bad == 0, "%d lanes differ", bad);
}
#endif

/* ---- detection and errors ---- */

ZT_TEST(simd_detect_and_override)
{
    zero_simd best;
    unsetenv("ZERO_SIMD");
    best = zero_simd_detect();
    printf("  simd: %s\n", zero_simd_name(best));
    ZT_CHECK(best >= ZERO_SIMD_PORTABLE && best <= ZERO_SIMD_AVX512);
#if defined(ZERO_NO_SIMD) || !(defined(__x86_64__) || defined(__i386__))
    ZT_CHECK(best == ZERO_SIMD_PORTABLE);
#endif
    setenv("ZERO_SIMD", "portable", 1);
    ZT_CHECK(zero_simd_detect() == ZERO_SIMD_PORTABLE);
    setenv("ZERO_SIMD", "avx2", 1);
    ZT_CHECK(zero_simd_detect() == (best < ZERO_SIMD_AVX2 ? best : ZERO_SIMD_AVX2));
    setenv("ZERO_SIMD", "avx512", 1);
    ZT_CHECK(zero_simd_detect() == best); /* never above the CPU */
    setenv("ZERO_SIMD", "sse9", 1);
    ZT_CHECK(zero_simd_detect() == best);
    unsetenv("ZERO_SIMD");
    ZT_CHECK(strcmp(zero_simd_name(ZERO_SIMD_PORTABLE), "portable") == 0);
    ZT_CHECK(strcmp(zero_simd_name(ZERO_SIMD_AVX2), "avx2") == 0);
    ZT_CHECK(strcmp(zero_simd_name(ZERO_SIMD_AVX512), "avx512") == 0);
    ZT_CHECK(strcmp(zero_simd_name((zero_simd)9), "?") == 0);
}

ZT_TEST(convert_errors)
{
    float f[4] = {1, 2, 3, 4};
    uint16_t h[4] = {1, 2, 3, 4};
    ZT_CHECK(zero_convert(h, ZERO_DTYPE_DEFAULT, f, ZERO_F32, 4, ZERO_SIMD_AUTO) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "dtype") != NULL);
    ZT_CHECK(zero_convert(h, ZERO_F16, f, (zero_dtype)5, 4, ZERO_SIMD_AUTO) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_convert(NULL, ZERO_F16, f, ZERO_F32, 4, ZERO_SIMD_AUTO) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_convert(h, ZERO_F16, NULL, ZERO_F32, 4, ZERO_SIMD_AUTO) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_convert(NULL, ZERO_F16, NULL, ZERO_F32, 0, ZERO_SIMD_AUTO) == ZERO_OK);
    ZT_CHECK(zero_convert(h, ZERO_F16, f, ZERO_F32, 4, (zero_simd)4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_convert(h, ZERO_F16, f, ZERO_F32, 4, (zero_simd)-1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_convert(h, ZERO_F16, f, ZERO_F32, (size_t)-1 / 2, ZERO_SIMD_AUTO) == ZERO_ERROR_OVERFLOW);
    ZT_CHECK(zero_convert(h, ZERO_F64, h, ZERO_F16, (size_t)-1 / 4, ZERO_SIMD_AUTO) == ZERO_ERROR_OVERFLOW);
    if (zero_simd_detect() < ZERO_SIMD_AVX512) {
        ZT_CHECK(zero_convert(h, ZERO_F16, f, ZERO_F32, 4, ZERO_SIMD_AVX512) == ZERO_ERROR_UNSUPPORTED);
        ZT_CHECK(strstr(zero_last_error(), "avx512") != NULL);
    }
    ZT_CHECKF(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4, "a failed call wrote");
    /* same dtype is a copy, overlap allowed */
    ZT_CHECK(zero_convert(h + 1, ZERO_F16, h, ZERO_F16, 3, ZERO_SIMD_AUTO) == ZERO_OK);
    ZT_CHECK(h[0] == 1 && h[1] == 1 && h[2] == 2 && h[3] == 3);
}

int main(void)
{
    BF16v = BF16;
    BF16v.maxfin = ldexp(255.0, 120); /* (2 - 2^-7) * 2^127 */
    ZT_RUN(f16_decode_all_65536);
    ZT_RUN(f16_round_trip_all_65536);
    ZT_RUN(bf16_decode_and_round_trip_all_65536);
    ZT_RUN(f32_to_f16_bf16_named_cases);
    ZT_RUN(f32_to_f16_bf16_edges);
    ZT_RUN(f32_to_f16_bf16_random_patterns);
    ZT_RUN(f64_pairs_against_references);
    ZT_RUN(widening_to_f64_is_exact);
    ZT_RUN(bulk_every_path_pair_length_alignment);
    ZT_RUN(simd_paths_identical_on_edges);
    ZT_RUN(bf16_rounding_every_high_half_every_path);
#ifdef ZERO__X86_SIMD
    ZT_RUN(simd_ignores_ftz_daz);
    ZT_RUN(shared_helpers_match_scalar);
#endif
    ZT_RUN(simd_detect_and_override);
    ZT_RUN(convert_errors);
    return zt_summary();
}
