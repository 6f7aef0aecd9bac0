/* Checkpoint throughput: zero_engine_save / zero_engine_load of one rank's state (fp32
   master, m, v and fp16 params: 14 bytes per element) against a plain sequential write and
   read of the same number of bytes in the same run, to the same directory. The plain write
   gets the same durability as the save (write, fsync, rename, fsync of the directory); the
   save adds the device-to-host copies and the CRC32C checksums, the load the checks, the
   copy into staging and the upload. Ratio = plain time / checkpoint time (target >= 0.8).

   usage: bench_ckpt [MB of state]   (default 1100, i.e. > 1 GiB; ZERO_BENCH_CKPT_MB too)
   The directory is $ZERO_BENCH_DIR, else $TMPDIR, else /tmp. Best of 3 of each. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h" /* bench_now */

#define CHECK(call)                                                                          \
    do {                                                                                     \
        zero_result r_ = (call);                                                             \
        if (r_ != ZERO_OK) {                                                                 \
            fprintf(stderr, "bench_ckpt: %s: %s\n", #call, zero_last_error());               \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static const char *g_dir;
static size_t g_numel;
static double t_save = 1e30, t_load = 1e30, t_write = 1e30, t_read = 1e30;
static size_t g_bytes;

static double plain_write(const unsigned char *buf, size_t n)
{
    char path[600], tmp[610];
    double t0 = bench_now();
    size_t at = 0;
    int fd;
    snprintf(path, sizeof path, "%s/plain.bin", g_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) exit(1);
    while (at < n) {
        size_t c = n - at < ((size_t)16 << 20) ? n - at : ((size_t)16 << 20);
        ssize_t w = write(fd, buf + at, c);
        if (w <= 0) exit(1);
        at += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) exit(1);
    fd = open(g_dir, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) exit(1);
    close(fd);
    return bench_now() - t0;
}

static double plain_read(unsigned char *buf, size_t n)
{
    char path[600];
    double t0 = bench_now();
    size_t at = 0;
    int fd;
    snprintf(path, sizeof path, "%s/plain.bin", g_dir);
    fd = open(path, O_RDONLY);
    if (fd < 0) exit(1);
    while (at < n) {
        size_t c = n - at < ((size_t)16 << 20) ? n - at : ((size_t)16 << 20);
        ssize_t got = read(fd, buf + at, c);
        if (got <= 0) exit(1);
        at += (size_t)got;
    }
    close(fd);
    return bench_now() - t0;
}

static zero_result rank_main(int rank, zero_comm *comm, void *user)
{
    zero_device *dev;
    zero_engine *e;
    zero_engine_desc d;
    int t, rep, ids[8];
    size_t per = g_numel / 8, i;
    float *v;
    unsigned char *plain;
    char ckdir[600];
    (void)rank;
    (void)user;
    CHECK(zero_host_device_create(NULL, &dev));
    memset(&d, 0, sizeof d);
    d.stage = 1;
    d.device = dev;
    d.comm = comm;
    CHECK(zero_engine_create(&d, &e));
    for (t = 0; t < 8; t++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d.weight", t);
        CHECK(zero_engine_add_tensor(e, name, per, t / 2, 0, &ids[t]));
    }
    CHECK(zero_engine_commit(e));
    v = (float *)malloc(per * sizeof(float));
    if (!v) exit(1);
    for (i = 0; i < per; i++) v[i] = (float)(i % 1000) * 1e-3f;
    for (t = 0; t < 8; t++) CHECK(zero_engine_set_tensor(e, ids[t], v));
    free(v);
    g_bytes = 8 * per * 14;
    plain = (unsigned char *)malloc(g_bytes);
    if (!plain) exit(1);
    memset(plain, 0x5a, g_bytes);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", g_dir);
    for (rep = 0; rep < 3; rep++) {
        double t0, dt;
        dt = plain_write(plain, g_bytes);
        if (dt < t_write) t_write = dt;
        t0 = bench_now();
        CHECK(zero_engine_save(e, ckdir));
        dt = bench_now() - t0;
        if (dt < t_save) t_save = dt;
        dt = plain_read(plain, g_bytes);
        if (dt < t_read) t_read = dt;
        t0 = bench_now();
        CHECK(zero_engine_load(e, ckdir));
        dt = bench_now() - t0;
        if (dt < t_load) t_load = dt;
    }
    free(plain);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

int main(int argc, char **argv)
{
    const char *env = getenv("ZERO_BENCH_CKPT_MB");
    double mb = argc > 1 ? atof(argv[1]) : env ? atof(env) : 1100.0;
    char dir[512], cmd[600];
    const char *base = getenv("ZERO_BENCH_DIR");
    if (!base) base = getenv("TMPDIR");
    if (!base) base = "/tmp";
    if (!(mb > 0)) mb = 1100.0;
    g_numel = (size_t)(mb * 1e6 / 14.0) / 8 * 8;
    snprintf(dir, sizeof dir, "%s/zero-bench-ckpt-%d", base, (int)getpid());
    if (mkdir(dir, 0755) != 0) {
        perror(dir);
        return 1;
    }
    g_dir = dir;
    CHECK(zero_local_run(1, rank_main, NULL));
    printf("checkpoint of %.0f MB of state (%zu elements x 14 bytes, 1 rank, stage 1, fp16) in %s\n",
           (double)g_bytes / 1e6, g_numel, base);
    printf("  plain write+fsync  %7.3f s  %7.0f MB/s\n", t_write, (double)g_bytes / 1e6 / t_write);
    printf("  zero_engine_save   %7.3f s  %7.0f MB/s   ratio %.2f (target >= 0.8)\n", t_save,
           (double)g_bytes / 1e6 / t_save, t_write / t_save);
    printf("  plain read         %7.3f s  %7.0f MB/s\n", t_read, (double)g_bytes / 1e6 / t_read);
    printf("  zero_engine_load   %7.3f s  %7.0f MB/s   ratio %.2f (target >= 0.8)\n", t_load,
           (double)g_bytes / 1e6 / t_load, t_read / t_load);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return 0;
}
