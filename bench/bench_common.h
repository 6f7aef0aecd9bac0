/* bench/bench_common.h: what the CPU benchmarks share. Include after zero.h (whose
   implementation selects the POSIX names, clock_gettime among them). */
#ifndef ZERO_BENCH_COMMON_H
#define ZERO_BENCH_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_clock(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds on the monotonic clock (differences of two calls time an interval). */
static inline double bench_now(void) { return bench_clock(CLOCK_MONOTONIC); }

/* The calling thread's CPU seconds: a single-threaded kernel's time that a loaded machine
   barely changes (it delays the thread, it does not make it run longer). */
static inline double bench_thread_cpu(void) { return bench_clock(CLOCK_THREAD_CPUTIME_ID); }

/* Whether fio is on PATH (the NVMe benches measure the disk with it in the same run and
   print a skip line without it). */
static inline int bench_have_fio(void) { return system("command -v fio >/dev/null 2>&1") == 0; }

/* One fio job as zero's I/O engine runs its I/O (O_DIRECT, io_uring, one job): rw "write" or
   "read" of 'size' bytes of file, blocks of 'block' bytes, 'depth' deep. Bytes per second
   (the job's bw_bytes), or < 0 on failure. */
static inline double bench_fio(const char *file, uint64_t size, size_t block, int depth, const char *rw)
{
    char cmd[1200], line[4096];
    FILE *p;
    double bw = -1.0;
    const char *key = strcmp(rw, "write") == 0 ? "\"write\"" : "\"read\"";
    int in_section = 0;
    snprintf(cmd, sizeof cmd,
             "fio --name=zero-bench --filename=%s --size=%llu --bs=%zu --iodepth=%d --direct=1 "
             "--ioengine=io_uring --rw=%s --numjobs=1 --output-format=json 2>/dev/null",
             file, (unsigned long long)size, block, depth, rw);
    p = popen(cmd, "r");
    if (!p) return -1.0;
    while (fgets(line, sizeof line, p)) { /* the job's "read" or "write" object: its bw_bytes */
        if (strstr(line, key) && strchr(line, '{')) in_section = 1;
        if (in_section) {
            const char *b = strstr(line, "\"bw_bytes\"");
            if (b && (b = strchr(b, ':')) != NULL) {
                bw = strtod(b + 1, NULL);
                in_section = 0;
            }
        }
    }
    if (pclose(p) != 0) return -1.0;
    return bw;
}


/* ---- ZERO_BENCH_INFINITY: bench_infinity's model and training loop ------------------------
   Defined by bench/bench_infinity.c, bench/bench_overlap.c and tests/test_infinity.c before
   including this file (after zero.h): G groups of one bf16 tensor each, a loss pulling each
   param towards a fixed target, optional matrix products per layer (--tokens), trained at
   stage 3 with or without the NVMe tiers on R ranks (threads). bench/bench_infinity.c's
   first comment describes it; ZERO_BENCH_INFINITY_TOOLS adds the programs' helpers. */
#ifdef ZERO_BENCH_INFINITY
#ifndef ZERO_BENCH_INFINITY_DONE
#define ZERO_BENCH_INFINITY_DONE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INF_MAX_STEPS 16

typedef struct inf_cfg {
    uint64_t params;   /* Psi */
    int groups, ranks, steps;
    const char *dir;   /* nvme_path */
    int plain;         /* 1: no offload, no budget */
    int grads_nvme;    /* 1: offload_gradients = nvme (else the host tier of the gradients) */
    size_t budget;     /* device bytes per rank (0: none) */
    int quiet;
    int tokens;           /* > 0: each layer's matrix products over this many tokens */
    int params_on_device; /* with offload: optimizer state on NVMe, params on the device */
} inf_cfg;

typedef struct inf_result {
    zero_result rc;
    char err[512];
    double loss[INF_MAX_STEPS + 1]; /* the loss at the forward of step s; [steps]: after the last */
    double step_s[INF_MAX_STEPS], fwd_s[INF_MAX_STEPS], bwd_s[INF_MAX_STEPS], opt_s[INF_MAX_STEPS];
    uint64_t io_read[INF_MAX_STEPS], io_written[INF_MAX_STEPS];
    double bwd_gather_s[INF_MAX_STEPS]; /* of the backward: time inside zero_engine_gather */
    double bwd_work_s[INF_MAX_STEPS];   /* of the backward: the layers' matrix products */
    double bwd_read_wait_s[INF_MAX_STEPS]; /* of the backward: the engine's wait for shard reads */
    uint64_t bwd_reads_demand[INF_MAX_STEPS]; /* of the backward: shard reads not issued ahead */
    double flops;                       /* of one step's layer products (forward + backward) */
    double sink;                        /* a checksum of the products (keeps them computed) */
    zero_gather_stats gstats;           /* rank 0, at the end */
    zero_engine_memory dev, host, nvme; /* rank 0 */
    uint64_t param_hash;                /* FNV-1a over every rank's final param bits */
    double commit_s;
} inf_result;

typedef struct inf_run {
    const inf_cfg *cfg;
    inf_result *res;
    double loss_part[64][INF_MAX_STEPS + 1]; /* per rank */
    uint64_t hash_part[64];
} inf_run;

/* The target of element i of layer g: cheap integer hash in [-0.05, 0.05). */
static float inf_target(int g, size_t i)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)g * 0x9E3779B9u;
    h ^= h >> 15;
    return ((float)(h & 1023u) / 1024.0f - 0.5f) * 0.1f;
}

static float inf_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* out[m][n] += sum over k of A(m, k) B[k][n] for m < M, n < N, k < K, with A(m, k) at
   a[m * am + k * ak] (so A may be read transposed), B row-major (row length N), out row-major
   (row length N). Blocks of 4 rows x 32 columns accumulate in locals the compiler keeps in
   vector registers. */
static void inf_gemm(float *out, const float *a, size_t am, size_t ak, const float *b, size_t M, size_t N,
                     size_t K)
{
    size_t m, n0, k, r, j;
    for (m = 0; m < M; m += 4) {
        size_t mr = M - m < 4 ? M - m : 4;
        for (n0 = 0; n0 < N; n0 += 32) {
            size_t nn = N - n0 < 32 ? N - n0 : 32;
            float acc[4][32];
            memset(acc, 0, sizeof acc);
            for (k = 0; k < K; k++) {
                const float *bk = b + k * N + n0;
                for (r = 0; r < mr; r++) {
                    float av = a[(m + r) * am + k * ak];
                    if (nn == 32)
                        for (j = 0; j < 32; j++) acc[r][j] += av * bk[j];
                    else
                        for (j = 0; j < nn; j++) acc[r][j] += av * bk[j];
                }
            }
            for (r = 0; r < mr; r++)
                for (j = 0; j < nn; j++) out[(m + r) * N + n0 + j] += acc[r][j];
        }
    }
}

/* out[m][n] += sum over k of a[m][k] b[n][k] (rows of length K, a multiple of 8): blocks of
   2 x 4 outputs, each summed in 8 lanes (vector registers) and the lanes added at the end. */
static void inf_gemm_nt(float *out, const float *a, const float *b, size_t M, size_t N, size_t K)
{
    size_t m, n, k, r, c, j;
    for (m = 0; m < M; m += 2) {
        size_t mr = M - m < 2 ? M - m : 2;
        for (n = 0; n < N; n += 4) {
            size_t nc = N - n < 4 ? N - n : 4;
            float acc[2][4][8];
            memset(acc, 0, sizeof acc);
            if (mr == 2 && nc == 4) {
                for (k = 0; k < K; k += 8)
                    for (r = 0; r < 2; r++)
                        for (c = 0; c < 4; c++)
                            for (j = 0; j < 8; j++) acc[r][c][j] += a[(m + r) * K + k + j] * b[(n + c) * K + k + j];
            } else {
                for (k = 0; k < K; k += 8)
                    for (r = 0; r < mr; r++)
                        for (c = 0; c < nc; c++)
                            for (j = 0; j < 8; j++) acc[r][c][j] += a[(m + r) * K + k + j] * b[(n + c) * K + k + j];
            }
            for (r = 0; r < mr; r++)
                for (c = 0; c < nc; c++) {
                    float t = 0.0f;
                    for (j = 0; j < 8; j++) t += acc[r][c][j];
                    out[(m + r) * N + n + c] += t;
                }
        }
    }
}

#define INF_COLS 1024 /* a layer's n params are a [n / INF_COLS, INF_COLS] weight */

/* One rank's buffers for the layers' products (tokens > 0). */
typedef struct inf_work {
    size_t tokens, din, dout;
    float *w, *x, *dy, *y, *dx, *dw;
} inf_work;

static void inf_work_free(inf_work *k)
{
    free(k->w);
    free(k->x);
    free(k->dy);
    free(k->y);
    free(k->dx);
    free(k->dw);
    memset(k, 0, sizeof *k);
}

static int inf_work_init(inf_work *k, size_t tokens, size_t n)
{
    size_t i;
    memset(k, 0, sizeof *k);
    k->tokens = tokens;
    k->dout = INF_COLS;
    k->din = n / INF_COLS;
    if (tokens == 0 || k->din == 0) return 0;
    k->w = (float *)malloc(k->din * k->dout * sizeof(float));
    k->dw = (float *)malloc(k->din * k->dout * sizeof(float));
    k->x = (float *)malloc(tokens * k->din * sizeof(float));
    k->dx = (float *)malloc(tokens * k->din * sizeof(float));
    k->dy = (float *)malloc(tokens * k->dout * sizeof(float));
    k->y = (float *)malloc(tokens * k->dout * sizeof(float));
    if (!k->w || !k->dw || !k->x || !k->dx || !k->dy || !k->y) {
        inf_work_free(k);
        return -1;
    }
    for (i = 0; i < tokens * k->din; i++) k->x[i] = inf_target(7, i);
    for (i = 0; i < tokens * k->dout; i++) k->dy[i] = inf_target(11, i);
    return 0;
}

/* The layer's products on its gathered bf16 params w: forward y = x W (2 T n FLOPs), or
   backward dx = dy W^T and dW = x^T dy (4 T n). Returns a checksum of the result. */
static double inf_work_layer(inf_work *k, const uint16_t *w, int backward)
{
    size_t i, T = k->tokens, I = k->din, O = k->dout;
    double s = 0.0;
    if (!k->w) return 0.0;
    (void)zero_convert(k->w, ZERO_F32, w, ZERO_BF16, I * O, ZERO_SIMD_AUTO);
    if (!backward) {
        memset(k->y, 0, T * O * sizeof(float));
        inf_gemm(k->y, k->x, I, 1, k->w, T, O, I);
        for (i = 0; i < T * O; i += 97) s += k->y[i];
        return s;
    }
    memset(k->dx, 0, T * I * sizeof(float));
    memset(k->dw, 0, I * O * sizeof(float));
    inf_gemm_nt(k->dx, k->dy, k->w, T, I, O); /* dx[t][i] = sum_o dy[t][o] W[i][o] */
    inf_gemm(k->dw, k->x, 1, I, k->dy, I, O, T);
    for (i = 0; i < T * I; i += 97) s += k->dx[i];
    for (i = 0; i < I * O; i += 997) s += k->dw[i];
    return s;
}

#define INF_TRY(call)                                                                        \
    do {                                                                                     \
        zero_result r_ = (call);                                                             \
        if (r_ != ZERO_OK) {                                                                 \
            if (rank == 0) snprintf(R->res->err, sizeof R->res->err, "%.60s: %.400s", #call, zero_last_error()); \
            rc = r_;                                                                         \
            goto out;                                                                        \
        }                                                                                    \
    } while (0)

static zero_result inf_rank(int rank, zero_comm *comm, void *user)
{
    inf_run *R = (inf_run *)user;
    const inf_cfg *c = R->cfg;
    zero_host_device_desc hd;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL;
    zero_result rc = ZERO_OK;
    size_t n = (size_t)(c->params / (uint64_t)c->groups), i;
    int g, s;
    double t0, t1;
    zero_io_stats a, b;
    inf_work wk;
    zero_gather_stats gs0, gs1;
    double sink = 0.0;
    memset(&wk, 0, sizeof wk);
    memset(&gs0, 0, sizeof gs0);
    memset(&gs1, 0, sizeof gs1);
    memset(&hd, 0, sizeof hd);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    hd.capacity = c->plain ? 0 : c->budget;
    INF_TRY(zero_host_device_create(&hd, &dev));
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.param_dtype = ZERO_BF16;
    d.device = dev;
    d.comm = comm;
    d.adam.lr = 1e-2f;
    if (!c->plain) {
        d.offload_optimizer = ZERO_OFFLOAD_NVME;
        d.offload_param = c->params_on_device ? ZERO_OFFLOAD_NONE : ZERO_OFFLOAD_NVME;
        d.offload_gradients = c->grads_nvme ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_NONE;
        d.nvme_path = c->dir;
        d.host_threads = 2;
    }
    INF_TRY(zero_engine_create(&d, &e));
    if (inf_work_init(&wk, c->tokens > 0 ? (size_t)c->tokens : 0, n) != 0) {
        rc = ZERO_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    if (rank == 0) R->res->flops = 6.0 * (double)wk.tokens * (double)(wk.din * wk.dout) * c->groups;
    for (g = 0; g < c->groups; g++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d.w", g);
        INF_TRY(zero_engine_add_tensor(e, name, n, g, 0, NULL));
    }
    t0 = bench_now();
    INF_TRY(zero_engine_commit(e)); /* params, master, m, v start at zero: no init written */
    if (rank == 0) R->res->commit_s = bench_now() - t0;
    for (s = 0; s <= c->steps; s++) {
        double loss = 0.0;
        /* forward: the loss (every rank the same) */
        INF_TRY(zero_engine_nvme_stats(e, &a)); /* the iteration's NVMe bytes, reads of params too */
        t0 = bench_now();
        for (g = 0; g < c->groups; g++) {
            void *p;
            const uint16_t *w;
            double sum = 0.0;
            INF_TRY(zero_engine_gather(e, g, &p));
            w = (const uint16_t *)p;
            for (i = 0; i < n; i++) {
                float dlt = inf_bf16(w[i]) - inf_target(g, i);
                sum += (double)(dlt * dlt);
            }
            loss += 0.5 * sum / (double)n;
            if (s < c->steps) sink += inf_work_layer(&wk, w, 0);
            INF_TRY(zero_engine_release(e, g));
        }
        R->loss_part[rank][s] = loss;
        if (s == c->steps) break; /* the loss after the last step */
        t1 = bench_now();
        if (rank == 0) R->res->fwd_s[s] = t1 - t0;
        /* backward, last layer first: dL/dp = (p - t) / n */
        if (rank == 0) R->res->bwd_gather_s[s] = R->res->bwd_work_s[s] = 0.0;
        INF_TRY(zero_engine_gather_stats(e, &gs0));
        for (g = c->groups - 1; g >= 0; g--) {
            void *p, *dg;
            const uint16_t *w;
            float *tmp;
            double tg = bench_now(), tw;
            INF_TRY(zero_engine_gather(e, g, &p));
            tw = bench_now();
            if (rank == 0) R->res->bwd_gather_s[s] += tw - tg;
            INF_TRY(zero_engine_grads(e, g, &dg));
            w = (const uint16_t *)p;
            sink += inf_work_layer(&wk, w, 1);
            if (rank == 0) R->res->bwd_work_s[s] += bench_now() - tw;
            tmp = (float *)malloc(((size_t)1 << 16) * sizeof *tmp);
            if (!tmp) {
                rc = ZERO_ERROR_OUT_OF_MEMORY;
                goto out;
            }
            for (i = 0; i < n; i += (size_t)1 << 16) { /* in chunks, rounded to bf16 at once */
                size_t k, m = n - i < ((size_t)1 << 16) ? n - i : ((size_t)1 << 16);
                for (k = 0; k < m; k++) tmp[k] = (inf_bf16(w[i + k]) - inf_target(g, i + k)) / (float)n;
                (void)zero_convert((uint16_t *)dg + i, ZERO_BF16, tmp, ZERO_F32, m, ZERO_SIMD_AUTO);
            }
            free(tmp);
            INF_TRY(zero_engine_release(e, g));
            INF_TRY(zero_engine_grads_ready(e, g));
        }
        t0 = bench_now();
        INF_TRY(zero_engine_gather_stats(e, &gs1));
        if (rank == 0) {
            R->res->bwd_s[s] = t0 - t1;
            R->res->bwd_read_wait_s[s] = gs1.nvme_read_wait_s - gs0.nvme_read_wait_s;
            R->res->bwd_reads_demand[s] = gs1.nvme_reads_demand - gs0.nvme_reads_demand;
        }
        INF_TRY(zero_engine_step(e, NULL));
        t1 = bench_now();
        INF_TRY(zero_engine_nvme_stats(e, &b));
        if (rank == 0) {
            R->res->opt_s[s] = t1 - t0;
            R->res->step_s[s] = R->res->fwd_s[s] + R->res->bwd_s[s] + R->res->opt_s[s];
            R->res->io_read[s] = b.bytes_read - a.bytes_read;
            R->res->io_written[s] = b.bytes_written - a.bytes_written;
        }
    }
    if (rank == 0) {
        INF_TRY(zero_engine_memory_tier(e, ZERO_TIER_DEVICE, &R->res->dev));
        INF_TRY(zero_engine_memory_tier(e, ZERO_TIER_HOST, &R->res->host));
        INF_TRY(zero_engine_memory_tier(e, ZERO_TIER_NVME, &R->res->nvme));
        INF_TRY(zero_engine_gather_stats(e, &R->res->gstats));
        R->res->sink = sink;
    }
    { /* the final params: a hash of this rank's shards (rank order combined by the caller) */
        uint64_t h = 1469598103934665603ull;
        uint16_t *buf = (uint16_t *)malloc(n * sizeof *buf);
        zero_range rg;
        if (!buf) {
            rc = ZERO_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        for (g = 0; g < c->groups; g++) {
            INF_TRY(zero_engine_read_tensor(e, g, ZERO_STATE_PARAM, buf, &rg));
            for (i = rg.offset; i < rg.offset + rg.numel; i++) h = (h ^ buf[i]) * 1099511628211ull;
        }
        free(buf);
        R->hash_part[rank] = h;
    }
out:
    inf_work_free(&wk);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return rc;
}

/* Trains the model; fills res. */
static zero_result inf_train(const inf_cfg *c, inf_result *res)
{
    inf_run *R = (inf_run *)calloc(1, sizeof *R);
    zero_local_desc ld;
    int s, r;
    if (!R) return ZERO_ERROR_OUT_OF_MEMORY;
    memset(res, 0, sizeof *res);
    if (c->ranks < 1 || c->ranks > 64 || c->steps < 1 || c->steps > INF_MAX_STEPS || c->groups < 1) {
        free(R);
        snprintf(res->err, sizeof res->err, "ranks 1..64, steps 1..%d, groups >= 1", INF_MAX_STEPS);
        return res->rc = ZERO_ERROR_INVALID_ARGUMENT;
    }
    R->cfg = c;
    R->res = res;
    memset(&ld, 0, sizeof ld);
    ld.world = c->ranks;
    ld.timeout_ms = 3600 * 1000; /* a rank may wait for a peer's I/O for long at large Psi */
    res->rc = zero_local_run_desc(&ld, inf_rank, R);
    if (res->rc != ZERO_OK && !res->err[0]) snprintf(res->err, sizeof res->err, "%s", zero_last_error());
    for (s = 0; s <= c->steps; s++) res->loss[s] = R->loss_part[0][s];
    res->param_hash = 1469598103934665603ull;
    for (r = 0; r < c->ranks; r++) res->param_hash = (res->param_hash ^ R->hash_part[r]) * 1099511628211ull;
    free(R);
    return res->rc;
}

#ifdef ZERO_BENCH_INFINITY_TOOLS /* the programs' own: the disk's rates, sizes like 4B */

/* Sequential write then read of 'bytes' through the engine's I/O engine (O_DIRECT, 1 MiB,
   queue depth 8, 16 MiB transfers kept 8 deep): the disk's rates for the I/O bound. */
static int inf_disk_rates(const char *dir, uint64_t bytes, double *wr, double *rd)
{
    zero_io *io = NULL;
    zero_io_file *f = NULL;
    zero_io_desc dsc;
    void *buf = NULL;
    size_t tile = (size_t)16 << 20;
    uint64_t off;
    zero_io_ticket t[8];
    int k;
    double t0;
    memset(&dsc, 0, sizeof dsc);
    memset(t, 0, sizeof t);
    if (zero_io_create(&dsc, &io) != ZERO_OK) return -1;
    if (zero_io_file_create(io, dir, "rate", 0, bytes, &f) != ZERO_OK ||
        zero_io_buffer_alloc(io, tile * 8, &buf) != ZERO_OK) {
        zero_io_file_destroy(f);
        zero_io_destroy(io);
        return -1;
    }
    memset(buf, 0x5a, tile * 8);
    t0 = bench_now();
    for (off = 0, k = 0; off + tile <= bytes; off += tile, k = (k + 1) % 8) {
        if (t[k]) (void)zero_io_wait(io, t[k]);
        if (zero_io_write(f, off, (unsigned char *)buf + (size_t)k * tile, tile, &t[k]) != ZERO_OK) t[k] = 0;
    }
    (void)zero_io_wait_all(io);
    *wr = (double)bytes / (bench_now() - t0);
    memset(t, 0, sizeof t);
    t0 = bench_now();
    for (off = 0, k = 0; off + tile <= bytes; off += tile, k = (k + 1) % 8) {
        if (t[k]) (void)zero_io_wait(io, t[k]);
        if (zero_io_read(f, off, (unsigned char *)buf + (size_t)k * tile, tile, &t[k]) != ZERO_OK) t[k] = 0;
    }
    (void)zero_io_wait_all(io);
    *rd = (double)bytes / (bench_now() - t0);
    zero_io_buffer_free(io, buf);
    zero_io_file_destroy(f);
    zero_io_destroy(io);
    return 0;
}

static uint64_t inf_parse(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1e3;
    else if (*end == 'M' || *end == 'm') v *= 1e6;
    else if (*end == 'G' || *end == 'g' || *end == 'B' || *end == 'b') v *= 1e9;
    if (end[0] && (end[1] == 'i' || end[1] == 'I')) v = v / 1e9 * 1073741824.0; /* GiB */
    return (uint64_t)v;
}

#endif /* ZERO_BENCH_INFINITY_TOOLS */

#endif /* ZERO_BENCH_INFINITY_DONE */
#endif /* ZERO_BENCH_INFINITY */

#endif
