/* bench_cuda_adam: the CUDA device's fused Adam/AdamW against a device copy kernel, same run.

   Bytes per parameter (fp16 grads and params): read master, m, v (12) and the grad (2);
   write master, m, v (12) and the param (2): 28. The reference is a grid-stride 16-byte
   copy kernel moving the same 28 bytes per parameter (14 read, 14 written); cudaMemcpyAsync
   device-to-device is printed too. Each figure is the median of --runs timed launches
   (cudaEvent on the device's compute stream) after --warmup launches.
   Target: Adam >= 0.85 x the copy kernel's bandwidth.

       build/cuda/bench_cuda_adam [--params N|256M|1G] [--runs R] [--warmup W] [--dtype f16|bf16|f32]

   The last line, "RESULT {json}", is what bench/torch_adamw.py parses. Without a GPU it
   prints a skip line and exits 0. */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_CUDA(call)                                                                     \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            fprintf(stderr, "bench_cuda_adam: %s: %s\n", #call, cudaGetErrorString(e_));      \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)
#define CHECK_ZERO(call)                                                                     \
    do {                                                                                     \
        zero_result r_ = (call);                                                             \
        if (r_ != ZERO_OK) {                                                                 \
            fprintf(stderr, "bench_cuda_adam: %s: %s\n", #call, zero_last_error());           \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static __global__ void copy_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst, size_t n16)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n16; i += stride) dst[i] = src[i];
}

/* Gradients of moderate size (a hash of the index), in the grad dtype. */
static __global__ void init_kernel(void *g, zero_dtype dt, float *master, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        uint32_t h = (uint32_t)(i * 2654435761u);
        float x = ((float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.01f;
        if (dt == ZERO_F32) ((float *)g)[i] = x;
        else if (dt == ZERO_F16) ((uint16_t *)g)[i] = zero__f32_to_f16_bits(zero_cuda__f32_bits(x));
        else ((uint16_t *)g)[i] = zero__f32_to_bf16_bits(zero_cuda__f32_bits(x));
        master[i] = x * 10.0f;
    }
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    size_t n = (size_t)256 << 20, es, bytes_per, copy_bytes;
    int runs = 20, warmup = 3, i, sm = 0, ndev = 0;
    zero_dtype dt = ZERO_F16;
    zero_device *dev = NULL;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    float *master, *m, *v, *t_adam, *t_copy, *t_memcpy, *mulskip, one_zero[2] = {1.0f, 0.0f};
    void *grad, *param, *csrc, *cdst;
    zero_adam_desc desc;
    zero_adam_coefs co;
    zero_adam_range r;
    memset(&r, 0, sizeof r);
    cudaDeviceProp prop;
    float adam_ms, copy_ms, memcpy_ms;
    double adam_gbs, copy_gbs, memcpy_gbs;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--params") && i + 1 < argc) { /* 268435456, 256M, 1G, 2.5e8 */
            char *end = NULL;
            double x = strtod(argv[++i], &end);
            if (end && (*end == 'K' || *end == 'k')) x *= 1024.0;
            if (end && (*end == 'M' || *end == 'm')) x *= 1048576.0;
            if (end && (*end == 'G' || *end == 'g')) x *= 1073741824.0;
            n = (size_t)x;
        }
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            i++;
            dt = !strcmp(argv[i], "f32") ? ZERO_F32 : !strcmp(argv[i], "bf16") ? ZERO_BF16 : ZERO_F16;
        } else {
            fprintf(stderr, "usage: %s [--params N] [--runs R] [--warmup W] [--dtype f16|bf16|f32]\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1) runs = 1;
    if (n < 1024) n = 1024;
    n = (n + 7) / 8 * 8;
    if (zero_cuda_device_probe(&ndev) != ZERO_OK) {
        fprintf(stderr, "bench_cuda_adam: %s\n", zero_last_error());
        return 1;
    }
    if (ndev == 0) {
        printf("bench_cuda_adam: skipped: no CUDA device\n");
        return 0;
    }
    es = zero_dtype_size(dt);
    bytes_per = 24 + 2 * es;        /* 28 for fp16 */
    copy_bytes = n * bytes_per / 2; /* read this much and write as much */
    copy_bytes = (copy_bytes + 15) / 16 * 16;
    CHECK_ZERO(zero_cuda_device_create(NULL, &dev));
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    CHECK_CUDA(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
    s = (cudaStream_t)dev->ops->native_queue(dev, ZERO_QUEUE_COMPUTE);
    /* everything in the device's arena: the engine's layout (one allocation per buffer) */
    CHECK_ZERO(dev->ops->reserve(dev, n * 12 + n * es * 2 + 2 * copy_bytes + 256, 8));
    CHECK_ZERO(dev->ops->alloc(dev, n * 4, ZERO_MEM_MASTER, (void **)&master));
    CHECK_ZERO(dev->ops->alloc(dev, n * 4, ZERO_MEM_MOMENT1, (void **)&m));
    CHECK_ZERO(dev->ops->alloc(dev, n * 4, ZERO_MEM_MOMENT2, (void **)&v));
    CHECK_ZERO(dev->ops->alloc(dev, n * es, ZERO_MEM_GRAD, &grad));
    CHECK_ZERO(dev->ops->alloc(dev, n * es, ZERO_MEM_PARAM, &param));
    CHECK_ZERO(dev->ops->alloc(dev, copy_bytes, ZERO_MEM_SCRATCH, &csrc));
    CHECK_ZERO(dev->ops->alloc(dev, copy_bytes, ZERO_MEM_SCRATCH, &cdst));
    CHECK_ZERO(dev->ops->alloc(dev, 8, ZERO_MEM_SCRATCH, (void **)&mulskip));
    CHECK_ZERO(dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, v, n * 4));
    CHECK_ZERO(dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, m, n * 4));
    CHECK_ZERO(dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, csrc, copy_bytes));
    CHECK_ZERO(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, mulskip, one_zero, sizeof one_zero));
    ZERO_CUDA_LAUNCH(init_kernel, sm * 8, 256, 0, s, grad, dt, master, n);
    CHECK_CUDA(cudaGetLastError());
    memset(&desc, 0, sizeof desc);
    desc.weight_decay = 0.01;
    CHECK_ZERO(zero_adam_coefs_make(&co, &desc, desc.weight_decay, 1));
    r.numel = n;
    r.master = master;
    r.m = m;
    r.v = v;
    r.grad = grad;
    r.grad_dtype = dt;
    r.param = param;
    r.param_dtype = dt;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    t_adam = (float *)malloc(sizeof(float) * (size_t)runs);
    t_copy = (float *)malloc(sizeof(float) * (size_t)runs);
    t_memcpy = (float *)malloc(sizeof(float) * (size_t)runs);
    /* interleaved: Adam, copy kernel, cudaMemcpy in each round, so clocks and heat are shared */
    for (i = -warmup; i < runs; i++) {
        float ms;
        CHECK_CUDA(cudaEventRecord(e0, s));
        CHECK_ZERO(dev->ops->adam(dev, ZERO_QUEUE_COMPUTE, &r, &co, mulskip, mulskip + 1));
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t_adam[i] = ms;
        CHECK_CUDA(cudaEventRecord(e0, s));
        ZERO_CUDA_LAUNCH(copy_kernel, sm * 8, 256, 0, s, (const uint4 *)csrc, (uint4 *)cdst, copy_bytes / 16);
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t_copy[i] = ms;
        CHECK_CUDA(cudaEventRecord(e0, s));
        CHECK_CUDA(cudaMemcpyAsync(cdst, csrc, copy_bytes, cudaMemcpyDeviceToDevice, s));
        CHECK_CUDA(cudaEventRecord(e1, s));
        CHECK_CUDA(cudaEventSynchronize(e1));
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 0) t_memcpy[i] = ms;
    }
    adam_ms = median(t_adam, runs);
    copy_ms = median(t_copy, runs);
    memcpy_ms = median(t_memcpy, runs);
    adam_gbs = (double)n * (double)bytes_per / (adam_ms * 1e-3) / 1e9;
    copy_gbs = 2.0 * (double)copy_bytes / (copy_ms * 1e-3) / 1e9;
    memcpy_gbs = 2.0 * (double)copy_bytes / (memcpy_ms * 1e-3) / 1e9;
    printf("bench_cuda_adam: %s, fused Adam over %zu params, %s grads and params, %zu bytes per param; "
           "median of %d runs after %d warm-up\n",
           prop.name, n, zero_dtype_name(dt), bytes_per, runs, warmup);
    printf("%-26s %10s %10s\n", "", "ms", "GB/s");
    printf("%-26s %10.3f %10.1f\n", "fused adam (zero_cuda)", adam_ms, adam_gbs);
    printf("%-26s %10.3f %10.1f\n", "copy kernel (same bytes)", copy_ms, copy_gbs);
    printf("%-26s %10.3f %10.1f\n", "cudaMemcpy d2d (same)", memcpy_ms, memcpy_gbs);
    printf("adam / copy kernel: %.3f (target >= 0.85: %s)\n", adam_gbs / copy_gbs, adam_gbs / copy_gbs >= 0.85 ? "met" : "MISSED");
    printf("RESULT {\"device\": \"%s\", \"params\": %zu, \"dtype\": \"%s\", \"bytes_per_param\": %zu, \"runs\": %d, "
           "\"adam_ms\": %.4f, \"adam_gbps\": %.1f, \"copy_ms\": %.4f, \"copy_gbps\": %.1f, \"memcpy_gbps\": %.1f, "
           "\"ratio\": %.4f}\n",
           prop.name, n, zero_dtype_name(dt), bytes_per, runs, adam_ms, adam_gbs, copy_ms, copy_gbs, memcpy_gbs,
           adam_gbs / copy_gbs);
    free(t_adam);
    free(t_copy);
    free(t_memcpy);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    zero_device_destroy(dev);
    return 0;
}
