/* bench_nvme.c - throughput of the NVMe I/O engine (zero_io_*) against fio, measured in the
   same run with the same file system, block size, queue depth and O_DIRECT.

   The engine writes a file of --size bytes as tiles of --tile bytes (--ahead tiles queued at
   a time, so its queue of queue_depth requests stays full; the requests in flight never
   exceed queue_depth), then reads them back (the engine's threads take each block's CRC32C
   and the wait compares the joined CRC: that cost is in the figure). fio does the
   same sequential pattern on its own file: --rw=write then --rw=read, --bs=block,
   --iodepth=depth, --direct=1, --ioengine=io_uring. Each measurement is repeated --reps
   times, interleaved (fio, engine io_uring, engine threads) so that a busy machine hurts
   them alike, and the best of each is reported, with the ratio engine / fio.

   fio comes from Debian's package (apt-get install -y fio); without it the engine's
   figures are printed and the comparison is skipped with a line saying so.

       build/bench_nvme [--dir DIR] [--size BYTES] [--tile BYTES] [--block BYTES]
                        [--depth N] [--reps N] [--ahead TILES]

   --dir must be a directory where O_DIRECT works (default: the first of /var/tmp, /tmp
   that takes it); the files are removed at the end. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h" /* bench_now, bench_fio */

typedef struct opts {
    const char *dir;
    size_t size, tile, block;
    int depth, reps, ahead;
} opts;

/* Engine: write then read the whole file; bytes per second of each. 0 on success. */
static int run_engine(const opts *o, zero_io_backend backend, double *wbps, double *rbps)
{
    zero_io_desc d;
    zero_io *io = NULL;
    zero_io_file *f = NULL;
    unsigned char *buf[16];
    zero_io_ticket t[16];
    size_t tiles = o->size / o->tile, k, A = (size_t)o->ahead;
    double t0;
    int rc = 1;
    memset(buf, 0, sizeof buf);
    memset(t, 0, sizeof t);
    memset(&d, 0, sizeof d);
    d.backend = backend;
    d.direct = ZERO_IO_DIRECT_REQUIRE;
    d.block_size = o->block;
    d.queue_depth = o->depth;
    if (zero_io_create(&d, &io) != ZERO_OK) goto out;
    for (k = 0; k < A; k++) {
        size_t i;
        if (zero_io_buffer_alloc(io, o->tile, (void **)&buf[k]) != ZERO_OK) goto out;
        for (i = 0; i < o->tile; i++) buf[k][i] = (unsigned char)(i * (131u + 2u * k) + 7u);
    }
    if (zero_io_file_create(io, o->dir, "bench", 0, (uint64_t)tiles * o->tile, &f) != ZERO_OK) goto out;
    /* write: tile k from buffer k % A, at most A tiles queued */
    t0 = bench_now();
    for (k = 0; k < tiles; k++) {
        if (t[k % A] && zero_io_wait(io, t[k % A]) != ZERO_OK) goto out;
        t[k % A] = 0;
        if (zero_io_write(f, (uint64_t)k * o->tile, buf[k % A], o->tile, &t[k % A]) != ZERO_OK) goto out;
    }
    if (zero_io_wait_all(io) != ZERO_OK) goto out;
    *wbps = (double)tiles * (double)o->tile / (bench_now() - t0);
    memset(t, 0, sizeof t);
    /* read: the same, the wait checks each tile's checksum */
    t0 = bench_now();
    for (k = 0; k < tiles; k++) {
        if (t[k % A] && zero_io_wait(io, t[k % A]) != ZERO_OK) goto out;
        t[k % A] = 0;
        if (zero_io_read(f, (uint64_t)k * o->tile, buf[k % A], o->tile, &t[k % A]) != ZERO_OK) goto out;
    }
    if (zero_io_wait_all(io) != ZERO_OK) goto out;
    *rbps = (double)tiles * (double)o->tile / (bench_now() - t0);
    rc = 0;
out:
    if (rc) fprintf(stderr, "bench_nvme: engine (%s): %s\n", zero_io_backend_name(backend), zero_last_error());
    zero_io_file_destroy(f);
    if (io)
        for (k = 0; k < 16; k++) zero_io_buffer_free(io, buf[k]);
    zero_io_destroy(io);
    return rc;
}

static int direct_works(const char *dir)
{
    zero_io_desc d;
    zero_io *io = NULL;
    zero_io_file *f = NULL;
    int ok;
    memset(&d, 0, sizeof d);
    d.direct = ZERO_IO_DIRECT_REQUIRE;
    d.backend = ZERO_IO_BACKEND_THREADS;
    if (zero_io_create(&d, &io) != ZERO_OK) return 0;
    ok = zero_io_file_create(io, dir, "probe", 0, 4096, &f) == ZERO_OK;
    zero_io_file_destroy(f);
    zero_io_destroy(io);
    return ok;
}

static double mb(double bps) { return bps / 1e6; }

int main(int argc, char **argv)
{
    opts o;
    int i, r, fio, uring_ok;
    double fw = 0, fr = 0, ew[2] = {0, 0}, er[2] = {0, 0};
    char fiofile[700];
    zero_io *probe = NULL;
    zero_io_desc pd;
    o.dir = NULL;
    o.size = (size_t)512 << 20;
    o.tile = (size_t)16 << 20;
    o.block = ZERO_IO_DEFAULT_BLOCK_SIZE;
    o.depth = ZERO_IO_DEFAULT_QUEUE_DEPTH;
    o.reps = 3;
    o.ahead = 4;
    for (i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_nvme: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--dir") == 0) o.dir = v;
        else if (strcmp(a, "--size") == 0) o.size = (size_t)strtoull(v, NULL, 0);
        else if (strcmp(a, "--tile") == 0) o.tile = (size_t)strtoull(v, NULL, 0);
        else if (strcmp(a, "--block") == 0) o.block = (size_t)strtoull(v, NULL, 0);
        else if (strcmp(a, "--depth") == 0) o.depth = atoi(v);
        else if (strcmp(a, "--reps") == 0) o.reps = atoi(v);
        else if (strcmp(a, "--ahead") == 0) o.ahead = atoi(v);
        else {
            fprintf(stderr, "bench_nvme: unknown option %s\n", a);
            return 2;
        }
    }
    if (o.tile == 0 || o.tile % ZERO_IO_ALIGN || o.size < o.tile || o.reps < 1 || o.ahead < 1 || o.ahead > 16) {
        fprintf(stderr, "bench_nvme: --tile must be a positive multiple of %u, --size >= --tile, --reps >= 1, "
                "--ahead 1..16\n", ZERO_IO_ALIGN);
        return 2;
    }
    o.size = o.size / o.tile * o.tile;
    if (!o.dir) {
        if (direct_works("/var/tmp")) o.dir = "/var/tmp";
        else if (direct_works("/tmp")) o.dir = "/tmp";
    } else if (!direct_works(o.dir)) {
        o.dir = NULL;
    }
    if (!o.dir) {
        printf("bench_nvme: no directory given or found where O_DIRECT works: skipped\n");
        return 0;
    }
    memset(&pd, 0, sizeof pd);
    pd.backend = ZERO_IO_BACKEND_IO_URING;
    uring_ok = zero_io_create(&pd, &probe) == ZERO_OK;
    zero_io_destroy(probe);
    fio = bench_have_fio();
    snprintf(fiofile, sizeof fiofile, "%s/zero-bench-fio-%ld.bin", o.dir, (long)getpid());
    printf("bench_nvme: %s, %zu MiB file, block %zu KiB, queue depth %d, O_DIRECT, tiles of %zu MiB "
           "(%d queued ahead), best of %d\n",
           o.dir, o.size >> 20, o.block >> 10, o.depth, o.tile >> 20, o.ahead, o.reps);
    if (!fio) printf("bench_nvme: fio not found on PATH: the fio comparison is skipped (apt-get install -y fio)\n");
    for (r = 0; r < o.reps; r++) {
        double w, rd;
        if (fio) {
            w = bench_fio(fiofile, o.size, o.block, o.depth, "write");
            rd = bench_fio(fiofile, o.size, o.block, o.depth, "read");
            unlink(fiofile);
            if (w < 0 || rd < 0) {
                printf("bench_nvme: fio failed (is its io_uring engine allowed here?): comparison skipped\n");
                fio = 0;
            } else {
                if (w > fw) fw = w;
                if (rd > fr) fr = rd;
            }
        }
        if (uring_ok) {
            if (run_engine(&o, ZERO_IO_BACKEND_IO_URING, &w, &rd) != 0) return 1;
            if (w > ew[0]) ew[0] = w;
            if (rd > er[0]) er[0] = rd;
        }
        if (run_engine(&o, ZERO_IO_BACKEND_THREADS, &w, &rd) != 0) return 1;
        if (w > ew[1]) ew[1] = w;
        if (rd > er[1]) er[1] = rd;
    }
    if (fio) printf("  fio io_uring        write %8.0f MB/s   read %8.0f MB/s\n", mb(fw), mb(fr));
    for (i = 0; i < 2; i++) {
        const char *name = i == 0 ? "engine io_uring" : "engine threads ";
        if (i == 0 && !uring_ok) {
            printf("  %s     skipped: io_uring not available here\n", name);
            continue;
        }
        if (fio)
            printf("  %s     write %8.0f MB/s   read %8.0f MB/s   vs fio: write %.2f, read %.2f "
                   "(target >= 0.90)\n",
                   name, mb(ew[i]), mb(er[i]), ew[i] / fw, er[i] / fr);
        else
            printf("  %s     write %8.0f MB/s   read %8.0f MB/s\n", name, mb(ew[i]), mb(er[i]));
    }
    return 0;
}
