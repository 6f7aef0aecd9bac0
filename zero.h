/* zero.h - the Zero Redundancy Optimizer (ZeRO) as a single-file C library.

   Do this:
       #define ZERO_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.

       // in exactly one .c file
       #define ZERO_IMPLEMENTATION
       #include "zero.h"

   Every other file includes "zero.h" without the define.

   WHAT IT IS
   ZeRO (Rajbhandari et al., SC20, arXiv 1910.02054) removes the redundancy of plain data
   parallelism by partitioning, across N data-parallel ranks, the optimizer state (stage 1,
   P_os), the gradients (stage 2, P_os+g) and the parameters (stage 3, P_os+g+p). This file
   holds everything that does not need a GPU:

       results      zero_result, zero_result_string(), zero_last_error()
       memory       ZERO_MALLOC / ZERO_FREE hooks, zero_allocator in descriptors
       conversion   fp32 <-> fp16 / bf16, scalar and bulk (SIMD where the CPU has it)
       plan         flat buffers, groups, shards, tensor views and intersections
       estimator    bytes per rank for stages 0-3 (paper and DeepSpeed formulas)
       comm         the collective interface; the in-process local comm (ranks as threads)
       device       the device interface; the host device (synchronous, on the CPU)
       optimizer    Adam / AdamW: one element expression shared by every backend
       scaler       dynamic loss scaling with DeepSpeed's defaults
       engine       stages 0-3 written once against the two interfaces above

   zero_cuda.h adds a CUDA device, zero_nccl.h an NCCL comm; the engine does not change.

   QUICK START (one engine per rank; here 4 ranks as threads of one process)

       static zero_result rank_main(int rank, zero_comm *comm, void *user)
       {
           zero_device *dev; zero_engine *e; zero_engine_desc d; zero_step_info info;
           int t, g, s;
           zero_host_device_create(NULL, &dev);          // or zero_cuda_device_create
           memset(&d, 0, sizeof d);                      // zero = defaults: fp16, AdamW
           d.stage = 3; d.device = dev; d.comm = comm; d.adam.lr = 1e-3f;
           zero_engine_create(&d, &e);
           zero_engine_add_tensor(e, "w0", 4096 * 1024, 0, 0, &t);      // group 0 = layer 0
           zero_engine_add_tensor(e, "b0", 1024, 0, ZERO_TENSOR_NO_DECAY, &t);
           zero_engine_commit(e);                        // collective: layout, checks, memory
           zero_engine_set_tensor(e, t, initial_values); // same values on every rank
           for (s = 0; s < steps; s++) {
               void *p, *dg;
               for (g = 0; g < G; g++) { zero_engine_gather(e, g, &p); ...forward...;
                                         zero_engine_release(e, g); }
               for (g = G - 1; g >= 0; g--) {
                   zero_engine_gather(e, g, &p); zero_engine_grads(e, g, &dg);
                   ...write d(loss * zero_engine_loss_scale(e))/dp into dg...;
                   zero_engine_release(e, g); zero_engine_grads_ready(e, g);
               }
               zero_engine_step(e, &info);               // info.skipped, .grad_norm, ...
           }
           zero_engine_destroy(e); zero_device_destroy(dev);
           return ZERO_OK;                               // check every result in real code
       }
       ...
       zero_local_run(4, rank_main, NULL);

   The same code runs at stages 0, 1, 2 and 3 (gather/release only count references below
   stage 3) and gives bit-identical parameters at every stage. examples/train_mlp.c is a
   complete program; docs/ has the longer story (engine.md, plan.md, optimizer.md, ...).

   MEMORY PER RANK (Psi params, N ranks, K = 12; checked by the test suite)
       stage 0  (2 + 2 + K) Psi          stage 2  2 Psi + (2 + K) Psi / N
       stage 1  4 Psi + K Psi / N        stage 3  (2 + 2 + K) Psi / N
   plus declared buffers (reduce buckets, stage-3 gather buffers). Traffic per step: 2 Psi
   (N-1)/N elements at stages 0-2, 3 Psi (N-1)/N at stage 3.

   OPTIONS (define before including, in the implementation file)
       ZERO_STATIC            make every function static (private to one translation unit)
       ZERO_MALLOC(sz)        replace malloc; define ZERO_FREE(p) too, or neither
       ZERO_FREE(p)           replace free
       ZERO_NO_SIMD           use only the portable paths (same bits, slower)

   ENVIRONMENT
       ZERO_SIMD=portable|avx2|avx512   caps the host kernels' instruction set (never above
                                        what the CPU has); unset = the best available

   ERRORS
   Every fallible call returns a zero_result: ZERO_OK (0) or a negative code. The library
   never exits or aborts on bad input; zero_last_error() gives a readable sentence naming
   the argument and value at fault (kept per thread). A failed call changes nothing.

   LICENSE: MIT, see the end of this file.
*/
/* The implementation uses POSIX (threads, clocks, sockets). When zero.h is the first header
   of the implementation file this asks the C library for it even under -std=c99/c11;
   otherwise compile that file with -D_POSIX_C_SOURCE=200809L or as gnu99/gnu11. */
#if defined(ZERO_IMPLEMENTATION) && !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && \
    !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif

#ifndef ZERO_H
#define ZERO_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef ZERO_STATIC
#define ZERODEF static
#else
#ifdef __cplusplus
#define ZERODEF extern "C"
#else
#define ZERODEF extern
#endif
#endif

/* Functions that must run identically on the CPU and inside CUDA kernels. */
#if defined(__CUDACC__)
#define ZERO_HOSTDEV __host__ __device__
#else
#define ZERO_HOSTDEV
#endif

#if defined(__cplusplus)
#define ZERO_INLINE inline
#else
#define ZERO_INLINE static inline
#endif

#if defined(ZERO_MALLOC) != defined(ZERO_FREE)
#error "zero.h: define both ZERO_MALLOC and ZERO_FREE, or neither"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
   Results: one enum for the whole library, 0 = success, negative = error.
   ====================================================================================== */

typedef enum zero_result {
    ZERO_OK = 0,
    ZERO_ERROR_INVALID_ARGUMENT = -1, /* a NULL pointer, a value out of range, a bad name   */
    ZERO_ERROR_OUT_OF_MEMORY = -2,    /* an allocation failed (host or device)             */
    ZERO_ERROR_INVALID_STATE = -3,    /* a call out of order: query before commit, ...     */
    ZERO_ERROR_NOT_FOUND = -4,        /* an unknown name, tensor or group                  */
    ZERO_ERROR_OVERFLOW = -5,         /* sizes whose sum or product does not fit size_t    */
    ZERO_ERROR_MISMATCH = -6,         /* ranks disagree (plan hash, sizes)                 */
    ZERO_ERROR_DEVICE = -7,           /* the device backend failed (CUDA error kept)       */
    ZERO_ERROR_COMM = -8,             /* a collective failed (NCCL error kept)             */
    ZERO_ERROR_TIMEOUT = -9,          /* a peer or collective did not answer in time       */
    ZERO_ERROR_IO = -10,              /* a file or socket operation failed (errno kept)    */
    ZERO_ERROR_UNSUPPORTED = -11      /* not available in this build or on this machine    */
} zero_result;

/* A short constant description of a result ("invalid argument"). Never NULL. */
ZERODEF const char *zero_result_string(zero_result result);

/* The detail of the last error raised on the calling thread: which call, which argument,
   which value, and any CUDA/NCCL/errno text. "" when none. The string is owned by the
   library and valid until the next failing call on this thread. */
ZERODEF const char *zero_last_error(void);

/* Clears the calling thread's last error. */
ZERODEF void zero_clear_error(void);

/* ======================================================================================
   Memory: allocation hooks. ZERO_MALLOC/ZERO_FREE replace malloc/free at compile time;
   a zero_allocator in a descriptor replaces them at run time (all fields NULL = default).
   ====================================================================================== */

typedef struct zero_allocator {
    void *(*alloc)(size_t bytes, void *user); /* NULL on failure */
    void (*free)(void *ptr, void *user);
    void *user;
} zero_allocator;

/* Element types. Value 0 means "the default" wherever a descriptor takes a dtype. */
typedef enum zero_dtype {
    ZERO_DTYPE_DEFAULT = 0,
    ZERO_F32 = 1,
    ZERO_F16 = 2,
    ZERO_BF16 = 3,
    ZERO_F64 = 4
} zero_dtype;

/* Bytes per element: 4, 2, 2, 8; 0 for an unknown dtype. */
ZERODEF size_t zero_dtype_size(zero_dtype dtype);
/* "f32", "f16", "bf16", "f64" or "?" */
ZERODEF const char *zero_dtype_name(zero_dtype dtype);

/* Which instruction set the host kernels use. AUTO picks the best the CPU supports
   (checked once with CPUID); every path gives the same bits. */
typedef enum zero_simd {
    ZERO_SIMD_AUTO = 0,
    ZERO_SIMD_PORTABLE = 1,
    ZERO_SIMD_AVX2 = 2,   /* AVX2 + FMA + F16C */
    ZERO_SIMD_AVX512 = 3  /* AVX-512 F + BW (+ F16C) */
} zero_simd;

/* The best path this CPU and build support (never AUTO). */
ZERODEF zero_simd zero_simd_detect(void);
/* "portable", "avx2", "avx512" */
ZERODEF const char *zero_simd_name(zero_simd simd);

/* ======================================================================================
   Conversion: fp32 <-> fp16 / bf16.
   ====================================================================================== */
/* Conversion declarations: fp32 <-> fp16 / bf16 (and fp64), one element
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

/* ======================================================================================
   Plan: tensors packed into flat, padded group buffers; shard r of a group is its r-th
   equal slice (what NCCL's reduce-scatter and all-gather need).
   ====================================================================================== */
/* Plan declarations. */

#define ZERO_DEFAULT_ALIGN_NUMEL 16

typedef struct zero_range {
    size_t offset; /* first element, in the group's flat buffer */
    size_t numel;
} zero_range;

typedef struct zero_tensor_info {
    const char *name; /* owned by the plan */
    int group;
    size_t offset;    /* first element in the group's flat buffer; a multiple of align */
    size_t numel;
} zero_tensor_info;

typedef struct zero_group_info {
    size_t numel;        /* padded flat size: a multiple of world * align               */
    size_t used_numel;   /* end of the group's last tensor (<= numel)                   */
    size_t shard_numel;  /* numel / world                                               */
    const int *tensors;  /* the group's tensor ids in registration order (plan-owned)  */
    int num_tensors;
    int persistent;      /* used_numel < persist_numel: stage 3 keeps it whole         */
} zero_group_info;

typedef struct zero_plan zero_plan;

/* A new, empty plan. allocator may be NULL (ZERO_MALLOC/ZERO_FREE); otherwise it is copied
   and every allocation of the plan, the plan itself included, goes through it until
   zero_plan_destroy(). A committed plan is read-only: its queries may run concurrently. */
ZERODEF zero_result zero_plan_create(zero_plan **out, const zero_allocator *allocator);
ZERODEF void zero_plan_destroy(zero_plan *plan);

/* Registers a tensor of numel (> 0) elements in group 'group' (>= 0). Names are unique,
   non-empty, at most 255 bytes (the plan keeps a copy). Tensor ids are 0, 1, 2... in
   registration order; out_tensor may be NULL. Errors: after commit (INVALID_STATE); NULL,
   empty, too long or duplicate name, numel 0, negative group (INVALID_ARGUMENT);
   OUT_OF_MEMORY. A failed add changes nothing. */
ZERODEF zero_result zero_plan_add(zero_plan *plan, const char *name, size_t numel, int group,
                                  int *out_tensor);

/* Lays out every group for 'world' ranks: each tensor start aligned to align_numel
   (0 = ZERO_DEFAULT_ALIGN_NUMEL), each group padded to a multiple of world * align_numel.
   Group ids must be exactly 0..G-1, each used. Groups with used_numel < persist_numel are
   marked persistent (0 = none); their shards are still the equal slices. Errors: world <= 0
   or a missing group id, named (INVALID_ARGUMENT); no tensors, or already committed
   (INVALID_STATE); a padded group or the total past SIZE_MAX (OVERFLOW); OUT_OF_MEMORY.
   Errors leave the plan uncommitted and unchanged. */
ZERODEF zero_result zero_plan_commit(zero_plan *plan, int world, size_t align_numel,
                                     size_t persist_numel);

ZERODEF int zero_plan_is_committed(const zero_plan *plan);
ZERODEF int zero_plan_world(const zero_plan *plan);          /* 0 before commit */
ZERODEF int zero_plan_num_groups(const zero_plan *plan);     /* 0 before commit */
ZERODEF int zero_plan_num_tensors(const zero_plan *plan);
ZERODEF size_t zero_plan_total_numel(const zero_plan *plan); /* sum of padded groups */
ZERODEF size_t zero_plan_align(const zero_plan *plan);       /* 0 before commit */

/* Queries: INVALID_STATE before commit, NOT_FOUND for an unknown id or name,
   INVALID_ARGUMENT for a rank outside 0..world-1 or a NULL out. */
ZERODEF zero_result zero_plan_group(const zero_plan *plan, int group, zero_group_info *out);
ZERODEF zero_result zero_plan_tensor(const zero_plan *plan, int tensor, zero_tensor_info *out);
ZERODEF zero_result zero_plan_find(const zero_plan *plan, const char *name, int *out_tensor);
/* Rank r's shard of a group: [r * shard_numel, (r + 1) * shard_numel). */
ZERODEF zero_result zero_plan_shard(const zero_plan *plan, int group, int rank, zero_range *out);
/* The part of a tensor inside rank r's shard of its group, as a range of the group buffer
   (numel 0 when they do not meet). The offset within the tensor is out->offset minus the
   tensor's offset. An empty result has its offset clamped into the tensor, so that
   offset - tensor offset is always within 0..numel and never decreases with the rank. */
ZERODEF zero_result zero_plan_intersect(const zero_plan *plan, int tensor, int rank,
                                        zero_range *out);
/* A 64-bit hash of everything that shapes the layout (names, sizes, groups, world, align,
   which groups are persistent), FNV-1a over a fixed little-endian encoding (docs/plan.md):
   equal plans hash equal on every rank, host and build. Never 0 after commit; 0 before. */
ZERODEF uint64_t zero_plan_hash(const zero_plan *plan);

/* ======================================================================================
   Estimator: model-state bytes per rank by stage (the paper's table and DeepSpeed's).
   ====================================================================================== */
/* Estimator declarations: model-state bytes per rank for ZeRO stages
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

/* ======================================================================================
   Comm: the collective interface. Every backend implements zero_comm_ops; the engine
   calls nothing else. Counts are in elements, never bytes.
   ====================================================================================== */

typedef enum zero_op { ZERO_OP_SUM = 0, ZERO_OP_MAX = 1 } zero_op;

typedef struct zero_comm zero_comm;

/* A collective's identity beyond its arguments: which engine group it serves, in which role,
   and the engine's running collective count. Ranks whose control flow diverged (rank 0
   gathers group 0 while rank 1 gathers group 1 of the same size) call collectives with
   equal arguments but different tags. role 0 means untagged: nothing to compare. */
typedef struct zero_comm_tag {
    int32_t group; /* engine group, -1 for none                                     */
    int32_t role;  /* what the collective is for (the engine's roles); 0 = untagged */
    uint64_t seq;  /* the caller's collective sequence number                        */
} zero_comm_tag;

typedef struct zero_comm_ops {
    const char *name;
    void (*destroy)(zero_comm *comm);
    /* recv holds world * send_numel elements, rank r's block at r * send_numel. In place
       when send == recv + rank * send_numel. */
    zero_result (*all_gather)(zero_comm *comm, const void *send, void *recv, size_t send_numel,
                              zero_dtype dtype, void *queue);
    /* send holds world * recv_numel elements; rank r receives the reduction of block r. In
       place when recv == send + rank * recv_numel (as NCCL allows). */
    zero_result (*reduce_scatter)(zero_comm *comm, const void *send, void *recv,
                                  size_t recv_numel, zero_dtype dtype, zero_op op, void *queue);
    /* In place when send == recv. */
    zero_result (*all_reduce)(zero_comm *comm, const void *send, void *recv, size_t numel,
                              zero_dtype dtype, zero_op op, void *queue);
    zero_result (*broadcast)(zero_comm *comm, void *buf, size_t numel, zero_dtype dtype,
                             int root, void *queue);
    /* Host-side barrier across ranks (waits for this rank's queued collectives first). */
    zero_result (*barrier)(zero_comm *comm);
    /* Optional (may be NULL): calls between them form one group (NCCL's grouped calls). */
    zero_result (*group_start)(zero_comm *comm);
    zero_result (*group_end)(zero_comm *comm);
} zero_comm_ops;

/* Determinism is a backend's promise: the local comm (and zero_cuda.h's device comm) sum
   in rank order 0..N-1 with one rounding, so an element's reduction is the same bits
   whichever collective computed it; NCCL's ring/tree orders are not, so on NCCL stage 0
   (all-reduce) may differ from stages 1-3 (reduce-scatter) in the last bits.

   A rank's handle. 'queue' arguments are the device's native queue for the comm queue
   (a cudaStream_t for CUDA, NULL for the host device); a backend that runs on the host
   completes the collective before returning. */
struct zero_comm {
    const zero_comm_ops *ops;
    void *impl;
    int rank;
    int world;
    zero_comm_tag tag; /* the identity of the next collective, set by the caller (the engine)
                          before each call; all zero = untagged. Backends compare it across
                          ranks where they can (docs/backends.md) and fail with
                          ZERO_ERROR_MISMATCH naming both sides. */
};

/* Local comm declarations: N ranks as threads of one process.

   A group holds 'world' ranks; each rank gets its own zero_comm and calls every collective
   from its own thread. Collectives complete before they return (queue is ignored and
   should be NULL). Semantics (docs/backends.md):

   - Determinism. SUM reduces in rank order 0..N-1, starting from rank 0's element,
     accumulating in fp32 (fp64 for F64) and rounding once to the dtype. An element's
     result therefore depends only on the N input elements: block r of a reduce_scatter is
     bit for bit the same elements of an all_reduce of the same input. MAX takes the
     largest element (NaN if any input is NaN).
   - Agreement. Every collective checks that all ranks called the same collective with the
     same numel, dtype, op and root. If not, every rank returns ZERO_ERROR_MISMATCH (a rank
     whose own arguments were invalid returns ZERO_ERROR_INVALID_ARGUMENT) and the group
     stays usable.
   - Failure. A rank that waits more than timeout_ms for its peers returns
     ZERO_ERROR_TIMEOUT, zero_local_abort() or destroying a comm makes waiting peers return
     ZERO_ERROR_COMM; either breaks the group, and every later collective on it fails at
     once with the same code and a message naming the cause. No rank returns (even with an
     error) while a peer may still read its buffers.
   - In place. all_gather with send == recv + rank * send_numel, all_reduce with
     send == recv, and reduce_scatter with recv == send + rank * recv_numel all work.
   - numel 0 is a valid collective (a synchronisation point whose arguments are checked);
     the buffers may then be NULL. */

typedef struct zero_local_desc {
    int world;                /* ranks, >= 1                                           */
    int timeout_ms;           /* how long a rank waits for its peers; 0 = 60000        */
    zero_allocator allocator; /* for the group and its comms; all NULL = ZERO_MALLOC   */
} zero_local_desc;

typedef struct zero_local_group zero_local_group;

/* A new group of desc->world ranks. INVALID_ARGUMENT: world < 1, timeout_ms < 0. */
ZERODEF zero_result zero_local_group_create(const zero_local_desc *desc, zero_local_group **out);

/* Releases the group. Meant for after every comm of it is destroyed; if some are still
   alive, the memory is released when the last of them is destroyed. NULL is ignored. */
ZERODEF void zero_local_group_destroy(zero_local_group *group);

/* Rank 'rank''s comm (one per rank; the rank's thread uses it). INVALID_ARGUMENT for a
   rank outside 0..world-1, INVALID_STATE when that rank already has a comm. */
ZERODEF zero_result zero_local_comm_create(zero_local_group *group, int rank, zero_comm **out);

/* Any backend's comm: comm->ops->destroy(comm). NULL is ignored. Destroying a local comm
   breaks its group (peers waiting in a collective return ZERO_ERROR_COMM). */
ZERODEF void zero_comm_destroy(zero_comm *comm);

/* Wakes every rank waiting in a collective of comm's group with ZERO_ERROR_COMM and breaks
   the group. Callable from any thread. INVALID_ARGUMENT when comm is not a local comm. */
ZERODEF zero_result zero_local_abort(zero_comm *comm);

/* Runs fn(rank, comm, user) on 'world' threads with a fresh group (default timeout) and
   waits for all of them. A rank whose fn returns an error (or returns at all) destroys its
   comm, so peers still waiting for it fail with ZERO_ERROR_COMM instead of hanging.
   Returns ZERO_OK when every rank returned ZERO_OK; otherwise the error of the lowest
   rank that failed before the group broke (the root cause), or else of the lowest failing
   rank; zero_last_error() on the calling thread then says "rank R: <its message>". */
ZERODEF zero_result zero_local_run(int world, zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                   void *user);

/* As zero_local_run() with a descriptor (world, timeout, allocator). */
ZERODEF zero_result zero_local_run_desc(const zero_local_desc *desc,
                                        zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                        void *user);

/* ======================================================================================
   Device: memory, queues and the element kernels the engine needs. The host device runs
   everything synchronously on the CPU; zero_cuda.h enqueues kernels on CUDA streams.
   All pointers passed to ops are device pointers unless the name says host.
   ====================================================================================== */

/* What an allocation holds: the engine's accounting is by category. */
typedef enum zero_mem_category {
    ZERO_MEM_PARAM = 0, /* fp16/bf16/fp32 parameters, whole or shard              */
    ZERO_MEM_GRAD,      /* gradients, whole or shard, and their accumulators      */
    ZERO_MEM_MASTER,    /* fp32 master weights                                    */
    ZERO_MEM_MOMENT1,   /* Adam m                                                 */
    ZERO_MEM_MOMENT2,   /* Adam v                                                 */
    ZERO_MEM_BUCKET,    /* reduce buckets                                         */
    ZERO_MEM_GATHER,    /* stage-3 gather buffers                                 */
    ZERO_MEM_SCRATCH,   /* flags, scalars, partial sums                           */
    ZERO_MEM_COUNT
} zero_mem_category;

ZERODEF const char *zero_mem_category_name(zero_mem_category category);

typedef enum zero_queue {
    ZERO_QUEUE_COMPUTE = 0, /* the user's forward/backward and the optimizer step */
    ZERO_QUEUE_COMM = 1,    /* collectives                                        */
    ZERO_QUEUE_OFFLOAD = 2, /* host <-> device streaming                          */
    ZERO_QUEUE_COUNT = 3
} zero_queue;

typedef struct zero_event zero_event; /* backend-defined */

/* One contiguous range for the Adam step. master, m, v are fp32; grad is read in
   grad_dtype; param (may be NULL) receives the updated master in param_dtype. */
typedef struct zero_adam_range {
    size_t numel;
    float *master;
    float *m;
    float *v;
    const void *grad;
    zero_dtype grad_dtype;
    void *param;
    zero_dtype param_dtype;
} zero_adam_range;

/* Per-step constants of Adam/AdamW, made on the host (see the optimizer section). */
typedef struct zero_adam_coefs {
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float step_size;    /* lr / (1 - beta1^t)                        */
    float inv_sqrt_bc2; /* 1 / sqrt(1 - beta2^t)                     */
    float eps;
    float decay;        /* AdamW: 1 - lr * weight_decay; else 1      */
    float l2;           /* Adam: weight_decay (added to the gradient); AdamW: 0 */
} zero_adam_coefs;

typedef struct zero_device zero_device;

typedef struct zero_device_ops {
    const char *name;
    void (*destroy)(zero_device *dev);
    /* Memory: 'bytes' bytes, aligned to at least 64 bytes, tagged with a category. */
    zero_result (*alloc)(zero_device *dev, size_t bytes, zero_mem_category category, void **out);
    zero_result (*free)(zero_device *dev, void *ptr);
    /* Optional (may be NULL): called once before an engine's allocations with their total
       bytes and count, so a backend can take one arena (each allocation may need up to
       256 bytes of alignment slack on top of its size). */
    zero_result (*reserve)(zero_device *dev, size_t total_bytes, size_t num_allocations);
    /* Queues and events: 'wait' makes queue q wait for ev without blocking the host;
       'sync' blocks the host until queue q is idle. */
    zero_result (*event_create)(zero_device *dev, zero_event **out);
    void (*event_destroy)(zero_device *dev, zero_event *ev);
    zero_result (*record)(zero_device *dev, zero_queue q, zero_event *ev);
    zero_result (*wait)(zero_device *dev, zero_queue q, zero_event *ev);
    zero_result (*sync)(zero_device *dev, zero_queue q);
    /* The backend's handle for queue q (cudaStream_t), handed to the comm; NULL on host. */
    void *(*native_queue)(zero_device *dev, zero_queue q);
    /* Transfers, enqueued on q. */
    zero_result (*copy)(zero_device *dev, zero_queue q, void *dst, const void *src, size_t bytes);
    zero_result (*upload)(zero_device *dev, zero_queue q, void *dst, const void *host_src,
                          size_t bytes);
    zero_result (*download)(zero_device *dev, zero_queue q, void *host_dst, const void *src,
                            size_t bytes);
    /* Element kernels, enqueued on q. */
    zero_result (*fill_zero)(zero_device *dev, zero_queue q, void *dst, size_t bytes);
    zero_result (*cast)(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                        const void *src, zero_dtype src_dtype, size_t numel);
    /* dst[i] = round_to_dtype((float)dst[i] + (float)src[i]) */
    zero_result (*add)(zero_device *dev, zero_queue q, void *dst, const void *src,
                       zero_dtype dtype, size_t numel);
    /* x[i] = round_to_dtype((float)x[i] * s) */
    zero_result (*scale)(zero_device *dev, zero_queue q, void *x, zero_dtype dtype,
                         size_t numel, float s);
    /* *flag (fp32, device) = 1 if any element is inf or NaN; left as it was otherwise. */
    zero_result (*nonfinite)(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                             size_t numel, float *flag);
    /* *acc (fp64, device) += sum of x[i]^2 in fp64, in an order fixed by numel alone (blocks
       of 65536, 8 lanes by index mod 8, a fixed tree): the host and CUDA devices give the
       same bits. */
    zero_result (*sumsq)(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                         size_t numel, double *acc);
    /* From the all-reduced sum of squares of the raw (scaled) gradients and the all-reduced
       non-finite flag: out[0] = gradient multiplier, out[1] = gradient norm, both fp32 on
       the device, by zero_grad_mul() below. No host round-trip. */
    zero_result (*grad_mul)(zero_device *dev, zero_queue q, const double *sumsq,
                            const float *nonfinite, float unscale, float clip_norm, float *out);
    /* Adam/AdamW on one range by zero_adam_update() below, gradients multiplied by
       *grad_mul; nothing is written when *skip != 0. grad_mul and skip are device fp32;
       skip may be NULL (never skip), grad_mul may not. coefs is a host pointer, read
       before the call returns. */
    zero_result (*adam)(zero_device *dev, zero_queue q, const zero_adam_range *range,
                        const zero_adam_coefs *coefs, const float *grad_mul, const float *skip);
} zero_device_ops;

struct zero_device {
    const zero_device_ops *ops;
    void *impl;
};

/* Host device declarations: zero_device_ops on the CPU.

   Every op runs synchronously on the calling thread (or on 'threads' workers it joins
   before returning), so queues are only names: events are real objects, record / wait /
   sync return ZERO_OK at once, native_queue() is NULL, and reserve is NULL (no arena). Memory comes
   from the allocator, 64-byte aligned; the device keeps a table of its live allocations,
   so freeing a pointer it did not allocate returns ZERO_ERROR_INVALID_ARGUMENT instead of
   crashing. Every op validates its arguments (NULL with numel > 0, unknown dtype, queue
   out of range) and returns an error rather than crash. The device is safe to use from
   several threads at once (allocation is locked; kernels share no state).

   Kernels (docs/backends.md): add, scale and cast compute in fp32 (fp64 for F64) and round
   once to the dtype, to nearest even; sumsq adds the squares in fp64 in an order fixed by
   numel alone (8 lanes over i mod 8 within blocks of ZERO_HOST_SUMSQ_BLOCK elements, the
   lanes combined in a fixed tree, the blocks in order), so its bits do not depend on the
   SIMD path or the thread count. */

/* Elements per block of sumsq; part of the definition of its result. */
#define ZERO_HOST_SUMSQ_BLOCK 65536

typedef struct zero_host_device_desc {
    zero_allocator allocator; /* all NULL = ZERO_MALLOC / ZERO_FREE                    */
    zero_simd simd;           /* AUTO = the best the CPU has; others must be supported */
    int threads;              /* worker threads for large kernels; 0 or 1 = the caller */
} zero_host_device_desc;

/* A new host device. desc NULL = defaults. INVALID_ARGUMENT: threads < 0;
   UNSUPPORTED: a simd path this CPU or build lacks. */
ZERODEF zero_result zero_host_device_create(const zero_host_device_desc *desc, zero_device **out);

/* Any backend's device: dev->ops->destroy(dev). NULL is ignored. The host device frees
   allocations still live at that point. */
ZERODEF void zero_device_destroy(zero_device *dev);

/* What a host device holds now: bytes requested per category (bytes[ZERO_MEM_COUNT], may be
   NULL) and the number of live allocations (may be NULL). INVALID_ARGUMENT when dev is not a
   host device. */
ZERODEF zero_result zero_host_device_stats(zero_device *dev, size_t *bytes, size_t *allocations);

/* ======================================================================================
   Optimizer: Adam / AdamW on fp32 master weights. zero_adam_update() is the one element
   expression every path uses (host SIMD, host portable, CUDA): each multiply-add is an
   explicit fmaf and no other product meets a sum, so no compiler contraction can change
   it, and an element's result does not depend on where it sits in a shard.
   ====================================================================================== */

/* The gradient multiplier and norm from the global sum of squares of raw gradients. */
ZERO_INLINE ZERO_HOSTDEV void zero_grad_mul(double sumsq, float nonfinite, float unscale,
                                            float clip_norm, float *out_mul, float *out_norm)
{
    float norm, coef = 1.0f;
    if (nonfinite != 0.0f) {
        *out_mul = 0.0f;
        *out_norm = -1.0f; /* the step is skipped; the norm is undefined */
        return;
    }
    norm = (float)(sqrt(sumsq) * (double)unscale);
    if (clip_norm > 0.0f && norm > clip_norm)
        coef = clip_norm / (norm + 1e-6f);
    *out_mul = unscale * coef;
    *out_norm = norm;
}

ZERO_INLINE ZERO_HOSTDEV void zero_adam_update(float g, float *p, float *m, float *v,
                                               const zero_adam_coefs *c)
{
    float mm, vv, denom, pp;
    g = fmaf(c->l2, *p, g);
    mm = fmaf(c->beta1, *m, c->one_minus_beta1 * g);
    vv = fmaf(c->beta2, *v, (c->one_minus_beta2 * g) * g);
    denom = fmaf(sqrtf(vv), c->inv_sqrt_bc2, c->eps);
    pp = (*p) * c->decay;
    *p = fmaf(-c->step_size, mm / denom, pp);
    *m = mm;
    *v = vv;
}

/* Optimizer declarations. */

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

/* ======================================================================================
   Scaler: dynamic loss scaling (fp16); bf16 and fp32 need none.
   ====================================================================================== */
/* Scaler declarations. Dynamic loss scaling as DeepSpeed does it:
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

/* ======================================================================================
   Engine: ZeRO stages 0-3 over a zero_device and a zero_comm.
   ====================================================================================== */
/* Engine declarations: ZeRO stages 0-3, written once against
   zero_device and zero_comm.

   One engine per rank. Every rank runs the same program (SPMD): the same registrations,
   the same calls in the same order; calls marked COLLECTIVE must be made by every rank of
   the comm. The engine owns the fp16/bf16/fp32 parameters, the gradients, the fp32
   master weights and Adam moments, and hands out device pointers into them.

   LIFECYCLE
       zero_engine_create(&desc, &e)            local: resolves the descriptor
       zero_engine_add_tensor(e, ...)           local: registers tensors (group = layer)
       zero_engine_commit(e)                    COLLECTIVE: lays out, checks that every rank
                                                registered the same (MISMATCH otherwise),
                                                allocates everything at once
       zero_engine_set_tensor(e, t, values)     local: initial fp32 values (same on every rank)
       loop over steps:
         loop accum_steps times (micro-steps):
           forward, g = 0..G-1:  zero_engine_gather(e, g, &p) ... zero_engine_release(e, g)
           backward, g = G-1..0: zero_engine_gather(e, g, &p); zero_engine_grads(e, g, &dg);
                                 write dL*scale/dp into dg; zero_engine_release(e, g);
                                 zero_engine_grads_ready(e, g)
         zero_engine_step(e, &info)             COLLECTIVE
       zero_engine_destroy(e)

   gather and prefetch are COLLECTIVE at stage 3, grads at stages 2-3, grads_ready and step at
   every stage: call them in the same order on every rank (release is local). At stages 0-2 gather and release only
   count references, so code written for stage 3 runs unchanged at every stage.

   GRADIENTS. The user writes gradients of (local mean loss * zero_engine_loss_scale(e)) in
   the param dtype into the buffer zero_engine_grads() hands out (zero-filled when handed
   out, so a backward may add into it). The engine averages over ranks and micro-steps:
   the multiplier is 1 / (loss_scale * world * accum_steps), times the clip coefficient.
   Each micro-step's gradients are reduced as soon as their group is ready (all-reduce at
   stage 0, reduce-scatter to the owner at stages 1-3) and accumulated in the comm dtype:
   the first micro-step's reduced values are stored as they are, each later one is added
   (one rounding), in the same order at every stage. Only the elements of registered
   tensors may be written; the padding between them must stay zero.

   QUEUES. The user's forward/backward belongs on ZERO_QUEUE_COMPUTE; collectives run on
   ZERO_QUEUE_COMM, ordered by events; the host waits only where it reads a value (end of
   step(), read_tensor). Pointers handed out are valid for compute-queue work enqueued after
   the call that returned them and until the matching release / grads_ready.

   DETERMINISM. With the local comm (rank-order sums, one rounding) stages 0, 1, 2 and 3 give
   bit-identical parameters, master weights and moments at the same world size, run after
   run. See docs/engine.md for what preserves and what breaks this.

   ERRORS. Every call validates the state and arguments and returns an error (detail in
   zero_last_error()) instead of aborting; a failed call changes nothing unless it says
   otherwise. After a device or comm failure inside a collective call the engine is
   "broken": every later call returns ZERO_ERROR_INVALID_STATE, and zero_engine_destroy()
   is always safe. */

/* The engine's stages (the paper's P_os, P_os+g, P_os+g+p). */
#define ZERO_STAGE_0 0 /* plain data parallel: everything whole on every rank         */
#define ZERO_STAGE_1 1 /* P_os: fp32 master, m, v partitioned                          */
#define ZERO_STAGE_2 2 /* P_os+g: also the gradients                                   */
#define ZERO_STAGE_3 3 /* P_os+g+p: also the fp16/bf16 params, gathered per group      */

/* Zero-initialised = defaults (see each field). */
typedef struct zero_engine_desc {
    int stage;                   /* 0..3 (0 = plain data parallel)                             */
    zero_dtype param_dtype;      /* DEFAULT = ZERO_F16; or ZERO_BF16, ZERO_F32. User gradients
                                    are in this dtype too.                                      */
    zero_dtype grad_comm_dtype;  /* reduction and accumulation dtype: DEFAULT = param_dtype;
                                    ZERO_F32 for accuracy (twice the gradient traffic)          */
    zero_adam_desc adam;         /* Adam/AdamW hyper-parameters (zero = defaults, AdamW)        */
    zero_scaler_desc scaler;     /* loss scaling (zero = dynamic for fp16, none otherwise)      */
    float clip_norm;             /* global gradient-norm clipping; 0 = none                     */
    int accum_steps;             /* micro-steps per step; 0 = 1                                 */
    size_t reduce_bucket_numel;  /* ready gradients are reduced once they total this many
                                    elements (and at the end of every micro-step); 0 = each
                                    group as soon as it is ready. Stages 2-3: the gradient
                                    bucket pool holds max(this, 2 x largest group) elements,
                                    in slots of the largest group's size.                        */
    size_t max_live_numel;       /* stage 3: gathered elements held at once, at most (the
                                    gather pool: slots of the largest non-persistent group);
                                    0 = (2 + prefetch depth) x largest non-persistent group.
                                    INVALID_ARGUMENT at commit if one group exceeds it.          */
    int prefetch_depth;          /* stage 3: groups gathered ahead; 0 = 1, negative = none      */
    size_t persist_numel;        /* stage 3: groups with fewer used elements stay whole on
                                    every rank (DeepSpeed's param_persistence_threshold);
                                    0 = none persistent (the paper's 3 Psi traffic)             */
    size_t align_numel;          /* tensor alignment in elements; 0 = ZERO_DEFAULT_ALIGN_NUMEL  */
    zero_device *device;         /* required; not owned                                         */
    zero_comm *comm;             /* required; not owned. world = comm->world                    */
    zero_allocator allocator;    /* host-side memory of the engine; all NULL = ZERO_MALLOC      */
    int host_threads;            /* reserved for host-side work (CPU offload, a later issue):
                                    validated (>= 0; 0 = 1) but not used yet. The host device's
                                    own 'threads' sets the Adam threads today.                    */
    int async_step;              /* 1 = zero_engine_step(e, NULL) enqueues the step and returns
                                    without waiting for the device: its verdict (skipped, norm)
                                    reaches the loss scaler and the step count when the engine
                                    next needs them (zero_engine_loss_scale, _step_count,
                                    _last_step, the next step), read on the offload queue so
                                    that wait covers this step's work only, not what you queued
                                    after it. Queue the next forward pass before asking for the
                                    loss scale to overlap them. Results are the same bits. A
                                    step given an info pointer waits as before. 0 = always wait. */
} zero_engine_desc;

typedef struct zero_engine zero_engine;

/* Tensor flags for zero_engine_add_tensor(). */
#define ZERO_TENSOR_NO_DECAY 1u /* excluded from weight decay (biases, norms)                  */

/* Per-step outcome, filled by zero_engine_step(). */
typedef struct zero_step_info {
    int64_t step;          /* optimizer steps taken so far (skipped steps not counted)      */
    int skipped;           /* 1 when some rank saw inf/NaN: nothing was updated             */
    float loss_scale;      /* the scale this step's gradients carried                       */
    float next_loss_scale; /* the scale for the next step's gradients                       */
    float grad_norm;       /* global L2 norm of the averaged unscaled gradient, before
                              clipping; -1 when skipped                                      */
    float clip_coef;       /* clip_norm / (grad_norm + 1e-6) when clipping, else 1          */
    float grad_mul;        /* what multiplied the accumulated gradients: 1 / (scale * world
                              * accum) * clip_coef; 0 when skipped                           */
} zero_step_info;

/* Collective kinds of the traffic counters. */
typedef enum zero_coll {
    ZERO_COLL_ALL_GATHER = 0,
    ZERO_COLL_REDUCE_SCATTER = 1,
    ZERO_COLL_ALL_REDUCE = 2,
    ZERO_COLL_BROADCAST = 3,
    ZERO_COLL_CONTROL = 4, /* small control all-reduces: inf flag, norm, plan hash  */
    ZERO_COLL_COUNT = 5
} zero_coll;

/* Traffic per rank, as bus volume: an all-gather or reduce-scatter over a total of T
   elements moves T (N-1)/N per rank, an all-reduce 2 T (N-1)/N, a broadcast T (N-1)/N;
   nothing at N = 1. Control all-reduces are counted apart (ZERO_COLL_CONTROL) so the
   payload can be compared with the paper (2 Psi or 3 Psi per step, times (N-1)/N). */
typedef struct zero_traffic {
    uint64_t calls[ZERO_COLL_COUNT];
    double numel[ZERO_COLL_COUNT]; /* elements moved per rank (exact below 2^53)          */
    double bytes[ZERO_COLL_COUNT]; /* the same in bytes of each call's dtype              */
} zero_traffic;

/* Device bytes this rank's engine holds, by category, now and at peak (since commit). */
typedef struct zero_engine_memory {
    size_t bytes[ZERO_MEM_COUNT];
    size_t peak_bytes[ZERO_MEM_COUNT];
    size_t total_bytes;      /* sum of bytes[]                                            */
    size_t peak_total_bytes; /* peak of the sum                                           */
    size_t allocations;      /* live device allocations                                   */
} zero_engine_memory;

/* Stage 3 gather accounting (zeros at stages 0-2). Live numel counts gathered elements of
   non-persistent groups held in the gather pool, whether in use or prefetched. */
typedef struct zero_gather_stats {
    size_t limit_numel;     /* the pool: slots * slot_numel (<= max_live_numel)          */
    size_t slot_numel;      /* largest non-persistent group                              */
    int slots;
    size_t live_numel;      /* gathered now                                              */
    size_t peak_live_numel; /* most gathered at once since commit                        */
    int live_groups;        /* non-persistent groups gathered now (in use or prefetched) */
    uint64_t gathers;       /* all-gathers issued for non-persistent groups              */
    uint64_t prefetches;    /* of which issued ahead of use                              */
    uint64_t prefetch_hits; /* gathers served by a prefetch                              */
    uint64_t evictions;     /* prefetched groups dropped unused                          */
} zero_gather_stats;

/* What zero_engine_read_tensor() reads. */
typedef enum zero_state_kind {
    ZERO_STATE_PARAM = 0,  /* fp16/bf16/fp32 params (param dtype)                     */
    ZERO_STATE_MASTER = 1, /* fp32 master weights                                      */
    ZERO_STATE_M = 2,      /* fp32 Adam first moment                                   */
    ZERO_STATE_V = 3       /* fp32 Adam second moment                                  */
} zero_state_kind;

/* A new, uncommitted engine for one rank. Resolves and validates the descriptor (stage,
   dtypes, Adam and scaler settings, device and comm present); allocates only host memory.
   Errors: INVALID_ARGUMENT naming the field; OUT_OF_MEMORY. *out is NULL on error. */
ZERODEF zero_result zero_engine_create(const zero_engine_desc *desc, zero_engine **out);

/* Frees everything the engine allocated (device and host). Does not touch the device or
   the comm themselves. Safe at any point, also after errors; NULL is ignored. Never runs a
   collective. */
ZERODEF void zero_engine_destroy(zero_engine *e);

/* The descriptor with every default filled in (valid after create). */
ZERODEF zero_result zero_engine_get_desc(const zero_engine *e, zero_engine_desc *out);

/* Registers a tensor of numel elements in group 'group' (0..G-1; groups are gathered in
   ascending order in forward). flags: 0 or ZERO_TENSOR_NO_DECAY. Tensor ids are 0, 1, ...
   in registration order. Errors: INVALID_STATE after commit; INVALID_ARGUMENT for a bad
   name, numel 0, a negative group or unknown flags. */
ZERODEF zero_result zero_engine_add_tensor(zero_engine *e, const char *name, size_t numel,
                                           int group, unsigned flags, int *out_tensor);

/* COLLECTIVE. Lays out the plan for comm->world, calls device->ops->reserve (if any) and
   allocates every buffer (everything starts at zero), then checks with one control
   all-reduce, which every rank joins even after its own plan or allocation failed, that
   every rank has the same plan and settings (ZERO_ERROR_MISMATCH on every rank otherwise)
   and that every rank allocated (a rank's allocation failure fails every rank's commit with
   its code). Nothing is allocated after this until destroy.
   Errors: INVALID_STATE if already committed or no tensor registered; INVALID_ARGUMENT for
   bad group ids or a stage-3 group larger than max_live_numel; MISMATCH; OUT_OF_MEMORY,
   DEVICE, COMM. After a failed commit the engine can only be destroyed. */
ZERODEF zero_result zero_engine_commit(zero_engine *e);

/* The committed plan (layout queries: zero_plan_tensor, zero_plan_group, ...); NULL
   before commit. Owned by the engine. */
ZERODEF const zero_plan *zero_engine_plan(const zero_engine *e);

/* Sets a tensor's values from numel fp32 host values (every rank passes the same): the
   master weights this rank owns and the params it stores (rounded to the param dtype).
   Moments are left as they are (zero after commit). Local, synchronous. Errors:
   INVALID_STATE before commit, between micro-steps of a step, or while the tensor's group
   is gathered (at every stage); NOT_FOUND; INVALID_ARGUMENT for NULL values. */
ZERODEF zero_result zero_engine_set_tensor(zero_engine *e, int tensor, const float *values);

/* Reads this rank's copy of a tensor's state into host memory, in tensor coordinates:
   host_dst holds the tensor's numel elements (param dtype for PARAM, fp32 otherwise); only
   the range this rank holds is written and returned in *out_range (offset and numel within
   the tensor): MASTER, M and V: the tensor's intersection with this rank's shard (at every
   stage, stage 0 included); PARAM: the whole tensor at stages 0-2 and for persistent
   groups, the shard intersection otherwise. Local, synchronous (waits for the device). */
ZERODEF zero_result zero_engine_read_tensor(zero_engine *e, int tensor, zero_state_kind kind,
                                            void *host_dst, zero_range *out_range);

/* COLLECTIVE at stage 3. Makes group g's parameters available and returns a device pointer
   to its flat buffer (param dtype, group numel elements; tensor t at zero_plan_tensor's
   offset). Stage 3: all-gathers the group into a gather-pool slot unless it is already
   gathered or persistent, then prefetches up to prefetch_depth groups in the current
   direction (ascending in forward; descending once gradients were requested in this
   micro-step or when g does not exceed the previous group gathered) while slots are free.
   Stages 0-2: the whole param buffer, no communication. Gathers are counted: each needs a
   matching zero_engine_release(). Errors: NOT_FOUND for an unknown group; INVALID_STATE
   before commit or when the pool is full of groups in use (release some first). */
ZERODEF zero_result zero_engine_gather(zero_engine *e, int group, void **out_params);

/* Ends one use of group g's parameters. Stage 3: when the count drops to zero the slot is
   returned to the pool (after the compute work already enqueued). Persistent groups stay.
   Errors: NOT_FOUND; INVALID_STATE when g is not gathered (released twice). */
ZERODEF zero_result zero_engine_release(zero_engine *e, int group);

/* COLLECTIVE at stage 3 (a prefetch is an all-gather). Starts gathering group g ahead of
   use if it is not gathered and a slot is free; does nothing otherwise (a hint, not a
   reference: no release needed). Stages 0-2: nothing. */
ZERODEF zero_result zero_engine_prefetch(zero_engine *e, int group);

/* COLLECTIVE at stages 2-3 (when every bucket slot is taken it first reduces the ready
   groups still pending). The buffer for this micro-step's gradients of group g (param
   dtype, group numel elements, tensor layout as in gather), zero-filled. Stages 0-1: a
   slice of the whole gradient buffer; stages 2-3: a slot of the bucket pool. Calling it again before
   grads_ready returns the same buffer unchanged. Errors: NOT_FOUND; INVALID_STATE before
   commit, when g is already ready in this micro-step, when the step's micro-steps are all
   done, or (stages 2-3) when every bucket slot is held by groups not yet ready. */
ZERODEF zero_result zero_engine_grads(zero_engine *e, int group, void **out_grads);

/* COLLECTIVE. Group g's gradients for this micro-step are written (by work enqueued on the
   compute queue before this call). Its reduction starts (or joins the pending bucket);
   once every group is ready the micro-step is complete. The buffer must not be touched
   afterwards. Errors: NOT_FOUND; INVALID_STATE when zero_engine_grads(g) was not called in
   this micro-step, or g is already ready; COMM/DEVICE (engine broken). */
ZERODEF zero_result zero_engine_grads_ready(zero_engine *e, int group);

/* COLLECTIVE. The optimizer step, after exactly accum_steps complete micro-steps:
   unscale, inf/NaN check agreed by all ranks (skip together), global norm, clip,
   Adam/AdamW on this rank's shard (stage 0: on everything), all-gather of the updated
   params (stages 1-2; stage 3: persistent groups), loss-scaler update. Stage 3 drops
   prefetched groups (their values are stale). info may be NULL.
   Errors (nothing changed, engine usable): INVALID_STATE before commit, before any
   gradient, after a number of micro-steps other than accum_steps, or while a group is
   still gathered (release every group first). COMM/DEVICE: engine broken. */
ZERODEF zero_result zero_engine_step(zero_engine *e, zero_step_info *info);

/* The scale to multiply the loss by in this step's micro-steps (1 without scaling). */
ZERODEF float zero_engine_loss_scale(const zero_engine *e);

/* Optimizer steps taken (skipped steps not counted). */
ZERODEF int64_t zero_engine_step_count(const zero_engine *e);

/* The info of the last completed step (all zero before the first), waiting for it when it
   was enqueued with async_step and info NULL. Errors: INVALID_ARGUMENT (NULL), the
   device's (engine broken). */
ZERODEF zero_result zero_engine_last_step(zero_engine *e, zero_step_info *info);

/* Changes the learning rate from the next step on (schedules). INVALID_ARGUMENT for a
   negative or non-finite lr. */
ZERODEF zero_result zero_engine_set_lr(zero_engine *e, float lr);

/* Device bytes held by this rank's engine, by category, now and at peak. */
ZERODEF zero_result zero_engine_memory_usage(const zero_engine *e, zero_engine_memory *out);

/* Traffic of the last step (from the end of the previous step(), or commit, to the end of
   the last step(); may be NULL) and since commit (may be NULL). Commit's hash check counts
   in the total only. */
ZERODEF zero_result zero_engine_traffic(const zero_engine *e, zero_traffic *last_step,
                                        zero_traffic *total);

/* Elements moved over payload kinds (everything but ZERO_COLL_CONTROL). */
ZERODEF double zero_traffic_payload_numel(const zero_traffic *t);

/* Stage 3 gather-pool accounting. */
ZERODEF zero_result zero_engine_gather_stats(const zero_engine *e, zero_gather_stats *out);

/* "all_gather", "reduce_scatter", "all_reduce", "broadcast", "control" or "?". */
ZERODEF const char *zero_coll_name(zero_coll kind);

#ifdef __cplusplus
}
#endif

#endif /* ZERO_H */

/* ======================================================================================
   IMPLEMENTATION
   ====================================================================================== */
#if defined(ZERO_IMPLEMENTATION) && !defined(ZERO_IMPLEMENTATION_DONE)
#define ZERO_IMPLEMENTATION_DONE

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ZERO_STATIC) && defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-function" /* a TU may use only part of the API */
#endif

#if defined(__cplusplus) && __cplusplus >= 201103L
#define ZERO__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define ZERO__THREAD_LOCAL _Thread_local
#elif defined(_MSC_VER)
#define ZERO__THREAD_LOCAL __declspec(thread)
#else
#define ZERO__THREAD_LOCAL __thread
#endif

/* ---- results ---- */

static ZERO__THREAD_LOCAL char zero__error_text[512];

ZERODEF const char *zero_result_string(zero_result result)
{
    switch (result) {
    case ZERO_OK: return "ok";
    case ZERO_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case ZERO_ERROR_OUT_OF_MEMORY: return "out of memory";
    case ZERO_ERROR_INVALID_STATE: return "invalid state";
    case ZERO_ERROR_NOT_FOUND: return "not found";
    case ZERO_ERROR_OVERFLOW: return "size overflow";
    case ZERO_ERROR_MISMATCH: return "ranks disagree";
    case ZERO_ERROR_DEVICE: return "device error";
    case ZERO_ERROR_COMM: return "communication error";
    case ZERO_ERROR_TIMEOUT: return "timeout";
    case ZERO_ERROR_IO: return "i/o error";
    case ZERO_ERROR_UNSUPPORTED: return "unsupported";
    }
    return "unknown result";
}

ZERODEF const char *zero_last_error(void) { return zero__error_text; }

ZERODEF void zero_clear_error(void) { zero__error_text[0] = '\0'; }

/* Records the detail of an error for zero_last_error() and returns 'result', so that
   error paths read: return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "world = %d", w); */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static zero_result zero__fail(zero_result result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(zero__error_text, sizeof zero__error_text, fmt, ap);
    va_end(ap);
    return result;
}

/* ---- memory ---- */

#ifndef ZERO_MALLOC
#define ZERO_MALLOC(sz) malloc(sz)
#define ZERO_FREE(p) free(p)
#endif

/* Allocates through 'a' when it has hooks, else ZERO_MALLOC. NULL on failure or 0 bytes. */
static void *zero__alloc(const zero_allocator *a, size_t bytes)
{
    if (bytes == 0) return NULL;
    if (a && a->alloc) return a->alloc(bytes, a->user);
    return ZERO_MALLOC(bytes);
}

static void zero__free(const zero_allocator *a, void *ptr)
{
    if (!ptr) return;
    if (a && a->alloc) {
        if (a->free) a->free(ptr, a->user);
        return;
    }
    ZERO_FREE(ptr);
}

/* n * size without overflow: returns 0 and sets *out, or -1 on overflow. */
static int zero__mul_size(size_t n, size_t size, size_t *out)
{
    if (size != 0 && n > (size_t)-1 / size) return -1;
    *out = n * size;
    return 0;
}

static int zero__add_size(size_t a, size_t b, size_t *out)
{
    if (a > (size_t)-1 - b) return -1;
    *out = a + b;
    return 0;
}

ZERODEF size_t zero_dtype_size(zero_dtype dtype)
{
    switch (dtype) {
    case ZERO_F32: return 4;
    case ZERO_F16: return 2;
    case ZERO_BF16: return 2;
    case ZERO_F64: return 8;
    case ZERO_DTYPE_DEFAULT: break;
    }
    return 0;
}

ZERODEF const char *zero_dtype_name(zero_dtype dtype)
{
    switch (dtype) {
    case ZERO_F32: return "f32";
    case ZERO_F16: return "f16";
    case ZERO_BF16: return "bf16";
    case ZERO_F64: return "f64";
    case ZERO_DTYPE_DEFAULT: break;
    }
    return "?";
}

ZERODEF const char *zero_mem_category_name(zero_mem_category category)
{
    static const char *names[ZERO_MEM_COUNT] = {"param", "grad", "master", "moment1",
                                                "moment2", "bucket", "gather", "scratch"};
    if ((int)category < 0 || category >= ZERO_MEM_COUNT) return "?";
    return names[category];
}

/* Conversion implementation: SIMD detection, scalar fp32 <-> fp16 /
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

/* ---- scalar conversions on bit patterns (ZERO_HOSTDEV: zero_cuda.h's kernels call them) ---- */

/* fp32 -> fp16, round to nearest even. */
static inline ZERO_HOSTDEV uint16_t zero__f32_to_f16_bits(uint32_t x)
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
static inline ZERO_HOSTDEV uint32_t zero__f16_to_f32_bits(uint16_t h)
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
static inline ZERO_HOSTDEV uint16_t zero__f32_to_bf16_bits(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact; a NaN becomes quiet. */
static inline ZERO_HOSTDEV uint32_t zero__bf16_to_f32_bits(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
    return x;
}

/* fp32 -> fp64 bits, exact; a NaN becomes quiet. */
static inline ZERO_HOSTDEV uint64_t zero__f32_to_f64_bits(uint32_t x)
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
static inline ZERO_HOSTDEV uint32_t zero__f64_narrow_bits(uint64_t x, unsigned ebits, unsigned mbits)
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
/* Plan implementation.

   Tensors live in one array in registration order; a hash table of names (open addressing,
   linear probing, at most half full) makes zero_plan_add's duplicate check and
   zero_plan_find O(1). Commit builds every group's layout into fresh arrays and installs
   them only when all of it succeeded, so a failed commit changes nothing. */

#define ZERO__PLAN_MAX_NAME 255
#define ZERO__PLAN_MAX_TENSORS 0x3ffffffe /* ids and id + 1 fit an int with room to spare */

typedef struct zero__plan_tensor {
    char *name;
    size_t name_len;
    uint64_t name_hash;
    size_t numel;
    int group;
    size_t offset; /* set by commit */
} zero__plan_tensor;

typedef struct zero__plan_group {
    size_t numel;
    size_t used_numel;
    size_t shard_numel;
    int first;          /* index into group_tensors */
    int num_tensors;
    int persistent;
} zero__plan_group;

struct zero_plan {
    zero_allocator alloc;
    zero__plan_tensor *tensors;
    int num_tensors;
    int cap_tensors;
    int *table;          /* tensor id + 1, 0 = empty; table_cap is a power of two */
    size_t table_cap;
    /* set by a successful commit */
    int committed;
    int world;
    size_t align;
    size_t persist;
    int num_groups;
    zero__plan_group *groups;
    int *group_tensors;  /* tensor ids, group by group, registration order within each */
    size_t total_numel;
    uint64_t hash;
};

#define ZERO__FNV_OFFSET 0xcbf29ce484222325ull
#define ZERO__FNV_PRIME 0x100000001b3ull

static uint64_t zero__fnv1a(uint64_t h, const void *data, size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= ZERO__FNV_PRIME;
    }
    return h;
}

/* Hashes v as 8 little-endian bytes, whatever the host's byte order and size_t width. */
static uint64_t zero__fnv1a_u64(uint64_t h, uint64_t v)
{
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return zero__fnv1a(h, b, 8);
}

/* The slot holding 'name' in the table, or the empty slot where it would go. */
static size_t zero__plan_slot(const zero_plan *plan, const char *name, size_t len, uint64_t h)
{
    size_t mask = plan->table_cap - 1, i = (size_t)h & mask;
    for (;;) {
        int id = plan->table[i];
        if (id == 0) return i;
        {
            const zero__plan_tensor *t = &plan->tensors[id - 1];
            if (t->name_hash == h && t->name_len == len && memcmp(t->name, name, len) == 0)
                return i;
        }
        i = (i + 1) & mask;
    }
}

ZERODEF zero_result zero_plan_create(zero_plan **out, const zero_allocator *allocator)
{
    zero_plan *plan;
    zero_allocator a = {NULL, NULL, NULL};
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_create: out is NULL");
    *out = NULL;
    if (allocator) a = *allocator;
    plan = (zero_plan *)zero__alloc(&a, sizeof *plan);
    if (!plan)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_create: %zu bytes",
                          sizeof *plan);
    memset(plan, 0, sizeof *plan);
    plan->alloc = a;
    *out = plan;
    return ZERO_OK;
}

ZERODEF void zero_plan_destroy(zero_plan *plan)
{
    int i;
    zero_allocator a;
    if (!plan) return;
    a = plan->alloc;
    for (i = 0; i < plan->num_tensors; i++) zero__free(&a, plan->tensors[i].name);
    zero__free(&a, plan->tensors);
    zero__free(&a, plan->table);
    zero__free(&a, plan->groups);
    zero__free(&a, plan->group_tensors);
    zero__free(&a, plan);
}

/* Grows the name table to new_cap slots (a power of two), rehashing every tensor. */
static zero_result zero__plan_rehash(zero_plan *plan, size_t new_cap)
{
    size_t bytes, i, mask = new_cap - 1;
    int *table;
    int id;
    if (zero__mul_size(new_cap, sizeof(int), &bytes))
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: name table of %zu slots",
                          new_cap);
    table = (int *)zero__alloc(&plan->alloc, bytes);
    if (!table)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: name table of %zu bytes",
                          bytes);
    memset(table, 0, bytes);
    for (id = 0; id < plan->num_tensors; id++) {
        i = (size_t)plan->tensors[id].name_hash & mask;
        while (table[i] != 0) i = (i + 1) & mask;
        table[i] = id + 1;
    }
    zero__free(&plan->alloc, plan->table);
    plan->table = table;
    plan->table_cap = new_cap;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_add(zero_plan *plan, const char *name, size_t numel, int group,
                                  int *out_tensor)
{
    size_t len = 0, slot;
    uint64_t h;
    char *copy;
    zero_result r;
    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: plan is NULL");
    if (plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_plan_add: the plan is committed; add tensors before commit");
    if (!name) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: name is NULL");
    while (len <= ZERO__PLAN_MAX_NAME && name[len] != '\0') len++;
    if (len == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: name is empty");
    if (len > ZERO__PLAN_MAX_NAME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: name \"%.32s...\" is longer than %d bytes", name,
                          ZERO__PLAN_MAX_NAME);
    if (numel == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: tensor \"%s\": numel = 0",
                          name);
    if (group < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: tensor \"%s\": group = %d (must be >= 0)", name, group);
    h = zero__fnv1a(ZERO__FNV_OFFSET, name, len);
    if (plan->table_cap != 0 && plan->table[zero__plan_slot(plan, name, len, h)] != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: tensor name \"%s\" is already registered", name);
    if (plan->num_tensors == ZERO__PLAN_MAX_TENSORS)
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: too many tensors (%d)",
                          plan->num_tensors);
    /* Grow the tensor array and the table first: a failure leaves the plan as it was
       (bigger arrays, same contents). */
    if (plan->num_tensors == plan->cap_tensors) {
        int cap = plan->cap_tensors == 0                             ? 16
                  : plan->cap_tensors > ZERO__PLAN_MAX_TENSORS / 2 ? ZERO__PLAN_MAX_TENSORS
                                                                   : plan->cap_tensors * 2;
        zero__plan_tensor *grown;
        size_t bytes;
        if (zero__mul_size((size_t)cap, sizeof *grown, &bytes))
            return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: %d tensors", cap);
        grown = (zero__plan_tensor *)zero__alloc(&plan->alloc, bytes);
        if (!grown)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: %zu bytes", bytes);
        if (plan->num_tensors)
            memcpy(grown, plan->tensors, (size_t)plan->num_tensors * sizeof *grown);
        zero__free(&plan->alloc, plan->tensors);
        plan->tensors = grown;
        plan->cap_tensors = cap;
    }
    if ((size_t)(plan->num_tensors + 1) * 2 > plan->table_cap) {
        r = zero__plan_rehash(plan, plan->table_cap ? plan->table_cap * 2 : 64);
        if (r != ZERO_OK) return r;
    }
    copy = (char *)zero__alloc(&plan->alloc, len + 1);
    if (!copy) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: %zu bytes", len + 1);
    memcpy(copy, name, len + 1);
    slot = zero__plan_slot(plan, name, len, h);
    {
        zero__plan_tensor *t = &plan->tensors[plan->num_tensors];
        t->name = copy;
        t->name_len = len;
        t->name_hash = h;
        t->numel = numel;
        t->group = group;
        t->offset = 0;
    }
    plan->table[slot] = plan->num_tensors + 1;
    if (out_tensor) *out_tensor = plan->num_tensors;
    plan->num_tensors++;
    return ZERO_OK;
}

/* x rounded up to a multiple of a (a > 0); -1 on overflow. */
static int zero__round_up(size_t x, size_t a, size_t *out)
{
    size_t rem = x % a;
    if (rem == 0) {
        *out = x;
        return 0;
    }
    return zero__add_size(x, a - rem, out);
}

ZERODEF zero_result zero_plan_commit(zero_plan *plan, int world, size_t align_numel,
                                     size_t persist_numel)
{
    int ntensors, ngroups, max_group = -1, i, g;
    size_t unit, bytes, total = 0, count_len;
    int *counts = NULL, *ids = NULL;
    size_t *offsets = NULL;
    zero__plan_group *groups = NULL;
    uint64_t h;
    zero_result r = ZERO_OK;

    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_commit: plan is NULL");
    if (plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_plan_commit: already committed");
    if (world <= 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_commit: world = %d (must be >= 1)", world);
    if (align_numel == 0) align_numel = ZERO_DEFAULT_ALIGN_NUMEL;
    ntensors = plan->num_tensors;
    if (ntensors == 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_plan_commit: no tensors registered");
    if (zero__mul_size((size_t)world, align_numel, &unit))
        return zero__fail(ZERO_ERROR_OVERFLOW,
                          "zero_plan_commit: world (%d) * align_numel (%zu) overflows size_t",
                          world, align_numel);

    /* Group ids must be exactly 0..G-1. At most ntensors distinct ids exist, so a missing id,
       if any, is below ntensors + 1: counting that far finds the smallest. */
    for (i = 0; i < ntensors; i++)
        if (plan->tensors[i].group > max_group) max_group = plan->tensors[i].group;
    count_len = (size_t)max_group + 1;
    if (count_len > (size_t)ntensors + 1) count_len = (size_t)ntensors + 1;
    counts = (int *)zero__alloc(&plan->alloc, count_len * sizeof(int));
    if (!counts) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_commit: %zu bytes",
                       count_len * sizeof(int));
        goto done;
    }
    memset(counts, 0, count_len * sizeof(int));
    for (i = 0; i < ntensors; i++)
        if ((size_t)plan->tensors[i].group < count_len) counts[plan->tensors[i].group]++;
    for (g = 0; (size_t)g < count_len && g <= max_group; g++)
        if (counts[g] == 0) {
            r = zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                           "zero_plan_commit: group ids must be 0..G-1 each used: group %d has "
                           "no tensor (largest id %d)",
                           g, max_group);
            goto done;
        }
    ngroups = max_group + 1;

    /* Layout, into fresh arrays: tensor offsets, groups, the group -> tensors index. */
    if (zero__mul_size((size_t)ngroups, sizeof *groups, &bytes)) {
        r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_commit: %d groups", ngroups);
        goto done;
    }
    groups = (zero__plan_group *)zero__alloc(&plan->alloc, bytes);
    ids = (int *)zero__alloc(&plan->alloc, (size_t)ntensors * sizeof(int));
    offsets = (size_t *)zero__alloc(&plan->alloc, (size_t)ntensors * sizeof(size_t));
    if (!groups || !ids || !offsets) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_commit: layout of %d tensors",
                       ntensors);
        goto done;
    }
    memset(groups, 0, bytes);
    {
        int first = 0;
        for (g = 0; g < ngroups; g++) {
            groups[g].first = first;
            first += counts[g];
        }
    }
    for (i = 0; i < ntensors; i++) {
        const zero__plan_tensor *t = &plan->tensors[i];
        zero__plan_group *grp = &groups[t->group];
        size_t off, end;
        if (zero__round_up(grp->used_numel, align_numel, &off) ||
            zero__add_size(off, t->numel, &end)) {
            r = zero__fail(ZERO_ERROR_OVERFLOW,
                           "zero_plan_commit: group %d overflows size_t at tensor \"%s\" "
                           "(numel %zu)",
                           t->group, t->name, t->numel);
            goto done;
        }
        offsets[i] = off;
        grp->used_numel = end;
        ids[grp->first + grp->num_tensors++] = i;
    }
    for (g = 0; g < ngroups; g++) {
        zero__plan_group *grp = &groups[g];
        if (zero__round_up(grp->used_numel, unit, &grp->numel) ||
            zero__add_size(total, grp->numel, &total)) {
            r = zero__fail(ZERO_ERROR_OVERFLOW,
                           "zero_plan_commit: group %d (%zu elements) padded to a multiple of "
                           "%zu overflows size_t",
                           g, grp->used_numel, unit);
            goto done;
        }
        grp->shard_numel = grp->numel / (size_t)world;
        grp->persistent = grp->used_numel < persist_numel;
    }

    /* The hash: FNV-1a 64 over a canonical byte encoding (fixed-width little-endian
       integers, length-prefixed names), never over struct memory. */
    h = zero__fnv1a(ZERO__FNV_OFFSET, "zero-plan-v1", 12);
    h = zero__fnv1a_u64(h, (uint64_t)world);
    h = zero__fnv1a_u64(h, (uint64_t)align_numel);
    h = zero__fnv1a_u64(h, (uint64_t)ntensors);
    for (i = 0; i < ntensors; i++) {
        const zero__plan_tensor *t = &plan->tensors[i];
        h = zero__fnv1a_u64(h, (uint64_t)t->name_len);
        h = zero__fnv1a(h, t->name, t->name_len);
        h = zero__fnv1a_u64(h, (uint64_t)t->numel);
        h = zero__fnv1a_u64(h, (uint64_t)t->group);
    }
    h = zero__fnv1a_u64(h, (uint64_t)ngroups);
    for (g = 0; g < ngroups; g++) h = zero__fnv1a_u64(h, (uint64_t)groups[g].persistent);
    if (h == 0) h = 1; /* 0 means "not committed" */

    /* Install. Nothing below can fail. */
    for (i = 0; i < ntensors; i++) plan->tensors[i].offset = offsets[i];
    plan->groups = groups;
    plan->group_tensors = ids;
    groups = NULL;
    ids = NULL;
    plan->num_groups = ngroups;
    plan->world = world;
    plan->align = align_numel;
    plan->persist = persist_numel;
    plan->total_numel = total;
    plan->hash = h;
    plan->committed = 1;

done:
    zero__free(&plan->alloc, counts);
    zero__free(&plan->alloc, offsets);
    zero__free(&plan->alloc, groups);
    zero__free(&plan->alloc, ids);
    return r;
}

ZERODEF int zero_plan_is_committed(const zero_plan *plan) { return plan && plan->committed; }
ZERODEF int zero_plan_world(const zero_plan *plan) { return plan ? plan->world : 0; }
ZERODEF int zero_plan_num_groups(const zero_plan *plan) { return plan ? plan->num_groups : 0; }
ZERODEF int zero_plan_num_tensors(const zero_plan *plan) { return plan ? plan->num_tensors : 0; }
ZERODEF size_t zero_plan_total_numel(const zero_plan *plan)
{
    return plan ? plan->total_numel : 0;
}
ZERODEF size_t zero_plan_align(const zero_plan *plan) { return plan ? plan->align : 0; }
ZERODEF uint64_t zero_plan_hash(const zero_plan *plan) { return plan ? plan->hash : 0; }

/* The common checks of the queries. */
static zero_result zero__plan_query(const zero_plan *plan, const void *out, const char *fn)
{
    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: plan is NULL", fn);
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: the plan is not committed", fn);
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_group(const zero_plan *plan, int group, zero_group_info *out)
{
    const zero__plan_group *g;
    zero_result r = zero__plan_query(plan, out, "zero_plan_group");
    if (r != ZERO_OK) return r;
    if (group < 0 || group >= plan->num_groups)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_group: group %d (the plan has %d)",
                          group, plan->num_groups);
    g = &plan->groups[group];
    out->numel = g->numel;
    out->used_numel = g->used_numel;
    out->shard_numel = g->shard_numel;
    out->tensors = plan->group_tensors + g->first;
    out->num_tensors = g->num_tensors;
    out->persistent = g->persistent;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_tensor(const zero_plan *plan, int tensor, zero_tensor_info *out)
{
    const zero__plan_tensor *t;
    zero_result r = zero__plan_query(plan, out, "zero_plan_tensor");
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= plan->num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_tensor: tensor %d (the plan has %d)",
                          tensor, plan->num_tensors);
    t = &plan->tensors[tensor];
    out->name = t->name;
    out->group = t->group;
    out->offset = t->offset;
    out->numel = t->numel;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_find(const zero_plan *plan, const char *name, int *out_tensor)
{
    size_t len = 0;
    int id;
    zero_result r = zero__plan_query(plan, out_tensor, "zero_plan_find");
    if (r != ZERO_OK) return r;
    if (!name) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_find: name is NULL");
    while (len <= ZERO__PLAN_MAX_NAME && name[len] != '\0') len++;
    id = 0;
    if (len >= 1 && len <= ZERO__PLAN_MAX_NAME)
        id = plan->table[zero__plan_slot(plan, name, len,
                                         zero__fnv1a(ZERO__FNV_OFFSET, name, len))];
    if (id == 0)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_find: no tensor named \"%.64s\"",
                          name);
    *out_tensor = id - 1;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_shard(const zero_plan *plan, int group, int rank, zero_range *out)
{
    const zero__plan_group *g;
    zero_result r = zero__plan_query(plan, out, "zero_plan_shard");
    if (r != ZERO_OK) return r;
    if (group < 0 || group >= plan->num_groups)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_shard: group %d (the plan has %d)",
                          group, plan->num_groups);
    if (rank < 0 || rank >= plan->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_shard: rank %d outside 0..%d", rank, plan->world - 1);
    g = &plan->groups[group];
    out->offset = (size_t)rank * g->shard_numel;
    out->numel = g->shard_numel;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_intersect(const zero_plan *plan, int tensor, int rank,
                                        zero_range *out)
{
    const zero__plan_tensor *t;
    size_t s0, s1, t0, t1, lo, hi;
    zero_result r = zero__plan_query(plan, out, "zero_plan_intersect");
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= plan->num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND,
                          "zero_plan_intersect: tensor %d (the plan has %d)", tensor,
                          plan->num_tensors);
    if (rank < 0 || rank >= plan->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_intersect: rank %d outside 0..%d", rank, plan->world - 1);
    t = &plan->tensors[tensor];
    s0 = (size_t)rank * plan->groups[t->group].shard_numel;
    s1 = s0 + plan->groups[t->group].shard_numel;
    t0 = t->offset;
    t1 = t0 + t->numel;
    lo = s0 > t0 ? s0 : t0;
    hi = s1 < t1 ? s1 : t1;
    if (lo < hi) {
        out->offset = lo;
        out->numel = hi - lo;
    } else {
        /* Empty: the offset is the shard start clamped into the tensor, so that
           out->offset - tensor offset stays within 0..numel and grows with the rank. */
        out->offset = s0 < t0 ? t0 : (s0 > t1 ? t1 : s0);
        out->numel = 0;
    }
    return ZERO_OK;
}
/* Estimator implementation: see the estimator declarations and docs/estimator.md. */

/* a * b and a + b in 64 bits; -1 on overflow. */
static int zero__mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b != 0 && a > UINT64_MAX / b) return -1;
    *out = a * b;
    return 0;
}

static int zero__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a > UINT64_MAX - b) return -1;
    *out = a + b;
    return 0;
}

/* A non-negative double truncated to an integer as Python's int() does, if it fits. */
static int zero__trunc_u64(double x, uint64_t *out)
{
    if (!(x >= 0.0) || x >= 18446744073709551616.0) return -1;
    *out = (uint64_t)x;
    return 0;
}

/* Validates desc and fills the defaults into *r. check_params: 0 for the inverse. */
static zero_result zero__estimate_resolve(const zero_estimate_desc *desc, zero_estimate_desc *r,
                                          int check_params)
{
    const char *fn = check_params ? "zero_estimate_compute" : "zero_estimate_max_params";
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    *r = *desc;
    if (r->mode == ZERO_ESTIMATE_DEFAULT) r->mode = ZERO_ESTIMATE_PAPER;
    if (r->mode != ZERO_ESTIMATE_PAPER && r->mode != ZERO_ESTIMATE_DEEPSPEED)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: mode = %d", fn, (int)desc->mode);
    if (check_params && (r->params == 0 || r->params > ZERO_ESTIMATE_MAX_PARAMS))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: params = %llu (want 1..2^53)", fn,
                          (unsigned long long)r->params);
    if (r->ranks < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: ranks = %d (want >= 1)", fn, r->ranks);
    if (r->stage < 0 || r->stage > 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: stage = %d (want 0..3)", fn, r->stage);
    if (r->param_bytes < 0 || r->param_bytes > 1024 || r->grad_bytes < 0 || r->grad_bytes > 1024 ||
        r->optimizer_bytes < 0 || r->optimizer_bytes > 1024)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: param_bytes = %d, grad_bytes = %d, optimizer_bytes = %d (want 0..1024)",
                          fn, r->param_bytes, r->grad_bytes, r->optimizer_bytes);
    if (r->param_bytes == 0) r->param_bytes = 2;
    if (r->grad_bytes == 0) r->grad_bytes = 2;
    if (r->optimizer_bytes == 0) r->optimizer_bytes = 12;
    if (r->gpus_per_node < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: gpus_per_node = %d", fn, r->gpus_per_node);
    if (r->gpus_per_node == 0) r->gpus_per_node = 1;
    if (r->ranks % r->gpus_per_node != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: gpus_per_node = %d does not divide ranks = %d", fn,
                          r->gpus_per_node, r->ranks);
    if (r->additional_buffer_factor != r->additional_buffer_factor || r->additional_buffer_factor < 0.0 ||
        r->additional_buffer_factor > 1e300)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: additional_buffer_factor = %g", fn,
                          r->additional_buffer_factor);
    if (r->additional_buffer_factor == 0.0) r->additional_buffer_factor = 1.5;
    r->offload = r->offload != 0;
    r->offload_params = r->offload_params != 0;
    r->no_zero_init = r->no_zero_init != 0;
    if (r->offload_params && !(r->mode == ZERO_ESTIMATE_DEEPSPEED && r->stage == 3 && r->offload))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_params needs DeepSpeed mode, stage 3 and offload", fn);
    if (r->mode == ZERO_ESTIMATE_DEEPSPEED) {
        if (r->stage < 2)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: stage = %d: DeepSpeed's estimators cover stages 2 and 3", fn,
                              r->stage);
        if (r->stage == 3) {
            if (r->largest_layer_params == 0)
                return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                                  "%s: largest_layer_params is required for DeepSpeed stage 3", fn);
            if (check_params && r->largest_layer_params > r->params)
                return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                                  "%s: largest_layer_params = %llu exceeds params = %llu", fn,
                                  (unsigned long long)r->largest_layer_params,
                                  (unsigned long long)r->params);
            if (r->largest_layer_params > ZERO_ESTIMATE_MAX_PARAMS)
                return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: largest_layer_params = %llu",
                                  fn, (unsigned long long)r->largest_layer_params);
        }
    }
    return ZERO_OK;
}

/* Paper mode: the device categories and host bytes of Psi = p. -1 on overflow. */
static int zero__estimate_paper(const zero_estimate_desc *r, uint64_t p, zero_estimate *e)
{
    uint64_t n = (uint64_t)r->ranks, shard = p / n + (p % n != 0); /* ceil(Psi / N) */
    uint64_t pn = r->stage >= 3 ? shard : p;                       /* params kept   */
    uint64_t gn = r->stage >= 2 ? shard : p;                       /* grads kept    */
    uint64_t on = r->stage >= 1 ? shard : p;                       /* optimizer kept */
    uint64_t opt, sum;
    if (zero__mul_u64(pn, (uint64_t)r->param_bytes, &e->params_bytes) ||
        zero__mul_u64(gn, (uint64_t)r->grad_bytes, &e->grads_bytes) ||
        zero__mul_u64(on, (uint64_t)r->optimizer_bytes, &opt))
        return -1;
    e->optimizer_bytes = r->offload ? 0 : opt;
    e->host_bytes = r->offload ? opt : 0;
    if (zero__add_u64(e->params_bytes, e->grads_bytes, &sum) ||
        zero__add_u64(sum, e->optimizer_bytes, &e->device_bytes))
        return -1;
    e->gather_bytes = 0;
    return 0;
}

/* DeepSpeed's gpu_mem for Psi = p (integer arithmetic: int(18 * p / N) is the exact floor).
   -1 on overflow. */
static int zero__estimate_ds_gpu(const zero_estimate_desc *r, uint64_t p, uint64_t *gpu,
                                 uint64_t *gather)
{
    uint64_t n = (uint64_t)r->ranks, t, u;
    *gather = 0;
    if (r->stage == 2) {
        if (zero__mul_u64(p, 2, &t)) return -1;
        if (r->offload) { /* 2 = fp16 params; everything else is on the CPU */
            *gpu = t;
            return 0;
        }
        /* 2 fp16 params + 18/N (2 fp16 grads, 4 fp32 grads, 4 fp32 params, 8 Adam m + v) */
        if (zero__mul_u64(p, 18, &u)) return -1;
        return zero__add_u64(t, u / n, gpu);
    }
    /* stage 3: largest_layer_memory = 4 * largest layer (fp16 params gathered + fp16 grads) */
    if (zero__mul_u64(r->largest_layer_params, 4, gather)) return -1;
    if (r->offload && r->offload_params) {
        *gpu = *gather;
        return 0;
    }
    if (zero__mul_u64(p, r->offload ? 2 : 18, &u)) return -1;
    return zero__add_u64(*gather, u / n, gpu);
}

/* DeepSpeed's cpu_mem (per node), evaluated in double in DeepSpeed's own order so that the
   result is the same double Python computes, then truncated. -1 on overflow. */
static int zero__estimate_ds_cpu(const zero_estimate_desc *r, uint64_t p, uint64_t *cpu)
{
    uint64_t gpn = (uint64_t)r->gpus_per_node, nodes = (uint64_t)(r->ranks / r->gpus_per_node);
    uint64_t total_gpus = (uint64_t)r->ranks, prod;
    double abf = r->additional_buffer_factor, gf = 1.0 / (double)nodes, x;
    if (r->stage == 2) {
        if (r->offload) { /* total_params * max(4 * total_gpus, 16) * abf */
            uint64_t m = 4 * total_gpus > 16 ? 4 * total_gpus : 16;
            if (zero__mul_u64(p, m, &prod)) return -1;
        } else { /* total_params * 4 * num_gpus_per_node * abf */
            if (zero__mul_u64(p, 4 * gpn, &prod)) return -1;
        }
        return zero__trunc_u64((double)prod * abf, cpu);
    }
    if (r->offload) {
        double f = (r->offload_params ? 18.0 : 16.0) * gf; /* 18 (or 16) * gpus_factor */
        if (!r->no_zero_init) { /* total_params * 18 * gpus_factor * abf */
            if (zero__mul_u64(p, r->offload_params ? 18 : 16, &prod)) return -1;
            x = (double)prod * gf * abf;
        } else if (f > (double)(4 * gpn)) { /* max() returns its first argument on ties */
            x = (double)p * f * abf;
        } else {
            if (zero__mul_u64(p, 4 * gpn, &prod)) return -1;
            x = (double)prod * abf;
        }
        return zero__trunc_u64(x, cpu);
    }
    /* no offload: the model is first built on the CPU (fp32, 4 bytes), per GPU of the node;
       with zero.Init only the largest layer at a time */
    if (zero__mul_u64(r->no_zero_init ? p : r->largest_layer_params, 4 * gpn, &prod)) return -1;
    return zero__trunc_u64((double)prod * abf, cpu);
}

/* All of the estimate of Psi = p into *e (desc already resolved). -1 on overflow. */
static int zero__estimate_all(const zero_estimate_desc *r, uint64_t p, zero_estimate *e)
{
    memset(e, 0, sizeof *e);
    e->mode = r->mode;
    e->stage = r->stage;
    e->ranks = r->ranks;
    e->params = p;
    if (r->mode == ZERO_ESTIMATE_PAPER) return zero__estimate_paper(r, p, e);
    if (zero__estimate_ds_gpu(r, p, &e->device_bytes, &e->gather_bytes)) return -1;
    return zero__estimate_ds_cpu(r, p, &e->host_bytes);
}

/* The inverse's predicate: Psi = p is computable and its device bytes fit. Monotone: once
   false it stays false as p grows (every byte count is non-decreasing in p). */
static int zero__estimate_fits(const zero_estimate_desc *r, uint64_t p, uint64_t memory)
{
    zero_estimate e;
    return zero__estimate_all(r, p, &e) == 0 && e.device_bytes <= memory;
}

ZERODEF zero_result zero_estimate_compute(const zero_estimate_desc *desc, zero_estimate *out)
{
    zero_estimate_desc r;
    zero_estimate e;
    zero_result res;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_estimate_compute: out is NULL");
    res = zero__estimate_resolve(desc, &r, 1);
    if (res != ZERO_OK) return res;
    if (zero__estimate_all(&r, r.params, &e))
        return zero__fail(ZERO_ERROR_OVERFLOW,
                          "zero_estimate_compute: the bytes of %llu params overflow 64 bits",
                          (unsigned long long)r.params);
    *out = e;
    return ZERO_OK;
}

ZERODEF zero_result zero_estimate_max_params(const zero_estimate_desc *desc,
                                             uint64_t device_memory, uint64_t *out)
{
    zero_estimate_desc r;
    zero_result res;
    uint64_t lo, hi;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_estimate_max_params: out is NULL");
    res = zero__estimate_resolve(desc, &r, 0);
    if (res != ZERO_OK) return res;
    /* the smallest model: one parameter, or (DeepSpeed stage 3) the largest layer alone */
    lo = r.mode == ZERO_ESTIMATE_DEEPSPEED && r.stage == 3 ? r.largest_layer_params : 1;
    if (!zero__estimate_fits(&r, lo, device_memory)) {
        *out = 0;
        return ZERO_OK;
    }
    hi = ZERO_ESTIMATE_MAX_PARAMS;
    if (zero__estimate_fits(&r, hi, device_memory)) {
        *out = hi;
        return ZERO_OK;
    }
    while (hi - lo > 1) { /* fits(lo) and not fits(hi) */
        uint64_t mid = lo + (hi - lo) / 2;
        if (zero__estimate_fits(&r, mid, device_memory)) lo = mid;
        else hi = mid;
    }
    *out = lo;
    return ZERO_OK;
}
/* Local comm implementation: N ranks as threads, one mutex and one
   condition variable per group.

   A collective is a sequence of sync points (a generation barrier). At the first, every rank
   posts its call (kind, numel, dtype, op, root, buffers) and the last rank to arrive checks
   that all posts agree, so every rank reads the same verdict. Between two sync points the
   ranks read each other's buffers without the lock (a "data phase"; the mutex hand-offs at
   the sync points order those reads after the posts and before the buffers are reused):

       barrier         post
       all_gather      post, copy every block, end
       reduce_scatter  post, reduce block 'rank' of every send, end
       broadcast       post, copy from the root, end
       all_reduce      post, reduce slice 'rank' into recv, mid, copy the other slices
                       from their owners' recv, end

   so every output element is reduced exactly once, and in-place calls are safe (a rank only
   writes what no peer reads in the same phase). Posts are double-buffered by the parity of
   the collective's sequence number: a rank can post call k+1 while a peer still reads the
   posts of call k, and cannot post k+2 before every peer has arrived at k+1.

   Failure: a wait that passes its deadline, zero_local_abort() or a destroyed comm breaks
   the group (broken != ZERO_OK, once, with a message); waiters wake and return that code,
   and later calls fail at once. 'active' counts the ranks inside a data phase; a rank leaves
   with an error only when it is 0, so no peer still reads a buffer its caller may free. */

#include <pthread.h>
#include <time.h>

enum {
    ZERO__LC_BARRIER = 1,
    ZERO__LC_ALL_GATHER,
    ZERO__LC_REDUCE_SCATTER,
    ZERO__LC_ALL_REDUCE,
    ZERO__LC_BROADCAST
};

enum { ZERO__SYNC_POST, ZERO__SYNC_MID, ZERO__SYNC_END };

/* Elements reduced per tile (fp32 / fp64 accumulators on the stack). */
#define ZERO__LOCAL_TILE 512

typedef struct zero__local_post {
    int kind;
    int bad; /* this rank's own arguments were invalid */
    zero_dtype dtype;
    zero_op op;
    int root;
    size_t numel;
    const void *send;
    void *recv;
} zero__local_post;

struct zero_local_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zero_allocator allocator;
    zero_simd simd; /* for the fp16/bf16 <-> fp32 tiles, resolved once */
    int world;
    int timeout_ms;
    int arrived;              /* ranks waiting at the current sync point                 */
    unsigned long long gen;   /* sync points completed                                   */
    int active;               /* ranks inside a data phase                               */
    zero_result broken;       /* ZERO_OK, or why every call now fails                    */
    char broken_msg[256];
    int live;                 /* comms alive                                             */
    int orphaned;             /* zero_local_group_destroy() was called                   */
    unsigned char *here;      /* [world]: arrived at the current sync point              */
    unsigned char *has_comm;  /* [world]                                                 */
    zero__local_post *posts;  /* [2][world]: by parity of the collective's sequence       */
    int verdict_ok[2];
    char verdict_msg[2][320];
};

typedef struct zero__local_comm {
    zero_comm base;
    zero_local_group *group;
    unsigned long long seq; /* collectives this rank has called */
    const void **srcs;      /* [world]: the inputs of one reduction */
} zero__local_comm;

static void zero__local_destroy(zero_comm *comm);

static const char *zero__local_kind_name(int kind)
{
    switch (kind) {
    case ZERO__LC_BARRIER: return "barrier";
    case ZERO__LC_ALL_GATHER: return "all_gather";
    case ZERO__LC_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO__LC_ALL_REDUCE: return "all_reduce";
    case ZERO__LC_BROADCAST: return "broadcast";
    }
    return "?";
}

/* "all_reduce(numel 10, f32, sum)" */
static void zero__local_describe(char *buf, size_t size, const zero__local_post *p)
{
    const char *name = zero__local_kind_name(p->kind);
    if (p->bad)
        snprintf(buf, size, "%s(invalid arguments)", name);
    else if (p->kind == ZERO__LC_BARRIER)
        snprintf(buf, size, "barrier()");
    else if (p->kind == ZERO__LC_BROADCAST)
        snprintf(buf, size, "broadcast(numel %zu, %s, root %d)", p->numel, zero_dtype_name(p->dtype),
                 p->root);
    else if (p->kind == ZERO__LC_ALL_GATHER)
        snprintf(buf, size, "all_gather(numel %zu, %s)", p->numel, zero_dtype_name(p->dtype));
    else
        snprintf(buf, size, "%s(numel %zu, %s, %s)", name, p->numel, zero_dtype_name(p->dtype),
                 p->op == ZERO_OP_MAX ? "max" : "sum");
}

static int zero__local_same(const zero__local_post *a, const zero__local_post *b)
{
    return !a->bad && !b->bad && a->kind == b->kind && a->numel == b->numel &&
           a->dtype == b->dtype && a->op == b->op && a->root == b->root;
}

/* Under the lock, by the last rank to post: do all posts of parity 'par' agree? */
static int zero__local_judge(zero_local_group *g, int par, unsigned long long seq)
{
    const zero__local_post *p = g->posts + (size_t)par * (size_t)g->world;
    char a[96], b[96];
    int r;
    for (r = 0; r < g->world; r++)
        if (p[r].bad) {
            snprintf(g->verdict_msg[par], sizeof g->verdict_msg[par],
                     "collective #%llu: rank %d passed invalid arguments to %s", seq, r,
                     zero__local_kind_name(p[r].kind));
            return 0;
        }
    for (r = 1; r < g->world; r++)
        if (!zero__local_same(&p[0], &p[r])) {
            zero__local_describe(a, sizeof a, &p[0]);
            zero__local_describe(b, sizeof b, &p[r]);
            snprintf(g->verdict_msg[par], sizeof g->verdict_msg[par],
                     "ranks disagree at collective #%llu: rank 0 called %s, rank %d called %s",
                     seq, a, r, b);
            return 0;
        }
    g->verdict_msg[par][0] = '\0';
    return 1;
}

/* Under the lock: breaks the group once (later causes are ignored) and wakes everyone. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void zero__local_break(zero_local_group *g, zero_result why, const char *fmt, ...)
{
    va_list ap;
    if (g->broken != ZERO_OK) return;
    g->broken = why;
    va_start(ap, fmt);
    vsnprintf(g->broken_msg, sizeof g->broken_msg, fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&g->cv); /* cannot fail on an initialised cond */
}

static void zero__local_deadline(const zero_local_group *g, struct timespec *ts)
{
#if defined(__APPLE__)
    clock_gettime(CLOCK_REALTIME, ts);
#else
    clock_gettime(CLOCK_MONOTONIC, ts); /* the cond waits on this clock (condattr) */
#endif
    ts->tv_sec += g->timeout_ms / 1000;
    ts->tv_nsec += (long)(g->timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Under the lock: the error of a broken group, once no peer is inside a data phase. */
static zero_result zero__local_fail_broken(zero_local_group *g, const char *what, int rank)
{
    zero_result why = g->broken;
    while (g->active > 0)
        if (pthread_cond_wait(&g->cv, &g->mu) != 0) break; /* cannot fail on a held mutex */
    pthread_mutex_unlock(&g->mu);
    return zero__fail(why, "%s (rank %d): group is broken: %s", what, rank, g->broken_msg);
}

/* One sync point for rank c. At ZERO__SYNC_POST the rank publishes *post first; the
   verdict on all posts is then in *ok. MID and END close a data phase; POST (when the
   verdict is good and the call moves data) and MID open one. */
static zero_result zero__local_sync(zero__local_comm *c, int point, const zero__local_post *post,
                                    int *ok)
{
    zero_local_group *g = c->group;
    int rank = c->base.rank, world = g->world, par = (int)(c->seq & 1u), rc, r;
    const char *what = zero__local_kind_name(post->kind);
    unsigned long long my_gen;
    struct timespec deadline;
    zero__local_deadline(g, &deadline);
    rc = pthread_mutex_lock(&g->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_COMM, "%s (rank %d): pthread_mutex_lock failed: %s", what, rank,
                          strerror(rc));
    if (point != ZERO__SYNC_POST && --g->active == 0 && g->broken != ZERO_OK)
        pthread_cond_broadcast(&g->cv); /* a failing peer waits for active == 0 */
    if (g->broken != ZERO_OK) return zero__local_fail_broken(g, what, rank);
    if (point == ZERO__SYNC_POST) g->posts[(size_t)par * (size_t)world + (size_t)rank] = *post;
    g->here[rank] = 1;
    if (++g->arrived == world) {
        g->arrived = 0;
        memset(g->here, 0, (size_t)world);
        g->gen++;
        if (point == ZERO__SYNC_POST) {
            g->verdict_ok[par] = zero__local_judge(g, par, c->seq);
            g->active = g->verdict_ok[par] && post->kind != ZERO__LC_BARRIER ? world : 0;
        } else if (point == ZERO__SYNC_MID) {
            g->active = world;
        }
        pthread_cond_broadcast(&g->cv);
    } else {
        my_gen = g->gen;
        while (g->gen == my_gen) {
            if (g->broken != ZERO_OK) return zero__local_fail_broken(g, what, rank);
            rc = pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
            if (g->gen != my_gen || g->broken != ZERO_OK) continue;
            if (rc == ETIMEDOUT) {
                char missing[128];
                size_t used = 0;
                missing[0] = '\0';
                for (r = 0; r < world && used + 8 < sizeof missing; r++)
                    if (!g->here[r])
                        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                                 used ? ", " : "", r);
                zero__local_break(g, ZERO_ERROR_TIMEOUT,
                                  "rank %d timed out after %d ms in %s #%llu waiting for rank(s) %s",
                                  rank, g->timeout_ms, what, c->seq, missing);
            } else if (rc != 0) {
                zero__local_break(g, ZERO_ERROR_COMM, "rank %d: pthread_cond_timedwait failed: %s",
                                  rank, strerror(rc));
            }
        }
    }
    if (ok) *ok = g->verdict_ok[par];
    pthread_mutex_unlock(&g->mu);
    return ZERO_OK;
}

/* ---- the data phases ---- */

static void zero__local_load(float *out, const void *src, zero_dtype dtype, size_t n,
                             zero_simd simd)
{
    if (dtype == ZERO_F32) memcpy(out, src, n * sizeof(float));
    else zero_convert(out, ZERO_F32, src, dtype, n, simd); /* arguments valid: cannot fail */
}

/* dst[i] = op over s = 0..nsrc-1 of src[s][i], in rank order, accumulated in fp32 (fp64 for
   F64), rounded once. Tile by tile: all inputs of a tile are read before its output is
   written, so dst may be one of the inputs. */
static void zero__local_reduce(void *dst, const void *const *src, int nsrc, size_t numel,
                               zero_dtype dtype, zero_op op, zero_simd simd)
{
    size_t es = zero_dtype_size(dtype), base, n, i;
    int s;
    if (nsrc == 1) {
        if (dst != src[0]) memcpy(dst, src[0], numel * es);
        return;
    }
    for (base = 0; base < numel; base += n) {
        n = numel - base < ZERO__LOCAL_TILE ? numel - base : ZERO__LOCAL_TILE;
        if (dtype == ZERO_F64) {
            double acc[ZERO__LOCAL_TILE], x[ZERO__LOCAL_TILE];
            memcpy(acc, (const double *)src[0] + base, n * sizeof(double));
            for (s = 1; s < nsrc; s++) {
                memcpy(x, (const double *)src[s] + base, n * sizeof(double));
                if (op == ZERO_OP_SUM)
                    for (i = 0; i < n; i++) acc[i] += x[i];
                else
                    for (i = 0; i < n; i++)
                        if (x[i] > acc[i] || x[i] != x[i]) acc[i] = acc[i] != acc[i] ? acc[i] : x[i];
            }
            memcpy((double *)dst + base, acc, n * sizeof(double));
        } else {
            float acc[ZERO__LOCAL_TILE], x[ZERO__LOCAL_TILE];
            const unsigned char *in;
            zero__local_load(acc, (const unsigned char *)src[0] + base * es, dtype, n, simd);
            for (s = 1; s < nsrc; s++) {
                in = (const unsigned char *)src[s] + base * es;
                zero__local_load(x, in, dtype, n, simd);
                if (op == ZERO_OP_SUM)
                    for (i = 0; i < n; i++) acc[i] += x[i];
                else
                    for (i = 0; i < n; i++)
                        if (x[i] > acc[i] || x[i] != x[i]) acc[i] = acc[i] != acc[i] ? acc[i] : x[i];
            }
            if (dtype == ZERO_F32) memcpy((float *)dst + base, acc, n * sizeof(float));
            else zero_convert((unsigned char *)dst + base * es, dtype, acc, ZERO_F32, n, simd);
        }
    }
}

/* All_reduce's slice of rank r: [off, off + len), in whole cache lines where numel allows. */
static void zero__local_slice(size_t numel, size_t es, int world, int r, size_t *off, size_t *len)
{
    size_t line = 64 / es, chunk = (numel + (size_t)world - 1) / (size_t)world;
    chunk = (chunk + line - 1) / line * line;
    *off = chunk * (size_t)r < numel ? chunk * (size_t)r : numel;
    *len = numel - *off < chunk ? numel - *off : chunk;
}

/* ---- the collectives ---- */

static zero__local_comm *zero__local_get(zero_comm *comm)
{
    if (!comm || !comm->ops || comm->ops->destroy != zero__local_destroy || !comm->impl) return NULL;
    return (zero__local_comm *)comm->impl;
}

/* Validates this rank's arguments into post->bad and 'why'. */
static void zero__local_check(zero__local_post *p, const zero_local_group *g, char *why,
                              size_t why_size)
{
    size_t es = zero_dtype_size(p->dtype), total = p->numel, bytes;
    const char *name = zero__local_kind_name(p->kind);
    p->bad = 1;
    if (p->kind == ZERO__LC_BARRIER) {
        p->bad = 0;
        return;
    }
    if (es == 0) {
        snprintf(why, why_size, "%s: unknown dtype %d", name, (int)p->dtype);
        return;
    }
    if (p->op != ZERO_OP_SUM && p->op != ZERO_OP_MAX) {
        snprintf(why, why_size, "%s: unknown op %d", name, (int)p->op);
        return;
    }
    if (p->root < 0 || p->root >= g->world) {
        snprintf(why, why_size, "%s: root = %d with world = %d", name, p->root, g->world);
        return;
    }
    if ((p->kind == ZERO__LC_ALL_GATHER || p->kind == ZERO__LC_REDUCE_SCATTER) &&
        zero__mul_size(p->numel, (size_t)g->world, &total) != 0) {
        snprintf(why, why_size, "%s: numel %zu times world %d overflows", name, p->numel, g->world);
        return;
    }
    if (zero__mul_size(total, es, &bytes) != 0) {
        snprintf(why, why_size, "%s: %zu elements of %s overflow size_t bytes", name, total,
                 zero_dtype_name(p->dtype));
        return;
    }
    if (p->numel > 0 && (!p->send || !p->recv)) {
        snprintf(why, why_size, "%s: %s is NULL with numel = %zu", name,
                 !p->send ? (p->kind == ZERO__LC_BROADCAST ? "buf" : "send") : "recv", p->numel);
        return;
    }
    p->bad = 0;
}

static zero_result zero__local_collective(zero_comm *comm, zero__local_post *p)
{
    zero__local_comm *c = zero__local_get(comm);
    zero_local_group *g;
    char why[160];
    const char *name = zero__local_kind_name(p->kind);
    size_t es, n, off, len;
    int ok = 0, rank, world, s;
    zero_result res;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: comm is not a local comm", name);
    g = c->group;
    rank = comm->rank;
    world = g->world;
    why[0] = '\0';
    zero__local_check(p, g, why, sizeof why);
    c->seq++;
    res = zero__local_sync(c, ZERO__SYNC_POST, p, &ok);
    if (res != ZERO_OK) return res;
    if (p->bad) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s", why);
    if (!ok)
        return zero__fail(ZERO_ERROR_MISMATCH, "%s (rank %d): %s", name, rank,
                          g->verdict_msg[c->seq & 1u]);
    if (p->kind == ZERO__LC_BARRIER) return ZERO_OK;

    {
        const zero__local_post *peer = g->posts + (size_t)(c->seq & 1u) * (size_t)world;
        es = zero_dtype_size(p->dtype);
        n = p->numel;
        switch (p->kind) {
        case ZERO__LC_ALL_GATHER:
            for (s = 0; s < world; s++) {
                int from = (rank + s) % world; /* spread the readers over the sources */
                unsigned char *dst = (unsigned char *)p->recv + (size_t)from * n * es;
                if (n && dst != peer[from].send) memcpy(dst, peer[from].send, n * es);
            }
            break;
        case ZERO__LC_REDUCE_SCATTER:
            for (s = 0; s < world; s++)
                c->srcs[s] = (const unsigned char *)peer[s].send + (size_t)rank * n * es;
            if (n) zero__local_reduce(p->recv, c->srcs, world, n, p->dtype, p->op, g->simd);
            break;
        case ZERO__LC_ALL_REDUCE:
            zero__local_slice(n, es, world, rank, &off, &len);
            for (s = 0; s < world; s++) c->srcs[s] = (const unsigned char *)peer[s].send + off * es;
            if (len)
                zero__local_reduce((unsigned char *)p->recv + off * es, c->srcs, world, len, p->dtype,
                                   p->op, g->simd);
            res = zero__local_sync(c, ZERO__SYNC_MID, p, NULL);
            if (res != ZERO_OK) return res;
            for (s = 1; s < world; s++) {
                int from = (rank + s) % world;
                zero__local_slice(n, es, world, from, &off, &len);
                if (len)
                    memcpy((unsigned char *)p->recv + off * es,
                           (const unsigned char *)peer[from].recv + off * es, len * es);
            }
            break;
        case ZERO__LC_BROADCAST:
            if (rank != p->root && n && p->recv != peer[p->root].recv)
                memcpy(p->recv, peer[p->root].recv, n * es);
            break;
        }
    }
    return zero__local_sync(c, ZERO__SYNC_END, p, NULL);
}

static zero_result zero__local_all_gather(zero_comm *comm, const void *send, void *recv,
                                          size_t send_numel, zero_dtype dtype, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_ALL_GATHER;
    p.send = send;
    p.recv = recv;
    p.numel = send_numel;
    p.dtype = dtype;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_reduce_scatter(zero_comm *comm, const void *send, void *recv,
                                              size_t recv_numel, zero_dtype dtype, zero_op op,
                                              void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_REDUCE_SCATTER;
    p.send = send;
    p.recv = recv;
    p.numel = recv_numel;
    p.dtype = dtype;
    p.op = op;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_all_reduce(zero_comm *comm, const void *send, void *recv,
                                          size_t numel, zero_dtype dtype, zero_op op, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_ALL_REDUCE;
    p.send = send;
    p.recv = recv;
    p.numel = numel;
    p.dtype = dtype;
    p.op = op;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_broadcast(zero_comm *comm, void *buf, size_t numel,
                                         zero_dtype dtype, int root, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_BROADCAST;
    p.send = buf;
    p.recv = buf;
    p.numel = numel;
    p.dtype = dtype;
    p.root = root;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_barrier(zero_comm *comm)
{
    zero__local_post p;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_BARRIER;
    return zero__local_collective(comm, &p);
}

/* ---- lifetime ---- */

static void zero__local_group_free(zero_local_group *g)
{
    zero_allocator a = g->allocator;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    zero__free(&a, g->posts);
    zero__free(&a, g->has_comm);
    zero__free(&a, g->here);
    zero__free(&a, g);
}

static void zero__local_destroy(zero_comm *comm)
{
    zero__local_comm *c = zero__local_get(comm);
    zero_local_group *g;
    int last;
    if (!c) return;
    g = c->group;
    pthread_mutex_lock(&g->mu);
    zero__local_break(g, ZERO_ERROR_COMM, "rank %d left the group (its comm was destroyed)",
                      comm->rank);
    g->has_comm[comm->rank] = 0;
    last = --g->live == 0 && g->orphaned;
    pthread_mutex_unlock(&g->mu);
    c->base.impl = NULL; /* a stale handle is then rejected, not followed */
    zero__free(&g->allocator, c->srcs);
    zero__free(&g->allocator, c);
    if (last) zero__local_group_free(g);
}

static const zero_comm_ops zero__local_ops = {
    "local",
    zero__local_destroy,
    zero__local_all_gather,
    zero__local_reduce_scatter,
    zero__local_all_reduce,
    zero__local_broadcast,
    zero__local_barrier,
    NULL,
    NULL,
};

ZERODEF zero_result zero_local_group_create(const zero_local_desc *desc, zero_local_group **out)
{
    zero_local_group *g;
    zero_allocator a;
    pthread_condattr_t attr;
    size_t w;
    int rc;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: desc is NULL");
    if (desc->world < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: world = %d (must be >= 1)",
                          desc->world);
    if (desc->timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_local_group_create: timeout_ms = %d (0 = default, else > 0)",
                          desc->timeout_ms);
    if ((desc->allocator.alloc != NULL) != (desc->allocator.free != NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_local_group_create: allocator needs both alloc and free, or neither");
    a = desc->allocator;
    w = (size_t)desc->world;
    g = (zero_local_group *)zero__alloc(&a, sizeof *g);
    if (!g) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_group_create: out of memory");
    memset(g, 0, sizeof *g);
    g->allocator = a;
    g->world = desc->world;
    g->timeout_ms = desc->timeout_ms ? desc->timeout_ms : 60000;
    g->simd = zero_simd_detect();
    g->here = (unsigned char *)zero__alloc(&a, w);
    g->has_comm = (unsigned char *)zero__alloc(&a, w);
    g->posts = (zero__local_post *)zero__alloc(&a, 2 * w * sizeof *g->posts);
    if (!g->here || !g->has_comm || !g->posts) {
        zero__free(&a, g->posts);
        zero__free(&a, g->has_comm);
        zero__free(&a, g->here);
        zero__free(&a, g);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_group_create: out of memory (world %d)",
                          desc->world);
    }
    memset(g->here, 0, w);
    memset(g->has_comm, 0, w);
    memset(g->posts, 0, 2 * w * sizeof *g->posts);
    rc = pthread_mutex_init(&g->mu, NULL);
    if (rc == 0) {
        rc = pthread_condattr_init(&attr);
        if (rc == 0) {
#if !defined(__APPLE__)
            rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
#endif
            if (rc == 0) rc = pthread_cond_init(&g->cv, &attr);
            pthread_condattr_destroy(&attr);
        }
        if (rc != 0) pthread_mutex_destroy(&g->mu);
    }
    if (rc != 0) {
        zero__free(&a, g->posts);
        zero__free(&a, g->has_comm);
        zero__free(&a, g->here);
        zero__free(&a, g);
        return zero__fail(ZERO_ERROR_COMM, "zero_local_group_create: pthread init failed: %s",
                          strerror(rc));
    }
    *out = g;
    return ZERO_OK;
}

ZERODEF void zero_local_group_destroy(zero_local_group *group)
{
    int now;
    if (!group) return;
    pthread_mutex_lock(&group->mu);
    group->orphaned = 1;
    now = group->live == 0;
    pthread_mutex_unlock(&group->mu);
    if (now) zero__local_group_free(group);
}

ZERODEF zero_result zero_local_comm_create(zero_local_group *group, int rank, zero_comm **out)
{
    zero__local_comm *c;
    zero_result res = ZERO_OK;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: out is NULL");
    *out = NULL;
    if (!group) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: group is NULL");
    if (rank < 0 || rank >= group->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: rank = %d with world = %d",
                          rank, group->world);
    c = (zero__local_comm *)zero__alloc(&group->allocator, sizeof *c);
    if (c) {
        memset(c, 0, sizeof *c);
        c->srcs = (const void **)zero__alloc(&group->allocator, (size_t)group->world * sizeof *c->srcs);
    }
    if (!c || !c->srcs) {
        if (c) zero__free(&group->allocator, c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_comm_create: out of memory");
    }
    c->base.ops = &zero__local_ops;
    c->base.impl = c;
    c->base.rank = rank;
    c->base.world = group->world;
    c->group = group;
    pthread_mutex_lock(&group->mu);
    if (group->has_comm[rank])
        res = zero__fail(ZERO_ERROR_INVALID_STATE, "zero_local_comm_create: rank %d already has a comm",
                         rank);
    else if (group->orphaned)
        res = zero__fail(ZERO_ERROR_INVALID_STATE, "zero_local_comm_create: the group was destroyed");
    if (res == ZERO_OK) {
        group->has_comm[rank] = 1;
        group->live++;
    }
    pthread_mutex_unlock(&group->mu);
    if (res != ZERO_OK) {
        zero__free(&group->allocator, c->srcs);
        zero__free(&group->allocator, c);
        return res;
    }
    *out = &c->base;
    return ZERO_OK;
}

ZERODEF void zero_comm_destroy(zero_comm *comm)
{
    if (comm && comm->ops && comm->ops->destroy) comm->ops->destroy(comm);
}

ZERODEF zero_result zero_local_abort(zero_comm *comm)
{
    zero__local_comm *c = zero__local_get(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_abort: comm is not a local comm");
    pthread_mutex_lock(&c->group->mu);
    zero__local_break(c->group, ZERO_ERROR_COMM, "rank %d called zero_local_abort", comm->rank);
    pthread_mutex_unlock(&c->group->mu);
    return ZERO_OK;
}

/* ---- zero_local_run ---- */

typedef struct zero__local_runner {
    zero_result (*fn)(int rank, zero_comm *comm, void *user);
    void *user;
    zero_comm *comm;
    zero_local_group *group;
    int rank;
    int first;     /* failed while the group was still whole: a root cause */
    zero_result result;
    char msg[512];
} zero__local_runner;

static void *zero__local_run_thread(void *arg)
{
    zero__local_runner *t = (zero__local_runner *)arg;
    zero_local_group *g = t->group;
    t->result = t->fn(t->rank, t->comm, t->user);
    if (t->result != ZERO_OK) {
        snprintf(t->msg, sizeof t->msg, "%s", zero_last_error());
        pthread_mutex_lock(&g->mu);
        t->first = g->broken == ZERO_OK;
        zero__local_break(g, ZERO_ERROR_COMM, "rank %d's function failed: %s: %s", t->rank,
                          zero_result_string(t->result), t->msg);
        pthread_mutex_unlock(&g->mu);
    }
    zero_comm_destroy(t->comm); /* peers still waiting for this rank fail, not hang */
    t->comm = NULL;
    return NULL;
}

ZERODEF zero_result zero_local_run_desc(const zero_local_desc *desc,
                                        zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                        void *user)
{
    zero_local_group *g = NULL;
    zero__local_runner *t;
    pthread_t *th;
    zero_result res;
    int r, started = 0, rc = 0, pick = -1;
    if (!desc || !fn)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_run: %s is NULL", desc ? "fn" : "desc");
    res = zero_local_group_create(desc, &g);
    if (res != ZERO_OK) return res;
    t = (zero__local_runner *)zero__alloc(&g->allocator, (size_t)desc->world * sizeof *t);
    th = (pthread_t *)zero__alloc(&g->allocator, (size_t)desc->world * sizeof *th);
    if (!t || !th) {
        zero__free(&g->allocator, th);
        zero__free(&g->allocator, t);
        zero_local_group_destroy(g);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_run: out of memory (world %d)", desc->world);
    }
    memset(t, 0, (size_t)desc->world * sizeof *t);
    for (r = 0; r < desc->world && res == ZERO_OK; r++) {
        t[r].fn = fn;
        t[r].user = user;
        t[r].group = g;
        t[r].rank = r;
        res = zero_local_comm_create(g, r, &t[r].comm);
    }
    for (r = 0; r < desc->world && res == ZERO_OK; r++) {
        rc = pthread_create(&th[r], NULL, zero__local_run_thread, &t[r]);
        if (rc != 0) {
            res = zero__fail(ZERO_ERROR_COMM, "zero_local_run: pthread_create for rank %d failed: %s", r,
                             strerror(rc));
            pthread_mutex_lock(&g->mu);
            zero__local_break(g, ZERO_ERROR_COMM, "zero_local_run could not start rank %d", r);
            pthread_mutex_unlock(&g->mu);
            break;
        }
        started++;
    }
    for (r = 0; r < started; r++) pthread_join(th[r], NULL);
    if (res == ZERO_OK) {
        for (r = 0; r < desc->world; r++)
            if (t[r].result != ZERO_OK && (pick < 0 || (t[r].first && !t[pick].first))) pick = r;
        if (pick >= 0)
            res = zero__fail(t[pick].result, "rank %d: %s", pick, t[pick].msg);
    }
    for (r = started; r < desc->world; r++) zero_comm_destroy(t[r].comm); /* never started */
    zero__free(&g->allocator, th);
    zero__free(&g->allocator, t);
    zero_local_group_destroy(g);
    return res;
}

ZERODEF zero_result zero_local_run(int world, zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                   void *user)
{
    zero_local_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.world = world;
    return zero_local_run_desc(&desc, fn, user);
}
/* Host device implementation: zero_device_ops on the CPU, synchronous.

   Memory: each allocation is over-allocated by 63 bytes and rounded up to 64; a small
   open-addressing table (pointer -> original pointer, bytes, category) makes free of a
   foreign pointer an error instead of a crash and gives exact per-category accounting.

   Kernels: element-wise, in blocks of ZERO_HOST_SUMSQ_BLOCK elements. With threads > 1
   and enough elements, the blocks are split over workers (each a contiguous run of
   blocks); a block's work never depends on which thread runs it, and per-block results
   (sums of squares, non-finite flags) are folded in block order on the calling thread, so
   every result is the same for any thread count. fp16 / bf16 go through fp32 tiles
   converted by zero_convert() (H1's SIMD paths, bit-identical to the scalar ones). */

#include <pthread.h>

#define ZERO__HOST_TILE 512                 /* elements per fp32 tile on the stack       */
#define ZERO__HOST_WAVE 256                 /* blocks whose results are held at once     */
#define ZERO__HOST_PER_THREAD (1u << 18)    /* elements below which a worker is not worth it */
#define ZERO__HOST_EVENT_MAGIC 0x7a657645u  /* "zevE" */

typedef struct zero__host_slot {
    void *ptr; /* NULL = empty */
    void *raw;
    size_t bytes;
    zero_mem_category category;
} zero__host_slot;

typedef struct zero__host_device {
    zero_device base;
    zero_allocator allocator;
    zero_simd simd; /* resolved: never AUTO */
    int threads;
    pthread_mutex_t mu; /* guards the table and the counters */
    zero__host_slot *table;
    size_t cap;   /* a power of two, or 0 */
    size_t count; /* live allocations */
    size_t bytes[ZERO_MEM_COUNT];
} zero__host_device;

struct zero_event {
    uint32_t magic;
    zero_device *dev;
};

static void zero__host_destroy(zero_device *dev);

static zero__host_device *zero__host_get(zero_device *dev)
{
    if (!dev || !dev->ops || dev->ops->destroy != zero__host_destroy || !dev->impl) return NULL;
    return (zero__host_device *)dev->impl;
}

/* The common checks of every op: a host device and a queue in range. */
#define ZERO__HOST_ENTER(what)                                                                 \
    zero__host_device *d = zero__host_get(dev);                                               \
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: dev is not a host device", what); \
    if ((int)q < 0 || (int)q >= ZERO_QUEUE_COUNT)                                             \
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: queue %d out of range", what, (int)q)

/* NULL with numel > 0, unknown dtype, or numel * size overflowing: an error; else OK. */
static zero_result zero__host_check_buf(const char *what, const char *arg, const void *p,
                                        zero_dtype dtype, size_t numel)
{
    size_t es = zero_dtype_size(dtype), bytes;
    if (es == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: unknown dtype %d", what, (int)dtype);
    if (zero__mul_size(numel, es, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "host %s: numel %zu of %s overflows", what, numel,
                          zero_dtype_name(dtype));
    if (numel > 0 && !p)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: %s is NULL with numel = %zu", what, arg,
                          numel);
    return ZERO_OK;
}

/* ---- the allocation table ---- */

static size_t zero__host_hash(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p >> 6; /* every pointer is 64-byte aligned */
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static size_t zero__host_find(const zero__host_device *d, const void *p)
{
    size_t i;
    if (d->cap == 0) return (size_t)-1;
    for (i = zero__host_hash(p, d->cap); d->table[i].ptr; i = (i + 1) & (d->cap - 1))
        if (d->table[i].ptr == p) return i;
    return (size_t)-1;
}

static void zero__host_put(zero__host_slot *table, size_t cap, const zero__host_slot *s)
{
    size_t i = zero__host_hash(s->ptr, cap);
    while (table[i].ptr) i = (i + 1) & (cap - 1);
    table[i] = *s;
}

/* Keeps the load at most 1/2. */
static int zero__host_grow(zero__host_device *d)
{
    size_t cap = d->cap ? d->cap * 2 : 64, i, bytes;
    zero__host_slot *t;
    if ((d->count + 1) * 2 <= d->cap) return 0;
    if (zero__mul_size(cap, sizeof *t, &bytes) != 0) return -1;
    t = (zero__host_slot *)zero__alloc(&d->allocator, bytes);
    if (!t) return -1;
    memset(t, 0, bytes);
    for (i = 0; i < d->cap; i++)
        if (d->table[i].ptr) zero__host_put(t, cap, &d->table[i]);
    zero__free(&d->allocator, d->table);
    d->table = t;
    d->cap = cap;
    return 0;
}

/* Removes slot i, shifting later members of its probe run back (no tombstones). */
static void zero__host_remove(zero__host_device *d, size_t i)
{
    size_t mask = d->cap - 1, j = i, home;
    d->table[i].ptr = NULL;
    for (;;) {
        j = (j + 1) & mask;
        if (!d->table[j].ptr) return;
        home = zero__host_hash(d->table[j].ptr, d->cap);
        /* move j into the hole i when its home is not cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            d->table[i] = d->table[j];
            d->table[j].ptr = NULL;
            i = j;
        }
    }
}

static zero_result zero__host_alloc(zero_device *dev, size_t bytes, zero_mem_category category,
                                    void **out)
{
    zero__host_device *d = zero__host_get(dev);
    zero__host_slot s;
    size_t total;
    int rc;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: dev is not a host device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: out is NULL");
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: bytes = 0");
    if ((int)category < 0 || category >= ZERO_MEM_COUNT)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: category %d out of range", (int)category);
    if (zero__add_size(bytes, 63, &total) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "host alloc: bytes = %zu overflows", bytes);
    s.raw = zero__alloc(&d->allocator, total);
    if (!s.raw)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host alloc: %zu bytes (%s) failed", bytes,
                          zero_mem_category_name(category));
    s.ptr = (void *)(((uintptr_t)s.raw + 63u) & ~(uintptr_t)63u);
    s.bytes = bytes;
    s.category = category;
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0) {
        zero__free(&d->allocator, s.raw);
        return zero__fail(ZERO_ERROR_DEVICE, "host alloc: pthread_mutex_lock failed: %s", strerror(rc));
    }
    if (zero__host_grow(d) != 0) {
        pthread_mutex_unlock(&d->mu);
        zero__free(&d->allocator, s.raw);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host alloc: out of memory for the allocation table");
    }
    zero__host_put(d->table, d->cap, &s);
    d->count++;
    d->bytes[category] += bytes;
    pthread_mutex_unlock(&d->mu);
    *out = s.ptr;
    return ZERO_OK;
}

static zero_result zero__host_free(zero_device *dev, void *ptr)
{
    zero__host_device *d = zero__host_get(dev);
    zero__host_slot s;
    size_t i;
    int rc;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host free: dev is not a host device");
    if (!ptr) return ZERO_OK;
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_DEVICE, "host free: pthread_mutex_lock failed: %s", strerror(rc));
    i = zero__host_find(d, ptr);
    if (i == (size_t)-1) {
        pthread_mutex_unlock(&d->mu);
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "host free: %p was not allocated by this device (or was freed already)", ptr);
    }
    s = d->table[i];
    zero__host_remove(d, i);
    d->count--;
    d->bytes[s.category] -= s.bytes;
    pthread_mutex_unlock(&d->mu);
    zero__free(&d->allocator, s.raw);
    return ZERO_OK;
}

/* ---- queues and events: everything has already happened ---- */

static zero_result zero__host_event_create(zero_device *dev, zero_event **out)
{
    zero__host_device *d = zero__host_get(dev);
    zero_event *ev;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host event_create: dev is not a host device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host event_create: out is NULL");
    ev = (zero_event *)zero__alloc(&d->allocator, sizeof *ev);
    if (!ev) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host event_create: out of memory");
    ev->magic = ZERO__HOST_EVENT_MAGIC;
    ev->dev = dev;
    *out = ev;
    return ZERO_OK;
}

static void zero__host_event_destroy(zero_device *dev, zero_event *ev)
{
    zero__host_device *d = zero__host_get(dev);
    if (!d || !ev || ev->magic != ZERO__HOST_EVENT_MAGIC || ev->dev != dev) return;
    ev->magic = 0;
    zero__free(&d->allocator, ev);
}

static zero_result zero__host_check_event(const char *what, zero_device *dev, const zero_event *ev)
{
    if (!ev) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: event is NULL", what);
    if (ev->magic != ZERO__HOST_EVENT_MAGIC || ev->dev != dev)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: not an event of this device", what);
    return ZERO_OK;
}

static zero_result zero__host_record(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO__HOST_ENTER("record");
    (void)d;
    return zero__host_check_event("record", dev, ev);
}

static zero_result zero__host_wait(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO__HOST_ENTER("wait");
    (void)d;
    return zero__host_check_event("wait", dev, ev);
}

static zero_result zero__host_sync(zero_device *dev, zero_queue q)
{
    ZERO__HOST_ENTER("sync");
    (void)d;
    return ZERO_OK;
}

static void *zero__host_native_queue(zero_device *dev, zero_queue q)
{
    (void)dev;
    (void)q;
    return NULL;
}

/* ---- transfers ---- */

static zero_result zero__host_move(zero_device *dev, zero_queue q, void *dst, const void *src,
                                   size_t bytes, const char *what)
{
    ZERO__HOST_ENTER(what);
    (void)d;
    if (bytes > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: %s is NULL with bytes = %zu", what,
                          dst ? "src" : "dst", bytes);
    if (bytes > 0 && dst != src) memmove(dst, src, bytes);
    return ZERO_OK;
}

static zero_result zero__host_copy(zero_device *dev, zero_queue q, void *dst, const void *src,
                                   size_t bytes)
{
    return zero__host_move(dev, q, dst, src, bytes, "copy");
}

static zero_result zero__host_upload(zero_device *dev, zero_queue q, void *dst, const void *host_src,
                                     size_t bytes)
{
    return zero__host_move(dev, q, dst, host_src, bytes, "upload");
}

static zero_result zero__host_download(zero_device *dev, zero_queue q, void *host_dst,
                                       const void *src, size_t bytes)
{
    return zero__host_move(dev, q, host_dst, src, bytes, "download");
}

static zero_result zero__host_fill_zero(zero_device *dev, zero_queue q, void *dst, size_t bytes)
{
    ZERO__HOST_ENTER("fill_zero");
    (void)d;
    if (bytes > 0 && !dst)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host fill_zero: dst is NULL with bytes = %zu", bytes);
    if (bytes > 0) memset(dst, 0, bytes);
    return ZERO_OK;
}

/* ---- blocks over threads ---- */

/* One block [begin, end) of a kernel; returns the block's result (or 0). */
typedef double (*zero__host_body)(void *ctx, size_t begin, size_t end);

typedef struct zero__host_job {
    zero__host_body body;
    void *ctx;
    size_t numel;
    size_t first, last; /* blocks [first, last) */
    double *results;    /* results[b - wave_first] */
    size_t wave_first;
} zero__host_job;

static void zero__host_job_run(const zero__host_job *j)
{
    size_t b, begin, end;
    for (b = j->first; b < j->last; b++) {
        begin = b * (size_t)ZERO_HOST_SUMSQ_BLOCK;
        end = j->numel - begin < (size_t)ZERO_HOST_SUMSQ_BLOCK ? j->numel : begin + ZERO_HOST_SUMSQ_BLOCK;
        j->results[b - j->wave_first] = j->body(j->ctx, begin, end);
    }
}

static void *zero__host_job_thread(void *arg)
{
    zero__host_job_run((const zero__host_job *)arg);
    return NULL;
}

/* Runs body over [0, numel) in blocks and returns the sum of the block results, added in
   block order starting from 0, whatever the number of threads. */
static double zero__host_for(const zero__host_device *d, size_t numel, zero__host_body body,
                             void *ctx)
{
    double results[ZERO__HOST_WAVE], total = 0.0;
    size_t nblocks = numel / ZERO_HOST_SUMSQ_BLOCK + (numel % ZERO_HOST_SUMSQ_BLOCK != 0);
    size_t want = numel / ZERO__HOST_PER_THREAD, wave, k, t, nthreads, first;
    zero__host_job jobs[64];
    pthread_t th[64];
    int started[64];
    nthreads = (size_t)(d->threads > 1 ? d->threads : 1);
    if (nthreads > want) nthreads = want ? want : 1;
    if (nthreads > 64) nthreads = 64;
    for (first = 0; first < nblocks; first += wave) {
        wave = nblocks - first < ZERO__HOST_WAVE ? nblocks - first : ZERO__HOST_WAVE;
        t = nthreads < wave ? nthreads : wave;
        for (k = 0; k < t; k++) {
            jobs[k].body = body;
            jobs[k].ctx = ctx;
            jobs[k].numel = numel;
            jobs[k].first = first + wave * k / t;
            jobs[k].last = first + wave * (k + 1) / t;
            jobs[k].results = results;
            jobs[k].wave_first = first;
        }
        /* worker k > 0 on its own thread; if a thread cannot start, the caller runs its part */
        for (k = 1; k < t; k++) started[k] = pthread_create(&th[k], NULL, zero__host_job_thread, &jobs[k]) == 0;
        zero__host_job_run(&jobs[0]);
        for (k = 1; k < t; k++) {
            if (started[k]) pthread_join(th[k], NULL);
            else zero__host_job_run(&jobs[k]);
        }
        for (k = 0; k < wave; k++) total += results[k];
    }
    return total;
}

/* ---- element kernels ---- */

typedef struct zero__host_ctx {
    const zero__host_device *d;
    void *dst;
    const void *src;
    zero_dtype dtype;
    zero_dtype src_dtype;
    float s;
} zero__host_ctx;

static double zero__host_body_cast(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    zero_convert((unsigned char *)c->dst + begin * zero_dtype_size(c->dtype), c->dtype,
                 (const unsigned char *)c->src + begin * zero_dtype_size(c->src_dtype), c->src_dtype,
                 end - begin, c->d->simd);
    return 0.0;
}

static zero_result zero__host_cast(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                                   const void *src, zero_dtype src_dtype, size_t numel)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("cast");
    if ((r = zero__host_check_buf("cast", "dst", dst, dst_dtype, numel)) != ZERO_OK) return r;
    if ((r = zero__host_check_buf("cast", "src", src, src_dtype, numel)) != ZERO_OK) return r;
    if (dst_dtype == src_dtype || numel < 2 * (size_t)ZERO__HOST_PER_THREAD || d->threads <= 1)
        return zero_convert(dst, dst_dtype, src, src_dtype, numel, d->simd); /* memmove if same */
    c.d = d;
    c.dst = dst;
    c.src = src;
    c.dtype = dst_dtype;
    c.src_dtype = src_dtype;
    c.s = 0.0f;
    zero__host_for(d, numel, zero__host_body_cast, &c);
    return ZERO_OK;
}

/* Portable bodies of the kernels over [begin, end). The SIMD bodies below do whole vectors
   and hand the rest to these, which compute the same expression element by element. */
static void zero__host_add_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t i, n, base;
    if (c->dtype == ZERO_F32) {
        float *x = (float *)c->dst;
        const float *y = (const float *)c->src;
        for (i = begin; i < end; i++) x[i] = x[i] + y[i];
    } else if (c->dtype == ZERO_F64) {
        double *x = (double *)c->dst;
        const double *y = (const double *)c->src;
        for (i = begin; i < end; i++) x[i] = x[i] + y[i];
    } else {
        float a[ZERO__HOST_TILE], b[ZERO__HOST_TILE];
        uint16_t *x = (uint16_t *)c->dst;
        const uint16_t *y = (const uint16_t *)c->src;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            zero_convert(a, ZERO_F32, x + base, c->dtype, n, c->d->simd);
            zero_convert(b, ZERO_F32, y + base, c->dtype, n, c->d->simd);
            for (i = 0; i < n; i++) a[i] = a[i] + b[i];
            zero_convert(x + base, c->dtype, a, ZERO_F32, n, c->d->simd);
        }
    }
}

static void zero__host_scale_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t i, n, base;
    float s = c->s;
    if (c->dtype == ZERO_F32) {
        float *x = (float *)c->dst;
        for (i = begin; i < end; i++) x[i] = x[i] * s;
    } else if (c->dtype == ZERO_F64) {
        double *x = (double *)c->dst, sd = (double)s;
        for (i = begin; i < end; i++) x[i] = x[i] * sd;
    } else {
        float a[ZERO__HOST_TILE];
        uint16_t *x = (uint16_t *)c->dst;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            zero_convert(a, ZERO_F32, x + base, c->dtype, n, c->d->simd);
            for (i = 0; i < n; i++) a[i] = a[i] * s;
            zero_convert(x + base, c->dtype, a, ZERO_F32, n, c->d->simd);
        }
    }
}

/* Non-zero when [begin, end) holds an inf or NaN: exponent bits all ones, as integers. */
static unsigned zero__host_nonfinite_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    const unsigned char *x = (const unsigned char *)c->src;
    size_t i;
    unsigned bad = 0;
    if (c->dtype == ZERO_F32) {
        for (i = begin; i < end; i++) {
            uint32_t u;
            memcpy(&u, x + 4 * i, 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    } else if (c->dtype == ZERO_F64) {
        for (i = begin; i < end; i++) {
            uint64_t u;
            memcpy(&u, x + 8 * i, 8);
            bad |= (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        }
    } else {
        uint16_t mask = c->dtype == ZERO_F16 ? 0x7c00u : 0x7f80u;
        for (i = begin; i < end; i++) {
            uint16_t u;
            memcpy(&u, x + 2 * i, 2);
            bad |= (u & mask) == mask;
        }
    }
    return bad;
}

/* Adds x[i]^2 for i in [begin, end) into lane[i mod 8], in order of i: exact products for
   fp32/fp16/bf16 (so an fma gives the same bits), fma for fp64. */
static void zero__host_sumsq_portable(const zero__host_ctx *c, size_t begin, size_t end, double *lane)
{
    size_t i, n, base;
    if (c->dtype == ZERO_F64) {
        const double *x = (const double *)c->src;
        for (i = begin; i < end; i++) lane[i & 7] = fma(x[i], x[i], lane[i & 7]);
    } else {
        float t[ZERO__HOST_TILE];
        const float *x;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            if (c->dtype == ZERO_F32) {
                x = (const float *)c->src + base;
            } else {
                zero_convert(t, ZERO_F32, (const uint16_t *)c->src + base, c->dtype, n, c->d->simd);
                x = t;
            }
            for (i = 0; i < n; i++) lane[(base + i) & 7] += (double)x[i] * (double)x[i];
        }
    }
}

#ifdef ZERO__X86_SIMD
/* AVX2 and AVX-512 bodies for fp32/fp16/bf16 (fp64 stays portable). Each returns the first
   index it did not do. GCC 12's AVX-512 headers make g++ warn "__Y may be used
   uninitialized" inside _mm512_undefined_*() (GCC PR 105593, fixed in 13): silenced here. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ZERO__HOST_POP_DIAGNOSTIC 1
#endif
ZERO__AVX2 static inline __m256 zero__host_ld8(zero_dtype dt, const unsigned char *p)
{
    if (dt == ZERO_F32) return _mm256_loadu_ps((const float *)(const void *)p);
    if (dt == ZERO_F16) return zero__ld_f16x8_avx2(p);
    return zero__ld_bf16x8_avx2(p);
}

ZERO__AVX2 static inline void zero__host_st8(zero_dtype dt, unsigned char *p, __m256 x)
{
    if (dt == ZERO_F32) _mm256_storeu_ps((float *)(void *)p, x);
    else if (dt == ZERO_F16) zero__st_f16x8_avx2(p, x);
    else zero__st_bf16x8_avx2(p, x);
}

ZERO__AVX2 static size_t zero__host_add_avx2(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    const unsigned char *y = (const unsigned char *)c->src;
    for (i = begin; i + 8 <= end; i += 8)
        zero__host_st8(c->dtype, x + i * es,
                       _mm256_add_ps(zero__host_ld8(c->dtype, x + i * es), zero__host_ld8(c->dtype, y + i * es)));
    return i;
}

ZERO__AVX2 static size_t zero__host_scale_avx2(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    __m256 s = _mm256_set1_ps(c->s);
    for (i = begin; i + 8 <= end; i += 8)
        zero__host_st8(c->dtype, x + i * es, _mm256_mul_ps(zero__host_ld8(c->dtype, x + i * es), s));
    return i;
}

ZERO__AVX2 static size_t zero__host_nonfinite_avx2(const zero__host_ctx *c, size_t begin, size_t end,
                                                   unsigned *bad)
{
    const unsigned char *x = (const unsigned char *)c->src;
    __m256i any = _mm256_setzero_si256(), m, v;
    size_t i;
    if (c->dtype == ZERO_F32) {
        m = _mm256_set1_epi32(0x7f800000);
        for (i = begin; i + 8 <= end; i += 8) {
            v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + 4 * i)), m);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi32(v, m));
        }
    } else {
        m = _mm256_set1_epi16((short)(c->dtype == ZERO_F16 ? 0x7c00 : 0x7f80));
        for (i = begin; i + 16 <= end; i += 16) {
            v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + 2 * i)), m);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi16(v, m));
        }
    }
    *bad |= !_mm256_testz_si256(any, any);
    return i;
}

ZERO__AVX2 static size_t zero__host_sumsq_avx2(const zero__host_ctx *c, size_t begin, size_t end,
                                               double *lane)
{
    size_t es = zero_dtype_size(c->dtype), i;
    const unsigned char *x = (const unsigned char *)c->src;
    __m256d a0 = _mm256_loadu_pd(lane), a1 = _mm256_loadu_pd(lane + 4), lo, hi;
    __m256 v;
    for (i = begin; i + 8 <= end; i += 8) { /* lanes 0-3 in a0, 4-7 in a1 (begin = 0 mod 8) */
        v = zero__host_ld8(c->dtype, x + i * es);
        lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
    return i;
}

ZERO__AVX512 static inline __m512 zero__host_ld16(zero_dtype dt, const unsigned char *p)
{
    if (dt == ZERO_F32) return _mm512_loadu_ps(p);
    if (dt == ZERO_F16) return zero__ld_f16x16_avx512(p);
    return zero__ld_bf16x16_avx512(p);
}

ZERO__AVX512 static inline void zero__host_st16(zero_dtype dt, unsigned char *p, __m512 x)
{
    if (dt == ZERO_F32) _mm512_storeu_ps(p, x);
    else if (dt == ZERO_F16) zero__st_f16x16_avx512(p, x);
    else zero__st_bf16x16_avx512(p, x);
}

ZERO__AVX512 static size_t zero__host_add_avx512(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    const unsigned char *y = (const unsigned char *)c->src;
    for (i = begin; i + 16 <= end; i += 16)
        zero__host_st16(c->dtype, x + i * es,
                        _mm512_add_ps(zero__host_ld16(c->dtype, x + i * es), zero__host_ld16(c->dtype, y + i * es)));
    return i;
}

ZERO__AVX512 static size_t zero__host_scale_avx512(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    __m512 s = _mm512_set1_ps(c->s);
    for (i = begin; i + 16 <= end; i += 16)
        zero__host_st16(c->dtype, x + i * es, _mm512_mul_ps(zero__host_ld16(c->dtype, x + i * es), s));
    return i;
}

ZERO__AVX512 static size_t zero__host_nonfinite_avx512(const zero__host_ctx *c, size_t begin, size_t end,
                                                       unsigned *bad)
{
    const unsigned char *x = (const unsigned char *)c->src;
    __m512i m, v;
    size_t i;
    unsigned any = 0;
    if (c->dtype == ZERO_F32) {
        m = _mm512_set1_epi32(0x7f800000);
        for (i = begin; i + 16 <= end; i += 16) {
            v = _mm512_and_si512(_mm512_loadu_si512(x + 4 * i), m);
            any |= (unsigned)_mm512_cmpeq_epi32_mask(v, m);
        }
    } else {
        m = _mm512_set1_epi16((short)(c->dtype == ZERO_F16 ? 0x7c00 : 0x7f80));
        for (i = begin; i + 32 <= end; i += 32) {
            v = _mm512_and_si512(_mm512_loadu_si512(x + 2 * i), m);
            any |= _mm512_cmpeq_epi16_mask(v, m) != 0;
        }
    }
    *bad |= any != 0;
    return i;
}

ZERO__AVX512 static size_t zero__host_sumsq_avx512(const zero__host_ctx *c, size_t begin, size_t end,
                                                   double *lane)
{
    size_t es = zero_dtype_size(c->dtype), i;
    const unsigned char *x = (const unsigned char *)c->src;
    __m512d a = _mm512_loadu_pd(lane), lo, hi;
    __m512 v;
    for (i = begin; i + 16 <= end; i += 16) { /* lane k: element i + k, then i + 8 + k */
        v = zero__host_ld16(c->dtype, x + i * es);
        lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a = _mm512_fmadd_pd(lo, lo, a);
        a = _mm512_fmadd_pd(hi, hi, a);
    }
    _mm512_storeu_pd(lane, a);
    return i;
}

#ifdef ZERO__HOST_POP_DIAGNOSTIC
#pragma GCC diagnostic pop
#undef ZERO__HOST_POP_DIAGNOSTIC
#endif

#define ZERO__HOST_SIMD(c, avx2_call, avx512_call, i)                                          \
    do {                                                                                      \
        if ((c)->dtype != ZERO_F64 && (c)->d->simd == ZERO_SIMD_AVX512) i = avx512_call;     \
        else if ((c)->dtype != ZERO_F64 && (c)->d->simd == ZERO_SIMD_AVX2) i = avx2_call;    \
    } while (0)
#else
#define ZERO__HOST_SIMD(c, avx2_call, avx512_call, i) (void)0
#endif

static double zero__host_body_add(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_add_avx2(c, begin, end), zero__host_add_avx512(c, begin, end), i);
    zero__host_add_portable(c, i, end);
    return 0.0;
}

static zero_result zero__host_add(zero_device *dev, zero_queue q, void *dst, const void *src,
                                  zero_dtype dtype, size_t numel)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("add");
    if ((r = zero__host_check_buf("add", "dst", dst, dtype, numel)) != ZERO_OK) return r;
    if ((r = zero__host_check_buf("add", "src", src, dtype, numel)) != ZERO_OK) return r;
    memset(&c, 0, sizeof c);
    c.d = d;
    c.dst = dst;
    c.src = src;
    c.dtype = dtype;
    zero__host_for(d, numel, zero__host_body_add, &c);
    return ZERO_OK;
}

static double zero__host_body_scale(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_scale_avx2(c, begin, end), zero__host_scale_avx512(c, begin, end), i);
    zero__host_scale_portable(c, i, end);
    return 0.0;
}

static zero_result zero__host_scale(zero_device *dev, zero_queue q, void *x, zero_dtype dtype,
                                    size_t numel, float s)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("scale");
    if ((r = zero__host_check_buf("scale", "x", x, dtype, numel)) != ZERO_OK) return r;
    memset(&c, 0, sizeof c);
    c.d = d;
    c.dst = x;
    c.dtype = dtype;
    c.s = s;
    zero__host_for(d, numel, zero__host_body_scale, &c);
    return ZERO_OK;
}

static double zero__host_body_nonfinite(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    unsigned bad = 0;
    ZERO__HOST_SIMD(c, zero__host_nonfinite_avx2(c, begin, end, &bad),
                    zero__host_nonfinite_avx512(c, begin, end, &bad), i);
    bad |= zero__host_nonfinite_portable(c, i, end);
    return bad ? 1.0 : 0.0;
}

static zero_result zero__host_nonfinite(zero_device *dev, zero_queue q, const void *x,
                                        zero_dtype dtype, size_t numel, float *flag)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("nonfinite");
    if ((r = zero__host_check_buf("nonfinite", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!flag) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host nonfinite: flag is NULL");
    memset(&c, 0, sizeof c);
    c.d = d;
    c.src = x;
    c.dtype = dtype;
    if (zero__host_for(d, numel, zero__host_body_nonfinite, &c) > 0.0) *flag = 1.0f;
    return ZERO_OK;
}

/* The sum of squares of one block in fp64: lane k adds x[i]^2 for i = k mod 8 in order of
   i, then ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). Blocks start at multiples of 8 and the
   vector bodies stop at one, so the lanes follow the global index on every path. */
static double zero__host_body_sumsq(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_sumsq_avx2(c, begin, end, lane), zero__host_sumsq_avx512(c, begin, end, lane), i);
    zero__host_sumsq_portable(c, i, end, lane);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static zero_result zero__host_sumsq(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                                    size_t numel, double *acc)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("sumsq");
    if ((r = zero__host_check_buf("sumsq", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!acc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host sumsq: acc is NULL");
    memset(&c, 0, sizeof c);
    c.d = d;
    c.src = x;
    c.dtype = dtype;
    *acc += zero__host_for(d, numel, zero__host_body_sumsq, &c);
    return ZERO_OK;
}

static zero_result zero__host_grad_mul(zero_device *dev, zero_queue q, const double *sumsq,
                                       const float *nonfinite, float unscale, float clip_norm,
                                       float *out)
{
    ZERO__HOST_ENTER("grad_mul");
    (void)d;
    if (!sumsq || !nonfinite || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host grad_mul: %s is NULL",
                          !sumsq ? "sumsq" : !nonfinite ? "nonfinite" : "out");
    zero_grad_mul(*sumsq, *nonfinite, unscale, clip_norm, &out[0], &out[1]);
    return ZERO_OK;
}

static zero_result zero__host_adam(zero_device *dev, zero_queue q, const zero_adam_range *range,
                                   const zero_adam_coefs *coefs, const float *grad_mul,
                                   const float *skip)
{
    ZERO__HOST_ENTER("adam");
    if (!range || !coefs || !grad_mul)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host adam: %s is NULL",
                          !range ? "range" : !coefs ? "coefs" : "grad_mul");
    if (skip && *skip != 0.0f) return ZERO_OK;
    return zero_adam_host(range, coefs, *grad_mul, d->simd, d->threads);
}

/* ---- lifetime ---- */

static void zero__host_destroy(zero_device *dev)
{
    zero__host_device *d = zero__host_get(dev);
    zero_allocator a;
    size_t i;
    if (!d) return;
    a = d->allocator;
    for (i = 0; i < d->cap; i++)
        if (d->table[i].ptr) zero__free(&a, d->table[i].raw);
    zero__free(&a, d->table);
    pthread_mutex_destroy(&d->mu);
    d->base.impl = NULL;
    zero__free(&a, d);
}

static const zero_device_ops zero__host_ops = {
    "host",
    zero__host_destroy,
    zero__host_alloc,
    zero__host_free,
    NULL, /* reserve: nothing to gain from one arena on the host */
    zero__host_event_create,
    zero__host_event_destroy,
    zero__host_record,
    zero__host_wait,
    zero__host_sync,
    zero__host_native_queue,
    zero__host_copy,
    zero__host_upload,
    zero__host_download,
    zero__host_fill_zero,
    zero__host_cast,
    zero__host_add,
    zero__host_scale,
    zero__host_nonfinite,
    zero__host_sumsq,
    zero__host_grad_mul,
    zero__host_adam,
};

ZERODEF zero_result zero_host_device_create(const zero_host_device_desc *desc, zero_device **out)
{
    zero_host_device_desc def;
    zero__host_device *d;
    int rc;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: out is NULL");
    *out = NULL;
    if (!desc) {
        memset(&def, 0, sizeof def);
        desc = &def;
    }
    if (desc->threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: threads = %d", desc->threads);
    if ((int)desc->simd < ZERO_SIMD_AUTO || (int)desc->simd > ZERO_SIMD_AVX512)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: simd = %d", (int)desc->simd);
    if (desc->simd != ZERO_SIMD_AUTO && desc->simd > zero__simd_cpu())
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_host_device_create: simd %s unavailable (best: %s)",
                          zero_simd_name(desc->simd), zero_simd_name(zero__simd_cpu()));
    if ((desc->allocator.alloc != NULL) != (desc->allocator.free != NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_host_device_create: allocator needs both alloc and free, or neither");
    d = (zero__host_device *)zero__alloc(&desc->allocator, sizeof *d);
    if (!d) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_host_device_create: out of memory");
    memset(d, 0, sizeof *d);
    rc = pthread_mutex_init(&d->mu, NULL);
    if (rc != 0) {
        zero__free(&desc->allocator, d);
        return zero__fail(ZERO_ERROR_DEVICE, "zero_host_device_create: pthread_mutex_init failed: %s",
                          strerror(rc));
    }
    d->allocator = desc->allocator;
    d->simd = desc->simd == ZERO_SIMD_AUTO ? zero_simd_detect() : desc->simd;
    d->threads = desc->threads > 1 ? desc->threads : 1;
    d->base.ops = &zero__host_ops;
    d->base.impl = d;
    *out = &d->base;
    return ZERO_OK;
}

ZERODEF void zero_device_destroy(zero_device *dev)
{
    if (dev && dev->ops && dev->ops->destroy) dev->ops->destroy(dev);
}

ZERODEF zero_result zero_host_device_stats(zero_device *dev, size_t *bytes, size_t *allocations)
{
    zero__host_device *d = zero__host_get(dev);
    int rc;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_stats: dev is not a host device");
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_DEVICE, "zero_host_device_stats: pthread_mutex_lock failed: %s",
                          strerror(rc));
    if (bytes) memcpy(bytes, d->bytes, sizeof d->bytes);
    if (allocations) *allocations = d->count;
    pthread_mutex_unlock(&d->mu);
    return ZERO_OK;
}
/* Optimizer implementation: Adam/AdamW descriptors and per-step
   constants, and the host kernel: one fused pass per element (load the gradient in its
   dtype, multiply by grad_mul, zero_adam_update(), store master/m/v and the rounded
   param), portable / AVX2+FMA / AVX-512, on 1..T threads.

   Every path computes zero_adam_update()'s operations in its order: each multiply-add is
   an fmaf / vfmadd, every other product, quotient and square root is a separate IEEE
   operation, and the vector tails call zero_adam_update() itself. So each element's bits
   depend on its own inputs only: not on the path, the thread count or its position. (A
   -ffast-math build would break this: it lets the compiler use approximate reciprocals.) */

#include <pthread.h>

ZERODEF zero_result zero_adam_desc_resolve(zero_adam_desc *out, const zero_adam_desc *in)
{
    zero_adam_desc d;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_desc_resolve: out is NULL");
    if (in) {
        d = *in;
    } else {
        memset(&d, 0, sizeof d);
    }
    if (d.mode == ZERO_ADAM_DEFAULT) d.mode = ZERO_ADAMW;
    if (d.lr == 0.0f) d.lr = 1e-3f;
    if (d.beta1 == 0.0f) d.beta1 = 0.9f;
    if (d.beta2 == 0.0f) d.beta2 = 0.999f;
    if (d.eps == 0.0f) d.eps = 1e-8f;
    if (d.mode != ZERO_ADAMW && d.mode != ZERO_ADAM)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_desc_resolve: mode = %d",
                          (int)d.mode);
    /* comparisons written so that NaN fails them */
    if (!(d.lr >= 0.0f) || !isfinite(d.lr))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: lr = %g (must be finite and >= 0)", (double)d.lr);
    if (!(d.beta1 >= 0.0f && d.beta1 < 1.0f))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: beta1 = %g (must be in [0, 1))", (double)d.beta1);
    if (!(d.beta2 >= 0.0f && d.beta2 < 1.0f))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: beta2 = %g (must be in [0, 1))", (double)d.beta2);
    if (!(d.eps > 0.0f) || !isfinite(d.eps))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: eps = %g (must be finite and > 0)", (double)d.eps);
    if (!(d.weight_decay >= 0.0f) || !isfinite(d.weight_decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: weight_decay = %g (must be finite and >= 0)",
                          (double)d.weight_decay);
    *out = d;
    return ZERO_OK;
}

ZERODEF zero_result zero_adam_coefs_make(zero_adam_coefs *out, const zero_adam_desc *desc,
                                         float weight_decay, int64_t step)
{
    zero_adam_desc d;
    zero_adam_coefs c;
    double t, lr, b1, b2, wd, bc1, bc2;
    zero_result r;
    memset(&d, 0, sizeof d); /* resolve writes it on success; this quiets -O3's doubts */
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make: out is NULL");
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make: desc is NULL");
    r = zero_adam_desc_resolve(&d, desc);
    if (r != ZERO_OK) return r;
    if (step < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_coefs_make: step = %lld (steps count from 1)", (long long)step);
    if (!(weight_decay >= 0.0f) || !isfinite(weight_decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_coefs_make: weight_decay = %g (must be finite and >= 0)",
                          (double)weight_decay);
    t = (double)step;
    lr = (double)d.lr;
    b1 = (double)d.beta1;
    b2 = (double)d.beta2;
    wd = (double)weight_decay;
    bc1 = 1.0 - pow(b1, t);
    bc2 = 1.0 - pow(b2, t);
    c.beta1 = d.beta1;
    c.one_minus_beta1 = (float)(1.0 - b1);
    c.beta2 = d.beta2;
    c.one_minus_beta2 = (float)(1.0 - b2);
    c.step_size = (float)(lr / bc1);
    c.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    c.eps = d.eps;
    if (d.mode == ZERO_ADAMW) {
        c.decay = (float)(1.0 - lr * wd);
        c.l2 = 0.0f;
    } else {
        c.decay = 1.0f;
        c.l2 = weight_decay;
    }
    if (!isfinite(c.step_size) || !isfinite(c.inv_sqrt_bc2) || !isfinite(c.decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_coefs_make: lr = %g, weight_decay = %g at step %lld give a "
                          "coefficient that is not finite in fp32",
                          (double)d.lr, (double)weight_decay, (long long)step);
    *out = c;
    return ZERO_OK;
}

/* ---- the kernels: elements [begin, end) of one range ---- */

typedef struct zero__adam_job {
    const zero_adam_range *range;
    const zero_adam_coefs *coefs;
    float grad_mul;
    zero_simd path;
    size_t begin, end;
} zero__adam_job;

/* The element loop every path ends with (and the portable path is). */
static void zero__adam_scalar(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                              size_t i, size_t end)
{
    for (; i < end; i++) {
        float g;
        switch (r->grad_dtype) {
        case ZERO_F16: g = zero_f16_to_f32(((const uint16_t *)r->grad)[i]); break;
        case ZERO_BF16: g = zero_bf16_to_f32(((const uint16_t *)r->grad)[i]); break;
        default: g = ((const float *)r->grad)[i]; break;
        }
        zero_adam_update(g * grad_mul, &r->master[i], &r->m[i], &r->v[i], c);
        if (r->param) {
            switch (r->param_dtype) {
            case ZERO_F16: ((uint16_t *)r->param)[i] = zero_f32_to_f16(r->master[i]); break;
            case ZERO_BF16: ((uint16_t *)r->param)[i] = zero_f32_to_bf16(r->master[i]); break;
            default: ((float *)r->param)[i] = r->master[i]; break;
            }
        }
    }
}

#ifdef ZERO__X86_SIMD

/* GCC 12's AVX-512 headers make C++ -O2 warn "__Y may be used uninitialized" inside
   _mm512_undefined_*() (GCC PR 105593, fixed in GCC 13): a false positive. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ZERO__ADAM_POP_DIAGNOSTIC 1
#endif

/* The vector bodies take the dtypes as constants (the callers switch on them), so each
   combination compiles to its own loop with no per-vector branch. pk 0 = no param. */
#define ZERO__ADAM_NO_PARAM ((zero_dtype)0)

ZERO__AVX2 static inline __attribute__((always_inline)) void
zero__adam_avx2_body(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                     size_t *pi, size_t end, zero_dtype gk, zero_dtype pk)
{
    const __m256 gm = _mm256_set1_ps(grad_mul), l2 = _mm256_set1_ps(c->l2);
    const __m256 b1 = _mm256_set1_ps(c->beta1), omb1 = _mm256_set1_ps(c->one_minus_beta1);
    const __m256 b2 = _mm256_set1_ps(c->beta2), omb2 = _mm256_set1_ps(c->one_minus_beta2);
    const __m256 ibc2 = _mm256_set1_ps(c->inv_sqrt_bc2), eps = _mm256_set1_ps(c->eps);
    const __m256 decay = _mm256_set1_ps(c->decay), nstep = _mm256_set1_ps(-c->step_size);
    size_t i = *pi;
    for (; i + 8 <= end; i += 8) {
        __m256 g, p, m, v, mm, vv, denom, pp;
        if (gk == ZERO_F16) g = zero__f16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else if (gk == ZERO_BF16) g = zero__bf16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else g = _mm256_loadu_ps((const float *)r->grad + i);
        p = _mm256_loadu_ps(r->master + i);
        m = _mm256_loadu_ps(r->m + i);
        v = _mm256_loadu_ps(r->v + i);
        g = _mm256_mul_ps(g, gm);                                          /* g * grad_mul */
        g = _mm256_fmadd_ps(l2, p, g);                                     /* fmaf(l2, p, g) */
        mm = _mm256_fmadd_ps(b1, m, _mm256_mul_ps(omb1, g));
        vv = _mm256_fmadd_ps(b2, v, _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), ibc2, eps);
        pp = _mm256_mul_ps(p, decay);
        p = _mm256_fmadd_ps(nstep, _mm256_div_ps(mm, denom), pp);
        _mm256_storeu_ps(r->master + i, p);
        _mm256_storeu_ps(r->m + i, mm);
        _mm256_storeu_ps(r->v + i, vv);
        if (pk == ZERO_F16) zero__f32_to_f16x8_avx2((uint16_t *)r->param + i, p);
        else if (pk == ZERO_BF16) zero__f32_to_bf16x8_avx2((uint16_t *)r->param + i, p);
        else if (pk == ZERO_F32) _mm256_storeu_ps((float *)r->param + i, p);
    }
    *pi = i;
}

ZERO__AVX512 static inline __attribute__((always_inline)) void
zero__adam_avx512_body(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                       size_t *pi, size_t end, zero_dtype gk, zero_dtype pk)
{
    const __m512 gm = _mm512_set1_ps(grad_mul), l2 = _mm512_set1_ps(c->l2);
    const __m512 b1 = _mm512_set1_ps(c->beta1), omb1 = _mm512_set1_ps(c->one_minus_beta1);
    const __m512 b2 = _mm512_set1_ps(c->beta2), omb2 = _mm512_set1_ps(c->one_minus_beta2);
    const __m512 ibc2 = _mm512_set1_ps(c->inv_sqrt_bc2), eps = _mm512_set1_ps(c->eps);
    const __m512 decay = _mm512_set1_ps(c->decay), nstep = _mm512_set1_ps(-c->step_size);
    size_t i = *pi;
    for (; i + 16 <= end; i += 16) {
        __m512 g, p, m, v, mm, vv, denom, pp;
        if (gk == ZERO_F16) g = zero__f16x16_to_f32_avx512((const uint16_t *)r->grad + i);
        else if (gk == ZERO_BF16) g = zero__bf16x16_to_f32_avx512((const uint16_t *)r->grad + i);
        else g = _mm512_loadu_ps((const float *)r->grad + i);
        p = _mm512_loadu_ps(r->master + i);
        m = _mm512_loadu_ps(r->m + i);
        v = _mm512_loadu_ps(r->v + i);
        g = _mm512_mul_ps(g, gm);
        g = _mm512_fmadd_ps(l2, p, g);
        mm = _mm512_fmadd_ps(b1, m, _mm512_mul_ps(omb1, g));
        vv = _mm512_fmadd_ps(b2, v, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), ibc2, eps);
        pp = _mm512_mul_ps(p, decay);
        p = _mm512_fmadd_ps(nstep, _mm512_div_ps(mm, denom), pp);
        _mm512_storeu_ps(r->master + i, p);
        _mm512_storeu_ps(r->m + i, mm);
        _mm512_storeu_ps(r->v + i, vv);
        if (pk == ZERO_F16) zero__f32_to_f16x16_avx512((uint16_t *)r->param + i, p);
        else if (pk == ZERO_BF16) zero__f32_to_bf16x16_avx512((uint16_t *)r->param + i, p);
        else if (pk == ZERO_F32) _mm512_storeu_ps((float *)r->param + i, p);
    }
    *pi = i;
}

/* One case per (grad dtype, param dtype) pair, each a constant-folded copy of the body. */
#define ZERO__ADAM_DISPATCH(body)                                                            \
    do {                                                                                     \
        zero_dtype pk_ = r->param ? r->param_dtype : ZERO__ADAM_NO_PARAM;                    \
        switch (r->grad_dtype * 8 + pk_) {                                                   \
        case ZERO_F32 * 8 + 0: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO__ADAM_NO_PARAM); break; \
        case ZERO_F32 * 8 + ZERO_F32: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO_F32); break;    \
        case ZERO_F32 * 8 + ZERO_F16: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO_F16); break;    \
        case ZERO_F32 * 8 + ZERO_BF16: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO_BF16); break;  \
        case ZERO_F16 * 8 + 0: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO__ADAM_NO_PARAM); break; \
        case ZERO_F16 * 8 + ZERO_F32: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO_F32); break;    \
        case ZERO_F16 * 8 + ZERO_F16: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO_F16); break;    \
        case ZERO_F16 * 8 + ZERO_BF16: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO_BF16); break;  \
        case ZERO_BF16 * 8 + 0: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO__ADAM_NO_PARAM); break; \
        case ZERO_BF16 * 8 + ZERO_F32: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO_F32); break;  \
        case ZERO_BF16 * 8 + ZERO_F16: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO_F16); break;  \
        case ZERO_BF16 * 8 + ZERO_BF16: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO_BF16); break; \
        default: break; /* validated by zero_adam_host: cannot happen */                      \
        }                                                                                    \
    } while (0)

ZERO__AVX2 static void zero__adam_avx2(const zero_adam_range *r, const zero_adam_coefs *c,
                                       float grad_mul, size_t begin, size_t end)
{
    size_t i = begin;
    ZERO__ADAM_DISPATCH(zero__adam_avx2_body);
    zero__adam_scalar(r, c, grad_mul, i, end);
}

ZERO__AVX512 static void zero__adam_avx512(const zero_adam_range *r, const zero_adam_coefs *c,
                                           float grad_mul, size_t begin, size_t end)
{
    size_t i = begin;
    ZERO__ADAM_DISPATCH(zero__adam_avx512_body);
    zero__adam_scalar(r, c, grad_mul, i, end);
}

#ifdef ZERO__ADAM_POP_DIAGNOSTIC
#pragma GCC diagnostic pop
#undef ZERO__ADAM_POP_DIAGNOSTIC
#endif

#endif /* ZERO__X86_SIMD */

static void zero__adam_run(const zero__adam_job *job)
{
    if (job->begin >= job->end) return;
#ifdef ZERO__X86_SIMD
    if (job->path == ZERO_SIMD_AVX512) {
        zero__adam_avx512(job->range, job->coefs, job->grad_mul, job->begin, job->end);
        return;
    }
    if (job->path == ZERO_SIMD_AVX2) {
        zero__adam_avx2(job->range, job->coefs, job->grad_mul, job->begin, job->end);
        return;
    }
#endif
    zero__adam_scalar(job->range, job->coefs, job->grad_mul, job->begin, job->end);
}

static void *zero__adam_thread(void *arg)
{
    zero__adam_run((const zero__adam_job *)arg);
    return NULL;
}

#define ZERO__ADAM_MAX_THREADS 256

ZERODEF zero_result zero_adam_host(const zero_adam_range *range, const zero_adam_coefs *coefs,
                                   float grad_mul, zero_simd simd, int threads)
{
    zero__adam_job jobs[ZERO__ADAM_MAX_THREADS];
    pthread_t tids[ZERO__ADAM_MAX_THREADS];
    int started[ZERO__ADAM_MAX_THREADS];
    zero_simd path;
    size_t n, chunk;
    int t, nthreads, join_failed = 0;
    if (!range) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: range is NULL");
    if (!coefs) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: coefs is NULL");
    n = range->numel;
    if (range->grad_dtype != ZERO_F32 && range->grad_dtype != ZERO_F16 &&
        range->grad_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_host: grad_dtype = %d (%s): f32, f16 or bf16 only",
                          (int)range->grad_dtype, zero_dtype_name(range->grad_dtype));
    if (range->param && range->param_dtype != ZERO_F32 && range->param_dtype != ZERO_F16 &&
        range->param_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_host: param_dtype = %d (%s): f32, f16 or bf16 only",
                          (int)range->param_dtype, zero_dtype_name(range->param_dtype));
    if (n > 0 && (!range->master || !range->m || !range->v || !range->grad))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_host: %s is NULL with numel = %zu",
                          !range->master ? "master" : !range->m ? "m" : !range->v ? "v" : "grad",
                          n);
    if ((int)simd < ZERO_SIMD_AUTO || (int)simd > ZERO_SIMD_AVX512)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: simd = %d", (int)simd);
    if (threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: threads = %d", threads);
    if (simd == ZERO_SIMD_AUTO) {
        path = zero_simd_detect();
    } else {
        if (simd > zero__simd_cpu())
            return zero__fail(ZERO_ERROR_UNSUPPORTED,
                              "zero_adam_host: simd %s unavailable (best here: %s)",
                              zero_simd_name(simd), zero_simd_name(zero__simd_cpu()));
        path = simd;
    }
    if (n == 0) return ZERO_OK;

    /* Contiguous chunks whose starts are multiples of 64 elements (whole cache lines of
       fp32 state when the range is aligned); no more threads than chunks. */
    nthreads = threads < 1 ? 1 : threads > ZERO__ADAM_MAX_THREADS ? ZERO__ADAM_MAX_THREADS : threads;
    if ((size_t)nthreads > (n + 63) / 64) nthreads = (int)((n + 63) / 64);
    chunk = (n / (size_t)nthreads + (n % (size_t)nthreads != 0) + 63) / 64 * 64;
    for (t = 0; t < nthreads; t++) {
        size_t b = chunk * (size_t)t, e = b + chunk;
        jobs[t].range = range;
        jobs[t].coefs = coefs;
        jobs[t].grad_mul = grad_mul;
        jobs[t].path = path;
        jobs[t].begin = b < n ? b : n;
        jobs[t].end = e < n ? e : n;
        started[t] = 0;
    }
    if (nthreads == 1) {
        zero__adam_run(&jobs[0]);
        return ZERO_OK;
    }
    /* Chunks 1..T-1 on new threads, chunk 0 here; a chunk whose thread could not start
       runs here too, so no work is lost. */
    for (t = 1; t < nthreads; t++)
        started[t] = pthread_create(&tids[t], NULL, zero__adam_thread, &jobs[t]) == 0;
    zero__adam_run(&jobs[0]);
    for (t = 1; t < nthreads; t++)
        if (!started[t]) zero__adam_run(&jobs[t]);
    for (t = 1; t < nthreads; t++)
        if (started[t] && pthread_join(tids[t], NULL) != 0) join_failed = t;
    if (join_failed)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_adam_host: pthread_join of worker %d failed", join_failed);
    return ZERO_OK;
}
/* Scaler implementation: DeepSpeed's DynamicLossScaler rule.

   overflow:    if hysteresis == 1 or cur_hysteresis == 1: scale = max(scale / factor, min)
                else cur_hysteresis -= 1;  last_overflow_iter = iter
   no overflow: if consecutive_hysteresis: cur_hysteresis = hysteresis
                if (iter - last_overflow_iter) % window == 0:
                    if not consecutive_hysteresis: cur_hysteresis = hysteresis
                    scale *= factor (kept if the product would not be finite)
   then iter += 1. */

ZERODEF zero_result zero_scaler_init(zero_scaler *scaler, const zero_scaler_desc *desc,
                                     zero_dtype param_dtype)
{
    zero_scaler s;
    zero_scaler_desc d;
    int mode;
    if (!scaler) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_scaler_init: scaler is NULL");
    if (desc) {
        d = *desc;
    } else {
        memset(&d, 0, sizeof d);
    }
    mode = (int)d.mode;
    if (mode < ZERO_SCALER_DEFAULT || mode > ZERO_SCALER_NONE)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_scaler_init: mode = %d", mode);
    if (mode == ZERO_SCALER_DEFAULT) {
        if (param_dtype == ZERO_F16)
            mode = ZERO_SCALER_DYNAMIC;
        else if (param_dtype == ZERO_BF16 || param_dtype == ZERO_F32 || param_dtype == ZERO_F64)
            mode = ZERO_SCALER_NONE;
        else
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_scaler_init: param_dtype = %d: the default mode needs a "
                              "resolved dtype (f16, bf16, f32 or f64)",
                              (int)param_dtype);
    }
    if (d.init_scale == 0.0f) d.init_scale = 65536.0f;
    if (d.window == 0) d.window = 1000;
    if (d.hysteresis == 0) d.hysteresis = 2;
    if (d.min_scale == 0.0f) d.min_scale = 1.0f;
    if (d.factor == 0.0f) d.factor = 2.0f;
    /* !(x > 0) also refuses NaN */
    if (!(d.init_scale > 0.0f) || !isfinite(d.init_scale))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: init_scale = %g (must be finite and > 0)",
                          (double)d.init_scale);
    if (d.window < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: window = %d (must be >= 1)", d.window);
    if (d.hysteresis < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: hysteresis = %d (must be >= 1)", d.hysteresis);
    if (!(d.min_scale > 0.0f) || !isfinite(d.min_scale))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: min_scale = %g (must be finite and > 0)",
                          (double)d.min_scale);
    if (!(d.factor > 1.0f) || !isfinite(d.factor))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: factor = %g (must be finite and > 1)",
                          (double)d.factor);
    if (mode == ZERO_SCALER_DYNAMIC && d.min_scale > d.init_scale)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: min_scale = %g is above init_scale = %g",
                          (double)d.min_scale, (double)d.init_scale);

    s.scale = mode == ZERO_SCALER_NONE ? 1.0f : d.init_scale;
    s.factor = d.factor;
    s.min_scale = d.min_scale;
    s.window = d.window;
    s.hysteresis = d.hysteresis;
    s.cur_hysteresis = d.hysteresis;
    s.consecutive_hysteresis = d.consecutive_hysteresis != 0;
    s.dynamic = mode == ZERO_SCALER_DYNAMIC;
    s.iter = 0;
    s.last_overflow_iter = -1;
    *scaler = s;
    return ZERO_OK;
}

ZERODEF void zero_scaler_update(zero_scaler *scaler, int overflow)
{
    if (!scaler) return;
    if (scaler->dynamic) {
        if (overflow) {
            if (scaler->hysteresis == 1 || scaler->cur_hysteresis == 1) {
                float cut = scaler->scale / scaler->factor;
                scaler->scale = cut > scaler->min_scale ? cut : scaler->min_scale;
            } else {
                scaler->cur_hysteresis -= 1;
            }
            scaler->last_overflow_iter = scaler->iter;
        } else {
            if (scaler->consecutive_hysteresis) scaler->cur_hysteresis = scaler->hysteresis;
            if ((scaler->iter - scaler->last_overflow_iter) % scaler->window == 0) {
                float grown = scaler->scale * scaler->factor;
                if (!scaler->consecutive_hysteresis) scaler->cur_hysteresis = scaler->hysteresis;
                if (isfinite(grown)) scaler->scale = grown; /* an inf scale would never recover */
            }
        }
    } else if (overflow) {
        scaler->last_overflow_iter = scaler->iter;
    }
    scaler->iter += 1;
}
/* Engine implementation: ZeRO stages 0-3 over zero_device/zero_comm.

   Layout. The plan packs every group into a flat buffer of numel elements (padded to a
   multiple of world * align); shard r is [r * shard, (r + 1) * shard). The engine keeps
   one device allocation per kind of buffer; group g lives at a fixed offset in it:
     whole layout  (params at stages 0-2, user gradients at stages 0-1, stage-0 master,
                    m, v and accumulator): group g at off_whole[g] = sum of earlier numel
     shard layout  (master, m, v and the gradient accumulator at stages 1-3, stage-3
                    params of partitioned groups): group g at off_shard[g] = sum of earlier
                    shard numel
     stage-3 params: partitioned groups keep their shard, persistent groups their whole
                    buffer, at off_param[g].

   Gradient rule (the same at every stage, so an element's final gradient has the same bits
   everywhere): per micro-step k the group's gradients (param dtype) are cast to the comm
   dtype if it differs, reduced across ranks (SUM, rank order, one rounding: all-reduce at
   stage 0, reduce-scatter into the owner's shard at 1-3), and accumulated: k == 0 stores the
   reduced values, k > 0 adds them (device add: one rounding to the comm dtype).

   Queues. Work the user enqueues on COMPUTE is handed to COMM by recording ev_c2m on
   COMPUTE and making COMM wait on it; COMM work is handed back by ev_m2c. Buffers reused by
   COMPUTE after COMM read them (bucket slots, stage 0-1 gradient slices) wait on an event
   recorded on COMM after the reduction that read them. */

#define ZERO__ENG_MAX_ALLOCS 16
#define ZERO__ENG_SCRATCH_BYTES 64
/* scratch layout (bytes): sumsq f64 at 0, flag f32 at 8, grad_mul out[2] f32 at 12..19;
   at commit, the check f64[5] at 24..63 (hash halves, their negations, a failure code). */

enum { ZERO__ENG_CREATED = 0, ZERO__ENG_COMMITTED = 1, ZERO__ENG_BROKEN = 2 };
enum { ZERO__GRADS_NONE = 0, ZERO__GRADS_HANDED = 1, ZERO__GRADS_READY = 2 };

typedef struct zero__eng_group {
    size_t numel, shard_numel, used_numel;
    int persistent; /* stage 3 only */
    size_t off_whole, off_shard, off_param;
    int refs;            /* outstanding user gathers                          */
    int slot;            /* stage 3 gather slot, -1 when not gathered         */
    int grads_state;     /* ZERO__GRADS_*                                     */
    int bucket;          /* stages 2-3: bucket slot of this micro-step        */
    zero_event *ev_gathered; /* stage 3: recorded on COMM after the all-gather */
    zero_event *ev_reduced;  /* stages 0-1: recorded on COMM after the reduction */
    int reduced_valid;
} zero__eng_group;

typedef struct zero__eng_slot {
    int group;      /* -1 free */
    zero_event *ev; /* buckets: recorded on COMM after the reduction that read the slot */
    int ev_valid;
} zero__eng_slot;

typedef struct zero__eng_allocation {
    void *ptr;
    size_t bytes;
    zero_mem_category cat;
} zero__eng_allocation;

struct zero_engine {
    zero_engine_desc d; /* resolved */
    zero_adam_desc adam;
    zero_scaler scaler;
    zero_device *dev;
    zero_comm *comm;
    int rank, world, stage, accum, depth;
    int state;
    zero_dtype gd, cd; /* param/gradient dtype, comm/accumulation dtype */
    size_t p, c;       /* their sizes */
    zero_plan *plan;
    unsigned *tflags;
    int ntensors, cap_tensors;
    int G;
    zero__eng_group *groups;
    size_t P, S, M, Mnp;
    int alias; /* the accumulator is the user gradient buffer (stages 0-1, accum 1, cd == gd) */
    /* device buffers */
    unsigned char *param, *grad_user, *grad_acc, *bucket, *tc, *ts, *gather, *scratch;
    float *master, *m1, *m2;
    zero__eng_allocation allocs[ZERO__ENG_MAX_ALLOCS];
    int nallocs;
    size_t mem[ZERO_MEM_COUNT], mem_peak[ZERO_MEM_COUNT], mem_total, mem_peak_total;
    /* stage 2-3 gradient buckets, stage 3 gather slots */
    zero__eng_slot *bslots;
    int nbslots, bcursor;
    zero__eng_slot *gslots;
    int ngslots;
    size_t gslot_numel, bslot_numel;
    zero_gather_stats gstats;
    int last_gathered, grads_seen; /* prefetch direction within a micro-step */
    /* events */
    zero_event *ev_c2m, *ev_m2c;
    /* micro-steps */
    int micro;          /* complete micro-steps in this step                 */
    int ready_in_micro; /* groups ready in the current micro-step            */
    int *pending;
    int npending;
    size_t pending_numel;
    /* step */
    int64_t step;
    zero_traffic traffic_total, traffic_cur, traffic_last;
    /* async_step: a step enqueued, its verdict not read yet */
    int step_pending;
    float pending_scale_used;
    zero_event *ev_step;
    zero_step_info last_info;
};

/* ---- small helpers ---------------------------------------------------------------------- */

ZERODEF const char *zero_coll_name(zero_coll kind)
{
    switch (kind) {
    case ZERO_COLL_ALL_GATHER: return "all_gather";
    case ZERO_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO_COLL_ALL_REDUCE: return "all_reduce";
    case ZERO_COLL_BROADCAST: return "broadcast";
    case ZERO_COLL_CONTROL: return "control";
    case ZERO_COLL_COUNT: break;
    }
    return "?";
}

ZERODEF double zero_traffic_payload_numel(const zero_traffic *t)
{
    double s = 0.0;
    int k;
    if (!t) return 0.0;
    for (k = 0; k < ZERO_COLL_CONTROL; k++) s += t->numel[k];
    return s;
}

/* Copies the calling thread's last error text (bounded), to quote it in a new one. */
static void zero__eng_copy_error(char *dst, size_t n)
{
    const char *src = zero_last_error();
    size_t i;
    for (i = 0; i + 1 < n && src[i]; i++) dst[i] = src[i];
    dst[i] = '\0';
}

/* Keeps the detail of a backend failure, prefixed with what the engine was doing, and
   marks the engine broken (a collective or device op failed half way). */
static zero_result zero__eng_break(zero_engine *e, zero_result r, const char *what)
{
    char prev[400];
    zero__eng_copy_error(prev, sizeof prev);
    if (e && e->state == ZERO__ENG_COMMITTED) e->state = ZERO__ENG_BROKEN;
    return zero__fail(r, "zero_engine: %s failed (engine broken): %.380s", what, prev);
}

#define ZERO__ENG_TRY(e, call, what)                                                          \
    do {                                                                                     \
        zero_result zr_ = (call);                                                            \
        if (zr_ != ZERO_OK) return zero__eng_break((e), zr_, (what));                        \
    } while (0)

static zero_result zero__eng_usable(const zero_engine *e, const char *fn)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: engine is NULL", fn);
    if (e->state == ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: engine not committed", fn);
    if (e->state == ZERO__ENG_BROKEN)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: engine broken by an earlier device or comm failure; destroy it",
                          fn);
    return ZERO_OK;
}

static zero_result zero__eng_group_arg(const zero_engine *e, int group, const char *fn)
{
    if (group < 0 || group >= e->G)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "%s: group %d unknown (groups 0..%d)", fn, group,
                          e->G - 1);
    return ZERO_OK;
}

static zero_result zero__eng_record(zero_engine *e, zero_queue q, zero_event *ev)
{
    if (!ev || !e->dev->ops->record) return ZERO_OK;
    return e->dev->ops->record(e->dev, q, ev);
}

static zero_result zero__eng_wait(zero_engine *e, zero_queue q, zero_event *ev)
{
    if (!ev || !e->dev->ops->wait) return ZERO_OK;
    return e->dev->ops->wait(e->dev, q, ev);
}

/* Orders 'to' after everything enqueued on 'from' so far. */
static zero_result zero__eng_handoff(zero_engine *e, zero_queue from, zero_queue to)
{
    zero_event *ev = from == ZERO_QUEUE_COMPUTE ? e->ev_c2m : e->ev_m2c;
    zero_result r = zero__eng_record(e, from, ev);
    if (r == ZERO_OK) r = zero__eng_wait(e, to, ev);
    return r;
}

static void *zero__eng_comm_queue(zero_engine *e)
{
    return e->dev->ops->native_queue ? e->dev->ops->native_queue(e->dev, ZERO_QUEUE_COMM) : NULL;
}

/* ---- counted collectives ------------------------------------------------------------------ */

static void zero__eng_count(zero_engine *e, zero_coll kind, double numel, zero_dtype dtype)
{
    double bytes = numel * (double)zero_dtype_size(dtype);
    e->traffic_cur.calls[kind]++;
    e->traffic_cur.numel[kind] += numel;
    e->traffic_cur.bytes[kind] += bytes;
    e->traffic_total.calls[kind]++;
    e->traffic_total.numel[kind] += numel;
    e->traffic_total.bytes[kind] += bytes;
}

static zero_result zero__eng_all_gather(zero_engine *e, const void *send, void *recv,
                                        size_t send_numel, zero_dtype dtype)
{
    zero_result r = e->comm->ops->all_gather(e->comm, send, recv, send_numel, dtype,
                                             zero__eng_comm_queue(e));
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_ALL_GATHER, (double)send_numel * (double)(e->world - 1),
                        dtype);
    return r;
}

static zero_result zero__eng_reduce_scatter(zero_engine *e, const void *send, void *recv,
                                            size_t recv_numel, zero_dtype dtype)
{
    zero_result r = e->comm->ops->reduce_scatter(e->comm, send, recv, recv_numel, dtype,
                                                 ZERO_OP_SUM, zero__eng_comm_queue(e));
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_REDUCE_SCATTER,
                        (double)recv_numel * (double)(e->world - 1), dtype);
    return r;
}

static zero_result zero__eng_all_reduce(zero_engine *e, const void *send, void *recv,
                                        size_t numel, zero_dtype dtype, zero_op op, int control)
{
    zero_result r = e->comm->ops->all_reduce(e->comm, send, recv, numel, dtype, op,
                                             zero__eng_comm_queue(e));
    if (r == ZERO_OK)
        zero__eng_count(e, control ? ZERO_COLL_CONTROL : ZERO_COLL_ALL_REDUCE,
                        2.0 * (double)numel * (double)(e->world - 1) / (double)e->world, dtype);
    return r;
}

static zero_result zero__eng_group_start(zero_engine *e)
{
    return e->comm->ops->group_start ? e->comm->ops->group_start(e->comm) : ZERO_OK;
}

static zero_result zero__eng_group_end(zero_engine *e)
{
    return e->comm->ops->group_end ? e->comm->ops->group_end(e->comm) : ZERO_OK;
}

/* A failure between group_start and group_end: break the engine, then close the comm's
   group (NCCL's stays open per thread otherwise, and its queued calls would run on buffers
   destroy frees), keeping the first failure's message. */
static zero_result zero__eng_break_in_group(zero_engine *e, zero_result r, const char *what)
{
    char msg[512];
    r = zero__eng_break(e, r, what);
    snprintf(msg, sizeof msg, "%s", zero_last_error());
    (void)zero__eng_group_end(e);
    return zero__fail(r, "%s", msg);
}

#define ZERO__ENG_TRY_IN_GROUP(e, call, what)                                                 \
    do {                                                                                     \
        zero_result zr_ = (call);                                                            \
        if (zr_ != ZERO_OK) return zero__eng_break_in_group((e), zr_, (what));               \
    } while (0)

/* ---- create / destroy / register ---------------------------------------------------------- */

static int zero__eng_dtype_ok(zero_dtype d)
{
    return d == ZERO_F16 || d == ZERO_BF16 || d == ZERO_F32;
}

ZERODEF zero_result zero_engine_create(const zero_engine_desc *desc, zero_engine **out)
{
    zero_engine_desc d;
    zero_engine *e;
    zero_result r;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: desc is NULL");
    d = *desc;
    if (d.stage < 0 || d.stage > 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: stage = %d (0..3)",
                          d.stage);
    if (d.param_dtype == ZERO_DTYPE_DEFAULT) d.param_dtype = ZERO_F16;
    if (!zero__eng_dtype_ok(d.param_dtype))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: param_dtype = %d (f16, bf16 or f32)",
                          (int)d.param_dtype);
    if (d.grad_comm_dtype == ZERO_DTYPE_DEFAULT) d.grad_comm_dtype = d.param_dtype;
    if (!zero__eng_dtype_ok(d.grad_comm_dtype))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: grad_comm_dtype = %d (f16, bf16 or f32)",
                          (int)d.grad_comm_dtype);
    if (!(d.clip_norm >= 0.0f) || isinf(d.clip_norm))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: clip_norm = %g (finite, >= 0)", (double)d.clip_norm);
    if (d.accum_steps < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: accum_steps = %d",
                          d.accum_steps);
    if (d.accum_steps == 0) d.accum_steps = 1;
    if (d.prefetch_depth == 0) d.prefetch_depth = 1;
    if (d.prefetch_depth < 0) d.prefetch_depth = -1;
    if (d.host_threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: host_threads = %d",
                          d.host_threads);
    if (d.host_threads == 0) d.host_threads = 1;
    if (d.align_numel == 0) d.align_numel = ZERO_DEFAULT_ALIGN_NUMEL;
    if (!d.device || !d.device->ops)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: device is NULL");
    if (!d.comm || !d.comm->ops)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: comm is NULL");
    if (d.comm->world < 1 || d.comm->rank < 0 || d.comm->rank >= d.comm->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: comm has rank %d of world %d", d.comm->rank,
                          d.comm->world);
    {
        const zero_device_ops *o = d.device->ops;
        if (!o->alloc || !o->free || !o->copy || !o->upload || !o->download || !o->fill_zero ||
            !o->cast || !o->add || !o->nonfinite || !o->sumsq || !o->grad_mul || !o->adam ||
            !o->sync)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: device '%s' lacks a required op",
                              o->name ? o->name : "?");
        if (!d.comm->ops->all_gather || !d.comm->ops->reduce_scatter || !d.comm->ops->all_reduce)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: comm lacks a required collective");
    }
    if ((d.allocator.alloc == NULL) != (d.allocator.free == NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: allocator needs both alloc and free");
    e = (zero_engine *)zero__alloc(&d.allocator, sizeof *e);
    if (!e) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_create: %zu bytes", sizeof *e);
    memset(e, 0, sizeof *e);
    r = zero_adam_desc_resolve(&e->adam, &d.adam);
    if (r == ZERO_OK) r = zero_scaler_init(&e->scaler, &d.scaler, d.param_dtype);
    if (r == ZERO_OK) r = zero_plan_create(&e->plan, &d.allocator);
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        zero_plan_destroy(e->plan);
        zero__free(&d.allocator, e);
        return zero__fail(r, "zero_engine_create: %.380s", prev);
    }
    d.adam = e->adam;
    e->d = d;
    e->dev = d.device;
    e->comm = d.comm;
    e->rank = d.comm->rank;
    e->world = d.comm->world;
    e->stage = d.stage;
    e->accum = d.accum_steps;
    e->depth = d.prefetch_depth > 0 ? d.prefetch_depth : 0;
    e->gd = d.param_dtype;
    e->cd = d.grad_comm_dtype;
    e->p = zero_dtype_size(e->gd);
    e->c = zero_dtype_size(e->cd);
    e->state = ZERO__ENG_CREATED;
    e->last_gathered = -1;
    *out = e;
    return ZERO_OK;
}

static void zero__eng_free_device(zero_engine *e)
{
    int i;
    for (i = e->nallocs - 1; i >= 0; i--) {
        e->dev->ops->free(e->dev, e->allocs[i].ptr);
        e->mem[e->allocs[i].cat] -= e->allocs[i].bytes;
        e->mem_total -= e->allocs[i].bytes;
    }
    e->nallocs = 0;
}

ZERODEF void zero_engine_destroy(zero_engine *e)
{
    const zero_allocator *a;
    int g, i;
    if (!e) return;
    a = &e->d.allocator;
    if (e->dev) {
        /* Let queued work finish before freeing what it may touch (errors are moot here). */
        if (e->nallocs > 0 && e->dev->ops->sync) {
            (void)e->dev->ops->sync(e->dev, ZERO_QUEUE_COMM);
            (void)e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE);
            if (e->ev_step) (void)e->dev->ops->sync(e->dev, ZERO_QUEUE_OFFLOAD);
        }
        zero__eng_free_device(e);
        if (e->dev->ops->event_destroy) {
            if (e->groups)
                for (g = 0; g < e->G; g++) {
                    if (e->groups[g].ev_gathered)
                        e->dev->ops->event_destroy(e->dev, e->groups[g].ev_gathered);
                    if (e->groups[g].ev_reduced)
                        e->dev->ops->event_destroy(e->dev, e->groups[g].ev_reduced);
                }
            if (e->bslots)
                for (i = 0; i < e->nbslots; i++)
                    if (e->bslots[i].ev) e->dev->ops->event_destroy(e->dev, e->bslots[i].ev);
            if (e->ev_c2m) e->dev->ops->event_destroy(e->dev, e->ev_c2m);
            if (e->ev_m2c) e->dev->ops->event_destroy(e->dev, e->ev_m2c);
            if (e->ev_step) e->dev->ops->event_destroy(e->dev, e->ev_step);
        }
    }
    zero__free(a, e->groups);
    zero__free(a, e->bslots);
    zero__free(a, e->gslots);
    zero__free(a, e->pending);
    zero__free(a, e->tflags);
    zero_plan_destroy(e->plan);
    zero__free(a, e);
}

ZERODEF zero_result zero_engine_get_desc(const zero_engine *e, zero_engine_desc *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_get_desc: NULL");
    *out = e->d;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_add_tensor(zero_engine *e, const char *name, size_t numel,
                                           int group, unsigned flags, int *out_tensor)
{
    zero_result r;
    int id = -1;
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_add_tensor: engine is NULL");
    if (e->state != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_add_tensor: '%.200s' registered after commit",
                          name ? name : "(null)");
    if (flags & ~(unsigned)ZERO_TENSOR_NO_DECAY)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_add_tensor: flags = 0x%x",
                          flags);
    if (e->ntensors == e->cap_tensors) {
        int cap = e->cap_tensors ? 2 * e->cap_tensors : 64;
        unsigned *nf = (unsigned *)zero__alloc(&e->d.allocator, (size_t)cap * sizeof *nf);
        if (!nf) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_add_tensor");
        if (e->ntensors) memcpy(nf, e->tflags, (size_t)e->ntensors * sizeof *nf);
        zero__free(&e->d.allocator, e->tflags);
        e->tflags = nf;
        e->cap_tensors = cap;
    }
    r = zero_plan_add(e->plan, name, numel, group, &id);
    if (r != ZERO_OK) return r;
    e->tflags[id] = flags;
    e->ntensors = id + 1;
    if (out_tensor) *out_tensor = id;
    return ZERO_OK;
}

ZERODEF const zero_plan *zero_engine_plan(const zero_engine *e)
{
    return (e && e->state != ZERO__ENG_CREATED) ? e->plan : NULL;
}

/* ---- commit ------------------------------------------------------------------------------ */

/* FNV-1a over 64-bit words. */
static uint64_t zero__eng_mix(uint64_t h, uint64_t v)
{
    int i;
    for (i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t zero__eng_fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Everything the ranks must agree on: the plan, the settings and the tensor flags. */
static uint64_t zero__eng_hash(const zero_engine *e)
{
    uint64_t h = zero_plan_hash(e->plan);
    const zero_engine_desc *d = &e->d;
    int t;
    h = zero__eng_mix(h, (uint64_t)d->stage);
    h = zero__eng_mix(h, (uint64_t)d->param_dtype);
    h = zero__eng_mix(h, (uint64_t)d->grad_comm_dtype);
    h = zero__eng_mix(h, (uint64_t)d->accum_steps);
    h = zero__eng_mix(h, (uint64_t)d->reduce_bucket_numel);
    h = zero__eng_mix(h, (uint64_t)d->max_live_numel);
    h = zero__eng_mix(h, (uint64_t)(int64_t)d->prefetch_depth);
    h = zero__eng_mix(h, (uint64_t)d->persist_numel);
    h = zero__eng_mix(h, zero__eng_fbits(d->clip_norm));
    h = zero__eng_mix(h, (uint64_t)e->adam.mode);
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.lr));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.beta1));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.beta2));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.eps));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.weight_decay));
    h = zero__eng_mix(h, zero__eng_fbits(e->scaler.scale));
    h = zero__eng_mix(h, (uint64_t)e->scaler.dynamic);
    h = zero__eng_mix(h, zero__eng_fbits(e->scaler.factor));
    h = zero__eng_mix(h, zero__eng_fbits(e->scaler.min_scale));
    h = zero__eng_mix(h, (uint64_t)(int64_t)e->scaler.window);
    h = zero__eng_mix(h, (uint64_t)(int64_t)e->scaler.hysteresis);
    h = zero__eng_mix(h, (uint64_t)d->align_numel);
    for (t = 0; t < e->ntensors; t++) h = zero__eng_mix(h, (uint64_t)e->tflags[t]);
    return h;
}

static zero_result zero__eng_alloc(zero_engine *e, size_t bytes, zero_mem_category cat, void **out)
{
    zero_result r;
    void *p = NULL;
    *out = NULL;
    if (bytes == 0) return ZERO_OK;
    if (e->nallocs == ZERO__ENG_MAX_ALLOCS)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine: too many allocations");
    r = e->dev->ops->alloc(e->dev, bytes, cat, &p);
    if (r != ZERO_OK) return r;
    e->allocs[e->nallocs].ptr = p;
    e->allocs[e->nallocs].bytes = bytes;
    e->allocs[e->nallocs].cat = cat;
    e->nallocs++;
    e->mem[cat] += bytes;
    if (e->mem[cat] > e->mem_peak[cat]) e->mem_peak[cat] = e->mem[cat];
    e->mem_total += bytes;
    if (e->mem_total > e->mem_peak_total) e->mem_peak_total = e->mem_total;
    *out = p;
    return ZERO_OK;
}

/* The byte sizes of every buffer, in allocation order (scratch first). */
typedef struct zero__eng_sizes {
    size_t bytes[12];
    zero_mem_category cat[12];
    int n;
} zero__eng_sizes;

enum {
    ZERO__B_SCRATCH = 0, ZERO__B_PARAM, ZERO__B_GRAD_USER, ZERO__B_GRAD_ACC, ZERO__B_MASTER,
    ZERO__B_M1, ZERO__B_M2, ZERO__B_BUCKET, ZERO__B_TC, ZERO__B_TS, ZERO__B_GATHER, ZERO__B_N
};

/* Fills the group table and the sizes from the committed plan. */
static zero_result zero__eng_layout(zero_engine *e, zero__eng_sizes *sz)
{
    int g, G = zero_plan_num_groups(e->plan);
    size_t ow = 0, os = 0, op = 0, pparam = 0, Ms;
    const zero_allocator *a = &e->d.allocator;
    int ovf = 0;
    e->G = G;
    e->groups = (zero__eng_group *)zero__alloc(a, (size_t)G * sizeof *e->groups);
    e->pending = (int *)zero__alloc(a, (size_t)G * sizeof *e->pending);
    if (!e->groups || !e->pending)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: group tables");
    memset(e->groups, 0, (size_t)G * sizeof *e->groups);
    e->M = e->Mnp = 0;
    for (g = 0; g < G; g++) {
        zero_group_info gi;
        zero__eng_group *eg = &e->groups[g];
        zero_result r;
        memset(&gi, 0, sizeof gi);
        r = zero_plan_group(e->plan, g, &gi);
        if (r != ZERO_OK) return r;
        eg->numel = gi.numel;
        eg->shard_numel = gi.shard_numel;
        eg->used_numel = gi.used_numel;
        eg->persistent = e->stage == 3 && gi.persistent;
        eg->off_whole = ow;
        eg->off_shard = os;
        eg->off_param = op;
        eg->slot = -1;
        eg->bucket = -1;
        ovf |= zero__add_size(ow, gi.numel, &ow);
        ovf |= zero__add_size(os, gi.shard_numel, &os);
        pparam = (e->stage == 3 && !eg->persistent) ? gi.shard_numel : gi.numel;
        ovf |= zero__add_size(op, pparam, &op);
        if (gi.numel > e->M) e->M = gi.numel;
        if (!eg->persistent && gi.numel > e->Mnp) e->Mnp = gi.numel;
    }
    e->P = ow;
    e->S = os;
    Ms = e->M / (size_t)e->world;
    e->alias = e->stage <= 1 && e->accum == 1 && e->cd == e->gd;
    memset(sz, 0, sizeof *sz);
    sz->n = ZERO__B_N;
    sz->cat[ZERO__B_SCRATCH] = ZERO_MEM_SCRATCH;
    sz->bytes[ZERO__B_SCRATCH] = ZERO__ENG_SCRATCH_BYTES;
    sz->cat[ZERO__B_PARAM] = ZERO_MEM_PARAM;
    ovf |= zero__mul_size(op, e->p, &sz->bytes[ZERO__B_PARAM]);
    sz->cat[ZERO__B_GRAD_USER] = ZERO_MEM_GRAD;
    if (e->stage <= 1) ovf |= zero__mul_size(e->P, e->p, &sz->bytes[ZERO__B_GRAD_USER]);
    sz->cat[ZERO__B_GRAD_ACC] = ZERO_MEM_GRAD;
    if (!e->alias)
        ovf |= zero__mul_size(e->stage == 0 ? e->P : e->S, e->c, &sz->bytes[ZERO__B_GRAD_ACC]);
    sz->cat[ZERO__B_MASTER] = ZERO_MEM_MASTER;
    sz->cat[ZERO__B_M1] = ZERO_MEM_MOMENT1;
    sz->cat[ZERO__B_M2] = ZERO_MEM_MOMENT2;
    ovf |= zero__mul_size(e->stage == 0 ? e->P : e->S, 4, &sz->bytes[ZERO__B_MASTER]);
    sz->bytes[ZERO__B_M1] = sz->bytes[ZERO__B_M2] = sz->bytes[ZERO__B_MASTER];
    sz->cat[ZERO__B_BUCKET] = sz->cat[ZERO__B_TC] = sz->cat[ZERO__B_TS] = ZERO_MEM_BUCKET;
    if (e->stage >= 2) {
        /* ceil(max(B, 2M) / M) slots, computed without overflow (B may be SIZE_MAX: "one
           bucket for everything"), capped at max(G, 2): each group holds at most one slot
           per micro-step, so more slots could never be used. */
        size_t want = e->d.reduce_bucket_numel, slots, cap = G > 2 ? (size_t)G : 2;
        slots = want / e->M + (want % e->M != 0);
        if (slots < 2) slots = 2;
        if (slots > cap) slots = cap;
        e->bslot_numel = e->M;
        e->nbslots = (int)slots;
        ovf |= zero__mul_size(slots, e->M, &want);
        ovf |= zero__mul_size(want, e->p, &sz->bytes[ZERO__B_BUCKET]);
    }
    if (e->cd != e->gd) ovf |= zero__mul_size(e->M, e->c, &sz->bytes[ZERO__B_TC]);
    if (e->stage >= 1 && e->accum > 1) ovf |= zero__mul_size(Ms, e->c, &sz->bytes[ZERO__B_TS]);
    sz->cat[ZERO__B_GATHER] = ZERO_MEM_GATHER;
    if (e->stage == 3 && e->Mnp > 0) {
        size_t live = e->d.max_live_numel;
        if (live == 0) {
            ovf |= zero__mul_size(e->Mnp, (size_t)(2 + e->depth), &live);
            e->d.max_live_numel = live;
        }
        if (e->Mnp > live)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_commit: a stage-3 group of %zu elements exceeds "
                              "max_live_numel = %zu",
                              e->Mnp, live);
        e->gslot_numel = e->Mnp;
        {   /* clamp in size_t first: max_live_numel may be SIZE_MAX ("no limit") */
            size_t slots = live / e->Mnp;
            if (slots > (size_t)G) slots = (size_t)G;
            e->ngslots = (int)slots;
            ovf |= zero__mul_size(slots, e->Mnp, &live);
            ovf |= zero__mul_size(live, e->p, &sz->bytes[ZERO__B_GATHER]);
        }
    }
    if (ovf) return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: sizes overflow size_t");
    return ZERO_OK;
}

static zero_result zero__eng_make_events(zero_engine *e)
{
    const zero_allocator *a = &e->d.allocator;
    zero_device *dev = e->dev;
    int g, i;
    zero_result r = ZERO_OK;
    if (e->nbslots > 0) {
        e->bslots = (zero__eng_slot *)zero__alloc(a, (size_t)e->nbslots * sizeof *e->bslots);
        if (!e->bslots) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit");
        memset(e->bslots, 0, (size_t)e->nbslots * sizeof *e->bslots);
        for (i = 0; i < e->nbslots; i++) e->bslots[i].group = -1;
    }
    if (e->ngslots > 0) {
        e->gslots = (zero__eng_slot *)zero__alloc(a, (size_t)e->ngslots * sizeof *e->gslots);
        if (!e->gslots) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit");
        memset(e->gslots, 0, (size_t)e->ngslots * sizeof *e->gslots);
        for (i = 0; i < e->ngslots; i++) e->gslots[i].group = -1;
    }
    if (!dev->ops->event_create) return ZERO_OK;
    for (g = 0; g < e->G && r == ZERO_OK; g++) {
        if (e->stage == 3 && !e->groups[g].persistent)
            r = dev->ops->event_create(dev, &e->groups[g].ev_gathered);
        if (r == ZERO_OK && e->stage <= 1)
            r = dev->ops->event_create(dev, &e->groups[g].ev_reduced);
    }
    for (i = 0; i < e->nbslots && r == ZERO_OK; i++)
        r = dev->ops->event_create(dev, &e->bslots[i].ev);
    return r;
}

ZERODEF zero_result zero_engine_commit(zero_engine *e)
{
    zero__eng_sizes sz;
    zero_result r, plan_r, alloc_r = ZERO_OK;
    void *ptrs[ZERO__B_N];
    size_t total = 0;
    int i, nalloc = 0;
    char plan_err[400], alloc_err[400];
    uint64_t h;
    double hv[5];
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_commit: engine is NULL");
    if (e->state != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_commit: already committed");
    /* From here on a failure leaves the engine broken (destroy only). */
    e->state = ZERO__ENG_COMMITTED;
    memset(ptrs, 0, sizeof ptrs);
    plan_err[0] = alloc_err[0] = '\0';
    plan_r = e->ntensors == 0
                 ? zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_commit: no tensor registered")
                 : zero_plan_commit(e->plan, e->world, e->d.align_numel,
                                    e->stage == 3 ? e->d.persist_numel : 0);
    if (plan_r == ZERO_OK) plan_r = zero__eng_layout(e, &sz);
    if (plan_r == ZERO_OK)
        for (i = 0; i < sz.n; i++)
            if (sz.bytes[i]) {
                if (zero__add_size(total, sz.bytes[i], &total)) {
                    plan_r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: total size");
                    break;
                }
                nalloc++;
            }
    if (plan_r != ZERO_OK) {
        zero__eng_copy_error(plan_err, sizeof plan_err);
        memset(&sz, 0, sizeof sz);
        sz.n = 1;
        sz.cat[0] = ZERO_MEM_SCRATCH;
        sz.bytes[0] = ZERO__ENG_SCRATCH_BYTES;
        total = ZERO__ENG_SCRATCH_BYTES;
        nalloc = 1;
    }
    /* Every rank allocates first and then joins the check, also one whose plan or whose
       allocations failed: it reports the failure through the check, so every rank fails
       together and none waits in a collective for a rank that already returned. Only a rank
       that cannot get even the 64-byte scratch (which the check runs on) returns at once;
       its peers then wait until the comm fails (timeout, abort, or its comm destroyed). */
    if (e->dev->ops->reserve) {
        r = e->dev->ops->reserve(e->dev, total, (size_t)nalloc);
        if (r != ZERO_OK) {
            char prev[360];
            zero__eng_copy_error(prev, sizeof prev);
            alloc_r = r;
            snprintf(alloc_err, sizeof alloc_err, "zero_engine_commit: reserve(%zu bytes): %s",
                     total, prev);
        }
    }
    r = zero__eng_alloc(e, sz.bytes[0], ZERO_MEM_SCRATCH, &ptrs[0]);
    if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_commit: scratch allocation");
    e->scratch = (unsigned char *)ptrs[0];
    for (i = 1; i < sz.n && alloc_r == ZERO_OK; i++) {
        r = zero__eng_alloc(e, sz.bytes[i], sz.cat[i], &ptrs[i]);
        if (r != ZERO_OK) {
            char prev[300];
            zero__eng_copy_error(prev, sizeof prev);
            alloc_r = r;
            snprintf(alloc_err, sizeof alloc_err,
                     "zero_engine_commit: allocating %zu bytes of %s: %s", sz.bytes[i],
                     zero_mem_category_name(sz.cat[i]), prev);
        }
    }
    if (e->dev->ops->event_create && !e->ev_c2m) {
        r = e->dev->ops->event_create(e->dev, &e->ev_c2m);
        if (r == ZERO_OK) r = e->dev->ops->event_create(e->dev, &e->ev_m2c);
        if (r != ZERO_OK) /* the hand-offs below need them */
            return zero__eng_break(e, r, "zero_engine_commit: event");
    }
    if (plan_r == ZERO_OK && alloc_r == ZERO_OK) {
        r = zero__eng_make_events(e);
        if (r != ZERO_OK) {
            char prev[360];
            zero__eng_copy_error(prev, sizeof prev);
            alloc_r = r;
            snprintf(alloc_err, sizeof alloc_err, "zero_engine_commit: events: %s", prev);
        }
    }
    h = plan_r == ZERO_OK ? zero__eng_hash(e) : 0;
    hv[0] = plan_r == ZERO_OK ? (double)(h >> 32) : -1.0;
    hv[1] = plan_r == ZERO_OK ? (double)(h & 0xffffffffu) : -1.0;
    hv[2] = -hv[0];
    hv[3] = -hv[1];
    hv[4] = alloc_r != ZERO_OK ? -(double)alloc_r : 0.0; /* MAX: some failing rank's code */
    ZERO__ENG_TRY(e, e->dev->ops->upload(e->dev, ZERO_QUEUE_COMPUTE, e->scratch + 24, hv, sizeof hv),
                  "zero_engine_commit: upload");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                  "zero_engine_commit: event");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, e->scratch + 24, e->scratch + 24, 5, ZERO_F64,
                                          ZERO_OP_MAX, 1),
                  "zero_engine_commit: plan hash all-reduce");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                  "zero_engine_commit: event");
    ZERO__ENG_TRY(e, e->dev->ops->download(e->dev, ZERO_QUEUE_COMPUTE, hv, e->scratch + 24, sizeof hv),
                  "zero_engine_commit: download");
    ZERO__ENG_TRY(e, e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE), "zero_engine_commit: sync");
    if (plan_r != ZERO_OK) {
        e->state = ZERO__ENG_BROKEN;
        return zero__fail(plan_r, "%.400s", plan_err);
    }
    if (hv[0] != -hv[2] || hv[1] != -hv[3]) {
        e->state = ZERO__ENG_BROKEN;
        return zero__fail(ZERO_ERROR_MISMATCH,
                          "zero_engine_commit: ranks registered different tensors or settings "
                          "(rank %d plan hash %016llx; hashes across ranks range over "
                          "[%08llx%08llx, %08llx%08llx])",
                          e->rank, (unsigned long long)h,
                          hv[2] <= 0.0 ? (unsigned long long)(-hv[2]) : 0ull,
                          hv[3] <= 0.0 ? (unsigned long long)(-hv[3]) : 0ull,
                          (unsigned long long)(hv[0] >= 0.0 ? hv[0] : 0.0),
                          (unsigned long long)(hv[1] >= 0.0 ? hv[1] : 0.0));
    }
    if (alloc_r != ZERO_OK) {
        e->state = ZERO__ENG_BROKEN;
        return zero__fail(alloc_r, "%.400s", alloc_err);
    }
    if (hv[4] != 0.0) {
        zero_result peer = (zero_result)(int)(-hv[4]);
        e->state = ZERO__ENG_BROKEN;
        return zero__fail(peer, "zero_engine_commit: another rank failed to allocate its "
                                "buffers (%s); every rank's commit fails",
                          zero_result_string(peer));
    }
    e->param = (unsigned char *)ptrs[ZERO__B_PARAM];
    e->grad_user = (unsigned char *)ptrs[ZERO__B_GRAD_USER];
    e->grad_acc = e->alias ? e->grad_user : (unsigned char *)ptrs[ZERO__B_GRAD_ACC];
    e->master = (float *)ptrs[ZERO__B_MASTER];
    e->m1 = (float *)ptrs[ZERO__B_M1];
    e->m2 = (float *)ptrs[ZERO__B_M2];
    e->bucket = (unsigned char *)ptrs[ZERO__B_BUCKET];
    e->tc = (unsigned char *)ptrs[ZERO__B_TC];
    e->ts = (unsigned char *)ptrs[ZERO__B_TS];
    e->gather = (unsigned char *)ptrs[ZERO__B_GATHER];
    for (i = 0; i < e->nallocs; i++)
        ZERO__ENG_TRY(e, e->dev->ops->fill_zero(e->dev, ZERO_QUEUE_COMPUTE, e->allocs[i].ptr,
                                                e->allocs[i].bytes),
                      "zero_engine_commit: fill");
    ZERO__ENG_TRY(e, e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE), "zero_engine_commit: sync");
    e->gstats.slots = e->ngslots;
    e->gstats.slot_numel = e->gslot_numel;
    e->gstats.limit_numel = (size_t)e->ngslots * e->gslot_numel;
    /* The hash check counts in the total only. */
    memset(&e->traffic_cur, 0, sizeof e->traffic_cur);
    return ZERO_OK;
}

/* ---- pointers into the buffers ------------------------------------------------------------ */

/* Group g's params as the user sees them (whole group) when they are resident. */
static unsigned char *zero__eng_param_whole(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    if (e->stage < 3) return e->param + eg->off_whole * e->p;
    if (eg->persistent) return e->param + eg->off_param * e->p;
    if (eg->slot < 0) return NULL;
    return e->gather + (size_t)eg->slot * e->gslot_numel * e->p;
}

/* Where this rank's updated param shard of group g is written by the step. */
static unsigned char *zero__eng_param_shard(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    size_t sh = (size_t)e->rank * eg->shard_numel;
    if (e->stage < 3) return e->param + (eg->off_whole + sh) * e->p;
    if (eg->persistent) return e->param + (eg->off_param + sh) * e->p;
    return e->param + eg->off_param * e->p;
}

/* The user gradient buffer of group g in this micro-step. */
static unsigned char *zero__eng_grad_user(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    if (e->stage <= 1) return e->grad_user + eg->off_whole * e->p;
    if (eg->bucket < 0) return NULL;
    return e->bucket + (size_t)eg->bucket * e->bslot_numel * e->p;
}

/* The accumulated gradient (comm dtype) of group g: stage 0 the whole group, else the
   rank's shard. */
static unsigned char *zero__eng_grad_acc(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    if (e->stage == 0) return e->grad_acc + eg->off_whole * e->c;
    if (e->alias) return e->grad_user + (eg->off_whole + (size_t)e->rank * eg->shard_numel) * e->p;
    return e->grad_acc + eg->off_shard * e->c;
}

/* The rank's shard of group g's accumulated gradient (what the norm reads, every stage). */
static unsigned char *zero__eng_grad_acc_shard(const zero_engine *e, int g)
{
    unsigned char *a = zero__eng_grad_acc(e, g);
    if (e->stage == 0) a += (size_t)e->rank * e->groups[g].shard_numel * e->c;
    return a;
}

/* ---- gradients ----------------------------------------------------------------------------- */

/* Reduces group g's gradients of micro-step k (on COMM, after the hand-off). fused: only the
   collective, the caller runs zero__eng_reduce_post after the group call. */
static zero_result zero__eng_reduce_one(zero_engine *e, int g, int k, int collective_only)
{
    zero__eng_group *eg = &e->groups[g];
    zero_device *dev = e->dev;
    unsigned char *src = zero__eng_grad_user(e, g);
    unsigned char *acc = zero__eng_grad_acc(e, g);
    zero_result r;
    if (e->cd != e->gd) {
        r = dev->ops->cast(dev, ZERO_QUEUE_COMM, e->tc, e->cd, src, e->gd, eg->numel);
        if (r != ZERO_OK) return r;
        src = e->tc;
    }
    if (e->stage == 0) {
        if (k == 0) return zero__eng_all_reduce(e, src, acc, eg->numel, e->cd, ZERO_OP_SUM, 0);
        r = zero__eng_all_reduce(e, src, src, eg->numel, e->cd, ZERO_OP_SUM, 0);
        if (r != ZERO_OK || collective_only) return r;
        return dev->ops->add(dev, ZERO_QUEUE_COMM, acc, src, e->cd, eg->numel);
    }
    if (k == 0) return zero__eng_reduce_scatter(e, src, acc, eg->shard_numel, e->cd);
    r = zero__eng_reduce_scatter(e, src, e->ts, eg->shard_numel, e->cd);
    if (r != ZERO_OK) return r;
    return dev->ops->add(dev, ZERO_QUEUE_COMM, acc, e->ts, e->cd, eg->shard_numel);
}

/* Reduces every pending group, in the order they became ready. Consecutive groups whose
   reduction is one collective on distinct buffers go into one group call. */
static zero_result zero__eng_flush(zero_engine *e)
{
    int i, k = e->micro;
    int fuse;
    if (e->npending == 0) return ZERO_OK;
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                  "gradient reduction: event");
    fuse = e->npending > 1 && e->cd == e->gd && (e->stage == 0 || k == 0) &&
           e->comm->ops->group_start != NULL;
    if (fuse) {
        ZERO__ENG_TRY(e, zero__eng_group_start(e), "gradient reduction: group_start");
        for (i = 0; i < e->npending; i++)
            ZERO__ENG_TRY_IN_GROUP(e, zero__eng_reduce_one(e, e->pending[i], k, 1),
                                   "gradient reduction");
        ZERO__ENG_TRY(e, zero__eng_group_end(e), "gradient reduction: group_end");
        if (e->stage == 0 && k > 0)
            for (i = 0; i < e->npending; i++) {
                int g = e->pending[i];
                ZERO__ENG_TRY(e, e->dev->ops->add(e->dev, ZERO_QUEUE_COMM, zero__eng_grad_acc(e, g),
                                                  zero__eng_grad_user(e, g), e->cd,
                                                  e->groups[g].numel),
                              "gradient accumulation");
            }
    } else {
        for (i = 0; i < e->npending; i++)
            ZERO__ENG_TRY(e, zero__eng_reduce_one(e, e->pending[i], k, 0), "gradient reduction");
    }
    for (i = 0; i < e->npending; i++) {
        zero__eng_group *eg = &e->groups[e->pending[i]];
        if (eg->bucket >= 0) {
            zero__eng_slot *s = &e->bslots[eg->bucket];
            ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMM, s->ev), "gradient reduction: event");
            s->ev_valid = 1;
            s->group = -1;
            eg->bucket = -1;
        } else if (eg->ev_reduced) {
            ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMM, eg->ev_reduced),
                          "gradient reduction: event");
            eg->reduced_valid = 1;
        }
    }
    e->npending = 0;
    e->pending_numel = 0;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_grads(zero_engine *e, int group, void **out_grads)
{
    zero_result r = zero__eng_usable(e, "zero_engine_grads");
    zero__eng_group *eg;
    unsigned char *ptr;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_grads")) != ZERO_OK) return r;
    if (!out_grads)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_grads: out_grads is NULL");
    eg = &e->groups[group];
    if (eg->grads_state == ZERO__GRADS_HANDED) {
        *out_grads = zero__eng_grad_user(e, group);
        return ZERO_OK;
    }
    if (eg->grads_state == ZERO__GRADS_READY)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads: group %d is already ready in this micro-step",
                          group);
    if (e->micro >= e->accum)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads: all %d micro-steps of this step are done; call "
                          "zero_engine_step()",
                          e->accum);
    if (e->stage >= 2) {
        int i, s = -1;
        for (i = 0; i < e->nbslots && s < 0; i++) {
            int j = (e->bcursor + i) % e->nbslots;
            if (e->bslots[j].group < 0) s = j;
        }
        if (s < 0 && e->npending > 0) {
            if ((r = zero__eng_flush(e)) != ZERO_OK) return r;
            for (i = 0; i < e->nbslots && s < 0; i++) {
                int j = (e->bcursor + i) % e->nbslots;
                if (e->bslots[j].group < 0) s = j;
            }
        }
        if (s < 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_grads: all %d gradient buckets are held by groups "
                              "not yet ready (call zero_engine_grads_ready first, or raise "
                              "reduce_bucket_numel)",
                              e->nbslots);
        e->bcursor = (s + 1) % e->nbslots;
        if (e->bslots[s].ev_valid)
            ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, e->bslots[s].ev),
                          "zero_engine_grads: event");
        e->bslots[s].group = group;
        eg->bucket = s;
    } else if (eg->reduced_valid) {
        ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, eg->ev_reduced),
                      "zero_engine_grads: event");
    }
    ptr = zero__eng_grad_user(e, group);
    ZERO__ENG_TRY(e, e->dev->ops->fill_zero(e->dev, ZERO_QUEUE_COMPUTE, ptr, eg->numel * e->p),
                  "zero_engine_grads: fill");
    eg->grads_state = ZERO__GRADS_HANDED;
    e->grads_seen = 1;
    *out_grads = ptr;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_grads_ready(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_grads_ready");
    zero__eng_group *eg;
    int g;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_grads_ready")) != ZERO_OK) return r;
    eg = &e->groups[group];
    if (eg->grads_state != ZERO__GRADS_HANDED)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads_ready: group %d %s", group,
                          eg->grads_state == ZERO__GRADS_READY
                              ? "is already ready in this micro-step"
                              : "has no gradient buffer (call zero_engine_grads first)");
    eg->grads_state = ZERO__GRADS_READY;
    e->pending[e->npending++] = group;
    e->pending_numel += eg->numel;
    e->ready_in_micro++;
    if (e->ready_in_micro == e->G || e->pending_numel >= e->d.reduce_bucket_numel)
        if ((r = zero__eng_flush(e)) != ZERO_OK) return r;
    if (e->ready_in_micro == e->G) {
        e->micro++;
        e->ready_in_micro = 0;
        for (g = 0; g < e->G; g++) e->groups[g].grads_state = ZERO__GRADS_NONE;
        e->last_gathered = -1;
        e->grads_seen = 0;
    }
    return ZERO_OK;
}

/* ---- stage 3 gathering ------------------------------------------------------------------- */

static int zero__eng_free_gslot(const zero_engine *e)
{
    int i;
    for (i = 0; i < e->ngslots; i++)
        if (e->gslots[i].group < 0) return i;
    return -1;
}

static void zero__eng_drop_slot(zero_engine *e, int s)
{
    int g = e->gslots[s].group;
    if (g < 0) return;
    e->groups[g].slot = -1;
    e->gslots[s].group = -1;
    e->gstats.live_numel -= e->groups[g].numel;
    e->gstats.live_groups--;
}

/* All-gathers non-persistent group g into slot s (on COMM, after COMPUTE's work so far:
   the step's updates of the shard and the uses of the slot's previous group). */
static zero_result zero__eng_issue_gather(zero_engine *e, int g, int s)
{
    zero__eng_group *eg = &e->groups[g];
    unsigned char *dst = e->gather + (size_t)s * e->gslot_numel * e->p;
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "gather: event");
    ZERO__ENG_TRY(e, zero__eng_all_gather(e, e->param + eg->off_param * e->p, dst,
                                          eg->shard_numel, e->gd),
                  "gather: all_gather");
    ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMM, eg->ev_gathered), "gather: event");
    e->gslots[s].group = g;
    eg->slot = s;
    e->gstats.gathers++;
    e->gstats.live_numel += eg->numel;
    e->gstats.live_groups++;
    if (e->gstats.live_numel > e->gstats.peak_live_numel)
        e->gstats.peak_live_numel = e->gstats.live_numel;
    return ZERO_OK;
}

static zero_result zero__eng_try_prefetch(zero_engine *e, int g, int *issued)
{
    int s;
    *issued = 0;
    if (g < 0 || g >= e->G || e->groups[g].persistent || e->groups[g].slot >= 0) return ZERO_OK;
    s = zero__eng_free_gslot(e);
    if (s < 0) return ZERO_OK;
    *issued = 1;
    e->gstats.prefetches++;
    return zero__eng_issue_gather(e, g, s);
}

ZERODEF zero_result zero_engine_gather(zero_engine *e, int group, void **out_params)
{
    zero_result r = zero__eng_usable(e, "zero_engine_gather");
    zero__eng_group *eg;
    int i, dir;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_gather")) != ZERO_OK) return r;
    if (!out_params)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_gather: out_params is NULL");
    eg = &e->groups[group];
    if (e->stage < 3 || eg->persistent) {
        eg->refs++;
        *out_params = zero__eng_param_whole(e, group);
        return ZERO_OK;
    }
    if (eg->slot < 0) {
        int s = zero__eng_free_gslot(e);
        if (s < 0) {
            /* Evict a prefetched group nobody uses yet: the one farthest ahead. */
            int best = -1, bestd = -1;
            for (i = 0; i < e->ngslots; i++) {
                int h = e->gslots[i].group;
                if (h >= 0 && e->groups[h].refs == 0) {
                    int dd = h > group ? h - group : group - h;
                    if (dd > bestd) bestd = dd, best = i;
                }
            }
            if (best < 0)
                return zero__fail(ZERO_ERROR_INVALID_STATE,
                                  "zero_engine_gather: group %d: all %d gather slots hold groups "
                                  "in use (release some, or raise max_live_numel)",
                                  group, e->ngslots);
            zero__eng_drop_slot(e, best);
            e->gstats.evictions++;
            s = best;
        }
        if ((r = zero__eng_issue_gather(e, group, s)) != ZERO_OK) return r;
    } else if (eg->refs == 0) {
        e->gstats.prefetch_hits++;
    }
    ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, eg->ev_gathered), "gather: event");
    eg->refs++;
    *out_params = zero__eng_param_whole(e, group);
    /* Prefetch in the direction of travel: descending in backward. */
    dir = (e->grads_seen || (e->last_gathered >= 0 && group <= e->last_gathered)) ? -1 : 1;
    e->last_gathered = group;
    for (i = 1; i <= e->depth; i++) {
        int issued;
        if ((r = zero__eng_try_prefetch(e, group + dir * i, &issued)) != ZERO_OK) return r;
    }
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_prefetch(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_prefetch");
    int issued;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_prefetch")) != ZERO_OK) return r;
    if (e->stage < 3) return ZERO_OK;
    return zero__eng_try_prefetch(e, group, &issued);
}

ZERODEF zero_result zero_engine_release(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_release");
    zero__eng_group *eg;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_release")) != ZERO_OK) return r;
    eg = &e->groups[group];
    if (eg->refs <= 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_release: group %d is not gathered (released twice?)",
                          group);
    eg->refs--;
    if (eg->refs == 0 && e->stage == 3 && !eg->persistent) zero__eng_drop_slot(e, eg->slot);
    return ZERO_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* The step's verdict (host[0] flag, host[1] multiplier, host[2] norm) applied on the host:
   the loss scaler, the step count, the step's info. */
static void zero__eng_step_verdict(zero_engine *e, const float *host, float scale_used)
{
    zero_step_info *info = &e->last_info;
    zero_scaler_update(&e->scaler, host[0] != 0.0f);
    if (host[0] == 0.0f) e->step++;
    info->step = e->step;
    info->skipped = host[0] != 0.0f;
    info->loss_scale = scale_used;
    info->next_loss_scale = e->scaler.scale;
    info->grad_norm = host[2];
    info->grad_mul = host[1];
    info->clip_coef = 1.0f;
    if (!info->skipped && e->d.clip_norm > 0.0f && host[2] > e->d.clip_norm)
        info->clip_coef = e->d.clip_norm / (host[2] + 1e-6f);
}

/* async_step: reads the verdict of the step enqueued last (on the offload queue, which
   waited for the step's event, so the wait does not cover later compute work). */
static zero_result zero__eng_step_complete(zero_engine *e)
{
    zero_device *dev = e->dev;
    float host[3];
    if (!e->step_pending) return ZERO_OK;
    e->step_pending = 0;
    ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_OFFLOAD, host, e->scratch + 8, 3 * sizeof(float)),
                  "step: download");
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_OFFLOAD), "step: sync");
    zero__eng_step_verdict(e, host, e->pending_scale_used);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_last_step(zero_engine *e, zero_step_info *info)
{
    zero_result r;
    if (!e || !info) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_last_step: %s is NULL", e ? "info" : "e");
    if (e->step_pending && (r = zero__eng_step_complete(e)) != ZERO_OK) return r;
    *info = e->last_info;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_step(zero_engine *e, zero_step_info *info)
{
    zero_result r = zero__eng_usable(e, "zero_engine_step");
    zero_device *dev;
    float unscale, host[3], scale_used;
    double *sumsq;
    float *flag, *mul;
    zero_adam_coefs co_wd, co_nowd;
    int g, t, i;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_step_complete(e)) != ZERO_OK) return r; /* the previous step's verdict */
    dev = e->dev;
    if (e->micro != e->accum || e->ready_in_micro != 0) {
        if (e->micro == 0 && e->ready_in_micro == 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_step: no gradients since the last step");
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_step: %d complete micro-steps (and %d of %d groups of "
                          "the next), accum_steps = %d",
                          e->micro, e->ready_in_micro, e->G, e->accum);
    }
    for (g = 0; g < e->G; g++)
        if (e->groups[g].refs > 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_step: group %d is still gathered (%d references); "
                              "release every group before the step",
                              g, e->groups[g].refs);
    /* Prefetched groups hold the old values. */
    for (i = 0; i < e->ngslots; i++)
        if (e->gslots[i].group >= 0) {
            zero__eng_drop_slot(e, i);
            e->gstats.evictions++;
        }
    scale_used = e->scaler.scale;
    unscale = (float)(1.0 / ((double)scale_used * (double)e->world * (double)e->accum));
    sumsq = (double *)(void *)e->scratch;
    flag = (float *)(void *)(e->scratch + 8);
    mul = (float *)(void *)(e->scratch + 12);

    /* 1. non-finite flag and sum of squares over this rank's shard of every group. */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "step: event");
    ZERO__ENG_TRY(e, dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, e->scratch, 20), "step: fill");
    for (g = 0; g < e->G; g++) {
        const unsigned char *a = zero__eng_grad_acc_shard(e, g);
        size_t n = e->groups[g].shard_numel;
        ZERO__ENG_TRY(e, dev->ops->nonfinite(dev, ZERO_QUEUE_COMPUTE, a, e->cd, n, flag),
                      "step: nonfinite");
        ZERO__ENG_TRY(e, dev->ops->sumsq(dev, ZERO_QUEUE_COMPUTE, a, e->cd, n, sumsq),
                      "step: sumsq");
    }
    /* 2. every rank agrees on skipping and on the norm. */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "step: event");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, flag, flag, 1, ZERO_F32, ZERO_OP_MAX, 1),
                  "step: all_reduce of the inf/NaN flag");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, sumsq, sumsq, 1, ZERO_F64, ZERO_OP_SUM, 1),
                  "step: all_reduce of the sum of squares");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "step: event");
    ZERO__ENG_TRY(e, dev->ops->grad_mul(dev, ZERO_QUEUE_COMPUTE, sumsq, flag, unscale,
                                        e->d.clip_norm, mul),
                  "step: grad_mul");
    /* 3. Adam/AdamW per (tensor x shard) segment; padding is never touched. */
    r = zero_adam_coefs_make(&co_wd, &e->adam, e->adam.weight_decay, e->step + 1);
    if (r == ZERO_OK) r = zero_adam_coefs_make(&co_nowd, &e->adam, 0.0f, e->step + 1);
    if (r != ZERO_OK) return zero__eng_break(e, r, "step: Adam constants");
    for (t = 0; t < e->ntensors; t++) {
        zero_tensor_info ti;
        zero_range seg, sh;
        zero_adam_range ar;
        const zero__eng_group *eg;
        size_t mo, go, po; /* element offsets of the segment in master, grad, param buffers */
        memset(&ti, 0, sizeof ti);
        memset(&seg, 0, sizeof seg);
        memset(&sh, 0, sizeof sh);
        r = zero_plan_tensor(e->plan, t, &ti);
        if (r != ZERO_OK) return zero__eng_break(e, r, "step: plan");
        eg = &e->groups[ti.group];
        if (e->stage == 0) {
            seg.offset = ti.offset;
            seg.numel = ti.numel;
            mo = eg->off_whole + seg.offset;
            go = seg.offset;
            po = eg->off_whole + seg.offset;
        } else {
            r = zero_plan_intersect(e->plan, t, e->rank, &seg);
            if (r == ZERO_OK) r = zero_plan_shard(e->plan, ti.group, e->rank, &sh);
            if (r != ZERO_OK) return zero__eng_break(e, r, "step: plan");
            if (seg.numel == 0) continue;
            mo = eg->off_shard + (seg.offset - sh.offset);
            go = seg.offset - sh.offset;
            if (e->stage < 3) po = eg->off_whole + seg.offset;
            else if (eg->persistent) po = eg->off_param + seg.offset;
            else po = eg->off_param + (seg.offset - sh.offset);
        }
        ar.numel = seg.numel;
        ar.master = e->master + mo;
        ar.m = e->m1 + mo;
        ar.v = e->m2 + mo;
        ar.grad = zero__eng_grad_acc(e, ti.group) + go * e->c;
        ar.grad_dtype = e->cd;
        ar.param = e->param + po * e->p;
        ar.param_dtype = e->gd;
        ZERO__ENG_TRY(e, dev->ops->adam(dev, ZERO_QUEUE_COMPUTE, &ar,
                                        (e->tflags[t] & ZERO_TENSOR_NO_DECAY) ? &co_nowd : &co_wd,
                                        mul, flag),
                      "step: adam");
    }
    /* 4. stages 1-2 (stage 3: persistent groups) all-gather the updated param shards. */
    if (e->stage >= 1 && e->world > 1) {
        int any = 0;
        for (g = 0; g < e->G; g++) any |= e->stage < 3 || e->groups[g].persistent;
        if (any) {
            ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                          "step: event");
            ZERO__ENG_TRY(e, zero__eng_group_start(e), "step: group_start");
            for (g = 0; g < e->G; g++) {
                if (e->stage == 3 && !e->groups[g].persistent) continue;
                ZERO__ENG_TRY_IN_GROUP(e, zero__eng_all_gather(e, zero__eng_param_shard(e, g),
                                                               zero__eng_param_whole(e, g),
                                                               e->groups[g].shard_numel, e->gd),
                                       "step: all_gather of updated params");
            }
            ZERO__ENG_TRY(e, zero__eng_group_end(e), "step: group_end");
            ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                          "step: event");
        }
    }
    /* 5. one download: flag, multiplier, norm (async_step: later, on the offload queue). */
    if (e->d.async_step && !info) {
        if (!e->ev_step) ZERO__ENG_TRY(e, dev->ops->event_create(dev, &e->ev_step), "step: event");
        ZERO__ENG_TRY(e, dev->ops->record(dev, ZERO_QUEUE_COMPUTE, e->ev_step), "step: event");
        ZERO__ENG_TRY(e, dev->ops->wait(dev, ZERO_QUEUE_OFFLOAD, e->ev_step), "step: event");
        e->step_pending = 1;
        e->pending_scale_used = scale_used;
    } else {
        ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_COMPUTE, host, e->scratch + 8,
                                            3 * sizeof(float)),
                      "step: download");
        ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), "step: sync");
        zero__eng_step_verdict(e, host, scale_used);
    }
    e->micro = 0;
    e->ready_in_micro = 0;
    e->last_gathered = -1;
    e->grads_seen = 0;
    for (g = 0; g < e->G; g++) e->groups[g].grads_state = ZERO__GRADS_NONE;
    e->traffic_last = e->traffic_cur;
    memset(&e->traffic_cur, 0, sizeof e->traffic_cur);
    if (info) *info = e->last_info;
    return ZERO_OK;
}

/* ---- tensors in and out ------------------------------------------------------------------ */

/* The parts of tensor t this rank stores: params [p0, p0 + pn) and master [m0, m0 + mn), in
   tensor coordinates, and the device addresses of their first elements. */
typedef struct zero__eng_parts {
    size_t p0, pn, m0, mn;
    unsigned char *param;
    size_t master_off; /* element offset in master / m / v */
} zero__eng_parts;

static zero_result zero__eng_parts_of(const zero_engine *e, int t, zero__eng_parts *out)
{
    zero_tensor_info ti;
    zero_range seg, sh;
    const zero__eng_group *eg;
    zero_result r;
    memset(&ti, 0, sizeof ti);
    memset(&seg, 0, sizeof seg);
    memset(&sh, 0, sizeof sh);
    r = zero_plan_tensor(e->plan, t, &ti);
    if (r != ZERO_OK) return r;
    eg = &e->groups[ti.group];
    r = zero_plan_intersect(e->plan, t, e->rank, &seg);
    if (r == ZERO_OK) r = zero_plan_shard(e->plan, ti.group, e->rank, &sh);
    if (r != ZERO_OK) return r;
    out->m0 = seg.numel ? seg.offset - ti.offset : 0;
    out->mn = seg.numel;
    out->master_off = e->stage == 0 ? eg->off_whole + seg.offset
                                    : eg->off_shard + (seg.offset - sh.offset);
    if (e->stage < 3 || eg->persistent) {
        out->p0 = 0;
        out->pn = ti.numel;
        out->param = e->param + ((e->stage < 3 ? eg->off_whole : eg->off_param) + ti.offset) * e->p;
    } else {
        out->p0 = out->m0;
        out->pn = out->mn;
        out->param = e->param + (eg->off_param + (seg.offset - sh.offset)) * e->p;
    }
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_set_tensor(zero_engine *e, int tensor, const float *values)
{
    zero_result r = zero__eng_usable(e, "zero_engine_set_tensor");
    zero_tensor_info ti;
    zero__eng_parts pt;
    void *tmp = NULL;
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= e->ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_set_tensor: tensor %d unknown",
                          tensor);
    if (!values)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_tensor: values is NULL");
    if (e->micro != 0 || e->ready_in_micro != 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_set_tensor: in the middle of a step");
    if ((r = zero_plan_tensor(e->plan, tensor, &ti)) != ZERO_OK) return r;
    /* The same rule at every stage, so a program that runs at stage 0 runs at stage 3. */
    if (e->groups[ti.group].refs > 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_set_tensor: group %d is gathered (release it first)",
                          ti.group);
    if ((r = zero__eng_parts_of(e, tensor, &pt)) != ZERO_OK) return r;
    /* A prefetch's all-gather may still be reading the shard on COMM: order the uploads
       after it; the prefetched copy is stale and dropped. */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                  "zero_engine_set_tensor: event");
    if (e->stage == 3 && e->groups[ti.group].slot >= 0)
        zero__eng_drop_slot(e, e->groups[ti.group].slot);
    if (e->stage == 0) { /* stage 0 holds the whole master */
        pt.m0 = 0;
        pt.mn = ti.numel;
        pt.master_off = e->groups[ti.group].off_whole + ti.offset;
    }
    if (pt.pn > 0 && e->gd != ZERO_F32) {
        tmp = zero__alloc(&e->d.allocator, pt.pn * e->p);
        if (!tmp) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_set_tensor");
        r = zero_convert(tmp, e->gd, values + pt.p0, ZERO_F32, pt.pn, ZERO_SIMD_AUTO);
        if (r != ZERO_OK) {
            zero__free(&e->d.allocator, tmp);
            return r;
        }
    }
    if (pt.pn > 0)
        r = e->dev->ops->upload(e->dev, ZERO_QUEUE_COMPUTE, pt.param,
                                tmp ? (const void *)tmp : (const void *)(values + pt.p0),
                                pt.pn * e->p);
    if (r == ZERO_OK && pt.mn > 0)
        r = e->dev->ops->upload(e->dev, ZERO_QUEUE_COMPUTE, e->master + pt.master_off,
                                values + pt.m0, pt.mn * sizeof(float));
    if (r == ZERO_OK) r = e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE);
    zero__free(&e->d.allocator, tmp);
    if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_set_tensor: upload");
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_read_tensor(zero_engine *e, int tensor, zero_state_kind kind,
                                            void *host_dst, zero_range *out_range)
{
    zero_result r = zero__eng_usable(e, "zero_engine_read_tensor");
    zero__eng_parts pt;
    const void *src;
    size_t off, n, esz;
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= e->ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_read_tensor: tensor %d unknown",
                          tensor);
    if (!host_dst)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_read_tensor: host_dst is NULL");
    if ((r = zero__eng_parts_of(e, tensor, &pt)) != ZERO_OK) return r;
    switch (kind) {
    case ZERO_STATE_PARAM: src = pt.param; off = pt.p0; n = pt.pn; esz = e->p; break;
    case ZERO_STATE_MASTER: src = e->master + pt.master_off; off = pt.m0; n = pt.mn; esz = 4; break;
    case ZERO_STATE_M: src = e->m1 + pt.master_off; off = pt.m0; n = pt.mn; esz = 4; break;
    case ZERO_STATE_V: src = e->m2 + pt.master_off; off = pt.m0; n = pt.mn; esz = 4; break;
    default:
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_read_tensor: kind = %d",
                          (int)kind);
    }
    if (n > 0) {
        r = e->dev->ops->download(e->dev, ZERO_QUEUE_COMPUTE,
                                  (unsigned char *)host_dst + off * esz, src, n * esz);
        if (r == ZERO_OK) r = e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE);
        if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_read_tensor: download");
    }
    if (out_range) {
        out_range->offset = off;
        out_range->numel = n;
    }
    return ZERO_OK;
}

/* ---- queries ----------------------------------------------------------------------------- */

ZERODEF float zero_engine_loss_scale(const zero_engine *e)
{
    /* async_step: the scale depends on the pending step's verdict (the engine is the
       caller's; const only promises the settings do not change). A failure breaks the
       engine and shows at its next call. */
    if (e && e->step_pending) (void)zero__eng_step_complete((zero_engine *)(uintptr_t)e);
    return e ? e->scaler.scale : 1.0f;
}

ZERODEF int64_t zero_engine_step_count(const zero_engine *e)
{
    if (e && e->step_pending) (void)zero__eng_step_complete((zero_engine *)(uintptr_t)e);
    return e ? e->step : 0;
}

ZERODEF zero_result zero_engine_set_lr(zero_engine *e, float lr)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_lr: engine is NULL");
    if (!(lr >= 0.0f) || isinf(lr))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_lr: lr = %g (finite, >= 0)",
                          (double)lr);
    e->adam.lr = lr;
    e->d.adam.lr = lr;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_memory_usage(const zero_engine *e, zero_engine_memory *out)
{
    int k;
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_memory_usage: NULL");
    for (k = 0; k < ZERO_MEM_COUNT; k++) {
        out->bytes[k] = e->mem[k];
        out->peak_bytes[k] = e->mem_peak[k];
    }
    out->total_bytes = e->mem_total;
    out->peak_total_bytes = e->mem_peak_total;
    out->allocations = (size_t)e->nallocs;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_traffic(const zero_engine *e, zero_traffic *last_step,
                                        zero_traffic *total)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_traffic: engine is NULL");
    if (last_step) *last_step = e->traffic_last;
    if (total) *total = e->traffic_total;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_gather_stats(const zero_engine *e, zero_gather_stats *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_gather_stats: NULL");
    *out = e->gstats;
    return ZERO_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* ZERO_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the zero authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this
software and associated documentation files (the "Software"), to deal in the Software
without restriction, including without limitation the rights to use, copy, modify, merge,
publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
to whom the Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
DEALINGS IN THE SOFTWARE.
*/
