/* The host device: every op against references written here (scalar conversions, sums in
   double and long double, a re-implementation of sumsq's documented order), alignment and
   bookkeeping of alloc/free, thread-count and SIMD-path independence, argument errors. */
#include "zero.h"
#include "tests/zt.h"

#include <float.h>

static const zero_dtype dtypes[] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64};
static const zero_queue Q = ZERO_QUEUE_COMPUTE;

static zero_device *make_dev(zero_simd simd, int threads)
{
    zero_host_device_desc d;
    zero_device *dev = NULL;
    memset(&d, 0, sizeof d);
    d.simd = simd;
    d.threads = threads;
    if (zero_host_device_create(&d, &dev) != ZERO_OK) return NULL;
    return dev;
}

/* ---- element helpers: values as double, stored in any dtype ---- */

static double get(zero_dtype dt, const void *p, size_t i)
{
    const unsigned char *b = (const unsigned char *)p;
    uint16_t h;
    float f;
    double d;
    switch (dt) {
    case ZERO_F32: memcpy(&f, b + 4 * i, 4); return f;
    case ZERO_F64: memcpy(&d, b + 8 * i, 8); return d;
    case ZERO_F16: memcpy(&h, b + 2 * i, 2); return zero_f16_to_f32(h);
    default: memcpy(&h, b + 2 * i, 2); return zero_bf16_to_f32(h);
    }
}

/* Stores v rounded to dt: via fp32 for the 16-bit types (v is already an fp32 value there). */
static void put(zero_dtype dt, void *p, size_t i, double v)
{
    unsigned char *b = (unsigned char *)p;
    uint16_t h;
    float f = (float)v;
    switch (dt) {
    case ZERO_F32: memcpy(b + 4 * i, &f, 4); return;
    case ZERO_F64: memcpy(b + 8 * i, &v, 8); return;
    case ZERO_F16: h = zero_f32_to_f16(f); memcpy(b + 2 * i, &h, 2); return;
    default: h = zero_f32_to_bf16(f); memcpy(b + 2 * i, &h, 2); return;
    }
}

/* Values of magnitude 2^-8 .. 2^8: the exact sum or product of two of them fits a double,
   so (float)(a + b) in double is the correctly rounded fp32 result. */
static void fill(zero_dtype dt, void *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) put(dt, p, i, (zt_uniform() * 2.0 - 1.0) * ldexp(1.0, (int)(zt_rand64() % 17) - 8));
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

/* ---- memory ---- */

static int hooks_live;
static void *hook_alloc(size_t bytes, void *user)
{
    (void)user;
    if (bytes > ((size_t)1 << 40)) return NULL; /* a failing allocation, without asking malloc */
    hooks_live++;
    return malloc(bytes);
}
static void hook_free(void *p, void *user)
{
    (void)user;
    hooks_live--;
    free(p);
}

ZT_TEST(alloc_is_aligned_and_accounted)
{
    zero_host_device_desc desc;
    zero_device *dev = NULL;
    void *p[200];
    size_t bytes[ZERO_MEM_COUNT], count = 99, want[ZERO_MEM_COUNT];
    int i, c;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc = hook_alloc;
    desc.allocator.free = hook_free;
    ZT_CHECK(zero_host_device_create(&desc, &dev) == ZERO_OK && dev);
    ZT_CHECK(strcmp(dev->ops->name, "host") == 0);
    memset(want, 0, sizeof want);
    zt_seed(3);
    for (i = 0; i < 200; i++) {
        size_t n = 1 + (size_t)(zt_rand64() % 5000);
        zero_mem_category cat = (zero_mem_category)(i % ZERO_MEM_COUNT);
        ZT_CHECK(dev->ops->alloc(dev, n, cat, &p[i]) == ZERO_OK);
        ZT_CHECKF(((uintptr_t)p[i] & 63u) == 0, "allocation %d at %p", i, p[i]);
        memset(p[i], i & 0xff, n); /* the whole size is usable (ASan checks the bounds) */
        want[cat] += n;
    }
    ZT_CHECK(zero_host_device_stats(dev, bytes, &count) == ZERO_OK && count == 200);
    for (c = 0; c < ZERO_MEM_COUNT; c++) ZT_CHECKF(bytes[c] == want[c], "category %d: %zu != %zu", c, bytes[c], want[c]);
    /* foreign, interior and double frees are refused, not followed */
    {
        int local = 0;
        void *m = malloc(64);
        ZT_CHECK(dev->ops->free(dev, &local) == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(dev->ops->free(dev, m) == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(dev->ops->free(dev, (char *)p[0] + 64) == ZERO_ERROR_INVALID_ARGUMENT);
        free(m);
    }
    for (i = 0; i < 200; i += 2) ZT_CHECK(dev->ops->free(dev, p[i]) == ZERO_OK);
    ZT_CHECK(dev->ops->free(dev, p[0]) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->free(dev, NULL) == ZERO_OK);
    ZT_CHECK(zero_host_device_stats(dev, NULL, &count) == ZERO_OK && count == 100);
    for (i = 1; i < 200; i += 4) ZT_CHECK(dev->ops->free(dev, p[i]) == ZERO_OK);
    /* argument errors */
    ZT_CHECK(dev->ops->alloc(dev, 0, ZERO_MEM_PARAM, &p[0]) == ZERO_ERROR_INVALID_ARGUMENT && p[0] == NULL);
    ZT_CHECK(dev->ops->alloc(dev, 16, ZERO_MEM_COUNT, &p[0]) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->alloc(dev, 16, ZERO_MEM_PARAM, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->alloc(dev, (size_t)-1, ZERO_MEM_PARAM, &p[0]) == ZERO_ERROR_OVERFLOW);
    ZT_CHECK(dev->ops->alloc(dev, (size_t)-1 / 2, ZERO_MEM_PARAM, &p[0]) == ZERO_ERROR_OUT_OF_MEMORY);
    ZT_CHECK(dev->ops->alloc(NULL, 16, ZERO_MEM_PARAM, &p[0]) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->reserve == NULL);
    /* the rest is released by destroy */
    zero_device_destroy(dev);
    zero_device_destroy(NULL);
    ZT_CHECKF(hooks_live == 0, "%d allocations leaked", hooks_live);
}

ZT_TEST(create_validates_its_descriptor)
{
    zero_host_device_desc d;
    zero_device *dev = NULL;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK && dev);
    zero_device_destroy(dev);
    ZT_CHECK(zero_host_device_create(NULL, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    memset(&d, 0, sizeof d);
    d.threads = -1;
    ZT_CHECK(zero_host_device_create(&d, &dev) == ZERO_ERROR_INVALID_ARGUMENT && dev == NULL);
    d.threads = 0;
    d.simd = (zero_simd)9;
    ZT_CHECK(zero_host_device_create(&d, &dev) == ZERO_ERROR_INVALID_ARGUMENT);
    d.simd = ZERO_SIMD_AVX512;
    if (zero_simd_detect() < ZERO_SIMD_AVX512 && !getenv("ZERO_SIMD"))
        ZT_CHECK(zero_host_device_create(&d, &dev) == ZERO_ERROR_UNSUPPORTED);
    d.simd = ZERO_SIMD_AUTO;
    d.allocator.alloc = hook_alloc; /* free missing */
    ZT_CHECK(zero_host_device_create(&d, &dev) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_host_device_stats(NULL, NULL, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
}

/* ---- queues, events, transfers ---- */

ZT_TEST(events_and_transfers)
{
    zero_device *dev = make_dev(ZERO_SIMD_AUTO, 1), *other = make_dev(ZERO_SIMD_AUTO, 1);
    zero_event *ev = NULL, *ev2 = NULL;
    unsigned char *a = NULL, *b = NULL, host[300];
    int q, i;
    ZT_CHECK(dev->ops->event_create(dev, &ev) == ZERO_OK && ev);
    ZT_CHECK(other->ops->event_create(other, &ev2) == ZERO_OK);
    for (q = 0; q < ZERO_QUEUE_COUNT; q++) {
        ZT_CHECK(dev->ops->record(dev, (zero_queue)q, ev) == ZERO_OK);
        ZT_CHECK(dev->ops->wait(dev, (zero_queue)q, ev) == ZERO_OK);
        ZT_CHECK(dev->ops->sync(dev, (zero_queue)q) == ZERO_OK);
        ZT_CHECK(dev->ops->native_queue(dev, (zero_queue)q) == NULL);
    }
    ZT_CHECK(dev->ops->record(dev, (zero_queue)3, ev) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->wait(dev, (zero_queue)-1, ev) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->sync(dev, (zero_queue)7) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->record(dev, Q, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->record(dev, Q, ev2) == ZERO_ERROR_INVALID_ARGUMENT); /* another device's */
    ZT_CHECK(dev->ops->event_create(dev, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    dev->ops->event_destroy(dev, ev);
    dev->ops->event_destroy(dev, NULL);
    other->ops->event_destroy(other, ev2);

    ZT_CHECK(dev->ops->alloc(dev, 300, ZERO_MEM_SCRATCH, (void **)&a) == ZERO_OK);
    ZT_CHECK(dev->ops->alloc(dev, 300, ZERO_MEM_SCRATCH, (void **)&b) == ZERO_OK);
    for (i = 0; i < 300; i++) host[i] = (unsigned char)(i * 7);
    ZT_CHECK(dev->ops->upload(dev, ZERO_QUEUE_OFFLOAD, a, host, 300) == ZERO_OK);
    ZT_CHECK(dev->ops->copy(dev, Q, b, a, 300) == ZERO_OK);
    ZT_CHECK(dev->ops->fill_zero(dev, Q, a, 100) == ZERO_OK);
    memset(host, 0xff, sizeof host);
    ZT_CHECK(dev->ops->download(dev, ZERO_QUEUE_COMM, host, b, 300) == ZERO_OK);
    for (i = 0; i < 300; i++) ZT_CHECK(host[i] == (unsigned char)(i * 7));
    for (i = 0; i < 300; i++) ZT_CHECK(a[i] == (i < 100 ? 0 : (unsigned char)(i * 7)));
    ZT_CHECK(dev->ops->copy(dev, Q, b, b + 10, 200) == ZERO_OK); /* overlapping: memmove */
    ZT_CHECK(b[0] == (unsigned char)(10 * 7));
    ZT_CHECK(dev->ops->copy(dev, Q, NULL, a, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->upload(dev, Q, a, NULL, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->download(dev, (zero_queue)3, host, a, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->fill_zero(dev, Q, NULL, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->copy(dev, Q, NULL, NULL, 0) == ZERO_OK);
    ZT_CHECK(dev->ops->fill_zero(dev, Q, NULL, 0) == ZERO_OK);
    dev->ops->free(dev, a);
    dev->ops->free(dev, b);
    zero_device_destroy(dev);
    zero_device_destroy(other);
}

/* ---- cast ---- */

ZT_TEST(cast_matches_scalar_conversions)
{
    zero_device *dev = make_dev(ZERO_SIMD_AUTO, 1);
    size_t sizes[] = {1, 7, 1003};
    int si, a, b;
    zt_seed(4);
    for (si = 0; si < 3; si++)
        for (a = 0; a < 4; a++)
            for (b = 0; b < 4; b++) {
                zero_dtype st = dtypes[a], dt = dtypes[b];
                size_t n = sizes[si], i, bad = 0;
                void *src = xmalloc(n * 8), *dst = xmalloc(n * 8), *ref = xmalloc(n * 8);
                fill(st, src, n);
                ZT_CHECK(dev->ops->cast(dev, Q, dst, dt, src, st, n) == ZERO_OK);
                if (st == ZERO_F64 || dt == ZERO_F64) {
                    /* fp64 narrows in one rounding (never via fp32): H1's portable path */
                    ZT_CHECK(zero_convert(ref, dt, src, st, n, ZERO_SIMD_PORTABLE) == ZERO_OK);
                } else {
                    for (i = 0; i < n; i++) put(dt, ref, i, get(st, src, i));
                }
                for (i = 0; i < n; i++) bad += memcmp((char *)dst + i * zero_dtype_size(dt), (char *)ref + i * zero_dtype_size(dt), zero_dtype_size(dt)) != 0;
                ZT_CHECKF(bad == 0, "%s -> %s n=%zu: %zu wrong", zero_dtype_name(st), zero_dtype_name(dt), n, bad);
                free(src);
                free(dst);
                free(ref);
            }
    zero_device_destroy(dev);
}

/* ---- add, scale ---- */

ZT_TEST(add_and_scale_round_once)
{
    zero_device *dev = make_dev(ZERO_SIMD_AUTO, 1);
    size_t sizes[] = {1, 7, 1003};
    float scales[] = {0.5f, 3.0f, 1.0f / 3.0f, -1e-3f};
    int si, di, k;
    zt_seed(5);
    for (si = 0; si < 3; si++)
        for (di = 0; di < 4; di++) {
            zero_dtype dt = dtypes[di];
            size_t n = sizes[si], i, bad = 0, es = zero_dtype_size(dt);
            void *x = xmalloc(n * es), *y = xmalloc(n * es), *x0 = xmalloc(n * es), *ref = xmalloc(n * es);
            fill(dt, x, n);
            fill(dt, y, n);
            memcpy(x0, x, n * es);
            ZT_CHECK(dev->ops->add(dev, Q, x, y, dt, n) == ZERO_OK);
            for (i = 0; i < n; i++) {
                double s = get(dt, x0, i) + get(dt, y, i); /* exact */
                put(dt, ref, i, dt == ZERO_F64 ? s : (double)(float)s);
            }
            for (i = 0; i < n; i++) bad += memcmp((char *)x + i * es, (char *)ref + i * es, es) != 0;
            ZT_CHECKF(bad == 0, "add %s n=%zu: %zu wrong", zero_dtype_name(dt), n, bad);
            for (k = 0; k < 4; k++) {
                memcpy(x, x0, n * es);
                ZT_CHECK(dev->ops->scale(dev, Q, x, dt, n, scales[k]) == ZERO_OK);
                for (i = 0; i < n; i++) {
                    double p = get(dt, x0, i) * (double)scales[k]; /* exact: 24 x 24 bits */
                    put(dt, ref, i, dt == ZERO_F64 ? p : (double)(float)p);
                }
                bad = 0;
                for (i = 0; i < n; i++) bad += memcmp((char *)x + i * es, (char *)ref + i * es, es) != 0;
                ZT_CHECKF(bad == 0, "scale %s by %g n=%zu: %zu wrong", zero_dtype_name(dt), (double)scales[k], n, bad);
            }
            free(x);
            free(y);
            free(x0);
            free(ref);
        }
    /* fp16 overflows to inf; NaN stays NaN; x + x in place */
    {
        uint16_t h[3] = {zero_f32_to_f16(60000.0f), zero_f32_to_f16(1.5f), 0x7e00u};
        ZT_CHECK(dev->ops->add(dev, Q, h, h, ZERO_F16, 3) == ZERO_OK);
        ZT_CHECK(h[0] == 0x7c00u && zero_f16_to_f32(h[1]) == 3.0f && (h[2] & 0x7fffu) > 0x7c00u);
    }
    zero_device_destroy(dev);
}

/* ---- nonfinite ---- */

static void put_special(zero_dtype dt, void *p, size_t i, int nan)
{
    double v = nan ? NAN : -INFINITY;
    put(dt, p, i, v);
}

ZT_TEST(nonfinite_finds_inf_and_nan_anywhere)
{
    zero_device *dev1 = make_dev(ZERO_SIMD_AUTO, 1), *dev4 = make_dev(ZERO_SIMD_AUTO, 4);
    size_t sizes[] = {1, 7, 1003, 1000003};
    int si, di, pos, nan, t;
    zt_seed(6);
    for (si = 0; si < (zt_quick() ? 3 : 4); si++)
        for (di = 0; di < 4; di++) {
            zero_dtype dt = dtypes[di];
            size_t n = sizes[si], es = zero_dtype_size(dt);
            void *x = xmalloc(n * es);
            float flag;
            fill(dt, x, n);
            /* the largest finite values are finite */
            put(dt, x, n / 2, dt == ZERO_F16 ? 65504.0 : dt == ZERO_BF16 ? (double)zero_bf16_to_f32(0x7f7fu) : dt == ZERO_F32 ? FLT_MAX : DBL_MAX);
            for (t = 0; t < 2; t++) {
                zero_device *dev = t ? dev4 : dev1;
                flag = 0.0f;
                ZT_CHECK(dev->ops->nonfinite(dev, Q, x, dt, n, &flag) == ZERO_OK && flag == 0.0f);
                flag = 0.5f; /* unchanged when all are finite */
                ZT_CHECK(dev->ops->nonfinite(dev, Q, x, dt, n, &flag) == ZERO_OK && flag == 0.5f);
                for (pos = 0; pos < 3; pos++)
                    for (nan = 0; nan < 2; nan++) {
                        size_t at = pos == 0 ? 0 : pos == 1 ? n / 3 : n - 1;
                        unsigned char save[8];
                        memcpy(save, (char *)x + at * es, es);
                        put_special(dt, x, at, nan);
                        flag = 0.0f;
                        ZT_CHECK(dev->ops->nonfinite(dev, Q, x, dt, n, &flag) == ZERO_OK);
                        ZT_CHECKF(flag == 1.0f, "%s n=%zu %s at %zu threads=%d", zero_dtype_name(dt), n,
                                  nan ? "NaN" : "-inf", at, t ? 4 : 1);
                        memcpy((char *)x + at * es, save, es);
                    }
            }
            free(x);
        }
    zero_device_destroy(dev1);
    zero_device_destroy(dev4);
}

/* ---- sumsq ---- */

/* The documented order, written again: blocks of ZERO_HOST_SUMSQ_BLOCK, 8 lanes over i mod 8
   (fma for fp64), lanes in the tree ((0+1)+(2+3))+((4+5)+(6+7)), blocks added in order. */
static double sumsq_order(zero_dtype dt, const void *x, size_t n)
{
    double total = 0.0;
    size_t b, i;
    for (b = 0; b < n; b += ZERO_HOST_SUMSQ_BLOCK) {
        size_t end = n - b < ZERO_HOST_SUMSQ_BLOCK ? n : b + ZERO_HOST_SUMSQ_BLOCK;
        double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (i = b; i < end; i++) {
            double v = get(dt, x, i);
            l[i % 8] = dt == ZERO_F64 ? fma(v, v, l[i % 8]) : l[i % 8] + v * v;
        }
        total += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    return total;
}

ZT_TEST(sumsq_is_accurate_and_path_independent)
{
    size_t sizes[] = {1, 7, 1003, 65536 + 9, 1000003};
    int threads[] = {1, 2, 3, 8};
    int si, di, ti, sp;
    zt_seed(7);
    for (si = 0; si < (zt_quick() ? 4 : 5); si++)
        for (di = 0; di < 4; di++) {
            zero_dtype dt = dtypes[di];
            size_t n = sizes[si], i, k;
            void *x = xmalloc(n * zero_dtype_size(dt));
            long double ref = 0.0L;
            double first = 0.0, order, tol;
            fill(dt, x, n);
            for (i = 0; i < n; i++) ref += (long double)get(dt, x, i) * (long double)get(dt, x, i);
            order = sumsq_order(dt, x, n);
            for (sp = ZERO_SIMD_PORTABLE; sp <= (int)zero_simd_detect(); sp++)
                for (ti = 0; ti < 4; ti++) {
                    zero_device *dev = make_dev((zero_simd)sp, threads[ti]);
                    double acc = 0.0, acc5 = 5.0;
                    ZT_CHECK(dev->ops->sumsq(dev, Q, x, dt, n, &acc) == ZERO_OK);
                    ZT_CHECK(dev->ops->sumsq(dev, Q, x, dt, n, &acc5) == ZERO_OK && acc5 == 5.0 + acc);
                    if (sp == ZERO_SIMD_PORTABLE && ti == 0) first = acc;
                    ZT_CHECKF(memcmp(&acc, &first, 8) == 0, "%s n=%zu %s threads=%d: %.17g != %.17g",
                              zero_dtype_name(dt), n, zero_simd_name((zero_simd)sp), threads[ti], acc, first);
                    zero_device_destroy(dev);
                }
            ZT_CHECKF(memcmp(&first, &order, 8) == 0, "%s n=%zu: %.17g, the documented order gives %.17g",
                      zero_dtype_name(dt), n, first, order);
            /* error bound of the order: a chain of k = 8192 + 3 + blocks roundings */
            k = ZERO_HOST_SUMSQ_BLOCK / 8 + 3 + n / ZERO_HOST_SUMSQ_BLOCK + 1;
            tol = 1.01 * (double)k * ldexp(1.0, -53) * (double)ref;
            ZT_CHECKF(fabsl((long double)first - ref) <= (long double)tol, "%s n=%zu: %.17g vs %.17Lg (tol %.3g)",
                      zero_dtype_name(dt), n, first, ref, tol);
            free(x);
        }
}

/* ---- grad_mul ---- */

ZT_TEST(grad_mul_clips_and_skips)
{
    zero_device *dev = make_dev(ZERO_SIMD_AUTO, 1);
    double sumsq;
    float flag = 0.0f, out[2], unscale = 1.0f / 1024.0f;
    sumsq = 4096.0 * 4096.0; /* raw norm 4096, unscaled 4 */
    ZT_CHECK(dev->ops->grad_mul(dev, Q, &sumsq, &flag, unscale, 1.0f, out) == ZERO_OK);
    ZT_CHECKF(out[1] == 4.0f && out[0] == unscale * (1.0f / (4.0f + 1e-6f)), "clip: %g %g", (double)out[0], (double)out[1]);
    ZT_CHECK(dev->ops->grad_mul(dev, Q, &sumsq, &flag, unscale, 0.0f, out) == ZERO_OK);
    ZT_CHECK(out[0] == unscale && out[1] == 4.0f); /* no clipping */
    ZT_CHECK(dev->ops->grad_mul(dev, Q, &sumsq, &flag, unscale, 8.0f, out) == ZERO_OK);
    ZT_CHECK(out[0] == unscale && out[1] == 4.0f); /* under the threshold */
    flag = 1.0f;
    ZT_CHECK(dev->ops->grad_mul(dev, Q, &sumsq, &flag, unscale, 1.0f, out) == ZERO_OK);
    ZT_CHECK(out[0] == 0.0f && out[1] == -1.0f);
    ZT_CHECK(dev->ops->grad_mul(dev, Q, NULL, &flag, unscale, 1.0f, out) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->grad_mul(dev, Q, &sumsq, NULL, unscale, 1.0f, out) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->grad_mul(dev, Q, &sumsq, &flag, unscale, 1.0f, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    zero_device_destroy(dev);
}

/* ---- adam ---- */

typedef struct adam_bufs {
    size_t n;
    float *master, *m, *v;
    uint16_t *grad, *param;
} adam_bufs;

static void adam_init(adam_bufs *b, size_t n)
{
    size_t i;
    b->n = n;
    b->master = (float *)xmalloc(n * 4);
    b->m = (float *)xmalloc(n * 4);
    b->v = (float *)xmalloc(n * 4);
    b->grad = (uint16_t *)xmalloc(n * 2);
    b->param = (uint16_t *)xmalloc(n * 2);
    for (i = 0; i < n; i++) {
        b->master[i] = (float)(zt_uniform() - 0.5);
        b->m[i] = (float)(zt_uniform() - 0.5) * 1e-2f;
        b->v[i] = (float)zt_uniform() * 1e-4f;
        b->grad[i] = zero_f32_to_f16((float)(zt_uniform() - 0.5) * 512.0f);
        b->param[i] = zero_f32_to_bf16(b->master[i]);
    }
}

static void adam_copy(adam_bufs *d, const adam_bufs *s)
{
    adam_init(d, s->n);
    memcpy(d->master, s->master, s->n * 4);
    memcpy(d->m, s->m, s->n * 4);
    memcpy(d->v, s->v, s->n * 4);
    memcpy(d->grad, s->grad, s->n * 2);
    memcpy(d->param, s->param, s->n * 2);
}

static int adam_equal(const adam_bufs *a, const adam_bufs *b)
{
    return memcmp(a->master, b->master, a->n * 4) == 0 && memcmp(a->m, b->m, a->n * 4) == 0 &&
           memcmp(a->v, b->v, a->n * 4) == 0 && memcmp(a->grad, b->grad, a->n * 2) == 0 &&
           memcmp(a->param, b->param, a->n * 2) == 0;
}

static void adam_free(adam_bufs *b)
{
    free(b->master);
    free(b->m);
    free(b->v);
    free(b->grad);
    free(b->param);
}

static zero_adam_range adam_range(adam_bufs *b)
{
    zero_adam_range r;
    memset(&r, 0, sizeof r);
    r.numel = b->n;
    r.master = b->master;
    r.m = b->m;
    r.v = b->v;
    r.grad = b->grad;
    r.grad_dtype = ZERO_F16;
    r.param = b->param;
    r.param_dtype = ZERO_BF16;
    return r;
}

ZT_TEST(adam_skips_or_matches_the_host_kernel)
{
    zero_device *dev = make_dev(ZERO_SIMD_AUTO, 1), *dev3 = make_dev(ZERO_SIMD_AUTO, 3);
    zero_adam_desc desc, resolved;
    zero_adam_coefs coefs;
    adam_bufs a, b, c;
    zero_adam_range ra, rb, rc;
    float mul = 1.0f / 1024.0f, skip = 1.0f, noskip = 0.0f;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    memset(&rc, 0, sizeof rc);
    memset(&desc, 0, sizeof desc);
    desc.weight_decay = 0.01f;
    ZT_CHECK(zero_adam_desc_resolve(&resolved, &desc) == ZERO_OK);
    ZT_CHECK(zero_adam_coefs_make(&coefs, &resolved, 0.01f, 3) == ZERO_OK);
    zt_seed(8);
    adam_init(&a, 100003);
    adam_copy(&b, &a);
    adam_copy(&c, &a);
    ra = adam_range(&a);
    rb = adam_range(&b);
    rc = adam_range(&c);
    ZT_CHECK(dev->ops->adam(dev, Q, &ra, &coefs, &mul, &skip) == ZERO_OK);
    ZT_CHECKF(adam_equal(&a, &b), "a skipped step changed the state");
    ZT_CHECK(dev->ops->adam(dev, Q, &ra, &coefs, &mul, &noskip) == ZERO_OK);
    ZT_CHECK(zero_adam_host(&rb, &coefs, mul, ZERO_SIMD_AUTO, 1) == ZERO_OK);
    ZT_CHECKF(adam_equal(&a, &b), "the device step differs from zero_adam_host");
    ZT_CHECKF(!adam_equal(&a, &c), "the step changed nothing");
    ZT_CHECK(dev3->ops->adam(dev3, Q, &rc, &coefs, &mul, NULL) == ZERO_OK); /* NULL skip: runs */
    ZT_CHECKF(adam_equal(&a, &c), "3 threads differ from 1");
    ZT_CHECK(dev->ops->adam(dev, Q, &ra, &coefs, NULL, &noskip) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->adam(dev, Q, NULL, &coefs, &mul, &noskip) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->adam(dev, Q, &ra, NULL, &mul, &noskip) == ZERO_ERROR_INVALID_ARGUMENT);
    ra.grad_dtype = ZERO_DTYPE_DEFAULT;
    ZT_CHECK(dev->ops->adam(dev, Q, &ra, &coefs, &mul, &noskip) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->adam(dev, (zero_queue)5, &rb, &coefs, &mul, &noskip) == ZERO_ERROR_INVALID_ARGUMENT);
    adam_free(&a);
    adam_free(&b);
    adam_free(&c);
    zero_device_destroy(dev);
    zero_device_destroy(dev3);
}

/* ---- neither threads nor the SIMD path change any result ---- */

ZT_TEST(kernels_match_across_threads_and_simd_paths)
{
    size_t n = zt_quick() ? 600001 : 2000003; /* odd: every path has a tail */
    int di, sp, t;
    zt_seed(9);
    for (di = 0; di < 4; di++) {
        zero_dtype dt = dtypes[di], to = dt == ZERO_F32 ? ZERO_BF16 : ZERO_F32;
        size_t es = zero_dtype_size(dt), i;
        void *x = xmalloc(n * es), *y = xmalloc(n * es), *x0 = xmalloc(n * es), *xr = xmalloc(n * es);
        void *c0 = xmalloc(n * 4), *cr = xmalloc(n * 4);
        float flag0 = 0.0f;
        fill(dt, x, n);
        fill(dt, y, n);
        put_special(dt, x, n - 3, 1); /* a NaN in the tail for nonfinite, then removed */
        for (sp = ZERO_SIMD_PORTABLE; sp <= (int)zero_simd_detect(); sp++)
            for (t = 1; t <= 5; t += 4) {
                zero_device *dev = make_dev((zero_simd)sp, t);
                float flag = 0.0f;
                void *w = sp == ZERO_SIMD_PORTABLE && t == 1 ? x0 : xr;
                void *c = sp == ZERO_SIMD_PORTABLE && t == 1 ? c0 : cr;
                ZT_CHECK(dev->ops->nonfinite(dev, Q, x, dt, n, &flag) == ZERO_OK && flag == 1.0f);
                memcpy(w, x, n * es);
                put(dt, w, n - 3, 1.0);
                ZT_CHECK(dev->ops->nonfinite(dev, Q, w, dt, n, &flag0) == ZERO_OK && flag0 == 0.0f);
                ZT_CHECK(dev->ops->add(dev, Q, w, y, dt, n) == ZERO_OK);
                ZT_CHECK(dev->ops->scale(dev, Q, w, dt, n, 0.75f) == ZERO_OK);
                ZT_CHECK(dev->ops->add(dev, Q, w, w, dt, n) == ZERO_OK);
                ZT_CHECK(dev->ops->cast(dev, Q, c, to, w, dt, n) == ZERO_OK);
                if (w == xr) {
                    size_t bad = 0;
                    for (i = 0; i < n; i++) bad += memcmp((char *)xr + i * es, (char *)x0 + i * es, es) != 0;
                    ZT_CHECKF(bad == 0, "add/scale %s on %s, %d threads: %zu differ", zero_dtype_name(dt),
                              zero_simd_name((zero_simd)sp), t, bad);
                    ZT_CHECKF(memcmp(c0, cr, n * zero_dtype_size(to)) == 0, "cast %s -> %s on %s, %d threads",
                              zero_dtype_name(dt), zero_dtype_name(to), zero_simd_name((zero_simd)sp), t);
                }
                zero_device_destroy(dev);
            }
        free(x);
        free(y);
        free(x0);
        free(xr);
        free(c0);
        free(cr);
    }
}

/* ---- argument errors of the element kernels ---- */

ZT_TEST(kernels_reject_bad_arguments)
{
    zero_device *dev = make_dev(ZERO_SIMD_AUTO, 1), fake;
    float f[4] = {1, 2, 3, 4}, flag = 0.0f;
    double acc = 0.0;
    fake = *dev;
    fake.impl = NULL;
    ZT_CHECK(dev->ops->add(dev, Q, NULL, f, ZERO_F32, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->add(dev, Q, f, NULL, ZERO_F32, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->add(dev, Q, f, f, ZERO_DTYPE_DEFAULT, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->add(dev, Q, f, f, (zero_dtype)17, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->add(dev, (zero_queue)3, f, f, ZERO_F32, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->add(&fake, Q, f, f, ZERO_F32, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->add(NULL, Q, f, f, ZERO_F32, 4) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->add(dev, Q, f, f, ZERO_F32, (size_t)-1 / 2) == ZERO_ERROR_OVERFLOW);
    ZT_CHECK(dev->ops->add(dev, Q, NULL, NULL, ZERO_F32, 0) == ZERO_OK);
    ZT_CHECK(dev->ops->scale(dev, Q, NULL, ZERO_F16, 1, 2.0f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->scale(dev, Q, f, (zero_dtype)0, 1, 2.0f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->cast(dev, Q, f, ZERO_F32, NULL, ZERO_F16, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->cast(dev, Q, f, (zero_dtype)5, f, ZERO_F16, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->nonfinite(dev, Q, f, ZERO_F32, 4, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->nonfinite(dev, Q, NULL, ZERO_F32, 4, &flag) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->nonfinite(dev, (zero_queue)-1, f, ZERO_F32, 4, &flag) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->sumsq(dev, Q, f, ZERO_F32, 4, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->sumsq(dev, Q, f, (zero_dtype)10, 4, &acc) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev->ops->sumsq(dev, Q, NULL, ZERO_F32, 0, &acc) == ZERO_OK && acc == 0.0);
    ZT_CHECK(dev->ops->grad_mul(&fake, Q, &acc, &flag, 1.0f, 0.0f, f) == ZERO_ERROR_INVALID_ARGUMENT);
    /* the values were never touched */
    ZT_CHECK(f[0] == 1 && f[1] == 2 && f[2] == 3 && f[3] == 4 && flag == 0.0f);
    zero_device_destroy(dev);
}

int main(void)
{
    ZT_RUN(alloc_is_aligned_and_accounted);
    ZT_RUN(create_validates_its_descriptor);
    ZT_RUN(events_and_transfers);
    ZT_RUN(cast_matches_scalar_conversions);
    ZT_RUN(add_and_scale_round_once);
    ZT_RUN(nonfinite_finds_inf_and_nan_anywhere);
    ZT_RUN(sumsq_is_accurate_and_path_independent);
    ZT_RUN(grad_mul_clips_and_skips);
    ZT_RUN(adam_skips_or_matches_the_host_kernel);
    ZT_RUN(kernels_match_across_threads_and_simd_paths);
    ZT_RUN(kernels_reject_bad_arguments);
    return zt_summary();
}
