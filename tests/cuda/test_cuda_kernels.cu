/* The CUDA device against the host device (the oracle: zero_host_device_create, whose kernels
   use zero_convert and zero_adam_host): every element kernel on the same inputs, random data
   with NaN, inf and subnormals mixed in, sizes 1 .. 300007 and offsets 0..7 elements so the
   vector/scalar split is exercised (and pointers misaligned relative to each other);
   bit-identical where the arithmetic is the same (casts, nonfinite, sumsq: the same order as
   the host, plus a 1e-12 relative bound against a long-double sum as the stated tolerance),
   NaN-aware equal for add, scale, Adam and SUM (a GPU NaN result carries no payload).
   Then the arena, pinned memory, streams and events, a user stream, and past 2^31 elements
   (64-bit indexing, skipped when cudaMemGetInfo says it does not fit).
   Without a GPU it prints one skip line and exits 0. */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "tests/zt.h"
#include "tests/cuda/gpu_probe.h"

#include <math.h>

#define NTESTS 14

static zero_device *H, *G; /* host oracle, CUDA device */

#define CUDA_OK(call)                                                                        \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        ZT_CHECKF(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                \
        if (e_ != cudaSuccess) return;                                                       \
    } while (0)
#define Z_OK(call)                                                                           \
    do {                                                                                     \
        zero_result r_ = (call);                                                             \
        ZT_CHECKF(r_ == ZERO_OK, "%s: %s: %s", #call, zero_result_string(r_), zero_last_error()); \
        if (r_ != ZERO_OK) return;                                                           \
    } while (0)

static const zero_dtype DTS[4] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64};
static const size_t SIZES_FULL[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 127, 1000, 4097, 65536 + 5, 300007};
static const size_t SIZES_QUICK[] = {1, 7, 8, 9, 17, 65, 1000, 4097};
#define NSIZES (zt_quick() ? sizeof SIZES_QUICK / sizeof *SIZES_QUICK : sizeof SIZES_FULL / sizeof *SIZES_FULL)
#define SIZE(i) (zt_quick() ? SIZES_QUICK[i] : SIZES_FULL[i])
static const int OFFS[][2] = {{0, 0}, {1, 1}, {3, 5}, {7, 2}, {0, 7}, {4, 4}};
#define NOFFS 6
#define MAXN 300007
#define PAD 16

/* ---- data ---- */

/* A float of varied magnitude with NaN (random payloads), inf, fp32 and fp16 subnormals,
   fp16-overflowing values and signed zeros mixed in (when specials). */
static float gen_f32(int specials)
{
    uint64_t r = zt_rand64();
    uint32_t u;
    float f;
    int k = (int)(r % 100);
    if (specials && k < 2) { /* NaN, random payload and sign */
        u = 0x7f800000u | (uint32_t)((r >> 8) & 0x7fffffu) | 1u | (uint32_t)((r >> 40) & 1) << 31;
        memcpy(&f, &u, 4);
        return f;
    }
    if (specials && k < 3) return (r >> 20) & 1 ? INFINITY : -INFINITY;
    if (specials && k < 6) { /* fp32 subnormal */
        u = (uint32_t)((r >> 8) & 0x7fffffu) | (uint32_t)((r >> 40) & 1) << 31;
        memcpy(&f, &u, 4);
        return f;
    }
    if (k < 10) return (float)ldexp(((double)(r >> 11) / 9007199254740992.0), -14 - (int)((r >> 3) % 12)); /* fp16 subnormal range */
    if (k < 12) /* the fp16 overflow edge (65504 is the largest finite; from 65520 on: inf) */
        return ((r >> 9) & 1 ? 1.0f : -1.0f) * (60000.0f + (float)((r >> 16) % (specials ? 12000 : 5504)));
    if (k < 13) return (r >> 9) & 1 ? 0.0f : -0.0f;
    return (float)(ldexp(zt_uniform() * 2.0 - 1.0, (int)(zt_rand64() % 24) - 12));
}

static void gen(zero_dtype dt, void *p, size_t n, int specials)
{
    size_t i;
    for (i = 0; i < n; i++) {
        float f = gen_f32(specials);
        switch (dt) {
        case ZERO_F32: ((float *)p)[i] = f; break;
        case ZERO_F16: ((uint16_t *)p)[i] = zero_f32_to_f16(f); break;
        case ZERO_BF16: ((uint16_t *)p)[i] = zero_f32_to_bf16(f); break;
        default: { /* a double with bits below fp32's precision too */
            double d = (double)f;
            if (isfinite(d) && d != 0.0) d *= 1.0 + ldexp((double)(zt_rand64() >> 40), -40);
            if (!specials || i % 7 != 3) ((double *)p)[i] = d;
            else { uint64_t u = zt_rand64() | 0x7ff0000000000000ull; memcpy((double *)p + i, &u, 8); }
        }
        }
    }
}

/* Element i of a and b: the same bits, or (nan_ok) both NaN. */
static int same_elem(zero_dtype dt, const void *a, const void *b, size_t i, int nan_ok)
{
    size_t es = zero_dtype_size(dt);
    const unsigned char *x = (const unsigned char *)a + i * es, *y = (const unsigned char *)b + i * es;
    if (memcmp(x, y, es) == 0) return 1;
    if (!nan_ok) return 0;
    switch (dt) {
    case ZERO_F32: { float f, g; memcpy(&f, x, 4); memcpy(&g, y, 4); return f != f && g != g; }
    case ZERO_F64: { double f, g; memcpy(&f, x, 8); memcpy(&g, y, 8); return f != f && g != g; }
    case ZERO_F16: { uint16_t f, g; memcpy(&f, x, 2); memcpy(&g, y, 2); return (f & 0x7fff) > 0x7c00 && (g & 0x7fff) > 0x7c00; }
    default: { uint16_t f, g; memcpy(&f, x, 2); memcpy(&g, y, 2); return (f & 0x7fff) > 0x7f80 && (g & 0x7fff) > 0x7f80; }
    }
}

/* First differing element of n, or n. */
static size_t first_diff(zero_dtype dt, const void *a, const void *b, size_t n, int nan_ok)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (!same_elem(dt, a, b, i, nan_ok)) return i;
    return n;
}

static char *at(void *p, zero_dtype dt, size_t i) { return (char *)p + i * zero_dtype_size(dt); }

/* Buffers shared by the tests: two device, three host, MAXN + PAD elements of 8 bytes. */
static void *dA, *dB, *hA, *hB, *hC, *hD;

static int setup(void)
{
    size_t bytes = (MAXN + PAD) * 8;
    if (cudaMalloc(&dA, bytes) != cudaSuccess || cudaMalloc(&dB, bytes) != cudaSuccess) return 0;
    hA = malloc(bytes);
    hB = malloc(bytes);
    hC = malloc(bytes);
    hD = malloc(bytes);
    return hA && hB && hC && hD;
}

static zero_result gsync(void) { return G->ops->sync(G, ZERO_QUEUE_COMPUTE); }

/* Host -> device outside the device's queues. A cudaMemcpy from pageable memory may return
   before its DMA has landed (it is ordered on the legacy stream only), and the CUDA device's
   streams are non-blocking (no implicit order with the legacy stream): without the device
   sync, an op enqueued next could read the old bytes. */
static cudaError_t h2d(void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

/* ---- casts ---- */

ZT_TEST(test_cast)
{
    int di, si, oi;
    size_t k;
    for (di = 0; di < 4; di++)
        for (si = 0; si < 4; si++)
            for (k = 0; k < NSIZES; k++)
                for (oi = 0; oi < NOFFS; oi++) {
                    zero_dtype dd = DTS[di], sd = DTS[si];
                    size_t n = SIZE(k), tot = n + PAD, bad;
                    int so = OFFS[oi][0], dof = OFFS[oi][1];
                    gen(sd, hA, tot, 1);
                    gen(dd, hB, tot, 1); /* dst garbage: outside the range it must stay */
                    memcpy(hC, hB, tot * zero_dtype_size(dd));
                    CUDA_OK(h2d(dA, hA, tot * zero_dtype_size(sd)));
                    CUDA_OK(h2d(dB, hB, tot * zero_dtype_size(dd)));
                    Z_OK(G->ops->cast(G, ZERO_QUEUE_COMPUTE, at(dB, dd, dof), dd, at(dA, sd, so), sd, n));
                    Z_OK(gsync());
                    Z_OK(H->ops->cast(H, ZERO_QUEUE_COMPUTE, at(hC, dd, dof), dd, at(hA, sd, so), sd, n));
                    CUDA_OK(cudaMemcpy(hD, dB, tot * zero_dtype_size(dd), cudaMemcpyDeviceToHost));
                    bad = first_diff(dd, hD, hC, tot, 0);
                    ZT_CHECKF(bad == tot, "cast %s -> %s n=%zu offs %d/%d: element %zu differs",
                              zero_dtype_name(sd), zero_dtype_name(dd), n, so, dof, bad);
                    if (bad != tot) return;
                }
}

/* ---- add, scale ---- */

ZT_TEST(test_add_scale)
{
    static const float scales[] = {0.5f, 3.0f, 1.0f / 65536.0f, 65504.0f, -1.5f, 0.0f};
    int ti, oi;
    size_t k;
    for (ti = 0; ti < 4; ti++)
        for (k = 0; k < NSIZES; k++)
            for (oi = 0; oi < NOFFS; oi++) {
                zero_dtype dt = DTS[ti];
                size_t n = SIZE(k), tot = n + PAD, es = zero_dtype_size(dt), bad;
                int so = OFFS[oi][0], dof = OFFS[oi][1];
                float s = scales[(k + (size_t)oi) % 6];
                gen(dt, hA, tot, 1);
                gen(dt, hB, tot, 1);
                memcpy(hC, hB, tot * es);
                CUDA_OK(h2d(dA, hA, tot * es));
                CUDA_OK(h2d(dB, hB, tot * es));
                Z_OK(G->ops->add(G, ZERO_QUEUE_COMPUTE, at(dB, dt, dof), at(dA, dt, so), dt, n));
                Z_OK(G->ops->scale(G, ZERO_QUEUE_COMPUTE, at(dB, dt, so), dt, n, s));
                Z_OK(gsync());
                Z_OK(H->ops->add(H, ZERO_QUEUE_COMPUTE, at(hC, dt, dof), at(hA, dt, so), dt, n));
                Z_OK(H->ops->scale(H, ZERO_QUEUE_COMPUTE, at(hC, dt, so), dt, n, s));
                CUDA_OK(cudaMemcpy(hD, dB, tot * es, cudaMemcpyDeviceToHost));
                bad = first_diff(dt, hD, hC, tot, 1);
                ZT_CHECKF(bad == tot, "add+scale %s n=%zu offs %d/%d s=%g: element %zu differs", zero_dtype_name(dt),
                          n, so, dof, (double)s, bad);
                if (bad != tot) return;
            }
}

/* ---- non-finite check ---- */

ZT_TEST(test_nonfinite)
{
    int ti, oi, variant;
    size_t k;
    float *dflag;
    CUDA_OK(cudaMalloc((void **)&dflag, sizeof(float)));
    for (ti = 0; ti < 4; ti++)
        for (k = 0; k < NSIZES; k++)
            for (oi = 0; oi < NOFFS; oi++)
                for (variant = 0; variant < 5; variant++) {
                    zero_dtype dt = DTS[ti];
                    size_t n = SIZE(k), tot = n + PAD, es = zero_dtype_size(dt), pos;
                    int off = OFFS[oi][0];
                    float hflag = variant == 4 ? 0.5f : 0.0f, gflag = hflag; /* "left as it was" */
                    gen(dt, hA, tot, 0); /* all finite */
                    /* 0: clean; 1: NaN at a random spot; 2: inf first; 3: inf last;
                       4: inf just outside the range (must not count) */
                    pos = variant == 1 ? (size_t)(zt_rand64() % n) : variant == 2 ? 0 : variant == 3 ? n - 1 : n;
                    if (variant > 0) {
                        float bad = variant == 1 ? NAN : INFINITY;
                        zero_dtype f32 = ZERO_F32;
                        Z_OK(zero_convert(at(hA, dt, (size_t)off + pos), dt, &bad, f32, 1, ZERO_SIMD_AUTO));
                    }
                    CUDA_OK(h2d(dA, hA, tot * es));
                    CUDA_OK(h2d(dflag, &gflag, sizeof gflag));
                    Z_OK(G->ops->nonfinite(G, ZERO_QUEUE_COMPUTE, at(dA, dt, (size_t)off), dt, n, dflag));
                    Z_OK(gsync());
                    CUDA_OK(cudaMemcpy(&gflag, dflag, sizeof gflag, cudaMemcpyDeviceToHost));
                    Z_OK(H->ops->nonfinite(H, ZERO_QUEUE_COMPUTE, at(hA, dt, (size_t)off), dt, n, &hflag));
                    ZT_CHECKF(gflag == hflag && hflag == ((variant >= 1 && variant <= 3) ? 1.0f : variant == 4 ? 0.5f : 0.0f),
                              "nonfinite %s n=%zu off %d variant %d: cuda %g host %g", zero_dtype_name(dt), n, off,
                              variant, (double)gflag, (double)hflag);
                }
    cudaFree(dflag);
}

/* ---- sum of squares ---- */

ZT_TEST(test_sumsq)
{
    static const size_t sizes[] = {1, 7, 8, 9, 100, 65535, 65536, 65537, 3 * 65536 + 17, 300007};
    int ti, oi;
    size_t k;
    double *dacc;
    CUDA_OK(cudaMalloc((void **)&dacc, sizeof(double)));
    for (ti = 0; ti < 4; ti++)
        for (k = 0; k < sizeof sizes / sizeof *sizes; k++)
            for (oi = 0; oi < NOFFS; oi++) {
                zero_dtype dt = DTS[ti];
                size_t n = sizes[k], tot = n + PAD, es = zero_dtype_size(dt), i;
                int off = OFFS[oi][0];
                double gacc = 0.25, hacc = 0.25;
                long double ref = 0.25L;
                if (zt_quick() && n > 70000) continue;
                gen(dt, hA, tot, 0);
                for (i = 0; i < n; i++) {
                    long double x;
                    if (dt == ZERO_F64) x = ((const double *)hA)[off + i];
                    else {
                        float f;
                        zero_convert(&f, ZERO_F32, at(hA, dt, (size_t)off + i), dt, 1, ZERO_SIMD_AUTO);
                        x = f;
                    }
                    ref += x * x;
                }
                CUDA_OK(h2d(dA, hA, tot * es));
                CUDA_OK(h2d(dacc, &gacc, sizeof gacc));
                Z_OK(G->ops->sumsq(G, ZERO_QUEUE_COMPUTE, at(dA, dt, (size_t)off), dt, n, dacc));
                Z_OK(gsync());
                CUDA_OK(cudaMemcpy(&gacc, dacc, sizeof gacc, cudaMemcpyDeviceToHost));
                Z_OK(H->ops->sumsq(H, ZERO_QUEUE_COMPUTE, at(hA, dt, (size_t)off), dt, n, &hacc));
                ZT_CHECKF(memcmp(&gacc, &hacc, 8) == 0, "sumsq %s n=%zu off %d: cuda %.17g host %.17g", zero_dtype_name(dt),
                          n, off, gacc, hacc);
                ZT_CHECKF(fabsl((long double)gacc - ref) <= 1e-12L * ref, "sumsq %s n=%zu: %.17g vs exact %.17Lg",
                          zero_dtype_name(dt), n, gacc, ref);
            }
    /* n = 0 still adds 0.0, as the host does (-0.0 becomes +0.0) */
    {
        double g = -0.0, h = -0.0;
        CUDA_OK(h2d(dacc, &g, 8));
        Z_OK(G->ops->sumsq(G, ZERO_QUEUE_COMPUTE, dA, ZERO_F32, 0, dacc));
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(&g, dacc, 8, cudaMemcpyDeviceToHost));
        Z_OK(H->ops->sumsq(H, ZERO_QUEUE_COMPUTE, hA, ZERO_F32, 0, &h));
        ZT_CHECK(memcmp(&g, &h, 8) == 0);
    }
    cudaFree(dacc);
}

/* ---- gradient multiplier ---- */

ZT_TEST(test_grad_mul)
{
    static const double sums[] = {0.0, 1e-30, 0.09, 1.0, 4.0, 12345.678, 1e30};
    static const float flags[] = {0.0f, 1.0f};
    static const float unscales[] = {1.0f, 1.0f / 65536.0f, 1.0f / 3.0f};
    static const float clips[] = {0.0f, 0.5f, 1.0f, 1000.0f};
    size_t a, b, c, e;
    double *ds;
    float *df, *dout;
    CUDA_OK(cudaMalloc((void **)&ds, 8));
    CUDA_OK(cudaMalloc((void **)&df, 4));
    CUDA_OK(cudaMalloc((void **)&dout, 8));
    for (a = 0; a < 7; a++)
        for (b = 0; b < 2; b++)
            for (c = 0; c < 3; c++)
                for (e = 0; e < 4; e++) {
                    float gout[2], hout[2];
                    CUDA_OK(h2d(ds, &sums[a], 8));
                    CUDA_OK(h2d(df, &flags[b], 4));
                    Z_OK(G->ops->grad_mul(G, ZERO_QUEUE_COMM, ds, df, unscales[c], clips[e], dout));
                    Z_OK(G->ops->sync(G, ZERO_QUEUE_COMM));
                    CUDA_OK(cudaMemcpy(gout, dout, 8, cudaMemcpyDeviceToHost));
                    Z_OK(H->ops->grad_mul(H, ZERO_QUEUE_COMM, &sums[a], &flags[b], unscales[c], clips[e], hout));
                    ZT_CHECKF(memcmp(gout, hout, 8) == 0, "grad_mul(%g, %g, %g, %g): cuda %.9g %.9g host %.9g %.9g",
                              sums[a], (double)flags[b], (double)unscales[c], (double)clips[e], (double)gout[0],
                              (double)gout[1], (double)hout[0], (double)hout[1]);
                }
    cudaFree(ds);
    cudaFree(df);
    cudaFree(dout);
}

/* ---- fused Adam / AdamW ---- */

/* One range on both devices: the state in host memory (h*) is copied to the GPU, stepped on
   both, and compared. offs: element offsets of master/m/v, grad, param. */
static void adam_case(zero_dtype gd, zero_dtype pd, size_t n, const int offs[3], const zero_adam_coefs *co,
                      float mul, float skip)
{
    size_t tot = n + PAD, i, bad;
    size_t b32 = tot * 4;
    float *hm = (float *)malloc(b32 * 3), *gm = (float *)malloc(b32 * 3);
    unsigned char *hg = (unsigned char *)malloc(b32), *hp = (unsigned char *)malloc(b32), *gp = (unsigned char *)malloc(b32);
    float *dm = NULL, *dmul = NULL, *dskip = NULL;
    unsigned char *dg = NULL, *dp = NULL;
    zero_adam_range hr, dr;
    const char *what[3] = {"master", "m", "v"};
    int j;
    memset(&hr, 0, sizeof hr);
    memset(&dr, 0, sizeof dr);
    gen(ZERO_F32, hm, tot, 1);                      /* master */
    gen(ZERO_F32, hm + tot, tot, 1);                /* m */
    for (i = 0; i < tot; i++) hm[2 * tot + i] = fabsf(gen_f32(i % 50 == 7)); /* v >= 0 (a few NaN/inf) */
    gen(gd, hg, tot, 1);
    gen(pd == ZERO_DTYPE_DEFAULT ? ZERO_F32 : pd, hp, tot, 0);
    memcpy(gp, hp, b32);
    if (cudaMalloc((void **)&dm, b32 * 3) != cudaSuccess || cudaMalloc((void **)&dg, b32) != cudaSuccess ||
        cudaMalloc((void **)&dp, b32) != cudaSuccess || cudaMalloc((void **)&dmul, 8) != cudaSuccess) {
        ZT_CHECKF(0, "cudaMalloc failed");
        goto done;
    }
    dskip = dmul + 1;
    if (h2d(dm, hm, b32 * 3) != cudaSuccess || h2d(dg, hg, b32) != cudaSuccess || h2d(dp, hp, b32) != cudaSuccess ||
        h2d(dmul, &mul, 4) != cudaSuccess || h2d(dskip, &skip, 4) != cudaSuccess) {
        ZT_CHECKF(0, "upload failed: %s", cudaGetErrorString(cudaGetLastError()));
        goto done;
    }
    hr.numel = dr.numel = n;
    hr.master = hm + offs[0];
    hr.m = hm + tot + offs[0];
    hr.v = hm + 2 * tot + offs[0];
    dr.master = dm + offs[0];
    dr.m = dm + tot + offs[0];
    dr.v = dm + 2 * tot + offs[0];
    hr.grad = at(hg, gd, (size_t)offs[1]);
    dr.grad = at(dg, gd, (size_t)offs[1]);
    hr.grad_dtype = dr.grad_dtype = gd;
    hr.param_dtype = dr.param_dtype = pd;
    hr.param = pd == ZERO_DTYPE_DEFAULT ? NULL : at(hp, pd, (size_t)offs[2]);
    dr.param = pd == ZERO_DTYPE_DEFAULT ? NULL : at(dp, pd, (size_t)offs[2]);
    {
        zero_result r1 = G->ops->adam(G, ZERO_QUEUE_COMPUTE, &dr, co, dmul, dskip);
        zero_result r2 = gsync();
        zero_result r3 = H->ops->adam(H, ZERO_QUEUE_COMPUTE, &hr, co, &mul, &skip);
        ZT_CHECKF(r1 == ZERO_OK && r2 == ZERO_OK && r3 == ZERO_OK, "adam: %s", zero_last_error());
    }
    if (cudaMemcpy(gm, dm, b32 * 3, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(gp, dp, b32, cudaMemcpyDeviceToHost) != cudaSuccess) {
        ZT_CHECKF(0, "download failed: %s", cudaGetErrorString(cudaGetLastError()));
        goto done;
    }
    for (j = 0; j < 3; j++) {
        bad = first_diff(ZERO_F32, gm + (size_t)j * tot, hm + (size_t)j * tot, tot, 1);
        ZT_CHECKF(bad == tot, "adam g=%s p=%s n=%zu offs %d/%d/%d mul %g skip %g: %s[%zu] cuda %.9g host %.9g",
                  zero_dtype_name(gd), zero_dtype_name(pd), n, offs[0], offs[1], offs[2], (double)mul, (double)skip,
                  what[j], bad, bad < tot ? (double)gm[(size_t)j * tot + bad] : 0.0,
                  bad < tot ? (double)hm[(size_t)j * tot + bad] : 0.0);
    }
    if (pd != ZERO_DTYPE_DEFAULT) {
        bad = first_diff(pd, gp, hp, tot, 1);
        ZT_CHECKF(bad == tot, "adam g=%s p=%s n=%zu offs %d/%d/%d: param[%zu] differs", zero_dtype_name(gd),
                  zero_dtype_name(pd), n, offs[0], offs[1], offs[2], bad);
    }
done:
    cudaFree(dm);
    cudaFree(dg);
    cudaFree(dp);
    cudaFree(dmul);
    free(hm);
    free(gm);
    free(hg);
    free(hp);
    free(gp);
}

ZT_TEST(test_adam)
{
    static const zero_dtype gds[3] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    static const zero_dtype pds[4] = {ZERO_DTYPE_DEFAULT, ZERO_F32, ZERO_F16, ZERO_BF16};
    static const int offs[][3] = {{0, 0, 0}, {1, 1, 1}, {5, 5, 5}, {0, 3, 0}, {2, 0, 7}, {7, 7, 1}};
    static const float muls[] = {1.0f, 1.0f / 65536.0f, 0.37f};
    int gi, pi, oi, step, mode;
    size_t k;
    for (mode = 0; mode < (zt_quick() ? 1 : 2); mode++)
        for (step = 1; step <= (zt_quick() ? 1 : 1000); step *= 31) {
            zero_adam_desc desc;
            zero_adam_coefs co;
            memset(&desc, 0, sizeof desc);
            desc.mode = mode ? ZERO_ADAM : ZERO_ADAMW;
            desc.lr = 3e-3;
            desc.weight_decay = 0.05;
            Z_OK(zero_adam_coefs_make(&co, &desc, desc.weight_decay, step));
            for (gi = 0; gi < 3; gi++)
                for (pi = 0; pi < 4; pi++)
                    for (k = 0; k < NSIZES; k += (step == 1 ? 1 : 3))
                        for (oi = 0; oi < 6; oi++) {
                            adam_case(gds[gi], pds[pi], SIZE(k), offs[oi], &co, muls[(k + (size_t)oi) % 3], 0.0f);
                            if (zt_cur_failures) return;
                        }
        }
    /* skip != 0: nothing is written */
    {
        zero_adam_desc desc;
        zero_adam_coefs co;
        static const int o[3] = {0, 0, 0};
        memset(&desc, 0, sizeof desc);
        Z_OK(zero_adam_coefs_make(&co, &desc, 0.0f, 1));
        adam_case(ZERO_F16, ZERO_F16, 1000, o, &co, 1.0f, 1.0f);
    }
}

/* bf16 optimizer states (state_dtype BF16): the CUDA kernel and the host give the same bits
   for master, m, v and params, every grad and param dtype, ranges at odd offsets (the
   stochastic rounding's counter is sr_index + i), several ranges in one launch. */
ZT_TEST(test_adam_bf16_states)
{
    static const zero_dtype gds[3] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    static const zero_dtype pds[4] = {ZERO_DTYPE_DEFAULT, ZERO_F32, ZERO_F16, ZERO_BF16};
    const size_t n = 5000;
    uint16_t *hs = (uint16_t *)malloc(n * 6), *gs = (uint16_t *)malloc(n * 6);
    unsigned char *hg = (unsigned char *)malloc(n * 4), *hp = (unsigned char *)malloc(n * 4),
                  *gp = (unsigned char *)malloc(n * 4);
    uint16_t *ds = NULL;
    unsigned char *dg = NULL, *dp = NULL;
    float *dmul = NULL, mul = 0.75f, skip = 0.0f;
    zero_adam_desc desc;
    zero_adam_coefs co;
    int gi, pi;
    size_t i;
    memset(&desc, 0, sizeof desc);
    desc.weight_decay = 0.05;
    Z_OK(zero_adam_coefs_make(&co, &desc, 0.05, 4));
    if (cudaMalloc((void **)&ds, n * 6) != cudaSuccess || cudaMalloc((void **)&dg, n * 4) != cudaSuccess ||
        cudaMalloc((void **)&dp, n * 4) != cudaSuccess || cudaMalloc((void **)&dmul, 8) != cudaSuccess) {
        ZT_CHECKF(0, "cudaMalloc failed");
        goto done;
    }
    Z_OK(h2d(dmul, &mul, 4) == cudaSuccess ? ZERO_OK : ZERO_ERROR_DEVICE);
    Z_OK(h2d(dmul + 1, &skip, 4) == cudaSuccess ? ZERO_OK : ZERO_ERROR_DEVICE);
    for (gi = 0; gi < 3; gi++)
        for (pi = 0; pi < 4; pi++) {
            zero_dtype gd = gds[gi], pd = pds[pi];
            size_t cuts[4] = {0, 3, 1001, n}, k;
            for (i = 0; i < n; i++) {
                hs[i] = zero_f32_to_bf16((float)sin(0.3 * (double)i));
                hs[n + i] = zero_f32_to_bf16((float)(1e-2 * cos((double)i)));
                hs[2 * n + i] = zero_f32_to_bf16((float)(1e-4 * (1.2 + sin(0.7 * (double)i))));
            }
            gen(gd, hg, n, 0);
            memset(hp, 0, n * 4);
            memcpy(gs, hs, n * 6);
            if (h2d(ds, hs, n * 6) != cudaSuccess || h2d(dg, hg, n * 4) != cudaSuccess ||
                h2d(dp, hp, n * 4) != cudaSuccess) {
                ZT_CHECKF(0, "upload failed");
                goto done;
            }
            for (k = 0; k + 1 < 4; k++) { /* three ranges, queued into one launch */
                zero_adam_range hr, dr;
                size_t a = cuts[k], b = cuts[k + 1];
                memset(&hr, 0, sizeof hr);
                hr.numel = b - a;
                hr.grad_dtype = gd;
                hr.param_dtype = pd;
                hr.state_dtype = ZERO_BF16;
                hr.sr_key = zero_sr_key(11, 4);
                hr.sr_index = 100 + a;
                dr = hr;
                hr.master = (float *)(void *)(hs + a);
                hr.m = (float *)(void *)(hs + n + a);
                hr.v = (float *)(void *)(hs + 2 * n + a);
                hr.grad = at(hg, gd, a);
                hr.param = pd == ZERO_DTYPE_DEFAULT ? NULL : at(hp, pd, a);
                dr.master = (float *)(void *)(ds + a);
                dr.m = (float *)(void *)(ds + n + a);
                dr.v = (float *)(void *)(ds + 2 * n + a);
                dr.grad = at(dg, gd, a);
                dr.param = pd == ZERO_DTYPE_DEFAULT ? NULL : at(dp, pd, a);
                Z_OK(H->ops->adam(H, ZERO_QUEUE_COMPUTE, &hr, &co, &mul, &skip));
                Z_OK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &dr, &co, dmul, dmul + 1));
            }
            Z_OK(gsync());
            if (cudaMemcpy(gs, ds, n * 6, cudaMemcpyDeviceToHost) != cudaSuccess ||
                cudaMemcpy(gp, dp, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
                ZT_CHECKF(0, "download failed");
                goto done;
            }
            ZT_CHECKF(!memcmp(gs, hs, n * 6), "bf16 states g=%s p=%s: master/m/v differ", zero_dtype_name(gd),
                      zero_dtype_name(pd));
            if (pd != ZERO_DTYPE_DEFAULT)
                ZT_CHECKF(!memcmp(gp, hp, n * zero_dtype_size(pd)), "bf16 states g=%s p=%s: params differ",
                          zero_dtype_name(gd), zero_dtype_name(pd));
            if (zt_cur_failures) goto done;
        }
done:
    cudaFree(ds);
    cudaFree(dg);
    cudaFree(dp);
    cudaFree(dmul);
    free(hs);
    free(gs);
    free(hg);
    free(hp);
    free(gp);
}

/* ---- arena, fallback, pinned memory, argument errors ---- */

ZT_TEST(test_arena)
{
    zero_device *d = NULL;
    zero_cuda_stats st0, st;
    static const size_t sizes[] = {1, 255, 256, 257, 1000, 4096, 12345, 1 << 20};
    void *p[8], *extra = NULL, *pin = NULL;
    size_t total = 0, i, j;
    Z_OK(zero_cuda_device_create(NULL, &d));
    Z_OK(zero_cuda_device_stats(d, &st0));
    ZT_CHECK(st0.cuda_mallocs == 1); /* the scratch */
    for (i = 0; i < 8; i++) total += sizes[i];
    Z_OK(d->ops->reserve(d, total, 8));
    for (i = 0; i < 8; i++) Z_OK(d->ops->alloc(d, sizes[i], (zero_mem_category)(i % ZERO_MEM_COUNT), &p[i]));
    Z_OK(zero_cuda_device_stats(d, &st));
    ZT_CHECKF(st.cuda_mallocs == 2, "cudaMalloc calls: %llu (1 scratch + 1 arena expected)", st.cuda_mallocs);
    ZT_CHECK(st.fallback_bytes == 0 && st.allocations == 8);
    ZT_CHECK(st.arena_bytes == total + 8 * 256);
    for (i = 0; i < 8; i++) {
        ZT_CHECKF((uintptr_t)p[i] % 256 == 0, "allocation %zu at %p", i, p[i]);
        ZT_CHECK(st.bytes[i % ZERO_MEM_COUNT] == sizes[i]);
        for (j = 0; j < i; j++) /* no overlap */
            ZT_CHECK((char *)p[i] + sizes[i] <= (char *)p[j] || (char *)p[j] + sizes[j] <= (char *)p[i]);
    }
    /* the memory is usable: write every byte of every block, read it back */
    for (i = 0; i < 8; i++) CUDA_OK(cudaMemset(p[i], (int)i + 1, sizes[i]));
    for (i = 0; i < 8; i++) {
        unsigned char last = 0;
        CUDA_OK(cudaMemcpy(&last, (char *)p[i] + sizes[i] - 1, 1, cudaMemcpyDeviceToHost));
        ZT_CHECK(last == i + 1);
    }
    /* no room left: a fallback cudaMalloc */
    Z_OK(d->ops->alloc(d, 3000, ZERO_MEM_SCRATCH, &extra));
    Z_OK(zero_cuda_device_stats(d, &st));
    ZT_CHECK(st.cuda_mallocs == 3 && st.fallback_bytes == 3000);
    Z_OK(d->ops->free(d, extra));
    /* free in a scattered order, reallocate into the holes: no new cudaMalloc */
    Z_OK(d->ops->free(d, p[3]));
    Z_OK(d->ops->free(d, p[1]));
    Z_OK(d->ops->free(d, p[2])); /* merges 1..3 */
    Z_OK(d->ops->alloc(d, sizes[1] + sizes[2] + 200, ZERO_MEM_GRAD, &p[1]));
    Z_OK(zero_cuda_device_stats(d, &st));
    ZT_CHECK(st.cuda_mallocs == 3);
    /* inside a block, not its start (p[0] + 256 would be the new p[1]: first fit put it
       at the hole's start, right after p[0]'s 256-byte block) */
    ZT_CHECK(d->ops->free(d, (char *)p[0] + 64) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(d->ops->free(d, (char *)p[1] + 256) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(d->ops->free(d, p[3]) == ZERO_ERROR_INVALID_ARGUMENT); /* freed already */
    ZT_CHECK(d->ops->alloc(d, 0, ZERO_MEM_GRAD, &extra) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(d->ops->free(d, NULL) == ZERO_OK);
    Z_OK(d->ops->free(d, p[1]));
    for (i = 0; i < 8; i++)
        if (i < 1 || i > 3) Z_OK(d->ops->free(d, p[i]));
    Z_OK(zero_cuda_device_stats(d, &st));
    ZT_CHECK(st.allocations == 0 && st.arena_free_bytes == st.arena_bytes);
    for (i = 0; i < ZERO_MEM_COUNT; i++) ZT_CHECK(st.bytes[i] == 0);
    /* a second engine's reserve releases the empty arena first */
    Z_OK(d->ops->reserve(d, 1000, 1));
    Z_OK(zero_cuda_device_stats(d, &st));
    ZT_CHECK(st.arena_bytes == 1256);
    /* pinned host memory */
    Z_OK(zero_cuda_host_alloc(d, 1 << 20, &pin));
    Z_OK(zero_cuda_device_stats(d, &st));
    ZT_CHECK(st.pinned_bytes == 1 << 20);
    {
        cudaPointerAttributes at;
        CUDA_OK(cudaPointerGetAttributes(&at, pin));
        ZT_CHECK(at.type == cudaMemoryTypeHost);
    }
    ZT_CHECK(zero_cuda_host_free(d, (char *)pin + 1) == ZERO_ERROR_INVALID_ARGUMENT);
    Z_OK(zero_cuda_host_free(d, pin));
    Z_OK(zero_cuda_host_alloc(d, 4096, &pin)); /* left for destroy to free */
    ZT_CHECK(zero_cuda_host_alloc(d, 0, &pin) == ZERO_ERROR_INVALID_ARGUMENT);
    /* argument checks */
    ZT_CHECK(d->ops->cast(d, ZERO_QUEUE_COMPUTE, NULL, ZERO_F16, dA, ZERO_F32, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(d->ops->cast(d, (zero_queue)7, dB, ZERO_F16, dA, ZERO_F32, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(d->ops->add(d, ZERO_QUEUE_COMPUTE, dB, dA, (zero_dtype)9, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(d->ops->copy(d, ZERO_QUEUE_COMPUTE, (char *)dA + 4, dA, 64) == ZERO_ERROR_INVALID_ARGUMENT); /* overlap */
    ZT_CHECK(d->ops->cast(d, ZERO_QUEUE_COMPUTE, (char *)dA + 2, ZERO_F16, dA, ZERO_F32, 8) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_cuda_is_device(d) && !zero_cuda_is_device(H) && zero_cuda_device_ordinal(d) == 0);
    ZT_CHECK(zero_cuda_device_stats(H, &st) == ZERO_ERROR_INVALID_ARGUMENT);
    {
        zero_cuda_desc bad;
        zero_device *x = NULL;
        memset(&bad, 0, sizeof bad);
        bad.device = 1000;
        ZT_CHECK(zero_cuda_device_create(&bad, &x) == ZERO_ERROR_INVALID_ARGUMENT && x == NULL);
    }
    zero_device_destroy(d);
}

/* ---- streams and events ---- */

static __global__ void spin_kernel(float *x, size_t n, int rounds)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int r;
    if (i >= n) return;
    for (r = 0; r < rounds; r++) x[i] = __fmaf_rn(x[i], 0.999f, 1.0f);
}

ZT_TEST(test_streams_events)
{
    zero_device *d = NULL;
    zero_event *ev = NULL;
#ifdef CUDASIM /* the CPU harness runs every thread: a shorter spin (its race mode delays ops) */
    const size_t n = 1 << 14;
    const int rounds = 200;
#else
    const size_t n = 1 << 20;
    const int rounds = 20000;
#endif
    float *x, *y, *h;
    size_t i;
    void *q[3];
    int a, b, bad = 0;
    Z_OK(zero_cuda_device_create(NULL, &d));
    for (a = 0; a < 3; a++) {
        q[a] = d->ops->native_queue(d, (zero_queue)a);
        ZT_CHECK(q[a] != NULL);
        for (b = 0; b < a; b++) ZT_CHECK(q[a] != q[b]);
    }
    CUDA_OK(cudaMalloc((void **)&x, n * 4));
    CUDA_OK(cudaMalloc((void **)&y, n * 4));
    h = (float *)malloc(n * 4);
    Z_OK(d->ops->event_create(d, &ev));
    /* a slow producer on compute, the consumer on comm after wait(): it must see the end
       result (a missing dependency would copy a partial one) */
    Z_OK(d->ops->fill_zero(d, ZERO_QUEUE_COMPUTE, x, n * 4));
    ZERO_CUDA_LAUNCH(spin_kernel, (unsigned)(n / 256), 256, 0, (cudaStream_t)q[ZERO_QUEUE_COMPUTE], x, n, rounds);
    CUDA_OK(cudaGetLastError());
    Z_OK(d->ops->scale(d, ZERO_QUEUE_COMPUTE, x, ZERO_F32, n, 2.0f));
    Z_OK(d->ops->record(d, ZERO_QUEUE_COMPUTE, ev));
    Z_OK(d->ops->wait(d, ZERO_QUEUE_COMM, ev));
    Z_OK(d->ops->copy(d, ZERO_QUEUE_COMM, y, x, n * 4));
    Z_OK(d->ops->download(d, ZERO_QUEUE_COMM, h, y, n * 4));
    Z_OK(d->ops->sync(d, ZERO_QUEUE_COMM));
    {
        float want = 0.0f;
        int r;
        for (r = 0; r < rounds; r++) want = fmaf(want, 0.999f, 1.0f);
        want *= 2.0f;
        for (i = 0; i < n; i++)
            if (h[i] != want) bad++;
        ZT_CHECKF(bad == 0, "%d elements differ from %.9g (first %.9g)", bad, (double)want, (double)h[0]);
    }
    /* upload from pinned memory on the offload queue */
    {
        void *pin = NULL;
        Z_OK(zero_cuda_host_alloc(d, n * 4, &pin));
        for (i = 0; i < n; i++) ((float *)pin)[i] = (float)i;
        Z_OK(d->ops->upload(d, ZERO_QUEUE_OFFLOAD, x, pin, n * 4));
        Z_OK(d->ops->download(d, ZERO_QUEUE_OFFLOAD, h, x, n * 4));
        Z_OK(d->ops->sync(d, ZERO_QUEUE_OFFLOAD));
        ZT_CHECK(h[12345] == 12345.0f && h[n - 1] == (float)(n - 1));
        Z_OK(zero_cuda_host_free(d, pin));
    }
    d->ops->event_destroy(d, ev);
    zero_device_destroy(d);
    /* the user's compute stream: used, not destroyed */
    {
        cudaStream_t s;
        zero_cuda_desc desc;
        CUDA_OK(cudaStreamCreate(&s));
        memset(&desc, 0, sizeof desc);
        desc.compute_stream = (void *)s;
        Z_OK(zero_cuda_device_create(&desc, &d));
        ZT_CHECK(d->ops->native_queue(d, ZERO_QUEUE_COMPUTE) == (void *)s);
        Z_OK(d->ops->fill_zero(d, ZERO_QUEUE_COMPUTE, x, 64));
        zero_device_destroy(d);
        ZT_CHECK(cudaStreamQuery(s) == cudaSuccess);
        CUDA_OK(cudaStreamDestroy(s));
    }
    cudaFree(x);
    cudaFree(y);
    free(h);
}

/* ---- past 2^31 elements ---- */

static __global__ void fill16_kernel(uint16_t *x, size_t n, uint16_t v)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) x[i] = v;
}

/* A small fp16 value from the index (exactly representable; same on host and device). */
static __host__ __device__ uint16_t hashed16(size_t i)
{
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 32;
    return (uint16_t)(0x3000u + (uint32_t)(z % 0x1000u)) ^ (uint16_t)((z >> 20) & 0x8000u); /* +-[0.125, 1) */
}

static __global__ void fill_hashed_kernel(uint16_t *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) x[i] = hashed16(i);
}

ZT_TEST(test_past_2_31)
{
    const size_t n = ((size_t)1 << 31) + 7, b16 = n * 2, b32 = n * 4;
    size_t freeb = 0, totalb = 0, need = b16 * 2 + b32 * 3 + ((size_t)1 << 30);
    uint16_t *x = NULL, *p = NULL;
    float *mvm = NULL, *fl = NULL, *mul = NULL;
    double *acc = NULL;
    /* windows checked: the start, around 2^31, the end */
    static const size_t wins[3] = {0, ((size_t)1 << 31) - 40, ((size_t)1 << 31) + 7 - 64};
    const size_t W = 64;
    int w;
    if (zt_quick()) ZT_SKIP("ZT_QUICK");
#ifdef CUDASIM
    ZT_SKIP("not simulated: 2^31 elements (23 GiB, hours of CPU time under tests/cudasim)");
#endif
    CUDA_OK(cudaMemGetInfo(&freeb, &totalb));
    if (freeb < need) {
        char why[128];
        snprintf(why, sizeof why, "needs %.1f GiB of device memory, %.1f GiB free", need / 1073741824.0,
                 freeb / 1073741824.0);
        ZT_SKIP(why);
    }
    CUDA_OK(cudaMalloc((void **)&x, b16));
    CUDA_OK(cudaMalloc((void **)&p, b16));
    CUDA_OK(cudaMalloc((void **)&mvm, b32 * 3));
    CUDA_OK(cudaMalloc((void **)&fl, 16));
    mul = fl + 1;
    acc = (double *)(fl + 2);
    /* sum of squares of all ones but the last (2.0): n + 3, exact in any order */
    ZERO_CUDA_LAUNCH(fill16_kernel, 4096, 256, 0, 0, x, n, 0x3c00);
    CUDA_OK(cudaGetLastError());
    {
        uint16_t two = 0x4000, inf = 0x7c00, one = 0x3c00, nan = 0x7e01;
        double s = 0.0;
        float f = 0.0f;
        CUDA_OK(h2d(x + n - 1, &two, 2));
        CUDA_OK(h2d(acc, &s, 8));
        Z_OK(G->ops->sumsq(G, ZERO_QUEUE_COMPUTE, x, ZERO_F16, n, acc));
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(&s, acc, 8, cudaMemcpyDeviceToHost));
        ZT_CHECKF(s == (double)n + 3.0, "sumsq: %.17g, want %.17g", s, (double)n + 3.0);
        /* the non-finite check: none; inf at the last element; NaN just past 2^31 */
        CUDA_OK(h2d(fl, &f, 4));
        Z_OK(G->ops->nonfinite(G, ZERO_QUEUE_COMPUTE, x, ZERO_F16, n, fl));
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(&f, fl, 4, cudaMemcpyDeviceToHost));
        ZT_CHECK(f == 0.0f);
        CUDA_OK(h2d(x + n - 1, &inf, 2));
        Z_OK(G->ops->nonfinite(G, ZERO_QUEUE_COMPUTE, x + 1, ZERO_F16, n - 1, fl)); /* misaligned too */
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(&f, fl, 4, cudaMemcpyDeviceToHost));
        ZT_CHECK(f == 1.0f);
        f = 0.0f;
        CUDA_OK(h2d(fl, &f, 4));
        CUDA_OK(h2d(x + n - 1, &one, 2));
        CUDA_OK(h2d(x + ((size_t)1 << 31) + 1, &nan, 2));
        Z_OK(G->ops->nonfinite(G, ZERO_QUEUE_COMPUTE, x, ZERO_F16, n, fl));
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(&f, fl, 4, cudaMemcpyDeviceToHost));
        ZT_CHECK(f == 1.0f);
    }
    /* element kernels over hashed values: windows against the host device */
    ZERO_CUDA_LAUNCH(fill_hashed_kernel, 4096, 256, 0, 0, x, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    Z_OK(G->ops->cast(G, ZERO_QUEUE_COMPUTE, mvm, ZERO_F32, x, ZERO_F16, n));      /* master */
    Z_OK(G->ops->fill_zero(G, ZERO_QUEUE_COMPUTE, mvm + n, b32 * 2));              /* m, v */
    Z_OK(G->ops->scale(G, ZERO_QUEUE_COMPUTE, x + 1, ZERO_F16, n - 1, 0.5f));      /* grads: x/2 (x[0] kept) */
    Z_OK(G->ops->add(G, ZERO_QUEUE_COMPUTE, x + 3, x + 3, ZERO_F16, n - 3));       /* in place: 2 x */
    {
        float one = 1.0f, zero = 0.0f;
        zero_adam_desc desc;
        zero_adam_coefs co;
        zero_adam_range r;
        memset(&r, 0, sizeof r);
        memset(&desc, 0, sizeof desc);
        desc.weight_decay = 0.1;
        Z_OK(zero_adam_coefs_make(&co, &desc, 0.1f, 1));
        CUDA_OK(h2d(mul, &one, 4));
        CUDA_OK(h2d(fl, &zero, 4));
        r.numel = n;
        r.master = mvm;
        r.m = mvm + n;
        r.v = mvm + 2 * n;
        r.grad = x;
        r.grad_dtype = ZERO_F16;
        r.param = p;
        r.param_dtype = ZERO_F16;
        Z_OK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &r, &co, mul, fl));
        Z_OK(gsync());
        for (w = 0; w < 3; w++) {
            uint16_t hx[64], gx[64], hp[64], gp[64];
            float hm[3][64], gm[3][64];
            size_t i, s = wins[w];
            zero_adam_range hr;
            memset(&hr, 0, sizeof hr);
            for (i = 0; i < W; i++) hx[i] = hashed16(s + i);
            for (i = 0; i < W; i++) hm[0][i] = zero_f16_to_f32(hx[i]);
            memset(hm[1], 0, sizeof hm[1]);
            memset(hm[2], 0, sizeof hm[2]);
            Z_OK(H->ops->scale(H, ZERO_QUEUE_COMPUTE, hx + (s == 0), ZERO_F16, W - (s == 0), 0.5f));
            Z_OK(H->ops->add(H, ZERO_QUEUE_COMPUTE, hx + (s == 0 ? 3 : 0), hx + (s == 0 ? 3 : 0), ZERO_F16,
                             W - (s == 0 ? 3 : 0)));
            hr = r;
            hr.numel = W;
            hr.master = hm[0];
            hr.m = hm[1];
            hr.v = hm[2];
            hr.grad = hx;
            hr.param = hp;
            Z_OK(H->ops->adam(H, ZERO_QUEUE_COMPUTE, &hr, &co, &one, &zero));
            CUDA_OK(cudaMemcpy(gx, x + s, W * 2, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(gp, p + s, W * 2, cudaMemcpyDeviceToHost));
            for (i = 0; i < 3; i++) CUDA_OK(cudaMemcpy(gm[i], mvm + i * n + s, W * 4, cudaMemcpyDeviceToHost));
            ZT_CHECKF(memcmp(gx, hx, sizeof gx) == 0, "window %zu: grads (scale, add) differ", s);
            ZT_CHECKF(memcmp(gp, hp, sizeof gp) == 0, "window %zu: params differ", s);
            ZT_CHECKF(memcmp(gm, hm, sizeof gm) == 0, "window %zu: master/m/v differ", s);
        }
    }
    cudaFree(x);
    cudaFree(p);
    cudaFree(mvm);
    cudaFree(fl);
}

/* ---- error paths that need no GPU fault ---- */

ZT_TEST(test_device_errors)
{
    zero_adam_range r;
    zero_adam_coefs co;
    float *f = (float *)dA;
    memset(&r, 0, sizeof r);
    memset(&co, 0, sizeof co);
    r.numel = 4;
    r.master = r.m = r.v = f;
    r.grad = f;
    r.grad_dtype = ZERO_F64;
    ZT_CHECK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &r, &co, f, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    r.grad_dtype = ZERO_F32;
    ZT_CHECK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &r, &co, NULL, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    r.m = NULL;
    ZT_CHECK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &r, &co, f, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->nonfinite(G, ZERO_QUEUE_COMPUTE, f, ZERO_F32, 4, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->sumsq(G, ZERO_QUEUE_COMPUTE, f, ZERO_F32, 4, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->grad_mul(G, ZERO_QUEUE_COMPUTE, NULL, f, 1.0f, 0.0f, f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->scale(G, ZERO_QUEUE_COMPUTE, f, ZERO_F32, (size_t)-1 / 2, 1.0f) == ZERO_ERROR_OVERFLOW);
    ZT_CHECK(G->ops->record(G, ZERO_QUEUE_COMPUTE, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->fill_zero(G, ZERO_QUEUE_COMPUTE, NULL, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->native_queue(G, (zero_queue)-1) == NULL);
    /* an element the GPU could not load: refused, not a fault */
    ZT_CHECK(G->ops->scale(G, ZERO_QUEUE_COMPUTE, (char *)dA + 1, ZERO_F16, 4, 1.0f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->sumsq(G, ZERO_QUEUE_COMPUTE, (char *)dA + 2, ZERO_F32, 4, (double *)dB) == ZERO_ERROR_INVALID_ARGUMENT);
    r.m = f;
    r.master = (float *)((char *)dA + 2);
    ZT_CHECK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &r, &co, f, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    /* zero-size ops are no-ops */
    ZT_CHECK(G->ops->cast(G, ZERO_QUEUE_COMPUTE, NULL, ZERO_F16, NULL, ZERO_F32, 0) == ZERO_OK);
    ZT_CHECK(G->ops->copy(G, ZERO_QUEUE_COMPUTE, NULL, NULL, 0) == ZERO_OK);
    ZT_CHECK(gsync() == ZERO_OK);
}

/* ---- the device keeps the caller's current device ---- */

ZT_TEST(test_current_device_kept)
{
    int n = zero_cuda_device_count(), cur = -1;
    zero_device *d = NULL;
    zero_cuda_desc desc;
    if (n < 2) ZT_SKIP("one GPU: nothing to switch");
    memset(&desc, 0, sizeof desc);
    desc.device = 1;
    CUDA_OK(cudaSetDevice(0));
    Z_OK(zero_cuda_device_create(&desc, &d));
    Z_OK(d->ops->fill_zero(d, ZERO_QUEUE_COMPUTE, NULL, 0));
    CUDA_OK(cudaGetDevice(&cur));
    ZT_CHECK(cur == 0);
    zero_device_destroy(d);
}

/* ---- the multiplier and skip flag come from device memory, on the step's queue ---- */


/* ---- batched calls: a step's many nonfinite/sumsq and adam calls, launched together ----
   The CUDA device holds consecutive calls of one kind on a queue and launches them as one
   kernel over a table at the next other op (here the sync); the results must be the host
   device's, call for call, in call order. */

ZT_TEST(test_batched)
{
    static const size_t lens[] = {0, 1, 9, 2049, 65536, 65537, 70001, 4096, 3};
    const int nb = (int)(sizeof lens / sizeof lens[0]);
    size_t offs[16], off = 0, i;
    double *dacc = NULL, gacc = 0.5, hacc = 0.5;
    float *dflag = NULL, gflag = 0.0f, hflag = 0.0f;
    int b, rep;
    for (b = 0; b < nb; b++) {
        offs[b] = off + (size_t)(b % 3); /* some misaligned */
        off = offs[b] + lens[b] + 5;
    }
    CUDA_OK(cudaMalloc((void **)&dacc, 16));
    dflag = (float *)(dacc + 1);
    for (rep = 0; rep < 2; rep++) { /* rep 1: an inf in one buffer */
        gen(ZERO_F16, hA, off, 0);
        if (rep == 1) ((uint16_t *)hA)[offs[5] + 77] = 0x7c00;
        gacc = hacc = 0.5;
        gflag = hflag = 0.0f;
        CUDA_OK(h2d(dA, hA, off * 2));
        CUDA_OK(h2d(dacc, &gacc, 8));
        CUDA_OK(h2d(dflag, &gflag, 4));
        for (b = 0; b < nb; b++) { /* as the engine's step: nonfinite then sumsq, group by group */
            Z_OK(G->ops->nonfinite(G, ZERO_QUEUE_COMPUTE, at(dA, ZERO_F16, offs[b]), ZERO_F16, lens[b], dflag));
            Z_OK(G->ops->sumsq(G, ZERO_QUEUE_COMPUTE, at(dA, ZERO_F16, offs[b]), ZERO_F16, lens[b], dacc));
            Z_OK(H->ops->nonfinite(H, ZERO_QUEUE_COMPUTE, at(hA, ZERO_F16, offs[b]), ZERO_F16, lens[b], &hflag));
            Z_OK(H->ops->sumsq(H, ZERO_QUEUE_COMPUTE, at(hA, ZERO_F16, offs[b]), ZERO_F16, lens[b], &hacc));
        }
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(&gacc, dacc, 8, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(&gflag, dflag, 4, cudaMemcpyDeviceToHost));
        ZT_CHECKF(memcmp(&gacc, &hacc, 8) == 0, "batched sumsq: cuda %.17g host %.17g", gacc, hacc);
        ZT_CHECKF(gflag == hflag, "batched nonfinite: cuda %g host %g", (double)gflag, (double)hflag);
    }
    /* Adam: many ranges of one buffer at odd offsets, two coefficient sets alternating */
    {
        size_t n = 200000, tot = n + PAD, start = 0, len;
        float *hm = (float *)malloc(tot * 12), *gm = (float *)malloc(tot * 12), *dm = NULL, *dmul = NULL;
        float one = 1.0f, zero = 0.0f;
        zero_adam_desc desc;
        zero_adam_coefs co[2];
        int k = 0;
        memset(&desc, 0, sizeof desc);
        desc.weight_decay = 0.1f;
        Z_OK(zero_adam_coefs_make(&co[0], &desc, 0.1f, 3));
        Z_OK(zero_adam_coefs_make(&co[1], &desc, 0.0f, 3));
        gen(ZERO_F32, hm, 2 * tot, 0);
        for (i = 0; i < tot; i++) hm[2 * tot + i] = fabsf(gen_f32(0));
        gen(ZERO_F16, hA, tot, 0); /* grads */
        gen(ZERO_BF16, hB, tot, 0); /* params */
        memcpy(hC, hB, tot * 2);
        CUDA_OK(cudaMalloc((void **)&dm, tot * 12 + 16));
        dmul = dm + 3 * tot;
        CUDA_OK(h2d(dm, hm, tot * 12));
        CUDA_OK(h2d(dA, hA, tot * 2));
        CUDA_OK(h2d(dB, hB, tot * 2));
        CUDA_OK(h2d(dmul, &one, 4));
        CUDA_OK(h2d(dmul + 1, &zero, 4));
        for (start = 0; start < n; start += len, k++) {
            zero_adam_range hr, dr;
            memset(&hr, 0, sizeof hr);
            memset(&dr, 0, sizeof dr);
            len = (size_t)(1 + (k * 7919) % 9000);
            if (len > n - start) len = n - start;
            hr.numel = dr.numel = len;
            hr.master = hm + start; dr.master = dm + start;
            hr.m = hm + tot + start; dr.m = dm + tot + start;
            hr.v = hm + 2 * tot + start; dr.v = dm + 2 * tot + start;
            hr.grad = at(hA, ZERO_F16, start); dr.grad = at(dA, ZERO_F16, start);
            hr.param = at(hB, ZERO_BF16, start + 1); dr.param = at(dB, ZERO_BF16, start + 1); /* misaligned */
            hr.grad_dtype = dr.grad_dtype = ZERO_F16;
            hr.param_dtype = dr.param_dtype = ZERO_BF16;
            Z_OK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &dr, &co[k & 1], dmul, dmul + 1));
            Z_OK(H->ops->adam(H, ZERO_QUEUE_COMPUTE, &hr, &co[k & 1], &one, &zero));
        }
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(gm, dm, tot * 12, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(hC, dB, tot * 2, cudaMemcpyDeviceToHost));
        ZT_CHECKF(first_diff(ZERO_F32, gm, hm, 3 * tot, 1) == 3 * tot, "batched adam (%d ranges): master/m/v differ", k);
        ZT_CHECKF(first_diff(ZERO_BF16, hC, hB, tot, 1) == tot, "batched adam (%d ranges): params differ", k);
        cudaFree(dm);
        free(hm);
        free(gm);
    }
    cudaFree(dacc);
}

ZT_TEST(test_step_chain)
{
    /* nonfinite -> grad_mul -> adam without a host round-trip: a NaN gradient makes the
       multiplier 0 and... the skip flag (the all-reduced nonfinite flag) stops the update */
    const size_t n = 4096;
    float *m, *flag, *out;
    uint16_t *g;
    double *ss;
    float host_m[4 * 4096];
    zero_adam_desc desc;
    zero_adam_coefs co;
    zero_adam_range r;
    uint16_t nan16 = 0x7e00;
    int pass;
    memset(&r, 0, sizeof r);
    CUDA_OK(cudaMalloc((void **)&m, n * 12));
    CUDA_OK(cudaMalloc((void **)&g, n * 2));
    CUDA_OK(cudaMalloc((void **)&flag, 32));
    out = flag + 1;            /* out[0] multiplier, out[1] norm */
    ss = (double *)(flag + 4); /* bytes 16..23 */
    memset(&desc, 0, sizeof desc);
    Z_OK(zero_adam_coefs_make(&co, &desc, 0.0f, 1));
    r.numel = n;
    r.master = m;
    r.m = m + n;
    r.v = m + 2 * n;
    r.grad = g;
    r.grad_dtype = ZERO_F16;
    r.param = NULL;
    r.param_dtype = ZERO_DTYPE_DEFAULT;
    for (pass = 0; pass < 2; pass++) {
        gen(ZERO_F16, hA, n, 0);
        CUDA_OK(h2d(g, hA, n * 2));
        if (pass == 1) CUDA_OK(h2d(g + 17, &nan16, 2));
        Z_OK(G->ops->fill_zero(G, ZERO_QUEUE_COMPUTE, m, n * 12));
        Z_OK(G->ops->fill_zero(G, ZERO_QUEUE_COMPUTE, flag, 32));
        Z_OK(G->ops->nonfinite(G, ZERO_QUEUE_COMPUTE, g, ZERO_F16, n, flag));
        Z_OK(G->ops->sumsq(G, ZERO_QUEUE_COMPUTE, g, ZERO_F16, n, ss));
        Z_OK(G->ops->grad_mul(G, ZERO_QUEUE_COMPUTE, ss, flag, 1.0f / 1024.0f, 1.0f, out));
        Z_OK(G->ops->adam(G, ZERO_QUEUE_COMPUTE, &r, &co, out, flag));
        Z_OK(gsync());
        CUDA_OK(cudaMemcpy(host_m, m, n * 12, cudaMemcpyDeviceToHost));
        {
            size_t i, changed = 0;
            for (i = 0; i < 3 * n; i++) changed += host_m[i] != 0.0f;
            if (pass == 0) ZT_CHECKF(changed > n, "a clean step changed only %zu values", changed);
            else ZT_CHECKF(changed == 0, "a skipped step changed %zu values", changed);
        }
    }
    cudaFree(m);
    cudaFree(g);
    cudaFree(flag);
}

int main(void)
{
    {
        int rc = zt_gpu_probe(NTESTS); /* skip only without a GPU */
        if (rc >= 0) return rc;
    }
    if (zero_host_device_create(NULL, &H) != ZERO_OK || zero_cuda_device_create(NULL, &G) != ZERO_OK || !setup()) {
        printf("FAIL setup: %s\n", zero_last_error());
        printf("zt: 0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    zt_seed(12345);
    ZT_RUN(test_cast);
    ZT_RUN(test_add_scale);
    ZT_RUN(test_nonfinite);
    ZT_RUN(test_sumsq);
    ZT_RUN(test_grad_mul);
    ZT_RUN(test_adam);
    ZT_RUN(test_adam_bf16_states);
    ZT_RUN(test_arena);
    ZT_RUN(test_streams_events);
    ZT_RUN(test_device_errors);
    ZT_RUN(test_batched);
    ZT_RUN(test_step_chain);
    ZT_RUN(test_current_device_kept);
    ZT_RUN(test_past_2_31);
    {
        /* a fault anywhere above would surface here */
        cudaError_t e = cudaDeviceSynchronize();
        zt_cur_name = "final_device_sync";
        zt_cur_failures = 0;
        ZT_CHECKF(e == cudaSuccess, "%s", cudaGetErrorString(e));
        if (zt_cur_failures) zt_failed++;
        else zt_passed++;
    }
    zero_device_destroy(G);
    zero_device_destroy(H);
    cudaFree(dA);
    cudaFree(dB);
    free(hA);
    free(hB);
    free(hC);
    free(hD);
    return zt_summary();
}
