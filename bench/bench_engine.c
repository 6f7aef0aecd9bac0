/* bench_engine.c - time per training step of the engine at stages 0-3 on 4 simulated ranks
   (threads, local comm, host device), against stage 0 measured in the same run.

   The model: 8 layer groups of 500k parameters each (4 M in all, fp16). A step is one
   micro-step of the stage-3 pattern (forward: gather/release each group; backward: gather,
   write synthetic gradients, release, grads_ready) and zero_engine_step(); the "user"
   work is a single pass writing the gradients, so the time is the engine's: reductions,
   gathers, norm, Adam and the all-gathers of updated params, plus the cost of simulating
   4 ranks on this machine's cores.

   Then the cost of the local comm itself, measured in the same run:
   - per-collective latency at 2 ranks: a barrier, a 1-element all_reduce and all_gather on
     the local comm, with its spin-then-sleep rendezvous and with spinning off (spin_us < 0),
     against a bare pthread_barrier_wait loop on the same number of threads;
   - the per-collective (per-gather) overhead at stage 3 on many small groups (512 groups of
     256 fp16 params): (step time on 2 ranks - step time on 1 rank) / collectives per step,
     spinning on and off, next to stage 0.

       build/bench_engine [--ranks N] [--steps T] [--numel PER_GROUP] [--groups G]
                          [--comm-only] */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

typedef struct bench {
    int stage, steps, warmup, groups;
    int small; /* one tensor of 'numel' elements per group (the small-group study) */
    size_t numel;
    double seconds;
    zero_engine_memory mem;
    zero_traffic traffic;
} bench;

#include "bench_common.h" /* bench_now */

static zero_result rank_main(int rank, zero_comm *comm, void *user)
{
    bench *B = (bench *)user;
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
        r = zero_engine_add_tensor(e, name, B->small ? B->numel : B->numel - 1000, g, 0, NULL);
        snprintf(name, sizeof name, "layer%d.bias", g);
        if (!r && !B->small)
            r = zero_engine_add_tensor(e, name, 1000, g, ZERO_TENSOR_NO_DECAY, NULL);
    }
    if (!r) r = zero_engine_commit(e);
    init = (float *)malloc(B->numel * sizeof(float));
    if (!init) r = ZERO_ERROR_OUT_OF_MEMORY;
    for (i = 0; !r && i < B->numel; i++) init[i] = 0.01f * (float)((i * 37) % 101) - 0.5f;
    for (g = 0; g < (B->small ? 1 : 2) * B->groups && !r; g++) r = zero_engine_set_tensor(e, g, init);
    for (s = 0; s < B->warmup + B->steps && !r; s++) {
        zero_step_info info;
        void *p, *gr;
        uint16_t gv = zero_f32_to_f16(0.001f * zero_engine_loss_scale(e) * (float)(1 + rank));
        if (s == B->warmup) t0 = bench_now();
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
    if (!r && rank == 0) {
        B->seconds = bench_now() - t0;
        zero_engine_memory_usage(e, &B->mem);
        zero_engine_traffic(e, &B->traffic, NULL);
    }
    free(init);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* ---- the local comm's own cost ------------------------------------------------------------ */

enum { OP_PTHREAD = 0, OP_BARRIER, OP_ALL_REDUCE, OP_ALL_GATHER };
static const char *const op_name[] = {"pthread_barrier_wait (reference)", "local barrier",
                                      "local all_reduce (1 f32)", "local all_gather (1 f16/rank)"};

typedef struct lat {
    int op, iters;
    pthread_barrier_t *pb;
    double seconds;
} lat;

static zero_result lat_rank(int rank, zero_comm *comm, void *user)
{
    lat *L = (lat *)user;
    float x = 1.0f;
    uint16_t h[16] = {0};
    zero_result r = ZERO_OK;
    int i;
    double t0 = 0;
    for (i = -100; i < L->iters && r == ZERO_OK; i++) { /* 100 warm-up calls */
        if (i == 0) t0 = bench_now();
        if (L->op == OP_BARRIER) r = comm->ops->barrier(comm);
        else if (L->op == OP_ALL_REDUCE) r = comm->ops->all_reduce(comm, &x, &x, 1, ZERO_F32, ZERO_OP_MAX, NULL);
        else r = comm->ops->all_gather(comm, &h[rank], h, 1, ZERO_F16, NULL);
    }
    if (rank == 0) L->seconds = bench_now() - t0;
    return r;
}

static void *pthread_rank(void *arg)
{
    lat *L = (lat *)arg;
    int i;
    double t0 = 0;
    for (i = -100; i < L->iters; i++) {
        if (i == 0) t0 = bench_now();
        pthread_barrier_wait(L->pb);
    }
    L->seconds = bench_now() - t0;
    return NULL;
}

/* Microseconds per operation on 'ranks' threads; < 0 on failure. */
static double lat_run(int op, int ranks, int iters, int spin_us)
{
    lat L[16];
    int r;
    memset(L, 0, sizeof L);
    if (ranks > 16) return -1.0;
    if (op == OP_PTHREAD) {
        pthread_barrier_t pb;
        pthread_t th[16];
        if (pthread_barrier_init(&pb, NULL, (unsigned)ranks) != 0) return -1.0;
        for (r = 0; r < ranks; r++) {
            L[r].iters = iters;
            L[r].pb = &pb;
            if (pthread_create(&th[r], NULL, pthread_rank, &L[r]) != 0) return -1.0;
        }
        for (r = 0; r < ranks; r++) pthread_join(th[r], NULL);
        pthread_barrier_destroy(&pb);
    } else {
        zero_local_desc d;
        memset(&d, 0, sizeof d);
        d.world = ranks;
        d.spin_us = spin_us;
        L[0].op = op;
        L[0].iters = iters;
        if (zero_local_run_desc(&d, lat_rank, &L[0]) != ZERO_OK) {
            fprintf(stderr, "%s: %s\n", op_name[op], zero_last_error());
            return -1.0;
        }
    }
    return 1e6 * L[0].seconds / iters;
}

/* Step time (seconds) of the small-group model at one stage, ranks and spin setting. */
static double small_step(int stage, int ranks, int groups, size_t numel, int steps, int spin_us,
                         uint64_t *calls)
{
    bench B;
    zero_local_desc d;
    int k;
    memset(&B, 0, sizeof B);
    B.stage = stage;
    B.steps = steps;
    B.warmup = 2;
    B.groups = groups;
    B.numel = numel;
    B.small = 1;
    memset(&d, 0, sizeof d);
    d.world = ranks;
    d.spin_us = spin_us;
    if (zero_local_run_desc(&d, rank_main, &B) != ZERO_OK) {
        fprintf(stderr, "small groups, stage %d: %s\n", stage, zero_last_error());
        return -1.0;
    }
    *calls = 0; /* per step: the traffic counters cover the last step */
    for (k = 0; k < ZERO_COLL_COUNT; k++) *calls += B.traffic.calls[k];
    return B.seconds / steps;
}

/* The machine is shared: each figure below is the best of REPS runs (the least disturbed). */
#define REPS 3

static double best_lat(int op, int ranks, int iters, int spin_us)
{
    double best = -1.0;
    int k;
    for (k = 0; k < REPS; k++) {
        double t = lat_run(op, ranks, iters, spin_us);
        if (t < 0) return t;
        if (best < 0 || t < best) best = t;
    }
    return best;
}

static double best_small(int stage, int ranks, int groups, size_t numel, int steps, int spin_us,
                         uint64_t *calls)
{
    double best = -1.0;
    int k;
    for (k = 0; k < REPS; k++) {
        double t = small_step(stage, ranks, groups, numel, steps, spin_us, calls);
        if (t < 0) return t;
        if (best < 0 || t < best) best = t;
    }
    return best;
}

static void comm_cost(void)
{
    const int R = 2, iters = 10000, G = 512, steps = 10;
    const size_t n = 256;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double ref = 0, t1[4], t2[2][4];
    int op, sp, st;
    uint64_t calls[4] = {0}, c1;
    printf("\nlocal comm: per-collective latency, %d ranks (threads) on %ld cores online, %d calls "
           "(after 100 warm-up), best of %d runs, in the same run as the pthread reference\n", R,
           cores, iters, REPS);
    printf("%-34s %-14s %-10s %-14s %-10s\n", "operation", "us/op (spin)", "vs ref", "us/op (sleep)",
           "vs ref");
    for (op = OP_PTHREAD; op <= OP_ALL_GATHER; op++) {
        double a = best_lat(op, R, iters, 0), b = op == OP_PTHREAD ? a : best_lat(op, R, iters, -1);
        if (op == OP_PTHREAD) ref = a;
        printf("%-34s %-14.2f %-10.2f %-14.2f %-10.2f\n", op_name[op], a, a / ref, b, b / ref);
    }
    printf("\nstage-3 overhead per collective (per gather: 2 of every 3 collectives at stage 3 are "
           "gathers of one group, the third its reduce-scatter), %d groups x %zu fp16 params, %d "
           "timed steps, best of %d: (step on %d ranks - step on 1 rank) / collectives per step\n",
           G, n, steps, REPS, R);
    printf("%-6s %-12s %-22s %-22s %-14s %-14s\n", "stage", "colls/step", "us/group/step N=1",
           "us/group/step N=2 spin", "N=2 sleep", "us/coll spin/sleep");
    for (st = 0; st <= 3; st += 3) {
        t1[st] = best_small(st, 1, G, n, steps, 0, &c1);
        for (sp = 0; sp < 2; sp++) t2[sp][st] = best_small(st, R, G, n, steps, sp ? -1 : 0, &calls[st]);
        if (t1[st] < 0 || t2[0][st] < 0 || t2[1][st] < 0) return;
        printf("%-6d %-12llu %-22.2f %-22.2f %-14.2f %.2f / %.2f\n", st,
               (unsigned long long)calls[st], 1e6 * t1[st] / G, 1e6 * t2[0][st] / G,
               1e6 * t2[1][st] / G, 1e6 * (t2[0][st] - t1[st]) / (double)calls[st],
               1e6 * (t2[1][st] - t1[st]) / (double)calls[st]);
    }
}

int main(int argc, char **argv)
{
    int ranks = 4, steps = 5, groups = 8, a, st, comm_only = 0;
    size_t numel = 500000;
    double base = 0;
    for (a = 1; a < argc; a++)
        if (!strcmp(argv[a], "--comm-only")) comm_only = 1;
    if (comm_only) {
        comm_cost();
        return 0;
    }
    for (a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "--ranks")) ranks = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--steps")) steps = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--groups")) groups = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--numel")) numel = (size_t)atol(argv[a + 1]);
    }
    if (ranks < 1 || steps < 1 || groups < 1 || numel < 2000) {
        fprintf(stderr, "usage: bench_engine [--ranks N] [--steps T] [--groups G] [--numel N>=2000]\n");
        return 2;
    }
    printf("engine step time, %d ranks (threads) on the host device, %d groups x %zu params "
           "(%.1f M, fp16), %d timed steps after 1 warm-up, simd %s\n",
           ranks, groups, numel, groups * (double)numel / 1e6, steps,
           zero_simd_name(zero_simd_detect()));
    printf("%-6s %-10s %-12s %-16s %-16s\n", "stage", "ms/step", "vs stage 0", "states MB/rank",
           "comm MB/rank/step");
    for (st = 0; st <= 3; st++) {
        bench B;
        zero_result r;
        double ms, states;
        memset(&B, 0, sizeof B);
        B.stage = st;
        B.steps = steps;
        B.warmup = 1;
        B.groups = groups;
        B.numel = numel;
        r = zero_local_run(ranks, rank_main, &B);
        if (r != ZERO_OK) {
            fprintf(stderr, "stage %d: %s: %s\n", st, zero_result_string(r), zero_last_error());
            return 1;
        }
        ms = 1e3 * B.seconds / steps;
        if (st == 0) base = ms;
        states = (double)(B.mem.bytes[ZERO_MEM_PARAM] + B.mem.bytes[ZERO_MEM_GRAD] +
                          B.mem.bytes[ZERO_MEM_MASTER] + B.mem.bytes[ZERO_MEM_MOMENT1] +
                          B.mem.bytes[ZERO_MEM_MOMENT2]);
        printf("%-6d %-10.2f %-12.2f %-16.2f %-16.2f\n", st, ms, ms / base, states / 1e6,
               (B.traffic.bytes[ZERO_COLL_ALL_GATHER] + B.traffic.bytes[ZERO_COLL_REDUCE_SCATTER] +
                B.traffic.bytes[ZERO_COLL_ALL_REDUCE]) / 1e6);
    }
    comm_cost();
    return 0;
}
