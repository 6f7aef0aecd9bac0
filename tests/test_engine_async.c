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
   shards), and with 'defer' set transfers really run late: every transfer on
   ZERO_QUEUE_OFFLOAD, and every upload on another queue whose host source is pinned memory
   of this device (host_alloc; CUDA copies from pageable memory before the call returns).
   They wait in a list per queue until the host syncs that queue, another queue waits on an
   event recorded on it, or a later op of the same queue needs them done (stream order), as
   a DMA engine would; so host code that reads a downloaded tile (or rewrites a pinned
   buffer being uploaded) without the sync sees stale data (or uploads the new data in
   place of the old) and the run's state differs from the plain run's. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, rmdir: the NVMe tier's directory */
#include <stdlib.h>
#include <unistd.h>
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

#include "tests/vc_device.h"

/* ---- the checking comm: collectives on ZERO_QUEUE_COMM ------------------------------------ */

static zero_comm *CI(zero_comm *c) { return ((ec_wrap *)c->impl)->inner; }
static size_t world_of(zero_comm *c) { return (size_t)c->world; }

static zero_result vcc_ag(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, void *q)
{
    size_t b = n * zero_dtype_size(d);
    (void)vc_begin(vc_current, ZERO_QUEUE_COMM);
    vc_touch(vc_current, ZERO_QUEUE_COMM, s, b, 0, "all_gather send");
    vc_touch(vc_current, ZERO_QUEUE_COMM, r, b * world_of(c), 1, "all_gather recv");
    return CI(c)->ops->all_gather(CI(c), s, r, n, d, q);
}
static zero_result vcc_rs(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, zero_op op,
                          void *q)
{
    size_t b = n * zero_dtype_size(d);
    (void)vc_begin(vc_current, ZERO_QUEUE_COMM);
    vc_touch(vc_current, ZERO_QUEUE_COMM, s, b * world_of(c), 0, "reduce_scatter send");
    vc_touch(vc_current, ZERO_QUEUE_COMM, r, b, 1, "reduce_scatter recv");
    return CI(c)->ops->reduce_scatter(CI(c), s, r, n, d, op, q);
}
static zero_result vcc_ar(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, zero_op op,
                          void *q)
{
    size_t b = n * zero_dtype_size(d);
    (void)vc_begin(vc_current, ZERO_QUEUE_COMM);
    vc_touch(vc_current, ZERO_QUEUE_COMM, s, b, 0, "all_reduce send");
    vc_touch(vc_current, ZERO_QUEUE_COMM, r, b, 1, "all_reduce recv");
    return CI(c)->ops->all_reduce(CI(c), s, r, n, d, op, q);
}
static zero_result vcc_bc(zero_comm *c, void *b, size_t n, zero_dtype d, int root, void *q)
{
    (void)vc_begin(vc_current, ZERO_QUEUE_COMM);
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
                                vcc_group, vcc_group, NULL, NULL};

/* ---- the run: the ec harness' program with the user's accesses logged ------------------- */

typedef struct arun {
    int stage, accum, steps, world;
    int offload; /* 0 none, 1 optimizer on the CPU, 2 params too (stage 3), 3 optimizer and
                    gradients on NVMe (nvme_dir); deferred transfers */
    const char *nvme_dir;
    uint64_t hash[EC_MAX_RANKS]; /* FNV-1a of every tensor's master and params after the run */
    zero_dtype dt, cdt;
    size_t bucket, persist, max_live;
    int prefetch;
    int model;     /* 0: ec_default_model; 1: persistent, partitioned, persistent (below) */
    int pin;       /* the engine's pin_memory when offloading (0: the default) */
    int pinned;    /* out: whether the engine took pinned memory */
    double ratio;  /* offload_optimizer_ratio (0 = 1) */
    int dpu;       /* delayed_update (K = 0), the run ending with zero_engine_finish_update */
    int nodefer;   /* transfers run when enqueued (the reference of a deferred run) */
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
    if (A->model == 1) {
        /* groups 0 and 2 persistent (fewer than persist_numel elements), group 1 partitioned:
           with its shard in one tile, the offloaded step's tiles are persistent (param
           staging tile 0), offloaded (no upload), persistent (staging tile 0 again) */
        static const size_t sizes[] = {9, 3, 30, 11};
        static const int groups[] = {0, 0, 1, 2};
        for (t = 0; t < 4; t++) {
            c.sizes[t] = sizes[t];
            c.groups[t] = groups[t];
            c.flags[t] = sizes[t] < 10 ? ZERO_TENSOR_NO_DECAY : 0;
        }
        c.ntensors = 4;
    }
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
        d.offload_optimizer = A->offload == 3 ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
        d.offload_param = A->offload == 2 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
        d.offload_gradients = A->offload == 3 ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_NONE;
        d.nvme_path = A->nvme_dir;
        d.sub_group_size = 29; /* many tiles: the pipeline's staging tiles are reused */
        d.pin_memory = A->pin; /* the default pins: this device offers host_alloc */
        d.offload_optimizer_ratio = A->ratio;
        d.delayed_update = A->dpu;
        vc_current->defer = !A->nodefer;
    }
    r = zero_engine_create(&d, &e);
    for (t = 0; t < c.ntensors && !r; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        r = zero_engine_add_tensor(e, name, c.sizes[t], c.groups[t], c.flags[t], &ids[t]);
    }
    if (!r) r = zero_engine_commit(e);
    if (r) goto out;
    {
        zero_engine_desc got;
        if (rank == 0 && zero_engine_get_desc(e, &got) == ZERO_OK) A->pinned = got.pin_memory; /* one writer */
    }
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
                (void)vc_begin(vc_current, ZERO_QUEUE_COMPUTE);
                vc_touch(vc_current, ZERO_QUEUE_COMPUTE, pp, gi.numel * zero_dtype_size(A->dt), 0,
                         "user forward");
                r = zero_engine_release(e, g);
            }
            for (g = G - 1; g >= 0 && !r; g--) {
                zero_group_info gi;
                zero_plan_group(plan, g, &gi);
                if ((r = zero_engine_gather(e, g, &pp))) break;
                if ((r = zero_engine_grads(e, g, &gp))) break;
                (void)vc_begin(vc_current, ZERO_QUEUE_COMPUTE);
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
    if (!r && A->dpu) r = zero_engine_finish_update(e);
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
    (void)vc_begin(v, ZERO_QUEUE_COMM);
    vc_touch(v, ZERO_QUEUE_COMM, buf, 64, 0, "collective");
    ZT_CHECK(v->races == 1);
    dev->ops->record(dev, ZERO_QUEUE_COMM, ev); /* compute waits for the collective's read */
    dev->ops->wait(dev, ZERO_QUEUE_COMPUTE, ev);
    dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, buf, 256);
    ZT_CHECK(v->races == 1);
    dev->ops->record(dev, ZERO_QUEUE_COMPUTE, ev);
    dev->ops->wait(dev, ZERO_QUEUE_COMM, ev);
    (void)vc_begin(v, ZERO_QUEUE_COMM);
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

/* Partial offload (offload_optimizer_ratio 0.4) on the race model: the device part's
   gradient upload from the host tier (on COMPUTE, after the OFFLOAD downloads it reads),
   the device's Adam beside the host's and the param tiles' uploads raise no race, and the
   state is the plain run's. */
ZT_TEST(offload_ratio_orders_its_queues)
{
    int st, v;
    for (st = 1; st <= 3; st++)
        for (v = 0; v < 2; v++) {
            uint64_t plain[EC_MAX_RANKS];
            int o, rk;
            for (o = 0; o <= 1; o++) {
                arun A;
                char label[64];
                memset(&A, 0, sizeof A);
                A.stage = st;
                A.world = 3;
                A.steps = 3;
                A.dt = v ? ZERO_BF16 : ZERO_F16;
                A.accum = v ? 2 : 1;
                if (v) A.cdt = ZERO_F32;
                A.offload = o;
                A.ratio = o ? 0.4 : 0.0;
                snprintf(label, sizeof label, "stage %d variant %d ratio 0.4", st, v);
                check_async(&A, label);
                for (rk = 0; rk < A.world; rk++) {
                    if (o == 0) plain[rk] = A.hash[rk];
                    else ZT_CHECKF(A.hash[rk] == plain[rk], "%s rank %d: state differs from the plain run",
                                   label, rk);
                }
            }
        }
}

/* The delayed update (delayed_update, K = 0) on the race model: the next backward's
   gradient downloads run late into the other gradient shard while the host Adam reads the
   previous one, the publish uploads the pending params on COMPUTE; no race, and the same
   state as the same run whose transfers run when enqueued. */
ZT_TEST(delayed_update_orders_its_queues)
{
    int st, v;
    for (st = 1; st <= 3; st++)
        for (v = 0; v < 2; v++) {
            uint64_t ref[EC_MAX_RANKS];
            int o, rk;
            for (o = 0; o <= 1; o++) {
                arun A;
                char label[64];
                memset(&A, 0, sizeof A);
                A.stage = st;
                A.world = 3;
                A.steps = 4;
                A.dt = v ? ZERO_BF16 : ZERO_F16;
                A.accum = v ? 2 : 1;
                if (v) A.cdt = ZERO_F32;
                A.offload = v && st == 3 ? 2 : 1;
                A.dpu = 1;
                A.nodefer = !o;
                snprintf(label, sizeof label, "stage %d variant %d delayed update", st, v);
                check_async(&A, label);
                for (rk = 0; rk < A.world; rk++) {
                    if (o == 0) ref[rk] = A.hash[rk];
                    else ZT_CHECKF(A.hash[rk] == ref[rk], "%s rank %d: state differs from the undeferred run",
                                   label, rk);
                }
            }
        }
}

/* The gradients on NVMe (offload_gradients = nvme) on a device whose OFFLOAD downloads run
   late: the staging buffers' downloads, the read-backs and adds of later micro-steps and the
   step's gradient tiles raise no race in the model, and the state is the plain run's. */
ZT_TEST(nvme_gradients_order_their_queues)
{
    char dir[64];
    int st, v;
    snprintf(dir, sizeof dir, "/tmp/zero-test-async-XXXXXX");
    ZT_CHECK(mkdtemp(dir) != NULL);
    for (st = 1; st <= 3; st++)
        for (v = 0; v < 2; v++) {
            uint64_t plain[EC_MAX_RANKS];
            int o, rk;
            for (o = 0; o <= 1; o++) {
                arun A;
                char label[96];
                memset(&A, 0, sizeof A);
                A.stage = st;
                A.world = 3;
                A.steps = 3;
                A.dt = v ? ZERO_BF16 : ZERO_F16;
                A.accum = v ? 2 : 1;
                if (v) A.cdt = ZERO_F32;
                A.offload = o ? 3 : 0;
                A.nvme_dir = dir;
                snprintf(label, sizeof label, "stage %d variant %d gradients on nvme %d", st, v, o);
                check_async(&A, label);
                ZT_CHECKF(vc_pinned_live == 0, "%s: %d pinned buffers not given back", label, vc_pinned_live);
                vc_pinned_total = 0;
                for (rk = 0; rk < A.world; rk++) {
                    if (o == 0) plain[rk] = A.hash[rk];
                    else ZT_CHECKF(A.hash[rk] == plain[rk], "%s rank %d: state differs from the plain run",
                                   label, rk);
                }
            }
        }
    ZT_CHECK(rmdir(dir) == 0);
}

/* Stage 3 with both offloads and persistent groups: the tiles of the step go persistent,
   offloaded, persistent, so the third tile's host Adam rewrites the param staging tile that
   the first tile's upload (on COMPUTE, from pinned memory, deferred by the model) reads,
   with no upload in between to have synced COMPUTE. The state must still equal the plain
   run's (one and three steps, 1 and 2 micro-steps, world 2 and 3: group 1's shard is one
   tile). */
ZT_TEST(offload_waits_for_the_upload_of_its_param_tile)
{
    int w, v;
    for (w = 2; w <= 3; w++)
        for (v = 0; v < 2; v++) {
            uint64_t plain[EC_MAX_RANKS];
            int o, rk;
            for (o = 0; o <= 2; o += 2) {
                arun A;
                char label[64];
                memset(&A, 0, sizeof A);
                A.stage = 3;
                A.world = w;
                A.steps = v ? 3 : 1;
                A.accum = v ? 2 : 1;
                A.dt = v ? ZERO_BF16 : ZERO_F16;
                A.persist = 20;
                A.model = 1;
                A.offload = o;
                snprintf(label, sizeof label, "world %d variant %d offload %d", w, v, o);
                check_async(&A, label);
                vc_pinned_total = 0;
                for (rk = 0; rk < w; rk++) {
                    if (o == 0) plain[rk] = A.hash[rk];
                    else ZT_CHECKF(A.hash[rk] == plain[rk], "%s rank %d: state differs from the plain run",
                                   label, rk);
                }
            }
        }
}

/* pin_memory's default follows the device: this device offers pinned memory (host_alloc),
   so the default (and ZERO_PIN_MEMORY_ON) take the offload tiers' buffers there, and the
   run defers its COMPUTE uploads from them; ZERO_PIN_MEMORY_OFF takes none. The state is
   the plain run's every time. The host device offers none: the default resolves to off. */
ZT_TEST(pin_memory_default_follows_the_device)
{
    static const int pins[] = {ZERO_PIN_MEMORY_AUTO, ZERO_PIN_MEMORY_ON, ZERO_PIN_MEMORY_OFF};
    uint64_t plain[EC_MAX_RANKS];
    int i, rk;
    for (i = -1; i < 3; i++) {
        arun A;
        char label[64];
        memset(&A, 0, sizeof A);
        A.stage = 3;
        A.world = 2;
        A.steps = 2;
        A.accum = 1;
        A.dt = ZERO_F16;
        A.persist = 20;
        A.model = 1;
        A.offload = i < 0 ? 0 : 2;
        A.pin = i < 0 ? 0 : pins[i];
        snprintf(label, sizeof label, "pin_memory %d", i < 0 ? 99 : A.pin);
        vc_pinned_total = 0;
        check_async(&A, label);
        if (i < 0) {
            for (rk = 0; rk < A.world; rk++) plain[rk] = A.hash[rk];
            continue;
        }
        ZT_CHECKF(A.pinned == (A.pin == ZERO_PIN_MEMORY_OFF ? ZERO_PIN_MEMORY_OFF : ZERO_PIN_MEMORY_ON),
                  "%s: resolved to %d", label, A.pinned);
        ZT_CHECKF((vc_pinned_total > 0) == (A.pin != ZERO_PIN_MEMORY_OFF), "%s: %d pinned buffers", label,
                  vc_pinned_total);
        ZT_CHECKF(vc_pinned_live == 0, "%s: %d pinned buffers not given back", label, vc_pinned_live);
        for (rk = 0; rk < A.world; rk++)
            ZT_CHECKF(A.hash[rk] == plain[rk], "%s rank %d: state differs from the plain run", label, rk);
    }
    {
        zero_device *host = NULL;
        zero_local_group *grp = NULL;
        zero_local_desc ld;
        zero_comm *comm = NULL;
        zero_engine *e = NULL;
        zero_engine_desc d, got;
        memset(&ld, 0, sizeof ld);
        ld.world = 1;
        ZT_CHECK(zero_host_device_create(NULL, &host) == ZERO_OK);
        ZT_CHECK(zero_local_group_create(&ld, &grp) == ZERO_OK);
        ZT_CHECK(zero_local_comm_create(grp, 0, &comm) == ZERO_OK);
        memset(&d, 0, sizeof d);
        d.stage = 1;
        d.offload_optimizer = ZERO_OFFLOAD_CPU;
        d.device = host;
        d.comm = comm;
        ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
        ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK && got.pin_memory == ZERO_PIN_MEMORY_OFF);
        zero_engine_destroy(e);
        zero_comm_destroy(comm);
        zero_local_group_destroy(grp);
        zero_device_destroy(host);
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
    ZT_RUN(offload_ratio_orders_its_queues);
    ZT_RUN(delayed_update_orders_its_queues);
    ZT_RUN(nvme_gradients_order_their_queues);
    ZT_RUN(offload_waits_for_the_upload_of_its_param_tile);
    ZT_RUN(pin_memory_default_follows_the_device);
    ZT_RUN(set_tensor_waits_for_prefetch);
    return zt_summary();
}
