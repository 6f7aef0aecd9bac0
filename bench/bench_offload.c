/* bench_offload.c - the optimizer step with ZeRO-Offload and ZeRO-Infinity against the plain
   step at the same size, and the overlap of the offloaded step.

   One rank (host device, local comm), stage 2, fp16, Psi parameters in 4 groups. For each
   mode (plain: Adam on the device; cpu: master/m/v in host memory, tiles streamed through
   the host Adam; nvme: master/m/v in a file under --dir, read ahead and written behind) it
   times zero_engine_step() alone (the gradients are written before the clock starts), best
   of --reps. Then, with the same sizes, threads and I/O settings, the parts of the nvme
   step measured alone:
     adam  the host Adam over the shard in tiles of --tile elements (zero_adam_host),
     io    reading every tile's 12 T bytes and writing them back (zero_io, all queued).
   overlap = nvme step / max(adam, io): 1 would be perfect overlap, adam + io over the max
   no overlap at all; the target is at most 1.25.
   Last, the cpu step against offload_optimizer_ratio r (the fraction of the optimizer state
   in the host tier; the rest is updated by the device's Adam while the host Adam runs). On
   the host device the "device" and the host tier are the same CPUs and the device's ops run
   on the caller's thread, so the two parts run one after the other: the figure shows what
   the split itself costs (the device part's gradient upload, the tile cut), not the overlap
   a GPU would give, where the step would approach max(device part, host part).
   Then the delayed parameter update (delayed_update, K = 0): a training iteration = the
   "model compute" (a synthetic FMA loop on the caller's thread, L1-resident, sized to take
   about as long as the host Adam of the step) + writing the gradients + zero_engine_step,
   with host_threads = 1, timed as the mean of --reps iterations after 2 warm-up ones. The
   undelayed iteration is compute + host Adam; with the delayed update the host Adam runs on
   its own thread during the next iteration's compute, so the goal is max(compute, Adam).
   Both run on this machine's CPUs: the figure shows the overlap the second core gives, the
   same overlap a GPU's compute would get against the CPU's Adam.

       build/bench_offload [--params N] [--tile N] [--threads T] [--reps R] [--dir DIR] */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h" /* bench_now */

typedef struct opts {
    size_t params, tile;
    int threads, reps;
    const char *dir;
} opts;

typedef struct brun {
    const opts *o;
    zero_offload_device mode;
    double ratio; /* offload_optimizer_ratio (0 = 1) */
    double best;
    zero_result rc;
} brun;

static zero_result bench_rank(int rank, zero_comm *comm, void *user)
{
    brun *B = (brun *)user;
    const opts *o = B->o;
    zero_host_device_desc hd;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    size_t n = o->params / 4, i;
    float *init = NULL;
    int g, rep, ids[4];
    (void)rank;
    memset(&hd, 0, sizeof hd);
    hd.threads = o->threads;
    if ((r = zero_host_device_create(&hd, &dev)) != ZERO_OK) return r;
    memset(&d, 0, sizeof d);
    d.stage = 2;
    d.device = dev;
    d.comm = comm;
    d.offload_optimizer = B->mode;
    d.offload_optimizer_ratio = B->ratio;
    d.nvme_path = o->dir;
    d.sub_group_size = o->tile;
    d.host_threads = o->threads;
    r = zero_engine_create(&d, &e);
    for (g = 0; g < 4 && r == ZERO_OK; g++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", g);
        r = zero_engine_add_tensor(e, name, n, g, 0, &ids[g]);
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    init = (float *)malloc(n * sizeof(float));
    if (!init && r == ZERO_OK) r = ZERO_ERROR_OUT_OF_MEMORY;
    for (i = 0; init && i < n; i++) init[i] = 0.001f * (float)(i % 1000);
    for (g = 0; g < 4 && r == ZERO_OK; g++) r = zero_engine_set_tensor(e, ids[g], init);
    B->best = 1e30;
    for (rep = 0; rep <= o->reps && r == ZERO_OK; rep++) {
        double t0;
        for (g = 3; g >= 0 && r == ZERO_OK; g--) {
            void *gp;
            r = zero_engine_grads(e, g, &gp);
            for (i = 0; r == ZERO_OK && i < n; i++) ((uint16_t *)gp)[i] = zero_f32_to_f16(1.0f + (float)(i % 7));
            if (r == ZERO_OK) r = zero_engine_grads_ready(e, g);
        }
        if (r != ZERO_OK) break;
        t0 = bench_now();
        r = zero_engine_step(e, NULL);
        if (rep > 0 && bench_now() - t0 < B->best) B->best = bench_now() - t0; /* rep 0 warms up */
    }
    free(init);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    B->rc = r;
    return r;
}

/* ---- the delayed parameter update ---- */

/* The synthetic model compute: units x 4096 independent FMAs over an L1-resident array. */
static float dpu_sink;
static void dpu_compute(long units)
{
    static float x[4096];
    long u;
    int i;
    for (u = 0; u < units; u++)
        for (i = 0; i < 4096; i++) x[i] = fmaf(x[i], 0.999f, 1e-3f);
    dpu_sink += x[17];
}

typedef struct drun {
    const opts *o;
    int dpu;     /* delayed_update (K = 0)                */
    long units;  /* dpu_compute units per iteration       */
    double iter; /* out: the best iteration's seconds     */
    double step; /* out: its seconds in zero_engine_step  */
    zero_result rc;
} drun;

static zero_result dpu_rank(int rank, zero_comm *comm, void *user)
{
    drun *D = (drun *)user;
    const opts *o = D->o;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    size_t n = o->params / 4, i;
    float *init = NULL;
    uint16_t *grad = NULL;
    int g, it, ids[4];
    (void)rank;
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    memset(&d, 0, sizeof d);
    d.stage = 2;
    d.device = dev;
    d.comm = comm;
    d.offload_optimizer = ZERO_OFFLOAD_CPU;
    d.sub_group_size = o->tile;
    d.host_threads = 1;
    d.delayed_update = D->dpu;
    r = zero_engine_create(&d, &e);
    for (g = 0; g < 4 && r == ZERO_OK; g++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", g);
        r = zero_engine_add_tensor(e, name, n, g, 0, &ids[g]);
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    init = (float *)malloc(n * sizeof(float));
    grad = (uint16_t *)malloc(n * sizeof(uint16_t));
    if ((!init || !grad) && r == ZERO_OK) r = ZERO_ERROR_OUT_OF_MEMORY;
    for (i = 0; init && grad && i < n; i++) {
        init[i] = 0.001f * (float)(i % 1000);
        grad[i] = zero_f32_to_f16(1.0f + (float)(i % 7));
    }
    for (g = 0; g < 4 && r == ZERO_OK; g++) r = zero_engine_set_tensor(e, ids[g], init);
    D->iter = D->step = 1e30;
    for (it = 0; it < o->reps + 2 && r == ZERO_OK; it++) {
        double t0 = bench_now(), t1, t2;
        dpu_compute(D->units); /* the forward and backward */
        for (g = 3; g >= 0 && r == ZERO_OK; g--) {
            void *gp;
            r = zero_engine_grads(e, g, &gp);
            if (r == ZERO_OK) memcpy(gp, grad, n * sizeof(uint16_t));
            if (r == ZERO_OK) r = zero_engine_grads_ready(e, g);
        }
        t1 = bench_now();
        if (r == ZERO_OK) r = zero_engine_step(e, NULL);
        t2 = bench_now();
        if (it >= 2 && t2 - t0 < D->iter) { /* best of reps, after 2 warm-up iterations */
            D->iter = t2 - t0;
            D->step = t2 - t1;
        }
    }
    if (r == ZERO_OK) r = zero_engine_finish_update(e);
    free(grad);
    free(init);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    D->rc = r;
    return r;
}

/* The host Adam over S elements in tiles of T (what the offloaded step computes). */
static double time_adam(const opts *o, size_t S, size_t T)
{
    float *m = (float *)calloc(S, 4), *mm = (float *)calloc(S, 4), *v = (float *)calloc(S, 4);
    uint16_t *gr = (uint16_t *)calloc(S, 2), *pa = (uint16_t *)calloc(S, 2);
    zero_adam_desc ad;
    zero_adam_coefs co;
    double best = 1e30;
    int rep;
    size_t i;
    memset(&ad, 0, sizeof ad);
    if (!m || !mm || !v || !gr || !pa || zero_adam_coefs_make(&co, &ad, 0.0f, 1) != ZERO_OK) best = -1;
    for (i = 0; best > 0 && i < S; i++) gr[i] = zero_f32_to_f16(1.0f);
    for (rep = 0; best > 0 && rep <= o->reps; rep++) {
        double t0 = bench_now();
        size_t b;
        for (b = 0; b < S; b += T) {
            zero_adam_range ar;
            memset(&ar, 0, sizeof ar);
            ar.numel = S - b < T ? S - b : T;
            ar.master = m + b;
            ar.m = mm + b;
            ar.v = v + b;
            ar.grad = gr + b;
            ar.grad_dtype = ZERO_F16;
            ar.param = pa + b;
            ar.param_dtype = ZERO_F16;
            zero_adam_host(&ar, &co, 0.5f, ZERO_SIMD_AUTO, ar.numel >= 65536 ? o->threads : 1);
        }
        if (rep > 0 && bench_now() - t0 < best) best = bench_now() - t0;
    }
    free(m);
    free(mm);
    free(v);
    free(gr);
    free(pa);
    return best;
}

/* Reading every tile's master/m/v (12 T bytes) and writing it back, all queued at once. */
static double time_io(const opts *o, size_t S, size_t T)
{
    zero_io *io = NULL;
    zero_io_file *f = NULL;
    unsigned char *buf = NULL;
    size_t nt = (S + T - 1) / T, rec = (size_t)zero_io_align_up(12 * (uint64_t)T), k;
    double best = 1e30;
    int rep;
    void *p = NULL;
    if (zero_io_create(NULL, &io) != ZERO_OK || zero_io_buffer_alloc(io, rec * nt, &p) != ZERO_OK ||
        zero_io_file_create(io, o->dir, "bench", 0, rec * nt, &f) != ZERO_OK) {
        fprintf(stderr, "bench_offload: io: %s\n", zero_last_error());
        best = -1;
    }
    buf = (unsigned char *)p;
    if (buf) memset(buf, 1, rec * nt);
    for (k = 0; best > 0 && k < nt; k++) {
        zero_io_ticket t;
        size_t len = (S - k * T < T ? S - k * T : T) * 12;
        if (zero_io_write(f, rec * k, buf + rec * k, len, &t) != ZERO_OK) best = -1;
    }
    if (best > 0 && zero_io_wait_all(io) != ZERO_OK) best = -1;
    for (rep = 0; best > 0 && rep <= o->reps; rep++) {
        double t0 = bench_now();
        zero_io_ticket t;
        for (k = 0; k < nt; k++) {
            size_t len = (S - k * T < T ? S - k * T : T) * 12;
            if (zero_io_read(f, rec * k, buf + rec * k, len, &t) != ZERO_OK) best = -1;
        }
        if (zero_io_wait_all(io) != ZERO_OK) best = -1;
        for (k = 0; k < nt; k++) {
            size_t len = (S - k * T < T ? S - k * T : T) * 12;
            if (zero_io_write(f, rec * k, buf + rec * k, len, &t) != ZERO_OK) best = -1;
        }
        if (zero_io_wait_all(io) != ZERO_OK) best = -1;
        if (rep > 0 && bench_now() - t0 < best) best = bench_now() - t0;
    }
    zero_io_file_destroy(f);
    if (io) zero_io_buffer_free(io, buf);
    zero_io_destroy(io);
    return best;
}

int main(int argc, char **argv)
{
    opts o;
    brun B[3];
    static const char *names[3] = {"plain (device Adam)", "offload cpu", "offload nvme"};
    int a, i;
    double adam, io, mx;
    memset(&o, 0, sizeof o);
    o.params = 8u << 20;
    o.tile = 1u << 20;
    o.threads = 2;
    o.reps = 3;
    o.dir = access("/var/tmp", W_OK) == 0 ? "/var/tmp" : "/tmp";
    for (a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "--params")) o.params = (size_t)atof(argv[a + 1]);
        else if (!strcmp(argv[a], "--tile")) o.tile = (size_t)atof(argv[a + 1]);
        else if (!strcmp(argv[a], "--threads")) o.threads = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--reps")) o.reps = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--dir")) o.dir = argv[a + 1];
        else {
            fprintf(stderr, "usage: bench_offload [--params N] [--tile N] [--threads T] [--reps R] [--dir DIR]\n");
            return 2;
        }
    }
    if (o.params < 4 || o.tile < 1 || o.threads < 1 || o.reps < 1) return 2;
    printf("bench_offload: Psi = %zu fp16 params (stage 2, 1 rank), tiles of %zu elements, %d threads, "
           "best of %d, NVMe files under %s\n",
           o.params, o.tile, o.threads, o.reps, o.dir);
    for (i = 0; i < 3; i++) {
        memset(&B[i], 0, sizeof B[i]);
        B[i].o = &o;
        B[i].mode = (zero_offload_device)i;
        if (zero_local_run(1, bench_rank, &B[i]) != ZERO_OK || B[i].rc != ZERO_OK) {
            fprintf(stderr, "bench_offload: %s: %s\n", names[i], zero_last_error());
            return 1;
        }
        printf("  %-20s step %8.2f ms   %.2fx the plain step\n", names[i], 1e3 * B[i].best,
               B[i].best / B[0].best);
    }
    adam = time_adam(&o, o.params, o.tile);
    io = time_io(&o, o.params, o.tile);
    if (adam < 0 || io < 0) return 1;
    mx = adam > io ? adam : io;
    printf("  parts alone: host adam %.2f ms, nvme io (read + write 12 Psi bytes) %.2f ms, sum %.2f ms\n",
           1e3 * adam, 1e3 * io, 1e3 * (adam + io));
    printf("  overlap: nvme step / max(adam, io) = %.2f (target <= 1.25; no overlap would be %.2f)\n",
           B[2].best / mx, (adam + io) / mx);
    {
        static const double rs[] = {0.01, 0.25, 0.5, 0.75, 0.999};
        printf("  offload_optimizer_ratio (cpu; r of the state on the host, the rest on the "
               "\"device\", both CPU here):\n");
        for (i = 0; i < (int)(sizeof rs / sizeof rs[0]); i++) {
            brun R;
            memset(&R, 0, sizeof R);
            R.o = &o;
            R.mode = ZERO_OFFLOAD_CPU;
            R.ratio = rs[i];
            if (zero_local_run(1, bench_rank, &R) != ZERO_OK || R.rc != ZERO_OK) {
                fprintf(stderr, "bench_offload: ratio %g: %s\n", rs[i], zero_last_error());
                return 1;
            }
            printf("    r = %-6g step %8.2f ms   %.2fx the plain step, %.2fx r = 1; "
                   "r (cpu) + (1 - r) (plain) would be %.2fx\n",
                   rs[i], 1e3 * R.best, R.best / B[0].best, R.best / B[1].best,
                   (rs[i] * B[1].best + (1 - rs[i]) * B[0].best) / B[0].best);
        }
    }
    {   /* the delayed parameter update: the compute sized to the host Adam (1 thread) */
        opts o1 = o;
        drun D[2];
        double t_unit = 1e30, adam1, c0, c1;
        long units;
        int k;
        o1.threads = 1;
        for (k = 0; k < 3; k++) {
            double t = bench_now();
            dpu_compute(200);
            t = (bench_now() - t) / 200.0;
            if (t < t_unit) t_unit = t;
        }
        adam1 = time_adam(&o1, o.params, o.tile);
        if (adam1 < 0 || t_unit <= 0) return 1;
        units = (long)(adam1 / t_unit) + 1;
        for (i = 0; i < 2; i++) {
            memset(&D[i], 0, sizeof D[i]);
            D[i].o = &o;
            D[i].dpu = i;
            D[i].units = units;
            if (zero_local_run(1, dpu_rank, &D[i]) != ZERO_OK || D[i].rc != ZERO_OK) {
                fprintf(stderr, "bench_offload: delayed update %d: %s\n", i, zero_last_error());
                return 1;
            }
        }
        c0 = D[0].iter - D[0].step; /* the compute and the gradients' hand-off */
        c1 = D[1].iter - D[1].step;
        printf("  delayed_update (cpu, K = 0, host_threads 1; compute = an FMA loop sized to the host "
               "adam alone, %.2f ms):\n", 1e3 * adam1);
        printf("    undelayed iteration %8.2f ms = compute %.2f + step %.2f\n", 1e3 * D[0].iter, 1e3 * c0,
               1e3 * D[0].step);
        printf("    delayed   iteration %8.2f ms = compute %.2f + step %.2f (the host adam on its thread)\n",
               1e3 * D[1].iter, 1e3 * c1, 1e3 * D[1].step);
        printf("    delayed / undelayed = %.2f; delayed / max(compute, undelayed step) = %.2f "
               "(goal 1; the sum would be %.2f)\n",
               D[1].iter / D[0].iter, D[1].iter / (c0 > D[0].step ? c0 : D[0].step),
               D[0].iter / (c0 > D[0].step ? c0 : D[0].step));
    }
    return 0;
}
