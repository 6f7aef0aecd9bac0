/* Scaler declarations (section of zero.h). Dynamic loss scaling as DeepSpeed does it:
   on an overflow the step is skipped and, once 'hysteresis' overflows have been absorbed,
   the scale is divided by 'factor' (never below min_scale); after 'window' steps without
   an overflow it is multiplied by 'factor'. */

typedef enum zero_scaler_mode {
    ZERO_SCALER_DEFAULT = 0, /* dynamic for fp16 params, none for bf16 / fp32 */
    ZERO_SCALER_DYNAMIC = 1,
    ZERO_SCALER_STATIC = 2,  /* always init_scale */
    ZERO_SCALER_NONE = 3     /* scale 1 */
} zero_scaler_mode;

typedef struct zero_scaler_desc {
    zero_scaler_mode mode;
    float init_scale;           /* 0 = 65536 (2^16)                         */
    int window;                 /* 0 = 1000 good steps before growing       */
    int hysteresis;             /* 0 = 2 overflows before shrinking          */
    float min_scale;            /* 0 = 1                                     */
    float factor;               /* 0 = 2                                     */
    int consecutive_hysteresis; /* 1: a good step refills the hysteresis     */
} zero_scaler_desc;

typedef struct zero_scaler {
    float scale;
    float factor;
    float min_scale;
    int window;
    int hysteresis;     /* the configured value                 */
    int cur_hysteresis; /* overflows still absorbed before a cut */
    int consecutive_hysteresis;
    int dynamic;
    int64_t iter;              /* updates so far                  */
    int64_t last_overflow_iter; /* -1 before the first overflow    */
} zero_scaler;

/* Resolves defaults for params of dtype param_dtype and validates (finite, positive
   values; window, hysteresis >= 1; factor > 1; dynamic: min_scale <= init_scale);
   INVALID_ARGUMENT names the field and writes nothing. desc may be NULL (all defaults).
   param_dtype is looked at only by the DEFAULT mode, which needs F16 (dynamic) or BF16,
   F32, F64 (none). */
ZERODEF zero_result zero_scaler_init(zero_scaler *scaler, const zero_scaler_desc *desc,
                                     zero_dtype param_dtype);
/* One step's outcome: overflow != 0 when any rank saw inf/NaN (the step is skipped).
   Dynamic: DeepSpeed's rule (docs/optimizer.md); a growth that would make the scale
   infinite leaves it as it is. Static and none: the scale stays; iter and
   last_overflow_iter still count. */
ZERODEF void zero_scaler_update(zero_scaler *scaler, int overflow);
