/* bench_nccl: bus bandwidth of each collective through zero_nccl.h's comm and through raw
   NCCL calls on the same (blocking) communicator, in the same run, 1 MB .. 1 GB.

   Bandwidth as nccl-tests defines it (its doc/PERFORMANCE.md): S = the total buffer size
   in bytes (all_reduce and broadcast: the buffer; all_gather: the gathered output,
   world x the per-rank input; reduce_scatter: the input, world x the per-rank output),
   t = the time of one operation (the slowest rank's), algbw = S / t, and
       busbw = algbw x 2 (N-1)/N   all_reduce
               algbw x (N-1)/N     all_gather, reduce_scatter
               algbw               broadcast
   so busbw compares with the hardware's link bandwidth whatever N is. The overhead column
   is (t_wrapper - t_raw) / t_raw; each figure is the median of 5 alternating repetitions
   of a timed loop (events on the rank's stream, all ranks started together by a barrier).
   Target: overhead <= 5% at every size.

   Ranks: one per process under a launcher (torchrun, mpirun, srun: see docs/nccl.md), or
   else threads of this process, one per visible GPU; with one GPU, 1 rank, then 2 and 4
   ranks on that GPU when NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE=1).

   Options: --min-bytes N  --max-bytes N (powers of 4 from min; defaults 1 MiB and 1 GiB)
            --dtype f32|f16|bf16 (default f32)  --ranks N (threads mode)  --reps N
            --strict (exit 1 when an overhead exceeds 5%) */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION /* zero_cuda_device_probe */
#define ZERO_NCCL_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "zero_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXR 16
#define REPS_MAX 15

enum { C_ALL_REDUCE, C_ALL_GATHER, C_REDUCE_SCATTER, C_BROADCAST, C_COUNT };
static const char *k_names[C_COUNT] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};

typedef struct bench_cfg {
    size_t min_bytes, max_bytes;
    zero_dtype dtype;
    int reps;
    int strict;
    int ranks; /* threads mode; 0 = automatic */
} bench_cfg;

typedef struct bench_shared {
    const bench_cfg *cfg;
    double worst_overhead; /* rank 0 writes */
    int rows;
} bench_shared;

static double bus_factor(int kind, int world)
{
    double n = (double)world;
    switch (kind) {
    case C_ALL_REDUCE: return 2.0 * (n - 1.0) / n;
    case C_ALL_GATHER:
    case C_REDUCE_SCATTER: return (n - 1.0) / n;
    default: return 1.0;
    }
}

static ncclDataType_t nccl_type(zero_dtype d)
{
    return d == ZERO_F16 ? ncclFloat16 : d == ZERO_BF16 ? ncclBfloat16 : ncclFloat32;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One raw NCCL call on the comm's own communicator (zero_nccl_handle: a plain blocking
   ncclComm_t, so the call enqueues on this thread and returns, as the wrapper's do; lock
   held by the caller). Both columns thus run the same NCCL path on the same communicator,
   and their difference is the wrapper's own cost (checks, lock, one event per call). */
static int raw_call(int kind, ncclComm_t nc, void *send, void *recv, size_t count, ncclDataType_t t,
                    cudaStream_t st)
{
    ncclResult_t r;
    switch (kind) {
    case C_ALL_REDUCE: r = ncclAllReduce(send, recv, count, t, ncclSum, nc, st); break;
    case C_ALL_GATHER: r = ncclAllGather(send, recv, count, t, nc, st); break;
    case C_REDUCE_SCATTER: r = ncclReduceScatter(send, recv, count, t, ncclSum, nc, st); break;
    default: r = ncclBroadcast(recv, recv, count, t, 0, nc, st); break;
    }
    if (r == ncclInProgress) { /* only a non-blocking comm says this: settle (60 s at most) */
        double deadline = now_s() + 60.0;
        while (r == ncclInProgress && now_s() < deadline) {
            ncclResult_t state = ncclInProgress;
            if (ncclCommGetAsyncError(nc, &state) != ncclSuccess) return -1;
            r = state;
        }
    }
    return r == ncclSuccess ? 0 : -1;
}

static zero_result wrap_call(int kind, zero_comm *comm, void *send, void *recv, size_t count,
                             zero_dtype dt, cudaStream_t st)
{
    switch (kind) {
    case C_ALL_REDUCE: return comm->ops->all_reduce(comm, send, recv, count, dt, ZERO_OP_SUM, st);
    case C_ALL_GATHER: return comm->ops->all_gather(comm, send, recv, count, dt, st);
    case C_REDUCE_SCATTER:
        return comm->ops->reduce_scatter(comm, send, recv, count, dt, ZERO_OP_SUM, st);
    default: return comm->ops->broadcast(comm, recv, count, dt, 0, st);
    }
}

typedef struct timer {
    cudaStream_t st;
    cudaEvent_t start, stop;
    double *d_time; /* device scalar for the max over ranks */
} timer;

/* Seconds per operation of 'iters' calls, the slowest rank's. */
static zero_result timed(zero_comm *comm, timer *tm, int raw, int kind, void *send, void *recv,
                         size_t count, zero_dtype dt, int iters, double *out)
{
    zero_result r;
    float ms = 0;
    double t;
    int i;
    r = comm->ops->barrier(comm);
    if (r != ZERO_OK) return r;
    if (cudaEventRecord(tm->start, tm->st) != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "cudaEventRecord");
    if (raw) {
        ncclComm_t nc;
        ncclDataType_t t = nccl_type(dt);
        zero_nccl_lock(comm); /* the watchdog shares the comm (and may have aborted it) */
        nc = (ncclComm_t)zero_nccl_handle(comm);
        if (!nc) {
            zero_nccl_unlock(comm);
            return zero_nccl_status(comm);
        }
        for (i = 0; i < iters; i++)
            if (raw_call(kind, nc, send, recv, count, t, tm->st) != 0) {
                zero_nccl_unlock(comm);
                return zero__fail(ZERO_ERROR_COMM, "raw %s failed: %s", k_names[kind], ncclGetLastError(nc));
            }
        zero_nccl_unlock(comm);
    } else {
        for (i = 0; i < iters; i++) {
            r = wrap_call(kind, comm, send, recv, count, dt, tm->st);
            if (r != ZERO_OK) return r;
        }
    }
    if (cudaEventRecord(tm->stop, tm->st) != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "cudaEventRecord");
    /* a watched collective behind the loop: waiting for it is bounded by the timeout
       (a dead peer is an error, not a hang), raw loops included */
    r = comm->ops->all_reduce(comm, tm->d_time, tm->d_time, 1, ZERO_F64, ZERO_OP_MAX, tm->st);
    if (r == ZERO_OK) r = zero_nccl_wait(comm, 0);
    if (r != ZERO_OK) return r;
    if (cudaEventSynchronize(tm->stop) != cudaSuccess || cudaEventElapsedTime(&ms, tm->start, tm->stop) != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "cudaEventElapsedTime");
    t = (double)ms * 1e-3 / iters;
    /* uploaded on the collective's stream, so the all_reduce below reads it */
    if (cudaMemcpyAsync(tm->d_time, &t, sizeof t, cudaMemcpyHostToDevice, tm->st) != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "cudaMemcpyAsync");
    r = comm->ops->all_reduce(comm, tm->d_time, tm->d_time, 1, ZERO_F64, ZERO_OP_MAX, tm->st);
    if (r == ZERO_OK) r = zero_nccl_wait(comm, 0);
    if (r != ZERO_OK) return r;
    if (cudaMemcpyAsync(&t, tm->d_time, sizeof t, cudaMemcpyDeviceToHost, tm->st) != cudaSuccess ||
        cudaStreamSynchronize(tm->st) != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "cudaMemcpyAsync");
    *out = t;
    return ZERO_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static zero_result bench_rank(int rank, int world, zero_comm *comm, bench_shared *sh)
{
    const bench_cfg *cfg = sh->cfg;
    size_t es = zero_dtype_size(cfg->dtype), bytes;
    void *send = NULL, *recv = NULL;
    timer tm;
    zero_result r = ZERO_OK;
    int kind;
    memset(&tm, 0, sizeof tm);
    if (cudaStreamCreateWithFlags(&tm.st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreate(&tm.start) != cudaSuccess || cudaEventCreate(&tm.stop) != cudaSuccess ||
        cudaMalloc((void **)&tm.d_time, sizeof(double)) != cudaSuccess ||
        cudaMalloc(&send, cfg->max_bytes) != cudaSuccess || cudaMalloc(&recv, cfg->max_bytes) != cudaSuccess ||
        cudaMemsetAsync(send, 0, cfg->max_bytes, tm.st) != cudaSuccess ||
        cudaMemsetAsync(recv, 0, cfg->max_bytes, tm.st) != cudaSuccess) { /* on the collectives' stream */
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "rank %d: CUDA setup for %zu-byte buffers failed: %s", rank,
                       cfg->max_bytes, cudaGetErrorString(cudaGetLastError()));
        goto done;
    }
    for (kind = 0; kind < C_COUNT && r == ZERO_OK; kind++) {
        if (rank == 0) {
            printf("\n%s, %d rank(s), %s\n", k_names[kind], world, zero_dtype_name(cfg->dtype));
            printf("%14s %12s | %10s %10s %10s | %10s %10s %10s | %9s\n", "size (B)", "count", "raw us",
                   "algbw", "busbw", "zero us", "algbw", "busbw", "overhead");
        }
        for (bytes = cfg->min_bytes; bytes <= cfg->max_bytes && r == ZERO_OK; bytes *= 4) {
            double traw[REPS_MAX], twrap[REPS_MAX], mraw, mwrap, unit = (double)es * world;
            size_t total = bytes, count;
            int rep, iters, i;
            /* all_gather / reduce_scatter: the total must split into equal blocks */
            if (kind == C_ALL_GATHER || kind == C_REDUCE_SCATTER) total = (size_t)(bytes / unit) * (size_t)unit;
            count = (kind == C_ALL_GATHER || kind == C_REDUCE_SCATTER) ? total / (es * world) : total / es;
            if (count == 0) continue;
            {
                size_t it = ((size_t)8 << 30) / total; /* ~8 GB moved per timed loop */
                iters = it < 10 ? 10 : it > 500 ? 500 : (int)it;
            }
            for (i = 0; i < 5 && r == ZERO_OK; i++) /* warm-up: connections, caches */
                r = wrap_call(kind, comm, send, recv, count, cfg->dtype, tm.st);
            if (r == ZERO_OK) r = zero_nccl_wait(comm, 0);
            for (rep = 0; rep < cfg->reps && r == ZERO_OK; rep++) {
                r = timed(comm, &tm, 1, kind, send, recv, count, cfg->dtype, iters, &traw[rep]);
                if (r == ZERO_OK) r = timed(comm, &tm, 0, kind, send, recv, count, cfg->dtype, iters, &twrap[rep]);
            }
            if (r != ZERO_OK) break;
            qsort(traw, (size_t)cfg->reps, sizeof traw[0], cmp_double);
            qsort(twrap, (size_t)cfg->reps, sizeof twrap[0], cmp_double);
            mraw = traw[cfg->reps / 2];
            mwrap = twrap[cfg->reps / 2];
            if (rank == 0) {
                double f = bus_factor(kind, world), ov = (mwrap - mraw) / mraw;
                printf("%14zu %12zu | %10.1f %10.2f %10.2f | %10.1f %10.2f %10.2f | %8.2f%%\n", total, count,
                       mraw * 1e6, total / mraw / 1e9, total / mraw / 1e9 * f, mwrap * 1e6, total / mwrap / 1e9,
                       total / mwrap / 1e9 * f, 100.0 * ov);
                if (ov > sh->worst_overhead) sh->worst_overhead = ov;
                sh->rows++;
            }
        }
    }
done:
    if (rank == 0) fflush(stdout);
    if (tm.st) cudaStreamDestroy(tm.st);
    if (tm.start) cudaEventDestroy(tm.start);
    if (tm.stop) cudaEventDestroy(tm.stop);
    cudaFree(tm.d_time);
    cudaFree(send);
    cudaFree(recv);
    return r;
}

/* ---- threads mode ---- */

typedef struct thread_ctx {
    int rank, world, ndev;
    const unsigned char *id;
    bench_shared *sh;
    zero_result rc;
    char err[700];
} thread_ctx;

static void *thread_main(void *p)
{
    thread_ctx *t = (thread_ctx *)p;
    zero_nccl_desc nd;
    zero_comm *comm = NULL;
    memset(&nd, 0, sizeof nd);
    nd.unique_id = t->id;
    nd.rank = t->rank;
    nd.world = t->world;
    nd.name = "bench_nccl";
    t->rc = cudaSetDevice(t->rank % t->ndev) == cudaSuccess ? ZERO_OK : ZERO_ERROR_DEVICE;
    if (t->rc == ZERO_OK) t->rc = zero_nccl_create(&nd, &comm);
    if (t->rc == ZERO_OK) t->rc = bench_rank(t->rank, t->world, comm, t->sh);
    if (t->rc != ZERO_OK) snprintf(t->err, sizeof t->err, "%s", zero_last_error());
    zero_comm_destroy(comm);
    return NULL;
}

static int run_threads(int world, int ndev, bench_shared *sh)
{
    thread_ctx ctx[MAXR];
    pthread_t th[MAXR];
    unsigned char id[ZERO_NCCL_ID_BYTES];
    int r, bad = 0;
    if (zero_nccl_unique_id(id) != ZERO_OK) {
        fprintf(stderr, "bench_nccl: %s\n", zero_last_error());
        return 1;
    }
    for (r = 0; r < world; r++) {
        memset(&ctx[r], 0, sizeof ctx[r]);
        ctx[r].rank = r;
        ctx[r].world = world;
        ctx[r].ndev = ndev;
        ctx[r].id = id;
        ctx[r].sh = sh;
        if (pthread_create(&th[r], NULL, thread_main, &ctx[r]) != 0) {
            fprintf(stderr, "bench_nccl: pthread_create failed\n");
            return 1; /* the started ranks time out and exit on their own */
        }
    }
    for (r = 0; r < world; r++) pthread_join(th[r], NULL);
    for (r = 0; r < world; r++)
        if (ctx[r].rc != ZERO_OK) {
            fprintf(stderr, "bench_nccl: rank %d: %s\n", r, ctx[r].err);
            bad = 1;
        }
    return bad;
}

static size_t parse_size(const char *s)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (end && (*end == 'k' || *end == 'K')) v *= 1024;
    if (end && (*end == 'm' || *end == 'M')) v *= 1024 * 1024;
    if (end && (*end == 'g' || *end == 'G')) v *= 1024.0 * 1024 * 1024;
    return v > 0 ? (size_t)v : 0;
}

int main(int argc, char **argv)
{
    bench_cfg cfg;
    bench_shared sh;
    zero_bootstrap_desc boot;
    int ndev = 0, i, failed = 0, version;
    int plan[4], nplan = 0;
    memset(&cfg, 0, sizeof cfg);
    cfg.min_bytes = (size_t)1 << 20;
    cfg.max_bytes = (size_t)1 << 30;
    cfg.dtype = ZERO_F32;
    cfg.reps = 5;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--min-bytes") && i + 1 < argc) cfg.min_bytes = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) cfg.max_bytes = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) cfg.ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) cfg.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--strict")) cfg.strict = 1;
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            i++;
            cfg.dtype = !strcmp(argv[i], "f16") ? ZERO_F16 : !strcmp(argv[i], "bf16") ? ZERO_BF16 : ZERO_F32;
        } else {
            fprintf(stderr,
                    "usage: bench_nccl [--min-bytes N] [--max-bytes N] [--dtype f32|f16|bf16] [--ranks N] "
                    "[--reps N] [--strict]\n");
            return 2;
        }
    }
    if (cfg.reps < 1) cfg.reps = 1;
    if (cfg.reps > REPS_MAX) cfg.reps = REPS_MAX;
    if (cfg.min_bytes == 0 || cfg.max_bytes < cfg.min_bytes) {
        fprintf(stderr, "bench_nccl: bad size range\n");
        return 2;
    }
    if (zero_cuda_device_probe(&ndev) != ZERO_OK) {
        fprintf(stderr, "bench_nccl: %s\n", zero_last_error());
        return 1;
    }
    if (ndev <= 0) {
        printf("bench_nccl: skipped: no GPU visible\n");
        return 0;
    }
    version = zero_nccl_version();
    memset(&sh, 0, sizeof sh);
    sh.cfg = &cfg;
    if (zero_bootstrap_env(&boot) != ZERO_OK) {
        fprintf(stderr, "bench_nccl: %s\n", zero_last_error());
        return 1;
    }
    if (boot.world > 1) { /* one rank per process, started by a launcher */
        zero_nccl_desc nd;
        zero_comm *comm = NULL;
        zero_result r;
        memset(&nd, 0, sizeof nd);
        nd.bootstrap = &boot;
        nd.name = "bench_nccl";
        r = zero_nccl_select_device(&boot, NULL);
        if (r == ZERO_OK) r = zero_nccl_create(&nd, &comm);
        if (r == ZERO_OK && boot.rank == 0)
            printf("bench_nccl: NCCL %d, %d processes (%s)\n", version, boot.world, zero_launcher_name(boot.launcher));
        if (r == ZERO_OK) r = bench_rank(boot.rank, boot.world, comm, &sh);
        if (r != ZERO_OK) fprintf(stderr, "bench_nccl: rank %d: %s\n", boot.rank, zero_last_error());
        zero_comm_destroy(comm);
        failed = r != ZERO_OK;
    } else {
        if (cfg.ranks > 0) {
            plan[nplan++] = cfg.ranks;
        } else if (ndev > 1) {
            plan[nplan++] = ndev < MAXR ? ndev : MAXR;
        } else {
            plan[nplan++] = 1;
            if (version >= ZERO_NCCL_MULTI_RANK_GPU_VERSION) {
                plan[nplan++] = 2;
                plan[nplan++] = 4;
            }
        }
        for (i = 0; i < nplan; i++)
            if (plan[i] > ndev) {
                if (version < ZERO_NCCL_MULTI_RANK_GPU_VERSION) {
                    fprintf(stderr, "bench_nccl: %d ranks on %d GPU(s) need NCCL >= 2.30 (have %d)\n", plan[i], ndev,
                            version);
                    return 1;
                }
                setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 0); /* before NCCL starts */
            }
        printf("bench_nccl: NCCL %d, %d GPU(s), ranks as threads\n", version, ndev);
        for (i = 0; i < nplan && !failed; i++) {
            if (plan[i] < 1 || plan[i] > MAXR) {
                fprintf(stderr, "bench_nccl: --ranks must be 1..%d\n", MAXR);
                return 2;
            }
            failed = run_threads(plan[i], ndev, &sh);
        }
    }
    if (!failed && (boot.world <= 1 || boot.rank == 0) && sh.rows > 0) {
        int ok = sh.worst_overhead <= 0.05;
        printf("\nbench_nccl: worst wrapper overhead %.2f%% over %d sizes (target <= 5%%): %s\n",
               100.0 * sh.worst_overhead, sh.rows, ok ? "ok" : "ABOVE TARGET");
        if (!ok && cfg.strict) failed = 1;
    }
    return failed;
}
