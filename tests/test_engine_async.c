/* The engine on an asynchronous device: a race detector for queue ordering.

   The host device runs every op at once, so it cannot show a missing event. This test wraps
   it in a checking device (and the local comm in a checking comm) that keeps, per queue, a
   vector clock: each op ticks its queue; record() stamps an event with the queue's clock;
   wait() merges the event's clock into the waiting queue; sync() merges the queue's clock
   into the host, whose clock every later op inherits (work enqueued after a host sync runs
   after it). Every device byte range an op, a collective (on ZERO_QUEUE_COMM) or the user
   (reads of gathered params and writes of gradients, on ZERO_QUEUE_COMPUTE) touches is
   logged; two accesses from different queues, one a write, must be ordered by the clocks,
   as CUDA streams would require. Any unordered pair is a race the CUDA device would hit.

   Offload: uploads and downloads also log their host range (staging tiles, offloaded
   shards), and with 'defer' set the transfers on ZERO_QUEUE_OFFLOAD really run late: they
   wait in a list until the host syncs that queue or another queue waits on an event
   recorded on it, as a DMA engine would, so host code that reads a downloaded tile (or
   rewrites a buffer being uploaded) without the sync sees stale data and the run's state
   differs from the plain run's. */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

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
    /* deferred OFFLOAD transfers */
    int defer;
    struct {
        int up;
        void *dst;
        const void *src;
        size_t b;
    } pend[512];
    int npend;
} vc_dev;

typedef struct vc_event {
    uint64_t vc[NQ];
    int q; /* the queue that recorded it */
} vc_event;

/* Runs the deferred OFFLOAD transfers, in order. */
static zero_result vc_flush(vc_dev *v)
{
    int i;
    zero_result r = ZERO_OK;
    for (i = 0; i < v->npend && r == ZERO_OK; i++)
        r = v->pend[i].up ? v->inner->ops->upload(v->inner, ZERO_QUEUE_OFFLOAD, v->pend[i].dst, v->pend[i].src,
                                                  v->pend[i].b)
                          : v->inner->ops->download(v->inner, ZERO_QUEUE_OFFLOAD, v->pend[i].dst,
                                                    v->pend[i].src, v->pend[i].b);
    v->npend = 0;
    return r;
}

static _Thread_local vc_dev *vc_current; /* the rank's checking device (for its comm) */

static void vc_begin(vc_dev *d, int q)
{
    int k;
    for (k = 0; k < NQ; k++)
        if (d->host[k] > d->clock[q][k]) d->clock[q][k] = d->host[k];
    d->clock[q][q]++;
}

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
    (void)d;
    *out = calloc(1, b);
    if (!*out) return ZERO_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&vc_pinned_mu);
    vc_pinned_live++;
    vc_pinned_total++;
    pthread_mutex_unlock(&vc_pinned_mu);
    return ZERO_OK;
}
static zero_result vc_host_free(zero_device *d, void *p)
{
    (void)d;
    if (!p) return ZERO_OK;
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
    vc_begin(v, (int)q);
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
    if (((vc_event *)ev)->q == ZERO_QUEUE_OFFLOAD && q != ZERO_QUEUE_OFFLOAD) return vc_flush(v);
    return ZERO_OK;
}
static zero_result vc_sync(zero_device *d, zero_queue q)
{
    vc_dev *v = VD(d);
    int k;
    for (k = 0; k < NQ; k++)
        if (v->clock[q][k] > v->host[k]) v->host[k] = v->clock[q][k];
    if (q == ZERO_QUEUE_OFFLOAD) return vc_flush(v);
    return ZERO_OK;
}
static void *vc_native(zero_device *d, zero_queue q)
{
    (void)d;
    (void)q;
    return NULL;
}
static zero_result vc_copy(zero_device *d, zero_queue q, void *dst, const void *src, size_t b)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, src, b, 0, "copy src");
    vc_touch(VD(d), q, dst, b, 1, "copy dst");
    return IN(d)->ops->copy(IN(d), q, dst, src, b);
}
static zero_result vc_upload(zero_device *d, zero_queue q, void *dst, const void *h, size_t b)
{
    vc_dev *v = VD(d);
    vc_begin(v, q);
    vc_touch(v, q, dst, b, 1, "upload");
    vc_touch(v, q, h, b, 0, "upload host source");
    if (v->defer && q == ZERO_QUEUE_OFFLOAD && v->npend < 512) {
        v->pend[v->npend].up = 1;
        v->pend[v->npend].dst = dst;
        v->pend[v->npend].src = h;
        v->pend[v->npend++].b = b;
        return ZERO_OK;
    }
    return IN(d)->ops->upload(IN(d), q, dst, h, b);
}
static zero_result vc_download(zero_device *d, zero_queue q, void *h, const void *src, size_t b)
{
    vc_dev *v = VD(d);
    vc_begin(v, q);
    vc_touch(v, q, src, b, 0, "download");
    vc_touch(v, q, h, b, 1, "download host destination");
    if (v->defer && q == ZERO_QUEUE_OFFLOAD && v->npend < 512) {
        v->pend[v->npend].up = 0;
        v->pend[v->npend].dst = h;
        v->pend[v->npend].src = src;
        v->pend[v->npend++].b = b;
        return ZERO_OK;
    }
    return IN(d)->ops->download(IN(d), q, h, src, b);
}
static zero_result vc_fill(zero_device *d, zero_queue q, void *dst, size_t b)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, dst, b, 1, "fill_zero");
    return IN(d)->ops->fill_zero(IN(d), q, dst, b);
}
static zero_result vc_cast(zero_device *d, zero_queue q, void *dst, zero_dtype dt, const void *src,
                           zero_dtype st, size_t n)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, src, n * zero_dtype_size(st), 0, "cast src");
    vc_touch(VD(d), q, dst, n * zero_dtype_size(dt), 1, "cast dst");
    return IN(d)->ops->cast(IN(d), q, dst, dt, src, st, n);
}
static zero_result vc_add(zero_device *d, zero_queue q, void *dst, const void *src, zero_dtype dt,
                          size_t n)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, src, n * zero_dtype_size(dt), 0, "add src");
    vc_touch(VD(d), q, dst, n * zero_dtype_size(dt), 1, "add dst");
    return IN(d)->ops->add(IN(d), q, dst, src, dt, n);
}
static zero_result vc_scale(zero_device *d, zero_queue q, void *x, zero_dtype dt, size_t n, float s)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, x, n * zero_dtype_size(dt), 1, "scale");
    return IN(d)->ops->scale(IN(d), q, x, dt, n, s);
}
static zero_result vc_nonfinite(zero_device *d, zero_queue q, const void *x, zero_dtype dt,
                                size_t n, float *flag)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, x, n * zero_dtype_size(dt), 0, "nonfinite");
    vc_touch(VD(d), q, flag, 4, 1, "nonfinite flag");
    return IN(d)->ops->nonfinite(IN(d), q, x, dt, n, flag);
}
static zero_result vc_sumsq(zero_device *d, zero_queue q, const void *x, zero_dtype dt, size_t n,
                            double *acc)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, x, n * zero_dtype_size(dt), 0, "sumsq");
    vc_touch(VD(d), q, acc, 8, 1, "sumsq acc");
    return IN(d)->ops->sumsq(IN(d), q, x, dt, n, acc);
}
static zero_result vc_grad_mul(zero_device *d, zero_queue q, const double *ss, const float *nf,
                               float unscale, float clip, float *out)
{
    vc_begin(VD(d), q);
    vc_touch(VD(d), q, ss, 8, 0, "grad_mul sumsq");
    vc_touch(VD(d), q, nf, 4, 0, "grad_mul flag");
    vc_touch(VD(d), q, out, 8, 1, "grad_mul out");
    return IN(d)->ops->grad_mul(IN(d), q, ss, nf, unscale, clip, out);
}
static zero_result vc_adam(zero_device *d, zero_queue q, const zero_adam_range *r,
                           const zero_adam_coefs *c, const float *mul, const float *skip)
{
    vc_dev *v = VD(d);
    vc_begin(v, q);
    vc_touch(v, q, r->grad, r->numel * zero_dtype_size(r->grad_dtype), 0, "adam grad");
    vc_touch(v, q, mul, 4, 0, "adam grad_mul");
    vc_touch(v, q, skip, 4, 0, "adam skip");
    vc_touch(v, q, r->master, r->numel * 4, 1, "adam master");
    vc_touch(v, q, r->m, r->numel * 4, 1, "adam m");
    vc_touch(v, q, r->v, r->numel * 4, 1, "adam v");
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

/* ---- the checking comm: collectives on ZERO_QUEUE_COMM ------------------------------------ */

static zero_comm *CI(zero_comm *c) { return ((ec_wrap *)c->impl)->inner; }
static size_t world_of(zero_comm *c) { return (size_t)c->world; }

static zero_result vcc_ag(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, void *q)
{
    size_t b = n * zero_dtype_size(d);
    vc_begin(vc_current, ZERO_QUEUE_COMM);
    vc_touch(vc_current, ZERO_QUEUE_COMM, s, b, 0, "all_gather send");
    vc_touch(vc_current, ZERO_QUEUE_COMM, r, b * world_of(c), 1, "all_gather recv");
    return CI(c)->ops->all_gather(CI(c), s, r, n, d, q);
}
static zero_result vcc_rs(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, zero_op op,
                          void *q)
{
    size_t b = n * zero_dtype_size(d);
    vc_begin(vc_current, ZERO_QUEUE_COMM);
    vc_touch(vc_current, ZERO_QUEUE_COMM, s, b * world_of(c), 0, "reduce_scatter send");
    vc_touch(vc_current, ZERO_QUEUE_COMM, r, b, 1, "reduce_scatter recv");
    return CI(c)->ops->reduce_scatter(CI(c), s, r, n, d, op, q);
}
static zero_result vcc_ar(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, zero_op op,
                          void *q)
{
    size_t b = n * zero_dtype_size(d);
    vc_begin(vc_current, ZERO_QUEUE_COMM);
    vc_touch(vc_current, ZERO_QUEUE_COMM, s, b, 0, "all_reduce send");
    vc_touch(vc_current, ZERO_QUEUE_COMM, r, b, 1, "all_reduce recv");
    return CI(c)->ops->all_reduce(CI(c), s, r, n, d, op, q);
}
static zero_result vcc_bc(zero_comm *c, void *b, size_t n, zero_dtype d, int root, void *q)
{
    vc_begin(vc_current, ZERO_QUEUE_COMM);
    vc_touch(vc_current, ZERO_QUEUE_COMM, b, n * zero_dtype_size(d), 1, "broadcast");
    return CI(c)->ops->broadcast(CI(c), b, n, d, root, q);
}
static zero_result vcc_barrier(zero_comm *c) { return CI(c)->ops->barrier(CI(c)); }
static zero_result vcc_group(zero_comm *c)
{
    (void)c;
    return ZERO_OK;
}
static void vcc_destroy(zero_comm *c) { (void)c; }
static zero_comm_ops vcc_ops = {"vc", vcc_destroy, vcc_ag, vcc_rs, vcc_ar, vcc_bc, vcc_barrier,
                                vcc_group, vcc_group};

/* ---- the run: the ec harness' program with the user's accesses logged ------------------- */

typedef struct arun {
    int stage, accum, steps, world;
    int offload; /* 0 none, 1 optimizer on the CPU, 2 params too (stage 3); deferred transfers */
    uint64_t hash[EC_MAX_RANKS]; /* FNV-1a of every tensor's master and params after the run */
    zero_dtype dt, cdt;
    size_t bucket, persist, max_live;
    int prefetch;
    int races[EC_MAX_RANKS];
    char first[EC_MAX_RANKS][256];
} arun;

static zero_result async_rank(int rank, zero_comm *comm, void *user)
{
    arun *A = (arun *)user;
    ec_wrap wrap;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    ec_cfg c;
    int ids[EC_MAX_T], t, s, k, g, G;
    float vals[512];
    const zero_plan *plan;
    ec_cfg_init(&c, A->stage, A->world, A->dt, A->accum, A->steps);
    wrap.base = *comm;
    wrap.base.ops = &vcc_ops;
    wrap.base.impl = &wrap;
    wrap.inner = comm;
    r = vc_create(&dev);
    if (r) return r;
    memset(&d, 0, sizeof d);
    d.stage = A->stage;
    d.param_dtype = A->dt;
    d.grad_comm_dtype = A->cdt;
    d.accum_steps = A->accum;
    d.reduce_bucket_numel = A->bucket;
    d.persist_numel = A->persist;
    d.max_live_numel = A->max_live;
    d.prefetch_depth = A->prefetch;
    d.clip_norm = 0.5f;
    d.device = dev;
    d.comm = &wrap.base;
    if (A->offload) {
        d.offload_optimizer = ZERO_OFFLOAD_CPU;
        d.offload_param = A->offload == 2 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
        d.sub_group_size = 29; /* many tiles: the pipeline's staging tiles are reused */
        d.pin_memory = 1;      /* host buffers from the device's host_alloc */
        vc_current->defer = 1;
    }
    r = zero_engine_create(&d, &e);
    for (t = 0; t < c.ntensors && !r; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        r = zero_engine_add_tensor(e, name, c.sizes[t], c.groups[t], c.flags[t], &ids[t]);
    }
    if (!r) r = zero_engine_commit(e);
    if (r) goto out;
    plan = zero_engine_plan(e);
    G = zero_plan_num_groups(plan);
    for (t = 0; t < c.ntensors && !r; t++) {
        size_t i;
        for (i = 0; i < c.sizes[t]; i++) vals[i] = ec_init_value(t, i);
        r = zero_engine_set_tensor(e, ids[t], vals);
    }
    for (s = 0; s < A->steps && !r; s++) {
        float scale = zero_engine_loss_scale(e);
        for (k = 0; k < A->accum && !r; k++) {
            void *pp, *gp;
            for (g = 0; g < G && !r; g++) {
                zero_group_info gi;
                zero_plan_group(plan, g, &gi);
                r = zero_engine_gather(e, g, &pp);
                if (r) break;
                /* the user's forward reads the group on the compute queue */
                vc_begin(vc_current, ZERO_QUEUE_COMPUTE);
                vc_touch(vc_current, ZERO_QUEUE_COMPUTE, pp, gi.numel * zero_dtype_size(A->dt), 0,
                         "user forward");
                r = zero_engine_release(e, g);
            }
            for (g = G - 1; g >= 0 && !r; g--) {
                zero_group_info gi;
                zero_plan_group(plan, g, &gi);
                if ((r = zero_engine_gather(e, g, &pp))) break;
                if ((r = zero_engine_grads(e, g, &gp))) break;
                vc_begin(vc_current, ZERO_QUEUE_COMPUTE);
                vc_touch(vc_current, ZERO_QUEUE_COMPUTE, pp, gi.numel * zero_dtype_size(A->dt), 0,
                         "user backward params");
                vc_touch(vc_current, ZERO_QUEUE_COMPUTE, gp, gi.numel * zero_dtype_size(A->dt), 1,
                         "user gradients");
                for (t = 0; t < c.ntensors; t++) {
                    zero_tensor_info ti;
                    size_t i;
                    if (c.groups[t] != g) continue;
                    zero_plan_tensor(plan, ids[t], &ti);
                    for (i = 0; i < ti.numel; i++) {
                        float p = ec_to_f32(pp, A->dt, ti.offset + i);
                        ec_from_f32(gp, A->dt, ti.offset + i,
                                    (float)(ec_synth_grad(p, rank, k, s, i, t) * scale));
                    }
                }
                if ((r = zero_engine_release(e, g))) break;
                r = zero_engine_grads_ready(e, g);
            }
        }
        if (!r) r = zero_engine_step(e, NULL);
    }
    A->hash[rank] = 1469598103934665603ull;
    for (t = 0; t < c.ntensors && !r; t++) {
        unsigned char buf[512 * 4];
        zero_range rg;
        int kind;
        size_t i;
        for (kind = 0; kind < 2 && !r; kind++) {
            memset(buf, 0, sizeof buf);
            r = zero_engine_read_tensor(e, ids[t], kind ? ZERO_STATE_MASTER : ZERO_STATE_PARAM, buf, &rg);
            for (i = 0; i < sizeof buf; i++) A->hash[rank] = (A->hash[rank] ^ buf[i]) * 1099511628211ull;
        }
    }
out:
    A->races[rank] = vc_current->races;
    memcpy(A->first[rank], vc_current->first_race, sizeof A->first[rank]);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* The checker itself sees a race, and an event removes it. */
ZT_TEST(checker_detects_unordered_queues)
{
    zero_device *dev;
    vc_dev *v;
    void *buf;
    zero_event *ev;
    ZT_CHECK(vc_create(&dev) == ZERO_OK);
    v = vc_current;
    ZT_CHECK(dev->ops->alloc(dev, 256, ZERO_MEM_SCRATCH, &buf) == ZERO_OK);
    dev->ops->event_create(dev, &ev);
    dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, buf, 256);
    vc_begin(v, ZERO_QUEUE_COMM);
    vc_touch(v, ZERO_QUEUE_COMM, buf, 64, 0, "collective");
    ZT_CHECK(v->races == 1);
    dev->ops->record(dev, ZERO_QUEUE_COMM, ev); /* compute waits for the collective's read */
    dev->ops->wait(dev, ZERO_QUEUE_COMPUTE, ev);
    dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, buf, 256);
    ZT_CHECK(v->races == 1);
    dev->ops->record(dev, ZERO_QUEUE_COMPUTE, ev);
    dev->ops->wait(dev, ZERO_QUEUE_COMM, ev);
    vc_begin(v, ZERO_QUEUE_COMM);
    vc_touch(v, ZERO_QUEUE_COMM, buf, 64, 1, "collective");
    ZT_CHECK(v->races == 1);
    /* and the compute queue reusing it without waiting is a race again */
    dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, buf, 256);
    ZT_CHECK(v->races == 2);
    dev->ops->event_destroy(dev, ev);
    dev->ops->free(dev, buf);
    zero_device_destroy(dev);
}

static void check_async(arun *A, const char *label)
{
    zero_result r;
    int rk;
    for (rk = 0; rk < EC_MAX_RANKS; rk++) A->races[rk] = 0;
    r = zero_local_run(A->world, async_rank, A);
    ZT_CHECKF(r == ZERO_OK, "%s: %s", label, zero_last_error());
    for (rk = 0; rk < A->world; rk++)
        ZT_CHECKF(A->races[rk] == 0, "%s rank %d: %d races, first: %s", label, rk, A->races[rk],
                  A->first[rk]);
}

/* The offloaded step on a device whose OFFLOAD transfers run late: no race, and the same
   params and master weights as the plain run (a missing host sync would read stale tiles). */
ZT_TEST(offload_orders_its_queues)
{
    int st, v, o;
    for (st = 1; st <= 3; st++)
        for (v = 0; v < 2; v++) {
            uint64_t plain[EC_MAX_RANKS];
            for (o = 0; o <= (st == 3 ? 2 : 1); o++) {
                arun A;
                char label[64];
                int rk;
                memset(&A, 0, sizeof A);
                A.stage = st;
                A.world = 3;
                A.steps = 3;
                A.dt = v ? ZERO_BF16 : ZERO_F16;
                A.accum = v ? 2 : 1;
                if (v) A.cdt = ZERO_F32;
                if (v && st == 3) A.persist = 20;
                A.offload = o;
                snprintf(label, sizeof label, "stage %d variant %d offload %d", st, v, o);
                check_async(&A, label);
                ZT_CHECKF(vc_pinned_live == 0, "%s: %d pinned buffers not given back", label, vc_pinned_live);
                ZT_CHECKF((vc_pinned_total > 0) == (o > 0), "%s: pinned buffers taken: %d", label, vc_pinned_total);
                vc_pinned_total = 0;
                for (rk = 0; rk < A.world; rk++) {
                    if (o == 0) plain[rk] = A.hash[rk];
                    else ZT_CHECKF(A.hash[rk] == plain[rk], "%s rank %d: state differs from the plain run",
                                   label, rk);
                }
            }
        }
}

ZT_TEST(engine_orders_its_queues)
{
    int st, v;
    for (st = 0; st <= 3; st++)
        for (v = 0; v < 7; v++) {
            arun A;
            char label[64];
            if (v >= 5 && st < 2) continue;
            memset(&A, 0, sizeof A);
            A.stage = st;
            A.world = v == 4 ? 1 : 3;
            A.steps = 3;
            A.dt = v == 2 ? ZERO_BF16 : ZERO_F16;
            A.accum = v == 1 || v == 3 ? 3 : 1;
            if (v == 2) A.cdt = ZERO_F32;
            if (v == 3) A.bucket = 400;
            if (v == 2 || v == 3) A.persist = 20;
            if (v == 3) A.prefetch = 2;
            /* a tight arena (twice the largest group, 288 at N = 3): gradient buffers reuse
               extents whose reduction or unused prefetch is still on COMM (the fences) */
            if (v >= 5) A.max_live = 2 * 288;
            if (v == 6) A.cdt = ZERO_F32, A.accum = 2, A.bucket = 300;
            snprintf(label, sizeof label, "stage %d variant %d", st, v);
            check_async(&A, label);
        }
}

/* set_tensor right after a prefetch (stage 3): the upload of the shard must wait for the
   all-gather still reading it on COMM. */
static zero_result set_after_prefetch_rank(int rank, zero_comm *comm, void *user)
{
    arun *A = (arun *)user;
    ec_wrap wrap;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    float vals[64];
    int t0, i;
    wrap.base = *comm;
    wrap.base.ops = &vcc_ops;
    wrap.base.impl = &wrap;
    wrap.inner = comm;
    if ((r = vc_create(&dev)) != ZERO_OK) return r;
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = dev;
    d.comm = &wrap.base;
    for (i = 0; i < 64; i++) vals[i] = (float)i;
    r = zero_engine_create(&d, &e);
    if (!r) r = zero_engine_add_tensor(e, "a", 64, 0, 0, &t0);
    if (!r) r = zero_engine_add_tensor(e, "b", 64, 1, 0, NULL);
    if (!r) r = zero_engine_commit(e);
    if (!r) r = zero_engine_prefetch(e, 0);
    if (!r) r = zero_engine_set_tensor(e, t0, vals);
    A->races[rank] = vc_current->races;
    memcpy(A->first[rank], vc_current->first_race, sizeof A->first[rank]);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(set_tensor_waits_for_prefetch)
{
    arun A;
    zero_result r;
    int rk;
    memset(&A, 0, sizeof A);
    r = zero_local_run(2, set_after_prefetch_rank, &A);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
    for (rk = 0; rk < 2; rk++)
        ZT_CHECKF(A.races[rk] == 0, "rank %d: %d races, first: %s", rk, A.races[rk], A.first[rk]);
}

int main(void)
{
    ZT_RUN(checker_detects_unordered_queues);
    ZT_RUN(engine_orders_its_queues);
    ZT_RUN(offload_orders_its_queues);
    ZT_RUN(set_tensor_waits_for_prefetch);
    return zt_summary();
}
