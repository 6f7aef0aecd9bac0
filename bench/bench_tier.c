/* The NVMe tier between steps: commit, init (zero_engine_set_tensor of every tensor), save
   and load of one rank's engine whose optimizer state and param shards live on NVMe
   (stage 3, offload_optimizer = offload_param = nvme), against the same engine without
   offload, in the same run and the same directory. Ratio = NVMe time / plain time (target
   <= 1.5 for init, save and load). It also prints the tier's bytes read and written by
   each operation (zero_engine_nvme_stats) next to the tier's size: each byte once.

   usage: bench_tier [--params N] [--groups G] [--dir D]
   N accepts 100M, 1B, ... (default 100M; ZERO_BENCH_TIER_PARAMS too); the plain run holds
   two engines' state in memory (2 x 16 N bytes) and the NVMe run writes about 4 x 14 N
   bytes of files, removed at the end. D defaults to $ZERO_BENCH_DIR, else /var/tmp. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h" /* bench_now */

#define CHECK(call)                                                                          \
    do {                                                                                     \
        zero_result r_ = (call);                                                             \
        if (r_ != ZERO_OK) {                                                                 \
            fprintf(stderr, "bench_tier: %s: %s\n", #call, zero_last_error());               \
            return r_;                                                                       \
        }                                                                                    \
    } while (0)

typedef struct tier_run {
    size_t params;
    int groups, nvme;
    const char *dir;
    char ckdir[600];
    double t_commit, t_init, t_save, t_load;
    zero_io_stats s_init, s_save, s_load;
    uint64_t tier_bytes;
} tier_run;

#define PER_GROUP 4

static zero_result make_engine(tier_run *R, zero_device *dev, zero_comm *comm, zero_engine **out)
{
    zero_engine_desc d;
    size_t per = R->params / ((size_t)R->groups * PER_GROUP);
    int g, t;
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = dev;
    d.comm = comm;
    if (R->nvme) {
        d.offload_optimizer = ZERO_OFFLOAD_NVME;
        d.offload_param = ZERO_OFFLOAD_NVME;
        d.nvme_path = R->dir;
    }
    CHECK(zero_engine_create(&d, out));
    for (g = 0; g < R->groups; g++)
        for (t = 0; t < PER_GROUP; t++) {
            char name[32];
            snprintf(name, sizeof name, "g%d.t%d", g, t);
            CHECK(zero_engine_add_tensor(*out, name, per + (size_t)t, g, 0, NULL));
        }
    return ZERO_OK;
}

static void diff_stats(const zero_io_stats *a, const zero_io_stats *b, zero_io_stats *out)
{
    memset(out, 0, sizeof *out);
    out->bytes_read = b->bytes_read - a->bytes_read;
    out->bytes_written = b->bytes_written - a->bytes_written;
}

static zero_result tier_rank(int rank, zero_comm *comm, void *user)
{
    tier_run *R = (tier_run *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL, *e2 = NULL;
    zero_io_stats a, b;
    zero_engine_memory nv;
    float *vals;
    size_t per = R->params / ((size_t)R->groups * PER_GROUP) + PER_GROUP, i;
    int t, nt = R->groups * PER_GROUP;
    double t0;
    (void)rank;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    CHECK(zero_host_device_create(NULL, &dev));
    vals = (float *)malloc(per * sizeof *vals);
    if (!vals) return ZERO_ERROR_OUT_OF_MEMORY;
    for (i = 0; i < per; i++) vals[i] = 0.001f * (float)(i % 1000);
    CHECK(make_engine(R, dev, comm, &e));
    t0 = bench_now();
    CHECK(zero_engine_commit(e));
    R->t_commit = bench_now() - t0;
    CHECK(zero_engine_memory_tier(e, ZERO_TIER_NVME, &nv));
    R->tier_bytes = nv.total_bytes;
    CHECK(zero_engine_nvme_stats(e, &a));
    t0 = bench_now();
    for (t = 0; t < nt; t++) CHECK(zero_engine_set_tensor(e, t, vals));
    CHECK(zero_engine_nvme_stats(e, &b)); /* what set_tensor moved, written back at the save */
    R->t_init = bench_now() - t0;
    diff_stats(&a, &b, &R->s_init);
    a = b;
    t0 = bench_now();
    CHECK(zero_engine_save(e, R->ckdir));
    R->t_save = bench_now() - t0;
    CHECK(zero_engine_nvme_stats(e, &b));
    diff_stats(&a, &b, &R->s_save);
    zero_engine_destroy(e);
    CHECK(make_engine(R, dev, comm, &e2));
    CHECK(zero_engine_commit(e2));
    CHECK(zero_engine_nvme_stats(e2, &a));
    t0 = bench_now();
    CHECK(zero_engine_load(e2, R->ckdir));
    R->t_load = bench_now() - t0;
    CHECK(zero_engine_nvme_stats(e2, &b));
    diff_stats(&a, &b, &R->s_load);
    zero_engine_destroy(e2);
    zero_device_destroy(dev);
    free(vals);
    return ZERO_OK;
}

static size_t parse_count(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1e3;
    if (*end == 'M' || *end == 'm') v *= 1e6;
    if (*end == 'B' || *end == 'b' || *end == 'G' || *end == 'g') v *= 1e9;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    tier_run R[2];
    const char *dir = getenv("ZERO_BENCH_DIR") ? getenv("ZERO_BENCH_DIR") : "/var/tmp";
    const char *ps = getenv("ZERO_BENCH_TIER_PARAMS");
    size_t params = ps ? parse_count(ps) : (size_t)100000000;
    int groups = 16, k, i;
    char cmd[700];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--params") && i + 1 < argc) params = parse_count(argv[++i]);
        else if (!strcmp(argv[i], "--groups") && i + 1 < argc) groups = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else {
            fprintf(stderr, "usage: bench_tier [--params N] [--groups G] [--dir D]\n");
            return 2;
        }
    }
    if (groups < 1 || params < (size_t)groups * PER_GROUP) {
        fprintf(stderr, "bench_tier: too few params for %d groups\n", groups);
        return 2;
    }
    printf("bench_tier: Psi = %zu (%d groups), stage 3, 1 rank, fp16, dir %s\n", params, groups, dir);
    for (k = 0; k < 2; k++) { /* plain first, then NVMe */
        memset(&R[k], 0, sizeof R[k]);
        R[k].params = params;
        R[k].groups = groups;
        R[k].nvme = k;
        R[k].dir = dir;
        snprintf(R[k].ckdir, sizeof R[k].ckdir, "%s/zero-bench-tier-XXXXXX", dir);
        if (!mkdtemp(R[k].ckdir)) {
            fprintf(stderr, "bench_tier: cannot make a directory under %s\n", dir);
            return 1;
        }
        if (zero_local_run(1, tier_rank, &R[k]) != ZERO_OK) {
            fprintf(stderr, "bench_tier: %s\n", zero_last_error());
            return 1;
        }
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", R[k].ckdir);
        if (system(cmd) != 0) fprintf(stderr, "bench_tier: could not remove %s\n", R[k].ckdir);
    }
    printf("%-8s %10s %10s %10s %10s\n", "", "commit s", "init s", "save s", "load s");
    printf("%-8s %10.3f %10.3f %10.3f %10.3f\n", "plain", R[0].t_commit, R[0].t_init, R[0].t_save, R[0].t_load);
    printf("%-8s %10.3f %10.3f %10.3f %10.3f\n", "nvme", R[1].t_commit, R[1].t_init, R[1].t_save, R[1].t_load);
    printf("%-8s %10s %10.2f %10.2f %10.2f   (target <= 1.5)\n", "ratio", "", R[1].t_init / R[0].t_init,
           R[1].t_save / R[0].t_save, R[1].t_load / R[0].t_load);
    printf("NVMe tier %llu bytes; read / written: init %llu / %llu (the last record and shard are "
           "written at the save), save %llu / %llu, load %llu / %llu\n",
           (unsigned long long)R[1].tier_bytes, (unsigned long long)R[1].s_init.bytes_read,
           (unsigned long long)R[1].s_init.bytes_written, (unsigned long long)R[1].s_save.bytes_read,
           (unsigned long long)R[1].s_save.bytes_written, (unsigned long long)R[1].s_load.bytes_read,
           (unsigned long long)R[1].s_load.bytes_written);
    return 0;
}
