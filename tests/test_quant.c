/* Block quantization (zero_quantize / zero_dequantize / zero_dequantize_sum): every block
   of every dtype (f32, f16, bf16) and width (int8, int4) against the documented bound,
   computed here in double from the input and the stored scale; the layout decoded by an
   independent reader; all-zero, non-finite and tail blocks; the fp32 sum of qgZ against a
   double sum; hierarchical qgZ's two quantizations per block against their scales. */
#include "zero.h"
#include "tests/zt.h"

#include <float.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double unif(void) { return (double)(rng() >> 11) / 9007199254740992.0; }

static const zero_dtype dtypes[3] = {ZERO_F32, ZERO_F16, ZERO_BF16};

static double load(const void *x, zero_dtype dt, size_t i)
{
    if (dt == ZERO_F32) return (double)((const float *)x)[i];
    if (dt == ZERO_F16) return (double)zero_f16_to_f32(((const uint16_t *)x)[i]);
    return (double)zero_bf16_to_f32(((const uint16_t *)x)[i]);
}

static void store(void *x, zero_dtype dt, size_t i, float v)
{
    if (dt == ZERO_F32) ((float *)x)[i] = v;
    else if (dt == ZERO_F16) ((uint16_t *)x)[i] = zero_f32_to_f16(v);
    else ((uint16_t *)x)[i] = zero_f32_to_bf16(v);
}

/* Half the spacing of dtype dt's values at magnitude v (at least half its least subnormal). */
static double half_ulp(zero_dtype dt, double v)
{
    double rel = dt == ZERO_F32 ? ldexp(1.0, -24) : dt == ZERO_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    double sub = dt == ZERO_F32 ? ldexp(1.0, -150) : dt == ZERO_F16 ? ldexp(1.0, -25) : ldexp(1.0, -134);
    return v * rel > sub ? v * rel : sub;
}

/* The independent reader of the layout: scale of block k, code of element i. */
static float rd_scale(const unsigned char *q, size_t k)
{
    float s;
    memcpy(&s, q + 4 * k, 4);
    return s;
}
static int rd_code(const unsigned char *q, size_t nb, int bits, size_t i)
{
    const unsigned char *c = q + 4 * nb;
    if (bits == 8) return (int)(signed char)c[i];
    {
        int v = (i % 2 == 0) ? (c[i / 2] & 15) : (c[i / 2] >> 4);
        return v > 7 ? v - 16 : v;
    }
}

/* Fills x (n elements of dt): each block of 'block' gets its own magnitude; block kinds by
   k % 7: 0 all zero, 1 one outlier, 2 inf (fp types), 3 NaN, others random. mag_lo/hi as
   powers of two. Returns nothing; 'nonfinite' marks the blocks that got inf/NaN. */
static void fill(void *x, zero_dtype dt, size_t n, size_t block, int with_nonfinite,
                 unsigned char *nonfinite)
{
    size_t nb = (n + block - 1) / block, k, i;
    int elo = dt == ZERO_F16 ? -20 : -120, ehi = dt == ZERO_F16 ? 14 : 110;
    for (k = 0; k < nb; k++) {
        size_t i0 = k * block, len = n - i0 < block ? n - i0 : block;
        int kind = (int)(k % 7);
        double mag = ldexp(1.0, elo + (int)(rng() % (uint64_t)(ehi - elo)));
        nonfinite[k] = 0;
        for (i = 0; i < len; i++) {
            double v = (2.0 * unif() - 1.0) * mag;
            if (kind == 0) v = (i % 3 == 0) ? -0.0 : 0.0;
            if (kind == 1 && i == len / 2) v = mag * 1000.0 > 6e4 && dt == ZERO_F16 ? 6e4 : mag * 1000.0;
            store(x, dt, i0 + i, (float)v);
        }
        if (with_nonfinite && kind == 2) {
            store(x, dt, i0 + len - 1, (float)(len % 2 ? -INFINITY : INFINITY));
            nonfinite[k] = 1;
        }
        if (with_nonfinite && kind == 3) {
            store(x, dt, i0, NAN);
            nonfinite[k] = 1;
        }
    }
}

/* Round trip of n elements: every block within the bound, the layout as documented. */
static void round_trip(zero_dtype dt, zero_dtype out_dt, int bits, size_t block, size_t n,
                       int *bad_blocks)
{
    size_t es = zero_dtype_size(dt), bytes = 0, nb = (n + block - 1) / block, k, i, expect;
    void *x = malloc(n * es + 1), *y = malloc(n * zero_dtype_size(out_dt) + 1);
    unsigned char *q, *nonfinite = (unsigned char *)malloc(nb + 1);
    int Q = bits == 8 ? 127 : 7;
    zero_result r;
    r = zero_quant_bytes(n, bits, block, &bytes);
    expect = 4 * nb + (bits == 8 ? n : (n + 1) / 2);
    expect = (expect + 3) / 4 * 4;
    ZT_CHECKF(r == ZERO_OK && bytes == expect, "bytes %zu expect %zu", bytes, expect);
    q = (unsigned char *)malloc(bytes + 1);
    fill(x, dt, n, block, 1, nonfinite);
    memset(q, 0xa5, bytes);
    ZT_CHECK(zero_quantize(q, x, dt, n, bits, block) == ZERO_OK);
    ZT_CHECK(zero_dequantize(y, out_dt, q, n, bits, block) == ZERO_OK);
    for (i = 4 * nb + (bits == 8 ? n : (n + 1) / 2); i < bytes; i++) ZT_CHECK(q[i] == 0);
    if (bits == 4 && n % 2) ZT_CHECK((q[4 * nb + n / 2] >> 4) == 0);
    for (k = 0; k < nb; k++) {
        size_t i0 = k * block, len = n - i0 < block ? n - i0 : block;
        double amax = 0.0, s = (double)rd_scale(q, k), bound;
        int ok = 1;
        for (i = i0; i < i0 + len; i++)
            if (fabs(load(x, dt, i)) > amax) amax = fabs(load(x, dt, i));
        if (nonfinite[k]) {
            ok = s != s;
            for (i = i0; i < i0 + len; i++) ok = ok && load(y, out_dt, i) != load(y, out_dt, i);
            if (!ok) (*bad_blocks)++;
            continue;
        }
        if (amax == 0.0) {
            ok = s == 0.0;
            for (i = i0; i < i0 + len; i++) {
                double v = load(y, out_dt, i);
                ok = ok && v == 0.0 && !signbit(v);
            }
            if (!ok) (*bad_blocks)++;
            continue;
        }
        /* the scale: amax / Q rounded up, by at most two fp32 steps (subnormal: absolute) */
        ok = s >= amax / Q && s <= amax / Q * (1.0 + ldexp(1.0, -22)) + ldexp(1.0, -148);
        bound = s / 2 + s * ldexp(1.0, -16) + half_ulp(ZERO_F32, amax) + half_ulp(out_dt, amax);
        for (i = i0; i < i0 + len; i++) {
            double xi = load(x, dt, i), yi = load(y, out_dt, i);
            int c = rd_code(q, nb, bits, i);
            /* the code is the nearest integer to x / s, up to the fp32 division's rounding
               (relative 2^-24 of |x / s| <= Q: below 2^-16) */
            ok = ok && c >= -Q && c <= Q && fabs((double)c - xi / s) <= 0.5 + ldexp(1.0, -16);
            ok = ok && fabs(xi - yi) <= bound;
            /* and the dequantized value is the code times the scale, rounded to out_dt */
            if (out_dt == ZERO_F32) ok = ok && (float)yi == (float)c * (float)s;
        }
        if (!ok) {
            if (*bad_blocks < 3)
                fprintf(stderr, "  block %zu (%s -> %s, int%d, block %zu, n %zu): amax %g s %g\n", k,
                        zero_dtype_name(dt), zero_dtype_name(out_dt), bits, block, n, amax, s);
            (*bad_blocks)++;
        }
    }
    free(x);
    free(y);
    free(q);
    free(nonfinite);
}

ZT_TEST(bound_every_block)
{
    static const size_t blocks[4] = {256, 2, 6, 1024};
    static const size_t sizes[5] = {1, 7, 256, 1000, 5003};
    int d, o, bits, b, s, bad = 0, runs = 0;
    for (d = 0; d < 3; d++)
        for (o = 0; o < 3; o++)
            for (bits = 4; bits <= 8; bits += 4)
                for (b = 0; b < 4; b++)
                    for (s = 0; s < 5; s++) {
                        if (dtypes[o] == ZERO_F16 && dtypes[d] != ZERO_F16)
                            continue; /* fp16 cannot hold the other dtypes' range */
                        round_trip(dtypes[d], dtypes[o], bits, blocks[b], sizes[s], &bad);
                        runs++;
                    }
    ZT_CHECKF(bad == 0, "%d blocks out of bound in %d runs", bad, runs);
}

/* The worst error seen over many random blocks is close to the bound's s/2 term: the bound
   is tight, not vacuous (and int4's is 127/7 times int8's, relative to absmax). */
ZT_TEST(bound_is_tight)
{
    size_t n = 256 * 64, i;
    float *x = (float *)malloc(n * 4), *y = (float *)malloc(n * 4);
    size_t bytes = 0;
    unsigned char *q;
    int bits;
    for (bits = 4; bits <= 8; bits += 4) {
        double worst = 0.0;
        int Q = bits == 8 ? 127 : 7;
        ZT_CHECK(zero_quant_bytes(n, bits, 256, &bytes) == ZERO_OK);
        q = (unsigned char *)malloc(bytes);
        for (i = 0; i < n; i++) x[i] = (float)(2.0 * unif() - 1.0);
        ZT_CHECK(zero_quantize(q, x, ZERO_F32, n, bits, 256) == ZERO_OK);
        ZT_CHECK(zero_dequantize(y, ZERO_F32, q, n, bits, 256) == ZERO_OK);
        for (i = 0; i < n; i++) {
            double s = (double)rd_scale(q, i / 256), e = fabs((double)x[i] - (double)y[i]) / s;
            if (e > worst) worst = e;
        }
        ZT_CHECKF(worst > 0.49 && worst <= 0.5 + 1e-4, "int%d: worst error %g scales", bits, worst);
        (void)Q;
        free(q);
    }
    free(x);
    free(y);
}

/* qgZ's reduction: count buffers dequantized and summed in fp32 against the double sum of
   the same dequantized values (at most count - 1 fp32 roundings plus the output's). */
ZT_TEST(dequantize_sum)
{
    size_t n = 777, block = 64, bytes = 0, stride, i;
    int count, d, bits;
    for (d = 0; d < 3; d++)
        for (bits = 4; bits <= 8; bits += 4)
            for (count = 1; count <= 8; count += 3) {
                unsigned char *q, nf[16];
                float *one = (float *)malloc(n * 4);
                double *ref = (double *)calloc(n, sizeof(double)), *mag = (double *)calloc(n, sizeof(double));
                void *x = malloc(n * 4), *y = malloc(n * 4);
                int j, bad = 0;
                ZT_CHECK(zero_quant_bytes(n, bits, block, &bytes) == ZERO_OK);
                stride = bytes + 12; /* a stride above the size works */
                q = (unsigned char *)malloc(stride * (size_t)count);
                for (j = 0; j < count; j++) {
                    for (i = 0; i < n; i++) store(x, dtypes[d], i, (float)(2.0 * unif() - 1.0) * (float)(j + 1));
                    (void)nf;
                    ZT_CHECK(zero_quantize(q + (size_t)j * stride, x, dtypes[d], n, bits, block) == ZERO_OK);
                    ZT_CHECK(zero_dequantize(one, ZERO_F32, q + (size_t)j * stride, n, bits, block) == ZERO_OK);
                    for (i = 0; i < n; i++) {
                        ref[i] += (double)one[i];
                        mag[i] += fabs((double)one[i]);
                    }
                }
                ZT_CHECK(zero_dequantize_sum(y, dtypes[d], q, stride, count, n, bits, block) == ZERO_OK);
                for (i = 0; i < n; i++) {
                    double v = load(y, dtypes[d], i);
                    if (fabs(v - ref[i]) > (double)(count - 1) * ldexp(1.0, -24) * mag[i] +
                                               half_ulp(dtypes[d], fabs(ref[i]) + mag[i] * 1e-6))
                        bad++;
                }
                ZT_CHECKF(bad == 0, "%s int%d count %d: %d elements off", zero_dtype_name(dtypes[d]), bits,
                          count, bad);
                free(q);
                free(one);
                free(ref);
                free(mag);
                free(x);
                free(y);
            }
}


/* Hierarchical qgZ's arithmetic (the engine's quantized_gradient_levels = 2), composed from
   the public primitives: N ranks' contributions to one shard, each quantized (scale s_r per
   block); per node the R dequantized in fp32 in local-rank order, that partial sum
   re-quantized (scale t_k per block); the M = N / R nodes' dequantized and summed in fp32,
   rounded once to T. Per block b, against the double sum of the inputs:
       |y_i - x_i| <= (1/2 + 2^-16) (sum_r s_rb + sum_k t_kb) + fp32 sums + hT
   (each quantization's bound from the Quantization section; the fp32 roundings of the
   products and sums at most 2^-22 N Q (sum_r s_rb + sum_k t_kb)). Every block checked, with
   magnitudes that vary by block (so the scales differ), and the worst error seen reported
   against the scale terms (the bound is reached, not vacuous). */
ZT_TEST(two_level_sum_per_block)
{
    static const int cases[][2] = {{4, 2}, {8, 2}, {8, 4}};
    size_t n = 777, block = 64, bytes = 0, nb = (777 + 63) / 64, i, b;
    int ci, d, bits;
    for (ci = 0; ci < 3; ci++)
        for (d = 0; d < 3; d += 2) /* f32 and bf16 params */
            for (bits = 4; bits <= 8; bits += 4) {
                int N = cases[ci][0], R = cases[ci][1], M = N / R, r, k, Q = bits == 8 ? 127 : 7, bad = 0;
                double worst = 0.0, h = 0.5 + ldexp(1.0, -16);
                unsigned char *q1, *q2;
                float *part = (float *)malloc(n * 4);
                double *ref = (double *)calloc(n, sizeof(double)), *sc = (double *)calloc(nb, sizeof(double));
                void *x = malloc(n * 4), *y = malloc(n * 4);
                ZT_CHECK(zero_quant_bytes(n, bits, block, &bytes) == ZERO_OK);
                q1 = (unsigned char *)malloc(bytes * (size_t)N);
                q2 = (unsigned char *)malloc(bytes * (size_t)M);
                for (r = 0; r < N; r++) { /* rank r = k R + j's buffer at q1 + r bytes: node k's R consecutive */
                    for (i = 0; i < n; i++) {
                        double mag = pow(10.0, (double)((i / block * 7 + (size_t)r) % 5) - 2.0);
                        store(x, dtypes[d], i, (float)((2.0 * unif() - 1.0) * mag));
                        ref[i] += load(x, dtypes[d], i);
                    }
                    ZT_CHECK(zero_quantize(q1 + (size_t)r * bytes, x, dtypes[d], n, bits, block) == ZERO_OK);
                    for (b = 0; b < nb; b++) sc[b] += (double)rd_scale(q1 + (size_t)r * bytes, b);
                }
                for (k = 0; k < M; k++) {
                    ZT_CHECK(zero_dequantize_sum(part, ZERO_F32, q1 + (size_t)k * R * bytes, bytes, R, n, bits,
                                                 block) == ZERO_OK);
                    ZT_CHECK(zero_quantize(q2 + (size_t)k * bytes, part, ZERO_F32, n, bits, block) == ZERO_OK);
                    for (b = 0; b < nb; b++) sc[b] += (double)rd_scale(q2 + (size_t)k * bytes, b);
                }
                ZT_CHECK(zero_dequantize_sum(y, dtypes[d], q2, bytes, M, n, bits, block) == ZERO_OK);
                for (i = 0; i < n; i++) {
                    double S = sc[i / block], e = fabs(load(y, dtypes[d], i) - ref[i]);
                    double bound = h * S + ldexp(1.0, -22) * N * Q * S + half_ulp(dtypes[d], fabs(ref[i]) + h * S);
                    if (!(e <= bound)) bad++;
                    if (S > 0.0 && e / (h * S) > worst) worst = e / (h * S);
                }
                ZT_CHECKF(bad == 0, "N %d R %d %s int%d: %d elements beyond their block's bound", N, R,
                          zero_dtype_name(dtypes[d]), bits, bad);
                ZT_CHECKF(worst > 0.2, "N %d R %d %s int%d: worst error only %.3f of the scale terms", N, R,
                          zero_dtype_name(dtypes[d]), bits, worst);
                if (d == 0)
                    printf("  N %d R %d int%d: worst error %.3f of (1/2 + 2^-16)(sum s + sum t)\n", N, R, bits,
                           worst);
                free(q1);
                free(q2);
                free(part);
                free(ref);
                free(sc);
                free(x);
                free(y);
            }
}

/* An inf in one rank's gradient block makes the summed block NaN: the scaler sees it. */
ZT_TEST(nonfinite_reaches_the_sum)
{
    size_t n = 300, bytes = 0, i;
    unsigned char *q;
    uint16_t x[300];
    float y[300];
    int j, nan_count = 0;
    ZT_CHECK(zero_quant_bytes(n, 4, 256, &bytes) == ZERO_OK);
    q = (unsigned char *)malloc(bytes * 4);
    for (j = 0; j < 4; j++) {
        for (i = 0; i < n; i++) x[i] = zero_f32_to_f16(0.5f);
        if (j == 2) x[10] = 0x7c00; /* fp16 +inf: an overflowed gradient */
        ZT_CHECK(zero_quantize(q + (size_t)j * bytes, x, ZERO_F16, n, 4, 256) == ZERO_OK);
    }
    ZT_CHECK(zero_dequantize_sum(y, ZERO_F32, q, bytes, 4, n, 4, 256) == ZERO_OK);
    for (i = 0; i < n; i++) nan_count += y[i] != y[i];
    ZT_CHECKF(nan_count == 256, "%d NaN (the first block's 256 expected)", nan_count);
    for (i = 256; i < n; i++) ZT_CHECK(y[i] == 2.0f);
    free(q);
}

ZT_TEST(bad_arguments)
{
    size_t bytes = 7;
    float x[4] = {1, 2, 3, 4};
    unsigned char q[64];
    ZT_CHECK(zero_quant_bytes(10, 5, 256, &bytes) == ZERO_ERROR_INVALID_ARGUMENT && bytes == 7);
    ZT_CHECK(zero_quant_bytes(10, 8, 3, &bytes) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_quant_bytes(10, 8, 0, &bytes) == ZERO_OK && bytes == 4 + 12);
    ZT_CHECK(zero_quant_bytes(SIZE_MAX, 8, 2, &bytes) == ZERO_ERROR_OVERFLOW);
    ZT_CHECK(zero_quantize(q, x, ZERO_F64, 4, 8, 256) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_quantize(NULL, x, ZERO_F32, 4, 8, 256) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_quantize(q, x, ZERO_F32, 4, 8, 256) == ZERO_OK);
    ZT_CHECK(zero_dequantize_sum(x, ZERO_F32, q, 4, 2, 4, 8, 256) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_dequantize_sum(x, ZERO_F32, q, 8, 0, 4, 8, 256) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "count") != NULL);
}

int main(void)
{
    ZT_RUN(bound_every_block);
    ZT_RUN(bound_is_tight);
    ZT_RUN(dequantize_sum);
    ZT_RUN(two_level_sum_per_block);
    ZT_RUN(nonfinite_reaches_the_sum);
    ZT_RUN(bad_arguments);
    return zt_summary();
}
