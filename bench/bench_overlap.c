/* Stage-3 NVMe param reads against compute: the backward with its params on NVMe
   (offload_param = nvme) against the same backward with the params on the device
   (offload_param = none), both with the optimizer state on NVMe, in the same run, for a range
   of tokens per step.

   The model is bench_infinity's (G layers of n = Psi / G bf16 params, 1 rank), with each
   layer doing the matrix products of a linear layer over T tokens (forward 2 T n FLOPs,
   backward 4 T n: bench_infinity.c --tokens; the model is in bench/bench_common.h). A backward gathers each layer in reverse
   order; with NVMe params each gather needs the layer's shard (2 n bytes) from the file, and
   the engine reads shards ahead of the gathers in the recorded order on its I/O engine
   (io_uring or threads) while the caller computes. The ratio backward(nvme) /
   backward(device) is then near 1 where a layer's compute outlasts its read, and tends to
   (read time) / (compute time) where it does not: both are printed, with the time the
   caller spent inside zero_engine_gather (the part of the reads not hidden) and the disk's
   read rate measured first (zero_io, O_DIRECT, 1 MiB, depth 8, same directory).

       build/bench_overlap [--params 50M] [--groups 8] [--tokens 1,4,16,64] [--steps 3]
                           [--reps 2] [--dir /var/tmp]

   (the defaults take about two minutes on 2 cores, for make bench; docs/BENCHMARKS.md has
   --params 100M --groups 16 --tokens 1,4,16,64,256)

   Timings are steps 2.. (the first step reads nothing: the tier starts as the files'
   zeros); each figure is the best of those steps over --reps runs of each kind, run in
   turn (device, NVMe, device, ...) so that other work on the machine hurts both alike.
   Besides the measured ratio it prints 1 + (gather extra) / (backward on the device): the
   ratio the NVMe tier causes by itself, which a busy machine's noise in the compute does
   not move. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZERO_BENCH_INFINITY
#define ZERO_BENCH_INFINITY_TOOLS
#include "bench_common.h" /* bench_infinity's model: inf_train, inf_disk_rates, inf_parse */

static double ov_best(const double *v, int steps)
{
    double b = 1e300;
    int s;
    for (s = 1; s < steps; s++)
        if (v[s] < b) b = v[s];
    return b;
}

int main(int argc, char **argv)
{
    inf_cfg c;
    inf_result dev, nv;
    const char *tok = "1,4,16,64";
    double wr = 0, rd = 0;
    int i, reps = 2;
    memset(&c, 0, sizeof c);
    c.params = 50000000ull;
    c.groups = 8;
    c.ranks = 1;
    c.steps = 3;
    c.dir = getenv("ZERO_BENCH_DIR") ? getenv("ZERO_BENCH_DIR") : "/var/tmp";
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--params") && i + 1 < argc) c.params = inf_parse(argv[++i]);
        else if (!strcmp(argv[i], "--groups") && i + 1 < argc) c.groups = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tok = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) c.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) c.dir = argv[++i];
        else {
            fprintf(stderr, "usage: bench_overlap [--params 50M] [--groups 8] [--tokens 1,4,16,64] "
                            "[--steps 3] [--reps 2] [--dir D]\n");
            return 2;
        }
    }
    if (c.steps < 2 || reps < 1) {
        fprintf(stderr, "bench_overlap: --steps >= 2 (the first step reads nothing), --reps >= 1\n");
        return 2;
    }
    if (inf_disk_rates(c.dir, (uint64_t)1 << 30, &wr, &rd) != 0) {
        fprintf(stderr, "bench_overlap: cannot measure the disk under %s\n", c.dir);
        return 1;
    }
    printf("bench_overlap: Psi = %.3g in %d layers of %.3g bf16 params, stage 3, 1 rank, optimizer on NVMe; "
           "params on NVMe vs on the device\n",
           (double)c.params, c.groups, (double)(c.params / (uint64_t)c.groups));
    printf("disk under %s (zero_io, O_DIRECT, 1 MiB, depth 8, 1 GiB): write %.2f GB/s, read %.2f GB/s; "
           "a layer's shard (%.1f MB) reads in %.1f ms\n",
           c.dir, wr / 1e9, rd / 1e9, 2.0 * (double)(c.params / (uint64_t)c.groups) / 1e6,
           2.0 * (double)(c.params / (uint64_t)c.groups) / rd * 1e3);
    printf("%7s %11s %11s %6s %8s %14s %12s %11s %12s %10s %8s %7s\n", "tokens", "bwd device", "bwd nvme", "ratio",
           "I/O rat.", "compute/layer", "(nvme run)", "read/layer", "gather extra", "read wait", "GFLOP/s", "demand");
    fflush(stdout);
    while (*tok) {
        char *end;
        long t = strtol(tok, &end, 10);
        double bd = 1e300, bn = 1e300, work = 1e300, wn = 1e300, gd = 1e300, gn = 1e300, rw = 1e300, rl;
        int k;
        uint64_t demand = 0;
        if (end == tok || t < 0) {
            fprintf(stderr, "bench_overlap: --tokens is a list like 16,64,256\n");
            return 2;
        }
        tok = *end == ',' ? end + 1 : end;
        c.tokens = (int)t;
        for (k = 0; k < reps; k++) {
            double v;
            c.params_on_device = 1;
            if (inf_train(&c, &dev) != ZERO_OK) {
                fprintf(stderr, "bench_overlap: %s\n", dev.err);
                return 1;
            }
            c.params_on_device = 0;
            if (inf_train(&c, &nv) != ZERO_OK) {
                fprintf(stderr, "bench_overlap: %s\n", nv.err);
                return 1;
            }
            if ((v = ov_best(dev.bwd_s, c.steps)) < bd) bd = v;
            if ((v = ov_best(nv.bwd_s, c.steps)) < bn) bn = v;
            if ((v = ov_best(dev.bwd_work_s, c.steps) / c.groups) < work) work = v;
            if ((v = ov_best(nv.bwd_work_s, c.steps) / c.groups) < wn) wn = v;
            if ((v = ov_best(dev.bwd_gather_s, c.steps)) < gd) gd = v;
            if ((v = ov_best(nv.bwd_gather_s, c.steps)) < gn) gn = v;
            if ((v = ov_best(nv.bwd_read_wait_s, c.steps)) < rw) rw = v;
            demand += nv.bwd_reads_demand[c.steps - 1];
        }
        rl = 2.0 * (double)(c.params / (uint64_t)c.groups) / rd;
        printf("%7ld %9.3f s %9.3f s %6.2f %8.2f %11.1f ms %9.1f ms %8.1f ms %9.1f ms %7.1f ms %8.1f %7llu\n", t, bd,
               bn, bn / bd, 1.0 + (gn - gd) / bd, work * 1e3, wn * 1e3, rl * 1e3, (gn - gd) * 1e3, rw * 1e3,
               work > 0 ? dev.flops * 4.0 / 6.0 / c.groups / work / 1e9 : 0.0, (unsigned long long)demand);
        fflush(stdout);
    }
    printf("ratio = backward with NVMe params / with the params on the device (target <= 1.2). gather extra =\n"
           "the extra time the backward's zero_engine_gather calls took with NVMe params (read waits, the read's\n"
           "checksum and the upload copy, on the caller's thread); I/O rat. = 1 + gather extra / bwd device;\n"
           "compute/layer: the layer's products in the device run, and (nvme run) in the NVMe run;\n"
           "read wait = of which waiting for shard reads (zero_gather_stats.nvme_read_wait_s); demand = the\n"
           "last backwards' shard reads not issued ahead (all runs)\n");
    return 0;
}
