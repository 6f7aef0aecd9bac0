/* Engine implementation (section of zero.h): ZeRO stages 0-3 over zero_device/zero_comm.

   Layout. The plan packs every group into a flat buffer of numel elements (padded to a
   multiple of world * align); shard r is [r * shard, (r + 1) * shard). The engine keeps
   one device allocation per kind of buffer; group g lives at a fixed offset in it:
     whole layout  (params at stages 0-2, user gradients at stages 0-1, stage-0 master,
                    m, v and accumulator): group g at off_whole[g] = sum of earlier numel
     shard layout  (master, m, v and the gradient accumulator at stages 1-3, stage-3
                    params of partitioned groups): group g at off_shard[g] = sum of earlier
                    shard numel
     stage-3 params: partitioned groups keep their shard, persistent groups their whole
                    buffer, at off_param[g].

   Gradient rule (the same at every stage, so an element's final gradient has the same bits
   everywhere): per micro-step k the group's gradients (param dtype) are cast to the comm
   dtype if it differs, reduced across ranks (SUM, rank order, one rounding: all-reduce at
   stage 0, reduce-scatter into the owner's shard at 1-3), and accumulated: k == 0 stores the
   reduced values, k > 0 adds them (device add: one rounding to the comm dtype).

   Queues. Work the user enqueues on COMPUTE is handed to COMM by recording ev_c2m on
   COMPUTE and making COMM wait on it; COMM work is handed back by ev_m2c. Buffers reused by
   COMPUTE after COMM read them (bucket slots, stage 0-1 gradient slices) wait on an event
   recorded on COMM after the reduction that read them. */

#define ZERO__ENG_MAX_ALLOCS 16
#define ZERO__ENG_SCRATCH_BYTES 64
/* scratch layout (bytes): sumsq f64 at 0, flag f32 at 8, grad_mul out[2] f32 at 12..19,
   hash check f64[4] at 32..63. */

enum { ZERO__ENG_CREATED = 0, ZERO__ENG_COMMITTED = 1, ZERO__ENG_BROKEN = 2 };
enum { ZERO__GRADS_NONE = 0, ZERO__GRADS_HANDED = 1, ZERO__GRADS_READY = 2 };

typedef struct zero__eng_group {
    size_t numel, shard_numel, used_numel;
    int persistent; /* stage 3 only */
    size_t off_whole, off_shard, off_param;
    int refs;            /* outstanding user gathers                          */
    int slot;            /* stage 3 gather slot, -1 when not gathered         */
    int grads_state;     /* ZERO__GRADS_*                                     */
    int bucket;          /* stages 2-3: bucket slot of this micro-step        */
    zero_event *ev_gathered; /* stage 3: recorded on COMM after the all-gather */
    zero_event *ev_reduced;  /* stages 0-1: recorded on COMM after the reduction */
    int reduced_valid;
} zero__eng_group;

typedef struct zero__eng_slot {
    int group;      /* -1 free */
    zero_event *ev; /* buckets: recorded on COMM after the reduction that read the slot */
    int ev_valid;
} zero__eng_slot;

typedef struct zero__eng_allocation {
    void *ptr;
    size_t bytes;
    zero_mem_category cat;
} zero__eng_allocation;

struct zero_engine {
    zero_engine_desc d; /* resolved */
    zero_adam_desc adam;
    zero_scaler scaler;
    zero_device *dev;
    zero_comm *comm;
    int rank, world, stage, accum, depth;
    int state;
    zero_dtype gd, cd; /* param/gradient dtype, comm/accumulation dtype */
    size_t p, c;       /* their sizes */
    zero_plan *plan;
    unsigned *tflags;
    int ntensors, cap_tensors;
    int G;
    zero__eng_group *groups;
    size_t P, S, M, Mnp;
    int alias; /* the accumulator is the user gradient buffer (stages 0-1, accum 1, cd == gd) */
    /* device buffers */
    unsigned char *param, *grad_user, *grad_acc, *bucket, *tc, *ts, *gather, *scratch;
    float *master, *m1, *m2;
    zero__eng_allocation allocs[ZERO__ENG_MAX_ALLOCS];
    int nallocs;
    size_t mem[ZERO_MEM_COUNT], mem_peak[ZERO_MEM_COUNT], mem_total, mem_peak_total;
    /* stage 2-3 gradient buckets, stage 3 gather slots */
    zero__eng_slot *bslots;
    int nbslots, bcursor;
    zero__eng_slot *gslots;
    int ngslots;
    size_t gslot_numel, bslot_numel;
    zero_gather_stats gstats;
    int last_gathered, grads_seen; /* prefetch direction within a micro-step */
    /* events */
    zero_event *ev_c2m, *ev_m2c;
    /* micro-steps */
    int micro;          /* complete micro-steps in this step                 */
    int ready_in_micro; /* groups ready in the current micro-step            */
    int *pending;
    int npending;
    size_t pending_numel;
    /* step */
    int64_t step;
    zero_traffic traffic_total, traffic_cur, traffic_last;
};

/* ---- small helpers ---------------------------------------------------------------------- */

ZERODEF const char *zero_coll_name(zero_coll kind)
{
    switch (kind) {
    case ZERO_COLL_ALL_GATHER: return "all_gather";
    case ZERO_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO_COLL_ALL_REDUCE: return "all_reduce";
    case ZERO_COLL_BROADCAST: return "broadcast";
    case ZERO_COLL_CONTROL: return "control";
    case ZERO_COLL_COUNT: break;
    }
    return "?";
}

ZERODEF double zero_traffic_payload_numel(const zero_traffic *t)
{
    double s = 0.0;
    int k;
    if (!t) return 0.0;
    for (k = 0; k < ZERO_COLL_CONTROL; k++) s += t->numel[k];
    return s;
}

/* Copies the calling thread's last error text (bounded), to quote it in a new one. */
static void zero__eng_copy_error(char *dst, size_t n)
{
    const char *src = zero_last_error();
    size_t i;
    for (i = 0; i + 1 < n && src[i]; i++) dst[i] = src[i];
    dst[i] = '\0';
}

/* Keeps the detail of a backend failure, prefixed with what the engine was doing, and
   marks the engine broken (a collective or device op failed half way). */
static zero_result zero__eng_break(zero_engine *e, zero_result r, const char *what)
{
    char prev[400];
    zero__eng_copy_error(prev, sizeof prev);
    if (e && e->state == ZERO__ENG_COMMITTED) e->state = ZERO__ENG_BROKEN;
    return zero__fail(r, "zero_engine: %s failed (engine broken): %.380s", what, prev);
}

#define ZERO__ENG_TRY(e, call, what)                                                          \
    do {                                                                                     \
        zero_result zr_ = (call);                                                            \
        if (zr_ != ZERO_OK) return zero__eng_break((e), zr_, (what));                        \
    } while (0)

static zero_result zero__eng_usable(const zero_engine *e, const char *fn)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: engine is NULL", fn);
    if (e->state == ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: engine not committed", fn);
    if (e->state == ZERO__ENG_BROKEN)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: engine broken by an earlier device or comm failure; destroy it",
                          fn);
    return ZERO_OK;
}

static zero_result zero__eng_group_arg(const zero_engine *e, int group, const char *fn)
{
    if (group < 0 || group >= e->G)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "%s: group %d unknown (groups 0..%d)", fn, group,
                          e->G - 1);
    return ZERO_OK;
}

static zero_result zero__eng_record(zero_engine *e, zero_queue q, zero_event *ev)
{
    if (!ev || !e->dev->ops->record) return ZERO_OK;
    return e->dev->ops->record(e->dev, q, ev);
}

static zero_result zero__eng_wait(zero_engine *e, zero_queue q, zero_event *ev)
{
    if (!ev || !e->dev->ops->wait) return ZERO_OK;
    return e->dev->ops->wait(e->dev, q, ev);
}

/* Orders 'to' after everything enqueued on 'from' so far. */
static zero_result zero__eng_handoff(zero_engine *e, zero_queue from, zero_queue to)
{
    zero_event *ev = from == ZERO_QUEUE_COMPUTE ? e->ev_c2m : e->ev_m2c;
    zero_result r = zero__eng_record(e, from, ev);
    if (r == ZERO_OK) r = zero__eng_wait(e, to, ev);
    return r;
}

static void *zero__eng_comm_queue(zero_engine *e)
{
    return e->dev->ops->native_queue ? e->dev->ops->native_queue(e->dev, ZERO_QUEUE_COMM) : NULL;
}

/* ---- counted collectives ------------------------------------------------------------------ */

static void zero__eng_count(zero_engine *e, zero_coll kind, double numel, zero_dtype dtype)
{
    double bytes = numel * (double)zero_dtype_size(dtype);
    e->traffic_cur.calls[kind]++;
    e->traffic_cur.numel[kind] += numel;
    e->traffic_cur.bytes[kind] += bytes;
    e->traffic_total.calls[kind]++;
    e->traffic_total.numel[kind] += numel;
    e->traffic_total.bytes[kind] += bytes;
}

static zero_result zero__eng_all_gather(zero_engine *e, const void *send, void *recv,
                                        size_t send_numel, zero_dtype dtype)
{
    zero_result r = e->comm->ops->all_gather(e->comm, send, recv, send_numel, dtype,
                                             zero__eng_comm_queue(e));
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_ALL_GATHER, (double)send_numel * (double)(e->world - 1),
                        dtype);
    return r;
}

static zero_result zero__eng_reduce_scatter(zero_engine *e, const void *send, void *recv,
                                            size_t recv_numel, zero_dtype dtype)
{
    zero_result r = e->comm->ops->reduce_scatter(e->comm, send, recv, recv_numel, dtype,
                                                 ZERO_OP_SUM, zero__eng_comm_queue(e));
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_REDUCE_SCATTER,
                        (double)recv_numel * (double)(e->world - 1), dtype);
    return r;
}

static zero_result zero__eng_all_reduce(zero_engine *e, const void *send, void *recv,
                                        size_t numel, zero_dtype dtype, zero_op op, int control)
{
    zero_result r = e->comm->ops->all_reduce(e->comm, send, recv, numel, dtype, op,
                                             zero__eng_comm_queue(e));
    if (r == ZERO_OK)
        zero__eng_count(e, control ? ZERO_COLL_CONTROL : ZERO_COLL_ALL_REDUCE,
                        2.0 * (double)numel * (double)(e->world - 1) / (double)e->world, dtype);
    return r;
}

static zero_result zero__eng_group_start(zero_engine *e)
{
    return e->comm->ops->group_start ? e->comm->ops->group_start(e->comm) : ZERO_OK;
}

static zero_result zero__eng_group_end(zero_engine *e)
{
    return e->comm->ops->group_end ? e->comm->ops->group_end(e->comm) : ZERO_OK;
}

/* ---- create / destroy / register ---------------------------------------------------------- */

static int zero__eng_dtype_ok(zero_dtype d)
{
    return d == ZERO_F16 || d == ZERO_BF16 || d == ZERO_F32;
}

ZERODEF zero_result zero_engine_create(const zero_engine_desc *desc, zero_engine **out)
{
    zero_engine_desc d;
    zero_engine *e;
    zero_result r;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: desc is NULL");
    d = *desc;
    if (d.stage < 0 || d.stage > 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: stage = %d (0..3)",
                          d.stage);
    if (d.param_dtype == ZERO_DTYPE_DEFAULT) d.param_dtype = ZERO_F16;
    if (!zero__eng_dtype_ok(d.param_dtype))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: param_dtype = %d (f16, bf16 or f32)",
                          (int)d.param_dtype);
    if (d.grad_comm_dtype == ZERO_DTYPE_DEFAULT) d.grad_comm_dtype = d.param_dtype;
    if (!zero__eng_dtype_ok(d.grad_comm_dtype))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: grad_comm_dtype = %d (f16, bf16 or f32)",
                          (int)d.grad_comm_dtype);
    if (!(d.clip_norm >= 0.0f) || isinf(d.clip_norm))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: clip_norm = %g (finite, >= 0)", (double)d.clip_norm);
    if (d.accum_steps < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: accum_steps = %d",
                          d.accum_steps);
    if (d.accum_steps == 0) d.accum_steps = 1;
    if (d.prefetch_depth == 0) d.prefetch_depth = 1;
    if (d.prefetch_depth < 0) d.prefetch_depth = -1;
    if (d.host_threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: host_threads = %d",
                          d.host_threads);
    if (d.host_threads == 0) d.host_threads = 1;
    if (d.align_numel == 0) d.align_numel = ZERO_DEFAULT_ALIGN_NUMEL;
    if (!d.device || !d.device->ops)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: device is NULL");
    if (!d.comm || !d.comm->ops)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: comm is NULL");
    if (d.comm->world < 1 || d.comm->rank < 0 || d.comm->rank >= d.comm->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: comm has rank %d of world %d", d.comm->rank,
                          d.comm->world);
    {
        const zero_device_ops *o = d.device->ops;
        if (!o->alloc || !o->free || !o->copy || !o->upload || !o->download || !o->fill_zero ||
            !o->cast || !o->add || !o->nonfinite || !o->sumsq || !o->grad_mul || !o->adam ||
            !o->sync)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: device '%s' lacks a required op",
                              o->name ? o->name : "?");
        if (!d.comm->ops->all_gather || !d.comm->ops->reduce_scatter || !d.comm->ops->all_reduce)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: comm lacks a required collective");
    }
    if ((d.allocator.alloc == NULL) != (d.allocator.free == NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: allocator needs both alloc and free");
    e = (zero_engine *)zero__alloc(&d.allocator, sizeof *e);
    if (!e) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_create: %zu bytes", sizeof *e);
    memset(e, 0, sizeof *e);
    r = zero_adam_desc_resolve(&e->adam, &d.adam);
    if (r == ZERO_OK) r = zero_scaler_init(&e->scaler, &d.scaler, d.param_dtype);
    if (r == ZERO_OK) r = zero_plan_create(&e->plan, &d.allocator);
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        zero_plan_destroy(e->plan);
        zero__free(&d.allocator, e);
        return zero__fail(r, "zero_engine_create: %.380s", prev);
    }
    d.adam = e->adam;
    e->d = d;
    e->dev = d.device;
    e->comm = d.comm;
    e->rank = d.comm->rank;
    e->world = d.comm->world;
    e->stage = d.stage;
    e->accum = d.accum_steps;
    e->depth = d.prefetch_depth > 0 ? d.prefetch_depth : 0;
    e->gd = d.param_dtype;
    e->cd = d.grad_comm_dtype;
    e->p = zero_dtype_size(e->gd);
    e->c = zero_dtype_size(e->cd);
    e->state = ZERO__ENG_CREATED;
    e->last_gathered = -1;
    *out = e;
    return ZERO_OK;
}

static void zero__eng_free_device(zero_engine *e)
{
    int i;
    for (i = e->nallocs - 1; i >= 0; i--) {
        e->dev->ops->free(e->dev, e->allocs[i].ptr);
        e->mem[e->allocs[i].cat] -= e->allocs[i].bytes;
        e->mem_total -= e->allocs[i].bytes;
    }
    e->nallocs = 0;
}

ZERODEF void zero_engine_destroy(zero_engine *e)
{
    const zero_allocator *a;
    int g, i;
    if (!e) return;
    a = &e->d.allocator;
    if (e->dev) {
        /* Let queued work finish before freeing what it may touch (errors are moot here). */
        if (e->nallocs > 0 && e->dev->ops->sync) {
            (void)e->dev->ops->sync(e->dev, ZERO_QUEUE_COMM);
            (void)e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE);
        }
        zero__eng_free_device(e);
        if (e->dev->ops->event_destroy) {
            if (e->groups)
                for (g = 0; g < e->G; g++) {
                    if (e->groups[g].ev_gathered)
                        e->dev->ops->event_destroy(e->dev, e->groups[g].ev_gathered);
                    if (e->groups[g].ev_reduced)
                        e->dev->ops->event_destroy(e->dev, e->groups[g].ev_reduced);
                }
            if (e->bslots)
                for (i = 0; i < e->nbslots; i++)
                    if (e->bslots[i].ev) e->dev->ops->event_destroy(e->dev, e->bslots[i].ev);
            if (e->ev_c2m) e->dev->ops->event_destroy(e->dev, e->ev_c2m);
            if (e->ev_m2c) e->dev->ops->event_destroy(e->dev, e->ev_m2c);
        }
    }
    zero__free(a, e->groups);
    zero__free(a, e->bslots);
    zero__free(a, e->gslots);
    zero__free(a, e->pending);
    zero__free(a, e->tflags);
    zero_plan_destroy(e->plan);
    zero__free(a, e);
}

ZERODEF zero_result zero_engine_get_desc(const zero_engine *e, zero_engine_desc *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_get_desc: NULL");
    *out = e->d;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_add_tensor(zero_engine *e, const char *name, size_t numel,
                                           int group, unsigned flags, int *out_tensor)
{
    zero_result r;
    int id = -1;
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_add_tensor: engine is NULL");
    if (e->state != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_add_tensor: '%.200s' registered after commit",
                          name ? name : "(null)");
    if (flags & ~(unsigned)ZERO_TENSOR_NO_DECAY)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_add_tensor: flags = 0x%x",
                          flags);
    if (e->ntensors == e->cap_tensors) {
        int cap = e->cap_tensors ? 2 * e->cap_tensors : 64;
        unsigned *nf = (unsigned *)zero__alloc(&e->d.allocator, (size_t)cap * sizeof *nf);
        if (!nf) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_add_tensor");
        if (e->ntensors) memcpy(nf, e->tflags, (size_t)e->ntensors * sizeof *nf);
        zero__free(&e->d.allocator, e->tflags);
        e->tflags = nf;
        e->cap_tensors = cap;
    }
    r = zero_plan_add(e->plan, name, numel, group, &id);
    if (r != ZERO_OK) return r;
    e->tflags[id] = flags;
    e->ntensors = id + 1;
    if (out_tensor) *out_tensor = id;
    return ZERO_OK;
}

ZERODEF const zero_plan *zero_engine_plan(const zero_engine *e)
{
    return (e && e->state != ZERO__ENG_CREATED) ? e->plan : NULL;
}

/* ---- commit ------------------------------------------------------------------------------ */

/* FNV-1a over 64-bit words. */
static uint64_t zero__eng_mix(uint64_t h, uint64_t v)
{
    int i;
    for (i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t zero__eng_fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Everything the ranks must agree on: the plan, the settings and the tensor flags. */
static uint64_t zero__eng_hash(const zero_engine *e)
{
    uint64_t h = zero_plan_hash(e->plan);
    const zero_engine_desc *d = &e->d;
    int t;
    h = zero__eng_mix(h, (uint64_t)d->stage);
    h = zero__eng_mix(h, (uint64_t)d->param_dtype);
    h = zero__eng_mix(h, (uint64_t)d->grad_comm_dtype);
    h = zero__eng_mix(h, (uint64_t)d->accum_steps);
    h = zero__eng_mix(h, (uint64_t)d->reduce_bucket_numel);
    h = zero__eng_mix(h, (uint64_t)d->max_live_numel);
    h = zero__eng_mix(h, (uint64_t)(int64_t)d->prefetch_depth);
    h = zero__eng_mix(h, (uint64_t)d->persist_numel);
    h = zero__eng_mix(h, zero__eng_fbits(d->clip_norm));
    h = zero__eng_mix(h, (uint64_t)e->adam.mode);
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.lr));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.beta1));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.beta2));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.eps));
    h = zero__eng_mix(h, zero__eng_fbits(e->adam.weight_decay));
    h = zero__eng_mix(h, zero__eng_fbits(e->scaler.scale));
    h = zero__eng_mix(h, (uint64_t)e->scaler.dynamic);
    for (t = 0; t < e->ntensors; t++) h = zero__eng_mix(h, (uint64_t)e->tflags[t]);
    return h;
}

static zero_result zero__eng_alloc(zero_engine *e, size_t bytes, zero_mem_category cat, void **out)
{
    zero_result r;
    void *p = NULL;
    *out = NULL;
    if (bytes == 0) return ZERO_OK;
    if (e->nallocs == ZERO__ENG_MAX_ALLOCS)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine: too many allocations");
    r = e->dev->ops->alloc(e->dev, bytes, cat, &p);
    if (r != ZERO_OK) return r;
    e->allocs[e->nallocs].ptr = p;
    e->allocs[e->nallocs].bytes = bytes;
    e->allocs[e->nallocs].cat = cat;
    e->nallocs++;
    e->mem[cat] += bytes;
    if (e->mem[cat] > e->mem_peak[cat]) e->mem_peak[cat] = e->mem[cat];
    e->mem_total += bytes;
    if (e->mem_total > e->mem_peak_total) e->mem_peak_total = e->mem_total;
    *out = p;
    return ZERO_OK;
}

/* The byte sizes of every buffer, in allocation order (scratch first). */
typedef struct zero__eng_sizes {
    size_t bytes[12];
    zero_mem_category cat[12];
    int n;
} zero__eng_sizes;

enum {
    ZERO__B_SCRATCH = 0, ZERO__B_PARAM, ZERO__B_GRAD_USER, ZERO__B_GRAD_ACC, ZERO__B_MASTER,
    ZERO__B_M1, ZERO__B_M2, ZERO__B_BUCKET, ZERO__B_TC, ZERO__B_TS, ZERO__B_GATHER, ZERO__B_N
};

/* Fills the group table and the sizes from the committed plan. */
static zero_result zero__eng_layout(zero_engine *e, zero__eng_sizes *sz)
{
    int g, G = zero_plan_num_groups(e->plan);
    size_t ow = 0, os = 0, op = 0, pparam = 0, Ms;
    const zero_allocator *a = &e->d.allocator;
    int ovf = 0;
    e->G = G;
    e->groups = (zero__eng_group *)zero__alloc(a, (size_t)G * sizeof *e->groups);
    e->pending = (int *)zero__alloc(a, (size_t)G * sizeof *e->pending);
    if (!e->groups || !e->pending)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: group tables");
    memset(e->groups, 0, (size_t)G * sizeof *e->groups);
    e->M = e->Mnp = 0;
    for (g = 0; g < G; g++) {
        zero_group_info gi;
        zero__eng_group *eg = &e->groups[g];
        zero_result r;
        memset(&gi, 0, sizeof gi);
        r = zero_plan_group(e->plan, g, &gi);
        if (r != ZERO_OK) return r;
        eg->numel = gi.numel;
        eg->shard_numel = gi.shard_numel;
        eg->used_numel = gi.used_numel;
        eg->persistent = e->stage == 3 && gi.persistent;
        eg->off_whole = ow;
        eg->off_shard = os;
        eg->off_param = op;
        eg->slot = -1;
        eg->bucket = -1;
        ovf |= zero__add_size(ow, gi.numel, &ow);
        ovf |= zero__add_size(os, gi.shard_numel, &os);
        pparam = (e->stage == 3 && !eg->persistent) ? gi.shard_numel : gi.numel;
        ovf |= zero__add_size(op, pparam, &op);
        if (gi.numel > e->M) e->M = gi.numel;
        if (!eg->persistent && gi.numel > e->Mnp) e->Mnp = gi.numel;
    }
    e->P = ow;
    e->S = os;
    Ms = e->M / (size_t)e->world;
    e->alias = e->stage <= 1 && e->accum == 1 && e->cd == e->gd;
    memset(sz, 0, sizeof *sz);
    sz->n = ZERO__B_N;
    sz->cat[ZERO__B_SCRATCH] = ZERO_MEM_SCRATCH;
    sz->bytes[ZERO__B_SCRATCH] = ZERO__ENG_SCRATCH_BYTES;
    sz->cat[ZERO__B_PARAM] = ZERO_MEM_PARAM;
    ovf |= zero__mul_size(op, e->p, &sz->bytes[ZERO__B_PARAM]);
    sz->cat[ZERO__B_GRAD_USER] = ZERO_MEM_GRAD;
    if (e->stage <= 1) ovf |= zero__mul_size(e->P, e->p, &sz->bytes[ZERO__B_GRAD_USER]);
    sz->cat[ZERO__B_GRAD_ACC] = ZERO_MEM_GRAD;
    if (!e->alias)
        ovf |= zero__mul_size(e->stage == 0 ? e->P : e->S, e->c, &sz->bytes[ZERO__B_GRAD_ACC]);
    sz->cat[ZERO__B_MASTER] = ZERO_MEM_MASTER;
    sz->cat[ZERO__B_M1] = ZERO_MEM_MOMENT1;
    sz->cat[ZERO__B_M2] = ZERO_MEM_MOMENT2;
    ovf |= zero__mul_size(e->stage == 0 ? e->P : e->S, 4, &sz->bytes[ZERO__B_MASTER]);
    sz->bytes[ZERO__B_M1] = sz->bytes[ZERO__B_M2] = sz->bytes[ZERO__B_MASTER];
    sz->cat[ZERO__B_BUCKET] = sz->cat[ZERO__B_TC] = sz->cat[ZERO__B_TS] = ZERO_MEM_BUCKET;
    if (e->stage >= 2) {
        size_t want = e->d.reduce_bucket_numel, two = 0;
        ovf |= zero__mul_size(e->M, 2, &two);
        if (want < two) want = two;
        e->bslot_numel = e->M;
        e->nbslots = (int)((want + e->M - 1) / e->M);
        ovf |= zero__mul_size((size_t)e->nbslots * e->M, e->p, &sz->bytes[ZERO__B_BUCKET]);
    }
    if (e->cd != e->gd) ovf |= zero__mul_size(e->M, e->c, &sz->bytes[ZERO__B_TC]);
    if (e->stage >= 1 && e->accum > 1) ovf |= zero__mul_size(Ms, e->c, &sz->bytes[ZERO__B_TS]);
    sz->cat[ZERO__B_GATHER] = ZERO_MEM_GATHER;
    if (e->stage == 3 && e->Mnp > 0) {
        size_t live = e->d.max_live_numel;
        if (live == 0) {
            ovf |= zero__mul_size(e->Mnp, (size_t)(2 + e->depth), &live);
            e->d.max_live_numel = live;
        }
        if (e->Mnp > live)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_commit: a stage-3 group of %zu elements exceeds "
                              "max_live_numel = %zu",
                              e->Mnp, live);
        e->gslot_numel = e->Mnp;
        e->ngslots = (int)(live / e->Mnp);
        if (e->ngslots > G) e->ngslots = G;
        ovf |= zero__mul_size((size_t)e->ngslots * e->Mnp, e->p, &sz->bytes[ZERO__B_GATHER]);
    }
    if (ovf) return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: sizes overflow size_t");
    return ZERO_OK;
}

static zero_result zero__eng_make_events(zero_engine *e)
{
    const zero_allocator *a = &e->d.allocator;
    zero_device *dev = e->dev;
    int g, i;
    zero_result r = ZERO_OK;
    if (e->nbslots > 0) {
        e->bslots = (zero__eng_slot *)zero__alloc(a, (size_t)e->nbslots * sizeof *e->bslots);
        if (!e->bslots) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit");
        memset(e->bslots, 0, (size_t)e->nbslots * sizeof *e->bslots);
        for (i = 0; i < e->nbslots; i++) e->bslots[i].group = -1;
    }
    if (e->ngslots > 0) {
        e->gslots = (zero__eng_slot *)zero__alloc(a, (size_t)e->ngslots * sizeof *e->gslots);
        if (!e->gslots) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit");
        memset(e->gslots, 0, (size_t)e->ngslots * sizeof *e->gslots);
        for (i = 0; i < e->ngslots; i++) e->gslots[i].group = -1;
    }
    if (!dev->ops->event_create) return ZERO_OK;
    for (g = 0; g < e->G && r == ZERO_OK; g++) {
        if (e->stage == 3 && !e->groups[g].persistent)
            r = dev->ops->event_create(dev, &e->groups[g].ev_gathered);
        if (r == ZERO_OK && e->stage <= 1)
            r = dev->ops->event_create(dev, &e->groups[g].ev_reduced);
    }
    for (i = 0; i < e->nbslots && r == ZERO_OK; i++)
        r = dev->ops->event_create(dev, &e->bslots[i].ev);
    return r;
}

ZERODEF zero_result zero_engine_commit(zero_engine *e)
{
    zero__eng_sizes sz;
    zero_result r, plan_r;
    void *ptrs[ZERO__B_N];
    size_t total = 0;
    int i, nalloc = 0;
    char plan_err[400];
    uint64_t h;
    double hv[4];
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_commit: engine is NULL");
    if (e->state != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_commit: already committed");
    /* From here on a failure leaves the engine broken (destroy only). */
    e->state = ZERO__ENG_COMMITTED;
    memset(ptrs, 0, sizeof ptrs);
    plan_err[0] = '\0';
    plan_r = e->ntensors == 0
                 ? zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_commit: no tensor registered")
                 : zero_plan_commit(e->plan, e->world, e->d.align_numel,
                                    e->stage == 3 ? e->d.persist_numel : 0);
    if (plan_r == ZERO_OK) plan_r = zero__eng_layout(e, &sz);
    if (plan_r != ZERO_OK) {
        zero__eng_copy_error(plan_err, sizeof plan_err);
        memset(&sz, 0, sizeof sz);
        sz.n = 1;
        sz.cat[0] = ZERO_MEM_SCRATCH;
        sz.bytes[0] = ZERO__ENG_SCRATCH_BYTES;
    }
    for (i = 0; i < sz.n; i++)
        if (sz.bytes[i]) {
            if (zero__add_size(total, sz.bytes[i], &total)) {
                e->state = ZERO__ENG_BROKEN;
                return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: total size");
            }
            nalloc++;
        }
    if (e->dev->ops->reserve) {
        r = e->dev->ops->reserve(e->dev, total, (size_t)nalloc);
        if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_commit: reserve");
    }
    /* The scratch first: the hash check needs device memory. Every rank joins the check,
       also one whose plan failed (it sends a value no hash has), so none waits forever. */
    r = zero__eng_alloc(e, sz.bytes[0], ZERO_MEM_SCRATCH, &ptrs[0]);
    if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_commit: scratch allocation");
    e->scratch = (unsigned char *)ptrs[0];
    h = plan_r == ZERO_OK ? zero__eng_hash(e) : 0;
    hv[0] = plan_r == ZERO_OK ? (double)(h >> 32) : -1.0;
    hv[1] = plan_r == ZERO_OK ? (double)(h & 0xffffffffu) : -1.0;
    hv[2] = -hv[0];
    hv[3] = -hv[1];
    ZERO__ENG_TRY(e, e->dev->ops->upload(e->dev, ZERO_QUEUE_COMPUTE, e->scratch + 32, hv, sizeof hv),
                  "zero_engine_commit: upload");
    if (e->dev->ops->event_create && !e->ev_c2m) {
        ZERO__ENG_TRY(e, e->dev->ops->event_create(e->dev, &e->ev_c2m), "zero_engine_commit: event");
        ZERO__ENG_TRY(e, e->dev->ops->event_create(e->dev, &e->ev_m2c), "zero_engine_commit: event");
    }
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                  "zero_engine_commit: event");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, e->scratch + 32, e->scratch + 32, 4, ZERO_F64,
                                          ZERO_OP_MAX, 1),
                  "zero_engine_commit: plan hash all-reduce");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                  "zero_engine_commit: event");
    ZERO__ENG_TRY(e, e->dev->ops->download(e->dev, ZERO_QUEUE_COMPUTE, hv, e->scratch + 32, sizeof hv),
                  "zero_engine_commit: download");
    ZERO__ENG_TRY(e, e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE), "zero_engine_commit: sync");
    if (plan_r != ZERO_OK) {
        e->state = ZERO__ENG_BROKEN;
        return zero__fail(plan_r, "%.400s", plan_err);
    }
    if (hv[0] != -hv[2] || hv[1] != -hv[3]) {
        e->state = ZERO__ENG_BROKEN;
        return zero__fail(ZERO_ERROR_MISMATCH,
                          "zero_engine_commit: ranks registered different tensors or settings "
                          "(rank %d plan hash %016llx; hashes across ranks range over "
                          "[%08llx%08llx, %08llx%08llx])",
                          e->rank, (unsigned long long)h,
                          hv[2] <= 0.0 ? (unsigned long long)(-hv[2]) : 0ull,
                          hv[3] <= 0.0 ? (unsigned long long)(-hv[3]) : 0ull,
                          (unsigned long long)(hv[0] >= 0.0 ? hv[0] : 0.0),
                          (unsigned long long)(hv[1] >= 0.0 ? hv[1] : 0.0));
    }
    for (i = 1; i < sz.n; i++) {
        r = zero__eng_alloc(e, sz.bytes[i], sz.cat[i], &ptrs[i]);
        if (r != ZERO_OK) {
            char what[96];
            snprintf(what, sizeof what, "zero_engine_commit: allocating %zu bytes of %s",
                     sz.bytes[i], zero_mem_category_name(sz.cat[i]));
            return zero__eng_break(e, r, what);
        }
    }
    e->param = (unsigned char *)ptrs[ZERO__B_PARAM];
    e->grad_user = (unsigned char *)ptrs[ZERO__B_GRAD_USER];
    e->grad_acc = e->alias ? e->grad_user : (unsigned char *)ptrs[ZERO__B_GRAD_ACC];
    e->master = (float *)ptrs[ZERO__B_MASTER];
    e->m1 = (float *)ptrs[ZERO__B_M1];
    e->m2 = (float *)ptrs[ZERO__B_M2];
    e->bucket = (unsigned char *)ptrs[ZERO__B_BUCKET];
    e->tc = (unsigned char *)ptrs[ZERO__B_TC];
    e->ts = (unsigned char *)ptrs[ZERO__B_TS];
    e->gather = (unsigned char *)ptrs[ZERO__B_GATHER];
    r = zero__eng_make_events(e);
    if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_commit: events");
    for (i = 0; i < e->nallocs; i++)
        ZERO__ENG_TRY(e, e->dev->ops->fill_zero(e->dev, ZERO_QUEUE_COMPUTE, e->allocs[i].ptr,
                                                e->allocs[i].bytes),
                      "zero_engine_commit: fill");
    ZERO__ENG_TRY(e, e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE), "zero_engine_commit: sync");
    e->gstats.slots = e->ngslots;
    e->gstats.slot_numel = e->gslot_numel;
    e->gstats.limit_numel = (size_t)e->ngslots * e->gslot_numel;
    /* The hash check counts in the total only. */
    memset(&e->traffic_cur, 0, sizeof e->traffic_cur);
    return ZERO_OK;
}

/* ---- pointers into the buffers ------------------------------------------------------------ */

/* Group g's params as the user sees them (whole group) when they are resident. */
static unsigned char *zero__eng_param_whole(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    if (e->stage < 3) return e->param + eg->off_whole * e->p;
    if (eg->persistent) return e->param + eg->off_param * e->p;
    if (eg->slot < 0) return NULL;
    return e->gather + (size_t)eg->slot * e->gslot_numel * e->p;
}

/* Where this rank's updated param shard of group g is written by the step. */
static unsigned char *zero__eng_param_shard(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    size_t sh = (size_t)e->rank * eg->shard_numel;
    if (e->stage < 3) return e->param + (eg->off_whole + sh) * e->p;
    if (eg->persistent) return e->param + (eg->off_param + sh) * e->p;
    return e->param + eg->off_param * e->p;
}

/* The user gradient buffer of group g in this micro-step. */
static unsigned char *zero__eng_grad_user(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    if (e->stage <= 1) return e->grad_user + eg->off_whole * e->p;
    if (eg->bucket < 0) return NULL;
    return e->bucket + (size_t)eg->bucket * e->bslot_numel * e->p;
}

/* The accumulated gradient (comm dtype) of group g: stage 0 the whole group, else the
   rank's shard. */
static unsigned char *zero__eng_grad_acc(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->groups[g];
    if (e->stage == 0) return e->grad_acc + eg->off_whole * e->c;
    if (e->alias) return e->grad_user + (eg->off_whole + (size_t)e->rank * eg->shard_numel) * e->p;
    return e->grad_acc + eg->off_shard * e->c;
}

/* The rank's shard of group g's accumulated gradient (what the norm reads, every stage). */
static unsigned char *zero__eng_grad_acc_shard(const zero_engine *e, int g)
{
    unsigned char *a = zero__eng_grad_acc(e, g);
    if (e->stage == 0) a += (size_t)e->rank * e->groups[g].shard_numel * e->c;
    return a;
}

/* ---- gradients ----------------------------------------------------------------------------- */

/* Reduces group g's gradients of micro-step k (on COMM, after the hand-off). fused: only the
   collective, the caller runs zero__eng_reduce_post after the group call. */
static zero_result zero__eng_reduce_one(zero_engine *e, int g, int k, int collective_only)
{
    zero__eng_group *eg = &e->groups[g];
    zero_device *dev = e->dev;
    unsigned char *src = zero__eng_grad_user(e, g);
    unsigned char *acc = zero__eng_grad_acc(e, g);
    zero_result r;
    if (e->cd != e->gd) {
        r = dev->ops->cast(dev, ZERO_QUEUE_COMM, e->tc, e->cd, src, e->gd, eg->numel);
        if (r != ZERO_OK) return r;
        src = e->tc;
    }
    if (e->stage == 0) {
        if (k == 0) return zero__eng_all_reduce(e, src, acc, eg->numel, e->cd, ZERO_OP_SUM, 0);
        r = zero__eng_all_reduce(e, src, src, eg->numel, e->cd, ZERO_OP_SUM, 0);
        if (r != ZERO_OK || collective_only) return r;
        return dev->ops->add(dev, ZERO_QUEUE_COMM, acc, src, e->cd, eg->numel);
    }
    if (k == 0) return zero__eng_reduce_scatter(e, src, acc, eg->shard_numel, e->cd);
    r = zero__eng_reduce_scatter(e, src, e->ts, eg->shard_numel, e->cd);
    if (r != ZERO_OK) return r;
    return dev->ops->add(dev, ZERO_QUEUE_COMM, acc, e->ts, e->cd, eg->shard_numel);
}

/* Reduces every pending group, in the order they became ready. Consecutive groups whose
   reduction is one collective on distinct buffers go into one group call. */
static zero_result zero__eng_flush(zero_engine *e)
{
    int i, k = e->micro;
    int fuse;
    if (e->npending == 0) return ZERO_OK;
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                  "gradient reduction: event");
    fuse = e->npending > 1 && e->cd == e->gd && (e->stage == 0 || k == 0) &&
           e->comm->ops->group_start != NULL;
    if (fuse) {
        ZERO__ENG_TRY(e, zero__eng_group_start(e), "gradient reduction: group_start");
        for (i = 0; i < e->npending; i++)
            ZERO__ENG_TRY(e, zero__eng_reduce_one(e, e->pending[i], k, 1), "gradient reduction");
        ZERO__ENG_TRY(e, zero__eng_group_end(e), "gradient reduction: group_end");
        if (e->stage == 0 && k > 0)
            for (i = 0; i < e->npending; i++) {
                int g = e->pending[i];
                ZERO__ENG_TRY(e, e->dev->ops->add(e->dev, ZERO_QUEUE_COMM, zero__eng_grad_acc(e, g),
                                                  zero__eng_grad_user(e, g), e->cd,
                                                  e->groups[g].numel),
                              "gradient accumulation");
            }
    } else {
        for (i = 0; i < e->npending; i++)
            ZERO__ENG_TRY(e, zero__eng_reduce_one(e, e->pending[i], k, 0), "gradient reduction");
    }
    for (i = 0; i < e->npending; i++) {
        zero__eng_group *eg = &e->groups[e->pending[i]];
        if (eg->bucket >= 0) {
            zero__eng_slot *s = &e->bslots[eg->bucket];
            ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMM, s->ev), "gradient reduction: event");
            s->ev_valid = 1;
            s->group = -1;
            eg->bucket = -1;
        } else if (eg->ev_reduced) {
            ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMM, eg->ev_reduced),
                          "gradient reduction: event");
            eg->reduced_valid = 1;
        }
    }
    e->npending = 0;
    e->pending_numel = 0;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_grads(zero_engine *e, int group, void **out_grads)
{
    zero_result r = zero__eng_usable(e, "zero_engine_grads");
    zero__eng_group *eg;
    unsigned char *ptr;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_grads")) != ZERO_OK) return r;
    if (!out_grads)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_grads: out_grads is NULL");
    eg = &e->groups[group];
    if (eg->grads_state == ZERO__GRADS_HANDED) {
        *out_grads = zero__eng_grad_user(e, group);
        return ZERO_OK;
    }
    if (eg->grads_state == ZERO__GRADS_READY)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads: group %d is already ready in this micro-step",
                          group);
    if (e->micro >= e->accum)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads: all %d micro-steps of this step are done; call "
                          "zero_engine_step()",
                          e->accum);
    if (e->stage >= 2) {
        int i, s = -1;
        for (i = 0; i < e->nbslots && s < 0; i++) {
            int j = (e->bcursor + i) % e->nbslots;
            if (e->bslots[j].group < 0) s = j;
        }
        if (s < 0 && e->npending > 0) {
            if ((r = zero__eng_flush(e)) != ZERO_OK) return r;
            for (i = 0; i < e->nbslots && s < 0; i++) {
                int j = (e->bcursor + i) % e->nbslots;
                if (e->bslots[j].group < 0) s = j;
            }
        }
        if (s < 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_grads: all %d gradient buckets are held by groups "
                              "not yet ready (call zero_engine_grads_ready first, or raise "
                              "reduce_bucket_numel)",
                              e->nbslots);
        e->bcursor = (s + 1) % e->nbslots;
        if (e->bslots[s].ev_valid)
            ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, e->bslots[s].ev),
                          "zero_engine_grads: event");
        e->bslots[s].group = group;
        eg->bucket = s;
    } else if (eg->reduced_valid) {
        ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, eg->ev_reduced),
                      "zero_engine_grads: event");
    }
    ptr = zero__eng_grad_user(e, group);
    ZERO__ENG_TRY(e, e->dev->ops->fill_zero(e->dev, ZERO_QUEUE_COMPUTE, ptr, eg->numel * e->p),
                  "zero_engine_grads: fill");
    eg->grads_state = ZERO__GRADS_HANDED;
    e->grads_seen = 1;
    *out_grads = ptr;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_grads_ready(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_grads_ready");
    zero__eng_group *eg;
    int g;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_grads_ready")) != ZERO_OK) return r;
    eg = &e->groups[group];
    if (eg->grads_state != ZERO__GRADS_HANDED)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads_ready: group %d %s", group,
                          eg->grads_state == ZERO__GRADS_READY
                              ? "is already ready in this micro-step"
                              : "has no gradient buffer (call zero_engine_grads first)");
    eg->grads_state = ZERO__GRADS_READY;
    e->pending[e->npending++] = group;
    e->pending_numel += eg->numel;
    e->ready_in_micro++;
    if (e->ready_in_micro == e->G || e->pending_numel >= e->d.reduce_bucket_numel)
        if ((r = zero__eng_flush(e)) != ZERO_OK) return r;
    if (e->ready_in_micro == e->G) {
        e->micro++;
        e->ready_in_micro = 0;
        for (g = 0; g < e->G; g++) e->groups[g].grads_state = ZERO__GRADS_NONE;
        e->last_gathered = -1;
        e->grads_seen = 0;
    }
    return ZERO_OK;
}

/* ---- stage 3 gathering ------------------------------------------------------------------- */

static int zero__eng_free_gslot(const zero_engine *e)
{
    int i;
    for (i = 0; i < e->ngslots; i++)
        if (e->gslots[i].group < 0) return i;
    return -1;
}

static void zero__eng_drop_slot(zero_engine *e, int s)
{
    int g = e->gslots[s].group;
    if (g < 0) return;
    e->groups[g].slot = -1;
    e->gslots[s].group = -1;
    e->gstats.live_numel -= e->groups[g].numel;
    e->gstats.live_groups--;
}

/* All-gathers non-persistent group g into slot s (on COMM, after COMPUTE's work so far:
   the step's updates of the shard and the uses of the slot's previous group). */
static zero_result zero__eng_issue_gather(zero_engine *e, int g, int s)
{
    zero__eng_group *eg = &e->groups[g];
    unsigned char *dst = e->gather + (size_t)s * e->gslot_numel * e->p;
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "gather: event");
    ZERO__ENG_TRY(e, zero__eng_all_gather(e, e->param + eg->off_param * e->p, dst,
                                          eg->shard_numel, e->gd),
                  "gather: all_gather");
    ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMM, eg->ev_gathered), "gather: event");
    e->gslots[s].group = g;
    eg->slot = s;
    e->gstats.gathers++;
    e->gstats.live_numel += eg->numel;
    e->gstats.live_groups++;
    if (e->gstats.live_numel > e->gstats.peak_live_numel)
        e->gstats.peak_live_numel = e->gstats.live_numel;
    return ZERO_OK;
}

static zero_result zero__eng_try_prefetch(zero_engine *e, int g, int *issued)
{
    int s;
    *issued = 0;
    if (g < 0 || g >= e->G || e->groups[g].persistent || e->groups[g].slot >= 0) return ZERO_OK;
    s = zero__eng_free_gslot(e);
    if (s < 0) return ZERO_OK;
    *issued = 1;
    e->gstats.prefetches++;
    return zero__eng_issue_gather(e, g, s);
}

ZERODEF zero_result zero_engine_gather(zero_engine *e, int group, void **out_params)
{
    zero_result r = zero__eng_usable(e, "zero_engine_gather");
    zero__eng_group *eg;
    int i, dir;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_gather")) != ZERO_OK) return r;
    if (!out_params)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_gather: out_params is NULL");
    eg = &e->groups[group];
    if (e->stage < 3 || eg->persistent) {
        eg->refs++;
        *out_params = zero__eng_param_whole(e, group);
        return ZERO_OK;
    }
    if (eg->slot < 0) {
        int s = zero__eng_free_gslot(e);
        if (s < 0) {
            /* Evict a prefetched group nobody uses yet: the one farthest ahead. */
            int best = -1, bestd = -1;
            for (i = 0; i < e->ngslots; i++) {
                int h = e->gslots[i].group;
                if (h >= 0 && e->groups[h].refs == 0) {
                    int dd = h > group ? h - group : group - h;
                    if (dd > bestd) bestd = dd, best = i;
                }
            }
            if (best < 0)
                return zero__fail(ZERO_ERROR_INVALID_STATE,
                                  "zero_engine_gather: group %d: all %d gather slots hold groups "
                                  "in use (release some, or raise max_live_numel)",
                                  group, e->ngslots);
            zero__eng_drop_slot(e, best);
            e->gstats.evictions++;
            s = best;
        }
        if ((r = zero__eng_issue_gather(e, group, s)) != ZERO_OK) return r;
    } else if (eg->refs == 0) {
        e->gstats.prefetch_hits++;
    }
    ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, eg->ev_gathered), "gather: event");
    eg->refs++;
    *out_params = zero__eng_param_whole(e, group);
    /* Prefetch in the direction of travel: descending in backward. */
    dir = (e->grads_seen || (e->last_gathered >= 0 && group <= e->last_gathered)) ? -1 : 1;
    e->last_gathered = group;
    for (i = 1; i <= e->depth; i++) {
        int issued;
        if ((r = zero__eng_try_prefetch(e, group + dir * i, &issued)) != ZERO_OK) return r;
    }
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_prefetch(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_prefetch");
    int issued;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_prefetch")) != ZERO_OK) return r;
    if (e->stage < 3) return ZERO_OK;
    return zero__eng_try_prefetch(e, group, &issued);
}

ZERODEF zero_result zero_engine_release(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_release");
    zero__eng_group *eg;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_release")) != ZERO_OK) return r;
    eg = &e->groups[group];
    if (eg->refs <= 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_release: group %d is not gathered (released twice?)",
                          group);
    eg->refs--;
    if (eg->refs == 0 && e->stage == 3 && !eg->persistent) zero__eng_drop_slot(e, eg->slot);
    return ZERO_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

ZERODEF zero_result zero_engine_step(zero_engine *e, zero_step_info *info)
{
    zero_result r = zero__eng_usable(e, "zero_engine_step");
    zero_device *dev;
    float unscale, host[3], scale_used;
    double *sumsq;
    float *flag, *mul;
    zero_adam_coefs co_wd, co_nowd;
    int g, t, i;
    if (r != ZERO_OK) return r;
    dev = e->dev;
    if (e->micro != e->accum || e->ready_in_micro != 0) {
        if (e->micro == 0 && e->ready_in_micro == 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_step: no gradients since the last step");
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_step: %d complete micro-steps (and %d of %d groups of "
                          "the next), accum_steps = %d",
                          e->micro, e->ready_in_micro, e->G, e->accum);
    }
    for (g = 0; g < e->G; g++)
        if (e->groups[g].refs > 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_step: group %d is still gathered (%d references); "
                              "release every group before the step",
                              g, e->groups[g].refs);
    /* Prefetched groups hold the old values. */
    for (i = 0; i < e->ngslots; i++)
        if (e->gslots[i].group >= 0) {
            zero__eng_drop_slot(e, i);
            e->gstats.evictions++;
        }
    scale_used = e->scaler.scale;
    unscale = (float)(1.0 / ((double)scale_used * (double)e->world * (double)e->accum));
    sumsq = (double *)(void *)e->scratch;
    flag = (float *)(void *)(e->scratch + 8);
    mul = (float *)(void *)(e->scratch + 12);

    /* 1. non-finite flag and sum of squares over this rank's shard of every group. */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "step: event");
    ZERO__ENG_TRY(e, dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, e->scratch, 20), "step: fill");
    for (g = 0; g < e->G; g++) {
        const unsigned char *a = zero__eng_grad_acc_shard(e, g);
        size_t n = e->groups[g].shard_numel;
        ZERO__ENG_TRY(e, dev->ops->nonfinite(dev, ZERO_QUEUE_COMPUTE, a, e->cd, n, flag),
                      "step: nonfinite");
        ZERO__ENG_TRY(e, dev->ops->sumsq(dev, ZERO_QUEUE_COMPUTE, a, e->cd, n, sumsq),
                      "step: sumsq");
    }
    /* 2. every rank agrees on skipping and on the norm. */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "step: event");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, flag, flag, 1, ZERO_F32, ZERO_OP_MAX, 1),
                  "step: all_reduce of the inf/NaN flag");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, sumsq, sumsq, 1, ZERO_F64, ZERO_OP_SUM, 1),
                  "step: all_reduce of the sum of squares");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "step: event");
    ZERO__ENG_TRY(e, dev->ops->grad_mul(dev, ZERO_QUEUE_COMPUTE, sumsq, flag, unscale,
                                        e->d.clip_norm, mul),
                  "step: grad_mul");
    /* 3. Adam/AdamW per (tensor x shard) segment; padding is never touched. */
    r = zero_adam_coefs_make(&co_wd, &e->adam, e->adam.weight_decay, e->step + 1);
    if (r == ZERO_OK) r = zero_adam_coefs_make(&co_nowd, &e->adam, 0.0f, e->step + 1);
    if (r != ZERO_OK) return zero__eng_break(e, r, "step: Adam constants");
    for (t = 0; t < e->ntensors; t++) {
        zero_tensor_info ti;
        zero_range seg, sh;
        zero_adam_range ar;
        const zero__eng_group *eg;
        size_t mo, go, po; /* element offsets of the segment in master, grad, param buffers */
        memset(&ti, 0, sizeof ti);
        memset(&seg, 0, sizeof seg);
        memset(&sh, 0, sizeof sh);
        r = zero_plan_tensor(e->plan, t, &ti);
        if (r != ZERO_OK) return zero__eng_break(e, r, "step: plan");
        eg = &e->groups[ti.group];
        if (e->stage == 0) {
            seg.offset = ti.offset;
            seg.numel = ti.numel;
            mo = eg->off_whole + seg.offset;
            go = seg.offset;
            po = eg->off_whole + seg.offset;
        } else {
            r = zero_plan_intersect(e->plan, t, e->rank, &seg);
            if (r == ZERO_OK) r = zero_plan_shard(e->plan, ti.group, e->rank, &sh);
            if (r != ZERO_OK) return zero__eng_break(e, r, "step: plan");
            if (seg.numel == 0) continue;
            mo = eg->off_shard + (seg.offset - sh.offset);
            go = seg.offset - sh.offset;
            if (e->stage < 3) po = eg->off_whole + seg.offset;
            else if (eg->persistent) po = eg->off_param + seg.offset;
            else po = eg->off_param + (seg.offset - sh.offset);
        }
        ar.numel = seg.numel;
        ar.master = e->master + mo;
        ar.m = e->m1 + mo;
        ar.v = e->m2 + mo;
        ar.grad = zero__eng_grad_acc(e, ti.group) + go * e->c;
        ar.grad_dtype = e->cd;
        ar.param = e->param + po * e->p;
        ar.param_dtype = e->gd;
        ZERO__ENG_TRY(e, dev->ops->adam(dev, ZERO_QUEUE_COMPUTE, &ar,
                                        (e->tflags[t] & ZERO_TENSOR_NO_DECAY) ? &co_nowd : &co_wd,
                                        mul, flag),
                      "step: adam");
    }
    /* 4. stages 1-2 (stage 3: persistent groups) all-gather the updated param shards. */
    if (e->stage >= 1 && e->world > 1) {
        int any = 0;
        for (g = 0; g < e->G; g++) any |= e->stage < 3 || e->groups[g].persistent;
        if (any) {
            ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                          "step: event");
            ZERO__ENG_TRY(e, zero__eng_group_start(e), "step: group_start");
            for (g = 0; g < e->G; g++) {
                if (e->stage == 3 && !e->groups[g].persistent) continue;
                ZERO__ENG_TRY(e, zero__eng_all_gather(e, zero__eng_param_shard(e, g),
                                                      zero__eng_param_whole(e, g),
                                                      e->groups[g].shard_numel, e->gd),
                              "step: all_gather of updated params");
            }
            ZERO__ENG_TRY(e, zero__eng_group_end(e), "step: group_end");
            ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                          "step: event");
        }
    }
    /* 5. one download: flag, multiplier, norm. */
    ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_COMPUTE, host, e->scratch + 8,
                                        3 * sizeof(float)),
                  "step: download");
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), "step: sync");
    zero_scaler_update(&e->scaler, host[0] != 0.0f);
    if (host[0] == 0.0f) e->step++;
    e->micro = 0;
    e->ready_in_micro = 0;
    e->last_gathered = -1;
    e->grads_seen = 0;
    for (g = 0; g < e->G; g++) e->groups[g].grads_state = ZERO__GRADS_NONE;
    e->traffic_last = e->traffic_cur;
    memset(&e->traffic_cur, 0, sizeof e->traffic_cur);
    if (info) {
        info->step = e->step;
        info->skipped = host[0] != 0.0f;
        info->loss_scale = scale_used;
        info->next_loss_scale = e->scaler.scale;
        info->grad_norm = host[2];
        info->grad_mul = host[1];
        info->clip_coef = 1.0f;
        if (!info->skipped && e->d.clip_norm > 0.0f && host[2] > e->d.clip_norm)
            info->clip_coef = e->d.clip_norm / (host[2] + 1e-6f);
    }
    return ZERO_OK;
}

/* ---- tensors in and out ------------------------------------------------------------------ */

/* The parts of tensor t this rank stores: params [p0, p0 + pn) and master [m0, m0 + mn), in
   tensor coordinates, and the device addresses of their first elements. */
typedef struct zero__eng_parts {
    size_t p0, pn, m0, mn;
    unsigned char *param;
    size_t master_off; /* element offset in master / m / v */
} zero__eng_parts;

static zero_result zero__eng_parts_of(const zero_engine *e, int t, zero__eng_parts *out)
{
    zero_tensor_info ti;
    zero_range seg, sh;
    const zero__eng_group *eg;
    zero_result r;
    memset(&ti, 0, sizeof ti);
    memset(&seg, 0, sizeof seg);
    memset(&sh, 0, sizeof sh);
    r = zero_plan_tensor(e->plan, t, &ti);
    if (r != ZERO_OK) return r;
    eg = &e->groups[ti.group];
    r = zero_plan_intersect(e->plan, t, e->rank, &seg);
    if (r == ZERO_OK) r = zero_plan_shard(e->plan, ti.group, e->rank, &sh);
    if (r != ZERO_OK) return r;
    out->m0 = seg.numel ? seg.offset - ti.offset : 0;
    out->mn = seg.numel;
    out->master_off = e->stage == 0 ? eg->off_whole + seg.offset
                                    : eg->off_shard + (seg.offset - sh.offset);
    if (e->stage < 3 || eg->persistent) {
        out->p0 = 0;
        out->pn = ti.numel;
        out->param = e->param + ((e->stage < 3 ? eg->off_whole : eg->off_param) + ti.offset) * e->p;
    } else {
        out->p0 = out->m0;
        out->pn = out->mn;
        out->param = e->param + (eg->off_param + (seg.offset - sh.offset)) * e->p;
    }
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_set_tensor(zero_engine *e, int tensor, const float *values)
{
    zero_result r = zero__eng_usable(e, "zero_engine_set_tensor");
    zero_tensor_info ti;
    zero__eng_parts pt;
    void *tmp = NULL;
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= e->ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_set_tensor: tensor %d unknown",
                          tensor);
    if (!values)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_tensor: values is NULL");
    if (e->micro != 0 || e->ready_in_micro != 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_set_tensor: in the middle of a step");
    if ((r = zero_plan_tensor(e->plan, tensor, &ti)) != ZERO_OK) return r;
    if (e->stage == 3 && e->groups[ti.group].slot >= 0) {
        if (e->groups[ti.group].refs > 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_set_tensor: group %d is gathered", ti.group);
        zero__eng_drop_slot(e, e->groups[ti.group].slot); /* a stale prefetch */
    }
    if ((r = zero__eng_parts_of(e, tensor, &pt)) != ZERO_OK) return r;
    if (e->stage == 0) { /* stage 0 holds the whole master */
        pt.m0 = 0;
        pt.mn = ti.numel;
        pt.master_off = e->groups[ti.group].off_whole + ti.offset;
    }
    if (pt.pn > 0 && e->gd != ZERO_F32) {
        tmp = zero__alloc(&e->d.allocator, pt.pn * e->p);
        if (!tmp) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_set_tensor");
        r = zero_convert(tmp, e->gd, values + pt.p0, ZERO_F32, pt.pn, ZERO_SIMD_AUTO);
        if (r != ZERO_OK) {
            zero__free(&e->d.allocator, tmp);
            return r;
        }
    }
    if (pt.pn > 0)
        r = e->dev->ops->upload(e->dev, ZERO_QUEUE_COMPUTE, pt.param,
                                tmp ? (const void *)tmp : (const void *)(values + pt.p0),
                                pt.pn * e->p);
    if (r == ZERO_OK && pt.mn > 0)
        r = e->dev->ops->upload(e->dev, ZERO_QUEUE_COMPUTE, e->master + pt.master_off,
                                values + pt.m0, pt.mn * sizeof(float));
    if (r == ZERO_OK) r = e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE);
    zero__free(&e->d.allocator, tmp);
    if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_set_tensor: upload");
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_read_tensor(zero_engine *e, int tensor, zero_state_kind kind,
                                            void *host_dst, zero_range *out_range)
{
    zero_result r = zero__eng_usable(e, "zero_engine_read_tensor");
    zero__eng_parts pt;
    const void *src;
    size_t off, n, esz;
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= e->ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_read_tensor: tensor %d unknown",
                          tensor);
    if (!host_dst)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_read_tensor: host_dst is NULL");
    if ((r = zero__eng_parts_of(e, tensor, &pt)) != ZERO_OK) return r;
    switch (kind) {
    case ZERO_STATE_PARAM: src = pt.param; off = pt.p0; n = pt.pn; esz = e->p; break;
    case ZERO_STATE_MASTER: src = e->master + pt.master_off; off = pt.m0; n = pt.mn; esz = 4; break;
    case ZERO_STATE_M: src = e->m1 + pt.master_off; off = pt.m0; n = pt.mn; esz = 4; break;
    case ZERO_STATE_V: src = e->m2 + pt.master_off; off = pt.m0; n = pt.mn; esz = 4; break;
    default:
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_read_tensor: kind = %d",
                          (int)kind);
    }
    if (n > 0) {
        r = e->dev->ops->download(e->dev, ZERO_QUEUE_COMPUTE,
                                  (unsigned char *)host_dst + off * esz, src, n * esz);
        if (r == ZERO_OK) r = e->dev->ops->sync(e->dev, ZERO_QUEUE_COMPUTE);
        if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_read_tensor: download");
    }
    if (out_range) {
        out_range->offset = off;
        out_range->numel = n;
    }
    return ZERO_OK;
}

/* ---- queries ----------------------------------------------------------------------------- */

ZERODEF float zero_engine_loss_scale(const zero_engine *e) { return e ? e->scaler.scale : 1.0f; }

ZERODEF int64_t zero_engine_step_count(const zero_engine *e) { return e ? e->step : 0; }

ZERODEF zero_result zero_engine_set_lr(zero_engine *e, float lr)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_lr: engine is NULL");
    if (!(lr >= 0.0f) || isinf(lr))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_lr: lr = %g (finite, >= 0)",
                          (double)lr);
    e->adam.lr = lr;
    e->d.adam.lr = lr;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_memory_usage(const zero_engine *e, zero_engine_memory *out)
{
    int k;
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_memory_usage: NULL");
    for (k = 0; k < ZERO_MEM_COUNT; k++) {
        out->bytes[k] = e->mem[k];
        out->peak_bytes[k] = e->mem_peak[k];
    }
    out->total_bytes = e->mem_total;
    out->peak_total_bytes = e->mem_peak_total;
    out->allocations = (size_t)e->nallocs;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_traffic(const zero_engine *e, zero_traffic *last_step,
                                        zero_traffic *total)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_traffic: engine is NULL");
    if (last_step) *last_step = e->traffic_last;
    if (total) *total = e->traffic_total;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_gather_stats(const zero_engine *e, zero_gather_stats *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_gather_stats: NULL");
    *out = e->gstats;
    return ZERO_OK;
}
