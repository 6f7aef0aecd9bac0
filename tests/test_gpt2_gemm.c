/* examples/gpt2_gemm.h, the GPT-2 example's matrix product and vector exp/tanh.

   gemm_acc is defined as one chain of fused multiply-adds per output in k order (the plain
   loop gemm_acc_ref). Asserted:
   - every kernel this machine has (portable C, AVX2, AVX-512), on shapes that cross every
     block edge (M > MC, N > NC, K > KC, partial register tiles) and with each operand read
     plain or transposed, returns the plain loop's bits, starting from a nonzero out;
   - against products and sums in double: |out - exact| <= gamma(K + 1) (|out0| + sum_k
     |a b|), gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability, 3.1);
   - gemm_expf / gemm_tanhf: within their stated ulp bounds of exp / tanh in double on a
     sweep of 2^20 floats over the range (every float was checked when they were written),
     the clamps (exp below -87.3 is 0, tanh saturates at +-1, tanh is odd), and an element's
     result does not depend on its position in the array (the 16-wide body and the padded
     tail). */
#include "examples/gpt2_gemm.h"
#include "tests/zt.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static float frand(void) { return (float)(zt_uniform() * 2.0 - 1.0); }

/* A case: M x N += (M x K)(K x N), a and b each plain or transposed. */
typedef struct mm_case {
    int M, N, K, ta, tb;
} mm_case;

static int run_case(const mm_case *c, int kernel, double *worst_ratio)
{
    int M = c->M, N = c->N, K = c->K, m, n, k, bad = 0;
    int ars = c->ta ? 1 : K, acs = c->ta ? M : 1, brs = c->tb ? 1 : N, bcs = c->tb ? K : 1;
    float *a = (float *)malloc(sizeof(float) * (size_t)M * K), *b = (float *)malloc(sizeof(float) * (size_t)K * N);
    float *o0 = (float *)malloc(sizeof(float) * (size_t)M * N), *o = (float *)malloc(sizeof(float) * (size_t)M * N);
    float *r = (float *)malloc(sizeof(float) * (size_t)M * N);
    size_t i;
    if (!a || !b || !o0 || !o || !r) {
        free(a), free(b), free(o0), free(o), free(r);
        return -1;
    }
    for (i = 0; i < (size_t)M * K; i++) a[i] = frand();
    for (i = 0; i < (size_t)K * N; i++) b[i] = frand();
    for (i = 0; i < (size_t)M * N; i++) o0[i] = frand();
    memcpy(o, o0, sizeof(float) * (size_t)M * N);
    memcpy(r, o0, sizeof(float) * (size_t)M * N);
    gemm_kernel_choice = kernel;
    gemm_acc(o, N, a, ars, acs, b, brs, bcs, M, N, K);
    gemm_kernel_choice = GEMM_AUTO;
    gemm_acc_ref(r, N, a, ars, acs, b, brs, bcs, M, N, K);
    bad = memcmp(o, r, sizeof(float) * (size_t)M * N) != 0;
    for (m = 0; m < M; m += 7) /* every 7th row against double */
        for (n = 0; n < N; n++) {
            double exact = o0[(size_t)m * N + n], mag = fabs(exact), u = ldexp(1.0, -24), g;
            for (k = 0; k < K; k++) {
                double p = (double)a[(size_t)m * ars + (size_t)k * acs] * b[(size_t)k * brs + (size_t)n * bcs];
                exact += p, mag += fabs(p);
            }
            g = (K + 1) * u / (1.0 - (K + 1) * u);
            if (fabs(o[(size_t)m * N + n] - exact) / (g * mag) > *worst_ratio)
                *worst_ratio = fabs(o[(size_t)m * N + n] - exact) / (g * mag);
        }
    free(a), free(b), free(o0), free(o), free(r);
    return bad;
}

ZT_TEST(every_kernel_gives_the_fma_chain_bits_at_every_shape)
{
    static const mm_case big[] = {
        {100, 1100, 300, 0, 0}, {100, 1100, 300, 0, 1}, {100, 1100, 300, 1, 0}, {100, 1100, 300, 1, 1},
    };
    static const mm_case small[] = {
        {1, 1, 1, 0, 0},   {5, 15, 3, 0, 1},   {6, 16, 256, 1, 0}, {7, 33, 257, 1, 1},
        {13, 37, 64, 0, 0}, {64, 64, 16, 0, 1}, {97, 31, 5, 1, 0}, {12, 32, 513, 0, 0},
    };
#ifdef GPT2_BLAS /* GEMM_AUTO is the BLAS there: blas_within_the_error_bound checks it */
    static const int kernels[] = {GEMM_PORTABLE, GEMM_AVX2, GEMM_AVX512, GEMM_AVX512};
#else
    static const int kernels[] = {GEMM_PORTABLE, GEMM_AVX2, GEMM_AVX512, GEMM_AUTO};
#endif
    const char *names[4];
    int kk, i;
    double worst = 0.0;
    zt_seed(29);
    for (kk = 0; kk < 4; kk++) {
        gemm_kernel_choice = kernels[kk];
        names[kk] = gemm_pick().name;
        gemm_kernel_choice = GEMM_AUTO;
        for (i = 0; i < (int)(sizeof small / sizeof *small); i++) {
            int rc = run_case(&small[i], kernels[kk], &worst);
            ZT_CHECKF(rc == 0, "kernel %s, case %d (M %d N %d K %d ta %d tb %d): %s", names[kk], i, small[i].M,
                      small[i].N, small[i].K, small[i].ta, small[i].tb, rc < 0 ? "out of memory" : "bits differ");
        }
        for (i = 0; i < (zt_quick() ? 1 : 4); i++) {
            int rc = run_case(&big[i], kernels[kk], &worst);
            ZT_CHECKF(rc == 0, "kernel %s, big case %d: %s", names[kk], i, rc < 0 ? "out of memory" : "bits differ");
        }
    }
    ZT_CHECKF(worst <= 1.0, "worst |error| / (gamma(K+1) sum |terms|) = %.3f", worst);
    printf("  kernels: %s, %s, %s; auto = %s; worst error / bound %.3f\n", names[0], names[1], names[2], names[3],
           worst);
    gemm_release();
}

#ifdef GPT2_BLAS
/* make BLAS=openblas: cblas_sgemm sums in its own order, so only the bound holds; shapes and
   strides as above, plus ones cblas cannot express (a leading dimension below the row length
   when M or K is 1 goes to our kernel: then the bits are the fma chain's). */
ZT_TEST(blas_within_the_error_bound)
{
    static const mm_case cases[] = {
        {1, 1, 1, 0, 0},   {5, 15, 3, 0, 1},    {6, 16, 256, 1, 0},    {7, 33, 257, 1, 1},
        {13, 37, 64, 0, 0}, {64, 64, 16, 0, 1}, {97, 31, 5, 1, 0},     {12, 32, 513, 0, 0},
        {100, 1100, 300, 0, 0}, {100, 1100, 300, 0, 1}, {100, 1100, 300, 1, 0}, {100, 1100, 300, 1, 1},
    };
    int i;
    double worst = 0.0;
    zt_seed(31);
    ZT_CHECK(gemm_pick().fn == NULL); /* GEMM_AUTO is the BLAS */
    for (i = 0; i < (int)(sizeof cases / sizeof *cases); i++) {
        int rc = run_case(&cases[i], GEMM_BLAS, &worst);
        ZT_CHECKF(rc >= 0, "case %d: out of memory", i);
    }
    ZT_CHECKF(worst <= 1.0, "BLAS: worst |error| / (gamma(K+1) sum |terms|) = %.3f", worst);
    printf("  %s: worst error / bound %.3f\n", gemm_pick().name, worst);
}
#endif

/* The error of got in units in the last place of the float nearest ref. */
static double ulps(float got, double ref)
{
    double a = fabs(ref), u;
    int e;
    if (a < FLT_MIN) return got == (float)ref ? 0.0 : fabs((double)got - ref) / ldexp(1.0, -149);
    frexp(a, &e);
    u = ldexp(1.0, e - 24);
    return fabs((double)got - ref) / u;
}

ZT_TEST(exp_and_tanh_within_their_ulp_bounds)
{
    enum { N = 1 << 20 };
    float *x = (float *)malloc(sizeof(float) * N), *y = (float *)malloc(sizeof(float) * N);
    double we = 0.0, wt = 0.0;
    float xe = 0.0f, xt = 0.0f;
    int i;
    if (!x || !y) {
        free(x), free(y);
        ZT_CHECKF(0, "out of memory");
        return;
    }
    for (i = 0; i < N; i++) x[i] = -87.3f + (float)((88.0 + 87.3) * i / (N - 1)); /* exp's range */
    gemm_expf(y, x, N);
    for (i = 0; i < N; i++) {
        double e = ulps(y[i], exp((double)x[i]));
        if (e > we) we = e, xe = x[i];
    }
    for (i = 0; i < N; i++) { /* tanh: every exponent, both signs, up to 2^5 */
        union { float f; uint32_t u; } v;
        v.u = (uint32_t)((uint64_t)i * (0x42000000u / (N / 2))) % 0x42000000u;
        x[i] = i % 2 ? -v.f : v.f;
    }
    gemm_tanhf(y, x, N);
    for (i = 0; i < N; i++) {
        double e = ulps(y[i], tanh((double)x[i]));
        if (e > wt) wt = e, xt = x[i];
    }
    ZT_CHECKF(we <= GEMM_EXPF_ULP, "exp: %.3f ulp at %a", we, (double)xe);
    ZT_CHECKF(wt <= GEMM_TANHF_ULP, "tanh: %.3f ulp at %a", wt, (double)xt);
    printf("  exp: max %.3f ulp (bound %d); tanh: max %.3f ulp (bound %d)\n", we, GEMM_EXPF_ULP, wt, GEMM_TANHF_ULP);
    free(x), free(y);
}

ZT_TEST(exp_and_tanh_clamp_and_do_not_depend_on_position)
{
    float x[40], y[40], z[40], big[4] = {-1000.0f, -87.31f, 20.0f, -9.5f}, out[4];
    int i, s;
    gemm_expf(out, big, 2);
    ZT_CHECK(out[0] == 0.0f && out[1] == 0.0f);
    gemm_tanhf(out, big, 4);
    ZT_CHECK(out[0] == -1.0f && out[2] == 1.0f && out[3] == -1.0f);
    for (i = 0; i < 40; i++) x[i] = (float)(i - 20) * 0.37f;
    gemm_tanhf(y, x, 40);
    for (i = 0; i < 40; i++) z[i] = -x[i];
    gemm_tanhf(z, z, 40);
    for (i = 0; i < 40; i++) ZT_CHECKF(z[i] == -y[i], "tanh(-x) at %d", i);
    for (s = 1; s < 17; s++) { /* the same values at other offsets and lengths (the tail) */
        float e1[40], t1[40];
        gemm_expf(e1, x + s, (size_t)(40 - s));
        gemm_tanhf(t1, x + s, (size_t)(40 - s));
        for (i = s; i < 40; i++) {
            float e0;
            gemm_expf(&e0, &x[i], 1);
            ZT_CHECKF(t1[i - s] == y[i] && e1[i - s] == e0, "offset %d, element %d", s, i);
        }
    }
}

int main(void)
{
    ZT_RUN(every_kernel_gives_the_fma_chain_bits_at_every_shape);
#ifdef GPT2_BLAS
    ZT_RUN(blas_within_the_error_bound);
#endif
    ZT_RUN(exp_and_tanh_within_their_ulp_bounds);
    ZT_RUN(exp_and_tanh_clamp_and_do_not_depend_on_position);
    return zt_summary();
}
