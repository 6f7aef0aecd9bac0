/* Host device implementation (section of zero.h): zero_device_ops on the CPU, synchronous.

   Memory: each allocation is over-allocated by 63 bytes and rounded up to 64; a small
   open-addressing table (pointer -> original pointer, bytes, category) makes free of a
   foreign pointer an error instead of a crash and gives exact per-category accounting.

   Kernels: element-wise, in blocks of ZERO_HOST_SUMSQ_BLOCK elements. With threads > 1
   and enough elements, the blocks are split over workers (each a contiguous run of
   blocks); a block's work never depends on which thread runs it, and per-block results
   (sums of squares, non-finite flags) are folded in block order on the calling thread, so
   every result is the same for any thread count. fp16 / bf16 go through fp32 tiles
   converted by zero_convert() (H1's SIMD paths, bit-identical to the scalar ones). */

#include <pthread.h>

#define ZERO__HOST_TILE 512                 /* elements per fp32 tile on the stack       */
#define ZERO__HOST_WAVE 256                 /* blocks whose results are held at once     */
#define ZERO__HOST_PER_THREAD (1u << 18)    /* elements below which a worker is not worth it */
#define ZERO__HOST_EVENT_MAGIC 0x7a657645u  /* "zevE" */

typedef struct zero__host_slot {
    void *ptr; /* NULL = empty */
    void *raw;
    size_t bytes;
    zero_mem_category category;
} zero__host_slot;

typedef struct zero__host_device {
    zero_device base;
    zero_allocator allocator;
    zero_simd simd; /* resolved: never AUTO */
    int threads;
    pthread_mutex_t mu; /* guards the table and the counters */
    zero__host_slot *table;
    size_t cap;   /* a power of two, or 0 */
    size_t count; /* live allocations */
    size_t bytes[ZERO_MEM_COUNT];
} zero__host_device;

struct zero_event {
    uint32_t magic;
    zero_device *dev;
};

static void zero__host_destroy(zero_device *dev);

static zero__host_device *zero__host_get(zero_device *dev)
{
    if (!dev || !dev->ops || dev->ops->destroy != zero__host_destroy || !dev->impl) return NULL;
    return (zero__host_device *)dev->impl;
}

/* The common checks of every op: a host device and a queue in range. */
#define ZERO__HOST_ENTER(what)                                                                 \
    zero__host_device *d = zero__host_get(dev);                                               \
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: dev is not a host device", what); \
    if ((int)q < 0 || (int)q >= ZERO_QUEUE_COUNT)                                             \
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: queue %d out of range", what, (int)q)

/* NULL with numel > 0, unknown dtype, or numel * size overflowing: an error; else OK. */
static zero_result zero__host_check_buf(const char *what, const char *arg, const void *p,
                                        zero_dtype dtype, size_t numel)
{
    size_t es = zero_dtype_size(dtype), bytes;
    if (es == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: unknown dtype %d", what, (int)dtype);
    if (zero__mul_size(numel, es, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "host %s: numel %zu of %s overflows", what, numel,
                          zero_dtype_name(dtype));
    if (numel > 0 && !p)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: %s is NULL with numel = %zu", what, arg,
                          numel);
    return ZERO_OK;
}

/* ---- the allocation table ---- */

static size_t zero__host_hash(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p >> 6; /* every pointer is 64-byte aligned */
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static size_t zero__host_find(const zero__host_device *d, const void *p)
{
    size_t i;
    if (d->cap == 0) return (size_t)-1;
    for (i = zero__host_hash(p, d->cap); d->table[i].ptr; i = (i + 1) & (d->cap - 1))
        if (d->table[i].ptr == p) return i;
    return (size_t)-1;
}

static void zero__host_put(zero__host_slot *table, size_t cap, const zero__host_slot *s)
{
    size_t i = zero__host_hash(s->ptr, cap);
    while (table[i].ptr) i = (i + 1) & (cap - 1);
    table[i] = *s;
}

/* Keeps the load at most 1/2. */
static int zero__host_grow(zero__host_device *d)
{
    size_t cap = d->cap ? d->cap * 2 : 64, i, bytes;
    zero__host_slot *t;
    if ((d->count + 1) * 2 <= d->cap) return 0;
    if (zero__mul_size(cap, sizeof *t, &bytes) != 0) return -1;
    t = (zero__host_slot *)zero__alloc(&d->allocator, bytes);
    if (!t) return -1;
    memset(t, 0, bytes);
    for (i = 0; i < d->cap; i++)
        if (d->table[i].ptr) zero__host_put(t, cap, &d->table[i]);
    zero__free(&d->allocator, d->table);
    d->table = t;
    d->cap = cap;
    return 0;
}

/* Removes slot i, shifting later members of its probe run back (no tombstones). */
static void zero__host_remove(zero__host_device *d, size_t i)
{
    size_t mask = d->cap - 1, j = i, home;
    d->table[i].ptr = NULL;
    for (;;) {
        j = (j + 1) & mask;
        if (!d->table[j].ptr) return;
        home = zero__host_hash(d->table[j].ptr, d->cap);
        /* move j into the hole i when its home is not cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            d->table[i] = d->table[j];
            d->table[j].ptr = NULL;
            i = j;
        }
    }
}

static zero_result zero__host_alloc(zero_device *dev, size_t bytes, zero_mem_category category,
                                    void **out)
{
    zero__host_device *d = zero__host_get(dev);
    zero__host_slot s;
    size_t total;
    int rc;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: dev is not a host device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: out is NULL");
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: bytes = 0");
    if ((int)category < 0 || category >= ZERO_MEM_COUNT)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: category %d out of range", (int)category);
    if (zero__add_size(bytes, 63, &total) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "host alloc: bytes = %zu overflows", bytes);
    s.raw = zero__alloc(&d->allocator, total);
    if (!s.raw)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host alloc: %zu bytes (%s) failed", bytes,
                          zero_mem_category_name(category));
    s.ptr = (void *)(((uintptr_t)s.raw + 63u) & ~(uintptr_t)63u);
    s.bytes = bytes;
    s.category = category;
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0) {
        zero__free(&d->allocator, s.raw);
        return zero__fail(ZERO_ERROR_DEVICE, "host alloc: pthread_mutex_lock failed: %s", strerror(rc));
    }
    if (zero__host_grow(d) != 0) {
        pthread_mutex_unlock(&d->mu);
        zero__free(&d->allocator, s.raw);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host alloc: out of memory for the allocation table");
    }
    zero__host_put(d->table, d->cap, &s);
    d->count++;
    d->bytes[category] += bytes;
    pthread_mutex_unlock(&d->mu);
    *out = s.ptr;
    return ZERO_OK;
}

static zero_result zero__host_free(zero_device *dev, void *ptr)
{
    zero__host_device *d = zero__host_get(dev);
    zero__host_slot s;
    size_t i;
    int rc;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host free: dev is not a host device");
    if (!ptr) return ZERO_OK;
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_DEVICE, "host free: pthread_mutex_lock failed: %s", strerror(rc));
    i = zero__host_find(d, ptr);
    if (i == (size_t)-1) {
        pthread_mutex_unlock(&d->mu);
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "host free: %p was not allocated by this device (or was freed already)", ptr);
    }
    s = d->table[i];
    zero__host_remove(d, i);
    d->count--;
    d->bytes[s.category] -= s.bytes;
    pthread_mutex_unlock(&d->mu);
    zero__free(&d->allocator, s.raw);
    return ZERO_OK;
}

/* ---- queues and events: everything has already happened ---- */

static zero_result zero__host_event_create(zero_device *dev, zero_event **out)
{
    zero__host_device *d = zero__host_get(dev);
    zero_event *ev;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host event_create: dev is not a host device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host event_create: out is NULL");
    ev = (zero_event *)zero__alloc(&d->allocator, sizeof *ev);
    if (!ev) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host event_create: out of memory");
    ev->magic = ZERO__HOST_EVENT_MAGIC;
    ev->dev = dev;
    *out = ev;
    return ZERO_OK;
}

static void zero__host_event_destroy(zero_device *dev, zero_event *ev)
{
    zero__host_device *d = zero__host_get(dev);
    if (!d || !ev || ev->magic != ZERO__HOST_EVENT_MAGIC || ev->dev != dev) return;
    ev->magic = 0;
    zero__free(&d->allocator, ev);
}

static zero_result zero__host_check_event(const char *what, zero_device *dev, const zero_event *ev)
{
    if (!ev) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: event is NULL", what);
    if (ev->magic != ZERO__HOST_EVENT_MAGIC || ev->dev != dev)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: not an event of this device", what);
    return ZERO_OK;
}

static zero_result zero__host_record(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO__HOST_ENTER("record");
    (void)d;
    return zero__host_check_event("record", dev, ev);
}

static zero_result zero__host_wait(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO__HOST_ENTER("wait");
    (void)d;
    return zero__host_check_event("wait", dev, ev);
}

static zero_result zero__host_sync(zero_device *dev, zero_queue q)
{
    ZERO__HOST_ENTER("sync");
    (void)d;
    return ZERO_OK;
}

static void *zero__host_native_queue(zero_device *dev, zero_queue q)
{
    (void)dev;
    (void)q;
    return NULL;
}

/* ---- transfers ---- */

static zero_result zero__host_move(zero_device *dev, zero_queue q, void *dst, const void *src,
                                   size_t bytes, const char *what)
{
    ZERO__HOST_ENTER(what);
    (void)d;
    if (bytes > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: %s is NULL with bytes = %zu", what,
                          dst ? "src" : "dst", bytes);
    if (bytes > 0 && dst != src) memmove(dst, src, bytes);
    return ZERO_OK;
}

static zero_result zero__host_copy(zero_device *dev, zero_queue q, void *dst, const void *src,
                                   size_t bytes)
{
    return zero__host_move(dev, q, dst, src, bytes, "copy");
}

static zero_result zero__host_upload(zero_device *dev, zero_queue q, void *dst, const void *host_src,
                                     size_t bytes)
{
    return zero__host_move(dev, q, dst, host_src, bytes, "upload");
}

static zero_result zero__host_download(zero_device *dev, zero_queue q, void *host_dst,
                                       const void *src, size_t bytes)
{
    return zero__host_move(dev, q, host_dst, src, bytes, "download");
}

static zero_result zero__host_fill_zero(zero_device *dev, zero_queue q, void *dst, size_t bytes)
{
    ZERO__HOST_ENTER("fill_zero");
    (void)d;
    if (bytes > 0 && !dst)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host fill_zero: dst is NULL with bytes = %zu", bytes);
    if (bytes > 0) memset(dst, 0, bytes);
    return ZERO_OK;
}

/* ---- blocks over threads ---- */

/* One block [begin, end) of a kernel; returns the block's result (or 0). */
typedef double (*zero__host_body)(void *ctx, size_t begin, size_t end);

typedef struct zero__host_job {
    zero__host_body body;
    void *ctx;
    size_t numel;
    size_t first, last; /* blocks [first, last) */
    double *results;    /* results[b - wave_first] */
    size_t wave_first;
} zero__host_job;

static void zero__host_job_run(const zero__host_job *j)
{
    size_t b, begin, end;
    for (b = j->first; b < j->last; b++) {
        begin = b * (size_t)ZERO_HOST_SUMSQ_BLOCK;
        end = j->numel - begin < (size_t)ZERO_HOST_SUMSQ_BLOCK ? j->numel : begin + ZERO_HOST_SUMSQ_BLOCK;
        j->results[b - j->wave_first] = j->body(j->ctx, begin, end);
    }
}

static void *zero__host_job_thread(void *arg)
{
    zero__host_job_run((const zero__host_job *)arg);
    return NULL;
}

/* Runs body over [0, numel) in blocks and returns the sum of the block results, added in
   block order starting from 0, whatever the number of threads. */
static double zero__host_for(const zero__host_device *d, size_t numel, zero__host_body body,
                             void *ctx)
{
    double results[ZERO__HOST_WAVE], total = 0.0;
    size_t nblocks = numel / ZERO_HOST_SUMSQ_BLOCK + (numel % ZERO_HOST_SUMSQ_BLOCK != 0);
    size_t want = numel / ZERO__HOST_PER_THREAD, wave, k, t, nthreads, first;
    zero__host_job jobs[64];
    pthread_t th[64];
    int started[64];
    nthreads = (size_t)(d->threads > 1 ? d->threads : 1);
    if (nthreads > want) nthreads = want ? want : 1;
    if (nthreads > 64) nthreads = 64;
    for (first = 0; first < nblocks; first += wave) {
        wave = nblocks - first < ZERO__HOST_WAVE ? nblocks - first : ZERO__HOST_WAVE;
        t = nthreads < wave ? nthreads : wave;
        for (k = 0; k < t; k++) {
            jobs[k].body = body;
            jobs[k].ctx = ctx;
            jobs[k].numel = numel;
            jobs[k].first = first + wave * k / t;
            jobs[k].last = first + wave * (k + 1) / t;
            jobs[k].results = results;
            jobs[k].wave_first = first;
        }
        /* worker k > 0 on its own thread; if a thread cannot start, the caller runs its part */
        for (k = 1; k < t; k++) started[k] = pthread_create(&th[k], NULL, zero__host_job_thread, &jobs[k]) == 0;
        zero__host_job_run(&jobs[0]);
        for (k = 1; k < t; k++) {
            if (started[k]) pthread_join(th[k], NULL);
            else zero__host_job_run(&jobs[k]);
        }
        for (k = 0; k < wave; k++) total += results[k];
    }
    return total;
}

/* ---- element kernels ---- */

typedef struct zero__host_ctx {
    const zero__host_device *d;
    void *dst;
    const void *src;
    zero_dtype dtype;
    zero_dtype src_dtype;
    float s;
} zero__host_ctx;

static double zero__host_body_cast(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    zero_convert((unsigned char *)c->dst + begin * zero_dtype_size(c->dtype), c->dtype,
                 (const unsigned char *)c->src + begin * zero_dtype_size(c->src_dtype), c->src_dtype,
                 end - begin, c->d->simd);
    return 0.0;
}

static zero_result zero__host_cast(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                                   const void *src, zero_dtype src_dtype, size_t numel)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("cast");
    if ((r = zero__host_check_buf("cast", "dst", dst, dst_dtype, numel)) != ZERO_OK) return r;
    if ((r = zero__host_check_buf("cast", "src", src, src_dtype, numel)) != ZERO_OK) return r;
    if (dst_dtype == src_dtype || numel < 2 * (size_t)ZERO__HOST_PER_THREAD || d->threads <= 1)
        return zero_convert(dst, dst_dtype, src, src_dtype, numel, d->simd); /* memmove if same */
    c.d = d;
    c.dst = dst;
    c.src = src;
    c.dtype = dst_dtype;
    c.src_dtype = src_dtype;
    c.s = 0.0f;
    zero__host_for(d, numel, zero__host_body_cast, &c);
    return ZERO_OK;
}

/* Portable bodies of the kernels over [begin, end). The SIMD bodies below do whole vectors
   and hand the rest to these, which compute the same expression element by element. */
static void zero__host_add_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t i, n, base;
    if (c->dtype == ZERO_F32) {
        float *x = (float *)c->dst;
        const float *y = (const float *)c->src;
        for (i = begin; i < end; i++) x[i] = x[i] + y[i];
    } else if (c->dtype == ZERO_F64) {
        double *x = (double *)c->dst;
        const double *y = (const double *)c->src;
        for (i = begin; i < end; i++) x[i] = x[i] + y[i];
    } else {
        float a[ZERO__HOST_TILE], b[ZERO__HOST_TILE];
        uint16_t *x = (uint16_t *)c->dst;
        const uint16_t *y = (const uint16_t *)c->src;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            zero_convert(a, ZERO_F32, x + base, c->dtype, n, c->d->simd);
            zero_convert(b, ZERO_F32, y + base, c->dtype, n, c->d->simd);
            for (i = 0; i < n; i++) a[i] = a[i] + b[i];
            zero_convert(x + base, c->dtype, a, ZERO_F32, n, c->d->simd);
        }
    }
}

static void zero__host_scale_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t i, n, base;
    float s = c->s;
    if (c->dtype == ZERO_F32) {
        float *x = (float *)c->dst;
        for (i = begin; i < end; i++) x[i] = x[i] * s;
    } else if (c->dtype == ZERO_F64) {
        double *x = (double *)c->dst, sd = (double)s;
        for (i = begin; i < end; i++) x[i] = x[i] * sd;
    } else {
        float a[ZERO__HOST_TILE];
        uint16_t *x = (uint16_t *)c->dst;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            zero_convert(a, ZERO_F32, x + base, c->dtype, n, c->d->simd);
            for (i = 0; i < n; i++) a[i] = a[i] * s;
            zero_convert(x + base, c->dtype, a, ZERO_F32, n, c->d->simd);
        }
    }
}

/* Non-zero when [begin, end) holds an inf or NaN: exponent bits all ones, as integers. */
static unsigned zero__host_nonfinite_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    const unsigned char *x = (const unsigned char *)c->src;
    size_t i;
    unsigned bad = 0;
    if (c->dtype == ZERO_F32) {
        for (i = begin; i < end; i++) {
            uint32_t u;
            memcpy(&u, x + 4 * i, 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    } else if (c->dtype == ZERO_F64) {
        for (i = begin; i < end; i++) {
            uint64_t u;
            memcpy(&u, x + 8 * i, 8);
            bad |= (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        }
    } else {
        uint16_t mask = c->dtype == ZERO_F16 ? 0x7c00u : 0x7f80u;
        for (i = begin; i < end; i++) {
            uint16_t u;
            memcpy(&u, x + 2 * i, 2);
            bad |= (u & mask) == mask;
        }
    }
    return bad;
}

/* Adds x[i]^2 for i in [begin, end) into lane[i mod 8], in order of i: exact products for
   fp32/fp16/bf16 (so an fma gives the same bits), fma for fp64. */
static void zero__host_sumsq_portable(const zero__host_ctx *c, size_t begin, size_t end, double *lane)
{
    size_t i, n, base;
    if (c->dtype == ZERO_F64) {
        const double *x = (const double *)c->src;
        for (i = begin; i < end; i++) lane[i & 7] = fma(x[i], x[i], lane[i & 7]);
    } else {
        float t[ZERO__HOST_TILE];
        const float *x;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            if (c->dtype == ZERO_F32) {
                x = (const float *)c->src + base;
            } else {
                zero_convert(t, ZERO_F32, (const uint16_t *)c->src + base, c->dtype, n, c->d->simd);
                x = t;
            }
            for (i = 0; i < n; i++) lane[(base + i) & 7] += (double)x[i] * (double)x[i];
        }
    }
}

#ifdef ZERO__X86_SIMD
/* AVX2 and AVX-512 bodies for fp32/fp16/bf16 (fp64 stays portable). Each returns the first
   index it did not do. GCC 12's AVX-512 headers make g++ warn "__Y may be used
   uninitialized" inside _mm512_undefined_*() (GCC PR 105593, fixed in 13): silenced here. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ZERO__HOST_POP_DIAGNOSTIC 1
#endif
ZERO__AVX2 static inline __m256 zero__host_ld8(zero_dtype dt, const unsigned char *p)
{
    if (dt == ZERO_F32) return _mm256_loadu_ps((const float *)(const void *)p);
    if (dt == ZERO_F16) return zero__ld_f16x8_avx2(p);
    return zero__ld_bf16x8_avx2(p);
}

ZERO__AVX2 static inline void zero__host_st8(zero_dtype dt, unsigned char *p, __m256 x)
{
    if (dt == ZERO_F32) _mm256_storeu_ps((float *)(void *)p, x);
    else if (dt == ZERO_F16) zero__st_f16x8_avx2(p, x);
    else zero__st_bf16x8_avx2(p, x);
}

ZERO__AVX2 static size_t zero__host_add_avx2(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    const unsigned char *y = (const unsigned char *)c->src;
    for (i = begin; i + 8 <= end; i += 8)
        zero__host_st8(c->dtype, x + i * es,
                       _mm256_add_ps(zero__host_ld8(c->dtype, x + i * es), zero__host_ld8(c->dtype, y + i * es)));
    return i;
}

ZERO__AVX2 static size_t zero__host_scale_avx2(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    __m256 s = _mm256_set1_ps(c->s);
    for (i = begin; i + 8 <= end; i += 8)
        zero__host_st8(c->dtype, x + i * es, _mm256_mul_ps(zero__host_ld8(c->dtype, x + i * es), s));
    return i;
}

ZERO__AVX2 static size_t zero__host_nonfinite_avx2(const zero__host_ctx *c, size_t begin, size_t end,
                                                   unsigned *bad)
{
    const unsigned char *x = (const unsigned char *)c->src;
    __m256i any = _mm256_setzero_si256(), m, v;
    size_t i;
    if (c->dtype == ZERO_F32) {
        m = _mm256_set1_epi32(0x7f800000);
        for (i = begin; i + 8 <= end; i += 8) {
            v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + 4 * i)), m);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi32(v, m));
        }
    } else {
        m = _mm256_set1_epi16((short)(c->dtype == ZERO_F16 ? 0x7c00 : 0x7f80));
        for (i = begin; i + 16 <= end; i += 16) {
            v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + 2 * i)), m);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi16(v, m));
        }
    }
    *bad |= !_mm256_testz_si256(any, any);
    return i;
}

ZERO__AVX2 static size_t zero__host_sumsq_avx2(const zero__host_ctx *c, size_t begin, size_t end,
                                               double *lane)
{
    size_t es = zero_dtype_size(c->dtype), i;
    const unsigned char *x = (const unsigned char *)c->src;
    __m256d a0 = _mm256_loadu_pd(lane), a1 = _mm256_loadu_pd(lane + 4), lo, hi;
    __m256 v;
    for (i = begin; i + 8 <= end; i += 8) { /* lanes 0-3 in a0, 4-7 in a1 (begin = 0 mod 8) */
        v = zero__host_ld8(c->dtype, x + i * es);
        lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
    return i;
}

ZERO__AVX512 static inline __m512 zero__host_ld16(zero_dtype dt, const unsigned char *p)
{
    if (dt == ZERO_F32) return _mm512_loadu_ps(p);
    if (dt == ZERO_F16) return zero__ld_f16x16_avx512(p);
    return zero__ld_bf16x16_avx512(p);
}

ZERO__AVX512 static inline void zero__host_st16(zero_dtype dt, unsigned char *p, __m512 x)
{
    if (dt == ZERO_F32) _mm512_storeu_ps(p, x);
    else if (dt == ZERO_F16) zero__st_f16x16_avx512(p, x);
    else zero__st_bf16x16_avx512(p, x);
}

ZERO__AVX512 static size_t zero__host_add_avx512(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    const unsigned char *y = (const unsigned char *)c->src;
    for (i = begin; i + 16 <= end; i += 16)
        zero__host_st16(c->dtype, x + i * es,
                        _mm512_add_ps(zero__host_ld16(c->dtype, x + i * es), zero__host_ld16(c->dtype, y + i * es)));
    return i;
}

ZERO__AVX512 static size_t zero__host_scale_avx512(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    __m512 s = _mm512_set1_ps(c->s);
    for (i = begin; i + 16 <= end; i += 16)
        zero__host_st16(c->dtype, x + i * es, _mm512_mul_ps(zero__host_ld16(c->dtype, x + i * es), s));
    return i;
}

ZERO__AVX512 static size_t zero__host_nonfinite_avx512(const zero__host_ctx *c, size_t begin, size_t end,
                                                       unsigned *bad)
{
    const unsigned char *x = (const unsigned char *)c->src;
    __m512i m, v;
    size_t i;
    unsigned any = 0;
    if (c->dtype == ZERO_F32) {
        m = _mm512_set1_epi32(0x7f800000);
        for (i = begin; i + 16 <= end; i += 16) {
            v = _mm512_and_si512(_mm512_loadu_si512(x + 4 * i), m);
            any |= (unsigned)_mm512_cmpeq_epi32_mask(v, m);
        }
    } else {
        m = _mm512_set1_epi16((short)(c->dtype == ZERO_F16 ? 0x7c00 : 0x7f80));
        for (i = begin; i + 32 <= end; i += 32) {
            v = _mm512_and_si512(_mm512_loadu_si512(x + 2 * i), m);
            any |= _mm512_cmpeq_epi16_mask(v, m) != 0;
        }
    }
    *bad |= any != 0;
    return i;
}

ZERO__AVX512 static size_t zero__host_sumsq_avx512(const zero__host_ctx *c, size_t begin, size_t end,
                                                   double *lane)
{
    size_t es = zero_dtype_size(c->dtype), i;
    const unsigned char *x = (const unsigned char *)c->src;
    __m512d a = _mm512_loadu_pd(lane), lo, hi;
    __m512 v;
    for (i = begin; i + 16 <= end; i += 16) { /* lane k: element i + k, then i + 8 + k */
        v = zero__host_ld16(c->dtype, x + i * es);
        lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a = _mm512_fmadd_pd(lo, lo, a);
        a = _mm512_fmadd_pd(hi, hi, a);
    }
    _mm512_storeu_pd(lane, a);
    return i;
}

#ifdef ZERO__HOST_POP_DIAGNOSTIC
#pragma GCC diagnostic pop
#undef ZERO__HOST_POP_DIAGNOSTIC
#endif

#define ZERO__HOST_SIMD(c, avx2_call, avx512_call, i)                                          \
    do {                                                                                      \
        if ((c)->dtype != ZERO_F64 && (c)->d->simd == ZERO_SIMD_AVX512) i = avx512_call;     \
        else if ((c)->dtype != ZERO_F64 && (c)->d->simd == ZERO_SIMD_AVX2) i = avx2_call;    \
    } while (0)
#else
#define ZERO__HOST_SIMD(c, avx2_call, avx512_call, i) (void)0
#endif

static double zero__host_body_add(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_add_avx2(c, begin, end), zero__host_add_avx512(c, begin, end), i);
    zero__host_add_portable(c, i, end);
    return 0.0;
}

static zero_result zero__host_add(zero_device *dev, zero_queue q, void *dst, const void *src,
                                  zero_dtype dtype, size_t numel)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("add");
    if ((r = zero__host_check_buf("add", "dst", dst, dtype, numel)) != ZERO_OK) return r;
    if ((r = zero__host_check_buf("add", "src", src, dtype, numel)) != ZERO_OK) return r;
    memset(&c, 0, sizeof c);
    c.d = d;
    c.dst = dst;
    c.src = src;
    c.dtype = dtype;
    zero__host_for(d, numel, zero__host_body_add, &c);
    return ZERO_OK;
}

static double zero__host_body_scale(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_scale_avx2(c, begin, end), zero__host_scale_avx512(c, begin, end), i);
    zero__host_scale_portable(c, i, end);
    return 0.0;
}

static zero_result zero__host_scale(zero_device *dev, zero_queue q, void *x, zero_dtype dtype,
                                    size_t numel, float s)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("scale");
    if ((r = zero__host_check_buf("scale", "x", x, dtype, numel)) != ZERO_OK) return r;
    memset(&c, 0, sizeof c);
    c.d = d;
    c.dst = x;
    c.dtype = dtype;
    c.s = s;
    zero__host_for(d, numel, zero__host_body_scale, &c);
    return ZERO_OK;
}

static double zero__host_body_nonfinite(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    unsigned bad = 0;
    ZERO__HOST_SIMD(c, zero__host_nonfinite_avx2(c, begin, end, &bad),
                    zero__host_nonfinite_avx512(c, begin, end, &bad), i);
    bad |= zero__host_nonfinite_portable(c, i, end);
    return bad ? 1.0 : 0.0;
}

static zero_result zero__host_nonfinite(zero_device *dev, zero_queue q, const void *x,
                                        zero_dtype dtype, size_t numel, float *flag)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("nonfinite");
    if ((r = zero__host_check_buf("nonfinite", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!flag) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host nonfinite: flag is NULL");
    memset(&c, 0, sizeof c);
    c.d = d;
    c.src = x;
    c.dtype = dtype;
    if (zero__host_for(d, numel, zero__host_body_nonfinite, &c) > 0.0) *flag = 1.0f;
    return ZERO_OK;
}

/* The sum of squares of one block in fp64: lane k adds x[i]^2 for i = k mod 8 in order of
   i, then ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). Blocks start at multiples of 8 and the
   vector bodies stop at one, so the lanes follow the global index on every path. */
static double zero__host_body_sumsq(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_sumsq_avx2(c, begin, end, lane), zero__host_sumsq_avx512(c, begin, end, lane), i);
    zero__host_sumsq_portable(c, i, end, lane);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static zero_result zero__host_sumsq(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                                    size_t numel, double *acc)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("sumsq");
    if ((r = zero__host_check_buf("sumsq", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!acc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host sumsq: acc is NULL");
    memset(&c, 0, sizeof c);
    c.d = d;
    c.src = x;
    c.dtype = dtype;
    *acc += zero__host_for(d, numel, zero__host_body_sumsq, &c);
    return ZERO_OK;
}

static zero_result zero__host_grad_mul(zero_device *dev, zero_queue q, const double *sumsq,
                                       const float *nonfinite, float unscale, float clip_norm,
                                       float *out)
{
    ZERO__HOST_ENTER("grad_mul");
    (void)d;
    if (!sumsq || !nonfinite || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host grad_mul: %s is NULL",
                          !sumsq ? "sumsq" : !nonfinite ? "nonfinite" : "out");
    zero_grad_mul(*sumsq, *nonfinite, unscale, clip_norm, &out[0], &out[1]);
    return ZERO_OK;
}

static zero_result zero__host_adam(zero_device *dev, zero_queue q, const zero_adam_range *range,
                                   const zero_adam_coefs *coefs, const float *grad_mul,
                                   const float *skip)
{
    ZERO__HOST_ENTER("adam");
    if (!range || !coefs || !grad_mul)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host adam: %s is NULL",
                          !range ? "range" : !coefs ? "coefs" : "grad_mul");
    if (skip && *skip != 0.0f) return ZERO_OK;
    return zero_adam_host(range, coefs, *grad_mul, d->simd, d->threads);
}

/* ---- lifetime ---- */

static void zero__host_destroy(zero_device *dev)
{
    zero__host_device *d = zero__host_get(dev);
    zero_allocator a;
    size_t i;
    if (!d) return;
    a = d->allocator;
    for (i = 0; i < d->cap; i++)
        if (d->table[i].ptr) zero__free(&a, d->table[i].raw);
    zero__free(&a, d->table);
    pthread_mutex_destroy(&d->mu);
    d->base.impl = NULL;
    zero__free(&a, d);
}

static const zero_device_ops zero__host_ops = {
    "host",
    zero__host_destroy,
    zero__host_alloc,
    zero__host_free,
    NULL, /* reserve: nothing to gain from one arena on the host */
    zero__host_event_create,
    zero__host_event_destroy,
    zero__host_record,
    zero__host_wait,
    zero__host_sync,
    zero__host_native_queue,
    zero__host_copy,
    zero__host_upload,
    zero__host_download,
    zero__host_fill_zero,
    zero__host_cast,
    zero__host_add,
    zero__host_scale,
    zero__host_nonfinite,
    zero__host_sumsq,
    zero__host_grad_mul,
    zero__host_adam,
};

ZERODEF zero_result zero_host_device_create(const zero_host_device_desc *desc, zero_device **out)
{
    zero_host_device_desc def;
    zero__host_device *d;
    int rc;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: out is NULL");
    *out = NULL;
    if (!desc) {
        memset(&def, 0, sizeof def);
        desc = &def;
    }
    if (desc->threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: threads = %d", desc->threads);
    if ((int)desc->simd < ZERO_SIMD_AUTO || (int)desc->simd > ZERO_SIMD_AVX512)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: simd = %d", (int)desc->simd);
    if (desc->simd != ZERO_SIMD_AUTO && desc->simd > zero__simd_cpu())
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_host_device_create: simd %s unavailable (best: %s)",
                          zero_simd_name(desc->simd), zero_simd_name(zero__simd_cpu()));
    if ((desc->allocator.alloc != NULL) != (desc->allocator.free != NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_host_device_create: allocator needs both alloc and free, or neither");
    d = (zero__host_device *)zero__alloc(&desc->allocator, sizeof *d);
    if (!d) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_host_device_create: out of memory");
    memset(d, 0, sizeof *d);
    rc = pthread_mutex_init(&d->mu, NULL);
    if (rc != 0) {
        zero__free(&desc->allocator, d);
        return zero__fail(ZERO_ERROR_DEVICE, "zero_host_device_create: pthread_mutex_init failed: %s",
                          strerror(rc));
    }
    d->allocator = desc->allocator;
    d->simd = desc->simd == ZERO_SIMD_AUTO ? zero_simd_detect() : desc->simd;
    d->threads = desc->threads > 1 ? desc->threads : 1;
    d->base.ops = &zero__host_ops;
    d->base.impl = d;
    *out = &d->base;
    return ZERO_OK;
}

ZERODEF void zero_device_destroy(zero_device *dev)
{
    if (dev && dev->ops && dev->ops->destroy) dev->ops->destroy(dev);
}

ZERODEF zero_result zero_host_device_stats(zero_device *dev, size_t *bytes, size_t *allocations)
{
    zero__host_device *d = zero__host_get(dev);
    int rc;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_stats: dev is not a host device");
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_DEVICE, "zero_host_device_stats: pthread_mutex_lock failed: %s",
                          strerror(rc));
    if (bytes) memcpy(bytes, d->bytes, sizeof d->bytes);
    if (allocations) *allocations = d->count;
    pthread_mutex_unlock(&d->mu);
    return ZERO_OK;
}
