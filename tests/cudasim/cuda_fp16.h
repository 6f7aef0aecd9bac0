/* cuda_fp16.h - cudasim's __half: the storage type and the exactly rounded conversions. */
#ifndef CUDASIM_CUDA_FP16_H
#define CUDASIM_CUDA_FP16_H
#include <cuda_runtime.h>

static inline float __half2float(struct __half h);
static inline struct __half __float2half_rn(float f);

/* As CUDA's: default-constructible, from float (round to nearest even) and back. */
struct __half {
    unsigned short x;
    __half() = default;
    __half(float f);
    operator float() const;
};

static inline float __half2float(__half h)
{
    unsigned s = (unsigned)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu, u;
    if (e == 31) u = s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else { /* subnormal: m * 2^-24, exact in fp32 */
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= s;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, overflow to inf, NaN stays NaN (quiet). */
static inline __half __float2half_rn(float f)
{
    unsigned u, s, a;
    memcpy(&u, &f, 4);
    s = (u >> 16) & 0x8000u;
    a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) { h.x = (unsigned short)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); return h; }
    if (a >= 0x477ff000u) { h.x = (unsigned short)(s | 0x7c00u); return h; } /* >= 65520: inf */
    if (a >= 0x38800000u) { /* normal half */
        unsigned r = a - 0x38000000u; /* rebias 127 -> 15 */
        unsigned v = r >> 13, rem = r & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (v & 1u))) v++;
        h.x = (unsigned short)(s | v);
        return h;
    }
    if (a < 0x33000000u) { h.x = (unsigned short)s; return h; } /* < 2^-25: +-0 */
    { /* subnormal half: value / 2^-24 rounded to an integer, ties to even */
        unsigned e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; /* m * 2^(e-150) / 2^-24 */
        unsigned v = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (v & 1u))) v++;
        h.x = (unsigned short)(s | v);
        return h;
    }
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
inline __half::__half(float f) : x(__float2half_rn(f).x) {}
inline __half::operator float() const { return __half2float(*this); }
#endif
