/* zero_cuda.h's conversion functions (the __host__ __device__ integer code every CUDA cast,
   load and store uses) against the host's zero_convert(), on the CPU: needs no GPU, so it
   runs everywhere nvcc does. Every fp16 and bf16 pattern in both directions and between
   them; fp32 -> fp16/bf16/fp64 over a strided sweep of all 2^32 patterns plus every
   exponent edge (ZT_FULL=1: all 2^32); fp64 -> fp32/fp16/bf16 over random and edge
   patterns. Also the vector/scalar split (zero_cuda__head). */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "tests/zt.h"

static int full_sweep(void)
{
    const char *f = getenv("ZT_FULL");
    return f && *f && strcmp(f, "0") != 0;
}

static uint32_t host_conv32(uint32_t x, zero_dtype dst, zero_dtype src)
{
    uint32_t out = 0;
    zero_result r = zero_convert(&out, dst, &x, src, 1, ZERO_SIMD_PORTABLE);
    (void)r;
    return out;
}

ZT_TEST(test_f16_bf16_all_patterns)
{
    uint32_t h;
    int bad = 0;
    for (h = 0; h < 65536; h++) {
        uint16_t b = (uint16_t)h, out16 = 0;
        uint32_t f;
        f = zero_cuda__f16_to_f32(b);
        ZT_CHECKF(f == host_conv32(b, ZERO_F32, ZERO_F16) || ++bad > 5, "f16 %04x -> %08x", h, f);
        f = zero_cuda__bf16_to_f32(b);
        ZT_CHECKF(f == host_conv32(b, ZERO_F32, ZERO_BF16) || ++bad > 5, "bf16 %04x -> %08x", h, f);
        /* fp16 <-> bf16 as the CUDA cast does it: widen exactly, narrow once */
        zero_convert(&out16, ZERO_BF16, &b, ZERO_F16, 1, ZERO_SIMD_AUTO);
        ZT_CHECKF(zero_cuda__f32_to_bf16(zero_cuda__f16_to_f32(b)) == out16, "f16 %04x -> bf16", h);
        zero_convert(&out16, ZERO_F16, &b, ZERO_BF16, 1, ZERO_SIMD_AUTO);
        ZT_CHECKF(zero_cuda__f32_to_f16(zero_cuda__bf16_to_f32(b)) == out16, "bf16 %04x -> f16", h);
        /* widening to fp64 */
        {
            double dd = 0;
            zero_convert(&dd, ZERO_F64, &b, ZERO_F16, 1, ZERO_SIMD_AUTO);
            ZT_CHECKF(zero_cuda__f32_to_f64(zero_cuda__f16_to_f32(b)) == zero_cuda__f64_bits(dd), "f16 %04x -> f64", h);
        }
    }
}

static void check_f32(uint32_t x, int *bad)
{
    uint16_t h = 0, bf = 0;
    double dd = 0;
    zero_convert(&h, ZERO_F16, &x, ZERO_F32, 1, ZERO_SIMD_PORTABLE);
    zero_convert(&bf, ZERO_BF16, &x, ZERO_F32, 1, ZERO_SIMD_PORTABLE);
    zero_convert(&dd, ZERO_F64, &x, ZERO_F32, 1, ZERO_SIMD_PORTABLE);
    if (zero_cuda__f32_to_f16(x) != h && ++*bad <= 5) ZT_CHECKF(0, "f32 %08x -> f16 %04x, host %04x", x, zero_cuda__f32_to_f16(x), h);
    if (zero_cuda__f32_to_bf16(x) != bf && ++*bad <= 5) ZT_CHECKF(0, "f32 %08x -> bf16 %04x, host %04x", x, zero_cuda__f32_to_bf16(x), bf);
    if (zero_cuda__f32_to_f64(x) != zero_cuda__f64_bits(dd) && ++*bad <= 5) ZT_CHECKF(0, "f32 %08x -> f64", x);
}

ZT_TEST(test_f32_sweep)
{
    uint64_t x, step = full_sweep() ? 1 : (zt_quick() ? 65521 : 4099);
    int bad = 0, e, s, k;
    for (x = 0; x < 0x100000000ull; x += step) check_f32((uint32_t)x, &bad);
    /* every exponent, both signs, mantissas at the rounding edges of fp16 and bf16 */
    for (s = 0; s < 2; s++)
        for (e = 0; e < 256; e++)
            for (k = 0; k < 64; k++) {
                uint32_t base = ((uint32_t)s << 31) | ((uint32_t)e << 23);
                static const uint32_t m[] = {0, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x7fff, 0x8000, 0x8001,
                                             0xffff, 0x10000, 0x18000, 0x3fffff, 0x400000, 0x7fffff};
                uint32_t mm = m[k % 16] ^ (k >= 16 ? (uint32_t)(zt_rand64() & 0x7fe000) : 0u);
                check_f32(base | (mm & 0x7fffffu), &bad);
            }
    ZT_CHECKF(bad == 0, "%d mismatches", bad);
}

ZT_TEST(test_f64_narrow)
{
    int i, bad = 0;
    for (i = 0; i < 2000000; i++) {
        uint64_t x = zt_rand64();
        float f = 0;
        uint16_t h = 0, bf = 0;
        double dd;
        if (i % 4 == 1) x = (x & 0x800fffffffffffffull) | ((uint64_t)(1023 - 30 + (int)(zt_rand64() % 60)) << 52);
        if (i % 4 == 2) x = (x & 0x800fffffffffffffull) | ((uint64_t)(1023 - 150 + (int)(zt_rand64() % 300)) << 52);
        if (i % 4 == 3) x &= 0xffffffffe0000000ull | (zt_rand64() & 1 ? 0x10000000ull : 0); /* near ties */
        memcpy(&dd, &x, 8);
        zero_convert(&f, ZERO_F32, &dd, ZERO_F64, 1, ZERO_SIMD_PORTABLE);
        zero_convert(&h, ZERO_F16, &dd, ZERO_F64, 1, ZERO_SIMD_PORTABLE);
        zero_convert(&bf, ZERO_BF16, &dd, ZERO_F64, 1, ZERO_SIMD_PORTABLE);
        if (zero_cuda__f64_narrow(x, 8, 23) != zero_cuda__f32_bits(f) && ++bad <= 5) ZT_CHECKF(0, "f64 %016llx -> f32", (unsigned long long)x);
        if (zero_cuda__f64_narrow(x, 5, 10) != h && ++bad <= 5) ZT_CHECKF(0, "f64 %016llx -> f16", (unsigned long long)x);
        if (zero_cuda__f64_narrow(x, 8, 7) != bf && ++bad <= 5) ZT_CHECKF(0, "f64 %016llx -> bf16", (unsigned long long)x);
    }
    ZT_CHECKF(bad == 0, "%d mismatches", bad);
}

ZT_TEST(test_vector_head)
{
    /* the first index where every pointer is 16-byte aligned, or -1 */
    char *base = (char *)(uintptr_t)0x10000;
    const void *p[3];
    size_t es[3] = {4, 4, 2};
    p[0] = base;
    p[1] = base + 64;
    p[2] = base + 32;
    ZT_CHECK(zero_cuda__head(p, es, 3) == 0);
    p[0] = base + 4; /* fp32 at element 1: aligned at elements 3, 7 */
    p[1] = base + 4;
    p[2] = base + 2; /* fp16 at element 1: aligned at element 7 */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 7);
    p[0] = base + 12;
    p[1] = base + 12;
    p[2] = base + 2; /* fp32: heads 1, 5; fp16: head 7: none common */
    ZT_CHECK(zero_cuda__head(p, es, 3) == -1);
    p[2] = base + 14; /* fp16: 14 + 2h = 16 -> h = 1; fp32: 12 + 4 = 16 -> h = 1 */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 1);
    p[1] = NULL; /* NULL pointers (no param) do not count */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 1);
    p[0] = base + 1; /* not even element-aligned */
    ZT_CHECK(zero_cuda__head(p, es, 1) == -1);
}

int main(void)
{
    ZT_RUN(test_f16_bf16_all_patterns);
    ZT_RUN(test_f32_sweep);
    ZT_RUN(test_f64_narrow);
    ZT_RUN(test_vector_head);
    return zt_summary();
}
