/* Conversion implementation (section of zero.h): SIMD detection, scalar fp32 <-> fp16 /
   bf16 / fp64 in integer arithmetic, and the bulk zero_convert() with its AVX2 / AVX-512
   paths. The x86 helpers below (zero__*x8_*_avx2, zero__*x16_*_avx512) are shared with the
   other host kernels (adam_impl.h), so that every kernel rounds exactly as the scalar
   functions do. */

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(ZERO_NO_SIMD)
#define ZERO__X86_SIMD 1
#ifdef __cplusplus
extern "C++" {
#endif
#include <cpuid.h>
#include <immintrin.h>
#ifdef __cplusplus
}
#endif
#endif

/* ---- bits <-> values (memcpy: no aliasing UB; compilers turn it into a move) ---- */

static inline uint32_t zero__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float zero__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- scalar conversions on bit patterns ---- */

/* fp32 -> fp16, round to nearest even. */
static inline uint16_t zero__f32_to_f16_bits(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top 9 payload bits kept (vcvtps2ph) */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 = halfway from 65504 to 2^16 (tie to even: inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* >= 2^-14: a normal fp16; rebias 127 -> 15, round 13 bits */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13)); /* a carry moves into the exponent correctly */
    }
    if (a <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: ties to even give 0 */
        return (uint16_t)sign;
    {
        /* subnormal fp16: the value in units of 2^-24 is m * 2^(e - 126) */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++; /* q = 0x400 is the least normal */
        return (uint16_t)(sign | q);
    }
}

/* fp16 -> fp32, exact; a NaN becomes quiet. */
static inline uint32_t zero__f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u);
    if (e == 0) {
        if (m == 0) return sign;
        e = 113; /* normalise the subnormal: value m * 2^-24 */
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        return sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

/* fp32 -> bf16, round to nearest even (a carry into the exponent is the right answer,
   including the overflow to inf). */
static inline uint16_t zero__f32_to_bf16_bits(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact; a NaN becomes quiet. */
static inline uint32_t zero__bf16_to_f32_bits(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
    return x;
}

/* fp32 -> fp64 bits, exact; a NaN becomes quiet. */
static inline uint64_t zero__f32_to_f64_bits(uint32_t x)
{
    uint64_t sign = (uint64_t)(x >> 31) << 63;
    uint32_t e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff)
        return sign | 0x7ff0000000000000ull | (m ? 0x8000000000000ull | ((uint64_t)m << 29) : 0u);
    if (e == 0) {
        if (m == 0) return sign;
        e = 1;
        while (!(m & 0x800000u)) {
            m <<= 1;
            e--; /* may wrap below zero: the unsigned sum below still gives the exponent */
        }
        m &= 0x7fffffu;
    }
    return sign | ((uint64_t)(e + 896u) << 52) | ((uint64_t)m << 29);
}

/* fp64 -> a binary format with ebits exponent and mbits mantissa bits (fp32: 8/23,
   fp16: 5/10, bf16: 8/7), rounded once to nearest even. NaN: quiet, top payload kept. */
static inline uint32_t zero__f64_narrow_bits(uint64_t x, unsigned ebits, unsigned mbits)
{
    uint32_t sign = (uint32_t)(x >> 63) << (ebits + mbits);
    uint64_t a = x & 0x7fffffffffffffffull, m;
    uint32_t emax = (1u << ebits) - 1u, inf = sign | (emax << mbits);
    int te;
    unsigned shift;
    if (a > 0x7ff0000000000000ull)
        return inf | (1u << (mbits - 1)) | (uint32_t)((a & 0xfffffffffffffull) >> (52 - mbits));
    if (a == 0x7ff0000000000000ull) return inf;
    if ((a >> 52) == 0) return sign; /* fp64 subnormals are far below half of any target's */
    m = (a & 0xfffffffffffffull) | 0x10000000000000ull; /* value m * 2^(e - 1075) */
    te = (int)(a >> 52) - 1023 + (int)(emax >> 1);      /* the target's biased exponent */
    if (te >= (int)emax) return inf;
    shift = 52u - mbits;
    if (te < 1) {
        shift += (unsigned)(1 - te); /* to units of the target's least subnormal */
        if (shift > 53u) return sign; /* m < 2^53 <= half a unit: rounds to 0 */
        te = 1;
    }
    {
        uint64_t q = m >> shift, rem = m & ((1ull << shift) - 1u), half = 1ull << (shift - 1);
        uint64_t r;
        if (rem > half || (rem == half && (q & 1u))) q++;
        /* normal: q holds the implicit bit, so (te - 1) << mbits + q is the encoding and a
           carry moves into the exponent; subnormal: q itself (te = 1 -> 0 << mbits). */
        if (shift > 52u - mbits) r = q;
        else r = ((uint64_t)(te - 1) << mbits) + q;
        if (r >= ((uint64_t)emax << mbits)) return inf;
        return sign | (uint32_t)r;
    }
}

ZERODEF uint16_t zero_f32_to_f16(float value) { return zero__f32_to_f16_bits(zero__f32_bits(value)); }
ZERODEF float zero_f16_to_f32(uint16_t bits) { return zero__f32_from_bits(zero__f16_to_f32_bits(bits)); }
ZERODEF uint16_t zero_f32_to_bf16(float value) { return zero__f32_to_bf16_bits(zero__f32_bits(value)); }
ZERODEF float zero_bf16_to_f32(uint16_t bits) { return zero__f32_from_bits(zero__bf16_to_f32_bits(bits)); }

/* ---- SIMD detection ---- */

ZERODEF const char *zero_simd_name(zero_simd simd)
{
    switch (simd) {
    case ZERO_SIMD_AUTO: return "auto";
    case ZERO_SIMD_PORTABLE: return "portable";
    case ZERO_SIMD_AVX2: return "avx2";
    case ZERO_SIMD_AVX512: return "avx512";
    }
    return "?";
}

/* The best path the CPU and the build support, ignoring ZERO_SIMD. CPUID once; the cache
   is an int written with the same value by any racing thread (atomic builtins, no UB). */
static zero_simd zero__simd_cpu(void)
{
#ifdef ZERO__X86_SIMD
    static int cached; /* 0 = not yet known */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v == 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        int f16c;
        __builtin_cpu_init();
        /* F16C: CPUID.1:ECX bit 29 (clang's __builtin_cpu_supports lacks "f16c"); it needs
           the OS's AVX state, which the avx2 check below already requires. */
        f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        v = ZERO_SIMD_PORTABLE;
        if (f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            v = ZERO_SIMD_AVX2;
            if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
                v = ZERO_SIMD_AVX512;
        }
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return (zero_simd)v;
#else
    return ZERO_SIMD_PORTABLE;
#endif
}

ZERODEF zero_simd zero_simd_detect(void)
{
    zero_simd cpu = zero__simd_cpu(), want = cpu;
    const char *env = getenv("ZERO_SIMD"); /* read each call: a test may change it */
    if (env) {
        if (strcmp(env, "portable") == 0) want = ZERO_SIMD_PORTABLE;
        else if (strcmp(env, "avx2") == 0) want = ZERO_SIMD_AVX2;
        else if (strcmp(env, "avx512") == 0) want = ZERO_SIMD_AVX512;
    }
    return want < cpu ? want : cpu;
}

/* ---- x86 vector helpers: bit-identical to the scalar functions, unaligned-safe ---- */

#ifdef ZERO__X86_SIMD

#define ZERO__AVX2 __attribute__((target("avx2,fma,f16c")))
#define ZERO__AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))

/* The void-pointer forms let bulk loops pass byte-misaligned addresses without forming a
   misaligned uint16_t pointer. */
ZERO__AVX2 static inline __m256 zero__ld_f16x8_avx2(const void *src)
{
    /* vcvtph2ps is exact and quiets NaNs (sign | 0x7fc00000 | m << 13), as the scalar. */
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
}

ZERO__AVX2 static inline __m256 zero__ld_bf16x8_avx2(const void *src)
{
    __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src)), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    x = _mm256_or_si256(x, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000)));
    return _mm256_castsi256_ps(x);
}

ZERO__AVX2 static inline void zero__st_f16x8_avx2(void *dst, __m256 x)
{
    /* imm 0 = round to nearest even, not MXCSR; NaN: sign | 0x7e00 | m >> 13. */
    _mm_storeu_si128((__m128i *)dst, _mm256_cvtps_ph(x, 0));
}

ZERO__AVX2 static inline void zero__st_bf16x8_avx2(void *dst, __m256 x)
{
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(b, _mm256_set1_epi32(0x400000)), nan);
    r = _mm256_srli_epi32(r, 16); /* 0..0xffff: packus keeps every value */
    _mm_storeu_si128((__m128i *)dst,
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

/* The AVX-512 helpers use the zero-masking forms with a full mask (the same instructions):
   GCC 12's unmasked forms start from _mm512_undefined_*(), which g++ -O1 -Wall reports as
   maybe-uninitialized once inlined (GCC bug 105593). */
#define ZERO__ALL16 ((__mmask16)0xffff)

ZERO__AVX512 static inline __m512 zero__ld_f16x16_avx512(const void *src)
{
    return _mm512_maskz_cvtph_ps(ZERO__ALL16, _mm256_loadu_si256((const __m256i *)src));
}

ZERO__AVX512 static inline __m512 zero__ld_bf16x16_avx512(const void *src)
{
    __m512i x = _mm512_maskz_slli_epi32(
        ZERO__ALL16, _mm512_maskz_cvtepu16_epi32(ZERO__ALL16, _mm256_loadu_si256((const __m256i *)src)), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    x = _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(x);
}

ZERO__AVX512 static inline void zero__st_f16x16_avx512(void *dst, __m512 x)
{
    _mm256_storeu_si256((__m256i *)dst, _mm512_maskz_cvtps_ph(ZERO__ALL16, x, 0));
}

ZERO__AVX512 static inline void zero__st_bf16x16_avx512(void *dst, __m512 x)
{
    __m512i b = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(ZERO__ALL16, b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x400000));
    _mm256_storeu_si256((__m256i *)dst,
                        _mm512_maskz_cvtepi32_epi16(ZERO__ALL16, _mm512_maskz_srli_epi32(ZERO__ALL16, r, 16)));
}

/* The helpers other kernels use (fixed names and signatures). */
ZERO__AVX2 static inline __m256 zero__f16x8_to_f32_avx2(const uint16_t *src) { return zero__ld_f16x8_avx2(src); }
ZERO__AVX2 static inline __m256 zero__bf16x8_to_f32_avx2(const uint16_t *src) { return zero__ld_bf16x8_avx2(src); }
ZERO__AVX2 static inline void zero__f32_to_f16x8_avx2(uint16_t *dst, __m256 x) { zero__st_f16x8_avx2(dst, x); }
ZERO__AVX2 static inline void zero__f32_to_bf16x8_avx2(uint16_t *dst, __m256 x) { zero__st_bf16x8_avx2(dst, x); }
ZERO__AVX512 static inline __m512 zero__f16x16_to_f32_avx512(const uint16_t *src) { return zero__ld_f16x16_avx512(src); }
ZERO__AVX512 static inline __m512 zero__bf16x16_to_f32_avx512(const uint16_t *src) { return zero__ld_bf16x16_avx512(src); }
ZERO__AVX512 static inline void zero__f32_to_f16x16_avx512(uint16_t *dst, __m512 x) { zero__st_f16x16_avx512(dst, x); }
ZERO__AVX512 static inline void zero__f32_to_bf16x16_avx512(uint16_t *dst, __m512 x) { zero__st_bf16x16_avx512(dst, x); }

#endif /* ZERO__X86_SIMD */

/* ---- bulk kernels ---- */

/* An element of a 16-bit format as fp32 bits, and back (h: 0 = fp16, 1 = bf16). */
static inline uint32_t zero__h_to_f32_bits(uint16_t v, int bf)
{
    return bf ? zero__bf16_to_f32_bits(v) : zero__f16_to_f32_bits(v);
}
static inline uint16_t zero__f32_bits_to_h(uint32_t x, int bf)
{
    return bf ? zero__f32_to_bf16_bits(x) : zero__f32_to_f16_bits(x);
}

/* Reads element i of a byte array (any alignment) and writes element i. */
static inline uint16_t zero__ld16(const unsigned char *p, size_t i)
{
    uint16_t v;
    memcpy(&v, p + 2 * i, 2);
    return v;
}
static inline uint32_t zero__ld32(const unsigned char *p, size_t i)
{
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}
static inline void zero__st16(unsigned char *p, size_t i, uint16_t v) { memcpy(p + 2 * i, &v, 2); }
static inline void zero__st32(unsigned char *p, size_t i, uint32_t v) { memcpy(p + 4 * i, &v, 4); }

/* Elements [i, n) of the fp32 / fp16 / bf16 pairs, one by one (the portable path and every
   vector path's tail). kind: which pair, see zero__cvt_kind(). */
enum {
    ZERO__CVT_F32_F16, /* dst_src */
    ZERO__CVT_F32_BF16,
    ZERO__CVT_F16_F32,
    ZERO__CVT_BF16_F32,
    ZERO__CVT_F16_BF16,
    ZERO__CVT_BF16_F16
};

static void zero__cvt_scalar(int kind, unsigned char *d, const unsigned char *s, size_t i, size_t n)
{
    switch (kind) {
    case ZERO__CVT_F32_F16:
        for (; i < n; i++) zero__st32(d, i, zero__f16_to_f32_bits(zero__ld16(s, i)));
        break;
    case ZERO__CVT_F32_BF16:
        for (; i < n; i++) zero__st32(d, i, zero__bf16_to_f32_bits(zero__ld16(s, i)));
        break;
    case ZERO__CVT_F16_F32:
        for (; i < n; i++) zero__st16(d, i, zero__f32_to_f16_bits(zero__ld32(s, i)));
        break;
    case ZERO__CVT_BF16_F32:
        for (; i < n; i++) zero__st16(d, i, zero__f32_to_bf16_bits(zero__ld32(s, i)));
        break;
    case ZERO__CVT_F16_BF16:
        for (; i < n; i++) zero__st16(d, i, zero__f32_bits_to_h(zero__h_to_f32_bits(zero__ld16(s, i), 1), 0));
        break;
    case ZERO__CVT_BF16_F16:
        for (; i < n; i++) zero__st16(d, i, zero__f32_bits_to_h(zero__h_to_f32_bits(zero__ld16(s, i), 0), 1));
        break;
    }
}

#ifdef ZERO__X86_SIMD
/* One kernel per path; each body does two vectors per iteration (loads ahead of stores),
   then one, then the scalar tail. */
#define ZERO__CVT_BODY(W, LD_F32, ST_F32, LD_F16, ST_F16, LD_BF16, ST_BF16)                  \
    switch (kind) {                                                                          \
    case ZERO__CVT_F32_F16:                                                                  \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_F16(s + 2 * i), b = LD_F16(s + 2 * (i + W));                      \
            ST_F32(d + 4 * i, a);                                                            \
            ST_F32(d + 4 * (i + W), b);                                                      \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_F32(d + 4 * i, LD_F16(s + 2 * i));                     \
        break;                                                                               \
    case ZERO__CVT_F32_BF16:                                                                 \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_BF16(s + 2 * i), b = LD_BF16(s + 2 * (i + W));                    \
            ST_F32(d + 4 * i, a);                                                            \
            ST_F32(d + 4 * (i + W), b);                                                      \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_F32(d + 4 * i, LD_BF16(s + 2 * i));                    \
        break;                                                                               \
    case ZERO__CVT_F16_F32:                                                                  \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_F32(s + 4 * i), b = LD_F32(s + 4 * (i + W));                      \
            ST_F16(d + 2 * i, a);                                                            \
            ST_F16(d + 2 * (i + W), b);                                                      \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_F16(d + 2 * i, LD_F32(s + 4 * i));                     \
        break;                                                                               \
    case ZERO__CVT_BF16_F32:                                                                 \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_F32(s + 4 * i), b = LD_F32(s + 4 * (i + W));                      \
            ST_BF16(d + 2 * i, a);                                                           \
            ST_BF16(d + 2 * (i + W), b);                                                     \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_BF16(d + 2 * i, LD_F32(s + 4 * i));                    \
        break;                                                                               \
    case ZERO__CVT_F16_BF16:                                                                 \
        for (; i + W <= n; i += W) ST_F16(d + 2 * i, LD_BF16(s + 2 * i));                    \
        break;                                                                               \
    case ZERO__CVT_BF16_F16:                                                                 \
        for (; i + W <= n; i += W) ST_BF16(d + 2 * i, LD_F16(s + 2 * i));                    \
        break;                                                                               \
    }

#define ZERO__LD_F32_AVX2(p) _mm256_loadu_ps((const float *)(const void *)(p))
#define ZERO__ST_F32_AVX2(p, v) _mm256_storeu_ps((float *)(void *)(p), v)
#define ZERO__V __m256
ZERO__AVX2 static void zero__cvt_avx2(int kind, unsigned char *d, const unsigned char *s, size_t n)
{
    size_t i = 0;
    ZERO__CVT_BODY(8, ZERO__LD_F32_AVX2, ZERO__ST_F32_AVX2, zero__ld_f16x8_avx2, zero__st_f16x8_avx2,
                   zero__ld_bf16x8_avx2, zero__st_bf16x8_avx2)
    zero__cvt_scalar(kind, d, s, i, n);
}
#undef ZERO__V

#define ZERO__V __m512
ZERO__AVX512 static void zero__cvt_avx512(int kind, unsigned char *d, const unsigned char *s, size_t n)
{
    size_t i = 0;
    ZERO__CVT_BODY(16, _mm512_loadu_ps, _mm512_storeu_ps, zero__ld_f16x16_avx512, zero__st_f16x16_avx512,
                   zero__ld_bf16x16_avx512, zero__st_bf16x16_avx512)
    /* a remaining 8 with the AVX2 body, the rest one by one */
    zero__cvt_avx2(kind, d + (i * (kind <= ZERO__CVT_F32_BF16 ? 4 : 2)),
                   s + (i * (kind == ZERO__CVT_F16_F32 || kind == ZERO__CVT_BF16_F32 ? 4 : 2)), n - i);
}
#undef ZERO__V
#undef ZERO__CVT_BODY
#undef ZERO__LD_F32_AVX2
#undef ZERO__ST_F32_AVX2
#endif

/* fp64 <-> anything, one element at a time through fp64 / fp32 bits. */
static void zero__cvt_f64_pair(unsigned char *d, zero_dtype dt, const unsigned char *s,
                               zero_dtype st, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        if (st == ZERO_F64) {
            uint64_t x;
            memcpy(&x, s + 8 * i, 8);
            if (dt == ZERO_F32) zero__st32(d, i, zero__f64_narrow_bits(x, 8, 23));
            else if (dt == ZERO_F16) zero__st16(d, i, (uint16_t)zero__f64_narrow_bits(x, 5, 10));
            else zero__st16(d, i, (uint16_t)zero__f64_narrow_bits(x, 8, 7));
        } else {
            uint32_t f = st == ZERO_F32 ? zero__ld32(s, i) : zero__h_to_f32_bits(zero__ld16(s, i), st == ZERO_BF16);
            uint64_t x = zero__f32_to_f64_bits(f);
            memcpy(d + 8 * i, &x, 8);
        }
    }
}

ZERODEF zero_result zero_convert(void *dst, zero_dtype dst_dtype, const void *src,
                                 zero_dtype src_dtype, size_t numel, zero_simd simd)
{
    size_t dsize = zero_dtype_size(dst_dtype), ssize = zero_dtype_size(src_dtype), bytes;
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    zero_simd path;
    int kind;
    if (dsize == 0 || ssize == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_convert: unknown dtype (dst %d, src %d)",
                          (int)dst_dtype, (int)src_dtype);
    if ((int)simd < ZERO_SIMD_AUTO || (int)simd > ZERO_SIMD_AVX512)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_convert: simd = %d", (int)simd);
    if (numel > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_convert: %s is NULL with numel = %zu",
                          dst ? "src" : "dst", numel);
    if (zero__mul_size(numel, dsize > ssize ? dsize : ssize, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_convert: numel = %zu elements overflow", numel);
    if (simd != ZERO_SIMD_AUTO && simd > zero__simd_cpu())
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_convert: simd %s unavailable (best: %s)",
                          zero_simd_name(simd), zero_simd_name(zero__simd_cpu()));
    if (numel == 0) return ZERO_OK;
    if (dst_dtype == src_dtype) {
        memmove(dst, src, numel * dsize);
        return ZERO_OK;
    }
    if (dst_dtype == ZERO_F64 || src_dtype == ZERO_F64) {
        zero__cvt_f64_pair(d, dst_dtype, s, src_dtype, numel);
        return ZERO_OK;
    }
    if (dst_dtype == ZERO_F32) kind = src_dtype == ZERO_F16 ? ZERO__CVT_F32_F16 : ZERO__CVT_F32_BF16;
    else if (src_dtype == ZERO_F32) kind = dst_dtype == ZERO_F16 ? ZERO__CVT_F16_F32 : ZERO__CVT_BF16_F32;
    else kind = dst_dtype == ZERO_F16 ? ZERO__CVT_F16_BF16 : ZERO__CVT_BF16_F16;
    path = simd == ZERO_SIMD_AUTO ? zero_simd_detect() : simd;
#ifdef ZERO__X86_SIMD
    if (path == ZERO_SIMD_AVX512) {
        zero__cvt_avx512(kind, d, s, numel);
        return ZERO_OK;
    }
    if (path == ZERO_SIMD_AVX2) {
        zero__cvt_avx2(kind, d, s, numel);
        return ZERO_OK;
    }
#else
    (void)path;
#endif
    zero__cvt_scalar(kind, d, s, 0, numel);
    return ZERO_OK;
}
