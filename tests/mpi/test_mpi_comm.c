/* test_mpi_comm.c - zero_mpi.h's collectives under mpirun (2, 3 and 4 processes).

   Every collective, dtype (f32, f16, bf16, f64), op, size (0, 1, odd, > one slice) and
   in-place form is compared bit for bit with the local comm (zero.h's ranks as threads, the
   reference the engine's determinism rests on): each process runs the same call on
   'world' threads in-process with every rank's inputs and checks its own rank's output.
   Then the failure paths: mismatches (kind, count, dtype, tag) on every rank, invalid
   arguments, a rank that aborts or leaves, the device-memory path over the host device,
   and last a rank that never joins in time (ZERO_ERROR_TIMEOUT, no hang). */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_MPI_IMPLEMENTATION
#include "zero_mpi.h"
#include "tests/mpi/zt_mpi.h"

#include <dirent.h>

enum { K_AG, K_RS, K_AR, K_BC, K_A2A };
static const char *const kname[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all"};

typedef struct ccase {
    int kind, inplace, root;
    zero_dtype dtype;
    zero_op op;
    size_t numel;
} ccase;

/* Rank r's input element i as fp64: mixed signs and magnitudes, so rounding order shows. */
static double in_value(const ccase *c, int r, size_t i)
{
    unsigned long long z = (unsigned long long)(r + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull) ^
                           ((unsigned long long)c->kind << 40) ^ ((unsigned long long)c->dtype << 48);
    double u;
    z ^= z >> 31;
    z *= 0x94d049bb133111ebull;
    z ^= z >> 29;
    u = (double)(z >> 11) * (1.0 / 9007199254740992.0);
    return (u - 0.5) * ((i % 7) == 0 ? 300.0 : (i % 3) == 0 ? 0.01 : 3.0);
}

static void put(void *p, zero_dtype dt, size_t i, double x)
{
    if (dt == ZERO_F64) ((double *)p)[i] = x;
    else if (dt == ZERO_F32) ((float *)p)[i] = (float)x;
    else if (dt == ZERO_F16) ((uint16_t *)p)[i] = zero_f32_to_f16((float)x);
    else ((uint16_t *)p)[i] = zero_f32_to_bf16((float)x);
}

/* Sizes of rank r's buffers: the allocation and the bytes the output covers. */
static size_t alloc_numel(const ccase *c, int world)
{
    return (c->kind == K_AG || c->kind == K_RS || c->kind == K_A2A) ? c->numel * (size_t)world : c->numel;
}

/* Runs case c on comm (rank, world) with inputs from in_value; out gets the output bytes
   (recv, or the whole buffer for broadcast / in-place all_gather); returns the result. */
static zero_result run_case(zero_comm *comm, const ccase *c, unsigned char *out, size_t *out_bytes)
{
    int rank = comm->rank, world = comm->world;
    size_t es = zero_dtype_size(c->dtype), n = c->numel, i, big = alloc_numel(c, world);
    unsigned char *a = (unsigned char *)calloc(big * es + 16, 1), *b = (unsigned char *)calloc(big * es + 16, 1);
    zero_result r = ZERO_OK;
    for (i = 0; i < big * es; i++) b[i] = (unsigned char)(0xa5 ^ rank); /* garbage in recv */
    switch (c->kind) {
    case K_AG:
        if (c->inplace) {
            for (i = 0; i < n; i++) put(b + (size_t)rank * n * es, c->dtype, i, in_value(c, rank, i));
            r = comm->ops->all_gather(comm, b + (size_t)rank * n * es, b, n, c->dtype, NULL);
        } else {
            for (i = 0; i < n; i++) put(a, c->dtype, i, in_value(c, rank, i));
            r = comm->ops->all_gather(comm, a, b, n, c->dtype, NULL);
        }
        memcpy(out, b, big * es);
        *out_bytes = big * es;
        break;
    case K_RS:
        for (i = 0; i < big; i++) put(a, c->dtype, i, in_value(c, rank, i));
        if (c->inplace) {
            r = comm->ops->reduce_scatter(comm, a, a + (size_t)rank * n * es, n, c->dtype, c->op, NULL);
            memcpy(out, a + (size_t)rank * n * es, n * es);
        } else {
            r = comm->ops->reduce_scatter(comm, a, b, n, c->dtype, c->op, NULL);
            memcpy(out, b, n * es);
        }
        *out_bytes = n * es;
        break;
    case K_AR:
        for (i = 0; i < n; i++) put(a, c->dtype, i, in_value(c, rank, i));
        r = comm->ops->all_reduce(comm, a, c->inplace ? a : b, n, c->dtype, c->op, NULL);
        memcpy(out, c->inplace ? a : b, n * es);
        *out_bytes = n * es;
        break;
    case K_A2A: /* never in place (send and recv must not overlap) */
        for (i = 0; i < big; i++) put(a, c->dtype, i, in_value(c, rank, i));
        r = comm->ops->all_to_all(comm, a, b, n, c->dtype, NULL);
        memcpy(out, b, big * es);
        *out_bytes = big * es;
        break;
    default:
        if (rank == c->root)
            for (i = 0; i < n; i++) put(b, c->dtype, i, in_value(c, rank, i));
        r = comm->ops->broadcast(comm, b, n, c->dtype, c->root, NULL);
        memcpy(out, b, n * es);
        *out_bytes = n * es;
        break;
    }
    free(a);
    free(b);
    return r;
}

/* The reference: the same case on the local comm, every rank's output kept. */
typedef struct ref_ctx {
    const ccase *c;
    unsigned char *out[16];
    size_t bytes[16];
} ref_ctx;

static zero_result ref_rank(int rank, zero_comm *comm, void *user)
{
    ref_ctx *x = (ref_ctx *)user;
    return run_case(comm, x->c, x->out[rank], &x->bytes[rank]);
}

static zero_comm *make_comm(int timeout_ms)
{
    zero_mpi_desc d;
    zero_comm *comm = NULL;
    zero_result r;
    memset(&d, 0, sizeof d);
    d.timeout_ms = timeout_ms;
    r = zero_mpi_create(&d, &comm);
    ZT_CHECKF(r == ZERO_OK, "rank %d: zero_mpi_create: %s", zm_rank, zero_last_error());
    return comm;
}

static zero_comm *g_comm;

ZT_TEST(collectives_equal_local_comm)
{
    static const zero_dtype dts[] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64};
    static const size_t sizes[] = {0, 1, 7, 1001, 40000};
    int k, d, s, ip, op, nsz = zt_quick() ? 4 : 5, cases = 0;
    for (k = 0; k < 5; k++)
        for (d = 0; d < 4; d++)
            for (s = 0; s < nsz; s++)
                for (ip = 0; ip < 2; ip++)
                    for (op = 0; op < ((k == K_RS || k == K_AR) ? 2 : 1); op++) {
                        ccase c;
                        ref_ctx x;
                        size_t es = zero_dtype_size(dts[d]), cap, mine = 0;
                        unsigned char *got;
                        zero_result r, rr;
                        int rk;
                        memset(&c, 0, sizeof c);
                        c.kind = k;
                        c.dtype = dts[d];
                        c.numel = sizes[s];
                        c.inplace = ip;
                        c.op = op ? ZERO_OP_MAX : ZERO_OP_SUM;
                        c.root = (int)((s + ip) % (size_t)zm_world);
                        if ((k == K_BC || k == K_A2A) && ip) continue; /* no in-place form */
                        cap = alloc_numel(&c, zm_world) * es + 16;
                        got = (unsigned char *)malloc(cap);
                        memset(&x, 0, sizeof x);
                        x.c = &c;
                        for (rk = 0; rk < zm_world; rk++) x.out[rk] = (unsigned char *)malloc(cap);
                        rr = zero_local_run(zm_world, ref_rank, &x);
                        r = run_case(g_comm, &c, got, &mine);
                        ZT_CHECKF(rr == ZERO_OK, "reference failed: %s", zero_last_error());
                        ZT_CHECKF(r == ZERO_OK, "rank %d: %s %s numel %zu: %s", zm_rank, kname[k],
                                  zero_dtype_name(c.dtype), c.numel, zero_last_error());
                        ZT_CHECKF(mine == x.bytes[zm_rank] && memcmp(got, x.out[zm_rank], mine) == 0,
                                  "rank %d: %s %s %s numel %zu%s: differs from the local comm", zm_rank,
                                  kname[k], zero_dtype_name(c.dtype), op ? "max" : "sum", c.numel,
                                  ip ? " in place" : "");
                        cases++;
                        for (rk = 0; rk < zm_world; rk++) free(x.out[rk]);
                        free(got);
                    }
    ZT_CHECK(cases > 100);
}

/* Each rank calls with 'mine'; every rank must get want (the bad rank want_bad). */
static void expect_all(zero_result got, zero_result want, const char *what)
{
    ZT_CHECKF(got == want, "rank %d: %s: got %s (%s), want %s", zm_rank, what, zero_result_string(got),
              zero_last_error(), zero_result_string(want));
}

ZT_TEST(mismatches_fail_every_rank)
{
    float buf[64 * 4], out[64 * 4];
    zero_result r;
    int last = zm_world - 1;
    memset(buf, 0, sizeof buf);
    /* different kinds */
    if (zm_rank == 0) r = g_comm->ops->all_gather(g_comm, buf, out, 8, ZERO_F32, NULL);
    else r = g_comm->ops->reduce_scatter(g_comm, buf, out, 8, ZERO_F32, ZERO_OP_SUM, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "kinds");
    ZT_CHECKF(strstr(zero_last_error(), "rank 0 called all_gather") && strstr(zero_last_error(), "rank 1 called reduce_scatter"),
              "rank %d: message names both sides: %s", zm_rank, zero_last_error());
    /* all_to_all against all_gather of the same count (the same packet sizes) */
    if (zm_rank == 0) r = g_comm->ops->all_to_all(g_comm, buf, out, 8, ZERO_F32, NULL);
    else r = g_comm->ops->all_gather(g_comm, buf, out, 8, ZERO_F32, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "all_to_all vs all_gather");
    ZT_CHECKF(strstr(zero_last_error(), "rank 0 called all_to_all") && strstr(zero_last_error(), "rank 1 called all_gather"),
              "rank %d: message names both sides: %s", zm_rank, zero_last_error());
    /* different counts, the last rank's */
    r = g_comm->ops->all_reduce(g_comm, buf, out, zm_rank == last ? 9 : 8, ZERO_F32, ZERO_OP_SUM, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "counts");
    ZT_CHECKF(strstr(zero_last_error(), "numel 8") && strstr(zero_last_error(), "numel 9"), "rank %d: %s",
              zm_rank, zero_last_error());
    /* different dtypes */
    r = g_comm->ops->all_reduce(g_comm, buf, out, 8, zm_rank == last ? ZERO_F16 : ZERO_F32, ZERO_OP_SUM, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "dtypes");
    /* different ops and roots */
    r = g_comm->ops->all_reduce(g_comm, buf, out, 8, ZERO_F32, zm_rank == last ? ZERO_OP_MAX : ZERO_OP_SUM, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "ops");
    r = g_comm->ops->broadcast(g_comm, buf, 8, ZERO_F32, zm_rank == last ? 1 : 0, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "roots");
    /* nothing was written on a mismatch, and the comm is still usable */
    {
        int i, ok = 1;
        for (i = 0; i < 8; i++) buf[i] = (float)(zm_rank + i);
        r = g_comm->ops->all_reduce(g_comm, buf, out, 8, ZERO_F32, ZERO_OP_SUM, NULL);
        expect_all(r, ZERO_OK, "after mismatches");
        for (i = 0; i < 8; i++)
            if (out[i] != (float)(zm_world * i + zm_world * (zm_world - 1) / 2)) ok = 0;
        ZT_CHECKF(ok, "rank %d: sum after mismatches", zm_rank);
    }
}

/* Mismatches of calls whose data goes point to point after the packets (blocks above the
   inline size, ZERO_MPI_INLINE_BYTES; the whole buffer of an all_reduce in one round),
   against each other and against calls whose data rides in the packets: every rank
   returns MISMATCH, nothing is written to the caller's buffers, and the next collective
   (point to point) is right. */
ZT_TEST(mismatches_point_to_point)
{
    enum { B = 20000, BIG = 100000 }; /* 80 KB and 400 KB blocks: after the packets (their
                                          payload is at most 64 KiB) */
    size_t cap = (size_t)BIG * (size_t)zm_world;
    float *buf = (float *)calloc(cap, sizeof(float)), *out = (float *)malloc(cap * sizeof(float));
    zero_result r;
    int last = zm_world - 1, i, k, ok = 1;
    if (!buf || !out) {
        ZT_CHECKF(0, "rank %d: out of memory", zm_rank);
        free(buf);
        free(out);
        return;
    }
    for (k = 0; k < 6; k++) {
        const char *what = "";
        for (i = 0; i < (int)cap; i++) out[i] = -7.0f;
        switch (k) {
        case 0: /* kinds */
            what = "all_gather vs reduce_scatter";
            if (zm_rank == 0) r = g_comm->ops->all_gather(g_comm, buf, out, B, ZERO_F32, NULL);
            else r = g_comm->ops->reduce_scatter(g_comm, buf, out, B, ZERO_F32, ZERO_OP_SUM, NULL);
            break;
        case 1: /* counts */
            what = "counts";
            r = g_comm->ops->all_gather(g_comm, buf, out, zm_rank == last ? B + 1 : B, ZERO_F32, NULL);
            break;
        case 2: /* in the packets against after them */
            what = "inline vs point to point";
            r = g_comm->ops->all_reduce(g_comm, buf, out, zm_rank == last ? 8 : 3 * B, ZERO_F32, ZERO_OP_SUM, NULL);
            break;
        case 3: /* block sizes */
            what = "80000 vs 400000 bytes";
            r = g_comm->ops->all_gather(g_comm, buf, out, zm_rank == 0 ? BIG : B, ZERO_F32, NULL);
            break;
        case 4: /* all_to_all against broadcast from the last rank */
            what = "all_to_all vs broadcast";
            if (zm_rank == last) r = g_comm->ops->broadcast(g_comm, out, B, ZERO_F32, last, NULL);
            else r = g_comm->ops->all_to_all(g_comm, buf, out, B, ZERO_F32, NULL);
            break;
        default: /* a rank with invalid arguments */
            what = "invalid arguments";
            r = g_comm->ops->all_gather(g_comm, zm_rank == last ? NULL : buf, out, B, ZERO_F32, NULL);
            expect_all(r, zm_rank == last ? ZERO_ERROR_INVALID_ARGUMENT : ZERO_ERROR_MISMATCH, what);
            break;
        }
        if (k < 5) expect_all(r, ZERO_ERROR_MISMATCH, what);
        for (i = 0; i < (int)cap && !(k == 4 && zm_rank == last); i++)
            if (out[i] != -7.0f) ok = 0;
        ZT_CHECKF(ok, "rank %d: %s: the output was written", zm_rank, what);
    }
    /* the comm is still usable */
    for (i = 0; i < B; i++) buf[i] = (float)(zm_rank * B + i);
    r = g_comm->ops->all_gather(g_comm, buf, out, B, ZERO_F32, NULL);
    expect_all(r, ZERO_OK, "after mismatches");
    for (i = 0; i < B * zm_world; i++)
        if (out[i] != (float)i) ok = 0;
    ZT_CHECKF(ok, "rank %d: all_gather after mismatches", zm_rank);
    free(buf);
    free(out);
}

/* Shared-memory packets reuse each slot every second collective with no acknowledgement
   (zero__mpi_slot says why that is safe): 600 small collectives in a row, with every rank
   sleeping at its own pseudo-random points so the ranks drift apart, give exact results
   (small integers: every sum is exact). Also the transport is the one this build asks for:
   shared memory on this one-node run, MPI under ZERO_MPI_SHM 0 (test_mpi_pieces). */
ZT_TEST(packets_under_skew)
{
    enum { N = 37 };
    zero__mpi_comm *c = zero__mpi_get(g_comm);
    int want = ZERO__MPI_SHM_OK && access("/dev/shm", W_OK) == 0, world = zm_world, it, i, p, bad = 0;
    float in[N * 4], out[N * 4];
    ZT_CHECKF(c && (c->shm != NULL) == want, "rank %d: packets through %s, this build asks for %s", zm_rank,
              c && c->shm ? "shared memory" : "MPI", want ? "shared memory" : "MPI");
    for (it = 0; it < 600 && !bad; it++) {
        unsigned h = (unsigned)(it * 2654435761u) ^ (unsigned)(zm_rank * 40503u);
        zero_result r;
        h ^= h >> 13;
        if (h % 5 == 0) {
            struct timespec ts = {0, (long)(h % 40) * 1000};
            nanosleep(&ts, NULL);
        }
        if (it % 3 == 0) { /* all_gather: every rank's block */
            for (i = 0; i < N; i++) in[i] = (float)(zm_rank * 1000 + it % 500 + i);
            r = g_comm->ops->all_gather(g_comm, in, out, N, ZERO_F32, NULL);
            for (p = 0; p < world && r == ZERO_OK; p++)
                for (i = 0; i < N; i++)
                    if (out[p * N + i] != (float)(p * 1000 + it % 500 + i)) bad = 1;
        } else if (it % 3 == 1) { /* reduce_scatter: block p of every rank to rank p */
            for (i = 0; i < N * world; i++) in[i] = (float)(zm_rank + 1) * (float)(i + it % 7);
            r = g_comm->ops->reduce_scatter(g_comm, in, out, N, ZERO_F32, ZERO_OP_SUM, NULL);
            for (i = 0; i < N && r == ZERO_OK; i++)
                if (out[i] != (float)(world * (world + 1) / 2) * (float)(zm_rank * N + i + it % 7)) bad = 1;
        } else { /* all_reduce */
            for (i = 0; i < N; i++) in[i] = (float)(zm_rank * it % 11 + i);
            r = g_comm->ops->all_reduce(g_comm, in, out, N, ZERO_F32, ZERO_OP_SUM, NULL);
            for (i = 0; i < N && r == ZERO_OK; i++) {
                float want_sum = 0;
                for (p = 0; p < world; p++) want_sum += (float)(p * it % 11 + i);
                if (out[i] != want_sum) bad = 1;
            }
        }
        if (r != ZERO_OK) {
            ZT_CHECKF(0, "rank %d: collective %d: %s", zm_rank, it, zero_last_error());
            return;
        }
    }
    ZT_CHECKF(!bad, "rank %d: a wrong result at collective %d", zm_rank, it - 1);
}

#if ZERO__MPI_SHM_OK
static int shm_files(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *f;
    int n = 0;
    if (!d) return 0;
    while ((f = readdir(d)) != NULL)
        if (!strncmp(f->d_name, "zero_mpi.", 9)) n++;
    closedir(d);
    return n;
}
#endif

/* One rank that cannot map the shared file (a full /dev/shm: posix_fallocate fails) makes
   every rank send its packets through MPI: the comm works, its results are exact, and no
   file is left in /dev/shm. */
ZT_TEST(shm_refused_by_one_rank_falls_back_to_mpi)
{
#if ZERO__MPI_SHM_OK
    zero_mpi_desc d;
    zero_comm *c2 = NULL;
    zero_result r;
    float in[64], out[64 * 4];
    int i, p, ok = 1, before = shm_files();
    if (access("/dev/shm", W_OK) != 0) {
        ZT_SKIP("no writable /dev/shm");
        return;
    }
    memset(&d, 0, sizeof d);
    d.comm = MPI_COMM_WORLD;
    zero__mpi_shm_refuse = zm_rank == zm_world - 1;
    r = zero_mpi_create(&d, &c2);
    zero__mpi_shm_refuse = 0;
    ZT_CHECKF(r == ZERO_OK, "rank %d: zero_mpi_create: %s", zm_rank, zero_last_error());
    if (r != ZERO_OK) return;
    ZT_CHECKF(zero__mpi_get(c2)->shm == NULL, "rank %d: packets in shared memory though a rank refused", zm_rank);
    for (i = 0; i < 64; i++) in[i] = (float)(zm_rank * 64 + i);
    r = c2->ops->all_gather(c2, in, out, 64, ZERO_F32, NULL);
    for (p = 0; p < zm_world && r == ZERO_OK; p++)
        for (i = 0; i < 64; i++)
            if (out[p * 64 + i] != (float)(p * 64 + i)) ok = 0;
    ZT_CHECKF(r == ZERO_OK && ok, "rank %d: all_gather through MPI: %s", zm_rank, r ? zero_last_error() : "wrong");
    zero_comm_destroy(c2);
    MPI_Barrier(MPI_COMM_WORLD);
    ZT_CHECKF(shm_files() <= before, "rank %d: %d zero_mpi files in /dev/shm, %d before", zm_rank, shm_files(), before);
#else
    ZT_SKIP("packets through MPI in this build");
#endif
}

ZT_TEST(tags_compared)
{
    float buf[8] = {0}, out[8];
    zero_result r;
    zero_comm_tag t;
    /* equal tags: fine */
    memset(&t, 0, sizeof t);
    t.group = 3;
    t.role = 2;
    t.seq = 41;
    g_comm->tag = t;
    r = g_comm->ops->all_gather(g_comm, buf, out, 1, ZERO_F32, NULL);
    expect_all(r, ZERO_OK, "equal tags");
    /* equal arguments, the last rank serves another group: the diverged control flow the
       arguments alone cannot see */
    if (zm_rank == zm_world - 1) g_comm->tag.group = 4;
    r = g_comm->ops->all_gather(g_comm, buf, out, 1, ZERO_F32, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "groups");
    ZT_CHECKF(strstr(zero_last_error(), "group 3") && strstr(zero_last_error(), "group 4"), "rank %d: %s",
              zm_rank, zero_last_error());
    /* different tag sequence numbers */
    g_comm->tag = t;
    if (zm_rank == 0) g_comm->tag.seq = 40;
    r = g_comm->ops->reduce_scatter(g_comm, buf, out, 1, ZERO_F32, ZERO_OP_SUM, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "tag seq");
    /* a payload split into pieces (zero_engine_allreduce): a different whole count */
    g_comm->tag = t;
    g_comm->tag.count = zm_rank == zm_world - 1 ? 9 : 8;
    r = g_comm->ops->all_reduce(g_comm, buf, out, 1, ZERO_F32, ZERO_OP_SUM, NULL);
    expect_all(r, ZERO_ERROR_MISMATCH, "tag count");
    ZT_CHECKF(strstr(zero_last_error(), "count 8") && strstr(zero_last_error(), "count 9"), "rank %d: %s",
              zm_rank, zero_last_error());
    /* one rank untagged */
    g_comm->tag = t;
    if (zm_rank == 1) memset(&g_comm->tag, 0, sizeof g_comm->tag);
    r = g_comm->ops->barrier(g_comm);
    expect_all(r, ZERO_ERROR_MISMATCH, "untagged");
    /* untagged everywhere again: fine */
    memset(&g_comm->tag, 0, sizeof g_comm->tag);
    r = g_comm->ops->barrier(g_comm);
    expect_all(r, ZERO_OK, "untagged barrier");
}

ZT_TEST(invalid_arguments_on_one_rank)
{
    float buf[8] = {0}, out[8];
    zero_result r = g_comm->ops->all_reduce(g_comm, zm_rank == 1 ? NULL : buf, out, 8, ZERO_F32, ZERO_OP_SUM, NULL);
    expect_all(r, zm_rank == 1 ? ZERO_ERROR_INVALID_ARGUMENT : ZERO_ERROR_MISMATCH, "NULL send on rank 1");
    if (zm_rank != 1)
        ZT_CHECKF(strstr(zero_last_error(), "rank 1 passed invalid arguments"), "rank %d: %s", zm_rank,
                  zero_last_error());
    r = g_comm->ops->barrier(g_comm);
    expect_all(r, ZERO_OK, "barrier after");
}

/* A rank that gives up (zero_mpi_abort) while its peers wait in a collective: they return
   ZERO_ERROR_COMM at once, not after the timeout. */
ZT_TEST(abort_on_one_rank)
{
    zero_comm *c = make_comm(20000);
    float buf[16] = {0}, out[16];
    double t0 = zt_now_ms(), dt;
    zero_result r;
    if (!c) return;
    if (zm_rank == 1) {
        zt_sleep_ms(100);
        r = zero_mpi_abort(c);
        expect_all(r, ZERO_OK, "zero_mpi_abort");
    } else {
        r = c->ops->all_reduce(c, buf, out, 16, ZERO_F32, ZERO_OP_SUM, NULL);
        expect_all(r, ZERO_ERROR_COMM, "peer aborted");
        ZT_CHECKF(strstr(zero_last_error(), "rank 1 called zero_mpi_abort"), "rank %d: %s", zm_rank,
                  zero_last_error());
    }
    dt = zt_now_ms() - t0;
    ZT_CHECKF(dt < 10000, "rank %d: took %.0f ms", zm_rank, dt);
    /* broken for good, at once */
    r = c->ops->barrier(c);
    expect_all(r, ZERO_ERROR_COMM, "after abort");
    ZT_CHECK(zero_mpi_status(c) == ZERO_ERROR_COMM);
    zero_comm_destroy(c);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* A rank whose code failed destroys its comm: peers in the next collective get COMM. */
ZT_TEST(leave_on_one_rank)
{
    zero_comm *c = make_comm(20000);
    float buf[16] = {0}, out[16 * 4];
    zero_result r;
    double t0 = zt_now_ms();
    if (!c) return;
    if (zm_rank == zm_world - 1) {
        zero_comm_destroy(c);
        c = NULL;
    } else {
        r = c->ops->all_gather(c, buf, out, 16, ZERO_F32, NULL);
        expect_all(r, ZERO_ERROR_COMM, "peer left");
        ZT_CHECKF(strstr(zero_last_error(), "left the group"), "rank %d: %s", zm_rank, zero_last_error());
        zero_comm_destroy(c);
    }
    ZT_CHECKF(zt_now_ms() - t0 < 10000, "rank %d: slow", zm_rank);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Buffers on a device: the download / reduce / upload path, here over the host device. */
ZT_TEST(device_path_equals_host_path)
{
    zero_mpi_desc d;
    zero_device *dev = NULL;
    zero_comm *c = NULL;
    ccase cs[3];
    int i;
    memset(&d, 0, sizeof d);
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    d.device = dev;
    ZT_CHECKF(zero_mpi_create(&d, &c) == ZERO_OK, "%s", zero_last_error());
    if (!c) {
        zero_device_destroy(dev);
        return;
    }
    memset(cs, 0, sizeof cs);
    for (i = 0; i < 3; i++) {
        cs[i].kind = i;
        cs[i].dtype = ZERO_BF16;
        cs[i].numel = 777;
        cs[i].inplace = i == 2;
    }
    for (i = 0; i < 3; i++) {
        size_t cap = alloc_numel(&cs[i], zm_world) * 2 + 16, b1 = 0, b2 = 0;
        unsigned char *x = (unsigned char *)malloc(cap), *y = (unsigned char *)malloc(cap);
        ZT_CHECK(run_case(c, &cs[i], x, &b1) == ZERO_OK);
        ZT_CHECK(run_case(g_comm, &cs[i], y, &b2) == ZERO_OK);
        ZT_CHECKF(b1 == b2 && memcmp(x, y, b1) == 0, "rank %d: %s differs", zm_rank, kname[i]);
        free(x);
        free(y);
    }
    zero_comm_destroy(c);
    zero_device_destroy(dev);
}

ZT_TEST(bcast_bytes)
{
    unsigned char id[128];
    int i, ok = 1;
    for (i = 0; i < 128; i++) id[i] = (unsigned char)(zm_rank == 1 ? i * 7 : 0);
    ZT_CHECK(zero_mpi_bcast_bytes(MPI_COMM_WORLD, 1, id, sizeof id, 5000) == ZERO_OK);
    for (i = 0; i < 128; i++)
        if (id[i] != (unsigned char)(i * 7)) ok = 0;
    ZT_CHECK(ok);
    ZT_CHECK(zero_mpi_bcast_bytes(MPI_COMM_WORLD, zm_world, id, 1, 0) == ZERO_ERROR_INVALID_ARGUMENT);
}

/* Last: the last rank joins 3 timeouts late. The others return TIMEOUT near the deadline
   and tell the late rank (a gave-up message). The late rank returns TIMEOUT in that
   collective when MPI delivers the gave-up message with the packets its peers sent
   before giving up; otherwise it completes the collective from those packets (every
   rank's data: the right sum) and its next call fails at once. Nobody hangs, and no rank
   goes on past its next call. */
/* n = 32: the data in the packets; n = 80000 (320 KB, slices of 80 KB or more): point to
   point after them, with packets in shared memory or through MPI (test_mpi_pieces). The
   ranks that time out then overwrite their input (a caller that reuses its buffer): the
   late rank returns TIMEOUT, or the sum of the data of the call, never of what the
   callers wrote after the timeout. */
static void late_rank(int n)
{
    const int T = 300;
    zero_comm *c;
    static float buf[80000], out[80000];
    double t0, dt;
    zero_result r;
    int late = zm_rank == zm_world - 1, i, ok = 1;
    MPI_Barrier(MPI_COMM_WORLD); /* the late rank of the last round has caught up */
    c = make_comm(T);
    if (!c) return;
    for (i = 0; i < n; i++) buf[i] = (float)(zm_rank + i);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = zt_now_ms();
    if (late) zt_sleep_ms(3 * T);
    r = c->ops->all_reduce(c, buf, out, (size_t)n, ZERO_F32, ZERO_OP_SUM, NULL);
    dt = zt_now_ms() - t0;
    if (!late)
        for (i = 0; i < n; i++) buf[i] = -1e30f; /* the caller reuses its buffer */
    if (late && r == ZERO_OK) { /* completed from the peers' packets: their data, summed */
        for (i = 0; i < n; i++)
            if (out[i] != (float)(zm_world * i + zm_world * (zm_world - 1) / 2)) ok = 0;
        ZT_CHECKF(ok, "rank %d: the late rank's sum (n %d)", zm_rank, n);
    } else {
        expect_all(r, ZERO_ERROR_TIMEOUT, late ? "late rank" : "waiting for the late rank");
        ZT_CHECKF(strstr(zero_last_error(), "timed out after 300 ms"), "rank %d: %s", zm_rank, zero_last_error());
    }
    ZT_CHECKF(dt >= T && dt < (late ? 4 * T : T) + 3000, "rank %d: returned after %.0f ms", zm_rank, dt);
    /* broken (or, on the late rank, told by the gave-up message): later calls fail at once */
    t0 = zt_now_ms();
    r = c->ops->barrier(c);
    expect_all(r, ZERO_ERROR_TIMEOUT, "after the timeout");
    ZT_CHECKF(strstr(zero_last_error(), "timed out after 300 ms"), "rank %d: %s", zm_rank, zero_last_error());
    ZT_CHECKF(zt_now_ms() - t0 < 100, "rank %d: the call after the timeout took %.0f ms", zm_rank, zt_now_ms() - t0);
    zero_comm_destroy(c);
}

ZT_TEST(timeout_when_a_rank_is_late)
{
    late_rank(32);
    late_rank(80000);
}

/* tests/mpi/abort.sh runs this: abort_on_timeout ends the job (mpirun exits non-zero)
   instead of returning, when the last rank sleeps through rank 0's collective. */
static int abort_probe(void)
{
    zero_mpi_desc d;
    zero_comm *c = NULL;
    float x = 1, y;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 200;
    d.abort_on_timeout = 1;
    if (zero_mpi_create(&d, &c) != ZERO_OK) return 3;
    if (zm_rank == zm_world - 1) zt_sleep_ms(5000);
    else c->ops->all_reduce(c, &x, &y, 1, ZERO_F32, ZERO_OP_SUM, NULL);
    printf("abort probe: rank %d returned\n", zm_rank); /* only the late rank may get here */
    fflush(stdout);
    zero_comm_destroy(c);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    zm_init(&argc, &argv);
    if (argc > 1 && !strcmp(argv[1], "--abort-probe")) return abort_probe();
    if (zm_world < 2) {
        if (zm_rank == 0) printf("test_mpi_comm: needs 2 or more processes (mpirun -np N)\n");
        ZM_RUN(collectives_equal_local_comm);
        return zm_summary();
    }
    g_comm = make_comm(30000);
    if (!g_comm) return zm_summary();
    ZM_RUN(collectives_equal_local_comm);
    ZM_RUN(mismatches_fail_every_rank);
    ZM_RUN(mismatches_point_to_point);
    ZM_RUN(packets_under_skew);
    ZM_RUN(shm_refused_by_one_rank_falls_back_to_mpi);
    ZM_RUN(tags_compared);
    ZM_RUN(invalid_arguments_on_one_rank);
    ZM_RUN(abort_on_one_rank);
    ZM_RUN(leave_on_one_rank);
    ZM_RUN(device_path_equals_host_path);
    ZM_RUN(bcast_bytes);
    zero_comm_destroy(g_comm);
    ZM_RUN(timeout_when_a_rank_is_late);
    return zm_summary();
}
