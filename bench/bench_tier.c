/* The NVMe tier between steps: commit, init (zero_engine_set_tensor of every tensor), save
   and load of one rank's engine whose optimizer state and param shards live on NVMe
   (stage 3, offload_optimizer = offload_param = nvme), against the same engine without
   offload and against the disk's bound, in the same run and the same directory.

   The bound of an operation is the time the disk needs for the bytes it must move, at the
   rates fio measures in this run with the tier's block size, queue depth, O_DIRECT,
   io_uring, a file of the tier's size, in the same directory: (bytes read) / (fio's read
   rate) + (bytes written) / (fio's write rate), the tier's bytes (zero_engine_nvme_stats:
   the requests completed within the operation) plus the checkpoint's (the files a save
   writes, the shard file a load reads). Target: tier time / bound <= 1.2 for init, save
   and load. The checkpoint is dropped from the page cache before each load (fdatasync,
   posix_fadvise DONTNEED), so a load reads it from the disk, as after a restart. Each rep
   runs fio, the plain engine and the NVMe engine in turn (interleaved); the best time of
   each operation and fio's best rates are reported. Without fio on PATH it prints a skip
   line and reports the times and the ratios to the plain run only. It also prints the tier's
   bytes read and written by each operation next to the tier's size: each byte once.

   usage: bench_tier [--params N] [--groups G] [--dir D] [--reps R]
   N accepts 100M, 1B, ... (default 100M; ZERO_BENCH_TIER_PARAMS too); the plain run holds
   one engine's state in memory (16 N bytes) and the NVMe run writes about 4 x 14 N bytes
   of files, removed at the end. D defaults to $ZERO_BENCH_DIR, else /var/tmp. R: 1. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h" /* bench_now, bench_fio */

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
    uint64_t ck_written, ck_read; /* the checkpoint's files: written by the save, read by the load */
    size_t block;
    int depth;
} tier_run;

/* Sums the sizes of the regular files in dir; with evict, each is also written back and
   dropped from the page cache (so the next read comes from the disk). */
static uint64_t dir_files(const char *dir, int evict)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    uint64_t total = 0;
    if (!d) return 0;
    while ((de = readdir(d)) != NULL) {
        char path[1200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        total += (uint64_t)st.st_size;
        if (evict) {
            int fd = open(path, O_RDONLY);
            if (fd >= 0) {
                (void)fdatasync(fd);
                (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
                close(fd);
            }
        }
    }
    closedir(d);
    return total;
}

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
    {
        zero_engine_desc rd;
        memset(&rd, 0, sizeof rd);
        CHECK(zero_engine_get_desc(e, &rd));
        R->block = rd.block_size;
        R->depth = rd.queue_depth;
    }
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
    R->ck_written = dir_files(R->ckdir, 1); /* and out of the page cache */
    CHECK(make_engine(R, dev, comm, &e2));
    CHECK(zero_engine_commit(e2));
    CHECK(zero_engine_nvme_stats(e2, &a));
    t0 = bench_now();
    CHECK(zero_engine_load(e2, R->ckdir));
    R->t_load = bench_now() - t0;
    CHECK(zero_engine_nvme_stats(e2, &b));
    diff_stats(&a, &b, &R->s_load);
    R->ck_read = R->ck_written; /* the manifest and this rank's shard file, whole */
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

static double mind(double a, double b) { return a < b ? a : b; }

/* The disk's time for an operation's bytes at fio's rates. */
static double bound_s(double rd, double wr, double fio_r, double fio_w) { return rd / fio_r + wr / fio_w; }

int main(int argc, char **argv)
{
    tier_run R[2], best[2];
    const char *dir = getenv("ZERO_BENCH_DIR") ? getenv("ZERO_BENCH_DIR") : "/var/tmp";
    const char *ps = getenv("ZERO_BENCH_TIER_PARAMS");
    size_t params = ps ? parse_count(ps) : (size_t)100000000;
    int groups = 16, reps = 1, k, i, rep, fio = 0;
    double fio_r = 0, fio_w = 0;
    char cmd[700], fiofile[700];
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--params") && i + 1 < argc) params = parse_count(argv[++i]);
        else if (!strcmp(argv[i], "--groups") && i + 1 < argc) groups = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_tier [--params N] [--groups G] [--dir D] [--reps R]\n");
            return 2;
        }
    }
    if (groups < 1 || reps < 1 || params < (size_t)groups * PER_GROUP) {
        fprintf(stderr, "bench_tier: too few params for %d groups (or reps < 1)\n", groups);
        return 2;
    }
    printf("bench_tier: Psi = %zu (%d groups), stage 3, 1 rank, fp16, dir %s, %d rep(s) (fio, plain, NVMe "
           "interleaved; best of each)\n",
           params, groups, dir, reps);
    fio = bench_have_fio();
    if (!fio) printf("bench_tier: fio not found on PATH: the disk's bound is skipped (apt-get install -y fio)\n");
    snprintf(fiofile, sizeof fiofile, "%s/zero-bench-tier-fio-%ld.bin", dir, (long)getpid());
    memset(best, 0, sizeof best);
    for (rep = 0; rep < reps; rep++) {
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
            if (rep == 0) {
                best[k] = R[k];
            } else {
                best[k].t_commit = mind(best[k].t_commit, R[k].t_commit);
                best[k].t_init = mind(best[k].t_init, R[k].t_init);
                best[k].t_save = mind(best[k].t_save, R[k].t_save);
                best[k].t_load = mind(best[k].t_load, R[k].t_load);
            }
            printf("  rep %d %-5s init %.3f s, save %.3f s, load %.3f s\n", rep + 1, k ? "nvme" : "plain",
                   R[k].t_init, R[k].t_save, R[k].t_load);
            fflush(stdout);
        }
        if (fio) { /* the same block, depth, O_DIRECT and directory, a file of the tier's size */
            uint64_t size = (R[1].tier_bytes + ((uint64_t)1 << 20) - 1) / ((uint64_t)1 << 20) * ((uint64_t)1 << 20);
            double w = bench_fio(fiofile, size, R[1].block, R[1].depth, "write");
            double r = w > 0 ? bench_fio(fiofile, size, R[1].block, R[1].depth, "read") : -1.0;
            unlink(fiofile);
            if (w <= 0 || r <= 0) {
                printf("bench_tier: fio failed (is its io_uring engine allowed here?): the bound is skipped\n");
                fio = 0;
            } else {
                printf("  rep %d fio   write %.0f MB/s, read %.0f MB/s (%zu-byte blocks, depth %d, O_DIRECT, %llu bytes)\n",
                       rep + 1, w / 1e6, r / 1e6, R[1].block, R[1].depth, (unsigned long long)size);
                if (w > fio_w) fio_w = w;
                if (r > fio_r) fio_r = r;
            }
            fflush(stdout);
        }
    }
    printf("%-8s %10s %10s %10s %10s\n", "", "commit s", "init s", "save s", "load s");
    printf("%-8s %10.3f %10.3f %10.3f %10.3f\n", "plain", best[0].t_commit, best[0].t_init, best[0].t_save, best[0].t_load);
    printf("%-8s %10.3f %10.3f %10.3f %10.3f\n", "nvme", best[1].t_commit, best[1].t_init, best[1].t_save, best[1].t_load);
    printf("%-8s %10s %10.2f %10.2f %10.2f   (nvme / plain)\n", "ratio", "", best[1].t_init / best[0].t_init,
           best[1].t_save / best[0].t_save, best[1].t_load / best[0].t_load);
    printf("NVMe tier %llu bytes; read / written: init %llu / %llu (the last record and shard are "
           "written at the save), save %llu / %llu, load %llu / %llu; checkpoint %llu bytes\n",
           (unsigned long long)R[1].tier_bytes, (unsigned long long)R[1].s_init.bytes_read,
           (unsigned long long)R[1].s_init.bytes_written, (unsigned long long)R[1].s_save.bytes_read,
           (unsigned long long)R[1].s_save.bytes_written, (unsigned long long)R[1].s_load.bytes_read,
           (unsigned long long)R[1].s_load.bytes_written, (unsigned long long)R[1].ck_written);
    if (fio) {
        const tier_run *n = &R[1], *pl = &R[0];
        double bi = bound_s((double)n->s_init.bytes_read, (double)n->s_init.bytes_written, fio_r, fio_w);
        double bs = bound_s((double)n->s_save.bytes_read, (double)(n->s_save.bytes_written + n->ck_written), fio_r, fio_w);
        double bl = bound_s((double)(n->s_load.bytes_read + n->ck_read), (double)n->s_load.bytes_written, fio_r, fio_w);
        double ps_ = bound_s(0, (double)pl->ck_written, fio_r, fio_w), pl_ = bound_s((double)pl->ck_read, 0, fio_r, fio_w);
        printf("disk's bound at fio's best rates (write %.0f MB/s, read %.0f MB/s): bytes read / fio read + bytes "
               "written / fio write\n",
               fio_w / 1e6, fio_r / 1e6);
        printf("%-8s %10s %10s %10s %10s\n", "", "", "init", "save", "load");
        printf("%-8s %10s %10.3f %10.3f %10.3f   (s: the NVMe tier's bytes + the checkpoint's)\n", "bound", "", bi, bs, bl);
        printf("%-8s %10s %10.2f %10.2f %10.2f   (target <= 1.2)\n", "nvme/bnd", "", best[1].t_init / bi,
               best[1].t_save / bs, best[1].t_load / bl);
        printf("%-8s %10s %10s %10.2f %10.2f   (the plain engine: the checkpoint's bytes alone, bound %.3f / %.3f s)\n",
               "plain/bd", "", "-", best[0].t_save / ps_, best[0].t_load / pl_, ps_, pl_);
    }
    return 0;
}
