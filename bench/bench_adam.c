/* bench_adam: host Adam throughput, fp16 grads and params, 16M parameters.

   Bytes per parameter: read master, m, v (12) and the fp16 grad (2); write master, m, v (12)
   and the fp16 param (2): 28. Measured in the same run against
     (a) a STREAM-triad-like loop a[i] = b[i] + s * c[i] over float arrays of about the same
         bytes, counting 3 arrays (12 bytes per element, as STREAM does), and
     (b) a naive multi-pass scalar Adam (convert grad, unscale, update m, update v, compute
         the update, apply it, write the param: one noinline function per pass, plain C),
   on 1 and 2 threads. Each figure is the best of several timed passes after a warm-up.
   Targets: fused >= 0.8 x triad bandwidth, >= 4 x naive.

   Then, at one thread and 64K to 16M parameters (in and out of the last-level cache), the
   fused pass with fp16 and with bf16 params beside a STREAM-like copy (b[i] = a[i], fp32,
   16M elements: 8 bytes an element with streaming stores, 12 with ordinary ones, whose
   write-allocate reads b first), the bandwidth a single core reaches here. Bytes a
   parameter of the fused pass: 28 where the param copy is streamed (past the last-level
   cache), else 30 (its write-allocate); DeepSpeed's step + copy moves 36 (its fp32 step
   reads p, g, m, v and writes p, m, v: 28; the copy reads p and writes the 16-bit param,
   with its write-allocate: 8), so at equal bandwidth zero's pass is 36/28 = 1.29x faster,
   and more only where the other pass leaves bandwidth unused (bench/torch_adamw_cpu.py
   measures that ratio). */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_PARAMS ((size_t)16 << 20)
#define BYTES_PER_PARAM 28.0
#define REPS 7

#include "bench_common.h" /* bench_now */

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0 || !p) {
        fprintf(stderr, "bench_adam: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes); /* touch every page before timing */
    return p;
}

/* ---- (a) triad -------------------------------------------------------------------------- */

typedef struct triad_job {
    float *a;
    const float *b, *c;
    float s;
    size_t begin, end;
} triad_job;

static void *triad_run(void *arg)
{
    triad_job *j = (triad_job *)arg;
    size_t i;
    for (i = j->begin; i < j->end; i++) j->a[i] = j->b[i] + j->s * j->c[i];
    return NULL;
}

static double triad_seconds(float *a, const float *b, const float *c, size_t n, int threads)
{
    triad_job jobs[2];
    pthread_t tid;
    double t0, best = 1e30;
    int rep, k;
    for (k = 0; k < threads; k++) {
        jobs[k].a = a;
        jobs[k].b = b;
        jobs[k].c = c;
        jobs[k].s = 3.0f;
        jobs[k].begin = n * (size_t)k / (size_t)threads;
        jobs[k].end = n * (size_t)(k + 1) / (size_t)threads;
    }
    for (rep = 0; rep <= REPS; rep++) {
        t0 = bench_now();
        if (threads == 2) {
            if (pthread_create(&tid, NULL, triad_run, &jobs[1]) != 0) {
                fprintf(stderr, "bench_adam: pthread_create failed\n");
                exit(1);
            }
            triad_run(&jobs[0]);
            pthread_join(tid, NULL);
        } else {
            triad_run(&jobs[0]);
        }
        t0 = bench_now() - t0;
        if (rep > 0 && t0 < best) best = t0; /* rep 0 warms up */
    }
    return best;
}

/* ---- (b) naive multi-pass Adam -------------------------------------------------------------- */

#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

NOINLINE static void pass_convert(float *g, const uint16_t *gh, size_t b, size_t e)
{
    size_t i;
    for (i = b; i < e; i++) g[i] = zero_f16_to_f32(gh[i]);
}
NOINLINE static void pass_unscale(float *g, float mul, size_t b, size_t e)
{
    size_t i;
    for (i = b; i < e; i++) g[i] = g[i] * mul;
}
NOINLINE static void pass_m(float *m, const float *g, float b1, size_t b, size_t e)
{
    size_t i;
    for (i = b; i < e; i++) m[i] = m[i] + (1.0f - b1) * (g[i] - m[i]); /* the lerp form */
}
NOINLINE static void pass_v(float *v, const float *g, float b2, size_t b, size_t e)
{
    size_t i;
    for (i = b; i < e; i++) v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
}
NOINLINE static void pass_update(float *u, const float *m, const float *v, float step,
                                 float ibc2, float eps, size_t b, size_t e)
{
    size_t i;
    for (i = b; i < e; i++) u[i] = step * m[i] / (sqrtf(v[i]) * ibc2 + eps);
}
NOINLINE static void pass_apply(float *p, const float *u, float neg_lr_wd, size_t b, size_t e)
{
    size_t i;
    for (i = b; i < e; i++) p[i] = (p[i] + neg_lr_wd * p[i]) - u[i];
}
NOINLINE static void pass_param(uint16_t *ph, const float *p, size_t b, size_t e)
{
    size_t i;
    for (i = b; i < e; i++) ph[i] = zero_f32_to_f16(p[i]);
}

typedef struct naive_job {
    float *master, *m, *v, *g, *u;
    const uint16_t *gh;
    uint16_t *ph;
    const zero_adam_coefs *c;
    float mul;
    size_t begin, end;
} naive_job;

static void *naive_run(void *arg)
{
    naive_job *j = (naive_job *)arg;
    size_t b = j->begin, e = j->end;
    pass_convert(j->g, j->gh, b, e);
    pass_unscale(j->g, j->mul, b, e);
    pass_m(j->m, j->g, j->c->beta1, b, e);
    pass_v(j->v, j->g, j->c->beta2, b, e);
    pass_update(j->u, j->m, j->v, j->c->step_size, j->c->inv_sqrt_bc2, j->c->eps, b, e);
    pass_apply(j->master, j->u, j->c->neg_lr_wd, b, e);
    pass_param(j->ph, j->master, b, e);
    return NULL;
}

/* ---- state ------------------------------------------------------------------------------------ */

typedef struct state {
    float *master, *m, *v, *g, *u;
    uint16_t *gh, *ph;
} state;

static void reset(state *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        float x = (float)((double)(i % 1000) / 1000.0 - 0.5);
        s->master[i] = x;
        s->m[i] = 0.0f;
        s->v[i] = 0.0f;
        s->gh[i] = zero_f32_to_f16(x * 64.0f);
    }
}

/* The best of REPS passes of zero_adam_host over r (after one warm-up pass). */
static double host_seconds(const zero_adam_range *r, const zero_adam_coefs *c, int threads, zero_simd simd)
{
    double t0, best = 1e30;
    int rep;
    for (rep = 0; rep <= REPS; rep++) {
        zero_result res;
        t0 = bench_now();
        res = zero_adam_host(r, c, 1.0f / 1024, simd, threads);
        t0 = bench_now() - t0;
        if (res != ZERO_OK) {
            fprintf(stderr, "bench_adam: %s\n", zero_last_error());
            exit(1);
        }
        if (rep > 0 && t0 < best) best = t0;
    }
    return best;
}

/* The fused pass's range over the first n parameters: fp16 gradients, params of param_dtype. */
static zero_adam_range fused_range(state *s, size_t n, zero_dtype param_dtype)
{
    zero_adam_range r;
    memset(&r, 0, sizeof r);
    r.numel = n;
    r.master = s->master;
    r.m = s->m;
    r.v = s->v;
    r.grad = s->gh;
    r.grad_dtype = ZERO_F16;
    r.param = s->ph;
    r.param_dtype = param_dtype;
    return r;
}

static double fused_seconds(state *s, size_t n, const zero_adam_coefs *c, int threads, zero_dtype param_dtype)
{
    zero_adam_range r = fused_range(s, n, param_dtype);
    return host_seconds(&r, c, threads, ZERO_SIMD_AUTO);
}

/* The same pass with bf16 master, m and v (optimizer_dtype = bf16: stochastic rounding from
   the counter-based RNG), on the given simd path; sb holds 3 n uint16 states. */
static double bf16_states_seconds(state *s, uint16_t *sb, size_t n, const zero_adam_coefs *c,
                                  int threads, zero_simd simd)
{
    zero_adam_range r;
    memset(&r, 0, sizeof r);
    r.numel = n;
    r.master = (float *)(void *)sb;
    r.m = (float *)(void *)(sb + n);
    r.v = (float *)(void *)(sb + 2 * n);
    r.state_dtype = ZERO_BF16;
    r.sr_key = zero_sr_key(1, 10);
    r.grad = s->gh;
    r.grad_dtype = ZERO_F16;
    r.param = s->ph;
    r.param_dtype = ZERO_F16;
    return host_seconds(&r, c, threads, simd);
}

static double naive_seconds(state *s, size_t n, const zero_adam_coefs *c, int threads)
{
    naive_job jobs[2];
    pthread_t tid;
    double t0, best = 1e30;
    int rep, k;
    for (k = 0; k < threads; k++) {
        jobs[k].master = s->master;
        jobs[k].m = s->m;
        jobs[k].v = s->v;
        jobs[k].g = s->g;
        jobs[k].u = s->u;
        jobs[k].gh = s->gh;
        jobs[k].ph = s->ph;
        jobs[k].c = c;
        jobs[k].mul = 1.0f / 1024;
        jobs[k].begin = n * (size_t)k / (size_t)threads;
        jobs[k].end = n * (size_t)(k + 1) / (size_t)threads;
    }
    for (rep = 0; rep <= 3; rep++) { /* slower: fewer reps */
        t0 = bench_now();
        if (threads == 2) {
            if (pthread_create(&tid, NULL, naive_run, &jobs[1]) != 0) {
                fprintf(stderr, "bench_adam: pthread_create failed\n");
                exit(1);
            }
            naive_run(&jobs[0]);
            pthread_join(tid, NULL);
        } else {
            naive_run(&jobs[0]);
        }
        t0 = bench_now() - t0;
        if (rep > 0 && t0 < best) best = t0;
    }
    return best;
}

/* ---- STREAM-like copy, one thread ----------------------------------------------------------- */

#if defined(__AVX__)
#include <immintrin.h>
#endif

/* b = a over n floats (64-byte aligned); streamed: non-temporal stores (where the build
   has AVX; otherwise returns 0 and the caller prints a dash). The best of REPS passes. */
static double copy_seconds(float *b, const float *a, size_t n, int streamed)
{
    double t0, best = 1e30;
    int rep;
#if !defined(__AVX__)
    if (streamed) return 0.0;
#endif
    for (rep = 0; rep <= REPS; rep++) {
        size_t i;
        t0 = bench_now();
        if (!streamed) {
            for (i = 0; i < n; i++) b[i] = a[i];
        } else {
#if defined(__AVX__)
            for (i = 0; i + 8 <= n; i += 8) _mm256_stream_ps(b + i, _mm256_load_ps(a + i));
            _mm_sfence();
#endif
        }
        t0 = bench_now() - t0;
        if (rep > 0 && t0 < best) best = t0;
    }
    return best;
}

/* The fused pass over the first n parameters, one thread: seconds a pass, the best of REPS
   samples of enough passes to fill about 4M parameters. */
static double fused_sized_seconds(state *s, size_t n, const zero_adam_coefs *c, zero_dtype param_dtype)
{
    zero_adam_range r = fused_range(s, n, param_dtype);
    size_t inner = n < ((size_t)4 << 20) ? ((size_t)4 << 20) / n : 1, k;
    double t0, best = 1e30;
    int rep;
    for (rep = 0; rep <= REPS; rep++) {
        t0 = bench_now();
        for (k = 0; k < inner; k++)
            if (zero_adam_host(&r, c, 1.0f / 1024, ZERO_SIMD_AUTO, 1) != ZERO_OK) {
                fprintf(stderr, "bench_adam: %s\n", zero_last_error());
                exit(1);
            }
        t0 = (bench_now() - t0) / (double)inner;
        if (rep > 0 && t0 < best) best = t0;
    }
    return best;
}

static void sizes_table(state *s, float *a, float *b, const zero_adam_coefs *c)
{
    static const size_t sizes[] = {(size_t)64 << 10, (size_t)256 << 10, (size_t)1 << 20, (size_t)4 << 20,
                                   (size_t)16 << 20};
    size_t llc = zero__llc_bytes(), k;
    double tc = copy_seconds(b, a, N_PARAMS, 0), tn = copy_seconds(b, a, N_PARAMS, 1);
    double copy_gbs = 12.0 * (double)N_PARAMS / tc / 1e9, nt_gbs = tn > 0 ? 8.0 * (double)N_PARAMS / tn / 1e9 : 0;
    char nt_txt[32];
    if (tn > 0) snprintf(nt_txt, sizeof nt_txt, "%.1f GB/s", nt_gbs);
    else snprintf(nt_txt, sizeof nt_txt, "-");
    printf("one thread by size (last-level cache %.0f MiB): STREAM-like copy of %zu floats: %.1f GB/s "
           "with ordinary stores (12 bytes an element with the write-allocate), %s streamed (8)\n",
           (double)llc / 1048576.0, (size_t)N_PARAMS, copy_gbs, nt_txt);
    printf("%10s %6s %11s %11s %11s %11s %12s\n", "params", "bytes", "f16 ms", "f16 GB/s", "bf16 ms",
           "bf16/f16", "f16 / copy");
    for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        int bytes = llc > 0 && n > llc / 30 ? 28 : 30; /* zero_adam_host streams the copy past the LLC */
        double tf = fused_sized_seconds(s, n, c, ZERO_F16), tb = fused_sized_seconds(s, n, c, ZERO_BF16);
        double gbs = (double)bytes * (double)n / tf / 1e9;
        printf("%10zu %6d %11.4f %11.1f %11.4f %10.2fx %11.2fx\n", n, bytes, tf * 1e3, gbs, tb * 1e3, tb / tf,
               gbs / (nt_gbs > copy_gbs ? nt_gbs : copy_gbs));
    }
    printf("f16 / copy: the fused pass's bandwidth over the best copy's; DeepSpeed's step + copy moves 36 "
           "bytes a parameter: at equal bandwidth zero's pass is 36/28 = 1.29x faster past the cache\n");
}

int main(void)
{
    const size_t n = N_PARAMS;
    /* triad arrays: 3 float arrays of about the same total bytes as one Adam pass */
    const size_t nt = (size_t)(BYTES_PER_PARAM * (double)n / 12.0);
    state s;
    float *ta, *tb, *tc;
    zero_adam_desc d;
    zero_adam_coefs c;
    int threads;
    size_t i;
    double t_all0 = bench_now();

    s.master = (float *)xalloc(n * sizeof(float));
    s.m = (float *)xalloc(n * sizeof(float));
    s.v = (float *)xalloc(n * sizeof(float));
    s.g = (float *)xalloc(n * sizeof(float));
    s.u = (float *)xalloc(n * sizeof(float));
    s.gh = (uint16_t *)xalloc(n * sizeof(uint16_t));
    s.ph = (uint16_t *)xalloc(n * sizeof(uint16_t));
    ta = (float *)xalloc(nt * sizeof(float));
    tb = (float *)xalloc(nt * sizeof(float));
    tc = (float *)xalloc(nt * sizeof(float));
    for (i = 0; i < nt; i++) {
        tb[i] = (float)(i & 255);
        tc[i] = 1.0f;
    }
    memset(&d, 0, sizeof d);
    d.weight_decay = 0.01;
    if (zero_adam_desc_resolve(&d, &d) != ZERO_OK || zero_adam_coefs_make(&c, &d, 0.01, 10) != ZERO_OK) {
        fprintf(stderr, "bench_adam: %s\n", zero_last_error());
        return 1;
    }
    reset(&s, n);

    printf("bench_adam: host Adam, fp16 grads -> fp32 master/m/v -> fp16 params, n = %zu "
           "(%.0f MB per pass at %.0f bytes/param); simd %s\n",
           n, BYTES_PER_PARAM * (double)n / 1e6, BYTES_PER_PARAM,
           zero_simd_name(zero_simd_detect()));
    printf("%-8s %11s %11s %11s %9s %12s %11s %9s %10s\n", "threads", "fused Gp/s", "fused GB/s",
           "triad GB/s", "vs triad", "triad+wa GB/s", "naive Gp/s", "vs naive", "bf16/f16");
    for (threads = 1; threads <= 2; threads++) {
        double tf = fused_seconds(&s, n, &c, threads, ZERO_F16);
        double tbf = fused_seconds(&s, n, &c, threads, ZERO_BF16);
        double tt = triad_seconds(ta, tb, tc, nt, threads);
        double tn = naive_seconds(&s, n, &c, threads);
        double fused_gbs = BYTES_PER_PARAM * (double)n / tf / 1e9;
        double triad_gbs = 12.0 * (double)nt / tt / 1e9;
        printf("%-8d %11.3f %11.1f %11.1f %8.2fx %12.1f %12.3f %8.2fx %9.2fx  %s\n", threads,
               (double)n / tf / 1e9, fused_gbs, triad_gbs, fused_gbs / triad_gbs,
               triad_gbs * 16.0 / 12.0, (double)n / tn / 1e9, tn / tf, tbf / tf,
               fused_gbs / triad_gbs >= 0.8 && tn / tf >= 4.0 ? "targets met"
                                                              : "below target");
    }
    {
        uint16_t *sb = (uint16_t *)xalloc(3 * n * sizeof(uint16_t));
        for (i = 0; i < n; i++) {
            sb[i] = zero_f32_to_bf16(s.master[i]);
            sb[n + i] = sb[2 * n + i] = 0;
        }
        printf("bf16 states (master, m, v in bf16, stochastic rounding), Gp/s:\n");
        printf("%-8s %11s %11s %11s %14s\n", "threads", "fp32 states", "bf16 vector", "bf16 loop",
               "bf16/fp32 time");
        for (threads = 1; threads <= 2; threads++) {
            double tf = fused_seconds(&s, n, &c, threads, ZERO_F16);
            double tv = bf16_states_seconds(&s, sb, n, &c, threads, ZERO_SIMD_AUTO);
            double tl = bf16_states_seconds(&s, sb, n, &c, threads, ZERO_SIMD_PORTABLE);
            printf("%-8d %11.3f %11.3f %11.3f %13.2fx\n", threads, (double)n / tf / 1e9,
                   (double)n / tv / 1e9, (double)n / tl / 1e9, tv / tf);
        }
        free(sb);
    }
    printf("bf16/f16: the time of the same pass writing bf16 params over the fp16 one (AVX2: 6 "
           "operations a vector, two vectors rounded together, against F16C's one)\n");
    printf("triad+wa: the triad's bytes with the write-allocate read of a[] counted (16 per "
           "element); the fused pass writes master/m/v where it just read them\n");
    sizes_table(&s, tb, ta, &c);
    printf("targets: fused >= 0.80x triad bandwidth, >= 4x naive; total %.1f s\n", bench_now() - t_all0);
    free(s.master);
    free(s.m);
    free(s.v);
    free(s.g);
    free(s.u);
    free(s.gh);
    free(s.ph);
    free(ta);
    free(tb);
    free(tc);
    return 0;
}
