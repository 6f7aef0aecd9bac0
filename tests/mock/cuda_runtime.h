/* A CPU stand-in for the parts of the CUDA runtime that zero_nccl.h's NCCL comm calls, so
   that the comm's code compiles and runs without CUDA (tests/test_nccl_mock.c). Streams and
   events are host objects; an event recorded while mock_cuda.hung is set does not complete
   until mock_cuda.hung is cleared (a collective kernel that waits for a peer forever),
   which the NCCL mock does when the communicator is aborted (NCCL's kernels then exit).
   Only for that test: every function is static inline, one translation unit. */
#ifndef ZERO_TEST_MOCK_CUDA_RUNTIME_H
#define ZERO_TEST_MOCK_CUDA_RUNTIME_H
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNoDevice = 100, cudaErrorNotReady = 600 };

typedef struct mock_cuda_stream {
    int id;
} *cudaStream_t;
typedef struct mock_cuda_event {
    int recorded;
} *cudaEvent_t;

#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamNonBlocking 0x1
#define cudaEventDisableTiming 0x2

static struct {
    volatile int hung; /* recorded events never complete while set */
    int events_live;
} mock_cuda;

static inline const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "mock CUDA error";
}
static inline cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : cudaErrorNoDevice;
}
static inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = calloc(1, bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    (void)s;
    memset(p, v, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = (cudaStream_t)calloc(1, sizeof **s);
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    free(s);
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = (cudaEvent_t)calloc(1, sizeof **e);
    if (*e) mock_cuda.events_live++;
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (e) mock_cuda.events_live--;
    free(e);
    return cudaSuccess;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    (void)s;
    e->recorded = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaEventQuery(cudaEvent_t e)
{
    return e->recorded && mock_cuda.hung ? cudaErrorNotReady : cudaSuccess;
}
#endif
