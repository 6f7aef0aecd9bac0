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

   OPTIONS (define before including, in the implementation file)
       ZERO_STATIC            make every function static (private to one translation unit)
       ZERO_MALLOC(sz)        replace malloc; define ZERO_FREE(p) too, or neither
       ZERO_FREE(p)           replace free
       ZERO_NO_SIMD           use only the portable paths (same bits, slower)

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
#include "src/convert.h"

/* ======================================================================================
   Plan: tensors packed into flat, padded group buffers; shard r of a group is its r-th
   equal slice (what NCCL's reduce-scatter and all-gather need).
   ====================================================================================== */
#include "src/plan.h"

/* ======================================================================================
   Estimator: model-state bytes per rank by stage (the paper's table and DeepSpeed's).
   ====================================================================================== */
#include "src/estimate.h"

/* ======================================================================================
   Comm: the collective interface. Every backend implements zero_comm_ops; the engine
   calls nothing else. Counts are in elements, never bytes.
   ====================================================================================== */

typedef enum zero_op { ZERO_OP_SUM = 0, ZERO_OP_MAX = 1 } zero_op;

typedef struct zero_comm zero_comm;

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

/* A rank's handle. 'queue' arguments are the device's native queue for the comm queue
   (a cudaStream_t for CUDA, NULL for the host device); a backend that runs on the host
   completes the collective before returning. */
struct zero_comm {
    const zero_comm_ops *ops;
    void *impl;
    int rank;
    int world;
};

#include "src/local.h"

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
    /* *acc (fp64, device) += sum of x[i]^2 in fp64, in an order fixed by numel alone. */
    zero_result (*sumsq)(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                         size_t numel, double *acc);
    /* From the all-reduced sum of squares of the raw (scaled) gradients and the all-reduced
       non-finite flag: out[0] = gradient multiplier, out[1] = gradient norm, both fp32 on
       the device, by zero_grad_mul() below. No host round-trip. */
    zero_result (*grad_mul)(zero_device *dev, zero_queue q, const double *sumsq,
                            const float *nonfinite, float unscale, float clip_norm, float *out);
    /* Adam/AdamW on one range by zero_adam_update() below, gradients multiplied by
       *grad_mul; nothing is written when *skip != 0. grad_mul and skip are device fp32. */
    zero_result (*adam)(zero_device *dev, zero_queue q, const zero_adam_range *range,
                        const zero_adam_coefs *coefs, const float *grad_mul, const float *skip);
} zero_device_ops;

struct zero_device {
    const zero_device_ops *ops;
    void *impl;
};

#include "src/host.h"

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

#include "src/adam.h"

/* ======================================================================================
   Scaler: dynamic loss scaling (fp16); bf16 and fp32 need none.
   ====================================================================================== */
#include "src/scaler.h"

/* ======================================================================================
   Engine: ZeRO stages 0-3 over a zero_device and a zero_comm.
   ====================================================================================== */
#include "src/engine.h"

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

#include "src/convert_impl.h"
#include "src/plan_impl.h"
#include "src/estimate_impl.h"
#include "src/local_impl.h"
#include "src/host_impl.h"
#include "src/adam_impl.h"
#include "src/scaler_impl.h"
#include "src/engine_impl.h"

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
