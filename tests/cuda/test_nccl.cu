/* The NCCL comm of zero_nccl.h on a GPU. Skips with one line when no GPU is visible.

   - One rank: every collective, dtype (f32, f16, bf16, f64) and op, in place and out of
     place, grouped calls, barrier, wait, argument errors that leave the comm usable,
     abort, and engine runs compared bit for bit with the local comm on the CUDA device
     and with the host run (host device + local comm): at N = 1 every reduction is an
     identity, so all three must agree exactly.
   - 2 and 4 ranks as threads of this process, one comm and stream each, on as many GPUs
     as there are (several ranks per GPU where NCCL >= 2.30, NCCL_MULTI_RANK_GPU_ENABLE=1):
     collectives on small integers (exact in every dtype and any reduction order, so the
     check is exact), random values against an fp64 reference within the tolerance of
     NCCL's reduction order, the TCP bootstrap feeding ncclCommInitRankConfig, and short
     engine runs (stages 0-3) against the local comm at the same N (on the CUDA device and
     the host run) within a stated tolerance (NCCL reduces in a different order than the
     local comm's rank order).
   - Ranks that disagree on a collective's count: an error on both (the watchdog's timeout
     on a GPU; under tests/cudasim the simulated NCCL's message naming the collective).
   - Sub-communicators and all_to_all (the hierarchical modes): zero_comm_split at N = 4
     (key order, ties, color < 0, a child destroyed after its parent) with the children's
     collectives against the local comm's, all_to_all at 1, 2 and 4 ranks in every dtype,
     the family's shared abort flag, and MiCS, hpZ and qgZ engine runs against the local
     comm (bit for bit under tests/cudasim; within tolerance on a GPU).
   - Timeouts: a queue of two collectives, each joined within the timeout of the one before,
     does not time out (the clock starts at the previous one's end); one rank never joins a
     collective; the other gets ZERO_ERROR_TIMEOUT from
     zero_nccl_wait (watchdog off), or returns from a plain cudaStreamSynchronize because
     the watchdog aborted the communicator (watchdog on), within the timeout plus slack;
     the same for a split and an all_to_all the peer never calls.

   Tolerances (|nccl - reference| per element): the reduction of N values in NCCL's order
   differs from the fp64 sum by at most (N-1) roundings of the dtype: f32 (N-1) 2^-24,
   f16 (N-1) 2^-11, bf16 (N-1) 2^-8, f64 (N-1) 2^-53, times the sum of |x_r|, plus one
   rounding of the result. Engine runs reduce gradients in fp32 (grad_comm_dtype) and
   compare fp32 master weights within 1e-6 + steps * lr * 1e-4 (a few fp32 ulps of a
   gradient change an Adam update by a few 1e-7 of lr); with fp16 gradient traffic within
   steps * lr * 4e-3 (N-1 fp16 roundings of a gradient, through Adam's normalisation). */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#define ZERO_NCCL_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "zero_nccl.h"
#include "tests/zt.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXR 8

static int g_ndev = 0;
static int g_version = 0;

/* Whether 'world' ranks fit: one GPU each, or several per GPU with NCCL >= 2.30. */
static const char *cannot_run(int world)
{
    static char why[160];
    if (world <= g_ndev) return NULL;
    if (g_version >= ZERO_NCCL_MULTI_RANK_GPU_VERSION) return NULL;
    snprintf(why, sizeof why,
             "%d ranks need %d GPUs, or NCCL >= 2.30 for several ranks per GPU (have %d GPU(s), "
             "NCCL %d)",
             world, world, g_ndev, g_version);
    return why;
}

/* ---- ranks as threads, each with an NCCL comm ---- */

typedef zero_result (*rank_fn)(int rank, int world, zero_comm *comm, void *user);

typedef struct rank_ctx {
    int rank, world;
    const unsigned char *id;
    const zero_bootstrap_desc *boot; /* instead of id: the TCP bootstrap */
    rank_fn fn;
    void *user;
    int timeout_ms;
    int no_watchdog;
    zero_result rc;
    char err[700];
} rank_ctx;

static void *rank_main(void *p)
{
    rank_ctx *c = (rank_ctx *)p;
    zero_nccl_desc nd;
    zero_comm *comm = NULL;
    memset(&nd, 0, sizeof nd);
    c->rc = cudaSetDevice(c->rank % g_ndev) == cudaSuccess ? ZERO_OK : ZERO_ERROR_DEVICE;
    if (c->rc != ZERO_OK) {
        snprintf(c->err, sizeof c->err, "cudaSetDevice failed");
        return NULL;
    }
    if (c->boot) {
        nd.bootstrap = c->boot;
    } else {
        nd.unique_id = c->id;
        nd.rank = c->rank;
        nd.world = c->world;
    }
    nd.timeout_ms = c->timeout_ms;
    nd.disable_watchdog = c->no_watchdog;
    nd.name = "test_nccl";
    c->rc = zero_nccl_create(&nd, &comm);
    if (c->rc == ZERO_OK) {
        if (comm->rank != c->rank || comm->world != c->world) {
            c->rc = ZERO_ERROR_MISMATCH;
            snprintf(c->err, sizeof c->err, "comm says rank %d/%d", comm->rank, comm->world);
        } else {
            c->rc = c->fn(c->rank, c->world, comm, c->user);
        }
    }
    if (c->rc != ZERO_OK && !c->err[0]) snprintf(c->err, sizeof c->err, "%s", zero_last_error());
    zero_comm_destroy(comm);
    return NULL;
}

/* Runs fn on 'world' threads; the first failing rank's error in err. */
static zero_result run_ranks(int world, rank_fn fn, void *user, int timeout_ms, int no_watchdog,
                             const zero_bootstrap_desc *boots, char *err, size_t err_size)
{
    rank_ctx ctx[MAXR];
    pthread_t th[MAXR];
    unsigned char id[ZERO_NCCL_ID_BYTES];
    zero_result rc = ZERO_OK;
    int r;
    err[0] = '\0';
    if (!boots) {
        rc = zero_nccl_unique_id(id);
        if (rc != ZERO_OK) {
            snprintf(err, err_size, "%s", zero_last_error());
            return rc;
        }
    }
    for (r = 0; r < world; r++) {
        memset(&ctx[r], 0, sizeof ctx[r]);
        ctx[r].rank = r;
        ctx[r].world = world;
        ctx[r].id = id;
        ctx[r].boot = boots ? &boots[r] : NULL;
        ctx[r].fn = fn;
        ctx[r].user = user;
        ctx[r].timeout_ms = timeout_ms;
        ctx[r].no_watchdog = no_watchdog;
        if (pthread_create(&th[r], NULL, rank_main, &ctx[r]) != 0) {
            ctx[r].rc = ZERO_ERROR_OUT_OF_MEMORY;
            snprintf(ctx[r].err, sizeof ctx[r].err, "pthread_create failed");
            th[r] = pthread_self();
        }
    }
    for (r = 0; r < world; r++)
        if (!pthread_equal(th[r], pthread_self())) pthread_join(th[r], NULL);
    for (r = 0; r < world; r++)
        if (ctx[r].rc != ZERO_OK) {
            snprintf(err, err_size, "rank %d: %s", r, ctx[r].err);
            return ctx[r].rc;
        }
    return ZERO_OK;
}

/* ---- collectives on exact values ---- */

static const zero_dtype k_dtypes[] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64};

/* Small integers: exact in every dtype, and so are their sums over <= 8 ranks. */
static float ival(int rank, size_t i) { return (float)((int)((rank * 7 + i * 3) % 17) - 8); }

static void to_dtype(void *dst, zero_dtype dt, const float *src, size_t n)
{
    (void)zero_convert(dst, dt, src, ZERO_F32, n, ZERO_SIMD_AUTO);
}

static void from_dtype(float *dst, const void *src, zero_dtype dt, size_t n)
{
    (void)zero_convert(dst, ZERO_F32, src, dt, n, ZERO_SIMD_AUTO);
}

typedef struct coll_result {
    int bad[MAXR];        /* mismatching elements seen by each rank */
    char what[MAXR][160]; /* the first mismatch */
} coll_result;

#define CUDA_TRY(call)                                                                       \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            r = zero__fail(ZERO_ERROR_DEVICE, "%s: %s", #call, cudaGetErrorString(e_));      \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)
#define Z_TRY(call)                                                                          \
    do {                                                                                     \
        r = (call);                                                                          \
        if (r != ZERO_OK) goto done;                                                         \
    } while (0)

static void note_bad(coll_result *res, int rank, const char *what, zero_dtype dt, size_t n,
                     size_t i, float got, float want)
{
    if (res->bad[rank]++ == 0)
        snprintf(res->what[rank], sizeof res->what[rank], "%s %s n=%zu: [%zu] = %g, want %g", what,
                 zero_dtype_name(dt), n, i, (double)got, (double)want);
}

/* Every collective on n elements per block, each dtype and op, out of place and in place. */
static zero_result exact_collectives(int rank, int world, zero_comm *comm, void *user, size_t n)
{
    coll_result *res = (coll_result *)user;
    cudaStream_t st = NULL;
    void *dsend = NULL, *drecv = NULL;
    float *h = NULL, *out = NULL;
    unsigned char *hb = NULL;
    size_t total = n * (size_t)world, i;
    size_t cap = (world < 3 ? 3 : (size_t)world) * n; /* the grouped test uses 3 n */
    zero_result r = ZERO_OK;
    int d, inplace, op, rr;
    h = (float *)malloc(cap * sizeof(float));
    out = (float *)malloc(cap * sizeof(float));
    hb = (unsigned char *)malloc(cap * 8);
    if (!h || !out || !hb) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host buffers");
        goto done;
    }
    CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_TRY(cudaMalloc(&dsend, cap * 8));
    CUDA_TRY(cudaMalloc(&drecv, cap * 8));
    for (d = 0; d < 4; d++) {
        zero_dtype dt = k_dtypes[d];
        size_t es = zero_dtype_size(dt);
        for (inplace = 0; inplace < 2; inplace++) {
            /* all_gather: block r of recv is rank r's n elements */
            for (i = 0; i < n; i++) h[i] = ival(rank, i);
            to_dtype(hb, dt, h, n);
            {
                unsigned char *send = inplace ? (unsigned char *)drecv + (size_t)rank * n * es
                                              : (unsigned char *)dsend;
                CUDA_TRY(cudaMemcpyAsync(send, hb, n * es, cudaMemcpyHostToDevice, st)); /* ordered before the collective */
                Z_TRY(comm->ops->all_gather(comm, send, drecv, n, dt, st));
            }
            Z_TRY(zero_nccl_wait(comm, 0));
            CUDA_TRY(cudaMemcpyAsync(hb, drecv, total * es, cudaMemcpyDeviceToHost, st));
            CUDA_TRY(cudaStreamSynchronize(st));
            from_dtype(out, hb, dt, total);
            for (rr = 0; rr < world; rr++)
                for (i = 0; i < n; i++)
                    if (out[rr * n + i] != ival(rr, i))
                        note_bad(res, rank, inplace ? "all_gather in place" : "all_gather", dt, n,
                                 rr * n + i, out[rr * n + i], ival(rr, i));
            for (op = 0; op < 2; op++) {
                zero_op zop = op ? ZERO_OP_MAX : ZERO_OP_SUM;
                /* reduce_scatter: rank r gets the reduction of block r */
                for (i = 0; i < total; i++) h[i] = ival(rank, i);
                to_dtype(hb, dt, h, total);
                CUDA_TRY(cudaMemcpyAsync(dsend, hb, total * es, cudaMemcpyHostToDevice, st)); /* ordered before the collective */
                {
                    unsigned char *recv = inplace ? (unsigned char *)dsend + (size_t)rank * n * es
                                                  : (unsigned char *)drecv;
                    Z_TRY(comm->ops->reduce_scatter(comm, dsend, recv, n, dt, zop, st));
                    Z_TRY(zero_nccl_wait(comm, 0));
                    CUDA_TRY(cudaMemcpyAsync(hb, recv, n * es, cudaMemcpyDeviceToHost, st));
                    CUDA_TRY(cudaStreamSynchronize(st));
                }
                from_dtype(out, hb, dt, n);
                for (i = 0; i < n; i++) {
                    float want = op ? -1e30f : 0.0f;
                    for (rr = 0; rr < world; rr++) {
                        float x = ival(rr, (size_t)rank * n + i);
                        want = op ? (x > want ? x : want) : want + x;
                    }
                    if (out[i] != want)
                        note_bad(res, rank, op ? "reduce_scatter max" : "reduce_scatter sum", dt, n,
                                 i, out[i], want);
                }
                /* all_reduce */
                for (i = 0; i < n; i++) h[i] = ival(rank, i + 5);
                to_dtype(hb, dt, h, n);
                CUDA_TRY(cudaMemcpyAsync(inplace ? drecv : dsend, hb, n * es, cudaMemcpyHostToDevice, st)); /* ordered before the collective */
                Z_TRY(comm->ops->all_reduce(comm, inplace ? drecv : dsend, drecv, n, dt, zop, st));
                Z_TRY(zero_nccl_wait(comm, 0));
                CUDA_TRY(cudaMemcpyAsync(hb, drecv, n * es, cudaMemcpyDeviceToHost, st));
                CUDA_TRY(cudaStreamSynchronize(st));
                from_dtype(out, hb, dt, n);
                for (i = 0; i < n; i++) {
                    float want = op ? -1e30f : 0.0f;
                    for (rr = 0; rr < world; rr++) {
                        float x = ival(rr, i + 5);
                        want = op ? (x > want ? x : want) : want + x;
                    }
                    if (out[i] != want)
                        note_bad(res, rank, op ? "all_reduce max" : "all_reduce sum", dt, n, i,
                                 out[i], want);
                }
            }
            /* broadcast from the last rank (in place by definition) */
            for (i = 0; i < n; i++) h[i] = ival(rank, i + 11);
            to_dtype(hb, dt, h, n);
            CUDA_TRY(cudaMemcpyAsync(drecv, hb, n * es, cudaMemcpyHostToDevice, st)); /* ordered before the collective */
            Z_TRY(comm->ops->broadcast(comm, drecv, n, dt, world - 1, st));
            Z_TRY(zero_nccl_wait(comm, 0));
            CUDA_TRY(cudaMemcpyAsync(hb, drecv, n * es, cudaMemcpyDeviceToHost, st));
            CUDA_TRY(cudaStreamSynchronize(st));
            from_dtype(out, hb, dt, n);
            for (i = 0; i < n; i++)
                if (out[i] != ival(world - 1, i + 11))
                    note_bad(res, rank, "broadcast", dt, n, i, out[i], ival(world - 1, i + 11));
        }
    }
    /* grouped: two all_reduces and an all_gather of a third region in one NCCL group */
    {
        size_t es = 4;
        float *a = (float *)dsend, *b = (float *)dsend + n, *c3 = (float *)dsend + 2 * n;
        float *g = (float *)drecv;
        for (i = 0; i < 3 * n; i++) h[i] = ival(rank, i);
        CUDA_TRY(cudaMemcpyAsync(dsend, h, 3 * n * es, cudaMemcpyHostToDevice, st)); /* ordered before the collective */
        Z_TRY(comm->ops->group_start(comm));
        Z_TRY(comm->ops->all_reduce(comm, a, a, n, ZERO_F32, ZERO_OP_SUM, st));
        Z_TRY(comm->ops->all_reduce(comm, b, b, n, ZERO_F32, ZERO_OP_MAX, st));
        Z_TRY(comm->ops->all_gather(comm, c3, g, n, ZERO_F32, st));
        Z_TRY(comm->ops->group_end(comm));
        Z_TRY(comm->ops->barrier(comm));
        CUDA_TRY(cudaMemcpyAsync(out, dsend, 2 * n * es, cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaStreamSynchronize(st));
        for (i = 0; i < n; i++) {
            float s = 0, m = -1e30f;
            for (rr = 0; rr < world; rr++) {
                s += ival(rr, i);
                m = ival(rr, n + i) > m ? ival(rr, n + i) : m;
            }
            if (out[i] != s) note_bad(res, rank, "grouped all_reduce sum", ZERO_F32, n, i, out[i], s);
            if (out[n + i] != m) note_bad(res, rank, "grouped all_reduce max", ZERO_F32, n, i, out[n + i], m);
        }
        CUDA_TRY(cudaMemcpyAsync(out, drecv, total * es, cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaStreamSynchronize(st));
        for (rr = 0; rr < world; rr++)
            for (i = 0; i < n; i++)
                if (out[rr * n + i] != ival(rr, 2 * n + i))
                    note_bad(res, rank, "grouped all_gather", ZERO_F32, n, rr * n + i, out[rr * n + i],
                             ival(rr, 2 * n + i));
    }
    Z_TRY(zero_nccl_status(comm));
done:
    if (st) cudaStreamDestroy(st);
    cudaFree(dsend);
    cudaFree(drecv);
    free(h);
    free(out);
    free(hb);
    return r;
}

static zero_result exact_small(int rank, int world, zero_comm *comm, void *user)
{
    return exact_collectives(rank, world, comm, user, 1000);
}

static zero_result exact_large(int rank, int world, zero_comm *comm, void *user)
{
    return exact_collectives(rank, world, comm, user, (1u << 20) + 3);
}

static void check_exact(int world)
{
    coll_result res;
    char err[800];
    zero_result r;
    int k;
    const char *why = cannot_run(world);
    if (why) ZT_SKIP(why);
    memset(&res, 0, sizeof res);
    r = run_ranks(world, exact_small, &res, 60000, 0, NULL, err, sizeof err);
    ZT_CHECKF(r == ZERO_OK, "world %d: %s", world, err);
    r = run_ranks(world, exact_large, &res, 60000, 0, NULL, err, sizeof err);
    ZT_CHECKF(r == ZERO_OK, "world %d: %s", world, err);
    for (k = 0; k < world; k++)
        ZT_CHECKF(res.bad[k] == 0, "world %d rank %d: %d wrong, first %s", world, k, res.bad[k], res.what[k]);
}

ZT_TEST(collectives_exact_1_rank) { check_exact(1); }
ZT_TEST(collectives_exact_2_ranks) { check_exact(2); }
ZT_TEST(collectives_exact_4_ranks) { check_exact(4); }

/* ---- random values within the stated tolerance ---- */

typedef struct tol_result {
    double worst[MAXR][4]; /* worst |err| / bound per dtype */
} tol_result;

static float rnd(int rank, size_t i)
{
    unsigned long long z = (unsigned long long)rank * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static zero_result random_all_reduce(int rank, int world, zero_comm *comm, void *user)
{
    tol_result *res = (tol_result *)user;
    const size_t n = 100003;
    static const double unit[4] = {5.9604644775390625e-08, 4.8828125e-04, 3.90625e-03, 1.1102230246251565e-16};
    cudaStream_t st = NULL;
    void *dbuf = NULL;
    float *h = NULL, *out = NULL;
    unsigned char *hb = NULL;
    zero_result r = ZERO_OK;
    size_t i;
    int d, rr;
    h = (float *)malloc(n * sizeof(float));
    out = (float *)malloc(n * sizeof(float));
    hb = (unsigned char *)malloc(n * 8);
    if (!h || !out || !hb) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host buffers");
        goto done;
    }
    CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_TRY(cudaMalloc(&dbuf, n * 8));
    for (d = 0; d < 4; d++) {
        zero_dtype dt = k_dtypes[d];
        size_t es = zero_dtype_size(dt);
        double worst = 0;
        for (i = 0; i < n; i++) h[i] = rnd(rank, i);
        to_dtype(hb, dt, h, n);
        CUDA_TRY(cudaMemcpyAsync(dbuf, hb, n * es, cudaMemcpyHostToDevice, st)); /* ordered before the collective */
        Z_TRY(comm->ops->all_reduce(comm, dbuf, dbuf, n, dt, ZERO_OP_SUM, st));
        Z_TRY(zero_nccl_wait(comm, 0));
        CUDA_TRY(cudaMemcpyAsync(hb, dbuf, n * es, cudaMemcpyDeviceToHost, st));
        CUDA_TRY(cudaStreamSynchronize(st));
        if (dt == ZERO_F64) {
            for (i = 0; i < n; i++) out[i] = 0; /* compared in double below */
        } else {
            from_dtype(out, hb, dt, n);
        }
        for (i = 0; i < n; i++) {
            double ref = 0, mag = 0, got, bound;
            for (rr = 0; rr < world; rr++) {
                /* each rank's input as that dtype holds it */
                float x = rnd(rr, i);
                double xd;
                if (dt == ZERO_F16) xd = zero_f16_to_f32(zero_f32_to_f16(x));
                else if (dt == ZERO_BF16) xd = zero_bf16_to_f32(zero_f32_to_bf16(x));
                else xd = x;
                ref += xd;
                mag += fabs(xd);
            }
            got = dt == ZERO_F64 ? ((const double *)hb)[i] : (double)out[i];
            bound = (double)(world - 1) * unit[d] * mag + unit[d] * fabs(ref) + 1e-300;
            if (fabs(got - ref) / bound > worst) worst = fabs(got - ref) / bound;
        }
        res->worst[rank][d] = worst;
    }
done:
    if (st) cudaStreamDestroy(st);
    cudaFree(dbuf);
    free(h);
    free(out);
    free(hb);
    return r;
}

static void check_tolerance(int world)
{
    tol_result res;
    char err[800];
    zero_result r;
    int k, d;
    const char *why = cannot_run(world);
    if (why) ZT_SKIP(why);
    memset(&res, 0, sizeof res);
    r = run_ranks(world, random_all_reduce, &res, 60000, 0, NULL, err, sizeof err);
    ZT_CHECKF(r == ZERO_OK, "%s", err);
    for (k = 0; k < world; k++)
        for (d = 0; d < 4; d++)
            ZT_CHECKF(res.worst[k][d] <= 1.0, "world %d rank %d %s: error %.2f x the bound", world, k,
                      zero_dtype_name(k_dtypes[d]), res.worst[k][d]);
}

ZT_TEST(all_reduce_tolerance_2_ranks) { check_tolerance(2); }
ZT_TEST(all_reduce_tolerance_4_ranks) { check_tolerance(4); }

/* ---- one rank: errors that leave the comm usable, abort ---- */

static zero_result misuse(int rank, int world, zero_comm *comm, void *user)
{
    int *checks = (int *)user, bad = 0;
    cudaStream_t st = NULL;
    float *d = NULL;
    zero_result r = ZERO_OK;
    (void)rank;
    (void)world;
    CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_TRY(cudaMalloc((void **)&d, 64 * sizeof(float)));
    bad += !zero_nccl_is(comm);
    bad += zero_nccl_handle(comm) == NULL;
    bad += comm->ops->all_reduce(comm, NULL, d, 4, ZERO_F32, ZERO_OP_SUM, st) != ZERO_ERROR_INVALID_ARGUMENT;
    bad += comm->ops->all_reduce(comm, d, d, 4, ZERO_DTYPE_DEFAULT, ZERO_OP_SUM, st) != ZERO_ERROR_INVALID_ARGUMENT;
    bad += comm->ops->all_reduce(comm, d, d, 4, ZERO_F32, (zero_op)7, st) != ZERO_ERROR_INVALID_ARGUMENT;
    bad += comm->ops->broadcast(comm, d, 4, ZERO_F32, 5, st) != ZERO_ERROR_INVALID_ARGUMENT;
    bad += comm->ops->all_gather(comm, d, NULL, 4, ZERO_F32, st) != ZERO_ERROR_INVALID_ARGUMENT;
    bad += comm->ops->reduce_scatter(comm, d, d, (size_t)-1 / 2, ZERO_F32, ZERO_OP_SUM, st) != ZERO_ERROR_OVERFLOW;
    bad += comm->ops->group_end(comm) != ZERO_ERROR_INVALID_STATE;
    bad += comm->ops->all_reduce(comm, NULL, NULL, 0, ZERO_F32, ZERO_OP_SUM, st) != ZERO_OK;
    bad += zero_nccl_wait(comm, -1) != ZERO_ERROR_INVALID_ARGUMENT;
    bad += comm->ops->group_start(comm) != ZERO_OK;
    bad += zero_nccl_wait(comm, 0) != ZERO_ERROR_INVALID_STATE;       /* inside a group */
    bad += comm->ops->group_end(comm) != ZERO_OK;
    bad += zero_nccl_status(comm) != ZERO_OK;                          /* still healthy */
    bad += comm->ops->all_reduce(comm, d, d, 64, ZERO_F32, ZERO_OP_SUM, st) != ZERO_OK;
    bad += comm->ops->barrier(comm) != ZERO_OK;
    bad += zero_nccl_abort(comm) != ZERO_OK;
    bad += zero_nccl_status(comm) != ZERO_ERROR_COMM;
    bad += comm->ops->all_reduce(comm, d, d, 64, ZERO_F32, ZERO_OP_SUM, st) != ZERO_ERROR_COMM;
    bad += strstr(zero_last_error(), "zero_nccl_abort") == NULL;
    bad += zero_nccl_handle(comm) != NULL;
    bad += comm->ops->barrier(comm) != ZERO_ERROR_COMM;
    bad += zero_nccl_wait(NULL, 0) != ZERO_ERROR_INVALID_ARGUMENT;
    *checks = bad;
done:
    if (st) cudaStreamDestroy(st);
    cudaFree(d);
    return r;
}

ZT_TEST(one_rank_misuse_and_abort)
{
    int bad = -1;
    char err[800];
    zero_result r = run_ranks(1, misuse, &bad, 30000, 0, NULL, err, sizeof err);
    ZT_CHECKF(r == ZERO_OK, "%s", err);
    ZT_CHECKF(bad == 0, "%d checks failed", bad);
}

ZT_TEST(create_arguments)
{
    zero_nccl_desc nd;
    zero_comm *c = (zero_comm *)&nd;
    unsigned char id[ZERO_NCCL_ID_BYTES];
    memset(&nd, 0, sizeof nd);
    memset(id, 0, sizeof id);
    ZT_CHECK(zero_nccl_create(NULL, &c) == ZERO_ERROR_INVALID_ARGUMENT && c == NULL);
    ZT_CHECK(zero_nccl_create(&nd, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    nd.unique_id = id;
    nd.world = 2;
    nd.rank = 2;
    ZT_CHECK(zero_nccl_create(&nd, &c) == ZERO_ERROR_INVALID_ARGUMENT);
    nd.rank = 0;
    nd.timeout_ms = -1;
    ZT_CHECK(zero_nccl_create(&nd, &c) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_nccl_unique_id(NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_nccl_version() == g_version && g_version > 0);
    ZT_CHECK(!zero_nccl_is(NULL));
}

/* ---- the TCP bootstrap feeding NCCL ---- */

static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static zero_result one_sum(int rank, int world, zero_comm *comm, void *user)
{
    coll_result *res = (coll_result *)user;
    float *d = NULL, h[16];
    zero_result r = ZERO_OK;
    int i;
    CUDA_TRY(cudaMalloc((void **)&d, sizeof h));
    for (i = 0; i < 16; i++) h[i] = (float)(rank + i);
    /* queue NULL: the collective runs on the legacy default stream, as cudaMemcpy does */
    CUDA_TRY(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
    Z_TRY(comm->ops->all_reduce(comm, d, d, 16, ZERO_F32, ZERO_OP_SUM, NULL));
    Z_TRY(comm->ops->barrier(comm));
    CUDA_TRY(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (i = 0; i < 16; i++) {
        float want = (float)(world * i + world * (world - 1) / 2);
        if (h[i] != want) note_bad(res, rank, "bootstrapped all_reduce", ZERO_F32, 16, (size_t)i, h[i], want);
    }
done:
    cudaFree(d);
    return r;
}

ZT_TEST(tcp_bootstrap_2_ranks)
{
    zero_bootstrap_desc boots[2];
    coll_result res;
    char err[800];
    zero_result r;
    int k, port = free_port();
    const char *why = cannot_run(2);
    if (why) ZT_SKIP(why);
    memset(&res, 0, sizeof res);
    for (k = 0; k < 2; k++) {
        memset(&boots[k], 0, sizeof boots[k]);
        boots[k].rank = k;
        boots[k].world = 2;
        boots[k].local_rank = k;
        boots[k].local_world = 2;
        boots[k].port = port;
        boots[k].timeout_ms = 30000;
        snprintf(boots[k].addr, sizeof boots[k].addr, "127.0.0.1");
    }
    r = run_ranks(2, one_sum, &res, 60000, 0, boots, err, sizeof err);
    ZT_CHECKF(r == ZERO_OK, "%s", err);
    ZT_CHECKF(res.bad[0] == 0 && res.bad[1] == 0, "%s %s", res.what[0], res.what[1]);
}

/* ---- timeouts: the last rank never joins ---- */

/* A rank's stream and n zeroed floats on it (the timeout tests' setup). */
static zero_result rank_stream_buffer(cudaStream_t *st, float **d, size_t n)
{
    zero_result r = ZERO_OK;
    CUDA_TRY(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
    CUDA_TRY(cudaMalloc((void **)d, n * sizeof(float)));
    CUDA_TRY(cudaMemsetAsync(*d, 0, n * sizeof(float), *st)); /* ordered before the collectives */
done:
    return r;
}

typedef struct hang_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;           /* rank 0 has finished its checks */
    int mode;           /* 0: zero_nccl_wait (no watchdog); 1: cudaStreamSynchronize (watchdog);
                           2: the very first collective (connected at init, so it
                           enqueues; the wait after it times out); 3: a split the peer never
                           joins; 4: an all_to_all the peer never joins (then zero_nccl_wait) */
    zero_result got;    /* rank 0's result */
    double elapsed_ms;
    char msg[700];
    zero_result later;  /* a collective after the failure */
} hang_ctx;

static zero_result hang_rank(int rank, int world, zero_comm *comm, void *user)
{
    hang_ctx *h = (hang_ctx *)user;
    cudaStream_t st = NULL;
    float *d = NULL;
    zero_result r = ZERO_OK;
    (void)world;
    Z_TRY(rank_stream_buffer(&st, &d, 1024));
    if (h->mode != 2) { /* one collective together: connections are up */
        Z_TRY(comm->ops->all_reduce(comm, d, d, 1024, ZERO_F32, ZERO_OP_SUM, st));
        Z_TRY(zero_nccl_wait(comm, 0));
    }
    if (rank == 0) {
        double t0 = zt_now_ms();
        zero_comm *sub = NULL;
        zero_result got = h->mode == 3   ? zero_comm_split(comm, 0, 0, &sub)
                          : h->mode == 4 ? comm->ops->all_to_all(comm, d, d + 512, 256, ZERO_F32, st)
                                         : comm->ops->all_reduce(comm, d, d, 1024, ZERO_F32, ZERO_OP_SUM, st);
        if (h->mode == 3 && (got == ZERO_OK || sub)) { /* it must not succeed alone */
            zero_comm_destroy(sub);
            got = ZERO_ERROR_INVALID_STATE;
        }
        if (got == ZERO_OK) {
            if (h->mode == 1) {
                (void)cudaStreamSynchronize(st); /* returns once the watchdog aborts */
                got = zero_nccl_status(comm);
            } else {
                got = zero_nccl_wait(comm, 0);
            }
        }
        h->elapsed_ms = zt_now_ms() - t0;
        h->got = got;
        snprintf(h->msg, sizeof h->msg, "%s", zero_last_error());
        h->later = comm->ops->all_reduce(comm, d, d, 1024, ZERO_F32, ZERO_OP_SUM, st);
        pthread_mutex_lock(&h->mu);
        h->done = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    } else {
        pthread_mutex_lock(&h->mu); /* the missing peer: waits for rank 0 to give up */
        while (!h->done) pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
    }
done:
    if (st) cudaStreamDestroy(st);
    cudaFree(d);
    return rank == 0 ? ZERO_OK : r;
}

static void check_hang(int mode)
{
    hang_ctx h;
    char err[800];
    const int timeout = 3000;
    double t0;
    const char *why = cannot_run(2);
    if (why) ZT_SKIP(why);
    memset(&h, 0, sizeof h);
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    h.mode = mode;
    t0 = zt_now_ms();
    (void)run_ranks(2, hang_rank, &h, timeout, mode == 0, NULL, err, sizeof err);
    ZT_CHECKF(h.got == ZERO_ERROR_TIMEOUT, "mode %d: got %s: %s", mode, zero_result_string(h.got), h.msg);
    ZT_CHECKF(h.elapsed_ms >= timeout * 0.9 && h.elapsed_ms < timeout * 3.0,
              "mode %d: rank 0 returned after %.0f ms (timeout %d ms)", mode, h.elapsed_ms, timeout);
    ZT_CHECKF(strstr(h.msg, "abort") != NULL, "mode %d: %s", mode, h.msg);
    ZT_CHECKF(h.later == ZERO_ERROR_TIMEOUT, "mode %d: later call %s", mode, zero_result_string(h.later));
    /* both ranks, destroy included, are back within a few timeouts */
    ZT_CHECKF(zt_now_ms() - t0 < 6.0 * timeout + 30000, "mode %d: the run took %.0f ms", mode, zt_now_ms() - t0);
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);
}

ZT_TEST(timeout_wait_no_watchdog) { check_hang(0); }
ZT_TEST(timeout_watchdog_unblocks_stream_sync) { check_hang(1); }
ZT_TEST(timeout_first_collective) { check_hang(2); }
ZT_TEST(timeout_split_peer_never_joins) { check_hang(3); }
ZT_TEST(timeout_all_to_all_peer_never_joins) { check_hang(4); }

/* The watchdog's clock: rank 0 queues two all-reduces at once, rank 1 joins the first after
   0.6 T and the second after 1.2 T. Each finishes within T of the one before it, so nothing
   times out (the second, enqueued 1.2 T before it ends, did when the clock started at the
   enqueue). */
typedef struct queue_ctx {
    int timeout_ms;
    zero_result got[2];
    char msg[700];
} queue_ctx;

static zero_result queue_rank(int rank, int world, zero_comm *comm, void *user)
{
    queue_ctx *q = (queue_ctx *)user;
    cudaStream_t st = NULL;
    float *d = NULL;
    zero_result r = ZERO_OK;
    int i;
    (void)world;
    Z_TRY(rank_stream_buffer(&st, &d, 64));
    Z_TRY(comm->ops->all_reduce(comm, d, d, 64, ZERO_F32, ZERO_OP_SUM, st)); /* connections up */
    Z_TRY(zero_nccl_wait(comm, 0));
    for (i = 0; i < 2; i++) {
        if (rank == 1) zt_sleep_ms((int)(0.6 * q->timeout_ms));
        Z_TRY(comm->ops->all_reduce(comm, d, d, 64, ZERO_F32, ZERO_OP_SUM, st));
    }
    r = zero_nccl_wait(comm, 3 * q->timeout_ms);
    if (r != ZERO_OK) snprintf(q->msg, sizeof q->msg, "%s", zero_last_error());
    q->got[rank] = r;
done:
    if (st) cudaStreamDestroy(st);
    cudaFree(d);
    return r;
}

ZT_TEST(timeout_clock_starts_after_previous)
{
    queue_ctx q;
    char err[800] = "";
    const char *why = cannot_run(2);
    if (why) ZT_SKIP(why);
    memset(&q, 0, sizeof q);
    q.timeout_ms = 2000;
    (void)run_ranks(2, queue_rank, &q, q.timeout_ms, 0, NULL, err, sizeof err);
    ZT_CHECKF(q.got[0] == ZERO_OK && q.got[1] == ZERO_OK, "rank 0 %s, rank 1 %s: %s %s", zero_result_string(q.got[0]),
              zero_result_string(q.got[1]), q.msg, err);
}

/* Ranks that disagree on a collective's count: an error on both, never a hang. On a GPU
   the watchdog's timeout ends it (NCCL cannot tell); under the harness (tests/cudasim) the
   simulated NCCL reports it at once, naming the collective and both counts. */
typedef struct mismatch_ctx {
    zero_result got[2];
    char msg[2][700];
} mismatch_ctx;

static zero_result mismatch_rank(int rank, int world, zero_comm *comm, void *user)
{
    mismatch_ctx *m = (mismatch_ctx *)user;
    cudaStream_t st = NULL;
    float *d = NULL;
    zero_result r = ZERO_OK;
    (void)world;
    Z_TRY(rank_stream_buffer(&st, &d, 64));
    r = comm->ops->all_reduce(comm, d, d, rank == 0 ? 64 : 32, ZERO_F32, ZERO_OP_SUM, st);
    if (r == ZERO_OK) r = zero_nccl_wait(comm, 0);
    m->got[rank] = r;
    snprintf(m->msg[rank], sizeof m->msg[rank], "%s", r == ZERO_OK ? "" : zero_last_error());
    r = ZERO_OK;
done:
    if (st) cudaStreamDestroy(st);
    cudaFree(d);
    return r;
}

ZT_TEST(mismatched_counts_fail)
{
    mismatch_ctx m;
    char err[800] = "";
    int r;
    const char *why = cannot_run(2);
    if (why) ZT_SKIP(why);
    memset(&m, 0, sizeof m);
    (void)run_ranks(2, mismatch_rank, &m, 2000, 0, NULL, err, sizeof err);
    for (r = 0; r < 2; r++) {
        ZT_CHECKF(m.got[r] != ZERO_OK, "rank %d: the mismatched all-reduce succeeded", r);
#ifdef CUDASIM
        ZT_CHECKF(m.got[r] == ZERO_ERROR_COMM && strstr(m.msg[r], "ncclAllReduce(count 64") &&
                      strstr(m.msg[r], "ncclAllReduce(count 32") && strstr(m.msg[r], "does not match"),
                  "rank %d: %s: %s", r, zero_result_string(m.got[r]), m.msg[r]);
#endif
    }
}

/* ---- sub-communicators (zero_comm_split) and all_to_all ---- */

#define SPLIT_N 257 /* elements per collective */
#define SPLITS 3

/* One rank's view of the three splits of split_rank, and what its collectives returned. */
typedef struct split_view {
    int rank[SPLITS], world[SPLITS]; /* -1 / 0: no comm (color < 0) */
    float ar[SPLITS][SPLIT_N], rs[SPLITS][SPLIT_N];
    unsigned short ag[SPLITS][4 * SPLIT_N], bc[SPLITS][SPLIT_N];
    float a2a[SPLITS][4 * SPLIT_N];
} split_view;

typedef struct split_ctx {
    int device; /* 1: NCCL (device buffers and a stream); 0: the local comm on the host */
    split_view v[MAXR];
    zero_comm *kept[MAXR]; /* split 1's comm, left alive past the parent's destroy */
    char err[MAXR][700];
} split_ctx;

/* Values of magnitudes 2^-4 .. 2^4: their f32 sums round differently in different orders. */
static float hval(int rank, size_t i)
{
    return (float)(ldexp(sin(1.3 * rank + 0.7 * (double)i + 0.2), (int)((rank * 3 + i) % 9) - 4));
}

/* Split s of rank r: (color, key). 0 = the nodes of 2 (key = rank), 1 = across the nodes
   with keys reversed, 2 = ranks 0-2 with keys reversed and rank 3 out (color < 0). */
static void split_of(int s, int r, int *color, int *key)
{
    *color = s == 0 ? r / 2 : s == 1 ? r % 2 : (r < 3 ? 0 : -1);
    *key = s == 0 ? r : s == 1 ? -r : 3 - r;
}

/* Runs all_reduce and reduce_scatter (f32: the local comm and NCCL, real or simulated,
   both round each f32 addition; f16 sums of 3 would differ by design, docs/nccl.md),
   all_gather and broadcast (root 1 or 0) in f16, and all_to_all (f32) on child, into v. */
static zero_result child_collectives(split_ctx *x, int r, zero_comm *child, int s, cudaStream_t st)
{
    split_view *v = &x->v[r];
    const int n = child->world, cr = child->rank;
    const size_t total = (size_t)n * SPLIT_N;
    unsigned short *h16 = (unsigned short *)calloc(total * 2, 2);
    float *hf = (float *)calloc(total * 2, sizeof(float));
    void *a = NULL, *b = NULL;
    zero_result r_ = ZERO_OK, r2;
    size_t i;
#define r r_
    if (!h16 || !hf) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host buffers");
        goto done;
    }
    if (x->device) {
        CUDA_TRY(cudaMalloc(&a, total * 4));
        CUDA_TRY(cudaMalloc(&b, total * 4));
    } else {
        a = malloc(total * 4);
        b = malloc(total * 4);
        if (!a || !b) {
            r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "buffers");
            goto done;
        }
    }
#define PUT(dst, src, bytes)                                                                       \
    do {                                                                                           \
        if (x->device) CUDA_TRY(cudaMemcpyAsync((dst), (src), (bytes), cudaMemcpyHostToDevice, st)); \
        else memcpy((dst), (src), (bytes));                                                        \
    } while (0)
#define GET(dst, src, bytes)                                                                       \
    do {                                                                                           \
        if (x->device) {                                                                           \
            CUDA_TRY(cudaStreamSynchronize(st));                                                   \
            CUDA_TRY(cudaMemcpy((dst), (src), (bytes), cudaMemcpyDeviceToHost));                   \
        } else {                                                                                   \
            memcpy((dst), (src), (bytes));                                                         \
        }                                                                                          \
    } while (0)
    for (i = 0; i < total; i++) hf[i] = hval(cr + 10 * s, i);
    PUT(a, hf, total * 4);
    Z_TRY(child->ops->all_reduce(child, a, b, SPLIT_N, ZERO_F32, ZERO_OP_SUM, st));
    GET(v->ar[s], b, SPLIT_N * 4);
    Z_TRY(child->ops->reduce_scatter(child, a, b, SPLIT_N, ZERO_F32, ZERO_OP_SUM, st));
    GET(v->rs[s], b, SPLIT_N * 4);
    to_dtype(h16, ZERO_F16, hf, total);
    PUT(a, h16, total * 2);
    Z_TRY(child->ops->all_gather(child, a, b, SPLIT_N, ZERO_F16, st));
    GET(v->ag[s], b, total * 2);
    PUT(b, h16, SPLIT_N * 2);
    Z_TRY(child->ops->broadcast(child, b, SPLIT_N, ZERO_F16, n > 1 ? 1 : 0, st));
    GET(v->bc[s], b, SPLIT_N * 2);
    for (i = 0; i < total; i++) hf[i] = (float)(1000 * (cr + 10 * s) + (int)i); /* exact in f32 */
    PUT(a, hf, total * 4);
    Z_TRY(child->ops->all_to_all(child, a, b, SPLIT_N, ZERO_F32, st));
    GET(v->a2a[s], b, total * 4);
    if (x->device) CUDA_TRY(cudaStreamSynchronize(st));
    r2 = child->ops->barrier(child);
    if (r2 != ZERO_OK) r = r2;
#undef PUT
#undef GET
done:
    if (x->device) {
        cudaFree(a);
        cudaFree(b);
    } else {
        free(a);
        free(b);
    }
    free(h16);
    free(hf);
#undef r
    return r_;
}

static zero_result split_rank(int rank, int world, zero_comm *comm, void *user)
{
    split_ctx *x = (split_ctx *)user;
    cudaStream_t st = NULL;
    zero_comm *child[SPLITS] = {NULL, NULL, NULL};
    zero_result r = ZERO_OK;
    int s;
    (void)world;
    if (x->device) CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (s = 0; s < SPLITS; s++) {
        int color, key;
        split_of(s, rank, &color, &key);
        child[s] = (zero_comm *)1; /* must be overwritten: NULL for color < 0 */
        Z_TRY(zero_comm_split(comm, color, key, &child[s]));
        x->v[rank].rank[s] = child[s] ? child[s]->rank : -1;
        x->v[rank].world[s] = child[s] ? child[s]->world : 0;
        if (child[s]) Z_TRY(child_collectives(x, rank, child[s], s, st));
    }
    /* the parent still works after its children's collectives */
    Z_TRY(comm->ops->barrier(comm));
done:
    if (r != ZERO_OK) snprintf(x->err[rank], sizeof x->err[rank], "%s", zero_last_error());
    zero_comm_destroy(child[0]); /* before the parent */
    zero_comm_destroy(child[2]);
    if (r == ZERO_OK) x->kept[rank] = child[1]; /* after the parent (split_after_parent) */
    else zero_comm_destroy(child[1]);
    if (st) cudaStreamDestroy(st);
    return r;
}

static zero_result split_local_rank(int rank, zero_comm *comm, void *user)
{
    return split_rank(rank, comm->world, comm, user);
}

/* Split 1's comm after its parent was destroyed: one more all_reduce on it, then destroy. */
typedef struct kept_ctx {
    split_ctx *x;
    int rank;
    zero_result rc;
    float got;
    char err[700];
} kept_ctx;

static void *kept_main(void *p)
{
    kept_ctx *k = (kept_ctx *)p;
    zero_comm *c = k->x->kept[k->rank];
    cudaStream_t st = NULL;
    float *d = NULL, one = (float)(k->rank + 1);
    zero_result r = ZERO_OK;
    k->got = -1;
    if (k->x->device) {
        CUDA_TRY(cudaSetDevice(k->rank % g_ndev));
        CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CUDA_TRY(cudaMalloc((void **)&d, sizeof(float)));
        CUDA_TRY(cudaMemcpyAsync(d, &one, sizeof one, cudaMemcpyHostToDevice, st));
        Z_TRY(c->ops->all_reduce(c, d, d, 1, ZERO_F32, ZERO_OP_SUM, st));
        CUDA_TRY(cudaStreamSynchronize(st));
        CUDA_TRY(cudaMemcpy(&k->got, d, sizeof(float), cudaMemcpyDeviceToHost));
    } else {
        Z_TRY(c->ops->all_reduce(c, &one, &k->got, 1, ZERO_F32, ZERO_OP_SUM, NULL));
    }
done:
    k->rc = r;
    if (r != ZERO_OK) snprintf(k->err, sizeof k->err, "%s", zero_last_error());
    zero_comm_destroy(c);
    k->x->kept[k->rank] = NULL;
    if (st) cudaStreamDestroy(st);
    cudaFree(d);
    return NULL;
}

static void run_kept(split_ctx *x, int world)
{
    kept_ctx k[MAXR];
    pthread_t th[MAXR];
    int r;
    for (r = 0; r < world; r++) {
        memset(&k[r], 0, sizeof k[r]);
        k[r].x = x;
        k[r].rank = r;
        ZT_CHECK(x->kept[r] != NULL);
        if (!x->kept[r] || pthread_create(&th[r], NULL, kept_main, &k[r]) != 0) th[r] = pthread_self();
    }
    for (r = 0; r < world; r++)
        if (!pthread_equal(th[r], pthread_self())) pthread_join(th[r], NULL);
    for (r = 0; r < world; r++) {
        if (pthread_equal(th[r], pthread_self())) continue;
        ZT_CHECKF(k[r].rc == ZERO_OK, "device %d rank %d: split comm after its parent: %s", x->device, r, k[r].err);
        /* split 1 groups {0, 2} and {1, 3}: (r + 1) + (r + 3) */
        ZT_CHECKF(k[r].got == (float)(2 * (r % 2) + 4), "device %d rank %d: sum %g after the parent", x->device, r,
                  (double)k[r].got);
    }
}

/* zero_comm_split on NCCL at N = 4: the nodes of 2, across the nodes with keys reversed,
   and a group of 3 with keys reversed and rank 3 out. Each child's rank and size from the
   contract (key order, ties by parent rank); its collectives (f16 all_reduce, reduce_scatter,
   all_gather, broadcast; f32 all_to_all) against the same splits of the local comm: bit for
   bit under the harness (both sum in the child's rank order; in the group of 3 that order
   is the reverse of the parent's, so a parent-order sum gives other bits); on a GPU the
   copies (gather, broadcast, all_to_all) are exact and the sums within f16 rounding. A
   child destroyed after its parent still works. */
ZT_TEST(split_4_ranks)
{
    split_ctx *x[2];
    char err[800];
    zero_result rc;
    int b, r, s, i;
    const char *why = cannot_run(4);
    if (why) ZT_SKIP(why);
    for (b = 0; b < 2; b++) {
        x[b] = (split_ctx *)calloc(1, sizeof *x[b]);
        x[b]->device = b == 0;
        if (b == 0) {
            rc = run_ranks(4, split_rank, x[b], 60000, 0, NULL, err, sizeof err);
        } else {
            rc = zero_local_run(4, split_local_rank, x[b]);
            snprintf(err, sizeof err, "%s", zero_last_error());
        }
        ZT_CHECKF(rc == ZERO_OK, "%s: %s", b == 0 ? "nccl" : "local", err);
        if (rc == ZERO_OK) run_kept(x[b], 4);
    }
    for (r = 0; r < 4; r++)
        for (s = 0; s < SPLITS; s++) {
            const split_view *v = &x[0]->v[r], *w = &x[1]->v[r];
            int want_rank = s == 0 ? r % 2 : s == 1 ? (r >= 2 ? 0 : 1) : (r < 3 ? 2 - r : -1);
            int want_world = s == 2 ? (r < 3 ? 3 : 0) : 2;
            ZT_CHECKF(v->rank[s] == want_rank && v->world[s] == want_world && w->rank[s] == want_rank &&
                          w->world[s] == want_world,
                      "split %d rank %d: nccl %d/%d, local %d/%d, want %d/%d", s, r, v->rank[s], v->world[s],
                      w->rank[s], w->world[s], want_rank, want_world);
            if (want_world == 0) continue;
            ZT_CHECKF(memcmp(v->ag[s], w->ag[s], sizeof v->ag[s]) == 0, "split %d rank %d: all_gather differs", s, r);
            ZT_CHECKF(memcmp(v->bc[s], w->bc[s], sizeof v->bc[s]) == 0, "split %d rank %d: broadcast differs", s, r);
            ZT_CHECKF(memcmp(v->a2a[s], w->a2a[s], sizeof v->a2a[s]) == 0, "split %d rank %d: all_to_all differs", s,
                      r);
            for (i = 0; i < want_world * SPLIT_N; i++) { /* block p from child rank p, its block for me */
                float want = (float)(1000 * (i / SPLIT_N + 10 * s) + want_rank * SPLIT_N + i % SPLIT_N);
                if (v->a2a[s][i] != want) {
                    ZT_CHECKF(0, "split %d rank %d: all_to_all [%d] = %g, want %g", s, r, i, (double)v->a2a[s][i],
                              (double)want);
                    break;
                }
            }
#ifdef CUDASIM
            ZT_CHECKF(memcmp(v->ar[s], w->ar[s], sizeof v->ar[s]) == 0 && memcmp(v->rs[s], w->rs[s], sizeof v->rs[s]) == 0,
                      "split %d rank %d: the sums differ from the local comm's", s, r);
#else
            for (i = 0; i < SPLIT_N; i++) /* NCCL's order: 2 f32 roundings of sums below 48 */
                ZT_CHECKF(fabs((double)v->ar[s][i] - (double)w->ar[s][i]) <= 48.0 * 3 * ldexp(1.0, -24),
                          "split %d rank %d [%d]: %.9g vs %.9g", s, r, i, (double)v->ar[s][i], (double)w->ar[s][i]);
#endif
        }
    {
        /* the group of 3 in the parent's order would give other bits: the check can fail */
        volatile float hf[3], acc_c, acc_p; /* volatile: each sum rounded to f32 */
        int differ = 0;
        for (i = 0; i < SPLIT_N && !differ; i++) {
            for (r = 0; r < 3; r++) hf[r] = hval(r + 20, (size_t)i); /* child rank r = parent 2 - r */
            acc_c = hf[0] + hf[1];
            acc_c = acc_c + hf[2];
            acc_p = hf[2] + hf[1];
            acc_p = acc_p + hf[0];
            differ = acc_c != acc_p;
        }
        ZT_CHECKF(differ, "no element of the group of 3 depends on the order: the bit check is vacuous");
    }
    for (b = 0; b < 2; b++) free(x[b]);
}

/* all_to_all on NCCL at 1, 2 and 4 ranks, sizes 1, 33 and 1000, every dtype: block p of
   rank r's result is block r of rank p's input, bit for bit (the local comm's contract: a
   pure copy); once inside a group; overlapping buffers refused with the comm still usable. */
typedef struct a2a_ctx {
    int bad[MAXR];
    char what[MAXR][200];
} a2a_ctx;

static float aval(int rank, size_t i) { return (float)ldexp(sin(0.9 * rank + 0.37 * (double)i), (int)(i % 5) - 2); }

static zero_result a2a_rank(int rank, int world, zero_comm *comm, void *user)
{
    a2a_ctx *x = (a2a_ctx *)user;
    static const size_t sizes[] = {1, 33, 1000};
    cudaStream_t st = NULL;
    void *a = NULL, *b = NULL;
    float *hf = NULL, *back = NULL;
    unsigned char *h = NULL;
    zero_result r = ZERO_OK;
    size_t si, i;
    int di;
    const size_t maxn = 1000 * (size_t)world;
    CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CUDA_TRY(cudaMalloc(&a, maxn * 8));
    CUDA_TRY(cudaMalloc(&b, maxn * 8));
    hf = (float *)malloc(maxn * sizeof(float));
    back = (float *)malloc(maxn * sizeof(float));
    h = (unsigned char *)malloc(maxn * 8);
    if (!hf || !back || !h) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host buffers");
        goto done;
    }
    for (di = 0; di < 4; di++)
        for (si = 0; si < 3; si++) {
            zero_dtype dt = k_dtypes[di];
            size_t n = sizes[si], es = zero_dtype_size(dt), total = n * (size_t)world;
            int grouped = si == 1;
            for (i = 0; i < total; i++) hf[i] = aval(rank, i);
            to_dtype(h, dt, hf, total);
            CUDA_TRY(cudaMemcpyAsync(a, h, total * es, cudaMemcpyHostToDevice, st));
            if (grouped) Z_TRY(comm->ops->group_start(comm));
            Z_TRY(comm->ops->all_to_all(comm, a, b, n, dt, st));
            if (grouped) Z_TRY(comm->ops->group_end(comm));
            CUDA_TRY(cudaStreamSynchronize(st));
            CUDA_TRY(cudaMemcpy(h, b, total * es, cudaMemcpyDeviceToHost));
            from_dtype(back, h, dt, total);
            for (i = 0; i < total; i++) {
                float want = aval((int)(i / n), (size_t)rank * n + i % n), wr;
                unsigned char wb[8];
                to_dtype(wb, dt, &want, 1); /* the sender's value in the dtype */
                from_dtype(&wr, wb, dt, 1);
                if (memcmp(&wr, &back[i], 4) != 0 && x->bad[rank]++ == 0)
                    snprintf(x->what[rank], sizeof x->what[rank], "%s n=%zu: [%zu] = %g, want %g",
                             zero_dtype_name(dt), n, i, (double)back[i], (double)wr);
            }
        }
    /* overlap: refused at the call, the comm still usable */
    if (world > 1) {
        zero_result o = comm->ops->all_to_all(comm, a, (char *)a + 4, 8, ZERO_F32, st);
        if (o != ZERO_ERROR_INVALID_ARGUMENT && x->bad[rank]++ == 0)
            snprintf(x->what[rank], sizeof x->what[rank], "overlapping all_to_all: %s", zero_result_string(o));
    }
    Z_TRY(comm->ops->all_to_all(comm, a, b, 8, ZERO_F32, st));
    Z_TRY(zero_nccl_wait(comm, 0));
done:
    if (st) cudaStreamDestroy(st);
    cudaFree(a);
    cudaFree(b);
    free(hf);
    free(back);
    free(h);
    return r;
}

ZT_TEST(all_to_all_exact)
{
    static const int worlds[] = {1, 2, 4};
    int wi, r;
    for (wi = 0; wi < 3; wi++) {
        a2a_ctx x;
        char err[800];
        zero_result rc;
        if (cannot_run(worlds[wi])) continue;
        memset(&x, 0, sizeof x);
        rc = run_ranks(worlds[wi], a2a_rank, &x, 60000, 0, NULL, err, sizeof err);
        ZT_CHECKF(rc == ZERO_OK, "N=%d: %s", worlds[wi], err);
        for (r = 0; r < worlds[wi]; r++)
            ZT_CHECKF(x.bad[r] == 0, "N=%d rank %d: %d bad: %s", worlds[wi], r, x.bad[r], x.what[r]);
    }
}

/* A comm and the comms split from it share NCCL's abort flag (splitShare): aborting the
   child aborts NCCL's state of the parent too, and the parent's next call says so instead
   of running on an aborted communicator. */
typedef struct family_ctx {
    zero_result after[2];
    char msg[2][700];
} family_ctx;

static zero_result family_rank(int rank, int world, zero_comm *comm, void *user)
{
    family_ctx *f = (family_ctx *)user;
    cudaStream_t st = NULL;
    float *d = NULL;
    zero_comm *child = NULL;
    zero_result r = ZERO_OK;
    (void)world;
    Z_TRY(rank_stream_buffer(&st, &d, 64));
    Z_TRY(zero_comm_split(comm, 0, rank, &child));
    Z_TRY(child->ops->all_reduce(child, d, d, 64, ZERO_F32, ZERO_OP_SUM, st));
    Z_TRY(zero_nccl_wait(child, 0));
    Z_TRY(zero_nccl_abort(child));
    f->after[rank] = comm->ops->all_reduce(comm, d, d, 64, ZERO_F32, ZERO_OP_SUM, st);
    snprintf(f->msg[rank], sizeof f->msg[rank], "%s", zero_last_error());
done:
    zero_comm_destroy(child);
    if (st) cudaStreamDestroy(st);
    cudaFree(d);
    return r;
}

ZT_TEST(family_fails_together)
{
    family_ctx f;
    char err[800];
    zero_result rc;
    int r;
    const char *why = cannot_run(2);
    if (why) ZT_SKIP(why);
    memset(&f, 0, sizeof f);
    f.after[0] = f.after[1] = ZERO_OK;
    rc = run_ranks(2, family_rank, &f, 60000, 0, NULL, err, sizeof err);
    ZT_CHECKF(rc == ZERO_OK, "%s", err);
    for (r = 0; r < 2; r++)
        ZT_CHECKF(f.after[r] == ZERO_ERROR_COMM && strstr(f.msg[r], "abort flag"), "rank %d: %s: %s", r,
                  zero_result_string(f.after[r]), f.msg[r]);
}

/* ---- engine runs: NCCL against the local comm ---- */

#define ET 6
static const size_t k_sizes[ET] = {37, 5, 1001, 3, 250, 7};
static const int k_groups[ET] = {0, 0, 1, 1, 2, 2};

typedef struct eng_cfg {
    int stage, world, steps, accum;
    zero_dtype dtype, comm_dtype;
    float lr;
    int backend; /* B_NCCL, B_GPU_LOCAL or B_HOST_LOCAL */
    int rpn, mics, hpz, qgz; /* ranks_per_node, mics_shard_size, hpz_partition_size,
                                quantized_gradients (0: off) */
} eng_cfg;

enum { B_NCCL = 0, B_GPU_LOCAL = 1, B_HOST_LOCAL = 2 };
static const char *k_backend[] = {"nccl", "local comm on the CUDA device", "local comm on the host device"};

typedef struct eng_out {
    const eng_cfg *cfg;
    float *master[ET];        /* merged over ranks */
    zero_step_info info[MAXR][16];
    zero_traffic traffic[MAXR]; /* the run's total, per rank */
    pthread_mutex_t mu;
    char err[1024];
} eng_out;

static double synth_grad(int rank, int micro, int step, size_t i, int t)
{
    double ph = 0.37 * (double)i + 1.3 * rank + 0.71 * micro + 0.19 * step + 0.5 * t;
    return 0.01 * (1.5 + sin(ph));
}

static zero_result engine_rank(int rank, int world, zero_comm *comm, void *user)
{
    eng_out *o = (eng_out *)user;
    const eng_cfg *c = o->cfg;
    zero_device *dev = NULL;
    zero_comm *dcomm = NULL; /* the local comm on device memory (reference runs) */
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_cuda_desc cd;
    zero_result r = ZERO_OK;
    const zero_plan *plan;
    int ids[ET], t, s, k, g, G;
    float *tmp = NULL;
    unsigned char *gh = NULL;
    (void)world;
    memset(&d, 0, sizeof d);
    memset(&cd, 0, sizeof cd);
    cd.device = rank % g_ndev;
    if (c->backend == B_HOST_LOCAL) {
        Z_TRY(zero_host_device_create(NULL, &dev));
    } else {
        Z_TRY(zero_cuda_device_create(&cd, &dev));
    }
    if (c->backend == B_GPU_LOCAL) {
        Z_TRY(zero_cuda_local_comm_create(comm, dev, &dcomm));
        comm = dcomm;
    }
    d.stage = c->stage;
    d.param_dtype = c->dtype;
    d.grad_comm_dtype = c->comm_dtype;
    d.accum_steps = c->accum;
    d.ranks_per_node = c->rpn;
    d.mics_shard_size = c->mics;
    d.hpz_partition_size = c->hpz;
    d.quantized_gradients = c->qgz;
    d.adam.lr = c->lr;
    d.adam.weight_decay = 0.01f;
    d.device = dev;
    d.comm = comm;
    Z_TRY(zero_engine_create(&d, &e));
    for (t = 0; t < ET; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        Z_TRY(zero_engine_add_tensor(e, name, k_sizes[t], k_groups[t], k_sizes[t] < 10 ? ZERO_TENSOR_NO_DECAY : 0, &ids[t]));
    }
    Z_TRY(zero_engine_commit(e));
    plan = zero_engine_plan(e);
    G = zero_plan_num_groups(plan);
    tmp = (float *)malloc(4096 * sizeof(float));
    gh = (unsigned char *)malloc(4096 * 4);
    if (!tmp || !gh) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host buffers");
        goto done;
    }
    for (t = 0; t < ET; t++) {
        size_t i;
        for (i = 0; i < k_sizes[t]; i++) tmp[i] = (float)(0.5 * sin(0.1 * (double)i + 0.7 * t + 0.3));
        Z_TRY(zero_engine_set_tensor(e, ids[t], tmp));
    }
    for (s = 0; s < c->steps; s++) {
        float scale = zero_engine_loss_scale(e);
        for (k = 0; k < c->accum; k++) {
            void *pp, *gp;
            for (g = 0; g < G; g++) {
                Z_TRY(zero_engine_gather(e, g, &pp));
                Z_TRY(zero_engine_release(e, g));
            }
            for (g = G - 1; g >= 0; g--) {
                Z_TRY(zero_engine_gather(e, g, &pp));
                Z_TRY(zero_engine_grads(e, g, &gp));
                for (t = 0; t < ET; t++) {
                    zero_tensor_info ti;
                    size_t i, es = zero_dtype_size(c->dtype);
                    if (k_groups[t] != g) continue;
                    Z_TRY(zero_plan_tensor(plan, ids[t], &ti));
                    for (i = 0; i < ti.numel; i++) tmp[i] = (float)(synth_grad(rank, k, s, i, t) * scale);
                    (void)zero_convert(gh, c->dtype, tmp, ZERO_F32, ti.numel, ZERO_SIMD_AUTO);
                    /* pageable source: the copy has read gh when upload returns */
                    Z_TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, (unsigned char *)gp + ti.offset * es, gh,
                                           ti.numel * es));
                }
                Z_TRY(zero_engine_release(e, g));
                Z_TRY(zero_engine_grads_ready(e, g));
            }
        }
        Z_TRY(zero_engine_step(e, &o->info[rank][s]));
    }
    Z_TRY(zero_engine_traffic(e, NULL, &o->traffic[rank]));
    for (t = 0; t < ET; t++) {
        zero_range rg;
        size_t i;
        Z_TRY(zero_engine_read_tensor(e, ids[t], ZERO_STATE_MASTER, tmp, &rg));
        pthread_mutex_lock(&o->mu);
        for (i = rg.offset; i < rg.offset + rg.numel; i++) o->master[t][i] = tmp[i];
        pthread_mutex_unlock(&o->mu);
    }
done:
    if (r != ZERO_OK && !o->err[0]) snprintf(o->err, sizeof o->err, "rank %d: %s", rank, zero_last_error());
    zero_engine_destroy(e);
    zero_comm_destroy(dcomm);
    zero_device_destroy(dev);
    free(tmp);
    free(gh);
    return r;
}

static zero_result local_engine_rank(int rank, zero_comm *comm, void *user)
{
    return engine_rank(rank, comm->world, comm, user);
}

static eng_out *engine_run(const eng_cfg *c, zero_result *rc)
{
    eng_out *o = (eng_out *)calloc(1, sizeof *o);
    char err[800];
    int t;
    o->cfg = c;
    pthread_mutex_init(&o->mu, NULL);
    for (t = 0; t < ET; t++) o->master[t] = (float *)calloc(k_sizes[t], sizeof(float));
    if (c->backend == B_NCCL) {
        *rc = run_ranks(c->world, engine_rank, o, 60000, 0, NULL, err, sizeof err);
        if (*rc != ZERO_OK && !o->err[0]) snprintf(o->err, sizeof o->err, "%s", err);
    } else {
        *rc = zero_local_run(c->world, local_engine_rank, o);
        if (*rc != ZERO_OK && !o->err[0]) snprintf(o->err, sizeof o->err, "%s", zero_last_error());
    }
    return o;
}

static void engine_free(eng_out *o)
{
    int t;
    for (t = 0; t < ET; t++) free(o->master[t]);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

/* Worst |a - b| over every master weight; at N = 1 also counts elements whose bits differ. */
static double engine_diff(const eng_out *a, const eng_out *b, size_t *where, int *bits_differ)
{
    double worst = 0;
    int t;
    size_t i;
    *bits_differ = 0;
    *where = 0;
    for (t = 0; t < ET; t++)
        for (i = 0; i < k_sizes[t]; i++) {
            double dlt = fabs((double)a->master[t][i] - (double)b->master[t][i]);
            if (memcmp(&a->master[t][i], &b->master[t][i], 4) != 0) (*bits_differ)++;
            if (!(dlt <= worst)) {
                worst = dlt;
                *where = i;
            }
        }
    return worst;
}

/* The same engine run over NCCL and over the local comm (on the CUDA device, and on the
   host device), at the same N: bit-identical at N = 1, within the tolerance above at N > 1. */
static void compare_engine(int stage, int world, zero_dtype dtype, zero_dtype comm_dtype, double per_step)
{
    eng_cfg c;
    eng_out *out[3];
    zero_result rc[3];
    double tol;
    int s, k, b;
    const char *why = cannot_run(world);
    if (why) ZT_SKIP(why);
    memset(&c, 0, sizeof c);
    c.stage = stage;
    c.world = world;
    c.steps = 5;
    c.accum = 2;
    c.dtype = dtype;
    c.comm_dtype = comm_dtype;
    c.lr = 1e-3f;
    for (b = 0; b < 3; b++) {
        c.backend = b;
        out[b] = engine_run(&c, &rc[b]);
        ZT_CHECKF(rc[b] == ZERO_OK, "stage %d N=%d over the %s: %s", stage, world, k_backend[b], out[b]->err);
    }
    tol = world == 1 ? 0.0 : 1e-6 + c.steps * (double)c.lr * per_step;
    for (b = 1; b < 3 && rc[0] == ZERO_OK; b++) {
        size_t where;
        int differ;
        double worst;
        if (rc[b] != ZERO_OK) continue;
        worst = engine_diff(out[0], out[b], &where, &differ);
        ZT_CHECKF(worst <= tol && (world > 1 || differ == 0),
                  "stage %d N=%d %s/%s: nccl vs %s: worst |diff| %.3g at [%zu] (tol %.3g), %d elements "
                  "with other bits",
                  stage, world, zero_dtype_name(dtype), zero_dtype_name(comm_dtype), k_backend[b], worst, where,
                  tol, differ);
        for (s = 0; s < c.steps; s++)
            for (k = 0; k < world; k++) {
                const zero_step_info *x = &out[0]->info[k][s], *y = &out[b]->info[k][s];
                ZT_CHECK(x->skipped == y->skipped && x->loss_scale == y->loss_scale);
                ZT_CHECKF(fabs(x->grad_norm - y->grad_norm) <= 1e-3 * fabs(y->grad_norm) + 1e-7,
                          "step %d rank %d: norm %g (nccl) vs %g (%s)", s, k, (double)x->grad_norm,
                          (double)y->grad_norm, k_backend[b]);
            }
    }
    for (b = 0; b < 3; b++) engine_free(out[b]);
}

ZT_TEST(engine_1_rank_identical)
{
    compare_engine(3, 1, ZERO_F16, ZERO_DTYPE_DEFAULT, 0);
    compare_engine(1, 1, ZERO_BF16, ZERO_DTYPE_DEFAULT, 0);
}

ZT_TEST(engine_2_ranks)
{
    compare_engine(0, 2, ZERO_F16, ZERO_F32, 1e-4);
    compare_engine(2, 2, ZERO_BF16, ZERO_F32, 1e-4);
    compare_engine(3, 2, ZERO_F16, ZERO_DTYPE_DEFAULT, 4e-3);
}

ZT_TEST(engine_4_ranks)
{
    compare_engine(1, 4, ZERO_F16, ZERO_F32, 1e-4);
    compare_engine(3, 4, ZERO_F16, ZERO_F32, 1e-4);
}

/* ---- hierarchical ZeRO on NCCL: MiCS, hpZ, qgZ against the local comm ----

   The same engine run on the NCCL comm and on zero_cuda.h's device comm (CUDA device), and
   on the local comm (host device),
   at N = 4 as 2 nodes x 2: MiCS (shard groups of 2 at stages 1-3), hpZ (stage 3,
   secondary partition of 2) and qgZ (int4 gradient blocks, stages 2 and 3). Under the
   harness NCCL sums in rank order like the local comm, so the master weights must be the
   same bits; on a GPU NCCL's order differs, so within the tolerance of compare_engine
   (qgZ's sum is the device's, in rank order, after an all_to_all that only copies). */
static double inter_sum(const zero_traffic *t)
{
    double b = 0;
    int i;
    for (i = 0; i < ZERO_COLL_COUNT; i++) b += t->inter_bytes[i];
    return b;
}

static void compare_hier(const char *mode, int stage, int rpn, int mics, int hpz, int qgz, zero_dtype comm_dtype)
{
    /* NCCL and zero_cuda.h's device comm, each against the local comm on the host */
    static const int backends[3] = {B_NCCL, B_GPU_LOCAL, B_HOST_LOCAL};
    eng_cfg c;
    eng_out *out[3];
    zero_result rc[3];
    int s, k, b, o, differ = 0;
    size_t where = 0;
    double worst, tol;
    const char *why = cannot_run(4);
    if (why) ZT_SKIP(why);
    memset(&c, 0, sizeof c);
    c.stage = stage;
    c.world = 4;
    c.steps = zt_quick() ? 3 : 5;
    c.accum = 2;
    c.dtype = ZERO_F16;
    c.comm_dtype = comm_dtype;
    c.lr = 1e-3f;
    c.rpn = rpn, c.mics = mics, c.hpz = hpz, c.qgz = qgz;
    for (b = 0; b < 3; b++) {
        c.backend = backends[b];
        out[b] = engine_run(&c, &rc[b]);
        ZT_CHECKF(rc[b] == ZERO_OK, "%s stage %d over the %s: %s", mode, stage, k_backend[c.backend], out[b]->err);
    }
    for (o = 0; o < 2; o++) {
        const char *name = k_backend[backends[o]];
        if (rc[o] != ZERO_OK || rc[2] != ZERO_OK) continue;
        worst = engine_diff(out[o], out[2], &where, &differ);
#ifdef CUDASIM
        tol = 0.0;
        ZT_CHECKF(differ == 0, "%s stage %d: %d master weights on the %s differ from the local comm's (worst %.3g at [%zu])",
                  mode, stage, differ, name, worst, where);
#else
        tol = 1e-6 + c.steps * (double)c.lr * (qgz ? 1e-4 : 4e-3);
#endif
        ZT_CHECKF(worst <= tol, "%s stage %d: worst |%s - local| %.3g at [%zu] (tol %.3g)", mode, stage, name, worst,
                  where, tol);
        for (k = 0; k < c.world; k++) /* the counters see the same collectives on either comm */
            ZT_CHECKF(memcmp(&out[o]->traffic[k], &out[2]->traffic[k], sizeof out[o]->traffic[k]) == 0,
                      "%s stage %d rank %d: traffic counters differ (inter-node bytes %.0f on the %s, %.0f on the "
                      "local comm)",
                      mode, stage, k, inter_sum(&out[o]->traffic[k]), name, inter_sum(&out[2]->traffic[k]));
        for (s = 0; s < c.steps; s++)
            for (k = 0; k < c.world; k++) {
                const zero_step_info *x = &out[o]->info[k][s], *y = &out[2]->info[k][s];
                ZT_CHECKF(x->skipped == y->skipped && x->loss_scale == y->loss_scale, "%s step %d rank %d (%s)", mode,
                          s, k, name);
#ifdef CUDASIM
                ZT_CHECKF(memcmp(&x->grad_norm, &y->grad_norm, sizeof x->grad_norm) == 0,
                          "%s step %d rank %d: norm %.9g (%s) vs %.9g (local)", mode, s, k, (double)x->grad_norm,
                          name, (double)y->grad_norm);
#endif
            }
    }
    for (b = 0; b < 3; b++) engine_free(out[b]);
}

ZT_TEST(engine_mics_4_ranks)
{
    compare_hier("MiCS S=2", 1, 2, 2, 0, 0, ZERO_F32);
    compare_hier("MiCS S=2", 2, 2, 2, 0, 0, ZERO_F16);
    compare_hier("MiCS S=2", 3, 2, 2, 0, 0, ZERO_F32);
}

ZT_TEST(engine_hpz_4_ranks) { compare_hier("hpZ S=2", 3, 2, 0, 2, 0, ZERO_F32); }

ZT_TEST(engine_qgz_4_ranks)
{
    compare_hier("qgZ", 2, 2, 0, 0, 1, ZERO_DTYPE_DEFAULT);
    compare_hier("qgZ", 3, 2, 0, 0, 1, ZERO_DTYPE_DEFAULT);
}

ZT_TEST(test_nccl) { ZT_SKIP("no GPU visible"); }

int main(void)
{
    if (zero_cuda_device_probe(&g_ndev) != ZERO_OK) { /* skip only without a GPU */
        printf("  FAIL: %s\n", zero_last_error());
        printf("zt: 0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    if (g_ndev <= 0) {
        ZT_RUN(test_nccl);
        return zt_summary();
    }
    /* several ranks of one communicator per GPU (NCCL >= 2.30); set before NCCL starts */
    setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 0);
    alarm(900); /* a hang is a failure, never a stuck CI job */
    g_version = zero_nccl_version();
    printf("  NCCL %d, %d GPU(s)\n", g_version, g_ndev);
    ZT_RUN(create_arguments);
    ZT_RUN(collectives_exact_1_rank);
    ZT_RUN(one_rank_misuse_and_abort);
    ZT_RUN(engine_1_rank_identical);
    ZT_RUN(collectives_exact_2_ranks);
    ZT_RUN(collectives_exact_4_ranks);
    ZT_RUN(all_reduce_tolerance_2_ranks);
    ZT_RUN(all_reduce_tolerance_4_ranks);
    ZT_RUN(tcp_bootstrap_2_ranks);
    ZT_RUN(engine_2_ranks);
    ZT_RUN(engine_4_ranks);
    ZT_RUN(split_4_ranks);
    ZT_RUN(all_to_all_exact);
    ZT_RUN(family_fails_together);
    ZT_RUN(engine_mics_4_ranks);
    ZT_RUN(engine_hpz_4_ranks);
    ZT_RUN(engine_qgz_4_ranks);
    ZT_RUN(timeout_wait_no_watchdog);
    ZT_RUN(timeout_watchdog_unblocks_stream_sync);
    ZT_RUN(timeout_first_collective);
    ZT_RUN(timeout_split_peer_never_joins);
    ZT_RUN(timeout_all_to_all_peer_never_joins);
    ZT_RUN(timeout_clock_starts_after_previous);
    ZT_RUN(mismatched_counts_fail);
    return zt_summary();
}
