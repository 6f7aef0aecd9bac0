/* vc_device.h - the race-model device of the engine tests: a checking wrapper around the
   host device that keeps a vector clock per queue and logs every byte range an op touches,
   so an access from one queue not ordered (by events or host syncs) after a conflicting
   access from another is counted as a race, as CUDA streams would hit it. With 'defer' set,
   transfers really run late (every transfer on ZERO_QUEUE_OFFLOAD, and uploads from pinned
   memory on other queues: until the host syncs the queue, another queue waits on an event
   recorded on it, or a later op of the queue needs them), so host code that reads a
   download or rewrites an upload's source too early sees stale data. Used by
   tests/test_engine_async.c (the engine's queues) and tests/test_activations.c (the
   activation tier). The full description is at the top of tests/test_engine_async.c.

   vc_create(&dev) makes one (its state is vc_current, per thread); vc_begin(v, q) and
   vc_touch(v, q, ptr, bytes, write, what) log a caller's access on queue q. Pinned host
   memory (host_alloc) is counted in vc_pinned_live / vc_pinned_total. Include after
   zero.h. */
#ifndef VC_DEVICE_H
#define VC_DEVICE_H
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NQ 3

typedef struct vc_access {
    uintptr_t lo, hi;
    int q;
    uint64_t t;
    int write;
    const char *what;
} vc_access;

typedef struct vc_dev {
    zero_device base;
    zero_device *inner;
    uint64_t clock[NQ][NQ];
    uint64_t host[NQ];
    vc_access *log;
    size_t nlog, cap;
    int races;
    char first_race[256];
    zero_device_ops ops;
    void *ptrs[64];
    size_t sizes[64];
    int nptrs;
    /* deferred transfers, in enqueue order */
    int defer;
    struct {
        int up, q;
        void *dst;
        const void *src;
        size_t b;
        uint64_t t; /* the queue's clock at the op */
    } pend[512];
    int npend;
    /* sources of uploads that ran before the host knew they had: a host write to one of
       them before a sync covers the upload could reach the device on real hardware */
    struct {
        const void *src;
        size_t b;
        int q;
        uint64_t t, sum;
    } held[512];
    int nheld;
    /* this device's pinned host allocations (host_alloc) */
    void *pinned[64];
    size_t pinned_bytes[64];
    int npinned;
} vc_dev;

typedef struct vc_event {
    uint64_t vc[NQ];
    int q; /* the queue that recorded it */
} vc_event;

static uint64_t vc_sum(const void *p, size_t b)
{
    const unsigned char *c = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < b; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static void vc_race(vc_dev *d, const char *msg)
{
    if (d->races++ == 0) snprintf(d->first_race, sizeof d->first_race, "%s", msg);
}

/* Runs the deferred transfers of queue q (-1: of every queue), in order. */
static zero_result vc_flush(vc_dev *v, int q)
{
    int i, n = 0;
    zero_result r = ZERO_OK;
    for (i = 0; i < v->npend; i++) {
        if (q >= 0 && v->pend[i].q != q) {
            v->pend[n++] = v->pend[i]; /* keeps its place in the list */
            continue;
        }
        if (r != ZERO_OK) continue;
        if (v->pend[i].up && v->host[v->pend[i].q] < v->pend[i].t && v->nheld < 512) {
            v->held[v->nheld].src = v->pend[i].src;
            v->held[v->nheld].b = v->pend[i].b;
            v->held[v->nheld].q = v->pend[i].q;
            v->held[v->nheld].t = v->pend[i].t;
            v->held[v->nheld++].sum = vc_sum(v->pend[i].src, v->pend[i].b);
        }
        r = v->pend[i].up ? v->inner->ops->upload(v->inner, (zero_queue)v->pend[i].q, v->pend[i].dst,
                                                  v->pend[i].src, v->pend[i].b)
                          : v->inner->ops->download(v->inner, (zero_queue)v->pend[i].q, v->pend[i].dst,
                                                    v->pend[i].src, v->pend[i].b);
    }
    v->npend = n;
    return r;
}

/* Whether [p, p + b) lies in pinned memory of this device. */
static int vc_is_pinned(const vc_dev *v, const void *p, size_t b)
{
    int i;
    for (i = 0; i < v->npinned; i++)
        if ((uintptr_t)p >= (uintptr_t)v->pinned[i] &&
            (uintptr_t)p + b <= (uintptr_t)v->pinned[i] + v->pinned_bytes[i])
            return 1;
    return 0;
}

/* Queues transfer (up, q, dst, src, b) to run late when the model defers it; 0 if it must
   run now. */
static int vc_defer(vc_dev *v, int up, int q, void *dst, const void *src, size_t b)
{
    if (!v->defer || v->npend == 512) return 0;
    if (q != ZERO_QUEUE_OFFLOAD && !(up && vc_is_pinned(v, src, b))) return 0;
    v->pend[v->npend].up = up;
    v->pend[v->npend].q = q;
    v->pend[v->npend].dst = dst;
    v->pend[v->npend].src = src;
    v->pend[v->npend].t = v->clock[q][q];
    v->pend[v->npend++].b = b;
    return 1;
}

static _Thread_local vc_dev *vc_current; /* the rank's checking device (for its comm) */

/* Queue q's clock ticks for a new op (which also runs after the host's last sync). */
static void vc_tick(vc_dev *d, int q)
{
    int k;
    for (k = 0; k < NQ; k++)
        if (d->host[k] > d->clock[q][k]) d->clock[q][k] = d->host[k];
    d->clock[q][q]++;
}

/* An op that touches memory starts on queue q: it runs after the queue's earlier work,
   deferred transfers of a queue other than OFFLOAD included (OFFLOAD's own ops are
   transfers, which may overlap: their order is kept by the list). Returns the flush's
   result. */
static zero_result vc_begin(vc_dev *d, int q)
{
    zero_result r = q != ZERO_QUEUE_OFFLOAD ? vc_flush(d, q) : ZERO_OK;
    vc_tick(d, q);
    return r;
}

#define VC_BEGIN(d, q)                                                                             \
    do {                                                                                           \
        zero_result vc_r_ = vc_begin((d), (q));                                                    \
        if (vc_r_ != ZERO_OK) return vc_r_;                                                        \
    } while (0)

static void vc_touch(vc_dev *d, int q, const void *p, size_t bytes, int write, const char *what)
{
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    size_t i;
    if (!p || bytes == 0) return;
    for (i = 0; i < d->nlog; i++) {
        vc_access *a = &d->log[i];
        if (a->q == q || !(a->write || write) || a->hi <= lo || hi <= a->lo) continue;
        if (d->clock[q][a->q] < a->t) {
            if (d->races++ == 0)
                snprintf(d->first_race, sizeof d->first_race,
                         "%s %s on queue %d is not ordered after %s %s on queue %d",
                         write ? "write" : "read", what, q, a->write ? "write" : "read", a->what,
                         a->q);
        }
    }
    /* Replace older accesses of the same queue and kind that this one covers. */
    for (i = 0; i < d->nlog; i++) {
        vc_access *a = &d->log[i];
        if (a->q == q && a->write == write && a->lo >= lo && a->hi <= hi) {
            *a = d->log[--d->nlog];
            i--;
        }
    }
    if (d->nlog == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 256;
        d->log = (vc_access *)realloc(d->log, d->cap * sizeof *d->log);
    }
    d->log[d->nlog].lo = lo;
    d->log[d->nlog].hi = hi;
    d->log[d->nlog].q = q;
    d->log[d->nlog].t = d->clock[q][q];
    d->log[d->nlog].write = write;
    d->log[d->nlog].what = what;
    d->nlog++;
}

static vc_dev *VD(zero_device *d) { return (vc_dev *)d->impl; }
static zero_device *IN(zero_device *d) { return VD(d)->inner; }

static void vc_destroy(zero_device *d)
{
    vc_dev *v = VD(d);
    zero_device_destroy(v->inner);
    free(v->log);
    free(v);
}
static zero_result vc_alloc(zero_device *d, size_t b, zero_mem_category c, void **out)
{
    vc_dev *v = VD(d);
    zero_result r = IN(d)->ops->alloc(IN(d), b, c, out);
    if (r == ZERO_OK && v->nptrs < 64) {
        v->ptrs[v->nptrs] = *out;
        v->sizes[v->nptrs++] = b;
    }
    return r;
}
static zero_result vc_free(zero_device *d, void *p)
{
    vc_dev *v = VD(d);
    size_t i, bytes = 0;
    int k;
    for (k = 0; k < v->nptrs; k++)
        if (v->ptrs[k] == p) {
            bytes = v->sizes[k];
            v->ptrs[k] = v->ptrs[--v->nptrs];
            v->sizes[k] = v->sizes[v->nptrs];
            break;
        }
    /* forget the allocation's accesses: its memory may come back in a new allocation */
    for (i = 0; i < v->nlog; i++)
        if (v->log[i].lo >= (uintptr_t)p && v->log[i].lo < (uintptr_t)p + bytes) {
            v->log[i] = v->log[--v->nlog];
            i--;
        }
    return IN(d)->ops->free(IN(d), p);
}
/* Pinned host memory, as a GPU device would give it: counted, so the test sees the engine
   take it (pin_memory = 1) and give every byte back. */
static int vc_pinned_live, vc_pinned_total;
static pthread_mutex_t vc_pinned_mu = PTHREAD_MUTEX_INITIALIZER;
static zero_result vc_host_alloc(zero_device *d, size_t b, void **out)
{
    vc_dev *v = VD(d);
    if (v->npinned == 64) return ZERO_ERROR_OUT_OF_MEMORY; /* the model's table is full */
    *out = calloc(1, b);
    if (!*out) return ZERO_ERROR_OUT_OF_MEMORY;
    v->pinned[v->npinned] = *out;
    v->pinned_bytes[v->npinned++] = b;
    pthread_mutex_lock(&vc_pinned_mu);
    vc_pinned_live++;
    vc_pinned_total++;
    pthread_mutex_unlock(&vc_pinned_mu);
    return ZERO_OK;
}
static zero_result vc_host_free(zero_device *d, void *p)
{
    vc_dev *v = VD(d);
    int i;
    if (!p) return ZERO_OK;
    for (i = 0; i < v->npinned; i++)
        if (v->pinned[i] == p) {
            size_t b = v->pinned_bytes[i];
            int k;
            for (k = 0; k < v->npend; k++) { /* a transfer still using it: a use after free */
                const void *h = v->pend[k].up ? v->pend[k].src : (const void *)v->pend[k].dst;
                if ((uintptr_t)h - (uintptr_t)p < b && v->races++ == 0)
                    snprintf(v->first_race, sizeof v->first_race,
                             "host_free of pinned memory that a %s on queue %d still uses",
                             v->pend[k].up ? "upload" : "download", v->pend[k].q);
            }
            v->pinned[i] = v->pinned[--v->npinned];
            v->pinned_bytes[i] = v->pinned_bytes[v->npinned];
            break;
        }
    free(p);
    pthread_mutex_lock(&vc_pinned_mu);
    vc_pinned_live--;
    pthread_mutex_unlock(&vc_pinned_mu);
    return ZERO_OK;
}
static zero_result vc_event_create(zero_device *d, zero_event **out)
{
    (void)d;
    *out = (zero_event *)calloc(1, sizeof(vc_event));
    return *out ? ZERO_OK : ZERO_ERROR_OUT_OF_MEMORY;
}
static void vc_event_destroy(zero_device *d, zero_event *ev)
{
    (void)d;
    free(ev);
}
static zero_result vc_record(zero_device *d, zero_queue q, zero_event *ev)
{
    vc_dev *v = VD(d);
    vc_tick(v, (int)q);
    memcpy(((vc_event *)ev)->vc, v->clock[q], sizeof v->clock[q]);
    ((vc_event *)ev)->q = (int)q;
    return ZERO_OK;
}
static zero_result vc_wait(zero_device *d, zero_queue q, zero_event *ev)
{
    vc_dev *v = VD(d);
    int k;
    for (k = 0; k < NQ; k++)
        if (((vc_event *)ev)->vc[k] > v->clock[q][k]) v->clock[q][k] = ((vc_event *)ev)->vc[k];
    if (((vc_event *)ev)->q != (int)q) return vc_flush(v, ((vc_event *)ev)->q);
    return ZERO_OK;
}
static zero_result vc_sync(zero_device *d, zero_queue q)
{
    vc_dev *v = VD(d);
    int k;
    zero_result r;
    int i, n = 0;
    for (k = 0; k < NQ; k++)
        if (v->clock[q][k] > v->host[k]) v->host[k] = v->clock[q][k];
    r = vc_flush(v, (int)q);
    for (i = 0; i < v->nheld; i++) { /* uploads the host now knows are done */
        if (v->host[v->held[i].q] < v->held[i].t) {
            v->held[n++] = v->held[i];
            continue;
        }
        if (vc_sum(v->held[i].src, v->held[i].b) != v->held[i].sum) {
            char msg[160];
            snprintf(msg, sizeof msg, "the host rewrote the source of an upload on queue %d "
                     "(%zu bytes) before a sync showed it done", v->held[i].q, v->held[i].b);
            vc_race(v, msg);
        }
    }
    v->nheld = n;
    return r;
}
static void *vc_native(zero_device *d, zero_queue q)
{
    (void)d;
    (void)q;
    return NULL;
}
static zero_result vc_copy(zero_device *d, zero_queue q, void *dst, const void *src, size_t b)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, src, b, 0, "copy src");
    vc_touch(VD(d), q, dst, b, 1, "copy dst");
    return IN(d)->ops->copy(IN(d), q, dst, src, b);
}
static zero_result vc_upload(zero_device *d, zero_queue q, void *dst, const void *h, size_t b)
{
    vc_dev *v = VD(d);
    VC_BEGIN(v, q);
    vc_touch(v, q, dst, b, 1, "upload");
    vc_touch(v, q, h, b, 0, "upload host source");
    if (vc_defer(v, 1, (int)q, dst, h, b)) return ZERO_OK;
    return IN(d)->ops->upload(IN(d), q, dst, h, b);
}
static zero_result vc_download(zero_device *d, zero_queue q, void *h, const void *src, size_t b)
{
    vc_dev *v = VD(d);
    VC_BEGIN(v, q);
    vc_touch(v, q, src, b, 0, "download");
    vc_touch(v, q, h, b, 1, "download host destination");
    if (vc_defer(v, 0, (int)q, h, src, b)) return ZERO_OK;
    return IN(d)->ops->download(IN(d), q, h, src, b);
}
static zero_result vc_fill(zero_device *d, zero_queue q, void *dst, size_t b)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, dst, b, 1, "fill_zero");
    return IN(d)->ops->fill_zero(IN(d), q, dst, b);
}
static zero_result vc_cast(zero_device *d, zero_queue q, void *dst, zero_dtype dt, const void *src,
                           zero_dtype st, size_t n)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, src, n * zero_dtype_size(st), 0, "cast src");
    vc_touch(VD(d), q, dst, n * zero_dtype_size(dt), 1, "cast dst");
    return IN(d)->ops->cast(IN(d), q, dst, dt, src, st, n);
}
static zero_result vc_add(zero_device *d, zero_queue q, void *dst, const void *src, zero_dtype dt,
                          size_t n)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, src, n * zero_dtype_size(dt), 0, "add src");
    vc_touch(VD(d), q, dst, n * zero_dtype_size(dt), 1, "add dst");
    return IN(d)->ops->add(IN(d), q, dst, src, dt, n);
}
static zero_result vc_scale(zero_device *d, zero_queue q, void *x, zero_dtype dt, size_t n, float s)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, x, n * zero_dtype_size(dt), 1, "scale");
    return IN(d)->ops->scale(IN(d), q, x, dt, n, s);
}
static zero_result vc_nonfinite(zero_device *d, zero_queue q, const void *x, zero_dtype dt,
                                size_t n, float *flag)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, x, n * zero_dtype_size(dt), 0, "nonfinite");
    vc_touch(VD(d), q, flag, 4, 1, "nonfinite flag");
    return IN(d)->ops->nonfinite(IN(d), q, x, dt, n, flag);
}
static zero_result vc_sumsq(zero_device *d, zero_queue q, const void *x, zero_dtype dt, size_t n,
                            double *acc)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, x, n * zero_dtype_size(dt), 0, "sumsq");
    vc_touch(VD(d), q, acc, 8, 1, "sumsq acc");
    return IN(d)->ops->sumsq(IN(d), q, x, dt, n, acc);
}
static zero_result vc_grad_mul(zero_device *d, zero_queue q, const double *ss, const float *nf,
                               float unscale, float clip, float *out)
{
    VC_BEGIN(VD(d), q);
    vc_touch(VD(d), q, ss, 8, 0, "grad_mul sumsq");
    vc_touch(VD(d), q, nf, 4, 0, "grad_mul flag");
    vc_touch(VD(d), q, out, 8, 1, "grad_mul out");
    return IN(d)->ops->grad_mul(IN(d), q, ss, nf, unscale, clip, out);
}
static zero_result vc_adam(zero_device *d, zero_queue q, const zero_adam_range *r,
                           const zero_adam_coefs *c, const float *mul, const float *skip)
{
    vc_dev *v = VD(d);
    VC_BEGIN(v, q);
    vc_touch(v, q, r->grad, r->numel * zero_dtype_size(r->grad_dtype), 0, "adam grad");
    vc_touch(v, q, mul, 4, 0, "adam grad_mul");
    vc_touch(v, q, skip, 4, 0, "adam skip");
    vc_touch(v, q, r->master, r->numel * (r->state_dtype == ZERO_BF16 ? 2 : 4), 1, "adam master");
    vc_touch(v, q, r->m, r->numel * (r->state_dtype == ZERO_BF16 ? 2 : 4), 1, "adam m");
    vc_touch(v, q, r->v, r->numel * (r->state_dtype == ZERO_BF16 ? 2 : 4), 1, "adam v");
    if (r->param) vc_touch(v, q, r->param, r->numel * zero_dtype_size(r->param_dtype), 1, "adam param");
    return IN(d)->ops->adam(IN(d), q, r, c, mul, skip);
}

static zero_result vc_create(zero_device **out)
{
    vc_dev *v = (vc_dev *)calloc(1, sizeof *v);
    zero_result r;
    if (!v) return ZERO_ERROR_OUT_OF_MEMORY;
    r = zero_host_device_create(NULL, &v->inner);
    if (r) {
        free(v);
        return r;
    }
#define vc_ops v->ops
    vc_ops = *v->inner->ops;
    vc_ops.name = "vc";
    vc_ops.destroy = vc_destroy;
    vc_ops.alloc = vc_alloc;
    vc_ops.free = vc_free;
    vc_ops.event_create = vc_event_create;
    vc_ops.event_destroy = vc_event_destroy;
    vc_ops.record = vc_record;
    vc_ops.wait = vc_wait;
    vc_ops.sync = vc_sync;
    vc_ops.native_queue = vc_native;
    vc_ops.copy = vc_copy;
    vc_ops.upload = vc_upload;
    vc_ops.download = vc_download;
    vc_ops.fill_zero = vc_fill;
    vc_ops.cast = vc_cast;
    vc_ops.add = vc_add;
    vc_ops.scale = vc_scale;
    vc_ops.nonfinite = vc_nonfinite;
    vc_ops.sumsq = vc_sumsq;
    vc_ops.grad_mul = vc_grad_mul;
    vc_ops.adam = vc_adam;
    vc_ops.host_alloc = vc_host_alloc;
    vc_ops.host_free = vc_host_free;
    v->base.ops = &vc_ops;
#undef vc_ops
    v->base.impl = v;
    vc_current = v;
    *out = &v->base;
    return ZERO_OK;
}

#endif
