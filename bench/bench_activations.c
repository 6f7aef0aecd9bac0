/* bench_activations.c - the activation tier (zero_engine_stash / zero_engine_fetch) against
   moving the same bytes without it, measured in the same run.

   One rank, host device. A "step" stashes K buffers of S bytes in order (one source buffer,
   overwritten after each stash's fence, as a model's residual stream would be) and fetches
   them back in reverse order (the backward), checking every byte. Best of --reps:
     host  tier = cpu;  reference: memcpy of each buffer out and back (2 K S bytes);
     nvme  tier = nvme (file under --dir, staging of two buffers: the backward is served by
           read-ahead); reference: the I/O engine alone (zero_io, same block size and queue
           depth) writing the K buffers and reading them back, all queued at once.
   ratio = tier / reference (1 = no cost over the bare copy or I/O).
   Then the key table: stash + fetch of 64 bytes under a new key every time (a counter),
   65536 times, host tier: the time per pair over the last 1024 keys against the first 1024
   (1 = O(1) per key whatever came before; the linear search it replaced gave ~730).

       build/bench_activations [--keys K] [--mib S] [--reps R] [--dir DIR] */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h" /* bench_now */

typedef struct bopts {
    int keys, reps;
    size_t bytes;
    const char *dir;
} bopts;

typedef struct brun {
    const bopts *o;
    zero_offload_device tier;
    double best, ref;
    zero_activation_stats st;
    int bad;
} brun;

/* The reference of one tier, best of reps: the same fills, copies or I/O and checks. */
static zero_result reference(const bopts *o, zero_offload_device tier, unsigned char *src, double *best)
{
    size_t n = o->bytes, i;
    int rep, k, bad = 0;
    zero_result r = ZERO_OK;
    *best = 1e30;
    if (tier == ZERO_OFFLOAD_CPU) {
        unsigned char *host = (unsigned char *)malloc(n * (size_t)o->keys);
        if (!host) return ZERO_ERROR_OUT_OF_MEMORY;
        for (rep = 0; rep < o->reps; rep++) {
            double t = bench_now();
            for (k = 0; k < o->keys; k++) {
                memset(src, k + 1, n);
                memcpy(host + (size_t)k * n, src, n);
            }
            for (k = o->keys - 1; k >= 0; k--) {
                memcpy(src, host + (size_t)k * n, n);
                for (i = 0; i < n; i += 4093) bad += src[i] != (unsigned char)(k + 1);
            }
            t = bench_now() - t;
            if (t < *best) *best = t;
        }
        free(host);
    } else {
        zero_io *io = NULL;
        zero_io_file *f = NULL;
        void *buf = NULL;
        uint64_t span = zero_io_align_up(n);
        zero_io_ticket t0;
        if ((r = zero_io_create(NULL, &io)) == ZERO_OK &&
            (r = zero_io_file_create(io, o->dir, "bench-act-ref", 0, span * (uint64_t)o->keys, &f)) == ZERO_OK &&
            (r = zero_io_buffer_alloc(io, (size_t)span * (size_t)o->keys, &buf)) == ZERO_OK) {
            for (rep = 0; rep < o->reps && r == ZERO_OK; rep++) {
                double t = bench_now();
                for (k = 0; k < o->keys && r == ZERO_OK; k++) {
                    memset((unsigned char *)buf + (size_t)k * span, k + 1, (size_t)span);
                    r = zero_io_write(f, span * (uint64_t)k, (unsigned char *)buf + (size_t)k * span, (size_t)span, &t0);
                }
                if (r == ZERO_OK) r = zero_io_wait_all(io);
                for (k = o->keys - 1; k >= 0 && r == ZERO_OK; k--)
                    r = zero_io_read(f, span * (uint64_t)k, (unsigned char *)buf + (size_t)k * span, (size_t)span, &t0);
                if (r == ZERO_OK) r = zero_io_wait_all(io);
                for (k = 0; k < o->keys && r == ZERO_OK; k++)
                    for (i = 0; i < n; i += 4093) bad += ((unsigned char *)buf)[(size_t)k * span + i] != (unsigned char)(k + 1);
                t = bench_now() - t;
                if (t < *best) *best = t;
            }
        }
        zero_io_buffer_free(io, buf);
        zero_io_file_destroy(f);
        zero_io_destroy(io);
    }
    if (r == ZERO_OK && bad) return zero__fail(ZERO_ERROR_IO, "the reference read other bytes");
    return r;
}

/* One rank's engine (host device, a 1024-element model) with an activation tier. */
static zero_result tier_engine(zero_comm *comm, zero_offload_device tier, size_t host_bytes,
                               size_t nvme_bytes, const char *dir, zero_device **dev, zero_engine **e)
{
    zero_engine_desc d;
    zero_result r;
    *e = NULL;
    if ((r = zero_host_device_create(NULL, dev)) != ZERO_OK) return r;
    memset(&d, 0, sizeof d);
    d.stage = 1;
    d.device = *dev;
    d.comm = comm;
    d.offload_activations = tier;
    d.nvme_path = dir;
    d.activation_host_bytes = host_bytes;
    d.activation_nvme_bytes = nvme_bytes;
    r = zero_engine_create(&d, e);
    if (r == ZERO_OK) r = zero_engine_add_tensor(*e, "w", 1024, 0, 0, NULL);
    if (r == ZERO_OK) r = zero_engine_commit(*e);
    return r;
}

static zero_result bench_rank(int rank, zero_comm *comm, void *user)
{
    brun *B = (brun *)user;
    const bopts *o = B->o;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    unsigned char *src = NULL, *chk = NULL;
    size_t n = o->bytes, span = (size_t)zero_io_align_up(n), i;
    int rep, k;
    zero_result r;
    (void)rank;
    r = tier_engine(comm, B->tier, B->tier == ZERO_OFFLOAD_CPU ? span * (size_t)o->keys : 2 * span,
                    span * (size_t)o->keys, o->dir, &dev, &e);
    if (r == ZERO_OK && (r = dev->ops->alloc(dev, n, ZERO_MEM_SCRATCH, (void **)&src)) == ZERO_OK) {
        chk = (unsigned char *)malloc(n);
        if (!chk) r = ZERO_ERROR_OUT_OF_MEMORY;
    }
    B->best = 1e30;
    for (rep = 0; rep < o->reps && r == ZERO_OK; rep++) {
        double t = bench_now();
        for (k = 0; k < o->keys && r == ZERO_OK; k++) {
            memset(src, k + 1, n); /* block k's output: the next block's input */
            r = zero_engine_stash(e, k, src, n);
            if (r == ZERO_OK) r = zero_engine_stash_fence(e);
        }
        for (k = o->keys - 1; k >= 0 && r == ZERO_OK; k--) {
            r = zero_engine_fetch(e, k, src, n);
            for (i = 0; r == ZERO_OK && i < n; i += 4093)
                if (src[i] != (unsigned char)(k + 1)) B->bad++;
        }
        t = bench_now() - t;
        if (t < B->best) B->best = t;
    }
    if (r == ZERO_OK) r = zero_engine_activation_stats(e, &B->st);
    if (r == ZERO_OK) r = reference(o, B->tier, chk, &B->ref);
    free(chk);
    if (src) dev->ops->free(dev, src);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* The key table: 65536 stash + fetch pairs under new keys; out[0] = us per pair over the
   first 1024, out[1] over the last 1024. */
static zero_result keys_rank(int rank, zero_comm *comm, void *user)
{
    double *out = (double *)user, t = 0;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    unsigned char *src = NULL;
    int k;
    zero_result r;
    (void)rank;
    r = tier_engine(comm, ZERO_OFFLOAD_CPU, (size_t)1 << 20, 0, NULL, &dev, &e);
    if (r == ZERO_OK) r = dev->ops->alloc(dev, 64, ZERO_MEM_SCRATCH, (void **)&src);
    for (k = 0; k < 65536 && r == ZERO_OK; k++) {
        if (k == 0 || k == 65536 - 1024) t = bench_now();
        r = zero_engine_stash(e, k, src, 64);
        if (r == ZERO_OK) r = zero_engine_fetch(e, k, src, 64);
        if (k == 1023) out[0] = (bench_now() - t) / 1024 * 1e6;
        if (k == 65535) out[1] = (bench_now() - t) / 1024 * 1e6;
    }
    if (src) dev->ops->free(dev, src);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

int main(int argc, char **argv)
{
    bopts o;
    int a, t;
    o.keys = 16;
    o.reps = 3;
    o.bytes = (size_t)8 << 20;
    o.dir = "/tmp";
    for (a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "--keys")) o.keys = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--mib")) o.bytes = (size_t)(atof(argv[a + 1]) * 1048576.0);
        else if (!strcmp(argv[a], "--reps")) o.reps = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--dir")) o.dir = argv[a + 1];
        else break;
    }
    if (a < argc || o.keys < 1 || o.reps < 1 || o.bytes == 0) {
        fprintf(stderr, "usage: %s [--keys K] [--mib S] [--reps R] [--dir DIR]\n", argv[0]);
        return 2;
    }
    printf("activation tier: %d buffers of %.1f MiB stashed in order and fetched in reverse, best of %d\n",
           o.keys, (double)o.bytes / 1048576.0, o.reps);
    printf("%-5s %10s %10s %8s %9s  %s\n", "tier", "tier ms", "ref ms", "ratio", "GB/s", "fetches: staging / read ahead / on demand");
    for (t = ZERO_OFFLOAD_CPU; t <= ZERO_OFFLOAD_NVME; t++) {
        brun B;
        zero_result r;
        memset(&B, 0, sizeof B);
        B.o = &o;
        B.tier = (zero_offload_device)t;
        r = zero_local_run(1, bench_rank, &B);
        if (r != ZERO_OK || B.bad) {
            fprintf(stderr, "%s: %s (%d bad bytes)\n", zero_result_string(r), zero_last_error(), B.bad);
            return 1;
        }
        printf("%-5s %10.2f %10.2f %8.2f %9.2f  %llu / %llu / %llu\n", t == ZERO_OFFLOAD_CPU ? "host" : "nvme",
               1e3 * B.best, 1e3 * B.ref, B.best / B.ref, 2.0 * (double)o.bytes * o.keys / B.best / 1e9,
               (unsigned long long)B.st.staging_hits / (unsigned long long)o.reps,
               (unsigned long long)B.st.prefetch_hits / (unsigned long long)o.reps,
               (unsigned long long)B.st.demand_reads / (unsigned long long)o.reps);
    }
    {
        double us[2] = {0, 0};
        zero_result r = zero_local_run(1, keys_rank, us);
        if (r != ZERO_OK) {
            fprintf(stderr, "key table: %s: %s\n", zero_result_string(r), zero_last_error());
            return 1;
        }
        printf("key table: stash + fetch under a new key: %.2f us per pair at keys 0..1k, %.2f us at "
               "63k..64k, ratio %.2f (1 = O(1))\n", us[0], us[1], us[1] / us[0]);
    }
    return 0;
}
