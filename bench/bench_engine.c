/* bench_engine.c - time per training step of the engine at stages 0-3 on 4 simulated ranks
   (threads, local comm, host device), against stage 0 measured in the same run.

   The model: 8 layer groups of 500k parameters each (4 M in all, fp16). A step is one
   micro-step of the stage-3 pattern (forward: gather/release each group; backward: gather,
   write synthetic gradients, release, grads_ready) and zero_engine_step(); the "user"
   work is a single pass writing the gradients, so the time is the engine's: reductions,
   gathers, norm, Adam and the all-gathers of updated params, plus the cost of simulating
   4 ranks on this machine's cores.

       build/bench_engine [--ranks N] [--steps T] [--numel PER_GROUP] [--groups G] */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bench {
    int stage, steps, warmup, groups;
    size_t numel;
    double seconds;
    zero_engine_memory mem;
    zero_traffic traffic;
} bench;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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
        r = zero_engine_add_tensor(e, name, B->numel - 1000, g, 0, NULL);
        snprintf(name, sizeof name, "layer%d.bias", g);
        if (!r) r = zero_engine_add_tensor(e, name, 1000, g, ZERO_TENSOR_NO_DECAY, NULL);
    }
    if (!r) r = zero_engine_commit(e);
    init = (float *)malloc(B->numel * sizeof(float));
    if (!init) r = ZERO_ERROR_OUT_OF_MEMORY;
    for (i = 0; !r && i < B->numel; i++) init[i] = 0.01f * (float)((i * 37) % 101) - 0.5f;
    for (g = 0; g < 2 * B->groups && !r; g++) r = zero_engine_set_tensor(e, g, init);
    for (s = 0; s < B->warmup + B->steps && !r; s++) {
        zero_step_info info;
        void *p, *gr;
        uint16_t gv = zero_f32_to_f16(0.001f * zero_engine_loss_scale(e) * (float)(1 + rank));
        if (s == B->warmup) t0 = now();
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
        B->seconds = now() - t0;
        zero_engine_memory_usage(e, &B->mem);
        zero_engine_traffic(e, &B->traffic, NULL);
    }
    free(init);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

int main(int argc, char **argv)
{
    int ranks = 4, steps = 5, groups = 8, a, st;
    size_t numel = 500000;
    double base = 0;
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
    return 0;
}
