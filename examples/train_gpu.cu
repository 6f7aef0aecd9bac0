/* train_gpu.cu - ZeRO stages 0-3 training the MLP of train_mlp.c on GPUs: CUDA device
   (zero_cuda.h), NCCL comm (zero_nccl.h), matrix products through cuBLAS.

   The student MLP (32 -> H -> H -> 8, tanh, H = 128) learns the same fixed random teacher
   network as examples/train_mlp.c from the same random inputs (each rank draws its own
   batch each micro-step: data parallelism); one engine group per layer, biases excluded
   from weight decay, AdamW, gradient clipping at 1. Forward and backward run on the
   engine's compute stream: cublasGemmEx with fp16 or bf16 inputs and CUBLAS_COMPUTE_32F
   for the three products of each layer, and small kernels for bias + tanh, the loss and
   its gradient, tanh's derivative and the bias gradient. Weight gradients (times the loss
   scale) are written by cuBLAS straight into the buffers the engine hands out.

   It prints the loss (mean over ranks), the loss scale and the time per step every few
   steps, and at the end each rank's device memory by category from the engine's
   accounting.

   Run (docs/nccl.md has more):
       build/cuda/train_gpu [--stage 0..3] [--steps T] [--dtype f16|bf16] [--accum A]
                            [--batch B] [--hidden H] [--lr LR] [--print N]
       torchrun --standalone --nproc-per-node=4 --no-python build/cuda/train_gpu --stage 3
       mpirun -np 4 build/cuda/train_gpu --stage 2
       srun -N 2 --ntasks-per-node=8 --gpus-per-node=8 build/cuda/train_gpu */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#define ZERO_NCCL_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "zero_nccl.h"
#include "examples/mlp_common.h" /* shape, teacher, batches, tensors, initial values: as train_mlp.c */

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct opts {
    int stage, steps, accum, batch, hidden, print_every;
    zero_dtype dtype;
    double lr;
} opts;

/* ---- kernels (T = __half or __nv_bfloat16, the param dtype) ---------------------------- */

__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* Blocks of 'threads' covering n elements (n < 2^31, checked with the options). */
static unsigned blocks_for(long long n, int threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* act = f(z + bias), f = tanh for hidden layers; act16 = the same in T for the next GEMM. */
template <typename T>
__global__ void bias_act(const float *z, const T *bias, float *act, T *act16, int rows, int cols, int hidden)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        float a = z[i] + to_f(bias[i % cols]);
        if (hidden) a = tanhf(a);
        act[i] = a;
        act16[i] = from_f<T>(a);
    }
}

/* One block: loss += mean((y - t)^2) in a fixed order (deterministic); dz = (y - t) * gscale. */
template <typename T>
__global__ void loss_grad(const float *y, const float *t, int n, float gscale, float *dz, T *dz16, double *loss)
{
    __shared__ double part[256];
    double acc = 0;
    int i;
    for (i = threadIdx.x; i < n; i += blockDim.x) {
        float d = y[i] - t[i];
        acc += (double)d * d;
        dz[i] = d * gscale;
        dz16[i] = from_f<T>(d * gscale);
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (i = blockDim.x / 2; i > 0; i /= 2) {
        if ((int)threadIdx.x < i) part[threadIdx.x] += part[threadIdx.x + i];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss += part[0] / n;
}

/* Through tanh: dz = dx * (1 - a^2), a = tanh's output. */
template <typename T>
__global__ void tanh_back(const float *dx, const float *a, int n, float *dz, T *dz16)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = dx[i] * (1.0f - a[i] * a[i]);
        dz[i] = g;
        dz16[i] = from_f<T>(g);
    }
}

/* db[j] = sum over the batch of dz[b][j], in batch order, written in T. */
template <typename T>
__global__ void bias_grad(const float *dz, int rows, int cols, T *db)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < cols) {
        float s = 0;
        int b;
        for (b = 0; b < rows; b++) s += dz[(size_t)b * cols + j];
        db[j] = from_f<T>(s);
    }
}

/* ---- one rank ---------------------------------------------------------------------------- */

#define PROG "train_gpu"
#include "cuda_check.h" /* fail, TRY, CUDA, BLAS */

typedef struct model {
    int dims[NL + 1];
    int wid[NL], bid[NL];
    size_t woff[NL], boff[NL]; /* element offsets in each layer's group buffer */
    /* device activations: act[l] = input of layer l (fp32 and in T), B x dims[l] */
    float *act[NL + 1], *dact[NL + 1], *z, *dz;
    void *act16[NL + 1], *dz16;
    float *target;
    double *loss; /* sum over micro-steps of each batch's mean loss */
} model;

/* One micro-step of forward and backward, all on 'st'. */
template <typename T>
static zero_result micro_step(zero_engine *e, zero_device *dev, cublasHandle_t blas, cudaStream_t st,
                              model *m, const opts *o, const float *x_host, const float *t_host, float scale)
{
    const cudaDataType_t ct = o->dtype == ZERO_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f, zero = 0.0f;
    const int B = o->batch, threads = 256;
    zero_result r = ZERO_OK;
    int l;
    /* inputs and targets (pageable: the copy has read them when upload returns) */
    {
        T *x16 = (T *)malloc(sizeof(T) * (size_t)B * IN);
        if (!x16) return fail(ZERO_ERROR_OUT_OF_MEMORY, "malloc", "input buffer");
        for (l = 0; l < B * IN; l++) x16[l] = (T)x_host[l];
        r = dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, m->act16[0], x16, sizeof(T) * (size_t)B * IN);
        free(x16);
        TRY(r);
        TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, m->target, t_host, sizeof(float) * (size_t)B * OUT));
    }
    /* forward: gather, Z^T = W X^T (column-major view of row-major W[no][ni], X[B][ni]) */
    for (l = 0; l < NL; l++) {
        void *p;
        int ni = m->dims[l], no = m->dims[l + 1];
        TRY(zero_engine_gather(e, l, &p));
        BLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, no, B, ni, &one, (T *)p + m->woff[l], ct, ni,
                          m->act16[l], ct, ni, &zero, m->z, CUDA_R_32F, no, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
        ZERO_CUDA_LAUNCH(bias_act<T>, blocks_for((long long)B * no, threads), threads, 0, st,
            m->z, (const T *)p + m->boff[l], m->act[l + 1], (T *)m->act16[l + 1], B, no, l < NL - 1);
        CUDA(cudaGetLastError());
        TRY(zero_engine_release(e, l));
    }
    /* loss and dL/dy times the loss scale */
    ZERO_CUDA_LAUNCH(loss_grad<T>, 1, 256, 0, st, m->act[NL], m->target, B * OUT, scale * 2.0f / (float)(B * OUT),
                     m->dz, (T *)m->dz16, m->loss);
    CUDA(cudaGetLastError());
    /* backward, layer by layer in reverse */
    for (l = NL - 1; l >= 0; l--) {
        void *p, *g;
        int ni = m->dims[l], no = m->dims[l + 1];
        TRY(zero_engine_gather(e, l, &p));
        TRY(zero_engine_grads(e, l, &g));
        /* dW^T (ni x no) = X^T (ni x B) dZ (B x no), written in T into the engine's buffer */
        BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, ni, no, B, &one, m->act16[l], ct, ni, m->dz16, ct, no,
                          &zero, (T *)g + m->woff[l], ct, ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        ZERO_CUDA_LAUNCH(bias_grad<T>, blocks_for(no, threads), threads, 0, st, m->dz, B, no, (T *)g + m->boff[l]);
        CUDA(cudaGetLastError());
        if (l > 0) {
            /* dX^T (ni x B) = W^T (ni x no) dZ^T (no x B), then through the previous tanh */
            BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, ni, B, no, &one, (T *)p + m->woff[l], ct, ni,
                              m->dz16, ct, no, &zero, m->dact[l], CUDA_R_32F, ni, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
            ZERO_CUDA_LAUNCH(tanh_back<T>, blocks_for((long long)B * ni, threads), threads, 0, st, m->dact[l], m->act[l],
                             B * ni, m->dz, (T *)m->dz16);
            CUDA(cudaGetLastError());
        }
        TRY(zero_engine_release(e, l));
        TRY(zero_engine_grads_ready(e, l));
    }
done:
    return r;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static zero_result train(const opts *o, const zero_bootstrap_desc *boot, int device)
{
    const int rank = boot->rank, world = boot->world, B = o->batch;
    zero_device *dev = NULL;
    zero_comm *comm = NULL;
    zero_engine *e = NULL;
    cublasHandle_t blas = NULL;
    zero_engine_desc d;
    zero_cuda_desc cd;
    zero_nccl_desc nd;
    zero_result r = ZERO_OK;
    model m;
    cudaStream_t st;
    const zero_plan *plan;
    float *x = NULL, *t = NULL, *init = NULL;
    double *stats = NULL, t0, t_print;
    int l, s, k, i;
    size_t es = zero_dtype_size(o->dtype), wide;
    memset(&m, 0, sizeof m);
    memset(&cd, 0, sizeof cd);
    memset(&nd, 0, sizeof nd);
    m.dims[0] = IN;
    m.dims[1] = o->hidden;
    m.dims[2] = o->hidden;
    m.dims[3] = OUT;

    cd.device = device;
    TRY(zero_cuda_device_create(&cd, &dev));
    nd.bootstrap = boot;
    nd.name = "train_gpu";
    TRY(zero_nccl_create(&nd, &comm));
    st = (cudaStream_t)dev->ops->native_queue(dev, ZERO_QUEUE_COMPUTE);
    BLAS(cublasCreate(&blas));
    BLAS(cublasSetStream(blas, st));

    mlp_engine_desc(&d, o->stage, o->dtype, o->accum, o->lr);
    d.device = dev;
    d.comm = comm;
    TRY(zero_engine_create(&d, &e));
    TRY(mlp_add_tensors(e, m.dims, m.wid, m.bid));
    TRY(zero_engine_commit(e));
    plan = zero_engine_plan(e);
    TRY(mlp_offsets(plan, m.wid, m.bid, m.woff, m.boff));
    /* activations: the user's memory, outside the engine's accounting */
    for (l = 0; l <= NL; l++) {
        size_t n = (size_t)B * m.dims[l];
        CUDA(cudaMalloc((void **)&m.act[l], n * sizeof(float)));
        CUDA(cudaMalloc((void **)&m.dact[l], n * sizeof(float)));
        CUDA(cudaMalloc(&m.act16[l], n * es));
    }
    wide = (size_t)B * (o->hidden > OUT ? o->hidden : OUT); /* the widest layer output */
    CUDA(cudaMalloc((void **)&m.z, wide * sizeof(float)));
    CUDA(cudaMalloc((void **)&m.dz, wide * sizeof(float)));
    CUDA(cudaMalloc(&m.dz16, wide * es));
    CUDA(cudaMalloc((void **)&m.target, (size_t)B * OUT * sizeof(float)));
    CUDA(cudaMalloc((void **)&m.loss, (ZERO_MEM_COUNT + 2) * (size_t)world * sizeof(double)));
    x = (float *)malloc(sizeof(float) * (size_t)B * IN);
    t = (float *)malloc(sizeof(float) * (size_t)B * OUT);
    init = (float *)malloc(sizeof(float) * (size_t)o->hidden * (o->hidden > IN ? o->hidden : IN));
    stats = (double *)malloc((ZERO_MEM_COUNT + 2) * (size_t)world * sizeof(double));
    if (!x || !t || !init || !stats) {
        r = fail(ZERO_ERROR_OUT_OF_MEMORY, "malloc", "host buffers");
        goto done;
    }
    /* initial values, as train_mlp.c: the same on every rank */
    TRY(mlp_set_init(e, m.dims, m.wid, m.bid, init));
    if (rank == 0) {
        printf("ZeRO stage %d on %d rank(s) (CUDA device + NCCL %d, launcher: %s): MLP %d-%d-%d-%d, %s params, "
               "%d steps of %d micro-step(s) x %d samples per rank\n",
               o->stage, world, zero_nccl_version(), zero_launcher_name(boot->launcher), IN, o->hidden, o->hidden,
               OUT, zero_dtype_name(o->dtype), o->steps, o->accum, B);
        printf("%6s | %-10s | %-10s | %s\n", "step", "loss", "loss scale", "ms/step");
        fflush(stdout);
    }

    t0 = t_print = seconds();
    for (s = 0; s < o->steps; s++) {
        zero_step_info info;
        float scale = zero_engine_loss_scale(e);
        double loss = 0;
        CUDA(cudaMemsetAsync(m.loss, 0, sizeof(double), st));
        for (k = 0; k < o->accum; k++) {
            mlp_batch(rank, s, k, B, x, t);
            if (o->dtype == ZERO_BF16) r = micro_step<__nv_bfloat16>(e, dev, blas, st, &m, o, x, t, scale);
            else r = micro_step<__half>(e, dev, blas, st, &m, o, x, t, scale);
            if (r != ZERO_OK) goto done;
        }
        TRY(zero_engine_step(e, &info));
        /* a step that waited through a watchdog abort reads undefined flag/norm values and
           still returns OK: the comm says whether its collectives really finished */
        if (zero_nccl_is(comm)) TRY(zero_nccl_status(comm));
        if ((s + 1) % o->print_every == 0 || s + 1 == o->steps) {
            /* the loss, averaged over ranks (an all-reduce on the compute stream) */
            TRY(comm->ops->all_reduce(comm, m.loss, m.loss, 1, ZERO_F64, ZERO_OP_SUM, st));
            TRY(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, &loss, m.loss, sizeof loss));
            TRY(dev->ops->sync(dev, ZERO_QUEUE_COMPUTE));
            if (rank == 0) {
                double now = seconds();
                int n = (s + 1) % o->print_every == 0 ? o->print_every : (s + 1) % o->print_every;
                printf("%6d | %-10.6f | %-10g | %.3f%s\n", s + 1, loss / world / o->accum,
                       (double)info.loss_scale, 1e3 * (now - t_print) / n, info.skipped ? "  (skipped: inf/NaN)" : "");
                fflush(stdout);
                t_print = now;
            }
        }
    }
    /* every rank's memory by category, gathered to rank 0 through the comm */
    {
        zero_engine_memory mem;
        double mine[ZERO_MEM_COUNT + 2];
        int c;
        TRY(zero_engine_memory_usage(e, &mem));
        for (c = 0; c < ZERO_MEM_COUNT; c++) mine[c] = (double)mem.bytes[c];
        mine[ZERO_MEM_COUNT] = (double)mem.total_bytes;
        mine[ZERO_MEM_COUNT + 1] = (double)mem.peak_total_bytes;
        TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, m.loss + (size_t)rank * (ZERO_MEM_COUNT + 2), mine, sizeof mine));
        TRY(comm->ops->all_gather(comm, m.loss + (size_t)rank * (ZERO_MEM_COUNT + 2), m.loss, ZERO_MEM_COUNT + 2,
                                  ZERO_F64, st));
        TRY(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, stats, m.loss,
                               (ZERO_MEM_COUNT + 2) * (size_t)world * sizeof(double)));
        TRY(dev->ops->sync(dev, ZERO_QUEUE_COMPUTE));
        if (rank == 0) {
            printf("\n%.3f ms/step over %d steps. Device bytes per rank held by the engine (Psi = %zu):\n",
                   1e3 * (seconds() - t0) / o->steps, o->steps, zero_plan_total_numel(plan));
            printf("%4s", "rank");
            for (c = 0; c < ZERO_MEM_COUNT; c++) printf(" %9s", zero_mem_category_name((zero_mem_category)c));
            printf(" %10s %10s\n", "total", "peak");
            for (i = 0; i < world; i++) {
                const double *v = stats + (size_t)i * (ZERO_MEM_COUNT + 2);
                printf("%4d", i);
                for (c = 0; c < ZERO_MEM_COUNT; c++) printf(" %9.0f", v[c]);
                printf(" %10.0f %10.0f\n", v[ZERO_MEM_COUNT], v[ZERO_MEM_COUNT + 1]);
            }
        }
    }
done:
    if (r != ZERO_OK) fprintf(stderr, "train_gpu: rank %d of %d failed\n", rank, world);
    zero_engine_destroy(e);
    if (blas) cublasDestroy(blas);
    for (l = 0; l <= NL; l++) {
        cudaFree(m.act[l]);
        cudaFree(m.dact[l]);
        cudaFree(m.act16[l]);
    }
    cudaFree(m.z);
    cudaFree(m.dz);
    cudaFree(m.dz16);
    cudaFree(m.target);
    cudaFree(m.loss);
    zero_comm_destroy(comm); /* after the engine, before the device (streams) */
    zero_device_destroy(dev);
    free(x);
    free(t);
    free(init);
    free(stats);
    return r;
}

static void usage(void)
{
    fprintf(stderr, "usage: train_gpu [--stage 0..3] [--steps T] [--dtype f16|bf16] [--accum A] [--batch B] "
                    "[--hidden H] [--lr LR] [--print N]\n");
}

int main(int argc, char **argv)
{
    opts o;
    zero_bootstrap_desc boot;
    zero_result r;
    int a, device = 0;
    memset(&o, 0, sizeof o);
    o.stage = 3;
    o.steps = 300;
    o.accum = 1;
    o.batch = 16;
    o.hidden = HID;
    o.print_every = 25;
    o.dtype = ZERO_F16;
    o.lr = 3e-3;
    for (a = 1; a < argc; a += 2) { /* every option takes a value */
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(argv[a], "--stage")) o.stage = atoi(v);
        else if (!strcmp(argv[a], "--steps")) o.steps = atoi(v);
        else if (!strcmp(argv[a], "--accum")) o.accum = atoi(v);
        else if (!strcmp(argv[a], "--batch")) o.batch = atoi(v);
        else if (!strcmp(argv[a], "--hidden")) o.hidden = atoi(v);
        else if (!strcmp(argv[a], "--print")) o.print_every = atoi(v);
        else if (!strcmp(argv[a], "--lr")) o.lr = atof(v);
        else if (!strcmp(argv[a], "--dtype")) {
            if (!strcmp(v, "f16")) o.dtype = ZERO_F16;
            else if (!strcmp(v, "bf16")) o.dtype = ZERO_BF16;
            else {
                usage();
                return 2;
            }
        } else {
            usage();
            return 2;
        }
    }
    /* the element kernels index batch x width in int: keep it (and the grids) in range */
    if (o.stage < 0 || o.stage > 3 || o.steps < 1 || o.accum < 1 || o.batch < 1 || o.hidden < 1 ||
        o.hidden > 65536 || o.print_every < 1 || (long long)o.batch * (o.hidden > 128 ? o.hidden : 128) > INT_MAX / 2) {
        usage();
        return 2;
    }
    if (zero_cuda_device_count() <= 0) {
        fprintf(stderr, "train_gpu: no GPU visible (examples/train_mlp.c runs the same model on the CPU)\n");
        return 1;
    }
    r = zero_bootstrap_env(&boot); /* RANK/WORLD_SIZE, OMPI_*, SLURM_*, or one process */
    if (r == ZERO_OK) r = zero_nccl_select_device(&boot, &device);
    if (r != ZERO_OK) {
        fprintf(stderr, "train_gpu: %s\n", zero_last_error());
        return 1;
    }
    teacher_init();
    return train(&o, &boot, device) == ZERO_OK ? 0 : 1;
}
