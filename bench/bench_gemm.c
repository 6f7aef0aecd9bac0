/* bench_gemm.c - GFLOP/s of the GPT-2 example's matrix product (examples/gpt2_gemm.h) at
   GPT-2 124M's shapes (B 4, T 64: 256 rows), each kernel this machine has, the fastest of 3
   calls: the forward projections, the backward's dx (W read transposed) and dW (x read
   transposed), the LM head (wte read transposed) and its two backward products; the time is
   the thread's CPU time (the machine may be shared), and the first line gives this core's
   FMA peak measured the same way (12 independent chains). Built with
   make BLAS=openblas, a last column gives OpenBLAS's cblas_sgemm on the same calls.

       build/bench_gemm [--quick] */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "examples/gpt2_gemm.h"
#include "bench_common.h" /* bench_thread_cpu */

#include <stdio.h>
#include <string.h>

typedef struct shape {
    const char *name;
    int M, N, K, ta, tb;
} shape;

static float *filled(size_t n)
{
    float *p = (float *)malloc(n * sizeof(float));
    size_t i;
    for (i = 0; p && i < n; i++) p[i] = (float)((i * 37) % 101) * 0.01f - 0.5f;
    return p;
}

#if GEMM_X86
/* This core's AVX2 FMA peak, GFLOP/s: 12 independent chains of vfmadd (2 FMA pipes x 4
   cycles of latency need 8), the thread's CPU time. */
#define BENCH_FMA12(x) x##0 = _mm256_fmadd_ps(x##0, m, d), x##1 = _mm256_fmadd_ps(x##1, m, d), \
    x##2 = _mm256_fmadd_ps(x##2, m, d), x##3 = _mm256_fmadd_ps(x##3, m, d)
__attribute__((target("avx2,fma"))) static double fma_peak(void)
{
    __m256 m = _mm256_set1_ps(0.999999f), d = _mm256_set1_ps(1e-7f), r;
    /* twelve different starts: equal chains would be computed once */
    __m256 a0 = _mm256_set1_ps(1), a1 = _mm256_set1_ps(2), a2 = _mm256_set1_ps(3), a3 = _mm256_set1_ps(4);
    __m256 b0 = _mm256_set1_ps(5), b1 = _mm256_set1_ps(6), b2 = _mm256_set1_ps(7), b3 = _mm256_set1_ps(8);
    __m256 c0 = _mm256_set1_ps(9), c1 = _mm256_set1_ps(10), c2 = _mm256_set1_ps(11), c3 = _mm256_set1_ps(12);
    const long n = 20000000;
    float out[8];
    long k;
    double t = bench_thread_cpu();
    for (k = 0; k < n; k++) BENCH_FMA12(a), BENCH_FMA12(b), BENCH_FMA12(c);
    t = bench_thread_cpu() - t;
    r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                      _mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
    r = _mm256_add_ps(r, _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
    _mm256_storeu_ps(out, r);
    return out[0] > 0.0f ? 12.0 * 16.0 * (double)n / t / 1e9 : 0.0; /* the sum keeps the loop */
}
#endif

int main(int argc, char **argv)
{
    static const shape shapes[] = {
        {"qkv forward", 256, 2304, 768, 0, 0},   {"fc forward", 256, 3072, 768, 0, 0},
        {"fc_proj forward", 256, 768, 3072, 0, 0}, {"fc_proj dx (W^T)", 256, 3072, 768, 0, 1},
        {"fc dW (x^T)", 768, 3072, 256, 1, 0},   {"head (wte^T)", 256, 50257, 768, 0, 1},
        {"head dlnf", 256, 768, 50257, 0, 0},    {"head dwte (dlogits^T)", 50257, 768, 256, 1, 0},
    };
#ifdef GPT2_BLAS /* make BLAS=openblas: the BLAS beside our kernels, same calls */
    static const int kernels[] = {GEMM_AVX512, GEMM_AVX2, GEMM_PORTABLE, GEMM_BLAS};
#else
    static const int kernels[] = {GEMM_AVX512, GEMM_AVX2, GEMM_PORTABLE};
#endif
    const int nk = (int)(sizeof kernels / sizeof *kernels);
    int quick = argc > 1 && !strcmp(argv[1], "--quick"), s, k, rep;
#if GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        printf("this core's AVX2 FMA peak: %.1f GFLOP/s (12 independent vfmadd chains)\n", fma_peak());
#endif
    printf("gemm_acc, GFLOP/s (the fastest of 3 calls, thread CPU time), GPT-2 124M shapes at 256 rows\n%-24s",
           "product");
    for (k = 0; k < nk; k++) {
        gemm_kernel_choice = kernels[k];
        printf(" %20s", gemm_pick().name);
    }
    printf("\n");
    for (s = 0; s < (int)(sizeof shapes / sizeof *shapes); s++) {
        const shape *h = &shapes[s];
        float *a = filled((size_t)h->M * h->K), *b = filled((size_t)h->K * h->N), *o = filled((size_t)h->M * h->N);
        int ars = h->ta ? 1 : h->K, acs = h->ta ? h->M : 1, brs = h->tb ? 1 : h->N, bcs = h->tb ? h->K : 1;
        if (!a || !b || !o) return 1;
        printf("%-24s", h->name);
        for (k = 0; k < nk; k++) {
            double best = 1e30;
            gemm_kernel_choice = kernels[k];
            for (rep = 0; rep < (quick || kernels[k] == GEMM_PORTABLE ? 1 : 3); rep++) {
                double t = bench_thread_cpu();
                gemm_acc(o, h->N, a, ars, acs, b, brs, bcs, h->M, h->N, h->K);
                t = bench_thread_cpu() - t;
                if (t < best) best = t;
            }
            printf(" %20.1f", 2.0 * h->M * h->N * h->K / best / 1e9);
        }
        printf("\n");
        free(a), free(b), free(o);
    }
    gemm_release();
    return 0;
}
