/* The harness tested itself (tests/cudasim, docs/cuda.md): the device language against
   references computed here (shuffles, barriers, shared memory per block, atomics, 3-D
   indices, the exactly rounded intrinsics), the runtime's stream and event semantics
   (cudaEventQuery while pending, the legacy stream, cudaStreamPerThread, elapsed time,
   cudaMemGetInfo), and seeded defects, each caught with a message that names it:
   a kernel reading pageable host memory or another device's memory, an out-of-bounds kernel
   write and a use after free (AddressSanitizer builds), a missing cudaStreamWaitEvent
   between two streams (race mode; ThreadSanitizer builds report it as a data race), 2048
   threads per block, more than __launch_bounds__, a grid y above 65535, static shared memory
   above 48 KiB, parameters above 32764 bytes, a __syncthreads reached by part of a block.

   Every case runs in a child process (fork before any CUDA call: a seeded fault leaves its
   device's sticky error, or a sanitizer report, behind), its stderr captured and searched.
   Built only by the harness (make test-cuda-sim). */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"

#include "cudasim.h"
#include "tests/zt.h"

#include <math.h>
#include <stdint.h>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define T_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(T_ASAN)
#define T_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(T_TSAN)
#define T_TSAN 1
#endif

#define LAUNCH(k, g, b, s, ...) CUDASIM_LAUNCH(k, g, b, 0, s, __VA_ARGS__)

/* ---- running a case in a child ---- */

struct child {
    int status; /* exit code, or 128 + signal */
    std::string out;
};

/* Runs fn() in a child with env ("NAME=VALUE" strings, NULL-terminated; or NULL) set; its
   exit code is fn's. */
static child run_child(int (*fn)(void), const char *const *env)
{
    child c;
    int fd[2];
    c.status = -1;
    if (pipe(fd) != 0) return c;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        for (; env && *env; env++) putenv((char *)*env);
        int rc = fn();
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    close(fd[1]);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd[0], buf, sizeof buf)) > 0) c.out.append(buf, (size_t)n);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return c;
}

static bool has(const child &c, const char *s) { return c.out.find(s) != std::string::npos; }

#define EXPECT_OUT(c, s) ZT_CHECKF(has(c, s), "expected \"%s\" in the output:\n%s", s, (c).out.c_str())

/* In a child: fails (exit 1) with a line when cond is false. */
#define REQ(cond)                                                                           \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "child: %s:%d: %s\n", __FILE__, __LINE__, #cond);               \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

/* ---- kernels ---- */

/* per warp: a full-mask shuffle tree (down), a butterfly (xor), and __shfl_sync from lane 5 */
__global__ void shfl_kernel(const float *x, float *down, float *xr, float *bc, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f, a = v, b = v;
    for (int o = 16; o > 0; o /= 2) a = __fadd_rn(a, __shfl_down_sync(0xffffffffu, a, o));
    for (int o = 1; o < 32; o *= 2) b = __fadd_rn(b, __shfl_xor_sync(0xffffffffu, b, o));
    float c = __shfl_sync(0xffffffffu, v, 5);
    if (i < n) {
        xr[i] = b;
        bc[i] = c;
        if (threadIdx.x % 32 == 0) down[i / 32] = a;
    }
}

/* shared memory per block: every block sums its slice through shared memory, with barriers */
__global__ void block_sum_kernel(const double *x, double *out, int *votes)
{
    __shared__ double s[256];
    __shared__ int any_neg;
    unsigned t = threadIdx.x;
    if (t == 0) any_neg = 0;
    s[t] = x[blockIdx.x * 256 + t];
    __syncthreads();
    if (s[t] < 0) atomicAdd(&any_neg, 1);
    for (unsigned w = 128; w > 0; w /= 2) {
        if (t < w) s[t] = __dadd_rn(s[t], s[t + w]);
        __syncthreads();
    }
    int neg = __syncthreads_or(x[blockIdx.x * 256 + t] < 0);
    int cnt = __syncthreads_count(x[blockIdx.x * 256 + t] < 0);
    int all = __syncthreads_and(x[blockIdx.x * 256 + t] < 0);
    if (t == 0) {
        out[blockIdx.x] = s[0];
        votes[4 * blockIdx.x] = neg;
        votes[4 * blockIdx.x + 1] = cnt;
        votes[4 * blockIdx.x + 2] = all;
        votes[4 * blockIdx.x + 3] = any_neg;
    }
}

/* 3-D grid and block: every thread writes its linear id at its own place */
__global__ void index_kernel(unsigned *out)
{
    unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned nb = blockDim.x * blockDim.y * blockDim.z;
    out[bx * nb + tx] = bx * 100000u + tx;
}

__global__ void atomic_kernel(unsigned *ctr, double *dsum, float *fmax_bits)
{
    atomicAdd(ctr, 1u);
    atomicAdd(dsum, 0.5);
    atomicMax((int *)fmax_bits, (int)(blockIdx.x * blockDim.x + threadIdx.x));
}

__global__ void rn_kernel(const float *a, const float *b, const float *c, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[4 * i] = __fadd_rn(a[i], b[i]);
    out[4 * i + 1] = __fmul_rn(a[i], b[i]);
    out[4 * i + 2] = fmaf(a[i], b[i], c[i]);
    out[4 * i + 3] = __fmaf_rn(a[i], b[i], c[i]);
}

__global__ void write_kernel(float *p, size_t n, float v)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

__global__ void read_kernel(const float *hostp, float *out) { out[threadIdx.x] = hostp[threadIdx.x]; }

__global__ void oob_kernel(float *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    p[i] = (float)n; /* no bound check: threads past n write past the allocation */
}

__global__ void partial_sync_kernel(float *p)
{
    if (threadIdx.x >= 100) return; /* a barrier below, reached by 100 of 128 threads */
    p[threadIdx.x] = 1.0f;
    __syncthreads();
    p[threadIdx.x] += p[(threadIdx.x + 1) % 100];
}

__global__ void divergent_shfl_kernel(float *p)
{
    float v = p[threadIdx.x];
    if (threadIdx.x < 16) v = __shfl_down_sync(0xffffffffu, v, 1); /* half a warp at a full-mask shuffle */
    p[threadIdx.x] = v;
}

__global__ void __launch_bounds__(128) bounded_kernel(float *p) { p[threadIdx.x] = 1.0f; }

__global__ void big_shared_kernel(float *p)
{
    __shared__ float big[13 * 1024]; /* 52 KiB */
    big[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    p[threadIdx.x] = big[(threadIdx.x + 1) % blockDim.x];
}

struct big_params {
    char bytes[40000];
};
__global__ void big_param_kernel(big_params b, float *p) { p[0] = (float)b.bytes[0]; }

__global__ void slow_kernel(float *p, int n, int rounds)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = 0.0f;
    for (int r = 0; r < rounds; r++) x = __fmaf_rn(x, 0.5f, 1.0f);
    p[i] = x + 1.0f; /* always 3.0f at the end: x -> 2 */
}

/* ---- the device language ---- */

ZT_TEST(test_shuffles)
{
    const int n = 1000; /* 32 blocks of 32 (the last partial: lanes past n hold 0) */
    float h[1024], down[32], xr[1024], bc[1024];
    float *dx, *dd, *dxr, *dbc;
    zt_seed(1);
    for (int i = 0; i < 1024; i++) h[i] = (float)(zt_uniform() * 2.0 - 1.0);
    ZT_CHECK(cudaMalloc((void **)&dx, 4096) == cudaSuccess && cudaMalloc((void **)&dd, 128) == cudaSuccess &&
             cudaMalloc((void **)&dxr, 4096) == cudaSuccess && cudaMalloc((void **)&dbc, 4096) == cudaSuccess);
    cudaMemcpy(dx, h, 4096, cudaMemcpyHostToDevice);
    LAUNCH(shfl_kernel, 4, 256, 0, dx, dd, dxr, dbc, n);
    ZT_CHECK(cudaGetLastError() == cudaSuccess);
    ZT_CHECK(cudaMemcpy(down, dd, 128, cudaMemcpyDeviceToHost) == cudaSuccess);
    cudaMemcpy(xr, dxr, 4096, cudaMemcpyDeviceToHost);
    cudaMemcpy(bc, dbc, 4096, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int w = 0; w < 32; w++) {
        float v[32], a[32];
        for (int l = 0; l < 32; l++) v[l] = a[l] = w * 32 + l < n ? h[w * 32 + l] : 0.0f;
        /* the down tree in its own order: lane l adds lane l + o (lanes past 31 keep their own) */
        for (int o = 16; o > 0; o /= 2) {
            float t[32];
            for (int l = 0; l < 32; l++) t[l] = a[l] + (l + o < 32 ? a[l + o] : a[l]);
            memcpy(a, t, sizeof t);
        }
        bad += down[w] != a[0];
        float b[32];
        memcpy(b, v, sizeof b);
        for (int o = 1; o < 32; o *= 2) {
            float t[32];
            for (int l = 0; l < 32; l++) t[l] = b[l] + b[l ^ o];
            memcpy(b, t, sizeof t);
        }
        for (int l = 0; l < 32 && w * 32 + l < n; l++) bad += xr[w * 32 + l] != b[l] || bc[w * 32 + l] != v[5];
    }
    ZT_CHECKF(bad == 0, "%d shuffle results differ from the reference", bad);
    cudaFree(dx);
    cudaFree(dd);
    cudaFree(dxr);
    cudaFree(dbc);
}

ZT_TEST(test_shared_barriers_votes)
{
    const int nb = 6;
    double h[nb * 256], out[nb];
    int votes[4 * nb];
    double *dx, *dout;
    int *dv;
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < 256; t++)
            h[b * 256 + t] = b == 1 ? -1.0 : b == 2 && t == 77 ? -3.0 : (double)(b * 1000 + t) * 0.1;
    cudaMalloc((void **)&dx, sizeof h);
    cudaMalloc((void **)&dout, sizeof out);
    cudaMalloc((void **)&dv, sizeof votes);
    cudaMemcpy(dx, h, sizeof h, cudaMemcpyHostToDevice);
    LAUNCH(block_sum_kernel, nb, 256, 0, dx, dout, dv);
    ZT_CHECK(cudaGetLastError() == cudaSuccess);
    ZT_CHECK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess);
    cudaMemcpy(votes, dv, sizeof votes, cudaMemcpyDeviceToHost);
    for (int b = 0; b < nb; b++) {
        double s[256];
        for (int t = 0; t < 256; t++) s[t] = h[b * 256 + t];
        for (int w = 128; w > 0; w /= 2)
            for (int t = 0; t < w; t++) s[t] += s[t + w];
        int neg = 0;
        for (int t = 0; t < 256; t++) neg += h[b * 256 + t] < 0;
        ZT_CHECKF(out[b] == s[0], "block %d: %.17g, want %.17g", b, out[b], s[0]);
        ZT_CHECKF(votes[4 * b] == (neg > 0) && votes[4 * b + 1] == neg && votes[4 * b + 2] == (neg == 256) &&
                      votes[4 * b + 3] == neg,
                  "block %d votes or/count/and/atomic %d %d %d %d, negatives %d", b, votes[4 * b], votes[4 * b + 1],
                  votes[4 * b + 2], votes[4 * b + 3], neg);
    }
    cudaFree(dx);
    cudaFree(dout);
    cudaFree(dv);
}

ZT_TEST(test_indices_atomics_rounding)
{
    dim3 grid(3, 2, 2), block(8, 4, 2);
    const unsigned nb = 12, nt = 64;
    unsigned *d, h[12 * 64];
    cudaMalloc((void **)&d, sizeof h);
    LAUNCH(index_kernel, grid, block, 0, d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (unsigned b = 0; b < nb; b++)
        for (unsigned t = 0; t < nt; t++) bad += h[b * nt + t] != b * 100000u + t;
    ZT_CHECKF(bad == 0, "%d threads saw the wrong blockIdx/threadIdx", bad);
    cudaFree(d);
    /* atomics across blocks and streams */
    unsigned *ctr;
    double *ds;
    float *fm;
    cudaMalloc((void **)&ctr, 64);
    ds = (double *)(ctr + 2);
    fm = (float *)(ctr + 4);
    cudaMemset(ctr, 0, 64);
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    LAUNCH(atomic_kernel, 7, 96, s1, ctr, ds, fm);
    LAUNCH(atomic_kernel, 5, 96, s2, ctr, ds, fm);
    cudaDeviceSynchronize();
    unsigned c = 0;
    double s = 0;
    int mx = 0;
    cudaMemcpy(&c, ctr, 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(&s, ds, 8, cudaMemcpyDeviceToHost);
    cudaMemcpy(&mx, fm, 4, cudaMemcpyDeviceToHost);
    ZT_CHECKF(c == 12 * 96 && s == 12 * 96 * 0.5 && mx == 7 * 96 - 1, "atomics: %u %g %d", c, s, mx);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    cudaFree(ctr);
    /* the rounded intrinsics: what IEEE fp32 gives (fmaf fused: one rounding) */
    const int n = 4096;
    std::vector<float> a(n), b(n), cc(n), o(4 * n);
    zt_seed(7);
    for (int i = 0; i < n; i++) {
        a[i] = (float)(zt_uniform() * 4 - 2);
        b[i] = (float)(zt_uniform() * 4 - 2);
        cc[i] = (float)(zt_uniform() * 4 - 2);
    }
    float *da, *db, *dc, *dout;
    cudaMalloc((void **)&da, n * 4);
    cudaMalloc((void **)&db, n * 4);
    cudaMalloc((void **)&dc, n * 4);
    cudaMalloc((void **)&dout, n * 16);
    cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, cc.data(), n * 4, cudaMemcpyHostToDevice);
    LAUNCH(rn_kernel, n / 256, 256, 0, da, db, dc, dout, n);
    cudaMemcpy(o.data(), dout, n * 16, cudaMemcpyDeviceToHost);
    bad = 0;
    for (int i = 0; i < n; i++) {
        double f = (double)a[i] * (double)b[i] + (double)cc[i]; /* exact product, one rounding to double */
        bad += o[4 * i] != (float)((double)a[i] + (double)b[i]) || o[4 * i + 1] != (float)((double)a[i] * b[i]);
        /* the fused result is within half an ulp of the exact value; the double above is
           the exact value rounded once more, so compare against fmaf on the host instead */
        bad += o[4 * i + 2] != fmaf(a[i], b[i], cc[i]) || o[4 * i + 3] != o[4 * i + 2];
        bad += fabs((double)o[4 * i + 2] - f) > fabs(f) * 6e-8 + 1e-45;
    }
    ZT_CHECKF(bad == 0, "%d rounded results differ", bad);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dout);
}

/* ---- streams and events ---- */

ZT_TEST(test_events_and_streams)
{
    const int n = 1 << 14;
    float *p, h[4];
    cudaStream_t s;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ZT_CHECK(cudaMalloc((void **)&p, n * 4) == cudaSuccess);
    ZT_CHECK(cudaStreamCreate(&s) == cudaSuccess);
    ZT_CHECK(cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess);
    ZT_CHECK(cudaEventQuery(e0) == cudaSuccess); /* never recorded */
    cudaEventRecord(e0, s);
    LAUNCH(slow_kernel, n / 256, 256, s, p, n, 4000);
    cudaEventRecord(e1, s);
    /* pending while the kernel runs (4000 rounds x 16384 threads: many milliseconds) */
    cudaError_t q = cudaEventQuery(e1);
    ZT_CHECKF(q == cudaErrorNotReady, "cudaEventQuery while pending: %s", cudaGetErrorName(q));
    ZT_CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    ZT_CHECK(cudaEventSynchronize(e1) == cudaSuccess);
    ZT_CHECK(cudaEventQuery(e1) == cudaSuccess && cudaStreamQuery(s) == cudaSuccess);
    float ms = -1;
    ZT_CHECK(cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0.0f);
    /* the legacy stream waits for s (a blocking stream): the copy sees the kernel's result */
    LAUNCH(slow_kernel, n / 256, 256, s, p, n, 200);
    ZT_CHECK(cudaMemcpy(h, p + n - 4, 16, cudaMemcpyDeviceToHost) == cudaSuccess);
    ZT_CHECKF(h[3] == 3.0f, "legacy-stream copy after the blocking stream: %g", (double)h[3]);
    /* cudaStreamPerThread: its own stream per host thread, ordered with the legacy one */
    ZT_CHECK(cudaMemsetAsync(p, 0, n * 4, cudaStreamPerThread) == cudaSuccess);
    ZT_CHECK(cudaMemcpy(h, p, 16, cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 0.0f);
    /* cudaMemGetInfo follows the allocations */
    size_t f0, t0, f1, t1;
    void *x;
    cudaMemGetInfo(&f0, &t0);
    cudaMalloc(&x, 1 << 20);
    cudaMemGetInfo(&f1, &t1);
    ZT_CHECK(t0 == t1 && f0 - f1 == (size_t)1 << 20);
    cudaFree(x);
    /* a destroyed stream is refused; a timing-disabled event has no elapsed time */
    cudaEvent_t nt;
    cudaEventCreateWithFlags(&nt, cudaEventDisableTiming);
    cudaEventRecord(nt, s);
    cudaEventSynchronize(nt);
    ZT_CHECK(cudaEventElapsedTime(&ms, e0, nt) == cudaErrorInvalidResourceHandle);
    cudaEventDestroy(nt);
    ZT_CHECK(cudaStreamDestroy(s) == cudaSuccess);
    ZT_CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(p);
}

static int child_mem_info(void)
{
    size_t f, t;
    REQ(cudaMemGetInfo(&f, &t) == cudaSuccess && t == ((size_t)3 << 20));
    void *a, *b;
    REQ(cudaMalloc(&a, (size_t)2 << 20) == cudaSuccess);
    REQ(cudaMalloc(&b, (size_t)2 << 20) == cudaErrorMemoryAllocation);
    int n = 0;
    REQ(cudaGetDeviceCount(&n) == cudaSuccess && n == 2);
    REQ(cudaSetDevice(2) == cudaErrorInvalidDevice);
    return 0;
}

ZT_TEST(test_configuration)
{
    static const char *env[] = {"CUDASIM_MEM=3M", "CUDASIM_DEVICES=2", NULL};
    child c = run_child(child_mem_info, env);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "cudaMalloc(2097152 bytes) on device 0: 1048576 of 3145728 bytes free");
}

/* ---- seeded defects ---- */

static int child_host_pointer(void)
{
    float host[32] = {0}, *out;
    REQ(cudaMalloc((void **)&out, 128) == cudaSuccess);
    LAUNCH(read_kernel, 1, 32, 0, host, out);
    REQ(cudaGetLastError() == cudaErrorIllegalAddress);
    return 0;
}

static int child_other_device(void)
{
    float *a, *b;
    REQ(cudaSetDevice(1) == cudaSuccess && cudaMalloc((void **)&a, 128) == cudaSuccess);
    REQ(cudaSetDevice(0) == cudaSuccess && cudaMalloc((void **)&b, 128) == cudaSuccess);
    LAUNCH(read_kernel, 1, 32, 0, a, b);
    REQ(cudaGetLastError() == cudaErrorIllegalAddress);
    return 0;
}

__attribute__((unused)) static int child_oob(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 1000 * 4) == cudaSuccess);
    LAUNCH(oob_kernel, 4, 256, 0, p, 1000); /* 1024 threads, 1000 floats */
    REQ(cudaDeviceSynchronize() == cudaSuccess);
    return 0;
}

__attribute__((unused)) static int child_use_after_free(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 4096) == cudaSuccess);
    REQ(cudaFree(p) == cudaSuccess);
    /* a kernel argument is checked at the launch (test_defect_freed_argument); a pointer
       the check cannot see (inside a struct, an op of a simulation) is ASan's */
    float *q = p;
    cudasim::enqueue(0, "use after free", [q]() {
        q[3] = 1.0f;
        return cudaSuccess;
    });
    REQ(cudaDeviceSynchronize() == cudaSuccess);
    return 0;
}

/* zero_cuda.h's arena: one cudaMalloc; what no alloc owns is poisoned (ZERO_CUDA_ARENA_POISON) */
__attribute__((unused)) static int child_arena(int after_free)
{
    zero_device *d = NULL;
    void *a = NULL, *b = NULL;
    REQ(zero_cuda_device_create(NULL, &d) == ZERO_OK);
    REQ(d->ops->reserve(d, 1 << 16, 4) == ZERO_OK);
    REQ(d->ops->alloc(d, 1000, ZERO_MEM_PARAM, &a) == ZERO_OK);
    REQ(d->ops->alloc(d, 4096, ZERO_MEM_PARAM, &b) == ZERO_OK);
    if (after_free) {
        REQ(d->ops->free(d, b) == ZERO_OK);
        LAUNCH(write_kernel, 1, 32, 0, (float *)b, (size_t)32, 1.0f); /* a freed block */
    } else {
        LAUNCH(write_kernel, 1, 256, 0, (float *)a, (size_t)256, 1.0f); /* 1024 bytes into 1000 */
    }
    REQ(cudaDeviceSynchronize() == cudaSuccess);
    zero_device_destroy(d);
    return 0;
}
__attribute__((unused)) static int child_arena_overrun(void) { return child_arena(0); }
__attribute__((unused)) static int child_arena_freed(void) { return child_arena(1); }

static int child_freed_arg(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 4096) == cudaSuccess);
    REQ(cudaFree(p) == cudaSuccess);
    LAUNCH(write_kernel, 1, 32, 0, p, (size_t)32, 1.0f);
    REQ(cudaGetLastError() == cudaErrorIllegalAddress);
    return 0;
}

/* Producer on s1, consumer copy on s2; wait = 1 orders them with an event. Returns the
   number of wrong elements the consumer saw. */
static int race_once(int wait)
{
    const int n = 4096;
    float *p, *q, *h;
    cudaStream_t s1, s2;
    cudaEvent_t e;
    cudaMalloc((void **)&p, n * 4);
    cudaMalloc((void **)&q, n * 4);
    cudaHostAlloc((void **)&h, n * 4, 0);
    cudaMemset(p, 0, n * 4);
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    LAUNCH(write_kernel, 16, 256, s1, p, (size_t)n, 7.0f);
    cudaEventRecord(e, s1);
    if (wait) cudaStreamWaitEvent(s2, e, 0);
    cudaMemcpyAsync(q, p, n * 4, cudaMemcpyDeviceToDevice, s2);
    cudaMemcpyAsync(h, q, n * 4, cudaMemcpyDeviceToHost, s2);
    cudaStreamSynchronize(s2);
    cudaDeviceSynchronize();
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != 7.0f;
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    cudaEventDestroy(e);
    cudaFree(p);
    cudaFree(q);
    cudaFreeHost(h);
    return bad;
}

static int child_race_missing_wait(void)
{
    int trials = 0, wrong = 0;
    for (trials = 0; trials < 12; trials++) wrong += race_once(0) > 0;
    fprintf(stderr, "missing cudaStreamWaitEvent: the consumer stream read stale data in %d of %d trials\n", wrong,
            trials);
    return wrong > 0 ? 0 : 1;
}

static int child_race_with_wait(void)
{
    for (int t = 0; t < 6; t++) REQ(race_once(1) == 0);
    return 0;
}

static int child_2048(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 8192 * 4) == cudaSuccess);
    LAUNCH(write_kernel, 1, 2048, 0, p, (size_t)2048, 1.0f);
    REQ(cudaGetLastError() == cudaErrorInvalidConfiguration);
    dim3 g(1, 70000, 1);
    LAUNCH(write_kernel, g, 32, 0, p, (size_t)32, 1.0f);
    REQ(cudaGetLastError() == cudaErrorInvalidConfiguration);
    REQ(cudaDeviceSynchronize() == cudaSuccess); /* configuration errors are not sticky */
    return 0;
}

static int child_launch_bounds(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 1024 * 4) == cudaSuccess);
    LAUNCH(bounded_kernel, 1, 128, 0, p);
    REQ(cudaGetLastError() == cudaSuccess);
    LAUNCH(bounded_kernel, 1, 256, 0, p);
    REQ(cudaGetLastError() == cudaErrorLaunchOutOfResources);
    return 0;
}

static int child_big_shared(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 1024 * 4) == cudaSuccess);
    LAUNCH(big_shared_kernel, 1, 64, 0, p);
    REQ(cudaGetLastError() == cudaErrorInvalidValue);
    return 0;
}

static int child_big_params(void)
{
    float *p;
    static big_params b;
    REQ(cudaMalloc((void **)&p, 1024 * 4) == cudaSuccess);
    LAUNCH(big_param_kernel, 1, 1, 0, b, p);
    REQ(cudaGetLastError() == cudaErrorInvalidValue);
    return 0;
}

static int child_partial_sync(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 128 * 4) == cudaSuccess);
    LAUNCH(partial_sync_kernel, 1, 128, 0, p);
    REQ(cudaGetLastError() == cudaSuccess); /* the launch itself is fine */
    REQ(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    REQ(cudaMalloc((void **)&p, 4) == cudaErrorLaunchFailure); /* sticky, as a faulted context */
    return 0;
}

static int child_divergent_shfl(void)
{
    float *p;
    REQ(cudaMalloc((void **)&p, 32 * 4) == cudaSuccess);
    cudaMemset(p, 0, 128);
    LAUNCH(divergent_shfl_kernel, 1, 32, 0, p);
    REQ(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
    return 0;
}

ZT_TEST(test_defect_host_pointer)
{
    child c = run_child(child_host_pointer, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "kernel read_kernel: argument 1 (host)");
    EXPECT_OUT(c, "pageable host memory");
}

ZT_TEST(test_defect_other_device)
{
    child c = run_child(child_other_device, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "kernel read_kernel: argument 1 (a)");
    EXPECT_OUT(c, "memory of device 1 (the access is on device 0");
}

ZT_TEST(test_defect_freed_argument)
{
    child c = run_child(child_freed_arg, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "kernel write_kernel: argument 1 (p)");
    EXPECT_OUT(c, "freed memory");
}

ZT_TEST(test_defect_out_of_bounds)
{
#ifndef T_ASAN
    ZT_SKIP("needs AddressSanitizer (make test-cuda-sim CUDASIM_SAN=asan)");
#else
    child c = run_child(child_oob, NULL);
    ZT_CHECKF(c.status != 0, "an out-of-bounds write went unnoticed:\n%s", c.out.c_str());
    EXPECT_OUT(c, "heap-buffer-overflow");
    EXPECT_OUT(c, "oob_kernel");
    c = run_child(child_use_after_free, NULL);
    ZT_CHECKF(c.status != 0, "a use after free went unnoticed:\n%s", c.out.c_str());
    EXPECT_OUT(c, "heap-use-after-free");
    c = run_child(child_arena_overrun, NULL);
    ZT_CHECKF(c.status != 0, "a write past an arena block went unnoticed:\n%s", c.out.c_str());
    EXPECT_OUT(c, "use-after-poison");
    EXPECT_OUT(c, "write_kernel");
    c = run_child(child_arena_freed, NULL);
    ZT_CHECKF(c.status != 0, "a write to a freed arena block went unnoticed:\n%s", c.out.c_str());
    EXPECT_OUT(c, "use-after-poison");
#endif
}

ZT_TEST(test_defect_missing_wait)
{
    static const char *race1[] = {"CUDASIM_RACE=1", NULL}, *race2[] = {"CUDASIM_RACE=2", NULL};
#ifdef T_TSAN
    child c = run_child(child_race_missing_wait, race1);
    EXPECT_OUT(c, "ThreadSanitizer: data race");
    c = run_child(child_race_with_wait, race2);
    ZT_CHECKF(c.status == 0 && !has(c, "ThreadSanitizer"), "with the wait, TSan or the data complained:\n%s",
              c.out.c_str());
#else
    child c = run_child(child_race_missing_wait, race1);
    ZT_CHECKF(c.status == 0, "a missing wait went unnoticed in race mode:\n%s", c.out.c_str());
    EXPECT_OUT(c, "missing cudaStreamWaitEvent: the consumer stream read stale data");
    c = run_child(child_race_with_wait, race2);
    ZT_CHECKF(c.status == 0, "with the wait, race mode still saw stale data:\n%s", c.out.c_str());
#endif
}

ZT_TEST(test_defect_launch_config)
{
    child c = run_child(child_2048, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "launch of write_kernel: 2048 threads per block");
    EXPECT_OUT(c, "grid (1,70000,1)");
    c = run_child(child_launch_bounds, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "launch of bounded_kernel: 256 threads per block above its __launch_bounds__(128)");
    c = run_child(child_big_shared, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "launch of big_shared_kernel: 53248 bytes of static __shared__");
    c = run_child(child_big_params, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "launch of big_param_kernel: 40008 bytes of kernel parameters");
}

ZT_TEST(test_defect_partial_barrier)
{
    child c = run_child(child_partial_sync, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "kernel partial_sync_kernel, block (0,0,0)");
    EXPECT_OUT(c, "__syncthreads reached by 100 of its 128 threads (28 had exited)");
    c = run_child(child_divergent_shfl, NULL);
    ZT_CHECKF(c.status == 0, "status %d:\n%s", c.status, c.out.c_str());
    EXPECT_OUT(c, "kernel divergent_shfl_kernel");
    EXPECT_OUT(c, "warp shuffle in warp 0 reached by 16 lanes");
}

int main(void)
{
    /* the children first: a fork after the runtime has started its stream threads would
       leave the child without them */
    ZT_RUN(test_configuration);
    ZT_RUN(test_defect_host_pointer);
    ZT_RUN(test_defect_other_device);
    ZT_RUN(test_defect_freed_argument);
    ZT_RUN(test_defect_out_of_bounds);
    ZT_RUN(test_defect_missing_wait);
    ZT_RUN(test_defect_launch_config);
    ZT_RUN(test_defect_partial_barrier);
    ZT_RUN(test_shuffles);
    ZT_RUN(test_shared_barriers_votes);
    ZT_RUN(test_indices_atomics_rounding);
    ZT_RUN(test_events_and_streams);
    return zt_summary();
}
