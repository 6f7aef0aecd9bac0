/* bench_mpi.c - zero_mpi.h's collectives against the MPI library's own, and the engine's
   step time over MPI against the same ranks as threads (make bench-mpi: 4 processes).

   Part 1: for each size (the whole buffer: all_gather's output, reduce_scatter's input,
   all_reduce's buffer; 4 KiB to 256 MiB of f32), the time of zero_mpi.h's all_gather,
   reduce_scatter and all_reduce (SUM) and of MPI_Allgather, MPI_Reduce_scatter_block and
   MPI_Allreduce on the same buffers, in the same run, alternating, the best of --rounds
   (3) rounds of each, 5 x --rounds up to 64 KiB (100 calls a round up to 64 KiB, 30 to
   1 MiB, fewer above; the machine may be busy: a round of 100 calls of a microsecond
   that another process's time slice interrupts is lost, so small sizes get more rounds). Bus bandwidth as nccl-tests defines it: algbw = size / time,
   busbw = algbw * (N-1)/N for all-gather and reduce-scatter, algbw * 2(N-1)/N for
   all-reduce; time = the slowest rank's mean. The ratio is ours / MPI's (above 1: ours
   is faster), of the best rounds; "paired" is the median over the rounds of MPI's time /
   ours in the same round (the two halves of a round run back to back, so a busy spell of
   the machine slows both: a steadier figure than the ratio of two best rounds).

   Part 2: the engine (stages 1 and 3, fp16, 8 groups x 500k params, bench_engine.c's step)
   over zero_mpi.h with one rank per process, against zero_local_run with the same number
   of threads in rank 0's process while the other processes sleep.

       mpirun -np 4 build/mpi/bench_mpi [--max-mib M] [--steps T] [--rounds R] [--sizes K,K,..]
   (--steps 0: the collectives only; --sizes 4,64,65536: those sizes in KiB instead of
   4 KiB, 16 KiB, ... up to --max-mib) */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_MPI_IMPLEMENTATION
#include "zero_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int me, world;

#include "bench_common.h" /* bench_now */

/* A barrier that sleeps while it waits, so idle processes leave the cores to the others. */
static void sleepy_barrier(void)
{
    MPI_Request req;
    int done = 0;
    struct timespec ts = {0, 1000000};
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    for (;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        nanosleep(&ts, NULL);
    }
}

enum { AG, RS, AR };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static const char *const names[] = {"all_gather", "reduce_scatter", "all_reduce"};

/* Mean seconds per call over iters calls (after one warm-up), the slowest rank's. */
static double time_op(zero_comm *comm, int which, int mine, float *send, float *recv, size_t total, int iters)
{
    size_t block = total / (size_t)world;
    double t0 = 0, dt, worst;
    int it;
    zero_result r = ZERO_OK;
    for (it = -1; it < iters; it++) {
        if (it == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = bench_now();
        }
        if (mine) {
            if (which == AG) r = comm->ops->all_gather(comm, send, recv, block, ZERO_F32, NULL);
            else if (which == RS) r = comm->ops->reduce_scatter(comm, send, recv, block, ZERO_F32, ZERO_OP_SUM, NULL);
            else r = comm->ops->all_reduce(comm, send, recv, total, ZERO_F32, ZERO_OP_SUM, NULL);
            if (r != ZERO_OK) {
                fprintf(stderr, "rank %d: %s: %s\n", me, names[which], zero_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        } else {
            if (which == AG) MPI_Allgather(send, (int)block, MPI_FLOAT, recv, (int)block, MPI_FLOAT, MPI_COMM_WORLD);
            else if (which == RS) MPI_Reduce_scatter_block(send, recv, (int)block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else MPI_Allreduce(send, recv, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
    }
    dt = (bench_now() - t0) / iters;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

/* ---- the engine step (bench_engine.c's model) ---- */

typedef struct ebench {
    int stage, steps, groups;
    size_t numel;
    double seconds;
} ebench;

static zero_result engine_rank(int rank, zero_comm *comm, void *user)
{
    ebench *B = (ebench *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    float *init = NULL;
    int g, s;
    double t0 = 0;
    size_t i;
    memset(&d, 0, sizeof d);
    r = zero_host_device_create(NULL, &dev);
    d.stage = B->stage;
    d.device = dev;
    d.comm = comm;
    d.clip_norm = 1.0f;
    if (!r) r = zero_engine_create(&d, &e);
    for (g = 0; g < B->groups && !r; g++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d.weight", g);
        r = zero_engine_add_tensor(e, name, B->numel - 1000, g, 0, NULL);
        snprintf(name, sizeof name, "layer%d.bias", g);
        if (!r) r = zero_engine_add_tensor(e, name, 1000, g, ZERO_TENSOR_NO_DECAY, NULL);
    }
    if (!r) r = zero_engine_commit(e);
    init = (float *)malloc(B->numel * sizeof(float));
    if (!init) r = ZERO_ERROR_OUT_OF_MEMORY;
    for (i = 0; !r && i < B->numel; i++) init[i] = 0.01f * (float)((i * 37) % 101) - 0.5f;
    for (g = 0; g < 2 * B->groups && !r; g++) r = zero_engine_set_tensor(e, g, init);
    for (s = 0; s < 1 + B->steps && !r; s++) {
        zero_step_info info;
        void *p, *gr;
        uint16_t gv = zero_f32_to_f16(0.001f * zero_engine_loss_scale(e) * (float)(1 + rank));
        if (s == 1) t0 = bench_now();
        for (g = 0; g < B->groups && !r; g++) {
            r = zero_engine_gather(e, g, &p);
            if (!r) r = zero_engine_release(e, g);
        }
        for (g = B->groups - 1; g >= 0 && !r; g--) {
            r = zero_engine_gather(e, g, &p);
            if (!r) r = zero_engine_grads(e, g, &gr);
            if (!r)
                for (i = 0; i < B->numel; i++) ((uint16_t *)gr)[i] = gv;
            if (!r) r = zero_engine_release(e, g);
            if (!r) r = zero_engine_grads_ready(e, g);
        }
        if (!r) r = zero_engine_step(e, &info);
    }
    if (!r && rank == 0) B->seconds = bench_now() - t0;
    free(init);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

int main(int argc, char **argv)
{
    zero_mpi_desc md;
    zero_comm *comm = NULL;
    size_t total, max_bytes = (size_t)256 << 20;
    int a, which, steps = 5, st, rounds = 3, nsizes = 0, k;
    size_t sizes_kib[16];
    float *send, *recv;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "--max-mib")) max_bytes = (size_t)atol(argv[a + 1]) << 20;
        else if (!strcmp(argv[a], "--steps")) steps = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--rounds")) rounds = atoi(argv[a + 1]) > 0 ? atoi(argv[a + 1]) : 1;
        else if (!strcmp(argv[a], "--sizes")) { /* "4,64,65536": these sizes (KiB) only */
            const char *q = argv[a + 1];
            while (*q && nsizes < 16) {
                char *end;
                unsigned long v = strtoul(q, &end, 10);
                if (end == q) break;
                if (v > 0) sizes_kib[nsizes++] = (size_t)v;
                q = *end == ',' ? end + 1 : end;
            }
        }
    }
    memset(&md, 0, sizeof md);
    md.timeout_ms = 600000;
    if (zero_mpi_create(&md, &comm) != ZERO_OK) {
        fprintf(stderr, "rank %d: %s\n", me, zero_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (k = 0; k < nsizes; k++)
        if (sizes_kib[k] << 10 > max_bytes) max_bytes = sizes_kib[k] << 10;
    send = (float *)malloc(max_bytes);
    recv = (float *)malloc(max_bytes);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
    for (total = 0; total < max_bytes / sizeof(float); total++) send[total] = (float)(total % 1000) * 1e-3f;
    memset(recv, 0, max_bytes);
    if (me == 0)
        printf("zero_mpi.h vs the MPI library's collectives, %d processes, f32 (busbw as nccl-tests: "
               "GB/s, the best round of each; ratio = ours / MPI's; paired = the median over the rounds of "
               "MPI's time / ours in the same round; our packets through %s)\n%-14s %10s | %9s %9s %6s %7s\n",
               world, zero__mpi_get(comm)->shm ? "shared memory" : "MPI", "collective", "size", "ours", "MPI", "ratio",
               "paired");
    for (which = 0; which < 3; which++)
        for (k = 0, total = nsizes ? (sizes_kib[0] << 10) / sizeof(float) : 4096 / sizeof(float);
             nsizes ? k < nsizes : total * sizeof(float) <= max_bytes;
             k++, total = nsizes ? (k < nsizes ? (sizes_kib[k] << 10) / sizeof(float) : 0) : total * 4) {
            double bytes = (double)total * sizeof(float), f = (double)(world - 1) / world, t_ours, t_mpi, b_ours, b_mpi;
            int iters = bytes <= (64 << 10) ? 100 : bytes <= (1 << 20) ? 30 : bytes <= (16 << 20) ? 5 : 2;
            if (which == AR) f *= 2;
            int rep, nrounds = bytes <= (64 << 10) ? 5 * rounds : rounds;
            double paired[64];
            if (nrounds > 64) nrounds = 64;
            t_mpi = t_ours = 1e30;
            for (rep = 0; rep < nrounds; rep++) { /* alternating; the best round (a busy machine) */
                double tm = time_op(comm, which, 0, send, recv, total - total % (size_t)world, iters);
                double to = time_op(comm, which, 1, send, recv, total - total % (size_t)world, iters);
                if (tm < t_mpi) t_mpi = tm;
                if (to < t_ours) t_ours = to;
                paired[rep] = tm / to;
            }
            qsort(paired, (size_t)nrounds, sizeof *paired, cmp_double);
            b_ours = bytes / t_ours * f / 1e9;
            b_mpi = bytes / t_mpi * f / 1e9;
            if (me == 0) {
                char sz[32];
                if (bytes >= (1 << 20)) snprintf(sz, sizeof sz, "%.0f MiB", bytes / (1 << 20));
                else snprintf(sz, sizeof sz, "%.0f KiB", bytes / 1024);
                printf("%-14s %10s | %9.3f %9.3f %6.2f %7.2f\n", names[which], sz, b_ours, b_mpi, b_ours / b_mpi,
                       nrounds % 2 ? paired[nrounds / 2] : 0.5 * (paired[nrounds / 2 - 1] + paired[nrounds / 2]));
                fflush(stdout);
            }
        }
    free(send);
    free(recv);

    if (steps < 1) { /* --steps 0: the collectives only */
        zero_comm_destroy(comm);
        MPI_Finalize();
        return 0;
    }
    if (me == 0)
        printf("\nengine step, 8 groups x 500k params (4 M, fp16), %d timed steps after 1 warm-up, best of 3\n"
               "%-6s %16s %16s %8s\n",
               steps, "stage", "MPI ms/step", "threads ms/step", "ratio");
    for (st = 1; st <= 3; st += 2) {
        ebench B;
        double t_mpi = 1e30, t_thr = 1e30;
        zero_result r;
        int rep;
        for (rep = 0; rep < 3; rep++) { /* alternating; the best of 3 */
            memset(&B, 0, sizeof B);
            B.stage = st;
            B.steps = steps;
            B.groups = 8;
            B.numel = 500000;
            sleepy_barrier();
            r = engine_rank(me, comm, &B);
            if (r != ZERO_OK) {
                fprintf(stderr, "rank %d: engine over MPI: %s\n", me, zero_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            if (me == 0 && B.seconds < t_mpi) t_mpi = B.seconds;
            sleepy_barrier();
            if (me == 0) {
                B.seconds = 0;
                r = zero_local_run(world, engine_rank, &B);
                if (r != ZERO_OK) {
                    fprintf(stderr, "threads: %s\n", zero_last_error());
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                if (B.seconds < t_thr) t_thr = B.seconds;
            }
        }
        if (me == 0) {
            printf("%-6d %16.2f %16.2f %8.2f\n", st, 1e3 * t_mpi / steps, 1e3 * t_thr / steps, t_mpi / t_thr);
            fflush(stdout);
        }
        sleepy_barrier();
    }
    zero_comm_destroy(comm);
    MPI_Finalize();
    return 0;
}
