/* Optimizer declarations (section of zero.h). */

typedef enum zero_adam_mode {
    ZERO_ADAM_DEFAULT = 0, /* AdamW */
    ZERO_ADAMW = 1,        /* decoupled weight decay: p *= 1 - lr * wd */
    ZERO_ADAM = 2          /* L2: wd * p added to the gradient         */
} zero_adam_mode;

typedef struct zero_adam_desc {
    zero_adam_mode mode;
    float lr;           /* 0 = 1e-3   */
    float beta1;        /* 0 = 0.9    */
    float beta2;        /* 0 = 0.999  */
    float eps;          /* 0 = 1e-8   */
    float weight_decay; /* 0 = none (tensors may opt out individually) */
} zero_adam_desc;

/* Fills defaults and validates: lr finite and >= 0, betas in [0, 1), eps > 0, weight decay
   finite and >= 0. INVALID_ARGUMENT names the field. */
ZERODEF zero_result zero_adam_desc_resolve(zero_adam_desc *out, const zero_adam_desc *in);

/* The constants of step t (1-based) for a tensor with weight decay wd (its own, or 0 when it
   opts out), computed in double and rounded once to float: step_size = lr / (1 - beta1^t),
   inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t); AdamW: decay = 1 - lr * wd, l2 = 0; Adam: decay = 1,
   l2 = wd. desc is resolved first (zeros mean defaults). INVALID_ARGUMENT for step < 1, a
   bad desc or wd, or a coefficient that is not finite in fp32. Nothing written on error. */
ZERODEF zero_result zero_adam_coefs_make(zero_adam_coefs *out, const zero_adam_desc *desc,
                                         float weight_decay, int64_t step);

/* Adam/AdamW on the host over one range, each element by zero_adam_update() with its
   gradient multiplied by grad_mul first; param (if any) receives the rounded master
   (nearest even). One pass: every element is read and written once.
   grad_dtype: F32, F16 or BF16; param_dtype (looked at only when param != NULL): the same.
   simd: AUTO (zero_simd_detect()) or a path the CPU supports (else UNSUPPORTED).
   threads: 0 or 1 = the calling thread only; T > 1 splits the range into T contiguous
   chunks starting at multiples of 64 elements (at most 256 threads, never more than there
   are chunks); a thread that cannot be started has its chunk run on the calling thread.
   Every path and thread count gives the same bits for finite inputs (NaN payloads may
   differ). Errors: INVALID_ARGUMENT for a NULL range/coefs, a NULL buffer with numel > 0,
   a dtype outside the above, an unknown simd or threads < 0; nothing is written then.
   Not for -ffast-math builds of the implementation file (approximate division/sqrt). */
ZERODEF zero_result zero_adam_host(const zero_adam_range *range, const zero_adam_coefs *coefs,
                                   float grad_mul, zero_simd simd, int threads);
