/* gpt2_gemm.h - the GPT-2 example's fp32 matrix product and its vector exp/tanh.

   gemm_acc(out, ldo, a, ars, acs, b, brs, bcs, M, N, K):
       out[m][n] = fma(a[m][K-1], b[K-1][n], ... fma(a[m][1], b[1][n], fma(a[m][0], b[0][n], out[m][n])))
   with a[m][k] at a[m * ars + k * acs] and b[k][n] at b[k * brs + n * bcs]: either operand may
   be read transposed in place (W^T is never materialised). Each output is one chain of fused
   multiply-adds in k order, starting from its old value, so the result does not depend on the
   kernel, the tile, the blocking or where an element sits in a tile: the AVX-512, AVX2 and
   portable C kernels and the plain triple loop of fmaf (gemm_acc_ref) give the same bits
   (tests/test_gpt2_gemm.c asserts it). Its error against exact arithmetic is at most
   gamma(K) sum_k |a[m][k] b[k][n]| + |out| terms (Higham 3.1; gamma(K) = K u / (1 - K u)).

   How: GotoBLAS/BLIS blocking. For each block of NC columns and KC of the K range (in k
   order), B's block is packed into panels of NR columns (zero-padded); for each block of MC
   rows A's block is packed into panels of MR rows; an MR x NR register tile (AVX2 6 x 16:
   12 accumulators + 2 B vectors + 1 broadcast = 15 of 16 ymm registers; AVX-512 6 x 32:
   12 zmm accumulators) keeps its outputs in registers across the KC products. An edge tile
   runs the same kernel on a padded copy. The B micro-panel (KC x NR) stays in L1, A's block in
   L2. The kernel is picked at run time (cpuid) among those the compiler can build; a
   program may name one (gemm_kernel_choice). The packing buffers belong to
   the calling thread (each rank is a thread), allocated on first use; gemm_release() frees
   the caller's. If that allocation fails the product runs as the plain loop: same bits.

   gemm_expf / gemm_tanhf (arrays): see their comments for the error bound; the SIMD body and
   the scalar tail compute the same expression, so an element's value does not depend on its
   position in the array.

   Compiled with the example's flags (-O3 -march=native -ffp-contract=off): the
   contraction setting does not matter here, every fma is written out. */
#ifndef GPT2_GEMM_H
#define GPT2_GEMM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_X86 1
#include <immintrin.h>
#else
#define GEMM_X86 0
#endif

#define GEMM_MC 96   /* rows of A per packed block (a multiple of every MR)       */
#define GEMM_KC 256  /* k per block                                               */
#define GEMM_NC 1024 /* columns of B per packed block (a multiple of every NR)    */
#define GEMM_MR_MAX 6
#define GEMM_NR_MAX 32

/* The kernel gemm_acc uses: GEMM_AUTO (the fastest this CPU has; in a GPT2_BLAS build the
   BLAS), or one named (tests); a named kernel the CPU or compiler lacks falls back to
   GEMM_AUTO's choice. GEMM_BLAS: cblas_sgemm (only in a GPT2_BLAS build, see below). */
enum { GEMM_AUTO, GEMM_PORTABLE, GEMM_AVX2, GEMM_AVX512, GEMM_BLAS };
static int gemm_kernel_choice = GEMM_AUTO;

/* GPT2_BLAS (make BLAS=openblas): products go to the system's cblas_sgemm instead of the
   kernels below, for comparison (bench_gemm prints both). Opt-in, never required. The BLAS
   does not promise gemm_acc's definition (one fma chain per output in k order: it blocks
   K and sums partial products in its own order), so its bits differ from the kernels';
   its error is still within the gamma(K) bound above (tests/test_gpt2_gemm.c checks it).
   It runs single-threaded (openblas_set_num_threads(1) on first use): each rank is a thread,
   and a product's bits must not depend on how many threads the BLAS would pick. A stride
   pattern cblas cannot express (neither of an operand's strides 1, or a leading dimension
   below the row length) runs our kernel. */
#ifdef GPT2_BLAS
#include <cblas.h>
#include <pthread.h>
static pthread_once_t gemm__blas_once = PTHREAD_ONCE_INIT;
static void gemm__blas_init(void) { openblas_set_num_threads(1); }
#endif

/* ---- kernels: c[MR][NR] (row length ldc) = the fma chain over kc packed products ---------- */

typedef void (*gemm_kernel_fn)(int kc, const float *ap, const float *bp, float *c, int ldc);

/* The portable kernel, MR x NR = 6 x 16: fmaf is exactly the fused operation. */
static inline void gemm__kernel_c(int kc, const float *ap, const float *bp, float *c, int ldc)
{
    float acc[6][16];
    int r, j, k;
    for (r = 0; r < 6; r++)
        for (j = 0; j < 16; j++) acc[r][j] = c[(size_t)r * ldc + j];
    for (k = 0; k < kc; k++, ap += 6, bp += 16)
        for (r = 0; r < 6; r++)
            for (j = 0; j < 16; j++) acc[r][j] = fmaf(ap[r], bp[j], acc[r][j]);
    for (r = 0; r < 6; r++)
        for (j = 0; j < 16; j++) c[(size_t)r * ldc + j] = acc[r][j];
}

#if GEMM_X86
__attribute__((target("avx2,fma"))) static inline void gemm__kernel_avx2(int kc, const float *ap, const float *bp, float *c,
                                                                   int ldc)
{
    __m256 c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
    __m256 c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
    __m256 c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
    __m256 c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
    __m256 c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
    __m256 c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    int k;
    for (k = 0; k < kc; k++, ap += 6, bp += 16) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8), a;
        a = _mm256_broadcast_ss(ap + 0), c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(ap + 1), c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(ap + 2), c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(ap + 3), c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(ap + 4), c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(ap + 5), c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01);
    _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

__attribute__((target("avx512f"))) static inline void gemm__kernel_avx512(int kc, const float *ap, const float *bp,
                                                                    float *c, int ldc)
{
    __m512 c00 = _mm512_loadu_ps(c), c01 = _mm512_loadu_ps(c + 16);
    __m512 c10 = _mm512_loadu_ps(c + ldc), c11 = _mm512_loadu_ps(c + ldc + 16);
    __m512 c20 = _mm512_loadu_ps(c + 2 * ldc), c21 = _mm512_loadu_ps(c + 2 * ldc + 16);
    __m512 c30 = _mm512_loadu_ps(c + 3 * ldc), c31 = _mm512_loadu_ps(c + 3 * ldc + 16);
    __m512 c40 = _mm512_loadu_ps(c + 4 * ldc), c41 = _mm512_loadu_ps(c + 4 * ldc + 16);
    __m512 c50 = _mm512_loadu_ps(c + 5 * ldc), c51 = _mm512_loadu_ps(c + 5 * ldc + 16);
    int k;
    for (k = 0; k < kc; k++, ap += 6, bp += 32) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16), a;
        a = _mm512_set1_ps(ap[0]), c00 = _mm512_fmadd_ps(a, b0, c00), c01 = _mm512_fmadd_ps(a, b1, c01);
        a = _mm512_set1_ps(ap[1]), c10 = _mm512_fmadd_ps(a, b0, c10), c11 = _mm512_fmadd_ps(a, b1, c11);
        a = _mm512_set1_ps(ap[2]), c20 = _mm512_fmadd_ps(a, b0, c20), c21 = _mm512_fmadd_ps(a, b1, c21);
        a = _mm512_set1_ps(ap[3]), c30 = _mm512_fmadd_ps(a, b0, c30), c31 = _mm512_fmadd_ps(a, b1, c31);
        a = _mm512_set1_ps(ap[4]), c40 = _mm512_fmadd_ps(a, b0, c40), c41 = _mm512_fmadd_ps(a, b1, c41);
        a = _mm512_set1_ps(ap[5]), c50 = _mm512_fmadd_ps(a, b0, c50), c51 = _mm512_fmadd_ps(a, b1, c51);
    }
    _mm512_storeu_ps(c, c00), _mm512_storeu_ps(c + 16, c01);
    _mm512_storeu_ps(c + ldc, c10), _mm512_storeu_ps(c + ldc + 16, c11);
    _mm512_storeu_ps(c + 2 * ldc, c20), _mm512_storeu_ps(c + 2 * ldc + 16, c21);
    _mm512_storeu_ps(c + 3 * ldc, c30), _mm512_storeu_ps(c + 3 * ldc + 16, c31);
    _mm512_storeu_ps(c + 4 * ldc, c40), _mm512_storeu_ps(c + 4 * ldc + 16, c41);
    _mm512_storeu_ps(c + 5 * ldc, c50), _mm512_storeu_ps(c + 5 * ldc + 16, c51);
}
#endif

typedef struct gemm_kernel {
    gemm_kernel_fn fn;
    int mr, nr;
    const char *name;
} gemm_kernel;

/* The kernel for a choice (the fastest this CPU and compiler have for GEMM_AUTO). */
static inline gemm_kernel gemm__pick(int want)
{
    gemm_kernel k = {gemm__kernel_c, 6, 16, "portable C (6x16)"};
    (void)want;
#ifdef GPT2_BLAS
    if (want == GEMM_AUTO || want == GEMM_BLAS) {
        k.fn = NULL, k.name = "OpenBLAS sgemm";
        return k;
    }
#endif
#if GEMM_X86
    int avx512, avx2;
    __builtin_cpu_init();
    avx512 = __builtin_cpu_supports("avx512f");
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (want == GEMM_PORTABLE) return k;
    if (want == GEMM_BLAS) want = GEMM_AUTO; /* not a GPT2_BLAS build */
    if (want == GEMM_AVX512 && !avx512) want = GEMM_AUTO;
    if (want == GEMM_AVX2 && !avx2) want = GEMM_AUTO;
    if (want == GEMM_AUTO) want = avx512 ? GEMM_AVX512 : avx2 ? GEMM_AVX2 : GEMM_PORTABLE;
    if (want == GEMM_AVX512) k.fn = gemm__kernel_avx512, k.nr = 32, k.name = "AVX-512 (6x32)";
    if (want == GEMM_AVX2) k.fn = gemm__kernel_avx2, k.name = "AVX2+FMA (6x16)";
#endif
    return k;
}

/* The kernel of gemm_kernel_choice. */
static inline gemm_kernel gemm_pick(void) { return gemm__pick(gemm_kernel_choice); }

/* ---- the driver ------------------------------------------------------------------------- */

/* The plain loop: the definition of the result (and the fallback without buffers). */
static inline void gemm_acc_ref(float *out, int ldo, const float *a, int ars, int acs, const float *b, int brs, int bcs,
                         int M, int N, int K)
{
    int m, n, k;
    for (m = 0; m < M; m++)
        for (k = 0; k < K; k++) {
            float av = a[(size_t)m * ars + (size_t)k * acs];
            for (n = 0; n < N; n++) {
                float *o = out + (size_t)m * ldo + n;
                *o = fmaf(av, b[(size_t)k * brs + (size_t)n * bcs], *o);
            }
        }
}

static _Thread_local float *gemm__buf; /* this thread's packing buffers, MC x KC + KC x NC */

/* Frees the calling thread's packing buffers (they come back on the next product). */
static inline void gemm_release(void)
{
    free(gemm__buf);
    gemm__buf = NULL;
}

/* A's rows m0 .. m0+mc-1, k0 .. k0+kc-1 into panels of mr rows: ap[panel][k][r] (zero rows past mc). */
static inline void gemm__pack_a(float *ap, const float *a, int ars, int acs, int m0, int mc, int k0, int kc, int mr)
{
    int i, r, k;
    for (i = 0; i < mc; i += mr) {
        int rows = mc - i < mr ? mc - i : mr;
        for (k = 0; k < kc; k++) {
            const float *s = a + (size_t)(m0 + i) * ars + (size_t)(k0 + k) * acs;
            for (r = 0; r < rows; r++) ap[r] = s[(size_t)r * ars];
            for (; r < mr; r++) ap[r] = 0.0f;
            ap += mr;
        }
    }
}

/* B's k0 .. k0+kc-1, columns n0 .. n0+nc-1 into panels of nr columns: bp[panel][k][j]. */
static inline void gemm__pack_b(float *bp, const float *b, int brs, int bcs, int k0, int kc, int n0, int nc, int nr)
{
    int j, c, k;
    for (j = 0; j < nc; j += nr) {
        int cols = nc - j < nr ? nc - j : nr;
        if (bcs == 1) { /* rows of B are contiguous */
            for (k = 0; k < kc; k++) {
                const float *s = b + (size_t)(k0 + k) * brs + (size_t)(n0 + j);
                float *d = bp + (size_t)k * nr;
                memcpy(d, s, sizeof(float) * (size_t)cols);
                for (c = cols; c < nr; c++) d[c] = 0.0f;
            }
        } else { /* columns of B are contiguous (B read transposed): walk each column */
            for (c = 0; c < cols; c++) {
                const float *s = b + (size_t)(n0 + j + c) * bcs + (size_t)k0 * brs;
                for (k = 0; k < kc; k++) bp[(size_t)k * nr + c] = s[(size_t)k * brs];
            }
            for (; c < nr; c++)
                for (k = 0; k < kc; k++) bp[(size_t)k * nr + c] = 0.0f;
        }
        bp += (size_t)kc * nr;
    }
}

static inline void gemm_acc(float *out, int ldo, const float *a, int ars, int acs, const float *b, int brs, int bcs,
                     int M, int N, int K)
{
    gemm_kernel kn = gemm_pick();
    float *ap, *bp, edge[GEMM_MR_MAX * GEMM_NR_MAX];
    int n0, k0, m0, i, j, r, c;
    if (M <= 0 || N <= 0 || K <= 0) return;
#ifdef GPT2_BLAS
    if (!kn.fn) {
        /* row-major cblas: an operand is plain (unit column stride, leading dimension its row
           stride) or transposed (unit row stride, leading dimension its column stride) */
        int a_plain = acs == 1 && ars >= K, a_trans = ars == 1 && acs >= M;
        int b_plain = bcs == 1 && brs >= N, b_trans = brs == 1 && bcs >= K;
        if ((a_plain || a_trans) && (b_plain || b_trans) && ldo >= N) {
            pthread_once(&gemm__blas_once, gemm__blas_init);
            cblas_sgemm(CblasRowMajor, a_plain ? CblasNoTrans : CblasTrans, b_plain ? CblasNoTrans : CblasTrans,
                        M, N, K, 1.0f, a, a_plain ? ars : acs, b, b_plain ? brs : bcs, 1.0f, out, ldo);
            return;
        }
        kn = gemm__pick(GEMM_AVX512); /* ours: AVX-512, else the fastest this CPU has */
    }
#endif
    if (!gemm__buf && !(gemm__buf = (float *)malloc(sizeof(float) * ((size_t)GEMM_MC * GEMM_KC +
                                                                     (size_t)GEMM_KC * GEMM_NC)))) {
        gemm_acc_ref(out, ldo, a, ars, acs, b, brs, bcs, M, N, K);
        return;
    }
    ap = gemm__buf, bp = gemm__buf + (size_t)GEMM_MC * GEMM_KC;
    for (n0 = 0; n0 < N; n0 += GEMM_NC) {
        int nc = N - n0 < GEMM_NC ? N - n0 : GEMM_NC;
        for (k0 = 0; k0 < K; k0 += GEMM_KC) { /* in k order: each output's chain continues */
            int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
            gemm__pack_b(bp, b, brs, bcs, k0, kc, n0, nc, kn.nr);
            for (m0 = 0; m0 < M; m0 += GEMM_MC) {
                int mc = M - m0 < GEMM_MC ? M - m0 : GEMM_MC;
                gemm__pack_a(ap, a, ars, acs, m0, mc, k0, kc, kn.mr);
                for (j = 0; j < nc; j += kn.nr) {
                    int cols = nc - j < kn.nr ? nc - j : kn.nr;
                    const float *bpj = bp + (size_t)(j / kn.nr) * kc * kn.nr;
                    for (i = 0; i < mc; i += kn.mr) {
                        int rows = mc - i < kn.mr ? mc - i : kn.mr;
                        const float *api = ap + (size_t)(i / kn.mr) * kc * kn.mr;
                        float *o = out + (size_t)(m0 + i) * ldo + (size_t)(n0 + j);
                        if (rows == kn.mr && cols == kn.nr) {
                            kn.fn(kc, api, bpj, o, ldo);
                            continue;
                        }
                        for (r = 0; r < kn.mr; r++) /* an edge: the same kernel on a padded copy */
                            for (c = 0; c < kn.nr; c++)
                                edge[r * kn.nr + c] = r < rows && c < cols ? o[(size_t)r * ldo + c] : 0.0f;
                        kn.fn(kc, api, bpj, edge, kn.nr);
                        for (r = 0; r < rows; r++)
                            for (c = 0; c < cols; c++) o[(size_t)r * ldo + c] = edge[r * kn.nr + c];
                    }
                }
            }
        }
    }
}

/* ---- vector exp and tanh ---------------------------------------------------------------
   Written once on GNU C vectors of 16 floats (the compiler maps them to AVX-512, AVX2 or SSE
   registers), of +, -, *, / and selects, without fma. The last n % 16 elements go through the
   same vector code on a padded copy, so an element's result does not depend on where it sits.

   gemm_expf: exp(x) = 2^n e^r, n = floor(x log2(e) + 1/2), r = x - n ln2 (ln2 in two parts,
   Cody-Waite: n ln2_hi is exact), e^r by Cephes' polynomial of degree 7 on |r| <= ln2 / 2.
   Error against exp in double, over every float x in [-87.3, 88] (checked exhaustively when
   written; tests/test_gpt2_gemm.c sweeps 2^20 of them): at most GEMM_EXPF_ULP ulp. Below
   -87.3 (results under FLT_MIN) it returns 0, above 88 (and for NaN) it returns exp(88) or
   exp(-87.3).
   gemm_tanhf: |x| < 0.625: Cephes' odd polynomial x + x^3 P(x^2); else
   sign(x) (1 - 2 / (exp(2|x|) + 1)) with gemm_expf's steps (tanh is +-1 in float from
   |x| = 9.01 on). At most GEMM_TANHF_ULP ulp from tanh in double over every float. */
#define GEMM_EXPF_ULP 2
#define GEMM_TANHF_ULP 2

typedef float gemm_v16f __attribute__((vector_size(64)));
typedef int32_t gemm_v16i __attribute__((vector_size(64)));

/* m ? a : b, lane by lane (m: a comparison's all-ones / zero lanes). The vector helpers take
   pointers: a 64-byte vector passed by value has an ABI that depends on -mavx512f. */
#define gemm__sel(m, a, b) ((gemm_v16f)(((m) & (gemm_v16i)(a)) | (~(m) & (gemm_v16i)(b))))

static inline void gemm__vexp(gemm_v16f *y, const gemm_v16f *xp)
{
    gemm_v16f x = *xp;
    const gemm_v16f zero = {0.0f}, lo = zero - 87.3f, hi = zero + 88.0f;
    gemm_v16f xc = gemm__sel(x > lo, x, lo), t, tf, n, r, p;
    gemm_v16i ti, up;
    xc = gemm__sel(xc < hi, xc, hi);
    t = xc * 1.44269504088896341f + 0.5f;
    ti = __builtin_convertvector(t, gemm_v16i); /* toward zero; |t| < 128 */
    tf = __builtin_convertvector(ti, gemm_v16f);
    up = tf > t;                                /* floor: one less where truncation went up */
    ti = ti + up;                               /* (up is -1 there) */
    n = __builtin_convertvector(ti, gemm_v16f);
    r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    p = p * (gemm_v16f)((ti + 127) << 23);
    *y = gemm__sel(x < lo, zero, p);
}

static inline void gemm__vtanh(gemm_v16f *y, const gemm_v16f *xp)
{
    gemm_v16f x = *xp;
    const gemm_v16i none = {0}, abs_mask = none + 0x7fffffff;
    gemm_v16f a = (gemm_v16f)((gemm_v16i)x & abs_mask), z = x * x, p, e, big;
    p = z * -5.70498872745e-3f + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    p = p * z * x + x;
    e = a + a;
    gemm__vexp(&e, &e);
    big = 1.0f - 2.0f / (e + 1.0f);
    big = (gemm_v16f)((gemm_v16i)big | ((gemm_v16i)x & ~abs_mask)); /* tanh(-x) = -tanh(x) */
    *y = gemm__sel(a < 0.625f, p, big);
}

/* y[i] = f(x[i]) for i < n, 16 at a time; y may be x. */
#define GEMM__MAP(y, x, n, f)                                                                  \
    do {                                                                                       \
        size_t i_ = 0, r_ = (n) % 16;                                                          \
        gemm_v16f v_;                                                                          \
        for (; i_ + 16 <= (n); i_ += 16) {                                                     \
            memcpy(&v_, (x) + i_, sizeof v_);                                                  \
            f(&v_, &v_);                                                                       \
            memcpy((y) + i_, &v_, sizeof v_);                                                  \
        }                                                                                      \
        if (r_) {                                                                              \
            v_ = (gemm_v16f){0.0f};                                                            \
            memcpy(&v_, (x) + i_, sizeof(float) * r_);                                         \
            f(&v_, &v_);                                                                       \
            memcpy((y) + i_, &v_, sizeof(float) * r_);                                         \
        }                                                                                      \
    } while (0)

/* y[i] = exp(x[i]) (y may be x). */
static inline void gemm_expf(float *y, const float *x, size_t n) { GEMM__MAP(y, x, n, gemm__vexp); }

/* y[i] = tanh(x[i]) (y may be x). */
static inline void gemm_tanhf(float *y, const float *x, size_t n) { GEMM__MAP(y, x, n, gemm__vtanh); }

#endif
