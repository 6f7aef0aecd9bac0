/* cudasim: the 16-bit formats' conversions as bit operations, for the cuBLAS and NCCL
   simulations (tests/cudasim/cublas_v2.h, nccl.h), which read and write fp16/bf16 operands as
   raw bits. Round to nearest even, as the GPU's __float2half_rn / __float2bfloat16_rn;
   NaN stays NaN (quiet). C++ only (the harness compiles .cu files as C++). */
#ifndef CUDASIM_SIM_NUMERIC_H
#define CUDASIM_SIM_NUMERIC_H
#include <cstdint>
#include <cstring>

namespace cudasim_num {

inline float bits_f32(uint32_t u)
{
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t f32_bits(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) { /* below 2^-14: subnormal half, value = m * 2^-24 */
        /* a * 2^24 rounded to an integer, to nearest even: exact fp32 arithmetic */
        float v = bits_f32(a) * 16777216.0f;
        float r = v + 8388608.0f; /* 2^23: rounds v to an integer (RNE) */
        r -= 8388608.0f;
        return (uint16_t)(sign | (uint32_t)r);
    }
    {
        uint32_t e = (a >> 23) - 112u, m = a & 0x7fffffu;
        uint32_t h = (e << 10) | (m >> 13), rest = m & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++; /* carries into the exponent */
        return (uint16_t)(sign | h);
    }
}

/* dtype codes shared by the simulations */
enum kind { F32 = 0, F64 = 1, F16 = 2, BF16 = 3 };

inline size_t kind_size(kind k) { return k == F64 ? 8 : k == F32 ? 4 : 2; }

/* a rounded to the 16-bit type k and widened back (F32, F64: a unchanged) */
inline float round_to(kind k, float a)
{
    return k == F16 ? f16_to_f32(f32_to_f16(a)) : k == BF16 ? bf16_to_f32(f32_to_bf16(a)) : a;
}

inline double load(const void *p, size_t i, kind k)
{
    switch (k) {
    case F32: return ((const float *)p)[i];
    case F64: return ((const double *)p)[i];
    case F16: return f16_to_f32(((const uint16_t *)p)[i]);
    default: return bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

/* v rounded once into the dtype (from double for F64, else from float: v must already be
   an fp32 value for F32/F16/BF16 stores made from fp32 arithmetic). */
inline void store(void *p, size_t i, kind k, double v)
{
    switch (k) {
    case F32: ((float *)p)[i] = (float)v; break;
    case F64: ((double *)p)[i] = v; break;
    case F16: ((uint16_t *)p)[i] = f32_to_f16((float)v); break;
    default: ((uint16_t *)p)[i] = f32_to_bf16((float)v); break;
    }
}

} /* namespace cudasim_num */
#endif
