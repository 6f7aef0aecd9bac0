/* Estimator declarations (section of zero.h): model-state bytes per rank for ZeRO stages
   0-3, the forward question (how many bytes does this model need?) and the inverse (how
   large a model fits?). Pure arithmetic on integers: no allocation, no device.

   Two modes:
   - ZERO_ESTIMATE_PAPER (the default): the table of the ZeRO paper (Rajbhandari et al.,
     SC20, arXiv 1910.02054, section 5), with Psi parameters, N ranks, 2-byte parameters,
     2-byte gradients and K = 12 bytes of optimizer state per parameter (Adam: fp32 master,
     m, v). A rank's shard holds ceil(Psi / N) elements (the plan pads groups to equal
     shards), so per rank:
         stage 0:  params 2 Psi   grads 2 Psi     optimizer K Psi       (2+2+K) Psi
         stage 1:  params 2 Psi   grads 2 Psi     optimizer K S         4 Psi + K S
         stage 2:  params 2 Psi   grads 2 S       optimizer K S         2 Psi + (2+K) S
         stage 3:  params 2 S     grads 2 S       optimizer K S         (2+2+K) S
     with S = ceil(Psi / N). With offload (ZeRO-Offload, arXiv 2101.06840) the optimizer
     state and the Adam step move to the host: the device keeps the same params and grads,
     its optimizer bytes become 0, and host_bytes = the optimizer bytes the stage would have
     kept on the device (K Psi at stage 0, K S at stages 1-3); gradient shards stream to the
     host through a bounded staging buffer that is not counted (docs/estimator.md).
     Constant-size buffers (reduce buckets, stage-3 gather buffers) are not counted either.
   - ZERO_ESTIMATE_DEEPSPEED: DeepSpeed's estimate_zero2_model_states_mem_needs (stage 2)
     and estimate_zero3_model_states_mem_needs (stage 3), re-derived from their published
     formulas (DeepSpeed after PR #5099, April 2024; see docs/estimator.md): device_bytes is
     DeepSpeed's gpu_mem (per GPU), host_bytes its cpu_mem (per node), gather_bytes its
     largest_layer_memory. No breakdown by category (those fields are 0). */

typedef enum zero_estimate_mode {
    ZERO_ESTIMATE_DEFAULT = 0, /* = PAPER */
    ZERO_ESTIMATE_PAPER = 1,
    ZERO_ESTIMATE_DEEPSPEED = 2
} zero_estimate_mode;

/* The largest parameter count the estimator accepts (2^53: every count is then exact in the
   double arithmetic that DeepSpeed's formulas use). */
#define ZERO_ESTIMATE_MAX_PARAMS 9007199254740992ull

/* What to estimate. Zero-initialise and fill params, ranks and stage; every other zero
   field means its default. */
typedef struct zero_estimate_desc {
    uint64_t params;         /* Psi, 1..ZERO_ESTIMATE_MAX_PARAMS (ignored by max_params)  */
    int ranks;               /* N, data-parallel ranks (GPUs), >= 1                       */
    int stage;               /* 0..3 (DeepSpeed mode: 2 or 3)                             */
    zero_estimate_mode mode; /* 0 = paper                                                 */
    int offload;             /* nonzero: optimizer state on the host (DeepSpeed cpu_offload) */
    int param_bytes;         /* paper mode: bytes per parameter, 0 = 2 (1..1024)          */
    int grad_bytes;          /* paper mode: bytes per gradient, 0 = 2 (1..1024)           */
    int optimizer_bytes;     /* paper mode: K, bytes of optimizer state, 0 = 12 (1..1024) */
    /* DeepSpeed mode only: */
    int gpus_per_node;            /* 0 = 1 (DeepSpeed's default); must divide ranks      */
    uint64_t largest_layer_params;/* stage 3: required, <= params                         */
    int offload_params;           /* stage 3 with offload: parameters on the host too    */
    int no_zero_init;             /* stage 3: nonzero = without deepspeed.zero.Init      */
    double additional_buffer_factor; /* 0 = 1.5; finite and > 0                           */
} zero_estimate_desc;

/* Bytes of one configuration. */
typedef struct zero_estimate {
    zero_estimate_mode mode; /* resolved (never DEFAULT)                                  */
    int stage;
    int ranks;
    uint64_t params;
    /* paper mode: device bytes per rank by category (0 in DeepSpeed mode) */
    uint64_t params_bytes;    /* fp16/bf16 parameters                                    */
    uint64_t grads_bytes;     /* gradients                                               */
    uint64_t optimizer_bytes; /* fp32 master + m + v (0 when offloaded)                  */
    uint64_t device_bytes;    /* per rank: the sum above; DeepSpeed: gpu_mem per GPU       */
    uint64_t host_bytes;      /* paper: offloaded optimizer state per rank;
                                 DeepSpeed: cpu_mem per node                             */
    uint64_t gather_bytes;    /* DeepSpeed stage 3: largest_layer_memory (inside device_bytes) */
} zero_estimate;

/* Fills *out for desc. Errors (INVALID_ARGUMENT naming the field): NULL pointers, params 0
   or above ZERO_ESTIMATE_MAX_PARAMS, ranks < 1, stage outside 0..3 (2..3 for DeepSpeed), an
   unknown mode, byte sizes outside 0..1024, gpus_per_node < 0 or not dividing ranks,
   largest_layer_params missing (DeepSpeed stage 3) or above params, offload_params
   without offload or outside DeepSpeed stage 3, a NaN, infinite or negative
   additional_buffer_factor. OVERFLOW when a byte count does not fit 64 bits. *out is
   written only on success. */
ZERODEF zero_result zero_estimate_compute(const zero_estimate_desc *desc, zero_estimate *out);

/* The inverse: the largest Psi that zero_estimate_compute() accepts with a device_bytes
   per rank of at most device_memory, for the other fields of desc (desc->params is
   ignored). Exact: device_bytes(*out) <= device_memory < device_bytes(*out + 1) (or
   *out + 1 is not computable). *out = 0 when not even the smallest model fits (one
   parameter; DeepSpeed stage 3: Psi = largest_layer_params); ZERO_ESTIMATE_MAX_PARAMS
   when every accepted Psi fits (DeepSpeed stage 3 with parameters offloaded: the device
   holds 4 * largest layer whatever Psi is). Errors as zero_estimate_compute (params
   aside); *out is written only on success. */
ZERODEF zero_result zero_estimate_max_params(const zero_estimate_desc *desc,
                                             uint64_t device_memory, uint64_t *out);
