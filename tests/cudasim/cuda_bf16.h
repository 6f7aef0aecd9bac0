/* cuda_bf16.h - cudasim's __nv_bfloat16: the storage type and the exactly rounded conversions. */
#ifndef CUDASIM_CUDA_BF16_H
#define CUDASIM_CUDA_BF16_H
#include <cuda_runtime.h>

static inline float __bfloat162float(struct __nv_bfloat16 b);
static inline struct __nv_bfloat16 __float2bfloat16_rn(float f);

/* As CUDA's: default-constructible, from float (round to nearest even) and back. */
struct __nv_bfloat16 {
    unsigned short x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f);
    operator float() const;
};

static inline float __bfloat162float(__nv_bfloat16 b)
{
    unsigned u = (unsigned)b.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN (quiet). */
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) b.x = (unsigned short)((u >> 16) | 0x40u);
    else b.x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return b;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline __nv_bfloat16::__nv_bfloat16(float f) : x(__float2bfloat16_rn(f).x) {}
inline __nv_bfloat16::operator float() const { return __bfloat162float(*this); }
#endif
