/* Bulk conversion throughput: every SIMD path this CPU has against the portable path and
   against memcpy of the same input bytes, in the same run, one thread. Throughput counts
   the bytes read plus the bytes written (memcpy: 2 x input bytes). Two sizes: one that
   stays in cache (L2) and one that streams from memory. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h" /* bench_now */

static volatile unsigned char sink;

/* Best time of 'reps' rounds, each repeating the call until it has run >= min_s seconds;
   returns seconds per call. path < 0: memcpy of n * ssize bytes. */
static double measure(void *dst, zero_dtype dt, const void *src, zero_dtype st, size_t n,
                      int path, double min_s, int reps)
{
    double best = 1e30;
    int r;
    for (r = 0; r < reps; r++) {
        double t0 = bench_now(), t;
        long calls = 0;
        do {
            if (path < 0) memcpy(dst, src, n * zero_dtype_size(st));
            else if (zero_convert(dst, dt, src, st, n, (zero_simd)path) != ZERO_OK) {
                fprintf(stderr, "bench_convert: %s\n", zero_last_error());
                exit(1);
            }
            calls++;
            t = bench_now() - t0;
        } while (t < min_s);
        sink ^= ((unsigned char *)dst)[n / 2];
        if (t / (double)calls < best) best = t / (double)calls;
    }
    return best;
}

int main(void)
{
    static const struct {
        zero_dtype dst, src;
        const char *name;
    } convs[4] = {{ZERO_F16, ZERO_F32, "f32->f16"},
                  {ZERO_F32, ZERO_F16, "f16->f32"},
                  {ZERO_BF16, ZERO_F32, "f32->bf16"},
                  {ZERO_F32, ZERO_BF16, "bf16->f32"}};
    static const size_t sizes[2] = {16384, 16u << 20}; /* 64 KiB and 64 MiB of fp32 */
    zero_simd best = zero_simd_detect();
    size_t maxn = sizes[1], i, s;
    float *f = (float *)malloc(maxn * sizeof(float) + 64);
    uint16_t *h = (uint16_t *)malloc(maxn * sizeof(uint16_t) + 64);
    float *fout = (float *)malloc(maxn * sizeof(float) + 64);
    int c, p;
    if (!f || !h || !fout) {
        fprintf(stderr, "bench_convert: out of memory\n");
        return 1;
    }
    /* values spread over the fp16 range, some subnormal, some out of range */
    for (i = 0; i < maxn; i++) {
        unsigned x = (unsigned)(i * 2654435761u);
        f[i] = ((float)(x % 200001u) - 100000.0f) * (x & 8 ? 1e-3f : 1.0f) * (x & 64 ? 1e-6f : 1.0f);
        h[i] = (uint16_t)(x >> 7);
        fout[i] = 0.0f;
    }
    printf("bench_convert: one thread, best path %s; GB/s = (bytes read + written) / s / 1e9\n",
           zero_simd_name(best));
    printf("%-9s %-9s", "size", "convert");
    for (p = best; p >= ZERO_SIMD_PORTABLE; p--) printf(" %10s", zero_simd_name((zero_simd)p));
    printf(" %10s %11s %11s\n", "memcpy", "best/port.", "best/memcpy");
    for (s = 0; s < 2; s++) {
        size_t n = sizes[s];
        double min_s = s == 0 ? 0.05 : 0.25;
        for (c = 0; c < 4; c++) {
            const void *src = convs[c].src == ZERO_F32 ? (const void *)f : (const void *)h;
            void *dst = fout;
            double bytes = (double)n * (double)(zero_dtype_size(convs[c].src) + zero_dtype_size(convs[c].dst));
            double gbs[4] = {0, 0, 0, 0}, mc;
            uint16_t *hout = NULL;
            if (convs[c].dst != ZERO_F32) { /* f32 -> 16-bit: its own output buffer */
                hout = (uint16_t *)malloc(n * sizeof(uint16_t) + 64);
                if (!hout) return 1;
                dst = hout;
            }
            printf("%-9s %-9s", s == 0 ? "64KiB" : "64MiB", convs[c].name);
            for (p = best; p >= ZERO_SIMD_PORTABLE; p--) {
                gbs[p] = bytes / measure(dst, convs[c].dst, src, convs[c].src, n, p, min_s, 3) / 1e9;
                printf(" %10.2f", gbs[p]);
            }
            mc = 2.0 * (double)n * (double)zero_dtype_size(convs[c].src) /
                 measure(fout, convs[c].dst, src, convs[c].src, n, -1, min_s, 3) / 1e9;
            printf(" %10.2f %10.2fx %10.2fx\n", mc, gbs[best] / gbs[ZERO_SIMD_PORTABLE], gbs[best] / mc);
            free(hout);
        }
    }
    free(f);
    free(h);
    free(fout);
    return (int)(sink & 0); /* keep the sink alive */
}
