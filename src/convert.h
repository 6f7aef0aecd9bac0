/* Conversion declarations (section of zero.h): fp32 <-> fp16 / bf16 (and fp64), one element
   at a time and in bulk.

   Rounding: every narrowing conversion rounds to nearest, ties to even, on the exact value
   (fp64 -> fp16/bf16 rounds once, never through fp32). Subnormals are produced and read in
   every direction (no flush to zero). A finite value whose magnitude rounds past the
   largest finite number becomes inf of its sign (fp16: |x| >= 65520 -> inf).

   NaN: stays NaN, keeps its sign and becomes quiet. Narrowing keeps the top payload bits
   that fit and sets the quiet bit (what x86 F16C's vcvtps2ph does: fp16 = sign | 0x7e00 |
   mantissa >> 13; bf16 = sign | 0x7fc0 | mantissa >> 16); widening keeps the payload and
   sets the quiet bit (fp32 = sign | 0x7fc00000 | fp16 mantissa << 13, or bf16 << 16).

   The scalar functions are integer arithmetic only, so they give the same bits whatever
   the floating-point environment (rounding mode, FTZ/DAZ); the SIMD paths are tested to
   give exactly those bits for every input. */

/* fp32 -> fp16 bits, round to nearest even. */
ZERODEF uint16_t zero_f32_to_f16(float value);
/* fp16 bits -> fp32 (exact). */
ZERODEF float zero_f16_to_f32(uint16_t bits);
/* fp32 -> bf16 bits, round to nearest even. */
ZERODEF uint16_t zero_f32_to_bf16(float value);
/* bf16 bits -> fp32 (exact). */
ZERODEF float zero_bf16_to_f32(uint16_t bits);

/* Converts numel elements of src (src_dtype) into dst (dst_dtype), for any pair of
   ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64 (fp16/bf16 are uint16_t bit patterns). Every
   narrowing rounds once, as the scalar functions above; every widening is exact. Same
   dtype is a copy (memmove: dst may overlap src); for different dtypes dst and src must
   not overlap. Pointers need no alignment beyond that of a byte.
   simd: ZERO_SIMD_AUTO (zero_simd_detect()), or a path no higher than the CPU supports;
   every path gives the same bits. fp32 <-> fp16 and fp32 <-> bf16 (and fp16 <-> bf16)
   are vectorised; fp64 pairs are scalar.
   Errors: INVALID_ARGUMENT for an unknown dtype or simd value, or a NULL pointer with
   numel > 0; OVERFLOW when numel * element size does not fit size_t; UNSUPPORTED when
   simd names a path this CPU or build lacks. Nothing is written on error. */
ZERODEF zero_result zero_convert(void *dst, zero_dtype dst_dtype, const void *src,
                                 zero_dtype src_dtype, size_t numel, zero_simd simd);
