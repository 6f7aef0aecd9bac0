/* cuda_runtime.h - cudasim's CUDA runtime: the subset of CUDA's runtime API and device
   language that zero's .cu files use, for g++/clang++ (C++17, -ffp-contract=off) on the CPU.
   Kernels run for every thread of every block, the threads of a block as fibers on the
   stream's worker thread (tests/cudasim/cudasim.cpp). docs/cuda.md: what it models. */
#ifndef CUDASIM_CUDA_RUNTIME_H
#define CUDASIM_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "cudasim: .cu files compile as C++17 (g++ -x c++ -std=c++17)"
#endif
#ifdef __CUDACC__
#error "cudasim: tests/cudasim is for g++/clang++; nvcc has the real cuda_runtime.h"
#endif

#define CUDASIM 1
#define CUDART_VERSION 12040

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- the CUDA C++ keywords ---- */
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __grid_constant__
#define __constant__ static
/* static __shared__ T x[N]: one per block. Blocks of a launch run one after another on the
   stream's worker thread, and the threads of a block are fibers of that thread. */
#define __shared__ static thread_local
/* __launch_bounds__(N): kept with the kernel (its symbol goes into section cudasim_lbN, N a
   literal or a macro for one); the launch checks the block against it. */
#define CUDASIM__STR2(x) #x
#define CUDASIM__STR(x) CUDASIM__STR2(x)
#define __launch_bounds__(...) __attribute__((section("cudasim_lb" CUDASIM__STR(CUDASIM__LB1(__VA_ARGS__, 0)))))
#define CUDASIM__LB1(n, ...) n

/* ---- errors, handles, enums ---- */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorPeerAccessNotEnabled = 705,
    cudaErrorAssert = 710,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventBlockingSync 0x1
#define cudaEventDisableTiming 0x2
#define cudaHostAllocDefault 0x0
#define cudaHostAllocPortable 0x1
#define cudaHostAllocMapped 0x2
#define cudaHostAllocWriteCombined 0x4

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2, cudaMemoryTypeManaged = 3 };
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
};

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
    int clockRate, memoryClockRate, memoryBusWidth;
    int unifiedAddressing;
    int pciBusID, pciDeviceID, pciDomainID;
};

/* ---- vector types ---- */
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) double2 { double x, y; };
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

/* ---- the runtime API (tests/cudasim/cudasim.cpp) ---- */
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device);
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer);
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
typedef void (*cudaHostFn_t)(void *user);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user);

/* ---- device code: the executing thread ---- */
namespace cudasim {
struct fiber;
struct kctx { /* the launch a worker is running */
    dim3 grid, block;
    uint3 block_idx;
    const char *name;
};
extern thread_local fiber *cur_fiber; /* the CUDA thread running on this OS thread */
extern thread_local kctx *cur_kernel;
const uint3 &thread_idx();
void syncthreads_site(const void *site);
int syncthreads_op_site(int v, int op, const void *site);       /* op: 0 or, 1 and, 2 count */
unsigned long long shfl(unsigned long long v, int mode, int arg, int width, unsigned mask, const void *site);
void kernel_trap(const char *what);
} // namespace cudasim

#define threadIdx (cudasim::thread_idx())
#define blockIdx (cudasim::cur_kernel->block_idx)
#define blockDim (cudasim::cur_kernel->block)
#define gridDim (cudasim::cur_kernel->grid)
static const int warpSize = 32;

__attribute__((noinline)) static inline void __syncthreads(void) { cudasim::syncthreads_site(__builtin_return_address(0)); }
__attribute__((noinline)) static inline int __syncthreads_or(int v)
{
    return cudasim::syncthreads_op_site(v, 0, __builtin_return_address(0));
}
__attribute__((noinline)) static inline int __syncthreads_and(int v)
{
    return cudasim::syncthreads_op_site(v, 1, __builtin_return_address(0));
}
__attribute__((noinline)) static inline int __syncthreads_count(int v)
{
    return cudasim::syncthreads_op_site(v, 2, __builtin_return_address(0));
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)mask; }

namespace cudasim {
template <class T> static inline T shfl_t(T v, int mode, int arg, int width, unsigned mask, const void *site)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "cudasim: shuffle of a type over 8 bytes");
    unsigned long long u = 0;
    memcpy(&u, &v, sizeof v);
    u = shfl(u, mode, arg, width, mask, site);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
} // namespace cudasim
template <class T> __attribute__((noinline)) static T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    return cudasim::shfl_t(v, 0, (int)d, width, mask, __builtin_return_address(0));
}
template <class T> __attribute__((noinline)) static T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    return cudasim::shfl_t(v, 1, (int)d, width, mask, __builtin_return_address(0));
}
template <class T> __attribute__((noinline)) static T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32)
{
    return cudasim::shfl_t(v, 2, m, width, mask, __builtin_return_address(0));
}
template <class T> __attribute__((noinline)) static T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return cudasim::shfl_t(v, 3, src, width, mask, __builtin_return_address(0));
}

/* Atomics: GCC's __atomic builtins (the blocks of concurrent launches may run at once on
   different workers; the threads of a block are fibers of one worker). */
template <class T> static inline T cudasim__atomic_add(T *p, T v)
{
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    } else {
        T old, sum;
        __atomic_load(p, &old, __ATOMIC_RELAXED);
        do {
            sum = old + v;
        } while (!__atomic_compare_exchange(p, &old, &sum, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    }
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return cudasim__atomic_add(p, v); }
static inline int atomicAdd(int *p, int v) { return cudasim__atomic_add(p, v); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) { return cudasim__atomic_add(p, v); }
static inline float atomicAdd(float *p, float v) { return cudasim__atomic_add(p, v); }
static inline double atomicAdd(double *p, double v) { return cudasim__atomic_add(p, v); }
static inline unsigned atomicSub(unsigned *p, unsigned v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
static inline int atomicSub(int *p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
static inline int atomicMax(int *p, int v)
{
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline unsigned atomicMax(unsigned *p, unsigned v)
{
    unsigned old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
template <class T> static inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
template <class T> static inline T atomicCAS(T *p, T cmp, T v)
{
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return cmp;
}
/* Fences: the blocks of a launch run one after another on one thread, so a fence orders
   nothing the harness could reorder; ThreadSanitizer does not take fences (a compiler
   barrier there). */
#if defined(__SANITIZE_THREAD__)
#define CUDASIM__FENCE() __asm__ __volatile__("" ::: "memory")
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CUDASIM__FENCE() __asm__ __volatile__("" ::: "memory")
#endif
#endif
#ifndef CUDASIM__FENCE
#define CUDASIM__FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#endif
static inline void __threadfence(void) { CUDASIM__FENCE(); }
static inline void __threadfence_block(void) { CUDASIM__FENCE(); }
static inline void __threadfence_system(void) { CUDASIM__FENCE(); }

/* Cached loads: a plain load (the simulation has no caches). */
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
template <class T> static inline T __ldcs(const T *p) { return *p; }
template <class T> static inline T __ldlu(const T *p) { return *p; }
template <class T> static inline void __stcg(T *p, T v) { *p = v; }
template <class T> static inline void __stcs(T *p, T v) { *p = v; }

/* The exactly rounded intrinsics: IEEE round-to-nearest-even on the CPU is what the GPU
   computes (the harness compiles with -ffp-contract=off, so a * b + c is never fused). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
/* The GPU's approximate functions: the CPU's (the last bits differ). */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

/* ---- zero_cuda.h's arena hooks: AddressSanitizer poisoning of what no alloc owns ---- */
namespace cudasim {
void arena_poison(const void *p, size_t bytes);   /* after the device's queued work */
void arena_unpoison(const void *p, size_t bytes);
} // namespace cudasim
#define ZERO_CUDA_ARENA_POISON(p, bytes) cudasim::arena_poison(p, bytes)
#define ZERO_CUDA_ARENA_UNPOISON(p, bytes) cudasim::arena_unpoison(p, bytes)

/* ---- launches: ZERO_CUDA_LAUNCH (zero_cuda.h) expands to CUDASIM_LAUNCH ---- */
namespace cudasim {
struct launch_info {
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    const char *kernel; /* the kernel expression's text */
    const char *args;   /* the arguments' text, for messages */
    const void *fn;     /* the kernel's address: its __launch_bounds__ */
    size_t param_bytes;
};
/* Checks the configuration (sets the last error and returns false on a bad one). */
bool launch_check(const launch_info &li);
/* Checks one pointer argument (k: its position). */
bool launch_check_ptr(const launch_info &li, int k, const void *p);
/* Queues the grid: body(i) runs CUDA thread i of the current block. */
void launch_enqueue(const launch_info &li, std::function<void()> body);

template <class T> static inline uintptr_t as_uintptr(const T &v)
{
    if constexpr (std::is_pointer<T>::value) return (uintptr_t)v;
    else return 0;
}
template <class Tuple, size_t... I>
static inline bool check_ptrs2(const launch_info &li, const Tuple &t, std::index_sequence<I...>)
{
    bool ok = true;
    ((ok = ok && (!std::is_pointer<std::tuple_element_t<I, Tuple>>::value ||
                  launch_check_ptr(li, (int)I, (const void *)as_uintptr(std::get<I>(t))))),
     ...);
    return ok;
}

template <class... P, class... A>
static inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
                          const char *kname, const char *argtext, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "cudasim: a kernel launch with the wrong number of arguments");
    typedef std::tuple<typename std::decay<P>::type...> params;
    launch_info li;
    li.grid = grid;
    li.block = block;
    li.shmem = shmem;
    li.stream = stream;
    li.kernel = kname;
    li.args = argtext;
    li.fn = (const void *)kernel;
    li.param_bytes = (0 + ... + sizeof(typename std::decay<P>::type));
    if (!launch_check(li)) return;
    auto tup = std::make_shared<params>(std::forward<A>(args)...);
    if (!check_ptrs2(li, *tup, std::index_sequence_for<P...>{})) return;
    launch_enqueue(li, [kernel, tup]() { std::apply(kernel, *tup); });
}
} // namespace cudasim

#define CUDASIM_LAUNCH(kernel, grid, block, shmem, stream, ...)                                        \
    cudasim::launch(kernel, grid, block, shmem, stream, #kernel, #__VA_ARGS__, __VA_ARGS__)

#endif
