/* zero_cuda.h - the CUDA device for zero.h: one-allocation arena, streams and events, fused
   mixed-precision AdamW and the other element kernels, pinned host memory, and a
   single-process multi-rank comm over device memory (N ranks on one GPU, for tests).

   Do this:
       #define ZERO_IMPLEMENTATION
       #define ZERO_CUDA_IMPLEMENTATION
       #include "zero.h"
       #include "zero_cuda.h"
   in *one* .cu file compiled by nvcc (the implementation is CUDA C++ and calls zero.h's
   private helpers, so both implementations live in the same file). Every other file, C or
   C++, includes "zero.h" then "zero_cuda.h" without the defines: the declarations are plain
   C and use no CUDA type (streams are passed as void *, i.e. a cudaStream_t cast to void *).

   WHAT IT IS
   zero.h writes ZeRO once against two interfaces, zero_device_ops and zero_comm_ops. This
   file implements the device in CUDA, so the same engine runs on a GPU:

       zero_cuda_device_create()     a zero_device on one GPU: queues are CUDA streams
                                     (compute: yours or a new one; comm; offload), events are
                                     cudaEvents, every op is enqueued, none blocks the host
                                     except sync (and a download to pageable memory).
       reserve / alloc / free        one cudaMalloc per engine (the reserve op), carved in
                                     256-byte aligned, category-tagged blocks. An alloc with
                                     no arena room left falls back to cudaMalloc (setup time
                                     only: the engine allocates everything at commit).
       kernels                       cast, add, scale, fill, non-finite check, sum of squares,
                                     gradient multiplier, fused Adam/AdamW: bit-identical to
                                     the host device (zero_host_device_create) for the same
                                     inputs, NaN payloads of arithmetic results aside.
                                     Consecutive nonfinite/sumsq calls on a queue, and
                                     consecutive adam calls, are held and launched as one
                                     kernel over a table by the device's next other op
                                     (zero_cuda_flush() to force it).
       zero_cuda_host_alloc/free     pinned host memory (for offload).
       zero_cuda_local_comm_create   wraps a rank's local comm (zero_local_*, ranks as
                                     threads of this process) into a comm whose buffers are
                                     device memory and whose queue is the rank's stream.

   DETERMINISM
   Every element kernel computes each element by itself with the host's expression: casts
   in integer arithmetic (round to nearest even, NaN kept quiet with its payload),
   add/scale in fp32 (fp64 for F64) with explicitly rounded operations (__fadd_rn,
   __fmul_rn: nvcc may not contract them into an FMA), Adam by zero_adam_update() itself
   (a ZERO_HOSTDEV function of zero.h) with the gradient multiplied first. The sum of
   squares adds in exactly the host device's order (blocks of ZERO_HOST_SUMSQ_BLOCK
   elements, 8 lanes by index mod 8, a fixed tree, the blocks in order), so its result
   depends on numel alone and equals the host's bit for bit. 16-byte vector loads are used
   where every pointer of a kernel shares one alignment; the vector and scalar paths run the
   same per-element code, so an element's bits never depend on where it falls.
   Build without fast-math (no --use_fast_math, no -ftz=true, no -prec-div=false,
   no -prec-sqrt=false): zero.h's Makefile uses nvcc's defaults, which are exact.

   ERRORS
   Every CUDA call is checked; a failure returns ZERO_ERROR_DEVICE (cudaErrorMemoryAllocation:
   ZERO_ERROR_OUT_OF_MEMORY) with the call and cudaGetErrorString() in zero_last_error().
   Kernel faults surface at the next sync (or any later call) as ZERO_ERROR_DEVICE.
   Nothing here exits or aborts.

   See docs/cuda.md for the whole story.

   LICENSE: MIT, see the end of zero.h.
*/
#ifndef ZERO_H
#error "zero_cuda.h: include zero.h first"
#endif

#ifndef ZERO_CUDA_H
#define ZERO_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* Descriptor of a CUDA device; zero-initialised = device 0 with streams of its own. */
typedef struct zero_cuda_desc {
    int device;           /* CUDA device ordinal                                          */
    void *compute_stream; /* your cudaStream_t for ZERO_QUEUE_COMPUTE (not owned, must
                             belong to 'device'); NULL = a new non-blocking stream. Pass
                             cudaStreamLegacy to use the legacy default stream.
                             cudaStreamPerThread is refused (INVALID_ARGUMENT): it names a
                             different stream on every host thread, and a comm or watchdog
                             thread using it would order nothing against your work.        */
} zero_cuda_desc;

/* What a CUDA device holds now (zero_cuda_device_stats). */
typedef struct zero_cuda_stats {
    size_t bytes[ZERO_MEM_COUNT];  /* live bytes requested, by category                     */
    size_t allocations;            /* live allocations                                       */
    size_t arena_bytes;            /* device memory held in arenas                           */
    size_t arena_free_bytes;       /* of which in no allocation                              */
    size_t fallback_bytes;         /* live allocations outside arenas (own cudaMalloc)       */
    size_t pinned_bytes;           /* live pinned host memory from zero_cuda_host_alloc      */
    size_t scratch_bytes;          /* the device's own scratch (sum-of-squares partials)     */
    unsigned long long cuda_mallocs; /* cudaMalloc calls so far: scratch, arenas, fallbacks */
} zero_cuda_stats;

/* Visible CUDA devices; 0 when there is none or no driver (never an error). */
ZERODEF int zero_cuda_device_count(void);

/* Like zero_cuda_device_count, but tells "no GPU here" from "a GPU that cannot be used":
   ZERO_OK with *count = the visible devices, 0 when CUDA says there is none
   (cudaErrorNoDevice) or when no CUDA driver is installed at all (libcuda.so.1 cannot be
   loaded); every other failure (a driver older than this CUDA runtime, a broken install, a
   device in a bad state) is ZERO_ERROR_DEVICE with CUDA's error name and text in
   zero_last_error(), and *count = 0. Test programs skip on 0 and fail on an error, so a
   run on a misconfigured GPU machine cannot pass while testing nothing. */
ZERODEF zero_result zero_cuda_device_probe(int *count);

/* A new CUDA device. desc NULL = defaults. Makes no CUDA context current for you beyond
   what the calls need: every op sets desc->device current for its duration and restores
   the caller's device. Takes ~400 KiB of device scratch (one cudaMalloc).
   Errors: UNSUPPORTED when no CUDA device is visible; INVALID_ARGUMENT for a device
   ordinal out of range; DEVICE / OUT_OF_MEMORY from CUDA. Destroy with
   zero_device_destroy() (dev->ops->destroy): it waits for the device's streams, then frees
   every arena, allocation, pinned buffer and stream it owns. */
ZERODEF zero_result zero_cuda_device_create(const zero_cuda_desc *desc, zero_device **out);

/* 1 when dev is a CUDA device of this file, else 0. */
ZERODEF int zero_cuda_is_device(const zero_device *dev);

/* The device's CUDA ordinal, or -1 when dev is not a CUDA device. */
ZERODEF int zero_cuda_device_ordinal(const zero_device *dev);

/* Pinned (page-locked, portable) host memory of 'bytes' bytes, for asynchronous
   upload/download and offload. Freed by zero_cuda_host_free or when the device is
   destroyed. Errors: INVALID_ARGUMENT (not a CUDA device, bytes 0, out NULL);
   OUT_OF_MEMORY. */
ZERODEF zero_result zero_cuda_host_alloc(zero_device *dev, size_t bytes, void **out);
/* NULL is ignored; INVALID_ARGUMENT for a pointer this device did not hand out. */
ZERODEF zero_result zero_cuda_host_free(zero_device *dev, void *ptr);

/* Launches the calls the device holds back to batch them: consecutive nonfinite/sumsq
   calls on one queue become one launch over a table, as do consecutive adam calls (one
   launch for all of a step's tensor segments). Every other op of the device, native_queue()
   included, launches them first, so the engine and any caller that works through the ops
   see the calls in order; call this only when you enqueue your own work directly on a
   queue's stream (a handle you kept) right after such calls. Launch errors of held calls
   are returned here (or by the next op). INVALID_ARGUMENT when dev is not a CUDA device. */
ZERODEF zero_result zero_cuda_flush(zero_device *dev);

/* Memory accounting of a CUDA device. INVALID_ARGUMENT when dev is not one. */
ZERODEF zero_result zero_cuda_device_stats(zero_device *dev, zero_cuda_stats *out);

/* Wraps rank comm->rank's local comm (zero_local_comm_create / zero_local_run: every rank a
   thread of this process) into a comm over device memory on 'dev' (this rank's CUDA
   device; every rank may use the same GPU). Its collectives take device pointers and
   'queue' = a cudaStream_t of dev's GPU (NULL = dev's comm stream); they are enqueued and
   return without waiting for the GPU, with the local comm's semantics: rank-order SUM in
   fp32 (fp64 for F64) rounded once, NaN-propagating MAX, in-place forms, agreement checks
   (MISMATCH / INVALID_ARGUMENT; the engine's comm->tag too, where both sides are tagged),
   timeouts (the local comm's). The host comm is used for
   the rendezvous (posts, barriers) and is not owned: destroy the device comm first.
   all_to_all copies block r of every peer's send into block 'peer' of r's recv (not in
   place). split (zero_comm_split; MiCS, hpZ and the two-level qgZ use it) splits the host
   comm and makes a device comm on the same device over the child, which owns that child
   host comm: destroy it before or after its parent. A rank that cannot make its child
   fails every rank of its new group.
   All ranks on one GPU (or GPUs with peer access enabled: kernels read peers' buffers).
   At most ZERO_CUDA_MAX_RANKS ranks. Errors: INVALID_ARGUMENT (NULL, not a CUDA device);
   UNSUPPORTED (not a local comm, too many ranks); DEVICE. */
#define ZERO_CUDA_MAX_RANKS 64
ZERODEF zero_result zero_cuda_local_comm_create(zero_comm *host_comm, zero_device *dev,
                                                zero_comm **out);

#ifdef __cplusplus
}
#endif

/* ZERO_CUDA_LAUNCH(kernel, grid, block, shmem, stream, args...): every kernel launch of
   zero's CUDA code goes through it: kernel<<<grid, block, shmem, stream>>>(args...) under
   nvcc, the CPU harness's launcher (tests/cudasim's cuda_runtime.h, docs/cuda.md) otherwise. A
   kernel name with a comma (a template with two arguments) goes in parentheses. */
#if defined(__CUDACC__)
#define ZERO_CUDA_LAUNCH(kernel, grid, block, shmem, stream, ...) kernel<<<grid, block, shmem, stream>>>(__VA_ARGS__)
#else
#define ZERO_CUDA_LAUNCH(kernel, grid, block, shmem, stream, ...) \
    CUDASIM_LAUNCH(kernel, grid, block, shmem, stream, __VA_ARGS__)
#endif

#endif /* ZERO_CUDA_H */

/* ======================================================================================
   IMPLEMENTATION (CUDA C++, nvcc)
   ====================================================================================== */
#if defined(ZERO_CUDA_IMPLEMENTATION) && !defined(ZERO_CUDA_IMPLEMENTATION_DONE)
#define ZERO_CUDA_IMPLEMENTATION_DONE

#ifndef __CUDACC__
#include <cuda_runtime.h> /* tests/cudasim's (it defines CUDASIM), or CUDA's, which errors below */
#endif
#if !defined(__CUDACC__) && !defined(CUDASIM)
#error "zero_cuda.h: the implementation (ZERO_CUDA_IMPLEMENTATION) must be compiled by nvcc (or by g++/clang++ against tests/cudasim, the CPU harness)"
#endif
#ifndef ZERO_IMPLEMENTATION_DONE
#error "zero_cuda.h: define ZERO_IMPLEMENTATION in the same file, before including zero.h"
#endif
#if defined(__FAST_MATH__) || defined(__CUDA_FTZ) || (defined(__CUDA_PREC_DIV) && !__CUDA_PREC_DIV) || \
    (defined(__CUDA_PREC_SQRT) && !__CUDA_PREC_SQRT)
#error "zero_cuda.h: compile without fast-math, -ftz=true, -prec-div=false or -prec-sqrt=false"
#endif

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

/* ZERO_CUDA_ARENA_POISON(p, bytes) / ZERO_CUDA_ARENA_UNPOISON(p, bytes): called for the parts
   of an arena (one cudaMalloc carved into blocks) that are not / become handed out. No-ops
   unless defined before this point: the CPU harness (tests/cudasim) maps them to
   AddressSanitizer's manual poisoning, so a kernel that touches arena memory no alloc owns
   is reported (after the device's queued work, for a free). */
#ifndef ZERO_CUDA_ARENA_POISON
#define ZERO_CUDA_ARENA_POISON(p, bytes) ((void)0)
#endif
#ifndef ZERO_CUDA_ARENA_UNPOISON
#define ZERO_CUDA_ARENA_UNPOISON(p, bytes) ((void)0)
#endif

#define ZERO_CUDA__HD static __host__ __device__ __forceinline__
#define ZERO_CUDA__THREADS 256    /* threads per block of the element kernels              */
#define ZERO_CUDA__ALIGN 256      /* arena block alignment (bytes)                          */
#define ZERO_CUDA__SUMSQ_BLOCK ((size_t)ZERO_HOST_SUMSQ_BLOCK) /* the host device's block  */

/* ---- errors ---- */

static zero_result zero_cuda__err(cudaError_t e, const char *what)
{
    return zero__fail(e == cudaErrorMemoryAllocation ? ZERO_ERROR_OUT_OF_MEMORY : ZERO_ERROR_DEVICE,
                      "%s: %s", what, cudaGetErrorString(e));
}

#define ZERO_CUDA__TRY(call, what)                                                           \
    do {                                                                                     \
        cudaError_t zero_cuda__e = (call);                                                   \
        if (zero_cuda__e != cudaSuccess) return zero_cuda__err(zero_cuda__e, what);          \
    } while (0)

/* After a kernel launch: a bad configuration or an earlier fault shows here. */
static zero_result zero_cuda__launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? ZERO_OK : zero_cuda__err(e, what);
}

/* Makes 'ordinal' current for the scope and restores the caller's device after. */
struct zero_cuda__guard {
    int prev;
    int changed;
    zero_cuda__guard() : prev(0), changed(0) {}
    ~zero_cuda__guard()
    {
        if (changed) (void)cudaSetDevice(prev);
    }
    /* what: the calling op, for the message ("cuda adam") */
    zero_result enter(int ordinal, const char *what)
    {
        cudaError_t e = cudaGetDevice(&prev);
        if (e == cudaSuccess && prev != ordinal) {
            e = cudaSetDevice(ordinal);
            changed = e == cudaSuccess;
        }
        if (e != cudaSuccess)
            return zero__fail(ZERO_ERROR_DEVICE, "%s: cudaSetDevice(%d): %s", what, ordinal, cudaGetErrorString(e));
        return ZERO_OK;
    }
};

/* ======================================================================================
   Conversions: zero.h's own integer converters (zero__f32_to_f16_bits and friends, marked
   ZERO_HOSTDEV) serve host and device alike, so the bits cannot depend on the hardware's
   cvt or on the floating-point mode; below are only the bit casts.
   ====================================================================================== */

ZERO_CUDA__HD uint32_t zero_cuda__f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

ZERO_CUDA__HD float zero_cuda__f32_from(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

ZERO_CUDA__HD uint64_t zero_cuda__f64_bits(double d)
{
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(d);
#else
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
#endif
}

ZERO_CUDA__HD double zero_cuda__f64_from(uint64_t u)
{
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
#endif
}

/* The integer fp16/bf16/fp64 converters are zero.h's own (zero__f32_to_f16_bits and
   friends, ZERO_HOSTDEV under nvcc), so kernels round exactly as the host does. */

/* ======================================================================================
   Element access in kernels. fp16/bf16 are uint16_t bit patterns. ld8/st8 move the 8
   elements starting at i with 16-byte accesses: the caller guarantees p + i is 16-byte
   aligned (zero_cuda__head below).
   ====================================================================================== */

template <int DT> struct zero_cuda__io;

template <> struct zero_cuda__io<ZERO_F32> {
    static __device__ __forceinline__ float ld(const void *p, size_t i)
    {
        return ((const float *)p)[i];
    }
    static __device__ __forceinline__ void st(void *p, size_t i, float x) { ((float *)p)[i] = x; }
    static __device__ __forceinline__ void ld8(const void *p, size_t i, float *x)
    {
        const float4 *q = (const float4 *)((const float *)p + i);
        float4 a = q[0], b = q[1];
        x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
        x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
    }
    static __device__ __forceinline__ void st8(void *p, size_t i, const float *x)
    {
        float4 *q = (float4 *)((float *)p + i);
        q[0] = make_float4(x[0], x[1], x[2], x[3]);
        q[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
};

template <int DT> struct zero_cuda__io16 {
    static __device__ __forceinline__ float widen(uint32_t h)
    {
        return zero_cuda__f32_from(DT == ZERO_F16 ? zero__f16_to_f32_bits((uint16_t)h)
                                                  : zero__bf16_to_f32_bits((uint16_t)h));
    }
    static __device__ __forceinline__ uint32_t narrow(float x)
    {
        return DT == ZERO_F16 ? zero__f32_to_f16_bits(zero_cuda__f32_bits(x))
                              : zero__f32_to_bf16_bits(zero_cuda__f32_bits(x));
    }
    static __device__ __forceinline__ float ld(const void *p, size_t i)
    {
        return widen(((const uint16_t *)p)[i]);
    }
    static __device__ __forceinline__ void st(void *p, size_t i, float x)
    {
        ((uint16_t *)p)[i] = (uint16_t)narrow(x);
    }
    static __device__ __forceinline__ void ld8(const void *p, size_t i, float *x)
    {
        uint4 u = *(const uint4 *)((const uint16_t *)p + i);
        x[0] = widen(u.x & 0xffffu); x[1] = widen(u.x >> 16);
        x[2] = widen(u.y & 0xffffu); x[3] = widen(u.y >> 16);
        x[4] = widen(u.z & 0xffffu); x[5] = widen(u.z >> 16);
        x[6] = widen(u.w & 0xffffu); x[7] = widen(u.w >> 16);
    }
    static __device__ __forceinline__ void st8(void *p, size_t i, const float *x)
    {
        uint4 u;
        u.x = narrow(x[0]) | (narrow(x[1]) << 16);
        u.y = narrow(x[2]) | (narrow(x[3]) << 16);
        u.z = narrow(x[4]) | (narrow(x[5]) << 16);
        u.w = narrow(x[6]) | (narrow(x[7]) << 16);
        *(uint4 *)((uint16_t *)p + i) = u;
    }
};
template <> struct zero_cuda__io<ZERO_F16> : zero_cuda__io16<ZERO_F16> {};
template <> struct zero_cuda__io<ZERO_BF16> : zero_cuda__io16<ZERO_BF16> {};

/* ======================================================================================
   The element-wise driver: elements [0, head) and the tail one by one, the 8-element
   vectors in between (nvec of them, starting at 'head', where every pointer of the op is
   16-byte aligned). Grid-stride loops with 64-bit counters.
   ====================================================================================== */

template <class Op>
static __global__ void __launch_bounds__(ZERO_CUDA__THREADS)
zero_cuda__ew_kernel(Op op, size_t numel, size_t head, size_t nvec)
{
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, body_end = head + 8 * nvec;
    size_t nscalar = numel - 8 * nvec, c, s;
    Op o = op; /* begin() may keep per-launch values (Adam's multiplier) */
    if (!o.begin()) return;
    for (c = tid; c < nvec; c += stride) o.eight(head + 8 * c);
    for (s = tid; s < nscalar; s += stride) o.one(s < head ? s : body_end + (s - head));
}

/* The first element index h in 0..7 at which every pointer (element sizes es[k]) is 16-byte
   aligned, or -1 when there is none (pointers misaligned relative to each other). */
static int zero_cuda__head(const void *const *ptrs, const size_t *es, int n)
{
    int h, k;
    for (h = 0; h < 8; h++) {
        for (k = 0; k < n; k++)
            if (ptrs[k] && ((uintptr_t)ptrs[k] + (uintptr_t)h * es[k]) % 16u != 0) break;
        if (k == n) return h;
    }
    return -1;
}

static unsigned zero_cuda__grid(size_t work, int sm_count, int per_sm)
{
    size_t blocks = (work + ZERO_CUDA__THREADS - 1) / ZERO_CUDA__THREADS;
    size_t cap = (size_t)(sm_count > 0 ? sm_count : 1) * (size_t)per_sm;
    if (blocks > cap) blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

/* ---- the ops ---- */

template <int D, int S> struct zero_cuda__cast_op { /* D, S in {F32, F16, BF16} */
    void *dst;
    const void *src;
    __device__ bool begin() const { return true; }
    __device__ void one(size_t i) const
    {
        zero_cuda__io<D>::st(dst, i, zero_cuda__io<S>::ld(src, i));
    }
    __device__ void eight(size_t i) const
    {
        float x[8];
        zero_cuda__io<S>::ld8(src, i, x);
        zero_cuda__io<D>::st8(dst, i, x);
    }
};

/* Casts with fp64 on one side, one element at a time through the host's bit functions. */
template <int D, int S> struct zero_cuda__cast64_op {
    void *dst;
    const void *src;
    __device__ bool begin() const { return true; }
    __device__ void one(size_t i) const
    {
        if (S == ZERO_F64) {
            uint64_t x = zero_cuda__f64_bits(((const double *)src)[i]);
            if (D == ZERO_F32) ((float *)dst)[i] = zero_cuda__f32_from(zero__f64_narrow_bits(x, 8, 23));
            else ((uint16_t *)dst)[i] = (uint16_t)zero__f64_narrow_bits(x, D == ZERO_F16 ? 5 : 8, D == ZERO_F16 ? 10 : 7);
        } else {
            uint32_t f = S == ZERO_F32 ? zero_cuda__f32_bits(((const float *)src)[i])
                         : S == ZERO_F16 ? zero__f16_to_f32_bits(((const uint16_t *)src)[i])
                                         : zero__bf16_to_f32_bits(((const uint16_t *)src)[i]);
            ((double *)dst)[i] = zero_cuda__f64_from(zero__f32_to_f64_bits(f));
        }
    }
    __device__ void eight(size_t i) const
    {
        for (int k = 0; k < 8; k++) one(i + (size_t)k);
    }
};

template <int DT> struct zero_cuda__add_op { /* dst = round(dst + src), fp32 math */
    void *dst;
    const void *src;
    __device__ bool begin() const { return true; }
    __device__ void one(size_t i) const
    {
        zero_cuda__io<DT>::st(dst, i, __fadd_rn(zero_cuda__io<DT>::ld(dst, i), zero_cuda__io<DT>::ld(src, i)));
    }
    __device__ void eight(size_t i) const
    {
        float a[8], b[8];
        zero_cuda__io<DT>::ld8(dst, i, a);
        zero_cuda__io<DT>::ld8(src, i, b);
        for (int k = 0; k < 8; k++) a[k] = __fadd_rn(a[k], b[k]);
        zero_cuda__io<DT>::st8(dst, i, a);
    }
};

struct zero_cuda__add64_op {
    double *dst;
    const double *src;
    __device__ bool begin() const { return true; }
    __device__ void one(size_t i) const { dst[i] = __dadd_rn(dst[i], src[i]); }
    __device__ void eight(size_t i) const
    {
        for (int k = 0; k < 8; k++) one(i + (size_t)k);
    }
};

template <int DT> struct zero_cuda__scale_op { /* x = round(x * s), fp32 math */
    void *x;
    float s;
    __device__ bool begin() const { return true; }
    __device__ void one(size_t i) const
    {
        zero_cuda__io<DT>::st(x, i, __fmul_rn(zero_cuda__io<DT>::ld(x, i), s));
    }
    __device__ void eight(size_t i) const
    {
        float a[8];
        zero_cuda__io<DT>::ld8(x, i, a);
        for (int k = 0; k < 8; k++) a[k] = __fmul_rn(a[k], s);
        zero_cuda__io<DT>::st8(x, i, a);
    }
};

struct zero_cuda__scale64_op {
    double *x;
    double s;
    __device__ bool begin() const { return true; }
    __device__ void one(size_t i) const { x[i] = __dmul_rn(x[i], s); }
    __device__ void eight(size_t i) const
    {
        for (int k = 0; k < 8; k++) one(i + (size_t)k);
    }
};

/* ---- reductions ---- */

/* *flag = 1 if any element of x is inf or NaN (exponent bits all ones, as integers).
   16-byte words from element 'head' (where x is 16-byte aligned) on, the rest one by one. */
template <int DT>
static __global__ void __launch_bounds__(ZERO_CUDA__THREADS)
zero_cuda__nonfinite_kernel(const void *x, size_t numel, size_t head, size_t nvec, float *flag)
{
    const size_t per = 16 / (DT == ZERO_F64 ? 8 : DT == ZERO_F32 ? 4 : 2);
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, body_end = head + per * nvec;
    size_t nscalar = numel - per * nvec, c, s, i;
    int bad = 0;
    for (c = tid; c < nvec; c += stride) {
        uint4 u = *(const uint4 *)((const unsigned char *)x + (head + per * c) * (16 / per));
        if (DT == ZERO_F32) {
            bad |= ((u.x & 0x7f800000u) == 0x7f800000u) | ((u.y & 0x7f800000u) == 0x7f800000u) |
                   ((u.z & 0x7f800000u) == 0x7f800000u) | ((u.w & 0x7f800000u) == 0x7f800000u);
        } else if (DT == ZERO_F64) { /* little-endian: the high words are y and w */
            bad |= ((u.y & 0x7ff00000u) == 0x7ff00000u) | ((u.w & 0x7ff00000u) == 0x7ff00000u);
        } else {
            const uint32_t lo = DT == ZERO_F16 ? 0x7c00u : 0x7f80u, hi = lo << 16;
            bad |= ((u.x & lo) == lo) | ((u.x & hi) == hi) | ((u.y & lo) == lo) | ((u.y & hi) == hi) |
                   ((u.z & lo) == lo) | ((u.z & hi) == hi) | ((u.w & lo) == lo) | ((u.w & hi) == hi);
        }
    }
    for (s = tid; s < nscalar; s += stride) {
        i = s < head ? s : body_end + (s - head);
        if (DT == ZERO_F32) {
            bad |= (((const uint32_t *)x)[i] & 0x7f800000u) == 0x7f800000u;
        } else if (DT == ZERO_F64) {
            bad |= (((const uint64_t *)x)[i] & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        } else {
            const uint32_t mask = DT == ZERO_F16 ? 0x7c00u : 0x7f80u;
            bad |= (((const uint16_t *)x)[i] & mask) == mask;
        }
    }
    bad = __syncthreads_or(bad);
    if (bad && threadIdx.x == 0) *flag = 1.0f;
}

/* ---- sum of squares (and the non-finite check fused with it) over a table of buffers ----

   The host device defines the result by its order (zero.h, ZERO_HOST_SUMSQ_BLOCK): blocks
   of B = 65536 elements; in a block, lane k (0..7) adds x[i]^2 in fp64 for the i = k mod 8
   of the block in increasing i (acc + (double)x * (double)x, the product exact; fma(x, x,
   acc) for f64); the lanes combine as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); the block sums
   are added in block order from 0.0; then *acc += total. Only the fp64 adds of each lane
   form a chain; everything else is parallel. So one CUDA block of 256 threads does one
   sumsq block at a time:

     - the 65536 elements pass through shared memory in tiles of 2048: every thread loads
       8 consecutive elements (16-byte loads: one for fp16/bf16, two for fp32, four for
       fp64, coalesced across the block) as raw bits, and only then widens them (fp16's
       subnormal loop no longer sits between loads), squares them (exact for fp32 and the
       16-bit types; f64 stays raw for the lanes' fma) and stores 8 doubles to the tile;
     - threads 0..7 (lane k) add tile[8 j + k] for j = 0..255 in order, while the other
       threads already load the next tile (double buffer, one __syncthreads per tile);
     - elements past the end of the buffer stage as +0.0 (acc + 0.0 == acc for every acc a
       lane can hold: +0, positive, +inf, NaN), so the last tile needs no special order;
     - the lanes combine by three shuffles; thread 0 writes the block's partial.

   The non-finite check reads the same raw bits (exponent all ones), so a buffer asking for
   both is read once. A table holds up to ZERO_CUDA__SQ_MAX pieces (a buffer, or a run of
   its blocks when it has more than a launch can hold); the whole table is one launch:
   blocks are assigned to CUDA blocks grid-stride, and the last CUDA block to finish (a
   ticket counter) adds the partials of each piece in block order and does *acc += total
   for the piece that ends a buffer (or keeps a running total for the next launch). */

#define ZERO_CUDA__SQ_MAX 128    /* pieces per launch                              */
#define ZERO_CUDA__SQ_TILE 2048  /* elements per shared-memory tile (8 per thread)  */
#define ZERO_CUDA__SQ_PARTS 16384 /* block partials per launch (per-queue scratch)   */
#define ZERO_CUDA__SCRATCH_Q (ZERO_CUDA__SQ_PARTS + 2) /* doubles of scratch per queue */

enum { ZERO_CUDA__SQ_SUM = 1, ZERO_CUDA__SQ_NONFINITE = 2, ZERO_CUDA__SQ_FIRST = 4, ZERO_CUDA__SQ_LAST = 8 };

typedef struct zero_cuda__sq_table {
    const void *x[ZERO_CUDA__SQ_MAX];
    size_t numel[ZERO_CUDA__SQ_MAX];       /* the whole buffer's                       */
    size_t first_block[ZERO_CUDA__SQ_MAX]; /* this piece: blocks [first, first + count) */
    size_t start[ZERO_CUDA__SQ_MAX + 1];   /* piece p's blocks are launch blocks [start[p], start[p + 1]) */
    unsigned char flags[ZERO_CUDA__SQ_MAX];
    int n;
    double *acc;      /* += the sum of squares (pieces with SQ_SUM)              */
    float *flag;      /* = 1 when a piece with SQ_NONFINITE has an inf or NaN     */
    double *partials; /* ZERO_CUDA__SQ_PARTS, then the running total, then the ticket */
} zero_cuda__sq_table;

/* The piece holding launch block g: the last p with start[p] <= g (start is increasing;
   empty pieces share their start with the next one). */
ZERO_CUDA__HD int zero_cuda__find_piece(const size_t *start, int n, size_t g)
{
    int lo = 0, hi = n - 1, mid;
    while (lo < hi) {
        mid = (lo + hi + 1) / 2;
        if (start[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Element i of x in dtype DT as raw bits (fp16/bf16: 16 bits, fp32: 32, fp64: 64). */
template <int DT> struct zero_cuda__raw {
    typedef typename std::conditional<DT == ZERO_F64, unsigned long long,
                                      typename std::conditional<DT == ZERO_F32, uint32_t, uint16_t>::type>::type T;
};

/* Thread t's 8 elements of a tile: raw bits, 16-byte loads when the whole 8 are inside the
   buffer and x is 16-byte aligned (then every 8-element group is), else one by one with
   +0 bits past the end. Loads only: nothing here depends on a loaded value. */
template <int DT>
static __device__ __forceinline__ void zero_cuda__sq_load(const void *x, size_t numel, size_t i0, int vec,
                                                          typename zero_cuda__raw<DT>::T *r)
{
    typedef typename zero_cuda__raw<DT>::T T;
    const T *p = (const T *)x;
    if (vec && i0 + 8 <= numel) {
        const uint4 *q = (const uint4 *)(p + i0);
        uint4 u[sizeof(T) / 2];
#pragma unroll
        for (int k = 0; k < (int)(sizeof(T) / 2); k++) u[k] = __ldg(q + k);
        memcpy(r, u, sizeof u);
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) r[k] = i0 + (size_t)k < numel ? __ldg(p + i0 + k) : (T)0;
    }
}

/* Raw bits -> what a lane adds (the exact square in fp64; f64: the value itself) and
   whether it is inf or NaN. Host and device: tests/cuda/test_cuda_host.cu runs the whole
   tile scheme through it on the CPU against the host device. */
template <int DT>
ZERO_CUDA__HD double zero_cuda__sq_stage(typename zero_cuda__raw<DT>::T r, int *bad)
{
    if constexpr (DT == ZERO_F64) {
        *bad |= (r & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        return zero_cuda__f64_from(r);
    } else {
        uint32_t f;
        if constexpr (DT == ZERO_F32) {
            f = r;
            *bad |= (r & 0x7f800000u) == 0x7f800000u;
        } else if constexpr (DT == ZERO_F16) {
            f = zero__f16_to_f32_bits(r);
            *bad |= (r & 0x7c00u) == 0x7c00u;
        } else {
            f = zero__bf16_to_f32_bits(r);
            *bad |= (r & 0x7f80u) == 0x7f80u;
        }
        double d = (double)zero_cuda__f32_from(f);
        return d * d; /* exact: 24-bit significands, fp64 range */
    }
}

/* One lane step: acc + v (v an exact square), or fma(x, x, acc) for f64. */
template <int DT> ZERO_CUDA__HD double zero_cuda__sq_add(double acc, double v)
{
#ifdef __CUDA_ARCH__
    if constexpr (DT == ZERO_F64) return fma(v, v, acc);
    else return __dadd_rn(acc, v);
#else
    if constexpr (DT == ZERO_F64) return fma(v, v, acc);
    else return acc + v;
#endif
}

/* Piece p of a table is complete with sum 'total': a piece that ends its buffer adds it to
   *acc (when it asked for a sum), any other keeps it as the running total for the piece
   that continues the buffer in the next launch. Returns the starting total of piece p + 1
   (0.0 when it starts a buffer, else the running total). Host and device. */
ZERO_CUDA__HD double zero_cuda__sq_close(const zero_cuda__sq_table *tab, int p, double total, double *acc,
                                         double *running)
{
    if (tab->flags[p] & ZERO_CUDA__SQ_LAST) {
        if (tab->flags[p] & ZERO_CUDA__SQ_SUM) *acc = *acc + total;
    } else {
        *running = total;
    }
    if (p + 1 >= tab->n) return 0.0;
    return (tab->flags[p + 1] & ZERO_CUDA__SQ_FIRST) ? 0.0 : *running;
}

/* The host's lane tree. */
ZERO_CUDA__HD double zero_cuda__sq_tree(const double *l)
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

template <int DT>
static __global__ void __launch_bounds__(ZERO_CUDA__THREADS)
zero_cuda__sumsq_kernel(const __grid_constant__ zero_cuda__sq_table tab)
{
    typedef typename zero_cuda__raw<DT>::T T;
    __shared__ double tile[2][ZERO_CUDA__SQ_TILE];
    __shared__ int last;
    const unsigned t = threadIdx.x;
    const size_t nblocks = tab.start[tab.n];
    size_t g;
    for (g = blockIdx.x; g < nblocks; g += gridDim.x) {
        const int p = zero_cuda__find_piece(tab.start, tab.n, g); /* the same for the whole block */
        const void *x = tab.x[p];
        const size_t numel = tab.numel[p];
        const size_t begin = (tab.first_block[p] + (g - tab.start[p])) * ZERO_CUDA__SUMSQ_BLOCK;
        const size_t len = numel - begin < ZERO_CUDA__SUMSQ_BLOCK ? numel - begin : ZERO_CUDA__SUMSQ_BLOCK;
        const int ntiles = (int)((len + ZERO_CUDA__SQ_TILE - 1) / ZERO_CUDA__SQ_TILE);
        const int vec = ((uintptr_t)x & 15u) == 0;
        T r[8];
        double acc = 0.0;
        int bad = 0, tt, k, j;
        zero_cuda__sq_load<DT>(x, numel, begin + 8 * (size_t)t, vec, r);
#pragma unroll
        for (k = 0; k < 8; k++) tile[0][8 * t + k] = zero_cuda__sq_stage<DT>(r[k], &bad);
        __syncthreads();
        for (tt = 0; tt < ntiles; tt++) {
            const int more = tt + 1 < ntiles;
            if (more) /* in flight while the lanes add */
                zero_cuda__sq_load<DT>(x, numel, begin + (size_t)(tt + 1) * ZERO_CUDA__SQ_TILE + 8 * (size_t)t, vec, r);
            if (t < 8) {
                const double *s = tile[tt & 1] + t;
#pragma unroll 16
                for (j = 0; j < ZERO_CUDA__SQ_TILE / 8; j++) acc = zero_cuda__sq_add<DT>(acc, s[8 * j]);
            }
            if (more) {
#pragma unroll
                for (k = 0; k < 8; k++) tile[(tt + 1) & 1][8 * t + k] = zero_cuda__sq_stage<DT>(r[k], &bad);
            }
            __syncthreads();
        }
        if (t < 32) { /* warp 0, all lanes (8..31 hold 0.0, unused): ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) */
            double o = __shfl_down_sync(0xffffffffu, acc, 1);
            if ((t & 1u) == 0) acc = __dadd_rn(acc, o);
            o = __shfl_down_sync(0xffffffffu, acc, 2);
            if ((t & 3u) == 0) acc = __dadd_rn(acc, o);
            o = __shfl_down_sync(0xffffffffu, acc, 4);
            if (t == 0) tab.partials[g] = __dadd_rn(acc, o);
        }
        bad = __syncthreads_or(bad);
        if (bad && t == 0 && (tab.flags[p] & ZERO_CUDA__SQ_NONFINITE)) *tab.flag = 1.0f;
    }
    /* the last CUDA block adds the partials in order */
    __threadfence();
    __syncthreads();
    if (t == 0) {
        unsigned *ticket = (unsigned *)(tab.partials + ZERO_CUDA__SQ_PARTS + 1);
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    {
        double *running = tab.partials + ZERO_CUDA__SQ_PARTS;
        double total = (tab.flags[0] & ZERO_CUDA__SQ_FIRST) ? 0.0 : *running;
        int p = 0;
        size_t base, m;
        for (base = 0; base < nblocks; base += ZERO_CUDA__THREADS) {
            tile[0][t] = base + t < nblocks ? __ldcg(tab.partials + base + t) : 0.0;
            __syncthreads();
            if (t == 0) {
                m = nblocks - base < ZERO_CUDA__THREADS ? nblocks - base : ZERO_CUDA__THREADS;
                for (size_t q = 0; q < m; q++) {
                    while (base + q == tab.start[p + 1]) { /* piece p is complete */
                        total = zero_cuda__sq_close(&tab, p, total, tab.acc, running);
                        p++;
                    }
                    total = __dadd_rn(total, tile[0][q]);
                }
            }
            __syncthreads();
        }
        if (t == 0) {
            for (; p < tab.n; p++) /* the rest, empty pieces included */
                total = zero_cuda__sq_close(&tab, p, total, tab.acc, running);
            *(unsigned *)(tab.partials + ZERO_CUDA__SQ_PARTS + 1) = 0u; /* for the next launch */
        }
    }
}

/* ---- Adam over a table of ranges: one launch for every (tensor x shard) segment ----

   Each range is cut into slots: slot 0 = its scalar head [0, h) (h = where every pointer
   of the range is 16-byte aligned, 0..7), slot q >= 1 = the 8 elements from h + 8 (q - 1)
   (16-byte accesses when all 8 are inside, else one by one). When the pointers are
   misaligned relative to each other (no such h) the head is empty and every slot goes one
   by one: still 8 elements to a thread, never the whole range on one thread (align_numel
   below 8 gives odd ranks' shards such ranges). 256 slots make a chunk, one thread
   each; chunks of all ranges are numbered in table order and taken grid-stride by CUDA
   blocks, which find their range by a binary search over the chunk starts. Vector and
   scalar elements run the same zero_adam_update, so an element's bits do not depend on
   where it falls, nor on the table it came in. */

#define ZERO_CUDA__ADAM_MAX 192 /* ranges per launch (the table is a kernel parameter) */
/* distinct coefficient sets per launch: one per (lr multiplier, weight decay) pair in use
   (zero_engine_set_tensor_hparams), so a few parameter groups share one launch */
#define ZERO_CUDA__ADAM_COEFS 8

typedef struct zero_cuda__adam_seg {
    float *master, *m, *v;
    const void *grad;
    void *param;
    size_t numel;
    unsigned head;   /* 0..7; or 8: no 16-byte path (pointers misaligned to each other) */
    unsigned coefs;  /* index into the table's coefficient sets                         */
    uint64_t sr_key, sr_index; /* bf16 states: the stochastic rounding's key and counter */
    unsigned bf16;   /* 1: master, m, v are bf16 (state_dtype BF16; always head 8)       */
} zero_cuda__adam_seg;

typedef struct zero_cuda__adam_table {
    zero_cuda__adam_seg seg[ZERO_CUDA__ADAM_MAX];
    size_t start[ZERO_CUDA__ADAM_MAX + 1]; /* range r's chunks: [start[r], start[r + 1]) */
    zero_adam_coefs coefs[ZERO_CUDA__ADAM_COEFS];
    const float *mul, *skip;
    int n, ncoefs;
} zero_cuda__adam_table;

/* Elements a slot holds at most (the head: at most 7). */
#define ZERO_CUDA__ADAM_SLOT 8

/* Slots of a range: 1 (the head, empty for head 8) + the 8-element groups after it. */
ZERO_CUDA__HD size_t zero_cuda__adam_slots(size_t numel, unsigned head)
{
    size_t h = head > 7 ? 0 : (head < numel ? head : numel);
    return 1 + (numel - h + 7) / 8;
}

/* Elements [*lo, *hi) of slot q of a range, and whether they go as one 16-byte vector
   (never for head 8: its pointers have no common 16-byte aligned element). */
ZERO_CUDA__HD int zero_cuda__adam_slot(size_t numel, unsigned head, size_t q, size_t *lo, size_t *hi)
{
    size_t h = head > 7 ? 0 : (head < numel ? head : numel);
    if (q == 0) {
        *lo = 0;
        *hi = h;
        return 0;
    }
    *lo = h + 8 * (q - 1);
    *hi = numel - *lo < 8 ? numel : *lo + 8;
    return head <= 7 && *hi - *lo == 8;
}

template <int G, int P>
static __device__ __forceinline__ void zero_cuda__adam_one(const zero_cuda__adam_seg &s, size_t i, float mul,
                                                           const zero_adam_coefs &c)
{
    float p, mm, vv;
    if (s.bf16) { /* bf16 states: the element function every backend shares */
        p = zero_adam_update_bf16(__fmul_rn(zero_cuda__io<G>::ld(s.grad, i), mul),
                                  (uint16_t *)(void *)s.master + i, (uint16_t *)(void *)s.m + i,
                                  (uint16_t *)(void *)s.v + i, &c,
                                  zero_sr_bits(s.sr_key, s.sr_index + i));
        if constexpr (P != 0) zero_cuda__io<P>::st(s.param, i, p);
        return;
    }
    p = s.master[i], mm = s.m[i], vv = s.v[i];
    zero_adam_update(__fmul_rn(zero_cuda__io<G>::ld(s.grad, i), mul), &p, &mm, &vv, &c);
    s.master[i] = p;
    s.m[i] = mm;
    s.v[i] = vv;
    if constexpr (P != 0) zero_cuda__io<P>::st(s.param, i, p);
}

template <int G, int P>
static __device__ __forceinline__ void zero_cuda__adam_eight(const zero_cuda__adam_seg &s, size_t i, float mul,
                                                             const zero_adam_coefs &c)
{
    float g[8], p[8], mm[8], vv[8];
    /* every load first (raw for the 16-bit gradient), then the conversions and math */
    zero_cuda__io<ZERO_F32>::ld8(s.master, i, p);
    zero_cuda__io<ZERO_F32>::ld8(s.m, i, mm);
    zero_cuda__io<ZERO_F32>::ld8(s.v, i, vv);
    zero_cuda__io<G>::ld8(s.grad, i, g);
#pragma unroll
    for (int k = 0; k < 8; k++) zero_adam_update(__fmul_rn(g[k], mul), &p[k], &mm[k], &vv[k], &c);
    zero_cuda__io<ZERO_F32>::st8(s.master, i, p);
    zero_cuda__io<ZERO_F32>::st8(s.m, i, mm);
    zero_cuda__io<ZERO_F32>::st8(s.v, i, vv);
    if constexpr (P != 0) zero_cuda__io<P>::st8(s.param, i, p);
}

template <int G, int P>
static __global__ void __launch_bounds__(ZERO_CUDA__THREADS)
zero_cuda__adam_kernel(const __grid_constant__ zero_cuda__adam_table tab)
{
    const size_t nchunks = tab.start[tab.n];
    size_t ch, q, lo, hi, i;
    float mul;
    if (tab.skip && *tab.skip != 0.0f) return; /* a skipped step reads and writes nothing */
    mul = *tab.mul;
    for (ch = blockIdx.x; ch < nchunks; ch += gridDim.x) {
        const int r = zero_cuda__find_piece(tab.start, tab.n, ch);
        const zero_cuda__adam_seg &s = tab.seg[r];
        const zero_adam_coefs &c = tab.coefs[s.coefs];
        q = (ch - tab.start[r]) * ZERO_CUDA__THREADS + threadIdx.x;
        if (q >= zero_cuda__adam_slots(s.numel, s.head)) continue;
        if (zero_cuda__adam_slot(s.numel, s.head, q, &lo, &hi)) {
            zero_cuda__adam_eight<G, P>(s, lo, mul, c);
        } else {
            for (i = lo; i < hi; i++) zero_cuda__adam_one<G, P>(s, i, mul, c);
        }
    }
}

/* Appends a range to the table (room checked by the caller): its head, and its chunks
   after the table's last. Shared with tests/cuda/test_cuda_host.cu, which walks the table
   on the CPU as the kernel does. */
static void zero_cuda__adam_push(zero_cuda__adam_table *t, const zero_adam_range *range, unsigned coefs)
{
    zero_cuda__adam_seg *sg = &t->seg[t->n];
    const void *ptrs[5] = {range->master, range->m, range->v, range->grad, range->param};
    size_t es[5] = {4, 4, 4, zero_dtype_size(range->grad_dtype),
                    range->param ? zero_dtype_size(range->param_dtype) : 0};
    const int bf16 = range->state_dtype == ZERO_BF16;
    int head = bf16 ? -1 : zero_cuda__head(ptrs, es, 5); /* bf16 states: element by element */
    size_t slots;
    sg->master = range->master;
    sg->m = range->m;
    sg->v = range->v;
    sg->grad = range->grad;
    sg->param = range->param;
    sg->numel = range->numel;
    sg->head = head < 0 ? 8u : (unsigned)head;
    sg->coefs = coefs;
    sg->bf16 = (unsigned)bf16;
    sg->sr_key = range->sr_key;
    sg->sr_index = range->sr_index;
    slots = zero_cuda__adam_slots(sg->numel, sg->head);
    t->start[t->n + 1] = t->start[t->n] + (slots + ZERO_CUDA__THREADS - 1) / ZERO_CUDA__THREADS;
    t->n++;
}

static __global__ void zero_cuda__grad_mul_kernel(const double *sumsq, const float *nonfinite, float unscale,
                                                  float clip_norm, float *out)
{
    zero_grad_mul(*sumsq, *nonfinite, unscale, clip_norm, &out[0], &out[1]);
}

/* ---- the comm's reduction: dst[i] = op over sources in rank order (local comm rules) ---- */

struct zero_cuda__srcs {
    const void *p[ZERO_CUDA_MAX_RANKS];
};

template <int DT, int OP>
static __global__ void __launch_bounds__(ZERO_CUDA__THREADS)
zero_cuda__reduce_kernel(zero_cuda__srcs s, int nsrc, void *dst, size_t numel)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    int r;
    for (; i < numel; i += stride) {
        if constexpr (DT == ZERO_F64) {
            double acc = ((const double *)s.p[0])[i], x;
            for (r = 1; r < nsrc; r++) {
                x = ((const double *)s.p[r])[i];
                if (OP == ZERO_OP_SUM) acc = __dadd_rn(acc, x);
                else if (x > acc || x != x) acc = acc != acc ? acc : x; /* NaN wins, first kept */
            }
            ((double *)dst)[i] = acc;
        } else {
            float acc = zero_cuda__io<DT>::ld(s.p[0], i), x;
            for (r = 1; r < nsrc; r++) {
                x = zero_cuda__io<DT>::ld(s.p[r], i);
                if (OP == ZERO_OP_SUM) acc = __fadd_rn(acc, x);
                else if (x > acc || x != x) acc = acc != acc ? acc : x;
            }
            zero_cuda__io<DT>::st(dst, i, acc);
        }
    }
}

/* ======================================================================================
   The device: streams, scratch, the arena allocator, pinned memory.
   ====================================================================================== */

typedef struct zero_cuda__block {
    struct zero_cuda__block *prev, *next; /* neighbours in the arena, by address */
    size_t offset, size;                  /* size: a multiple of ZERO_CUDA__ALIGN */
    size_t requested;
    int used;
    zero_mem_category category;
} zero_cuda__block;

typedef struct zero_cuda__arena {
    struct zero_cuda__arena *next; /* newest first */
    char *base;
    size_t bytes;
    size_t live; /* used blocks */
    zero_cuda__block *first;
} zero_cuda__arena;

typedef struct zero_cuda__mem { /* a fallback allocation or a pinned buffer */
    struct zero_cuda__mem *next;
    void *ptr;
    size_t bytes;
    zero_mem_category category;
} zero_cuda__mem;

/* Batched launches (one queue's): consecutive nonfinite/sumsq calls become one launch of
   the sum-of-squares kernel over a table, consecutive adam calls one launch of the Adam
   kernel over a table. The batch is launched (flushed) by the next op of the device that
   is not a compatible call of the same kind (any queue), by native_queue(), by free,
   reserve and destroy, and by zero_cuda_flush(). */
#define ZERO_CUDA__SQ_REQS 256 /* nonfinite/sumsq calls held per queue */
typedef struct zero_cuda__sq_req {
    const void *x;
    size_t numel;
    unsigned char flags; /* ZERO_CUDA__SQ_SUM and/or ZERO_CUDA__SQ_NONFINITE */
} zero_cuda__sq_req;

enum { ZERO_CUDA__PEND_NONE = 0, ZERO_CUDA__PEND_STATS = 1, ZERO_CUDA__PEND_ADAM = 2 };

typedef struct zero_cuda__pending {
    int kind;
    zero_dtype dtype;     /* stats: the buffers' dtype; adam: the gradient's          */
    zero_dtype pdtype;    /* adam: the param's, or ZERO_DTYPE_COUNT-like -1 for none  */
    double *acc;          /* stats                                                     */
    float *flag;          /* stats                                                     */
    int n;
    zero_cuda__sq_req req[ZERO_CUDA__SQ_REQS];
    zero_cuda__adam_table adam;
} zero_cuda__pending;

typedef struct zero_cuda__device {
    zero_device base;
    int ordinal;
    int sm_count;
    cudaStream_t streams[ZERO_QUEUE_COUNT];
    int has_stream[ZERO_QUEUE_COUNT]; /* set: created here, or the user's */
    int own_stream[ZERO_QUEUE_COUNT]; /* created here: destroyed with the device */
    double *scratch; /* per queue: ZERO_CUDA__SQ_PARTS partials, a running total, a ticket */
    pthread_mutex_t mu; /* guards the lists, counters and batches below */
    zero_cuda__pending pend[ZERO_QUEUE_COUNT];
    zero_result flush_err;   /* a launch failure of native_queue()'s flush, returned by   */
    char flush_msg[512];     /* the device's next op                                      */
    zero_cuda__arena *arenas;
    zero_cuda__mem *fallbacks;
    zero_cuda__mem *pinned;
    size_t bytes[ZERO_MEM_COUNT];
    size_t allocations;
    size_t fallback_bytes, pinned_bytes;
    unsigned long long cuda_mallocs;
} zero_cuda__device;

static void zero_cuda__destroy(zero_device *dev);
static zero_result zero_cuda__flush(zero_cuda__device *d);

static zero_cuda__device *zero_cuda__get(const zero_device *dev)
{
    if (!dev || !dev->ops || dev->ops->destroy != zero_cuda__destroy || !dev->impl) return NULL;
    return (zero_cuda__device *)dev->impl;
}

/* Every op: a CUDA device, a queue in range, its GPU current for the scope. */
#define ZERO_CUDA__ENTER_D(what)                                                              \
    zero_cuda__device *d = zero_cuda__get(dev);                                              \
    zero_cuda__guard guard;                                                                  \
    zero_result enter_res;                                                                   \
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: dev is not a CUDA device", what); \
    if ((int)q < 0 || (int)q >= ZERO_QUEUE_COUNT)                                            \
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: queue %d out of range", what, (int)q); \
    if ((enter_res = guard.enter(d->ordinal, what)) != ZERO_OK) return enter_res;
#define ZERO_CUDA__ENTER(what)                                                                \
    ZERO_CUDA__ENTER_D(what);                                                                \
    cudaStream_t stream = d->streams[q]

/* A GPU load of an element must be aligned to its size (the host device would not care:
   refuse here rather than fault the context). */
static zero_result zero_cuda__check_align(const char *what, const char *arg, const void *p, size_t es)
{
    if (p && es && (uintptr_t)p % es != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda %s: %s = %p is not aligned to its element size (%zu)",
                          what, arg, p, es);
    return ZERO_OK;
}

/* As the host device: NULL with numel > 0, an unknown dtype or a size overflow is an error;
   and the pointer must be aligned to its element size. */
static zero_result zero_cuda__check_buf(const char *what, const char *arg, const void *p, zero_dtype dtype,
                                        size_t numel)
{
    size_t es = zero_dtype_size(dtype), bytes;
    if (es == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda %s: unknown dtype %d", what, (int)dtype);
    if (zero__mul_size(numel, es, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "cuda %s: numel %zu of %s overflows", what, numel,
                          zero_dtype_name(dtype));
    if (numel > 0 && !p)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda %s: %s is NULL with numel = %zu", what, arg, numel);
    return zero_cuda__check_align(what, arg, p, es);
}

static int zero_cuda__overlap(const void *a, size_t abytes, const void *b, size_t bbytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return abytes && bbytes && x < y + bbytes && y < x + abytes;
}

/* ---- memory ---- */

static void zero_cuda__arena_release(zero_cuda__device *d, zero_cuda__arena *a)
{
    zero_cuda__block *b = a->first, *n;
    (void)cudaFree(a->base);
    for (; b; b = n) {
        n = b->next;
        zero__free(NULL, b);
    }
    zero__free(NULL, a);
    (void)d;
}

/* Under the lock: unlinks and frees every empty arena but the newest. */
static void zero_cuda__arena_trim(zero_cuda__device *d, int keep_newest)
{
    zero_cuda__arena **pa = &d->arenas, *a;
    if (keep_newest && *pa) pa = &(*pa)->next;
    while ((a = *pa) != NULL) {
        if (a->live == 0) {
            *pa = a->next;
            zero_cuda__arena_release(d, a);
        } else {
            pa = &a->next;
        }
    }
}

static zero_result zero_cuda__reserve(zero_device *dev, size_t total_bytes, size_t num_allocations)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    zero_cuda__arena *a;
    size_t slack, bytes;
    zero_result res;
    cudaError_t e;
    void *base = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda reserve: dev is not a CUDA device");
    if (zero__mul_size(num_allocations, ZERO_CUDA__ALIGN, &slack) != 0 ||
        zero__add_size(total_bytes, slack, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "cuda reserve: %zu bytes in %zu allocations overflow",
                          total_bytes, num_allocations);
    if (bytes == 0) return ZERO_OK;
    if ((res = guard.enter(d->ordinal, "cuda reserve")) != ZERO_OK) return res;
    if ((res = zero_cuda__flush(d)) != ZERO_OK) return res; /* held calls may use an old arena */
    a = (zero_cuda__arena *)zero__alloc(NULL, sizeof *a);
    zero_cuda__block *b = (zero_cuda__block *)zero__alloc(NULL, sizeof *b);
    if (!a || !b) {
        zero__free(NULL, a);
        zero__free(NULL, b);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "cuda reserve: out of host memory");
    }
    pthread_mutex_lock(&d->mu);
    zero_cuda__arena_trim(d, 0); /* arenas of engines already destroyed */
    e = cudaMalloc(&base, bytes);
    if (e == cudaSuccess) d->cuda_mallocs++;
    if (e != cudaSuccess) {
        pthread_mutex_unlock(&d->mu);
        zero__free(NULL, a);
        zero__free(NULL, b);
        size_t fb = 0, tb = 0;
        (void)cudaGetLastError(); /* an OOM is not sticky: clear it */
        if (e == cudaErrorMemoryAllocation && cudaMemGetInfo(&fb, &tb) == cudaSuccess)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY,
                              "cuda reserve: %zu bytes asked, device memory %zu bytes (%zu free)", bytes, tb,
                              fb);
        (void)cudaGetLastError();
        return zero__fail(e == cudaErrorMemoryAllocation ? ZERO_ERROR_OUT_OF_MEMORY : ZERO_ERROR_DEVICE,
                          "cuda reserve: cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    ZERO_CUDA_ARENA_POISON(base, bytes);
    memset(b, 0, sizeof *b);
    b->size = bytes;
    a->base = (char *)base;
    a->bytes = bytes;
    a->live = 0;
    a->first = b;
    a->next = d->arenas;
    d->arenas = a;
    pthread_mutex_unlock(&d->mu);
    return ZERO_OK;
}

/* Under the lock: a block of 'size' (aligned) bytes from the arenas, or NULL. */
static void *zero_cuda__arena_take(zero_cuda__device *d, size_t size, size_t requested, zero_mem_category cat,
                                   int *oom)
{
    zero_cuda__arena *a;
    zero_cuda__block *b, *rest;
    for (a = d->arenas; a; a = a->next)
        for (b = a->first; b; b = b->next) {
            if (b->used || b->size < size) continue;
            if (b->size - size >= ZERO_CUDA__ALIGN) { /* split: the rest stays free */
                rest = (zero_cuda__block *)zero__alloc(NULL, sizeof *rest);
                if (!rest) {
                    *oom = 1;
                    return NULL;
                }
                memset(rest, 0, sizeof *rest);
                rest->offset = b->offset + size;
                rest->size = b->size - size;
                rest->prev = b;
                rest->next = b->next;
                if (b->next) b->next->prev = rest;
                b->next = rest;
                b->size = size;
            }
            b->used = 1;
            b->requested = requested;
            b->category = cat;
            a->live++;
            ZERO_CUDA_ARENA_UNPOISON(a->base + b->offset, requested);
            return a->base + b->offset;
        }
    return NULL;
}

static zero_result zero_cuda__alloc(zero_device *dev, size_t bytes, zero_mem_category category, void **out)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    zero_cuda__mem *f;
    size_t size;
    void *p;
    int oom = 0;
    zero_result res;
    cudaError_t e;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda alloc: dev is not a CUDA device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda alloc: out is NULL");
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda alloc: bytes = 0");
    if ((int)category < 0 || category >= ZERO_MEM_COUNT)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda alloc: category %d out of range", (int)category);
    if (zero__add_size(bytes, ZERO_CUDA__ALIGN - 1, &size) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "cuda alloc: bytes = %zu overflows", bytes);
    size &= ~(size_t)(ZERO_CUDA__ALIGN - 1);
    pthread_mutex_lock(&d->mu);
    p = zero_cuda__arena_take(d, size, bytes, category, &oom);
    if (p) {
        d->bytes[category] += bytes;
        d->allocations++;
    }
    pthread_mutex_unlock(&d->mu);
    if (oom) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "cuda alloc: out of host memory");
    if (p) {
        *out = p;
        return ZERO_OK;
    }
    /* No arena room: its own cudaMalloc (setup time: the engine reserves first). */
    if ((res = guard.enter(d->ordinal, "cuda alloc")) != ZERO_OK) return res;
    f = (zero_cuda__mem *)zero__alloc(NULL, sizeof *f);
    if (!f) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "cuda alloc: out of host memory");
    e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
        zero__free(NULL, f);
        (void)cudaGetLastError();
        return zero__fail(e == cudaErrorMemoryAllocation ? ZERO_ERROR_OUT_OF_MEMORY : ZERO_ERROR_DEVICE,
                          "cuda alloc: cudaMalloc(%zu bytes, %s): %s", bytes, zero_mem_category_name(category),
                          cudaGetErrorString(e));
    }
    f->ptr = p;
    f->bytes = bytes;
    f->category = category;
    pthread_mutex_lock(&d->mu);
    f->next = d->fallbacks;
    d->fallbacks = f;
    d->cuda_mallocs++;
    d->fallback_bytes += bytes;
    d->bytes[category] += bytes;
    d->allocations++;
    pthread_mutex_unlock(&d->mu);
    *out = p;
    return ZERO_OK;
}

static zero_result zero_cuda__free(zero_device *dev, void *ptr)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    zero_cuda__arena *a;
    zero_cuda__block *b, *n;
    zero_cuda__mem **pf, *f;
    zero_result res;
    char *p = (char *)ptr;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda free: dev is not a CUDA device");
    if (!ptr) return ZERO_OK;
    if ((res = guard.enter(d->ordinal, "cuda free")) != ZERO_OK) return res; /* cudaFree below */
    if ((res = zero_cuda__flush(d)) != ZERO_OK) return res; /* held calls may use the block */
    pthread_mutex_lock(&d->mu);
    for (a = d->arenas; a; a = a->next) {
        if (p < a->base || p >= a->base + a->bytes) continue;
        for (b = a->first; b; b = b->next)
            if (a->base + b->offset == p && b->used) break;
        if (!b) break;
        d->bytes[b->category] -= b->requested;
        d->allocations--;
        ZERO_CUDA_ARENA_POISON(p, b->size);
        b->used = 0;
        b->requested = 0;
        if ((n = b->next) != NULL && !n->used) { /* merge the next free block */
            b->size += n->size;
            b->next = n->next;
            if (n->next) n->next->prev = b;
            zero__free(NULL, n);
        }
        if ((n = b->prev) != NULL && !n->used) { /* merge into the previous free block */
            n->size += b->size;
            n->next = b->next;
            if (b->next) b->next->prev = n;
            zero__free(NULL, b);
        }
        a->live--;
        if (a->live == 0 && a != d->arenas) zero_cuda__arena_trim(d, 1); /* an older engine's */
        pthread_mutex_unlock(&d->mu);
        return ZERO_OK;
    }
    for (pf = &d->fallbacks; (f = *pf) != NULL; pf = &f->next)
        if (f->ptr == ptr) break;
    if (f) {
        *pf = f->next;
        d->fallback_bytes -= f->bytes;
        d->bytes[f->category] -= f->bytes;
        d->allocations--;
    }
    pthread_mutex_unlock(&d->mu);
    if (!f)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "cuda free: %p was not allocated by this device (or was freed already)", ptr);
    {
        cudaError_t e = cudaFree(f->ptr);
        res = e == cudaSuccess ? ZERO_OK : zero_cuda__err(e, "cuda free: cudaFree");
    }
    zero__free(NULL, f);
    return res;
}

/* ---- batched launches ---- */

template <int DT>
static zero_result zero_cuda__sq_launch(const zero_cuda__device *d, cudaStream_t stream, const zero_cuda__sq_table *tab)
{
    size_t nblocks = tab->start[tab->n];
    size_t cap = (size_t)(d->sm_count > 0 ? d->sm_count : 1) * 6; /* 32 KiB of shared memory per block */
    unsigned grid = (unsigned)(nblocks < cap ? (nblocks ? nblocks : 1) : cap);
    ZERO_CUDA_LAUNCH(zero_cuda__sumsq_kernel<DT>, grid, ZERO_CUDA__THREADS, 0, stream, *tab);
    return zero_cuda__launched("cuda sumsq (batched): kernel launch");
}

static zero_result zero_cuda__sq_launch_dt(const zero_cuda__device *d, cudaStream_t stream, zero_dtype dt,
                                           const zero_cuda__sq_table *tab)
{
    switch (dt) {
    case ZERO_F32: return zero_cuda__sq_launch<ZERO_F32>(d, stream, tab);
    case ZERO_F16: return zero_cuda__sq_launch<ZERO_F16>(d, stream, tab);
    case ZERO_BF16: return zero_cuda__sq_launch<ZERO_BF16>(d, stream, tab);
    default: return zero_cuda__sq_launch<ZERO_F64>(d, stream, tab);
    }
}

template <int DT>
static zero_result zero_cuda__nonfinite_run(const zero_cuda__device *d, cudaStream_t stream, const void *x,
                                            size_t numel, float *flag)
{
    const size_t es = DT == ZERO_F64 ? 8 : DT == ZERO_F32 ? 4 : 2, per = 16 / es;
    size_t head = 0, nvec = 0, h;
    uintptr_t a = (uintptr_t)x;
    if (a % es == 0) {
        h = ((16u - a % 16u) % 16u) / es;
        if (h < numel && numel - h >= per) {
            head = h;
            nvec = (numel - head) / per;
        }
    }
    ZERO_CUDA_LAUNCH(zero_cuda__nonfinite_kernel<DT>, zero_cuda__grid(nvec + (numel - per * nvec), d->sm_count, 8),
                     ZERO_CUDA__THREADS, 0, stream, x, numel, head, nvec, flag);
    return zero_cuda__launched("cuda nonfinite: kernel launch");
}

/* Cuts held requests into sum-of-squares tables: calls launch(tab) for each full table and
   the last one, nonfinite(req) for a request without a sum. At most max_pieces pieces and
   parts blocks per table; a buffer with more blocks than fit is cut into pieces flagged
   FIRST / LAST, carrying the running total between launches. tab holds acc, flag and
   partials on entry. Shared with tests/cuda/test_cuda_host.cu (small budgets, on the CPU). */
template <class Launch, class Nonfinite>
static zero_result zero_cuda__sq_build(const zero_cuda__sq_req *req, int n, size_t parts, int max_pieces,
                                       zero_cuda__sq_table *tab, Launch launch, Nonfinite nonfinite)
{
    zero_result r = ZERO_OK;
    int i;
    tab->n = 0;
    tab->start[0] = 0;
    for (i = 0; i < n && r == ZERO_OK; i++) {
        const zero_cuda__sq_req *rq = &req[i];
        size_t nb = rq->numel / ZERO_CUDA__SUMSQ_BLOCK + (rq->numel % ZERO_CUDA__SUMSQ_BLOCK != 0), done = 0, take;
        if (!(rq->flags & ZERO_CUDA__SQ_SUM)) {
            if (rq->numel > 0) r = nonfinite(rq);
            continue;
        }
        do { /* pieces of this buffer, launching whenever the table is full */
            size_t room = parts - tab->start[tab->n];
            if (tab->n == max_pieces || (room == 0 && nb - done > 0)) {
                r = launch(tab);
                if (r != ZERO_OK) break;
                tab->n = 0;
                tab->start[0] = 0;
                room = parts;
            }
            take = nb - done < room ? nb - done : room;
            tab->x[tab->n] = rq->x;
            tab->numel[tab->n] = rq->numel;
            tab->first_block[tab->n] = done;
            tab->flags[tab->n] = (unsigned char)(rq->flags | (done == 0 ? ZERO_CUDA__SQ_FIRST : 0) |
                                                 (done + take == nb ? ZERO_CUDA__SQ_LAST : 0));
            tab->start[tab->n + 1] = tab->start[tab->n] + take;
            tab->n++;
            done += take;
        } while (done < nb);
    }
    if (r == ZERO_OK && tab->n > 0) r = launch(tab);
    return r;
}

/* Lock held. Launches queue q's held nonfinite/sumsq calls: the calls with a sum go into
   sum-of-squares tables (ZERO_CUDA__SQ_MAX pieces and ZERO_CUDA__SQ_PARTS blocks per
   launch), the non-finite check riding along where the same buffer asked for both; a
   nonfinite call alone runs the plain non-finite kernel. */
static zero_result zero_cuda__flush_stats(zero_cuda__device *d, int q)
{
    zero_cuda__pending *pd = &d->pend[q];
    cudaStream_t stream = d->streams[q];
    zero_dtype dt = pd->dtype;
    float *flag = pd->flag;
    zero_cuda__sq_table tab;
    memset(&tab, 0, sizeof tab);
    tab.acc = pd->acc;
    tab.flag = pd->flag;
    tab.partials = d->scratch + (size_t)q * ZERO_CUDA__SCRATCH_Q;
    return zero_cuda__sq_build(
        pd->req, pd->n, ZERO_CUDA__SQ_PARTS, ZERO_CUDA__SQ_MAX, &tab,
        [d, stream, dt](const zero_cuda__sq_table *t) { return zero_cuda__sq_launch_dt(d, stream, dt, t); },
        [d, stream, dt, flag](const zero_cuda__sq_req *rq) {
            switch (dt) {
            case ZERO_F32: return zero_cuda__nonfinite_run<ZERO_F32>(d, stream, rq->x, rq->numel, flag);
            case ZERO_F16: return zero_cuda__nonfinite_run<ZERO_F16>(d, stream, rq->x, rq->numel, flag);
            case ZERO_BF16: return zero_cuda__nonfinite_run<ZERO_BF16>(d, stream, rq->x, rq->numel, flag);
            default: return zero_cuda__nonfinite_run<ZERO_F64>(d, stream, rq->x, rq->numel, flag);
            }
        });
}

template <int G, int P>
static zero_result zero_cuda__adam_launch(const zero_cuda__device *d, cudaStream_t stream,
                                          const zero_cuda__adam_table *tab)
{
    size_t nchunks = tab->start[tab->n];
    unsigned grid = zero_cuda__grid(nchunks * ZERO_CUDA__THREADS, d->sm_count, 8);
    if (nchunks == 0) return ZERO_OK;
    ZERO_CUDA_LAUNCH((zero_cuda__adam_kernel<G, P>), grid, ZERO_CUDA__THREADS, 0, stream, *tab);
    return zero_cuda__launched("cuda adam (batched): kernel launch");
}

template <int G>
static zero_result zero_cuda__adam_launch_p(const zero_cuda__device *d, cudaStream_t stream, int p,
                                            const zero_cuda__adam_table *tab)
{
    switch (p) {
    case 0: return zero_cuda__adam_launch<G, 0>(d, stream, tab);
    case ZERO_F32: return zero_cuda__adam_launch<G, ZERO_F32>(d, stream, tab);
    case ZERO_F16: return zero_cuda__adam_launch<G, ZERO_F16>(d, stream, tab);
    default: return zero_cuda__adam_launch<G, ZERO_BF16>(d, stream, tab);
    }
}

/* Lock held. Launches queue q's held calls (if any) and empties the batch. */
static zero_result zero_cuda__flush_q(zero_cuda__device *d, int q)
{
    zero_cuda__pending *pd = &d->pend[q];
    zero_result r = ZERO_OK;
    if (pd->kind == ZERO_CUDA__PEND_STATS) {
        r = zero_cuda__flush_stats(d, q);
    } else if (pd->kind == ZERO_CUDA__PEND_ADAM) {
        int p = (int)pd->pdtype;
        switch (pd->dtype) {
        case ZERO_F32: r = zero_cuda__adam_launch_p<ZERO_F32>(d, d->streams[q], p, &pd->adam); break;
        case ZERO_F16: r = zero_cuda__adam_launch_p<ZERO_F16>(d, d->streams[q], p, &pd->adam); break;
        default: r = zero_cuda__adam_launch_p<ZERO_BF16>(d, d->streams[q], p, &pd->adam); break;
        }
    }
    pd->kind = ZERO_CUDA__PEND_NONE;
    pd->n = 0;
    return r;
}

/* Lock held. Every queue's batch, in queue order; the first error is returned (every batch
   is emptied either way). */
static zero_result zero_cuda__flush_locked(zero_cuda__device *d, int except)
{
    zero_result r = ZERO_OK, e;
    int q;
    for (q = 0; q < ZERO_QUEUE_COUNT; q++) {
        if (q == except || d->pend[q].kind == ZERO_CUDA__PEND_NONE) continue;
        e = zero_cuda__flush_q(d, q);
        if (r == ZERO_OK) r = e;
    }
    return r;
}

/* Every op that is not a batched call starts here (the caller's device already current). */
static zero_result zero_cuda__flush(zero_cuda__device *d)
{
    zero_result r;
    int q, any = 0;
    pthread_mutex_lock(&d->mu);
    for (q = 0; q < ZERO_QUEUE_COUNT; q++) any |= d->pend[q].kind != ZERO_CUDA__PEND_NONE;
    r = any ? zero_cuda__flush_locked(d, -1) : ZERO_OK;
    if (r == ZERO_OK && d->flush_err != ZERO_OK) {
        r = zero__fail(d->flush_err, "%s", d->flush_msg);
        d->flush_err = ZERO_OK;
    }
    pthread_mutex_unlock(&d->mu);
    return r;
}

#define ZERO_CUDA__FLUSH()                                                                   \
    do {                                                                                     \
        zero_result flush_res = zero_cuda__flush(d);                                         \
        if (flush_res != ZERO_OK) return flush_res;                                          \
    } while (0)

/* ---- queues and events: a zero_event is a cudaEvent_t ---- */

static zero_result zero_cuda__event_create(zero_device *dev, zero_event **out)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    cudaEvent_t ev;
    zero_result res;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda event_create: dev is not a CUDA device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda event_create: out is NULL");
    if ((res = guard.enter(d->ordinal, "cuda event_create")) != ZERO_OK) return res;
    ZERO_CUDA__TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cuda event_create: cudaEventCreateWithFlags");
    *out = (zero_event *)ev;
    return ZERO_OK;
}

static void zero_cuda__event_destroy(zero_device *dev, zero_event *ev)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    if (!d || !ev) return;
    if (guard.enter(d->ordinal, "cuda event_destroy") != ZERO_OK) return;
    (void)cudaEventDestroy((cudaEvent_t)ev);
}

static zero_result zero_cuda__record(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO_CUDA__ENTER("cuda record");
    ZERO_CUDA__FLUSH();
    if (!ev) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda record: event is NULL");
    ZERO_CUDA__TRY(cudaEventRecord((cudaEvent_t)ev, stream), "cuda record: cudaEventRecord");
    return ZERO_OK;
}

static zero_result zero_cuda__wait(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO_CUDA__ENTER("cuda wait");
    ZERO_CUDA__FLUSH();
    if (!ev) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda wait: event is NULL");
    ZERO_CUDA__TRY(cudaStreamWaitEvent(stream, (cudaEvent_t)ev, 0), "cuda wait: cudaStreamWaitEvent");
    return ZERO_OK;
}

static zero_result zero_cuda__sync(zero_device *dev, zero_queue q)
{
    ZERO_CUDA__ENTER("cuda sync");
    ZERO_CUDA__FLUSH();
    ZERO_CUDA__TRY(cudaStreamSynchronize(stream), "cuda sync: cudaStreamSynchronize");
    return ZERO_OK;
}

static void *zero_cuda__native_queue(zero_device *dev, zero_queue q)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    if (!d || (int)q < 0 || (int)q >= ZERO_QUEUE_COUNT) return NULL;
    /* whoever takes the stream (a comm, the user) enqueues after the held calls; a launch
       error here shows at the stream's next sync (a kernel that never ran leaves its
       outputs as they were), and in zero_last_error() */
    if (guard.enter(d->ordinal, "cuda native_queue") == ZERO_OK) {
        zero_result r = zero_cuda__flush(d);
        if (r != ZERO_OK) { /* kept for the next op: native_queue has no error channel */
            pthread_mutex_lock(&d->mu);
            d->flush_err = r;
            snprintf(d->flush_msg, sizeof d->flush_msg, "%s", zero_last_error());
            pthread_mutex_unlock(&d->mu);
        }
    }
    return (void *)d->streams[q];
}

/* ---- transfers ---- */

static zero_result zero_cuda__move(zero_device *dev, zero_queue q, void *dst, const void *src, size_t bytes,
                                   const char *what)
{
    ZERO_CUDA__ENTER(what);
    ZERO_CUDA__FLUSH();
    if (bytes > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: %s is NULL with bytes = %zu", what,
                          dst ? "src" : "dst", bytes);
    if (bytes == 0 || dst == src) return ZERO_OK;
    if (zero_cuda__overlap(dst, bytes, src, bytes))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: dst %p and src %p overlap (%zu bytes)", what,
                          dst, src, bytes);
    {
        cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
        if (e != cudaSuccess) return zero__fail(ZERO_ERROR_DEVICE, "%s: cudaMemcpyAsync(%zu bytes): %s", what,
                                                bytes, cudaGetErrorString(e));
    }
    return ZERO_OK;
}

static zero_result zero_cuda__copy(zero_device *dev, zero_queue q, void *dst, const void *src, size_t bytes)
{
    return zero_cuda__move(dev, q, dst, src, bytes, "cuda copy");
}

static zero_result zero_cuda__upload(zero_device *dev, zero_queue q, void *dst, const void *host_src, size_t bytes)
{
    return zero_cuda__move(dev, q, dst, host_src, bytes, "cuda upload");
}

static zero_result zero_cuda__download(zero_device *dev, zero_queue q, void *host_dst, const void *src,
                                       size_t bytes)
{
    return zero_cuda__move(dev, q, host_dst, src, bytes, "cuda download");
}

static zero_result zero_cuda__fill_zero(zero_device *dev, zero_queue q, void *dst, size_t bytes)
{
    ZERO_CUDA__ENTER("cuda fill_zero");
    ZERO_CUDA__FLUSH();
    if (bytes > 0 && !dst)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda fill_zero: dst is NULL with bytes = %zu", bytes);
    if (bytes == 0) return ZERO_OK;
    ZERO_CUDA__TRY(cudaMemsetAsync(dst, 0, bytes, stream), "cuda fill_zero: cudaMemsetAsync");
    return ZERO_OK;
}

/* ---- element kernels ---- */

/* Launches the element-wise driver for op over numel elements; ptrs/es: the op's arrays
   and element sizes, for the vector alignment; vec = 0 forces the scalar path. */
template <class Op>
static zero_result zero_cuda__run_ew(const zero_cuda__device *d, cudaStream_t stream, const Op &op, size_t numel,
                                     const void *const *ptrs, const size_t *es, int nptr, int vec, const char *what)
{
    size_t head = 0, nvec = 0;
    int h = vec ? zero_cuda__head(ptrs, es, nptr) : -1;
    if (numel == 0) return ZERO_OK;
    if (h >= 0 && (size_t)h < numel && numel - (size_t)h >= 8) {
        head = (size_t)h;
        nvec = (numel - head) / 8;
    }
    ZERO_CUDA_LAUNCH(zero_cuda__ew_kernel<Op>, zero_cuda__grid(nvec + (numel - 8 * nvec), d->sm_count, 8),
                     ZERO_CUDA__THREADS, 0, stream, op, numel, head, nvec);
    return zero_cuda__launched(what);
}

template <int D, int S>
static zero_result zero_cuda__cast_run(const zero_cuda__device *d, cudaStream_t stream, void *dst,
                                       const void *src, size_t numel)
{
    const void *ptrs[2] = {dst, src};
    size_t es[2] = {zero_dtype_size((zero_dtype)D), zero_dtype_size((zero_dtype)S)};
    if constexpr (D == ZERO_F64 || S == ZERO_F64) {
        zero_cuda__cast64_op<D, S> op = {dst, src};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 2, 0, "cuda cast: kernel launch");
    } else {
        zero_cuda__cast_op<D, S> op = {dst, src};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 2, 1, "cuda cast: kernel launch");
    }
}

template <int D>
static zero_result zero_cuda__cast_from(const zero_cuda__device *d, cudaStream_t stream, void *dst,
                                        const void *src, zero_dtype src_dtype, size_t numel)
{
    switch (src_dtype) {
    case ZERO_F32: return zero_cuda__cast_run<D, ZERO_F32>(d, stream, dst, src, numel);
    case ZERO_F16: return zero_cuda__cast_run<D, ZERO_F16>(d, stream, dst, src, numel);
    case ZERO_BF16: return zero_cuda__cast_run<D, ZERO_BF16>(d, stream, dst, src, numel);
    default: return zero_cuda__cast_run<D, ZERO_F64>(d, stream, dst, src, numel);
    }
}

static zero_result zero_cuda__cast(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                                   const void *src, zero_dtype src_dtype, size_t numel)
{
    zero_result r;
    ZERO_CUDA__ENTER("cuda cast");
    ZERO_CUDA__FLUSH();
    if ((r = zero_cuda__check_buf("cast", "dst", dst, dst_dtype, numel)) != ZERO_OK) return r;
    if ((r = zero_cuda__check_buf("cast", "src", src, src_dtype, numel)) != ZERO_OK) return r;
    if (numel == 0 || (dst == src && dst_dtype == src_dtype)) return ZERO_OK;
    if (zero_cuda__overlap(dst, numel * zero_dtype_size(dst_dtype), src, numel * zero_dtype_size(src_dtype)))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda cast: dst %p and src %p overlap", dst, src);
    if (dst_dtype == src_dtype) {
        cudaError_t e = cudaMemcpyAsync(dst, src, numel * zero_dtype_size(dst_dtype), cudaMemcpyDefault, stream);
        if (e != cudaSuccess) return zero_cuda__err(e, "cuda cast: cudaMemcpyAsync");
        return ZERO_OK;
    }
    switch (dst_dtype) {
    case ZERO_F32: return zero_cuda__cast_from<ZERO_F32>(d, stream, dst, src, src_dtype, numel);
    case ZERO_F16: return zero_cuda__cast_from<ZERO_F16>(d, stream, dst, src, src_dtype, numel);
    case ZERO_BF16: return zero_cuda__cast_from<ZERO_BF16>(d, stream, dst, src, src_dtype, numel);
    default: return zero_cuda__cast_from<ZERO_F64>(d, stream, dst, src, src_dtype, numel);
    }
}

static zero_result zero_cuda__add(zero_device *dev, zero_queue q, void *dst, const void *src, zero_dtype dtype,
                                  size_t numel)
{
    const void *ptrs[2] = {dst, src};
    size_t es[2];
    zero_result r;
    ZERO_CUDA__ENTER("cuda add");
    ZERO_CUDA__FLUSH();
    if ((r = zero_cuda__check_buf("add", "dst", dst, dtype, numel)) != ZERO_OK) return r;
    if ((r = zero_cuda__check_buf("add", "src", src, dtype, numel)) != ZERO_OK) return r;
    es[0] = es[1] = zero_dtype_size(dtype);
    switch (dtype) {
    case ZERO_F32: {
        zero_cuda__add_op<ZERO_F32> op = {dst, src};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 2, 1, "cuda add: kernel launch");
    }
    case ZERO_F16: {
        zero_cuda__add_op<ZERO_F16> op = {dst, src};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 2, 1, "cuda add: kernel launch");
    }
    case ZERO_BF16: {
        zero_cuda__add_op<ZERO_BF16> op = {dst, src};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 2, 1, "cuda add: kernel launch");
    }
    default: {
        zero_cuda__add64_op op = {(double *)dst, (const double *)src};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 2, 0, "cuda add: kernel launch");
    }
    }
}

static zero_result zero_cuda__scale(zero_device *dev, zero_queue q, void *x, zero_dtype dtype, size_t numel,
                                    float s)
{
    const void *ptrs[1] = {x};
    size_t es[1];
    zero_result r;
    ZERO_CUDA__ENTER("cuda scale");
    ZERO_CUDA__FLUSH();
    if ((r = zero_cuda__check_buf("scale", "x", x, dtype, numel)) != ZERO_OK) return r;
    es[0] = zero_dtype_size(dtype);
    switch (dtype) {
    case ZERO_F32: {
        zero_cuda__scale_op<ZERO_F32> op = {x, s};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 1, 1, "cuda scale: kernel launch");
    }
    case ZERO_F16: {
        zero_cuda__scale_op<ZERO_F16> op = {x, s};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 1, 1, "cuda scale: kernel launch");
    }
    case ZERO_BF16: {
        zero_cuda__scale_op<ZERO_BF16> op = {x, s};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 1, 1, "cuda scale: kernel launch");
    }
    default: {
        zero_cuda__scale64_op op = {(double *)x, (double)s};
        return zero_cuda__run_ew(d, stream, op, numel, ptrs, es, 1, 0, "cuda scale: kernel launch");
    }
    }
}

/* Lock held: queue q's batch takes a call of 'kind' (the caller has checked it fits, or
   the batch was launched). */
static void zero_cuda__batch_open(zero_cuda__pending *pd, int kind, zero_dtype dtype, int pdtype)
{
    if (pd->kind != ZERO_CUDA__PEND_NONE) return;
    pd->kind = kind;
    pd->dtype = dtype;
    pd->pdtype = (zero_dtype)pdtype;
    pd->acc = NULL;
    pd->flag = NULL;
    pd->n = 0;
    pd->adam.n = 0;
    pd->adam.ncoefs = 0;
    pd->adam.start[0] = 0;
}

/* A nonfinite (flag) or sumsq (acc) call joins queue q's batch. The same buffer asking for
   both in a row becomes one request (read once). A call whose output overlaps its input
   is launched alone, in order. */
static zero_result zero_cuda__stats_add(zero_cuda__device *d, int q, const void *x, zero_dtype dtype, size_t numel,
                                        double *acc, float *flag)
{
    zero_cuda__pending *pd = &d->pend[q];
    unsigned char bit = acc ? ZERO_CUDA__SQ_SUM : ZERO_CUDA__SQ_NONFINITE;
    size_t bytes = numel * zero_dtype_size(dtype);
    int alone = acc ? zero_cuda__overlap(x, bytes, acc, sizeof *acc) : zero_cuda__overlap(x, bytes, flag, sizeof *flag);
    zero_result r;
    pthread_mutex_lock(&d->mu);
    r = zero_cuda__flush_locked(d, q); /* launches keep the order of the calls */
    if (r == ZERO_OK && pd->kind != ZERO_CUDA__PEND_NONE) {
        int fits = pd->kind == ZERO_CUDA__PEND_STATS && pd->dtype == dtype && pd->n < ZERO_CUDA__SQ_REQS && !alone &&
                   !(acc && pd->acc && pd->acc != acc) && !(flag && pd->flag && pd->flag != flag);
        if (!fits) r = zero_cuda__flush_q(d, q);
    }
    if (r == ZERO_OK) {
        zero_cuda__sq_req *last = pd->n > 0 ? &pd->req[pd->n - 1] : NULL;
        zero_cuda__batch_open(pd, ZERO_CUDA__PEND_STATS, dtype, 0);
        if (acc) pd->acc = acc;
        if (flag) pd->flag = flag;
        if (last && last->x == x && last->numel == numel && !(last->flags & bit)) {
            last->flags |= bit;
        } else {
            pd->req[pd->n].x = x;
            pd->req[pd->n].numel = numel;
            pd->req[pd->n].flags = bit;
            pd->n++;
        }
        if (alone) r = zero_cuda__flush_q(d, q);
    }
    pthread_mutex_unlock(&d->mu);
    return r;
}

static zero_result zero_cuda__nonfinite(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                                        size_t numel, float *flag)
{
    zero_result r;
    ZERO_CUDA__ENTER_D("cuda nonfinite");
    if ((r = zero_cuda__check_buf("nonfinite", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!flag) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda nonfinite: flag is NULL");
    if ((r = zero_cuda__check_align("nonfinite", "flag", flag, sizeof *flag)) != ZERO_OK) return r;
    return zero_cuda__stats_add(d, (int)q, x, dtype, numel, NULL, flag);
}

static zero_result zero_cuda__sumsq(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype, size_t numel,
                                    double *acc)
{
    zero_result r;
    ZERO_CUDA__ENTER_D("cuda sumsq");
    if ((r = zero_cuda__check_buf("sumsq", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!acc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda sumsq: acc is NULL");
    if ((r = zero_cuda__check_align("sumsq", "acc", acc, sizeof *acc)) != ZERO_OK) return r;
    /* each queue has its own partials: sums on different queues may run at once; a sum's
       pieces are launched under the device's lock, in order, on its queue */
    return zero_cuda__stats_add(d, (int)q, x, dtype, numel, acc, NULL);
}

static zero_result zero_cuda__grad_mul(zero_device *dev, zero_queue q, const double *sumsq, const float *nonfinite,
                                       float unscale, float clip_norm, float *out)
{
    ZERO_CUDA__ENTER("cuda grad_mul");
    if (!sumsq || !nonfinite || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda grad_mul: %s is NULL",
                          !sumsq ? "sumsq" : !nonfinite ? "nonfinite" : "out");
    ZERO_CUDA__FLUSH();
    ZERO_CUDA_LAUNCH(zero_cuda__grad_mul_kernel, 1, 1, 0, stream, sumsq, nonfinite, unscale, clip_norm, out);
    return zero_cuda__launched("cuda grad_mul: kernel launch");
}

static zero_result zero_cuda__adam(zero_device *dev, zero_queue q, const zero_adam_range *range,
                                   const zero_adam_coefs *coefs, const float *grad_mul, const float *skip)
{
    zero_cuda__pending *pd;
    zero_result r;
    int pdt, k, ci = -1;
    size_t ssz;
    ZERO_CUDA__ENTER_D("cuda adam");
    if (!range || !coefs || !grad_mul)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda adam: %s is NULL",
                          !range ? "range" : !coefs ? "coefs" : "grad_mul");
    if (range->grad_dtype != ZERO_F32 && range->grad_dtype != ZERO_F16 && range->grad_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda adam: grad_dtype = %d (%s): f32, f16 or bf16 only",
                          (int)range->grad_dtype, zero_dtype_name(range->grad_dtype));
    if (range->param && range->param_dtype != ZERO_F32 && range->param_dtype != ZERO_F16 &&
        range->param_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda adam: param_dtype = %d (%s): f32, f16 or bf16 only",
                          (int)range->param_dtype, zero_dtype_name(range->param_dtype));
    if (range->state_dtype != ZERO_DTYPE_DEFAULT && range->state_dtype != ZERO_F32 &&
        range->state_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda adam: state_dtype = %d (%s): f32 or bf16 only",
                          (int)range->state_dtype, zero_dtype_name(range->state_dtype));
    ssz = range->state_dtype == ZERO_BF16 ? 2u : 4u;
    if (range->numel > 0 && (!range->master || !range->m || !range->v || !range->grad))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda adam: %s is NULL with numel = %zu",
                          !range->master ? "master" : !range->m ? "m" : !range->v ? "v" : "grad", range->numel);
    if (range->numel > (size_t)-1 / 4)
        return zero__fail(ZERO_ERROR_OVERFLOW, "cuda adam: numel %zu overflows", range->numel);
    if ((r = zero_cuda__check_align("adam", "master", range->master, ssz)) != ZERO_OK ||
        (r = zero_cuda__check_align("adam", "m", range->m, ssz)) != ZERO_OK ||
        (r = zero_cuda__check_align("adam", "v", range->v, ssz)) != ZERO_OK ||
        (r = zero_cuda__check_align("adam", "grad", range->grad, zero_dtype_size(range->grad_dtype))) != ZERO_OK ||
        (r = zero_cuda__check_align("adam", "param", range->param, zero_dtype_size(range->param_dtype))) != ZERO_OK ||
        (r = zero_cuda__check_align("adam", "grad_mul", grad_mul, 4)) != ZERO_OK ||
        (r = zero_cuda__check_align("adam", "skip", skip, 4)) != ZERO_OK)
        return r;
    if (range->numel == 0) return ZERO_OK;
    pdt = range->param ? (int)range->param_dtype : 0;
    pd = &d->pend[q];
    pthread_mutex_lock(&d->mu);
    r = zero_cuda__flush_locked(d, (int)q);
    if (r == ZERO_OK && pd->kind != ZERO_CUDA__PEND_NONE) {
        int fits = pd->kind == ZERO_CUDA__PEND_ADAM && pd->dtype == range->grad_dtype && (int)pd->pdtype == pdt &&
                   pd->adam.mul == grad_mul && pd->adam.skip == skip && pd->adam.n < ZERO_CUDA__ADAM_MAX;
        for (k = 0; fits && k < pd->adam.ncoefs; k++)
            if (!memcmp(&pd->adam.coefs[k], coefs, sizeof *coefs)) ci = k;
        if (fits && ci < 0 && pd->adam.ncoefs == ZERO_CUDA__ADAM_COEFS) fits = 0;
        /* ranges of one launch run concurrently: one that overlaps a held one waits */
        for (k = 0; fits && k < pd->adam.n; k++)
            if (zero_cuda__overlap(pd->adam.seg[k].master, pd->adam.seg[k].numel * (pd->adam.seg[k].bf16 ? 2u : 4u),
                                   range->master, range->numel * ssz))
                fits = 0;
        if (!fits) {
            r = zero_cuda__flush_q(d, (int)q);
            ci = -1;
        }
    }
    if (r == ZERO_OK) {
        zero_cuda__adam_table *t = &pd->adam;
        zero_cuda__batch_open(pd, ZERO_CUDA__PEND_ADAM, range->grad_dtype, pdt);
        t->mul = grad_mul;
        t->skip = skip;
        if (ci < 0) {
            ci = t->ncoefs++;
            t->coefs[ci] = *coefs;
        }
        zero_cuda__adam_push(t, range, (unsigned)ci);
    }
    pthread_mutex_unlock(&d->mu);
    return r;
}

/* ---- lifetime ---- */

static void zero_cuda__destroy(zero_device *dev)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    zero_cuda__arena *a, *an;
    zero_cuda__mem *f, *fn;
    int q;
    if (!d) return;
    (void)guard.enter(d->ordinal, "cuda destroy");
    (void)zero_cuda__flush(d);
    for (q = 0; q < ZERO_QUEUE_COUNT; q++)
        if (d->has_stream[q]) (void)cudaStreamSynchronize(d->streams[q]);
    for (a = d->arenas; a; a = an) {
        an = a->next;
        zero_cuda__arena_release(d, a);
    }
    for (f = d->fallbacks; f; f = fn) {
        fn = f->next;
        (void)cudaFree(f->ptr);
        zero__free(NULL, f);
    }
    for (f = d->pinned; f; f = fn) {
        fn = f->next;
        (void)cudaFreeHost(f->ptr);
        zero__free(NULL, f);
    }
    (void)cudaFree(d->scratch);
    for (q = 0; q < ZERO_QUEUE_COUNT; q++)
        if (d->own_stream[q]) (void)cudaStreamDestroy(d->streams[q]);
    pthread_mutex_destroy(&d->mu);
    d->base.impl = NULL;
    zero__free(NULL, d);
}

/* The device's capacity (total memory) and the bytes in use on it (by every process), from
   cudaMemGetInfo: the budget the engine names when an allocation does not fit. */
static zero_result zero_cuda__memory_info(zero_device *dev, size_t *capacity, size_t *used)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    zero_result res;
    size_t free_b = 0, total_b = 0;
    cudaError_t e;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda memory_info: dev is not a CUDA device");
    if ((res = guard.enter(d->ordinal, "cuda memory_info")) != ZERO_OK) return res;
    e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) return zero_cuda__err(e, "cuda memory_info: cudaMemGetInfo");
    if (capacity) *capacity = total_b;
    if (used) *used = total_b - free_b;
    return ZERO_OK;
}

/* ---- block quantization (ZeRO++'s qwZ / qgZ; zero.h's Quantization section) ----
   One thread per quantization block for quantize (its two passes over the block: the
   absmax, then the codes; blocks are small, 256 by default), one thread per element for the
   dequantized sum. The arithmetic is zero.h's (zero__quant_scale, zero__quant_code,
   zero__quant_get and the same fmaf sum), so the bytes and values equal the host's. */

template <int DT>
static __global__ void __launch_bounds__(ZERO_CUDA__THREADS)
zero_cuda__quantize_kernel(unsigned char *dst, const void *src, size_t numel, size_t block,
                           size_t nb, int bits, size_t codes_end, size_t bytes)
{
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    int qmax = bits == 8 ? 127 : 7;
    unsigned char *codes = dst + 4 * nb;
    for (; k < nb; k += step) {
        size_t i0 = k * block, len = numel - i0 < block ? numel - i0 : block, i;
        uint32_t amax = 0;
        int bad = 0;
        float sc;
        for (i = 0; i < len; i++) {
            uint32_t a = zero_cuda__f32_bits(zero_cuda__io<DT>::ld(src, i0 + i)) & 0x7fffffffu;
            if (a >= 0x7f800000u) bad = 1;
            else if (a > amax) amax = a;
        }
        sc = zero__quant_scale(zero_cuda__f32_from(amax), bad, qmax);
        ((float *)dst)[k] = sc;
        if (bits == 8) {
            for (i = 0; i < len; i++)
                codes[i0 + i] =
                    (unsigned char)(zero__quant_code(zero_cuda__io<DT>::ld(src, i0 + i), sc, qmax) & 0xff);
        } else {
            for (i = 0; i < len; i += 2) { /* block is even: pairs never straddle blocks */
                int lo = zero__quant_code(zero_cuda__io<DT>::ld(src, i0 + i), sc, qmax);
                int hi = i + 1 < len ? zero__quant_code(zero_cuda__io<DT>::ld(src, i0 + i + 1), sc, qmax) : 0;
                codes[(i0 + i) >> 1] = (unsigned char)((unsigned)(lo & 0xf) | ((unsigned)(hi & 0xf) << 4));
            }
        }
        if (k == nb - 1)
            for (i = codes_end; i < bytes; i++) dst[i] = 0; /* the padding */
    }
}

template <int DT>
static __global__ void __launch_bounds__(ZERO_CUDA__THREADS)
zero_cuda__dequantize_kernel(void *dst, const unsigned char *src, size_t src_stride, int count,
                             size_t numel, size_t block, size_t nb, int bits)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    for (; i < numel; i += step) {
        size_t k = i / block;
        float acc = 0.0f;
        int j;
        for (j = 0; j < count; j++) {
            const unsigned char *b = src + (size_t)j * src_stride;
            float sc = ((const float *)b)[k];
            if (j == 0) acc = (float)zero__quant_get(b + 4 * nb, bits, i) * sc;
            else acc = fmaf((float)zero__quant_get(b + 4 * nb, bits, i), sc, acc);
        }
        zero_cuda__io<DT>::st(dst, i, acc);
    }
}

static zero_result zero_cuda__quantize(zero_device *dev, zero_queue q, void *dst, const void *src,
                                       zero_dtype src_dtype, size_t numel, int bits, size_t block)
{
    size_t bytes = 0, nb, codes_end;
    unsigned grid;
    zero_result r = zero__quant_check("cuda quantize", src_dtype, bits, &block);
    if (r == ZERO_OK) r = zero__quant_size("cuda quantize", numel, bits, block, &bytes);
    if (r != ZERO_OK) return r;
    {
        ZERO_CUDA__ENTER("cuda quantize");
        if (numel == 0) return ZERO_OK;
        if ((r = zero_cuda__check_buf("quantize", "src", src, src_dtype, numel)) != ZERO_OK) return r;
        if (!dst) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda quantize: dst is NULL");
        if ((r = zero_cuda__check_align("quantize", "dst", dst, 4)) != ZERO_OK) return r;
        nb = numel / block + (numel % block != 0);
        codes_end = 4 * nb + (bits == 8 ? numel : numel / 2 + (numel & 1u));
        grid = zero_cuda__grid(nb, d->sm_count, 8);
        ZERO_CUDA__FLUSH();
        switch (src_dtype) {
        case ZERO_F32:
            ZERO_CUDA_LAUNCH(zero_cuda__quantize_kernel<ZERO_F32>, grid, ZERO_CUDA__THREADS, 0, stream,
                             (unsigned char *)dst, src, numel, block, nb, bits, codes_end, bytes);
            break;
        case ZERO_F16:
            ZERO_CUDA_LAUNCH(zero_cuda__quantize_kernel<ZERO_F16>, grid, ZERO_CUDA__THREADS, 0, stream,
                             (unsigned char *)dst, src, numel, block, nb, bits, codes_end, bytes);
            break;
        default:
            ZERO_CUDA_LAUNCH(zero_cuda__quantize_kernel<ZERO_BF16>, grid, ZERO_CUDA__THREADS, 0, stream,
                             (unsigned char *)dst, src, numel, block, nb, bits, codes_end, bytes);
            break;
        }
        return zero_cuda__launched("cuda quantize: kernel launch");
    }
}

static zero_result zero_cuda__dequantize(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                                         const void *src, size_t src_stride, int count, size_t numel,
                                         int bits, size_t block)
{
    size_t bytes = 0, nb;
    unsigned grid;
    zero_result r = zero__quant_check("cuda dequantize", dst_dtype, bits, &block);
    if (r == ZERO_OK) r = zero__quant_size("cuda dequantize", numel, bits, block, &bytes);
    if (r != ZERO_OK) return r;
    if (count < 1 || (count > 1 && (src_stride < bytes || src_stride % 4 != 0)))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "cuda dequantize: count = %d, src_stride = %zu (a multiple of 4, at least %zu)",
                          count, src_stride, bytes);
    {
        ZERO_CUDA__ENTER("cuda dequantize");
        if (numel == 0) return ZERO_OK;
        if ((r = zero_cuda__check_buf("dequantize", "dst", dst, dst_dtype, numel)) != ZERO_OK) return r;
        if (!src) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda dequantize: src is NULL");
        if ((r = zero_cuda__check_align("dequantize", "src", src, 4)) != ZERO_OK) return r;
        nb = numel / block + (numel % block != 0);
        grid = zero_cuda__grid(numel, d->sm_count, 8);
        ZERO_CUDA__FLUSH();
        switch (dst_dtype) {
        case ZERO_F32:
            ZERO_CUDA_LAUNCH(zero_cuda__dequantize_kernel<ZERO_F32>, grid, ZERO_CUDA__THREADS, 0, stream, dst,
                             (const unsigned char *)src, src_stride, count, numel, block, nb, bits);
            break;
        case ZERO_F16:
            ZERO_CUDA_LAUNCH(zero_cuda__dequantize_kernel<ZERO_F16>, grid, ZERO_CUDA__THREADS, 0, stream, dst,
                             (const unsigned char *)src, src_stride, count, numel, block, nb, bits);
            break;
        default:
            ZERO_CUDA_LAUNCH(zero_cuda__dequantize_kernel<ZERO_BF16>, grid, ZERO_CUDA__THREADS, 0, stream, dst,
                             (const unsigned char *)src, src_stride, count, numel, block, nb, bits);
            break;
        }
        return zero_cuda__launched("cuda dequantize: kernel launch");
    }
}

static const zero_device_ops zero_cuda__ops = {
    "cuda",
    zero_cuda__destroy,
    zero_cuda__alloc,
    zero_cuda__free,
    zero_cuda__reserve,
    zero_cuda__event_create,
    zero_cuda__event_destroy,
    zero_cuda__record,
    zero_cuda__wait,
    zero_cuda__sync,
    zero_cuda__native_queue,
    zero_cuda__copy,
    zero_cuda__upload,
    zero_cuda__download,
    zero_cuda__fill_zero,
    zero_cuda__cast,
    zero_cuda__add,
    zero_cuda__scale,
    zero_cuda__nonfinite,
    zero_cuda__sumsq,
    zero_cuda__grad_mul,
    zero_cuda__adam,
    zero_cuda_host_alloc, /* pinned host memory for the offload tier */
    zero_cuda_host_free,
    zero_cuda__memory_info,
    zero_cuda__quantize,
    zero_cuda__dequantize,
};

ZERODEF int zero_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

ZERODEF zero_result zero_cuda_device_probe(int *count)
{
    int n = 0;
    cudaError_t e;
    void *lib;
    if (!count) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_device_probe: count is NULL");
    *count = 0;
    e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess) {
        *count = n > 0 ? n : 0;
        return ZERO_OK;
    }
    (void)cudaGetLastError();
    if (e == cudaErrorNoDevice) return ZERO_OK;
    /* The runtime reports a missing driver and an old one alike (cudaErrorInsufficientDriver):
       only the absence of the driver library itself means "no GPU here". */
    if (e == cudaErrorInsufficientDriver) {
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return ZERO_OK;
        dlclose(lib);
    }
    return zero__fail(ZERO_ERROR_DEVICE, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
}

ZERODEF zero_result zero_cuda_device_create(const zero_cuda_desc *desc, zero_device **out)
{
    zero_cuda_desc def;
    zero_cuda__device *d;
    zero_cuda__guard guard;
    zero_result res;
    cudaError_t e;
    int count = 0, q, rc;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_device_create: out is NULL");
    *out = NULL;
    if (!desc) {
        memset(&def, 0, sizeof def);
        desc = &def;
    }
    if (desc->compute_stream == (void *)cudaStreamPerThread)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_cuda_device_create: compute_stream = cudaStreamPerThread names another stream "
                          "on every host thread (NCCL's and the watchdog's threads would not order against your "
                          "work): pass a stream of your own (cudaStreamCreate) or cudaStreamLegacy");
    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_cuda_device_create: no CUDA device (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    }
    if (desc->device < 0 || desc->device >= count)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_device_create: device = %d with %d visible",
                          desc->device, count);
    if ((res = guard.enter(desc->device, "zero_cuda_device_create")) != ZERO_OK) return res;
    d = (zero_cuda__device *)zero__alloc(NULL, sizeof *d);
    if (!d) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_cuda_device_create: out of host memory");
    memset(d, 0, sizeof *d);
    rc = pthread_mutex_init(&d->mu, NULL);
    if (rc != 0) {
        zero__free(NULL, d);
        return zero__fail(ZERO_ERROR_DEVICE, "zero_cuda_device_create: pthread_mutex_init failed: %s", strerror(rc));
    }
    d->ordinal = desc->device;
    d->base.ops = &zero_cuda__ops;
    d->base.impl = d;
    res = ZERO_OK;
    e = cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, d->ordinal);
    if (e != cudaSuccess) res = zero_cuda__err(e, "zero_cuda_device_create: cudaDeviceGetAttribute");
    for (q = 0; q < ZERO_QUEUE_COUNT && res == ZERO_OK; q++) {
        if (q == ZERO_QUEUE_COMPUTE && desc->compute_stream) {
            d->streams[q] = (cudaStream_t)desc->compute_stream;
            d->has_stream[q] = 1;
            continue;
        }
        e = cudaStreamCreateWithFlags(&d->streams[q], cudaStreamNonBlocking);
        if (e != cudaSuccess) res = zero_cuda__err(e, "zero_cuda_device_create: cudaStreamCreateWithFlags");
        else d->own_stream[q] = d->has_stream[q] = 1;
    }
    if (res == ZERO_OK) {
        e = cudaMalloc((void **)&d->scratch, sizeof(double) * ZERO_QUEUE_COUNT * ZERO_CUDA__SCRATCH_Q);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            d->scratch = NULL;
            res = zero_cuda__err(e, "zero_cuda_device_create: cudaMalloc (scratch)");
        } else {
            d->cuda_mallocs++;
            /* each queue's ticket (and running total) starts at 0, ordered on its stream */
            for (q = 0; q < ZERO_QUEUE_COUNT && res == ZERO_OK; q++) {
                e = cudaMemsetAsync(d->scratch + (size_t)q * ZERO_CUDA__SCRATCH_Q, 0,
                                    sizeof(double) * ZERO_CUDA__SCRATCH_Q, d->streams[q]);
                if (e != cudaSuccess) res = zero_cuda__err(e, "zero_cuda_device_create: cudaMemsetAsync (scratch)");
            }
        }
    }
    if (res != ZERO_OK) {
        zero_cuda__destroy(&d->base);
        return res;
    }
    *out = &d->base;
    return ZERO_OK;
}

ZERODEF int zero_cuda_is_device(const zero_device *dev) { return zero_cuda__get(dev) != NULL; }

ZERODEF zero_result zero_cuda_flush(zero_device *dev)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    zero_result res;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_flush: dev is not a CUDA device");
    if ((res = guard.enter(d->ordinal, "zero_cuda_flush")) != ZERO_OK) return res;
    return zero_cuda__flush(d);
}

ZERODEF int zero_cuda_device_ordinal(const zero_device *dev)
{
    const zero_cuda__device *d = zero_cuda__get(dev);
    return d ? d->ordinal : -1;
}

ZERODEF zero_result zero_cuda_host_alloc(zero_device *dev, size_t bytes, void **out)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__guard guard;
    zero_cuda__mem *m;
    zero_result res;
    cudaError_t e;
    void *p = NULL;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_host_alloc: dev is not a CUDA device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_host_alloc: out is NULL");
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_host_alloc: bytes = 0");
    if ((res = guard.enter(d->ordinal, "zero_cuda_host_alloc")) != ZERO_OK) return res;
    m = (zero_cuda__mem *)zero__alloc(NULL, sizeof *m);
    if (!m) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_cuda_host_alloc: out of host memory");
    e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        zero__free(NULL, m);
        (void)cudaGetLastError();
        return zero__fail(e == cudaErrorMemoryAllocation ? ZERO_ERROR_OUT_OF_MEMORY : ZERO_ERROR_DEVICE,
                          "zero_cuda_host_alloc: cudaHostAlloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    m->ptr = p;
    m->bytes = bytes;
    m->category = ZERO_MEM_SCRATCH;
    pthread_mutex_lock(&d->mu);
    m->next = d->pinned;
    d->pinned = m;
    d->pinned_bytes += bytes;
    pthread_mutex_unlock(&d->mu);
    *out = p;
    return ZERO_OK;
}

ZERODEF zero_result zero_cuda_host_free(zero_device *dev, void *ptr)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__mem **pm, *m;
    cudaError_t e;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_host_free: dev is not a CUDA device");
    if (!ptr) return ZERO_OK;
    {
        zero_cuda__guard guard; /* held calls may read the buffer: launch them first */
        zero_result res = guard.enter(d->ordinal, "zero_cuda_host_free");
        if (res == ZERO_OK) res = zero_cuda__flush(d);
        if (res != ZERO_OK) return res;
    }
    pthread_mutex_lock(&d->mu);
    for (pm = &d->pinned; (m = *pm) != NULL; pm = &m->next)
        if (m->ptr == ptr) break;
    if (m) {
        *pm = m->next;
        d->pinned_bytes -= m->bytes;
    }
    pthread_mutex_unlock(&d->mu);
    if (!m)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_host_free: %p was not allocated by this device",
                          ptr);
    e = cudaFreeHost(m->ptr);
    zero__free(NULL, m);
    if (e != cudaSuccess) return zero_cuda__err(e, "zero_cuda_host_free: cudaFreeHost");
    return ZERO_OK;
}

ZERODEF zero_result zero_cuda_device_stats(zero_device *dev, zero_cuda_stats *out)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__arena *a;
    zero_cuda__block *b;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_device_stats: dev is not a CUDA device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_device_stats: out is NULL");
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&d->mu);
    memcpy(out->bytes, d->bytes, sizeof d->bytes);
    out->allocations = d->allocations;
    for (a = d->arenas; a; a = a->next) {
        out->arena_bytes += a->bytes;
        for (b = a->first; b; b = b->next)
            if (!b->used) out->arena_free_bytes += b->size;
    }
    out->fallback_bytes = d->fallback_bytes;
    out->pinned_bytes = d->pinned_bytes;
    out->scratch_bytes = sizeof(double) * ZERO_QUEUE_COUNT * ZERO_CUDA__SCRATCH_Q;
    out->cuda_mallocs = d->cuda_mallocs;
    pthread_mutex_unlock(&d->mu);
    return ZERO_OK;
}

/* ======================================================================================
   The multi-rank comm over device memory (ranks = threads of this process).

   A collective on rank r, queue s:
     1. record ev[POST] on s (everything queued before, the send buffer included, is done
        when it fires), then all-gather every rank's post (kind, sizes, buffers, events)
        over the host local comm: a rendezvous with the local comm's timeout;
     2. check that all posts agree (every rank sees the same posts, so all give the same
        verdict without another round);
     3. make s wait for every peer's ev[POST] (cudaStreamWaitEvent across the streams of
        one process: no host wait), then enqueue the data phase: copies, or a kernel that
        reads every peer's buffer and writes only r's output;
     4. record ev[END], host barrier, make s wait for every peer's ev[END]: later work on s
        (which may overwrite r's buffers) starts only after every peer has read them.
   all_reduce has two data phases (reduce slice r into r's recv; copy the other slices
   from their owners' recv) with ev[MID] and a barrier between, so in-place works. An event
   is recorded again only after a barrier every peer passes after its wait on the previous
   record was enqueued, so no wait ever binds to the wrong record.
   ====================================================================================== */

enum { ZERO_CUDA__AG = 1, ZERO_CUDA__RS, ZERO_CUDA__AR, ZERO_CUDA__BC, ZERO_CUDA__A2A };
enum { ZERO_CUDA__EV_POST = 0, ZERO_CUDA__EV_MID = 1, ZERO_CUDA__EV_END = 2 };

typedef struct zero_cuda__post { /* all 8-byte fields: all-gathered as F64 (a plain copy) */
    uint64_t kind, bad, dtype, op, root, numel;
    uint64_t send, recv;
    uint64_t ev[3];
    uint64_t tag_group, tag_role, tag_seq, tag_count; /* the caller's comm->tag (zero.h); role 0 = untagged */
} zero_cuda__post;

/* " group 0 (gather, seq 12)", " (flag, seq 3)" or "" (untagged), for mismatch messages. */
static void zero_cuda__tag_text(char *buf, size_t size, const zero_cuda__post *p)
{
    int32_t group = (int32_t)(int64_t)p->tag_group, role = (int32_t)p->tag_role;
    char count[40] = "";
    if (p->tag_count) snprintf(count, sizeof count, ", count %llu", (unsigned long long)p->tag_count);
    if (role == ZERO_ROLE_NONE) buf[0] = '\0';
    else if (group >= 0)
        snprintf(buf, size, " group %d (%s, seq %llu%s)", (int)group, zero_comm_role_name(role),
                 (unsigned long long)p->tag_seq, count);
    else
        snprintf(buf, size, " (%s, seq %llu%s)", zero_comm_role_name(role), (unsigned long long)p->tag_seq,
                 count);
}

typedef struct zero_cuda__comm {
    zero_comm base;
    zero_comm *host;
    zero_device *dev;
    int ordinal;
    cudaEvent_t ev[3];
    cudaStream_t last; /* the queue of the last collective, for barrier */
    int has_last;
    int owns_host; /* a comm from split: its host comm (the host comm's split) is its own */
    zero_cuda__post *posts; /* [world] */
} zero_cuda__comm;

static void zero_cuda__comm_destroy(zero_comm *comm);

static zero_cuda__comm *zero_cuda__comm_get(zero_comm *comm)
{
    if (!comm || !comm->ops || comm->ops->destroy != zero_cuda__comm_destroy || !comm->impl) return NULL;
    return (zero_cuda__comm *)comm->impl;
}

static const char *zero_cuda__kind_name(int kind)
{
    switch (kind) {
    case ZERO_CUDA__AG: return "all_gather";
    case ZERO_CUDA__RS: return "reduce_scatter";
    case ZERO_CUDA__AR: return "all_reduce";
    case ZERO_CUDA__BC: return "broadcast";
    case ZERO_CUDA__A2A: return "all_to_all";
    }
    return "?";
}

template <int DT>
static zero_result zero_cuda__reduce_dt(cudaStream_t s, const zero_cuda__srcs *srcs, int n, void *dst, size_t numel,
                                        zero_op op, int sm_count)
{
    unsigned grid = zero_cuda__grid(numel, sm_count, 8);
    if (op == ZERO_OP_SUM) ZERO_CUDA_LAUNCH((zero_cuda__reduce_kernel<DT, ZERO_OP_SUM>), grid, ZERO_CUDA__THREADS, 0, s, *srcs, n, dst, numel);
    else ZERO_CUDA_LAUNCH((zero_cuda__reduce_kernel<DT, ZERO_OP_MAX>), grid, ZERO_CUDA__THREADS, 0, s, *srcs, n, dst, numel);
    return zero_cuda__launched("cuda comm: reduce kernel launch");
}

/* dst = op of the n sources (rank order); one source is a plain copy (no rounding), as the
   local comm does. */
static zero_result zero_cuda__reduce(cudaStream_t s, const zero_cuda__srcs *srcs, int n, void *dst, size_t numel,
                                     zero_dtype dtype, zero_op op, int sm_count)
{
    if (numel == 0) return ZERO_OK;
    if (n == 1) {
        if (dst != srcs->p[0])
            ZERO_CUDA__TRY(cudaMemcpyAsync(dst, srcs->p[0], numel * zero_dtype_size(dtype), cudaMemcpyDeviceToDevice, s),
                           "cuda comm: cudaMemcpyAsync");
        return ZERO_OK;
    }
    switch (dtype) {
    case ZERO_F32: return zero_cuda__reduce_dt<ZERO_F32>(s, srcs, n, dst, numel, op, sm_count);
    case ZERO_F16: return zero_cuda__reduce_dt<ZERO_F16>(s, srcs, n, dst, numel, op, sm_count);
    case ZERO_BF16: return zero_cuda__reduce_dt<ZERO_BF16>(s, srcs, n, dst, numel, op, sm_count);
    default: return zero_cuda__reduce_dt<ZERO_F64>(s, srcs, n, dst, numel, op, sm_count);
    }
}

/* all_reduce's slice of rank r: whole 16-element runs (vector-friendly), the last short. */
static void zero_cuda__slice(size_t numel, int world, int r, size_t *off, size_t *len)
{
    size_t chunk = (numel + (size_t)world - 1) / (size_t)world;
    chunk = (chunk + 15) / 16 * 16;
    *off = chunk * (size_t)r < numel ? chunk * (size_t)r : numel;
    *len = numel - *off < chunk ? numel - *off : chunk;
}

/* A CUDA failure inside a collective, after the rendezvous: wake the peers (they fail with
   COMM at their next rendezvous instead of timing out) and return the error. */
static zero_result zero_cuda__comm_cuda_fail(zero_cuda__comm *c, cudaError_t e, const char *what)
{
    zero_result res = zero_cuda__err(e, what);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", zero_last_error());
    (void)zero_local_abort(c->host);
    return zero__fail(res, "%s", msg);
}

/* Records ev[k] on s, runs a host barrier, makes s wait for every peer's ev[k]. The last
   phase (END) ends with a second barrier: a peer's event handles are used (the waits are
   enqueued) only between the first barrier and the second, so once a rank has returned no
   peer touches its events any more and it may destroy its comm at once (without it, a rank
   leaving first could cudaEventDestroy its END event while a slower peer is still about
   to cudaStreamWaitEvent on it). MID needs no second barrier: END's first one follows. */
static zero_result zero_cuda__phase_end(zero_cuda__comm *c, cudaStream_t s, int k)
{
    zero_result res;
    cudaError_t e;
    int p;
    e = cudaEventRecord(c->ev[k], s);
    if (e != cudaSuccess) return zero_cuda__comm_cuda_fail(c, e, "cuda comm: cudaEventRecord");
    res = c->host->ops->barrier(c->host);
    if (res != ZERO_OK) return res;
    for (p = 0; p < c->base.world; p++)
        if (p != c->base.rank) {
            e = cudaStreamWaitEvent(s, (cudaEvent_t)(uintptr_t)c->posts[p].ev[k], 0);
            if (e != cudaSuccess) return zero_cuda__comm_cuda_fail(c, e, "cuda comm: cudaStreamWaitEvent");
        }
    if (k == ZERO_CUDA__EV_END && c->base.world > 1) return c->host->ops->barrier(c->host);
    return ZERO_OK;
}

/* The data phase(s) of rank r; the posts agree. */
static zero_result zero_cuda__data(zero_cuda__comm *c, cudaStream_t s, const zero_cuda__post *me)
{
    const int world = c->base.world, rank = c->base.rank;
    const zero_dtype dtype = (zero_dtype)me->dtype;
    const zero_op op = (zero_op)me->op;
    const size_t n = (size_t)me->numel, es = zero_dtype_size(dtype);
    const zero_cuda__post *peer = c->posts;
    const zero_cuda__device *d = zero_cuda__get(c->dev);
    zero_cuda__srcs srcs;
    zero_result res;
    size_t off, len;
    int i, from;
    switch ((int)me->kind) {
    case ZERO_CUDA__AG:
        for (i = 0; i < world; i++) {
            from = (rank + i) % world; /* spread the readers over the sources */
            char *dst = (char *)(uintptr_t)me->recv + (size_t)from * n * es;
            const void *src = (const void *)(uintptr_t)peer[from].send;
            if (dst != src)
                ZERO_CUDA__TRY(cudaMemcpyAsync(dst, src, n * es, cudaMemcpyDeviceToDevice, s), "cuda all_gather: cudaMemcpyAsync");
        }
        return ZERO_OK;
    case ZERO_CUDA__RS:
        for (i = 0; i < world; i++) srcs.p[i] = (const char *)(uintptr_t)peer[i].send + (size_t)rank * n * es;
        return zero_cuda__reduce(s, &srcs, world, (void *)(uintptr_t)me->recv, n, dtype, op, d->sm_count);
    case ZERO_CUDA__AR:
        zero_cuda__slice(n, world, rank, &off, &len);
        for (i = 0; i < world; i++) srcs.p[i] = (const char *)(uintptr_t)peer[i].send + off * es;
        res = zero_cuda__reduce(s, &srcs, world, (char *)(uintptr_t)me->recv + off * es, len, dtype, op, d->sm_count);
        if (res != ZERO_OK || world == 1) return res;
        if ((res = zero_cuda__phase_end(c, s, ZERO_CUDA__EV_MID)) != ZERO_OK) return res;
        for (i = 1; i < world; i++) {
            from = (rank + i) % world;
            zero_cuda__slice(n, world, from, &off, &len);
            if (len)
                ZERO_CUDA__TRY(cudaMemcpyAsync((char *)(uintptr_t)me->recv + off * es,
                                               (const char *)(uintptr_t)peer[from].recv + off * es, len * es,
                                               cudaMemcpyDeviceToDevice, s),
                               "cuda all_reduce: cudaMemcpyAsync");
        }
        return ZERO_OK;
    case ZERO_CUDA__A2A: /* block 'rank' of every peer's send into block 'from' of recv */
        for (i = 0; i < world; i++) {
            from = (rank + i) % world;
            if (n)
                ZERO_CUDA__TRY(cudaMemcpyAsync((char *)(uintptr_t)me->recv + (size_t)from * n * es,
                                               (const char *)(uintptr_t)peer[from].send + (size_t)rank * n * es,
                                               n * es, cudaMemcpyDeviceToDevice, s),
                               "cuda all_to_all: cudaMemcpyAsync");
        }
        return ZERO_OK;
    case ZERO_CUDA__BC:
        if (rank != (int)me->root && me->recv != peer[me->root].recv)
            ZERO_CUDA__TRY(cudaMemcpyAsync((void *)(uintptr_t)me->recv, (const void *)(uintptr_t)peer[me->root].recv,
                                           n * es, cudaMemcpyDeviceToDevice, s),
                           "cuda broadcast: cudaMemcpyAsync");
        return ZERO_OK;
    }
    return ZERO_OK;
}

static zero_result zero_cuda__collective(zero_comm *comm, zero_cuda__post *me, void *queue)
{
    zero_cuda__comm *c = zero_cuda__comm_get(comm);
    zero_cuda__guard guard;
    const char *name = zero_cuda__kind_name((int)me->kind);
    char why[160];
    cudaStream_t s;
    zero_result res, my_err = ZERO_ERROR_INVALID_ARGUMENT;
    size_t es, total, bytes;
    int p, world, rank;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda %s: comm is not a CUDA local comm", name);
    world = comm->world;
    rank = comm->rank;
    s = queue ? (cudaStream_t)queue : (cudaStream_t)c->dev->ops->native_queue(c->dev, ZERO_QUEUE_COMM);
    /* this rank's arguments, checked as the local comm checks them */
    es = zero_dtype_size((zero_dtype)me->dtype);
    total = (size_t)me->numel;
    why[0] = '\0';
    me->bad = 1;
    if (es == 0) snprintf(why, sizeof why, "cuda %s: unknown dtype %d", name, (int)me->dtype);
    else if (me->op != ZERO_OP_SUM && me->op != ZERO_OP_MAX) snprintf(why, sizeof why, "cuda %s: unknown op %d", name, (int)me->op);
    else if ((int)me->root < 0 || (int)me->root >= world)
        snprintf(why, sizeof why, "cuda %s: root = %d with world = %d", name, (int)me->root, world);
    else if ((me->kind == ZERO_CUDA__AG || me->kind == ZERO_CUDA__RS || me->kind == ZERO_CUDA__A2A) &&
             zero__mul_size((size_t)me->numel, (size_t)world, &total) != 0)
        snprintf(why, sizeof why, "cuda %s: numel %zu times world %d overflows", name, (size_t)me->numel, world);
    else if (zero__mul_size(total, es, &bytes) != 0)
        snprintf(why, sizeof why, "cuda %s: %zu elements overflow size_t bytes", name, total);
    else if (me->numel > 0 && (!me->send || !me->recv))
        snprintf(why, sizeof why, "cuda %s: %s is NULL with numel = %zu", name, !me->send ? "send" : "recv",
                 (size_t)me->numel);
    else if (me->send % es != 0 || me->recv % es != 0)
        snprintf(why, sizeof why, "cuda %s: %s is not aligned to its element size (%zu)", name,
                 me->send % es ? "send" : "recv", es);
    else if (me->kind == ZERO_CUDA__A2A && bytes > 0 && me->send < me->recv + bytes && me->recv < me->send + bytes)
        snprintf(why, sizeof why, "cuda all_to_all: send and recv overlap (not in place)");
    else me->bad = 0;
    for (p = 0; p < 3; p++) me->ev[p] = (uint64_t)(uintptr_t)c->ev[p];
    me->tag_group = (uint64_t)(int64_t)comm->tag.group;
    me->tag_role = (uint64_t)(int64_t)comm->tag.role;
    me->tag_seq = comm->tag.seq;
    me->tag_count = comm->tag.count;
    if (!me->bad && guard.enter(c->ordinal, "cuda comm") != ZERO_OK) {
        me->bad = 1; /* still take part in the rendezvous: peers must not wait for us */
        my_err = ZERO_ERROR_DEVICE;
        snprintf(why, sizeof why, "%.150s", zero_last_error());
    }
    if (!me->bad) {
        cudaError_t e = cudaEventRecord(c->ev[ZERO_CUDA__EV_POST], s);
        if (e != cudaSuccess) {
            me->bad = 1;
            my_err = ZERO_ERROR_DEVICE;
            snprintf(why, sizeof why, "cuda %s: cudaEventRecord: %s", name, cudaGetErrorString(e));
        }
    }
    res = c->host->ops->all_gather(c->host, me, c->posts, sizeof *me / 8, ZERO_F64, NULL);
    if (res != ZERO_OK) return res;
    for (p = 0; p < world; p++)
        if (c->posts[p].bad) {
            if (me->bad) return zero__fail(my_err, "%s", why);
            return zero__fail(ZERO_ERROR_MISMATCH, "cuda %s (rank %d): rank %d passed invalid arguments", name, rank, p);
        }
    for (p = 0; p < world; p++) {
        const zero_cuda__post *o = &c->posts[p];
        if (o->kind != me->kind || o->numel != me->numel || o->dtype != me->dtype || o->op != me->op ||
            o->root != me->root)
            return zero__fail(ZERO_ERROR_MISMATCH,
                              "cuda %s (rank %d): ranks disagree: rank %d called %s(numel %zu, %s, op %d, root %d)",
                              name, rank, p, zero_cuda__kind_name((int)o->kind), (size_t)o->numel,
                              zero_dtype_name((zero_dtype)o->dtype), (int)o->op, (int)o->root);
    }
    /* Same arguments, different purpose (the engine's tag: group, role, seq, count) where both sides
       are tagged: the ranks' control flow diverged. Every rank names rank 0 and the first
       rank that differs from it, as the local comm does. */
    for (p = 1; p < world; p++) {
        const zero_cuda__post *a = &c->posts[0], *o = &c->posts[p];
        if (a->tag_role != ZERO_ROLE_NONE && o->tag_role != ZERO_ROLE_NONE &&
            (a->tag_group != o->tag_group || a->tag_role != o->tag_role || a->tag_seq != o->tag_seq ||
             a->tag_count != o->tag_count)) {
            char ta[112], tb[112];
            zero_cuda__tag_text(ta, sizeof ta, a);
            zero_cuda__tag_text(tb, sizeof tb, o);
            return zero__fail(ZERO_ERROR_MISMATCH, "cuda %s (rank %d): ranks disagree: rank 0 %s%s vs rank %d %s%s",
                              name, rank, zero_cuda__kind_name((int)a->kind), ta, p,
                              zero_cuda__kind_name((int)o->kind), tb);
        }
    }
    c->last = s;
    c->has_last = 1;
    if (me->numel == 0) return ZERO_OK; /* a checked synchronisation point */
    for (p = 0; p < world; p++)
        if (p != rank) {
            cudaError_t e = cudaStreamWaitEvent(s, (cudaEvent_t)(uintptr_t)c->posts[p].ev[ZERO_CUDA__EV_POST], 0);
            if (e != cudaSuccess) {
                res = zero_cuda__err(e, "cuda comm: cudaStreamWaitEvent");
                break;
            }
        }
    if (res == ZERO_OK) res = zero_cuda__data(c, s, me);
    if (res != ZERO_OK) {
        /* wake the peers (they fail with COMM instead of timing out); ours is the cause.
           Then let what was enqueued (reads of peers' buffers) finish before returning. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zero_last_error());
        (void)zero_local_abort(c->host);
        (void)cudaStreamSynchronize(s);
        return zero__fail(res, "%s", msg);
    }
    res = zero_cuda__phase_end(c, s, ZERO_CUDA__EV_END);
    if (res != ZERO_OK) { /* a broken group: keep our reads of peers' buffers from outliving us */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", zero_last_error());
        (void)cudaStreamSynchronize(s);
        return zero__fail(res, "%s", msg);
    }
    return ZERO_OK;
}

/* Fill a post for one collective and run it: op is 0 for all_gather/broadcast, root is 0 but for broadcast. */
static zero_result zero_cuda__post_run(zero_comm *comm, uint64_t kind, const void *send, void *recv, size_t numel,
                                       zero_dtype dtype, uint64_t op, int root, void *queue)
{
    zero_cuda__post p;
    memset(&p, 0, sizeof p);
    p.kind = kind;
    p.send = (uint64_t)(uintptr_t)send;
    p.recv = (uint64_t)(uintptr_t)recv;
    p.numel = numel;
    p.dtype = (uint64_t)dtype;
    p.op = op;
    p.root = (uint64_t)(int64_t)root;
    return zero_cuda__collective(comm, &p, queue);
}

static zero_result zero_cuda__all_gather(zero_comm *comm, const void *send, void *recv, size_t send_numel,
                                         zero_dtype dtype, void *queue)
{
    return zero_cuda__post_run(comm, ZERO_CUDA__AG, send, recv, send_numel, dtype, 0, 0, queue);
}

static zero_result zero_cuda__reduce_scatter(zero_comm *comm, const void *send, void *recv, size_t recv_numel,
                                             zero_dtype dtype, zero_op op, void *queue)
{
    return zero_cuda__post_run(comm, ZERO_CUDA__RS, send, recv, recv_numel, dtype, (uint64_t)op, 0, queue);
}

static zero_result zero_cuda__all_reduce(zero_comm *comm, const void *send, void *recv, size_t numel,
                                         zero_dtype dtype, zero_op op, void *queue)
{
    return zero_cuda__post_run(comm, ZERO_CUDA__AR, send, recv, numel, dtype, (uint64_t)op, 0, queue);
}

static zero_result zero_cuda__broadcast(zero_comm *comm, void *buf, size_t numel, zero_dtype dtype, int root,
                                        void *queue)
{
    return zero_cuda__post_run(comm, ZERO_CUDA__BC, buf, buf, numel, dtype, 0, root, queue);
}

static zero_result zero_cuda__all_to_all(zero_comm *comm, const void *send, void *recv, size_t numel,
                                         zero_dtype dtype, void *queue)
{
    return zero_cuda__post_run(comm, ZERO_CUDA__A2A, send, recv, numel, dtype, 0, 0, queue);
}

static zero_result zero_cuda__barrier(zero_comm *comm)
{
    zero_cuda__comm *c = zero_cuda__comm_get(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda barrier: comm is not a CUDA local comm");
    if (c->has_last) {
        zero_cuda__guard guard;
        zero_result res = guard.enter(c->ordinal, "cuda barrier");
        if (res != ZERO_OK) return res;
        ZERO_CUDA__TRY(cudaStreamSynchronize(c->last), "cuda barrier: cudaStreamSynchronize");
    }
    return c->host->ops->barrier(c->host);
}

static void zero_cuda__comm_destroy(zero_comm *comm)
{
    zero_cuda__comm *c = zero_cuda__comm_get(comm);
    zero_cuda__guard guard;
    int k;
    if (!c) return;
    (void)guard.enter(c->ordinal, "cuda comm destroy");
    if (c->has_last) (void)cudaStreamSynchronize(c->last);
    for (k = 0; k < 3; k++)
        if (c->ev[k]) (void)cudaEventDestroy(c->ev[k]);
    zero__free(NULL, c->posts);
    if (c->owns_host) zero_comm_destroy(c->host);
    c->base.impl = NULL;
    zero__free(NULL, c);
}

/* split: the host comm's split (the local comm's: the same groups, ranked by key), then a
   device comm over the child on the same device, owning it. Every rank of a new group
   learns over the child host comm whether all of them made theirs, so a rank that cannot
   (out of memory, a failed event) fails its whole group, not just itself. */
static zero_result zero_cuda__split(zero_comm *comm, int color, int key, zero_comm **out)
{
    zero_cuda__comm *c = zero_cuda__comm_get(comm);
    zero_comm *h = NULL, *child = NULL;
    zero_result res;
    double failed[1];
    char msg[512] = "";
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda split: out is NULL");
    *out = NULL;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "cuda split: comm is not a CUDA local comm");
    if ((res = zero_comm_split(c->host, color, key, &h)) != ZERO_OK || !h) return res;
    res = zero_cuda_local_comm_create(h, c->dev, &child);
    if (res == ZERO_OK) zero_cuda__comm_get(child)->owns_host = 1;
    else snprintf(msg, sizeof msg, "%s", zero_last_error());
    failed[0] = res != ZERO_OK;
    if (h->ops->all_reduce(h, failed, failed, 1, ZERO_F64, ZERO_OP_MAX, NULL) != ZERO_OK || failed[0] != 0.0) {
        if (res == ZERO_OK) {
            res = ZERO_ERROR_COMM;
            snprintf(msg, sizeof msg, "cuda split: a rank of the new group (color %d) could not make its comm "
                     "(%.300s)", color, zero_last_error());
        }
        if (child) zero_comm_destroy(child); /* and h, which it owns */
        else zero_comm_destroy(h);
        return zero__fail(res, "%s", msg);
    }
    *out = child;
    return ZERO_OK;
}

static const zero_comm_ops zero_cuda__comm_ops = {
    "cuda-local",
    zero_cuda__comm_destroy,
    zero_cuda__all_gather,
    zero_cuda__reduce_scatter,
    zero_cuda__all_reduce,
    zero_cuda__broadcast,
    zero_cuda__barrier,
    NULL,
    NULL,
    zero_cuda__all_to_all,
    zero_cuda__split,
};

ZERODEF zero_result zero_cuda_local_comm_create(zero_comm *host_comm, zero_device *dev, zero_comm **out)
{
    zero_cuda__device *d = zero_cuda__get(dev);
    zero_cuda__comm *c;
    zero_cuda__guard guard;
    zero_result res;
    cudaError_t e = cudaSuccess;
    int k;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_local_comm_create: out is NULL");
    *out = NULL;
    if (!host_comm || !host_comm->ops)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_local_comm_create: host_comm is NULL");
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_cuda_local_comm_create: dev is not a CUDA device");
    if (!host_comm->ops->name || strcmp(host_comm->ops->name, "local") != 0)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "zero_cuda_local_comm_create: host_comm is a '%s' comm, not a local comm (the ranks must "
                          "be threads of this process)", host_comm->ops->name ? host_comm->ops->name : "?");
    if (host_comm->world < 1 || host_comm->world > ZERO_CUDA_MAX_RANKS)
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_cuda_local_comm_create: world = %d (at most %d)",
                          host_comm->world, ZERO_CUDA_MAX_RANKS);
    if ((res = guard.enter(d->ordinal, "zero_cuda_local_comm_create")) != ZERO_OK) return res;
    c = (zero_cuda__comm *)zero__alloc(NULL, sizeof *c);
    if (c) {
        memset(c, 0, sizeof *c);
        c->posts = (zero_cuda__post *)zero__alloc(NULL, (size_t)host_comm->world * sizeof *c->posts);
    }
    if (!c || !c->posts) {
        if (c) zero__free(NULL, c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_cuda_local_comm_create: out of host memory");
    }
    c->base.ops = &zero_cuda__comm_ops;
    c->base.impl = c;
    c->base.rank = host_comm->rank;
    c->base.world = host_comm->world;
    c->host = host_comm;
    c->dev = dev;
    c->ordinal = d->ordinal;
    for (k = 0; k < 3 && e == cudaSuccess; k++) e = cudaEventCreateWithFlags(&c->ev[k], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        zero_cuda__comm_destroy(&c->base);
        return zero_cuda__err(e, "zero_cuda_local_comm_create: cudaEventCreateWithFlags");
    }
    *out = &c->base;
    return ZERO_OK;
}

#endif /* ZERO_CUDA_IMPLEMENTATION */
