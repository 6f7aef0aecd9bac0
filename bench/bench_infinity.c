/* What ZeRO-Infinity is for: a model whose states do not fit in this machine's memory,
   trained with its params, gradients and optimizer state off the device (stage 3,
   offload_optimizer = offload_param = nvme) on a host device with a small memory budget.

   The model: G groups ("layers") of one bf16 tensor each; the loss is the sum over layers of
   half the mean squared distance of the layer's params to a fixed target, so its gradient
   is (p - t) / n and Adam moves every param towards its target: the loss must fall. Each
   step runs a forward (gather, loss, release per layer), a backward in reverse (gather,
   gradients, release, grads_ready) and the step, on R ranks (threads), the same data on
   every rank.

   It prints the model states (16 Psi bytes: params, grads, master, m, v), the machine's RAM
   and their ratio, the bytes of each tier on rank 0, peak RSS, seconds per step, the NVMe
   bytes moved per step and the ratio of the step time to the I/O bound (those bytes at the
   disk's sequential read and write rates, measured first in the same run with the same I/O
   engine, block size and queue depth), and whether the loss moved.

   usage: bench_infinity [--params 4B] [--groups 80] [--ranks 1] [--steps 3]
                         [--dir /var/tmp] [--budget 2GB] [--plain] [--grads-nvme] [--tokens T]
   --plain trains the same model without offload (for comparison at a size that fits).
   --grads-nvme puts the reduced gradient shard on NVMe too (offload_gradients = nvme)
   instead of host memory: the host then holds staging only, whatever Psi.
   --tokens T gives each layer the matrix products of a linear layer over T tokens (its
   params as a [n / 1024, 1024] weight): forward 2 T n FLOPs, backward 4 T n (dX and dW),
   fp32 on the caller's thread, as a model's compute between the gathers (0 = none: the
   loss and its gradient only). bench/bench_overlap.c uses it to see where the NVMe reads
   hide behind compute.
   Not in CI at 4B (about 64 GB of files and many minutes); tests/test_infinity.c runs this
   code at a small Psi with a small budget and checks it against the plain run bit for bit.
   The model and its training loop (inf_train) live in bench/bench_common.h (section
   ZERO_BENCH_INFINITY), shared with bench/bench_overlap.c and tests/test_infinity.c. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define ZERO_BENCH_INFINITY
#define ZERO_BENCH_INFINITY_TOOLS
#include "bench_common.h" /* bench_now, the model: inf_train, inf_disk_rates, inf_parse */

int main(int argc, char **argv)
{
    inf_cfg c;
    inf_result res;
    struct rusage ru;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    double ram = (double)pages * (double)psz, wr = 0, rd = 0, total = 0, bound = 0;
    uint64_t rb = 0, wb = 0;
    int i, s;
    memset(&c, 0, sizeof c);
    c.params = 4000000000ull;
    c.groups = 80;
    c.ranks = 1;
    c.steps = 3;
    c.dir = getenv("ZERO_BENCH_DIR") ? getenv("ZERO_BENCH_DIR") : "/var/tmp";
    c.budget = (size_t)2 << 30;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--params") && i + 1 < argc) c.params = inf_parse(argv[++i]);
        else if (!strcmp(argv[i], "--groups") && i + 1 < argc) c.groups = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) c.ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) c.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) c.dir = argv[++i];
        else if (!strcmp(argv[i], "--budget") && i + 1 < argc) c.budget = (size_t)inf_parse(argv[++i]);
        else if (!strcmp(argv[i], "--plain")) c.plain = 1;
        else if (!strcmp(argv[i], "--grads-nvme")) c.grads_nvme = 1;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) c.tokens = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_infinity [--params 4B] [--groups 80] [--ranks 1] [--steps 3] "
                            "[--dir D] [--budget 2GB] [--plain] [--grads-nvme] [--tokens T]\n");
            return 2;
        }
    }
    printf("bench_infinity: Psi = %.3g (%d layers), stage 3, bf16, %d rank(s), %d steps, %s\n",
           (double)c.params, c.groups, c.ranks, c.steps,
           c.plain ? "no offload"
           : c.grads_nvme ? "params, gradients and optimizer state off the device (all three on NVMe)"
                          : "params, gradients and optimizer state off the device (NVMe; gradients in host memory)");
    printf("model states 16 Psi = %.1f GB; this machine's RAM %.1f GB: %.2fx\n", 16.0 * (double)c.params / 1e9,
           ram / 1e9, 16.0 * (double)c.params / ram);
    if (!c.plain) {
        if (inf_disk_rates(c.dir, (uint64_t)1 << 31, &wr, &rd) != 0) {
            fprintf(stderr, "bench_infinity: cannot measure the disk under %s\n", c.dir);
            return 1;
        }
        printf("disk under %s (zero_io, O_DIRECT, 1 MiB, depth 8, 2 GiB): write %.2f GB/s, read %.2f GB/s\n",
               c.dir, wr / 1e9, rd / 1e9);
        printf("device budget %zu bytes per rank\n", c.budget);
    }
    fflush(stdout);
    if (inf_train(&c, &res) != ZERO_OK) {
        fprintf(stderr, "bench_infinity: %s\n", res.err);
        return 1;
    }
    getrusage(RUSAGE_SELF, &ru);
    printf("commit %.2f s\n", res.commit_s);
    for (s = 0; s < c.steps; s++) {
        printf("step %d: loss %.6f  forward %.1f s, backward %.1f s, optimizer step %.1f s; NVMe read %.2f GB, written %.2f GB in the iteration\n",
               s + 1, res.loss[s], res.fwd_s[s], res.bwd_s[s], res.opt_s[s], (double)res.io_read[s] / 1e9,
               (double)res.io_written[s] / 1e9);
        if (s > 0) { /* the first step reads nothing (the tier starts as the files' zeros) */
            total += res.step_s[s];
            rb += res.io_read[s];
            wb += res.io_written[s];
        }
    }
    printf("loss after %d steps %.6f (from %.6f): %s\n", c.steps, res.loss[c.steps], res.loss[0],
           res.loss[c.steps] < res.loss[0] ? "the loss moved down" : "THE LOSS DID NOT FALL");
    printf("rank 0 bytes: device %zu (params %zu, grads %zu, master+m+v %zu, arena+buckets+scratch %zu) | "
           "host %zu (gradients %zu) | nvme %zu (gradients %zu)\n",
           res.dev.total_bytes, res.dev.bytes[ZERO_MEM_PARAM], res.dev.bytes[ZERO_MEM_GRAD],
           res.dev.bytes[ZERO_MEM_MASTER] + res.dev.bytes[ZERO_MEM_MOMENT1] + res.dev.bytes[ZERO_MEM_MOMENT2],
           res.dev.bytes[ZERO_MEM_GATHER] + res.dev.bytes[ZERO_MEM_BUCKET] + res.dev.bytes[ZERO_MEM_SCRATCH],
           res.host.total_bytes, res.host.bytes[ZERO_MEM_GRAD], res.nvme.total_bytes, res.nvme.bytes[ZERO_MEM_GRAD]);
    printf("peak RSS %.2f GB\n", (double)ru.ru_maxrss * 1024.0 / 1e9);
    if (c.steps > 1 && !c.plain) {
        double per = total / (double)(c.steps - 1);
        bound = ((double)rb / rd + (double)wb / wr) / (double)(c.steps - 1);
        printf("steps 2..%d: %.1f s/step; I/O bound %.1f s/step (%.1f GB read, %.1f GB written per step at "
               "the disk's rates): ratio %.2f\n",
               c.steps, per, bound, (double)rb / 1e9 / (c.steps - 1), (double)wb / 1e9 / (c.steps - 1),
               per / bound);
    }
    return res.loss[c.steps] < res.loss[0] ? 0 : 1;
}

