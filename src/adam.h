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
   opts out), computed in double and rounded once to float. */
ZERODEF zero_result zero_adam_coefs_make(zero_adam_coefs *out, const zero_adam_desc *desc,
                                         float weight_decay, int64_t step);

/* Adam/AdamW on the host over one range, each element by zero_adam_update() with its
   gradient multiplied by grad_mul first; param (if any) receives the rounded master.
   simd: AUTO or a path the CPU supports; threads: 0 or 1 = the calling thread only. */
ZERODEF zero_result zero_adam_host(const zero_adam_range *range, const zero_adam_coefs *coefs,
                                   float grad_mul, zero_simd simd, int threads);
