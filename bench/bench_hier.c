/* bench_hier.c - bytes per step inside and between nodes for the hierarchical modes, at
   GPT-2 124M's shapes (examples/gpt2_common.h's parameter table: 124,439,808 params in 14
   groups, bf16 params and gradients), N = 8 ranks as 2 nodes x 4 (threads, local comm,
   ranks_per_node = 4), one micro-step per step.

   The tensors are registered with the model's real shapes, but the model math is not run:
   each rank gathers every group forward and backward, takes its zero-filled gradient buffer
   as it is (gradients of zero) and makes it ready, then steps. The engine's collectives do
   not depend on the values, so the bytes are the training run's; this keeps the bench to a
   few seconds. The bytes are measured (zero_traffic.intra_bytes / inter_bytes of rank 0's
   step, payload only: control all-reduces excluded) and checked against the
   estimator's formula (zero_estimate.step_*); the step time is a model, not a measurement:
   intra / B_intra + inter / B_inter, the link speeds given (default 450 GB/s inside a node,
   NVLink-class, and 25 GB/s between nodes, 200 Gb/s InfiniBand), nothing overlapped.
   The ZeRO++ rows (qwZ, qgZ int4, hpZ) have no estimator formula (the quantized bytes depend
   on each group's shard): their formula is the per-group one of docs/engine.md, from the
   plan (P8 and P4 of each group's shard), and each row also prints its bytes between nodes
   in the ZeRO++ paper's units, M = a third of flat stage 3's (the paper: 3 M -> 0.75 M).
   qgZ runs flat (quantized_gradient_levels = 1: one all_to_all over the 8 ranks) and
   two-level (the default on 2 nodes: inside the node, then across; bytes between nodes / R).

       build/bench_hier [--intra-gbs B] [--inter-gbs B] [--layers L] */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "examples/gpt2_common.h"
#include "bench/bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BH_N 8
#define BH_R 4

typedef struct bh_mode {
    const char *name;
    int stage, mics, hpz, qw, qg, lv; /* lv: quantized_gradient_levels (0 = the default: 2 here) */
} bh_mode;

typedef struct bh_run {
    const gpt2_config *cfg;
    const bh_mode *mode;
    zero_traffic traffic; /* rank 0, the step */
    size_t psi;
    double seconds;
    double q8, q4, sec; /* rank 0: sums over groups of P8(shard), P4(shard), numel / hpz */
} bh_run;

static zero_result bh_rank(int rank, zero_comm *comm, void *user)
{
    bh_run *B = (bh_run *)user;
    int nt = gpt2_num_tensors(B->cfg), t, g, G = 0, s;
    gpt2_tensor *tab = (gpt2_tensor *)calloc((size_t)nt, sizeof *tab);
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = tab ? zero_host_device_create(NULL, &dev) : ZERO_ERROR_OUT_OF_MEMORY;
    double t0 = 0.0;
    void *p;
    memset(&d, 0, sizeof d);
    d.stage = B->mode->stage;
    d.param_dtype = ZERO_BF16;
    d.device = dev;
    d.comm = comm;
    d.prefetch_depth = -1;
    d.ranks_per_node = BH_R;
    d.mics_shard_size = B->mode->mics;
    d.hpz_partition_size = B->mode->hpz;
    d.quantized_weights = B->mode->qw;
    d.quantized_gradients = B->mode->qg;
    d.quantized_gradient_levels = B->mode->lv;
    if (r == ZERO_OK) r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) {
        gpt2_param_table(B->cfg, tab);
        for (t = 0; t < nt && r == ZERO_OK; t++) {
            r = zero_engine_add_tensor(e, tab[t].name, tab[t].numel, tab[t].group, tab[t].flags, NULL);
            if (tab[t].group + 1 > G) G = tab[t].group + 1;
        }
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    t0 = bench_now();
    for (s = 0; s < 1 && r == ZERO_OK; s++) {
        for (g = 0; g < G && r == ZERO_OK; g++) {
            r = zero_engine_gather(e, g, &p);
            if (r == ZERO_OK) r = zero_engine_release(e, g);
        }
        for (g = G - 1; g >= 0 && r == ZERO_OK; g--) {
            /* params released before the gradient buffer is asked for (a linear layer's
               weight gradient needs no weights), so the embedding's two never share the arena */
            r = zero_engine_gather(e, g, &p);
            if (r == ZERO_OK) r = zero_engine_release(e, g);
            if (r == ZERO_OK) r = zero_engine_grads(e, g, &p); /* zero-filled: left as is */
            if (r == ZERO_OK) r = zero_engine_grads_ready(e, g);
        }
        if (r == ZERO_OK) r = zero_engine_step(e, NULL);
    }
    if (r == ZERO_OK && rank == 0) {
        B->seconds = bench_now() - t0;
        zero_engine_traffic(e, &B->traffic, NULL);
        B->psi = zero_plan_total_numel(zero_engine_plan(e));
        for (g = 0; g < G && r == ZERO_OK; g++) {
            zero_group_info gi;
            size_t b8 = 0, b4 = 0;
            zero_plan_group(zero_engine_plan(e), g, &gi);
            r = zero_quant_bytes(gi.shard_numel, 8, 0, &b8);
            if (r == ZERO_OK) r = zero_quant_bytes(gi.shard_numel, 4, 0, &b4);
            B->q8 += (double)b8;
            B->q4 += (double)b4;
            if (B->mode->hpz) B->sec += (double)gi.numel / B->mode->hpz;
        }
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    free(tab);
    return r;
}

int main(int argc, char **argv)
{
    static const bh_mode modes[] = {
        {"flat stage 1", 1, 0, 0, 0, 0, 0},        {"flat stage 2", 2, 0, 0, 0, 0, 0},
        {"flat stage 3", 3, 0, 0, 0, 0, 0},        {"MiCS S=4 stage 2", 2, 4, 0, 0, 0, 0},
        {"MiCS S=4 stage 3", 3, 4, 0, 0, 0, 0},    {"MiCS S=2 stage 3", 3, 2, 0, 0, 0, 0},
        {"hpZ S=4 stage 3", 3, 0, 4, 0, 0, 0},     {"hpZ S=2 stage 3", 3, 0, 2, 0, 0, 0},
        {"qgZ int4 flat", 3, 0, 0, 0, 1, 1},       {"qgZ int4 2-level", 3, 0, 0, 0, 1, 0},
        {"qwZ + qgZ flat", 3, 0, 0, 1, 1, 1},      {"qwZ + qgZ 2-level", 3, 0, 0, 1, 1, 0},
        {"qwZ+hpZ+qgZ flat", 3, 0, 4, 1, 1, 1},    {"qwZ+hpZ+qgZ 2-lvl", 3, 0, 4, 1, 1, 0},
    };
    double flat3_inter = 0.0;
    double bi = 450e9, bo = 25e9, base = 0.0;
    gpt2_config cfg;
    size_t m;
    int i, k, bad = 0;
    memset(&cfg, 0, sizeof cfg);
    cfg.layers = 12;
    cfg.heads = 12;
    cfg.channels = 768;
    cfg.seq = cfg.max_seq = 1024;
    cfg.vocab = 50257;
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--intra-gbs")) bi = atof(argv[i + 1]) * 1e9;
        else if (!strcmp(argv[i], "--inter-gbs")) bo = atof(argv[i + 1]) * 1e9;
        else if (!strcmp(argv[i], "--layers")) cfg.layers = atoi(argv[i + 1]);
        else break;
    }
    if (i < argc || !(bi > 0) || !(bo > 0) || cfg.layers < 1) {
        fprintf(stderr, "usage: %s [--intra-gbs B] [--inter-gbs B] [--layers L]\n", argv[0]);
        return 2;
    }
    printf("bench_hier: GPT-2 124M shapes (%d layers), bf16, N = %d as %d nodes x %d (local comm); bytes per "
           "rank per step measured (payload), step comm time modelled at %.0f GB/s inside, %.0f GB/s "
           "between nodes\n", cfg.layers, BH_N, BH_N / BH_R, BH_R, bi / 1e9, bo / 1e9);
    printf("%-18s | %-14s %-14s | %-14s %-14s | %-9s\n", "mode", "intra MB", "(formula)", "inter MB",
           "(formula)", "comm ms");
    for (m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        bh_run B;
        zero_result r;
        zero_estimate_desc ed;
        zero_estimate est;

        double in = 0, out = 0, ms;
        memset(&B, 0, sizeof B);
        B.cfg = &cfg;
        B.mode = &modes[m];
        r = zero_local_run(BH_N, bh_rank, &B);
        if (r != ZERO_OK) {
            fprintf(stderr, "%s: %s\n", modes[m].name, zero_last_error());
            return 1;
        }
        for (k = 0; k < ZERO_COLL_CONTROL; k++) {
            in += B.traffic.intra_bytes[k];
            out += B.traffic.inter_bytes[k];
        }
        memset(&ed, 0, sizeof ed);
        memset(&est, 0, sizeof est);
        ed.params = B.psi;
        ed.ranks = BH_N;
        ed.stage = modes[m].stage;
        ed.ranks_per_node = BH_R;
        ed.mics_shard_size = modes[m].mics;
        ed.hpz_partition_size = modes[m].hpz;
        if (zero_estimate_compute(&ed, &est) != ZERO_OK) {
            fprintf(stderr, "estimator: %s\n", zero_last_error());
            return 1;
        }
        if (modes[m].qw || modes[m].qg) { /* docs/engine.md's per-group formula, A = 1 */
            double p = 2.0, shard = (double)B.psi / BH_N * p, fwd = modes[m].qw ? B.q8 : shard;
            double grad = B.q4, later = modes[m].hpz ? 0.0 : shard;
            int two = modes[m].lv != 1, M = BH_N / BH_R; /* qgZ two-level: M inside, M-1 between */
            est.step_inter_bytes = (fwd + later) * (BH_N - BH_R) + grad * (two ? M - 1 : BH_N - BH_R);
            est.step_intra_bytes = (fwd + later) * (BH_R - 1) + grad * (two ? (BH_R - 1) * M : BH_R - 1) +
                                   (modes[m].hpz ? B.sec * p * (modes[m].hpz - 1) : 0.0);
        }
        if (fabs(est.step_intra_bytes - in) > 1e-9 * in + 1 || fabs(est.step_inter_bytes - out) > 1e-9 * out + 1)
            bad = 1;
        ms = 1e3 * (in / bi + out / bo);
        if (modes[m].stage == 3 && !modes[m].mics && !modes[m].hpz && !modes[m].qw && !modes[m].qg) {
            base = ms;
            flat3_inter = out;
        }
        printf("%-18s | %-14.1f %-14.1f | %-14.1f %-14.1f | %-9.2f\n", modes[m].name, in / 1e6,
               est.step_intra_bytes / 1e6, out / 1e6, est.step_inter_bytes / 1e6, ms);
        if (base > 0.0 && modes[m].stage == 3 && ms != base)
            printf("%-18s   (%.2fx less comm time than flat stage 3; between nodes %.3f M, flat stage 3 = 3 M)\n",
                   "", base / ms, 3.0 * out / flat3_inter);
        fflush(stdout);
    }
    printf("Psi (padded) = the plan's numel; measured = formula: %s\n", bad ? "NO" : "yes");
    return bad;
}
