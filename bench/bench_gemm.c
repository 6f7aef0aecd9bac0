/* bench_gemm.c - GFLOP/s of the GPT-2 example's matrix product (examples/gpt2_gemm.h) at
   GPT-2 124M's shapes (B 4, T 64: 256 rows), each kernel this machine has, the fastest of 3
   calls: the forward projections, the backward's dx (W read transposed) and dW (x read
   transposed), the LM head (wte read transposed) and its two backward products. Built with
   make BLAS=openblas, a last column gives OpenBLAS's cblas_sgemm on the same calls.

       build/bench_gemm [--quick] */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "examples/gpt2_gemm.h"
#include "bench_common.h" /* bench_now */

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
    printf("gemm_acc, GFLOP/s (the fastest of 3 calls), GPT-2 124M shapes at 256 rows\n%-24s", "product");
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
                double t = bench_now();
                gemm_acc(o, h->N, a, ars, acs, b, brs, bcs, h->M, h->N, h->K);
                t = bench_now() - t;
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
