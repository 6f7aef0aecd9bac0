/* engine_common.h - the harness the engine tests share: one training run of synthetic
   gradients on N ranks (threads, local comm, host device), its state gathered on the host.

   A run registers a fixed set of tensors (sizes not multiples of N, several groups, biases
   excluded from weight decay), sets them from a deterministic function, and runs 'steps'
   optimizer steps of 'accum' micro-steps. Every micro-step does the stage-3 pattern (forward:
   gather/release groups ascending; backward: descending, gather, grads, write, release,
   grads_ready), so one program runs at every stage. The gradient of element i of tensor t on
   rank r in micro-step k is synth_grad(param, r, k, step, i, t): it depends on the current
   params, so any divergence between runs propagates. */
#ifndef ENGINE_COMMON_H
#define ENGINE_COMMON_H
#include <math.h>
#include <pthread.h>

#define EC_MAX_T 16
#define EC_MAX_RANKS 8
#define EC_MAX_STEPS 64

typedef struct ec_cfg {
    int stage, world, accum, steps;
    zero_dtype dtype, comm_dtype;
    int ntensors;
    size_t sizes[EC_MAX_T];
    int groups[EC_MAX_T];
    unsigned flags[EC_MAX_T];
    size_t persist, max_live, bucket;
    int prefetch;
    float clip, lr, wd;
    float init_scale; /* 0 = default */
    int window, hysteresis;
    /* Faults: a NaN (or inf when fault_inf) in rank fault_rank's gradient at the listed
       steps (0-based), micro-step 0, tensor 0 element 0. */
    int fault_steps[EC_MAX_STEPS];
    int nfault;
    int fault_rank, fault_inf;
    /* Whole-batch single rank: world must be 1; each gradient is the mean over virt_world
       ranks' synthetic gradients (computed in double, rounded once). */
    int virt_world;
    zero_comm_ops *wrap_ops; /* optional: a comm wrapper (tests of group calls, failures) */
    /* offload (tests/test_offload.c): the engine's knobs and the host device's budget */
    zero_offload_device offload_opt, offload_param;
    zero_offload_device offload_grad; /* engine offload_gradients */
    size_t sub_group;
    int host_threads;
    size_t device_capacity;
    const char *nvme_path;
    int pin_memory;
    int async_step;          /* engine async_step: steps without info, read one step later */
    int param_read_ahead;    /* engine param_read_ahead (offload_param = nvme)             */
    double offload_ratio;    /* engine offload_optimizer_ratio (0 = 1 with offload)        */
    /* zero_engine_offload_states(states_what, states_tier) before step states_at, and
       zero_engine_reload_states right after (tests/test_offload_states.c); 0 = never */
    unsigned states_what;
    zero_offload_device states_tier;
    int states_at;
    /* per-tensor hyper-parameters, set after commit when hp_on (zero_engine_set_tensor_hparams) */
    int hp_on;
    double lr_mul[EC_MAX_T], hp_wd[EC_MAX_T];
    zero_dtype opt_dtype;    /* engine optimizer_dtype (0 = fp32 states)                    */
    uint64_t opt_seed;       /* engine optimizer_seed                                       */
    /* ZeRO++'s quantized collectives (tests/test_quant_engine.c): the engine's settings, and
       when qw_stats is set the forward's gathered params are compared with the backward's
       (exact) per quantization block of each rank's shard, against the int8 bound. */
    int quant_w, quant_g, quant_bits;
    int quant_levels; /* engine quantized_gradient_levels (0 = default)                     */
    size_t quant_block;
    struct ec_qw_stats *qw_stats;
    /* topology (tests/test_hier.c): engine ranks_per_node; per-rank override when
       rpn_rank[r] != 0 (a disagreement test) */
    int ranks_per_node;
    int rpn_rank[EC_MAX_RANKS];
    int mics;                     /* engine mics_shard_size; per-rank override mics_rank[r] */
    int mics_rank[EC_MAX_RANKS];
    int hpz;                      /* engine hpz_partition_size; per-rank override hpz_rank[r] */
    int hpz_rank[EC_MAX_RANKS];
    /* delayed_update (tests/test_dpu.c): the engine's settings; the run ends with
       zero_engine_finish_update unless dpu_no_finish */
    int dpu, dpu_after, dpu_no_finish;
    /* The delayed update's reference (tests/test_dpu.c), on an engine without it: when
       stale is set, step s's gradients are computed from the params the backward gathered
       in step s - 1 whenever step s - 1's update was one the delayed engine delays (it
       had taken at least stale_after updates before it), else from the current params. */
    struct ec_stale *stale;
    int stale_after;
} ec_cfg;

/* The reference driver's params per rank and group: seen in the previous step, this step. */
#define EC_STALE_G 16
typedef struct ec_stale {
    unsigned char *prev[EC_MAX_RANKS][EC_STALE_G], *cur[EC_MAX_RANKS][EC_STALE_G];
    int use[EC_MAX_RANKS]; /* this step's gradients from prev */
} ec_stale;

typedef struct ec_qw_stats {
    pthread_mutex_t mu;
    long blocks, bad_blocks;
    double max_err_over_scale; /* the largest |forward - exact| / scale seen */
    long differing;            /* elements whose forward value differed from the exact one */
} ec_qw_stats;

typedef struct ec_result {
    zero_result rc;
    char err[512];
    /* merged over ranks, tensor coordinates */
    float *master[EC_MAX_T], *m[EC_MAX_T], *v[EC_MAX_T];
    unsigned char *param[EC_MAX_T]; /* param dtype bytes */
    int params_agree;               /* every rank holding a param element has the same bits */
    zero_step_info info[EC_MAX_RANKS][EC_MAX_STEPS];
    zero_engine_memory mem[EC_MAX_RANKS];
    zero_engine_memory host_mem[EC_MAX_RANKS]; /* the host tier (offload) */
    zero_engine_memory nvme_mem[EC_MAX_RANKS]; /* the NVMe tier (offload) */
    /* states_what: each tier before the offload [0], between it and the reload [1], after [2] */
    zero_engine_memory states_mem[EC_MAX_RANKS][3][3];
    zero_result states_refused[EC_MAX_RANKS]; /* a gather while offloaded */
    zero_traffic traffic_last[EC_MAX_RANKS][EC_MAX_STEPS];
    zero_gather_stats gstats[EC_MAX_RANKS];
    size_t live_after_step_max; /* the most non-persistent gathered numel seen after a step */
    size_t plan_total, plan_shard_total, max_group, max_np_group, persist_total;
    size_t max_group2; /* the second-largest group (the largest when there is one group) */
    size_t frozen_total; /* every group's frozen region (zero_group_info.frozen_numel) */
    int ngroups;
    float loss_scale_before[EC_MAX_STEPS];
} ec_result;

/* The default model: 4 groups, a small persistent-able group 2, odd sizes. */
static void ec_default_model(ec_cfg *c)
{
    static const size_t sizes[] = {37, 5, 101, 3, 13, 250, 7, 1};
    static const int groups[] = {0, 0, 1, 1, 2, 3, 3, 3};
    int t;
    c->ntensors = 8;
    for (t = 0; t < 8; t++) {
        c->sizes[t] = sizes[t];
        c->groups[t] = groups[t];
        c->flags[t] = (sizes[t] < 10) ? ZERO_TENSOR_NO_DECAY : 0;
    }
}

static void ec_cfg_init(ec_cfg *c, int stage, int world, zero_dtype dt, int accum, int steps)
{
    memset(c, 0, sizeof *c);
    c->stage = stage;
    c->world = world;
    c->dtype = dt;
    c->accum = accum;
    c->steps = steps;
    c->lr = 1e-3f;
    c->wd = 0.01f;
    c->fault_rank = -1;
    ec_default_model(c);
}

static float ec_init_value(int t, size_t i)
{
    return (float)(0.5 * sin(0.1 * (double)i + 0.7 * t + 0.3));
}

/* Bounded away from zero (0.005 .. 0.025 plus a small param term), so the sign of every
   gradient is robust to rounding: what makes the N-rank / 1-rank comparison tight. */
static double ec_synth_grad(float p, int rank, int micro, int step, size_t i, int t)
{
    double ph = 0.37 * (double)i + 1.3 * rank + 0.71 * micro + 0.19 * step + 0.5 * t;
    return 0.01 * (1.5 + sin(ph)) + 0.002 * (double)p;
}

static float ec_to_f32(const void *p, zero_dtype dt, size_t i)
{
    if (dt == ZERO_F32) return ((const float *)p)[i];
    if (dt == ZERO_F16) return zero_f16_to_f32(((const uint16_t *)p)[i]);
    return zero_bf16_to_f32(((const uint16_t *)p)[i]);
}

static void ec_from_f32(void *p, zero_dtype dt, size_t i, float x)
{
    if (dt == ZERO_F32) ((float *)p)[i] = x;
    else if (dt == ZERO_F16) ((uint16_t *)p)[i] = zero_f32_to_f16(x);
    else ((uint16_t *)p)[i] = zero_f32_to_bf16(x);
}

typedef struct ec_ctx {
    const ec_cfg *cfg;
    ec_result *res;
    unsigned char *param_rank[EC_MAX_RANKS][EC_MAX_T];
    pthread_mutex_t mu;
} ec_ctx;

/* A comm that forwards to another and may be wrapped by tests. */
typedef struct ec_wrap {
    zero_comm base;
    zero_comm *inner;
} ec_wrap;

static int ec_is_fault(const ec_cfg *c, int step)
{
    int i;
    for (i = 0; i < c->nfault; i++)
        if (c->fault_steps[i] == step) return 1;
    return 0;
}

#define EC_TRY(call)                                                                         \
    do {                                                                                     \
        r = (call);                                                                          \
        if (r != ZERO_OK) goto done;                                                         \
    } while (0)

/* The engine descriptor of cfg (device and comm left to the caller). */
static void ec_engine_desc(const ec_cfg *c, zero_engine_desc *d)
{
    memset(d, 0, sizeof *d);
    d->stage = c->stage;
    d->param_dtype = c->dtype;
    d->grad_comm_dtype = c->comm_dtype;
    d->accum_steps = c->accum;
    d->adam.lr = c->lr;
    d->adam.weight_decay = c->wd;
    d->clip_norm = c->clip;
    d->scaler.init_scale = c->init_scale;
    d->scaler.window = c->window;
    d->scaler.hysteresis = c->hysteresis;
    d->reduce_bucket_numel = c->bucket;
    d->max_live_numel = c->max_live;
    d->prefetch_depth = c->prefetch;
    d->persist_numel = c->persist;
    d->offload_optimizer = c->offload_opt;
    d->offload_param = c->offload_param;
    d->offload_gradients = c->offload_grad;
    d->sub_group_size = c->sub_group;
    d->host_threads = c->host_threads;
    d->nvme_path = c->nvme_path;
    d->param_read_ahead = c->param_read_ahead;
    d->pin_memory = c->pin_memory;
    d->async_step = c->async_step;
    d->optimizer_dtype = c->opt_dtype;
    d->optimizer_seed = c->opt_seed;
    d->quantized_weights = c->quant_w;
    d->quantized_gradients = c->quant_g;
    d->quantized_gradient_bits = c->quant_bits;
    d->quantized_gradient_levels = c->quant_levels;
    d->quant_block_numel = c->quant_block;
    d->ranks_per_node = c->ranks_per_node;
    d->mics_shard_size = c->mics;
    d->hpz_partition_size = c->hpz;
    d->offload_optimizer_ratio = c->offload_ratio;
    d->delayed_update = c->dpu;
    d->delayed_update_after = c->dpu_after;
}

/* Registers cfg's tensors as "t0", "t1", ... */
static zero_result ec_add_tensors(zero_engine *e, const ec_cfg *c, int *ids)
{
    int t;
    for (t = 0; t < c->ntensors; t++) {
        char name[32];
        zero_result r;
        snprintf(name, sizeof name, "t%d", t);
        r = zero_engine_add_tensor(e, name, c->sizes[t], c->groups[t], c->flags[t], &ids[t]);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}

/* Eight parameter groups on the default model (every tensor its own lr multiplier and weight
   decay pair: 1, 0.1, 3, 0 (does not move), ...; the default decay, explicit ones, an explicit
   0 on a decayed tensor and an explicit decay on a NO_DECAY one), applied after commit. */
static inline void ec_param_groups(ec_cfg *c)
{
    static const double mul[8] = {1.0, 0.1, 3.0, 0.0, 0.5, 2.5, 1.0, 0.25};
    static const double wd[8] = {ZERO_WEIGHT_DECAY_DEFAULT, 0.2, 0.0, ZERO_WEIGHT_DECAY_DEFAULT,
                                 0.3, ZERO_WEIGHT_DECAY_DEFAULT, 0.15, ZERO_WEIGHT_DECAY_DEFAULT};
    int t;
    c->hp_on = 1;
    for (t = 0; t < 8; t++) {
        c->lr_mul[t] = mul[t];
        c->hp_wd[t] = wd[t];
    }
}

/* Applies cfg's per-tensor hyper-parameters (when hp_on) after commit. */
static zero_result ec_set_hparams(zero_engine *e, const ec_cfg *c, const int *ids)
{
    int t;
    for (t = 0; c->hp_on && t < c->ntensors; t++) {
        zero_result r = zero_engine_set_tensor_hparams(e, ids[t], c->lr_mul[t], c->hp_wd[t]);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}

/* Sets every tensor to ec_init_value; tmp holds at least the largest tensor. */
static zero_result ec_set_init(zero_engine *e, const ec_cfg *c, const int *ids, float *tmp)
{
    int t;
    for (t = 0; t < c->ntensors; t++) {
        size_t i;
        zero_result r;
        for (i = 0; i < c->sizes[t]; i++) tmp[i] = ec_init_value(t, i);
        r = zero_engine_set_tensor(e, ids[t], tmp);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}

/* The forward pass of one micro-step: gather and release every group, ascending. */
static zero_result ec_forward(zero_engine *e, int G)
{
    int g;
    void *pp;
    for (g = 0; g < G; g++) {
        zero_result r = zero_engine_gather(e, g, &pp);
        if (r == ZERO_OK) r = zero_engine_release(e, g);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}

/* Writes the scaled synthetic gradients of group g's tensors into gp (group layout, host
   memory) from the gathered params pp, with the configured fault. */
static void ec_fill_grads(const ec_cfg *c, const zero_plan *plan, const int *ids, int g, int rank, int k,
                          int s, float scale, const void *pp, void *gp)
{
    int t;
    for (t = 0; t < c->ntensors; t++) {
        zero_tensor_info ti;
        size_t i;
        if (c->groups[t] != g) continue;
        if (c->flags[t] & ZERO_TENSOR_FROZEN) continue; /* no gradient */
        zero_plan_tensor(plan, ids[t], &ti);
        for (i = 0; i < ti.numel; i++) {
            float p = ec_to_f32(pp, c->dtype, ti.offset + i);
            double gv;
            if (c->virt_world > 0) {
                int vr;
                gv = 0.0;
                for (vr = 0; vr < c->virt_world; vr++)
                    gv += ec_synth_grad(p, vr, k, s, i, t);
                gv /= c->virt_world;
            } else {
                gv = ec_synth_grad(p, rank, k, s, i, t);
            }
            ec_from_f32(gp, c->dtype, ti.offset + i, (float)(gv * scale));
        }
        if (t == 0 && k == 0 && rank == c->fault_rank && ec_is_fault(c, s))
            ec_from_f32(gp, c->dtype, ti.offset, c->fault_inf ? INFINITY : NAN);
    }
}

/* Frozen tensors (ZERO_TENSOR_FROZEN) never change: per rank, the elements of frozen
   tensors whose gathered value differed from their initial value (tests/test_frozen.c). */
static int ec_frozen_bad[EC_MAX_RANKS];

static void ec_check_frozen(const ec_cfg *c, const zero_plan *plan, const int *ids, int g, int rank,
                            const void *pp)
{
    size_t esz = zero_dtype_size(c->dtype);
    int t;
    for (t = 0; t < c->ntensors; t++) {
        zero_tensor_info ti;
        size_t i;
        if (c->groups[t] != g || !(c->flags[t] & ZERO_TENSOR_FROZEN)) continue;
        zero_plan_tensor(plan, ids[t], &ti);
        for (i = 0; i < ti.numel; i++) {
            unsigned char want[4];
            ec_from_f32(want, c->dtype, 0, ec_init_value(t, i));
            if (memcmp((const unsigned char *)pp + (ti.offset + i) * esz, want, esz))
                ec_frozen_bad[rank]++;
        }
    }
}

/* One step's micro-steps (forward, then backward group by group with the synthetic
   gradients of step s at the given loss scale, each group made ready), without the
   optimizer step itself. */
/* qwZ: group g's forward values fwd against its exact (backward) values pp, per block of
   each rank's shard: |fwd - exact| <= s/2 + 2^-16 s + h32 + hT with s = absmax / 127
   rounded up (tests/test_quant.c checks the same bound on the primitives). */
static void ec_qw_compare(const ec_cfg *c, const zero_group_info *gi, const void *fwd,
                          const void *pp)
{
    size_t N = (size_t)c->world, S = gi->shard_numel, B = c->quant_block ? c->quant_block : 256;
    size_t r, k, i;
    double rel = c->dtype == ZERO_F32 ? ldexp(1.0, -24) : c->dtype == ZERO_F16 ? ldexp(1.0, -11)
                                                                              : ldexp(1.0, -8);
    long blocks = 0, bad = 0, diff = 0;
    double worst = 0.0;
    for (r = 0; r < N; r++)
        for (k = 0; k * B < S; k++) {
            size_t i0 = r * S + k * B, len = S - k * B < B ? S - k * B : B;
            double amax = 0.0, sc, bound;
            for (i = i0; i < i0 + len; i++)
                if (fabs((double)ec_to_f32(pp, c->dtype, i)) > amax) amax = fabs((double)ec_to_f32(pp, c->dtype, i));
            sc = amax / 127.0 * (1.0 + ldexp(1.0, -22));
            bound = sc / 2 + sc * ldexp(1.0, -16) + amax * ldexp(1.0, -24) + amax * rel + ldexp(1.0, -24);
            blocks++;
            for (i = i0; i < i0 + len; i++) {
                double x = (double)ec_to_f32(pp, c->dtype, i), y = (double)ec_to_f32(fwd, c->dtype, i);
                if (x != y) diff++;
                if (fabs(x - y) > bound) {
                    bad++;
                    break;
                }
                if (sc > 0 && fabs(x - y) / sc > worst) worst = fabs(x - y) / sc;
            }
        }
    pthread_mutex_lock(&c->qw_stats->mu);
    c->qw_stats->blocks += blocks;
    c->qw_stats->bad_blocks += bad;
    c->qw_stats->differing += diff;
    if (worst > c->qw_stats->max_err_over_scale) c->qw_stats->max_err_over_scale = worst;
    pthread_mutex_unlock(&c->qw_stats->mu);
}

static zero_result ec_micro_steps(const ec_cfg *c, zero_engine *e, const int *ids, int rank,
                                  int s, float scale)
{
    const zero_plan *plan = zero_engine_plan(e);
    int G = zero_plan_num_groups(plan), k, g;
    zero_result r = ZERO_OK;
    void *fwd[64] = {0};
    for (k = 0; k < c->accum; k++) {
        void *pp, *gp;
        if (c->qw_stats && G <= 64) { /* the forward, keeping each group's values */
            for (g = 0; g < G && r == ZERO_OK; g++) {
                zero_group_info gi;
                zero_plan_group(plan, g, &gi);
                EC_TRY(zero_engine_gather(e, g, &pp));
                if (!fwd[g]) fwd[g] = malloc(gi.numel * zero_dtype_size(c->dtype) + 1);
                if (fwd[g]) memcpy(fwd[g], pp, gi.numel * zero_dtype_size(c->dtype));
                EC_TRY(zero_engine_release(e, g));
            }
        } else {
            EC_TRY(ec_forward(e, G));
        }
        for (g = G - 1; g >= 0; g--) {
            zero_group_info gi;
            zero_plan_group(plan, g, &gi);
            EC_TRY(zero_engine_gather(e, g, &pp));
            if (c->qw_stats && G <= 64 && fwd[g]) ec_qw_compare(c, &gi, fwd[g], pp);
            if (gi.frozen_numel) ec_check_frozen(c, plan, ids, g, rank, pp);
            if (gi.frozen_numel == gi.numel) { /* only frozen tensors: no gradient */
                EC_TRY(zero_engine_release(e, g));
                continue;
            }
            EC_TRY(zero_engine_grads(e, g, &gp));
            if (c->stale && g < EC_STALE_G) { /* the delayed update's reference driver */
                size_t bytes = gi.numel * zero_dtype_size(c->dtype);
                ec_stale *st = c->stale;
                if (!st->cur[rank][g]) st->cur[rank][g] = (unsigned char *)malloc(bytes + 1);
                if (!st->prev[rank][g]) st->prev[rank][g] = (unsigned char *)calloc(bytes + 1, 1);
                if (k == 0 && st->cur[rank][g]) memcpy(st->cur[rank][g], pp, bytes);
                ec_fill_grads(c, plan, ids, g, rank, k, s, scale,
                              st->use[rank] && st->prev[rank][g] ? st->prev[rank][g] : pp, gp);
            } else {
                ec_fill_grads(c, plan, ids, g, rank, k, s, scale, pp, gp);
            }
            EC_TRY(zero_engine_release(e, g));
            EC_TRY(zero_engine_grads_ready(e, g));
        }
    }
done:
    for (g = 0; g < 64; g++) free(fwd[g]);
    return r;
}

/* Reads tensor t's master, m, v and params into the result; merges this rank's param
   elements (whole or shard) into res->param[t]: the first holder writes, the others compare. */
static zero_result ec_read_states(zero_engine *e, ec_ctx *ctx, int rank, int t, int id)
{
    const ec_cfg *c = ctx->cfg;
    ec_result *res = ctx->res;
    zero_range rg;
    zero_result r;
    size_t i, esz = zero_dtype_size(c->dtype);
    if (!(c->flags[t] & ZERO_TENSOR_FROZEN)) { /* frozen: params only (master, m, v stay 0) */
        if ((r = zero_engine_read_tensor(e, id, ZERO_STATE_MASTER, res->master[t], &rg)) != ZERO_OK) return r;
        if ((r = zero_engine_read_tensor(e, id, ZERO_STATE_M, res->m[t], &rg)) != ZERO_OK) return r;
        if ((r = zero_engine_read_tensor(e, id, ZERO_STATE_V, res->v[t], &rg)) != ZERO_OK) return r;
    }
    if ((r = zero_engine_read_tensor(e, id, ZERO_STATE_PARAM, ctx->param_rank[rank][t], &rg)) != ZERO_OK)
        return r;
    pthread_mutex_lock(&ctx->mu);
    for (i = rg.offset; i < rg.offset + rg.numel; i++) {
        unsigned char *dst = res->param[t] + i * esz;
        unsigned char *src = ctx->param_rank[rank][t] + i * esz;
        /* param[t] starts as 0xff bytes */
        static const unsigned char ff[4] = {0xff, 0xff, 0xff, 0xff};
        if (memcmp(dst, ff, esz) == 0) memcpy(dst, src, esz);
        else if (memcmp(dst, src, esz) != 0) res->params_agree = 0;
    }
    pthread_mutex_unlock(&ctx->mu);
    return ZERO_OK;
}

static zero_result ec_rank_fn(int rank, zero_comm *comm, void *user)
{
    ec_ctx *ctx = (ec_ctx *)user;
    const ec_cfg *c = ctx->cfg;
    ec_result *res = ctx->res;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T];
    int t, s, g, G = 0;
    float *tmp = NULL;
    ec_wrap wrap;
    const zero_plan *plan;
    if (c->wrap_ops) {
        wrap.base = *comm;
        wrap.base.ops = c->wrap_ops;
        wrap.base.impl = &wrap;
        wrap.inner = comm;
        comm = &wrap.base;
    }
    ec_engine_desc(c, &d);
    {
        zero_host_device_desc hd;
        memset(&hd, 0, sizeof hd);
        hd.capacity = c->device_capacity;
        EC_TRY(zero_host_device_create(&hd, &dev));
    }
    d.device = dev;
    d.comm = comm;
    if (rank < EC_MAX_RANKS && c->rpn_rank[rank]) d.ranks_per_node = c->rpn_rank[rank];
    if (rank < EC_MAX_RANKS && c->mics_rank[rank]) d.mics_shard_size = c->mics_rank[rank];
    if (rank < EC_MAX_RANKS && c->hpz_rank[rank]) d.hpz_partition_size = c->hpz_rank[rank];
    EC_TRY(zero_engine_create(&d, &e));
    EC_TRY(ec_add_tensors(e, c, ids));
    EC_TRY(zero_engine_commit(e));
    EC_TRY(ec_set_hparams(e, c, ids));
    plan = zero_engine_plan(e);
    G = zero_plan_num_groups(plan);
    if (rank == 0) {
        res->plan_total = zero_plan_total_numel(plan);
        res->ngroups = G;
        res->plan_shard_total = res->max_group = res->max_np_group = res->persist_total = 0;
        res->max_group2 = 0;
        for (g = 0; g < G; g++) {
            zero_group_info gi;
            zero_plan_group(plan, g, &gi);
            res->plan_shard_total += gi.shard_numel;
            res->frozen_total += gi.frozen_numel;
            if (gi.numel > res->max_group) {
                res->max_group2 = res->max_group;
                res->max_group = gi.numel;
            } else if (gi.numel > res->max_group2) {
                res->max_group2 = gi.numel;
            }
            if (c->stage == 3 && gi.persistent) res->persist_total += gi.numel;
            else if (gi.numel > res->max_np_group) res->max_np_group = gi.numel;
        }
        if (G == 1) res->max_group2 = res->max_group;
    }
    {
        size_t mx = 1;
        for (t = 0; t < c->ntensors; t++)
            if (c->sizes[t] > mx) mx = c->sizes[t];
        tmp = (float *)malloc(mx * sizeof(float));
    }
    EC_TRY(ec_set_init(e, c, ids, tmp));
    for (s = 0; s < c->steps; s++) {
        zero_step_info info;
        zero_gather_stats gs = {0};
        float scale = zero_engine_loss_scale(e); /* async_step: completes step s - 1 */
        if (rank == 0) res->loss_scale_before[s] = scale;
        if (c->async_step && s > 0) EC_TRY(zero_engine_last_step(e, &res->info[rank][s - 1]));
        if (c->states_what && s == c->states_at) { /* between phases: off the device and back */
            int k;
            for (k = 0; k < 3; k++) zero_engine_memory_tier(e, (zero_mem_tier)k, &res->states_mem[rank][0][k]);
            EC_TRY(zero_engine_offload_states(e, c->states_what, c->states_tier));
            for (k = 0; k < 3; k++) zero_engine_memory_tier(e, (zero_mem_tier)k, &res->states_mem[rank][1][k]);
            {
                void *p = NULL;
                res->states_refused[rank] = zero_engine_gather(e, 0, &p);
            }
            EC_TRY(zero_engine_reload_states(e));
            for (k = 0; k < 3; k++) zero_engine_memory_tier(e, (zero_mem_tier)k, &res->states_mem[rank][2][k]);
        }
        EC_TRY(ec_micro_steps(c, e, ids, rank, s, scale));
        EC_TRY(zero_engine_step(e, c->async_step ? NULL : &info));
        if (!c->async_step) res->info[rank][s] = info;
        if (c->stale) { /* the next step sees this one's view when its update was delayed */
            ec_stale *st = c->stale;
            for (g = 0; g < G && g < EC_STALE_G; g++) {
                unsigned char *x = st->prev[rank][g];
                st->prev[rank][g] = st->cur[rank][g];
                st->cur[rank][g] = x;
            }
            st->use[rank] = info.step - (info.skipped ? 0 : 1) >= c->stale_after;
        }
        zero_engine_traffic(e, &res->traffic_last[rank][s], NULL);
        zero_engine_gather_stats(e, &gs);
        pthread_mutex_lock(&ctx->mu);
        if (gs.live_numel > res->live_after_step_max) res->live_after_step_max = gs.live_numel;
        pthread_mutex_unlock(&ctx->mu);
    }
    if (c->async_step && c->steps > 0) EC_TRY(zero_engine_last_step(e, &res->info[rank][c->steps - 1]));
    if (c->dpu && !c->dpu_no_finish) EC_TRY(zero_engine_finish_update(e));
    zero_engine_memory_usage(e, &res->mem[rank]);
    zero_engine_memory_tier(e, ZERO_TIER_HOST, &res->host_mem[rank]);
    zero_engine_memory_tier(e, ZERO_TIER_NVME, &res->nvme_mem[rank]);
    zero_engine_gather_stats(e, &res->gstats[rank]);
    for (t = 0; t < c->ntensors; t++) EC_TRY(ec_read_states(e, ctx, rank, t, ids[t]));
done:
    if (r != ZERO_OK && rank == 0) snprintf(res->err, sizeof res->err, "%s", zero_last_error());
    free(tmp);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

static inline void ec_result_free(ec_result *res)
{
    int t;
    for (t = 0; t < EC_MAX_T; t++) {
        free(res->master[t]);
        free(res->m[t]);
        free(res->v[t]);
        free(res->param[t]);
    }
    free(res);
}

/* Runs cfg with fn as each rank's body on zero_local_run; ctx (zeroed by the caller) is
   fn's state or its first member, user is what fn receives. The result is heap-allocated
   (free with ec_result_free). */
static inline ec_result *ec_run_with(const ec_cfg *c, ec_ctx *ctx,
                                     zero_result (*fn)(int rank, zero_comm *comm, void *user), void *user)
{
    ec_result *res = (ec_result *)calloc(1, sizeof *res);
    int t, rk;
    ctx->cfg = c;
    ctx->res = res;
    pthread_mutex_init(&ctx->mu, NULL);
    res->params_agree = 1;
    for (t = 0; t < c->ntensors; t++) {
        size_t n = c->sizes[t];
        res->master[t] = (float *)calloc(n, 4);
        res->m[t] = (float *)calloc(n, 4);
        res->v[t] = (float *)calloc(n, 4);
        res->param[t] = (unsigned char *)malloc(n * 4);
        memset(res->param[t], 0xff, n * 4);
        for (rk = 0; rk < c->world; rk++) ctx->param_rank[rk][t] = (unsigned char *)calloc(n, 4);
    }
    res->rc = zero_local_run(c->world, fn, user);
    if (res->rc != ZERO_OK && !res->err[0])
        snprintf(res->err, sizeof res->err, "%s", zero_last_error());
    for (t = 0; t < c->ntensors; t++)
        for (rk = 0; rk < c->world; rk++) free(ctx->param_rank[rk][t]);
    pthread_mutex_destroy(&ctx->mu);
    return res;
}

/* A run in pieces (checkpoint tests): steps first..last-1 (the synthetic gradients of those
   step numbers), after loading load_dir (else from the initial values and cfg's per-tensor
   hyper-parameters), saving into save_dir at the end; after_load (optional) looks at the
   loaded engine on each rank. */
typedef struct ec_job {
    ec_ctx ctx; /* first: ec_run_with hands it to the rank function */
    const char *save_dir, *load_dir;
    int first, last;
    zero_result (*after_load)(struct ec_job *job, zero_engine *e, const int *ids);
    int checked; /* for after_load: ranks whose check passed */
    int finish;  /* zero_engine_finish_update before reading the states (delayed_update) */
} ec_job;

static zero_result ec_job_rank(int rank, zero_comm *comm, void *user)
{
    ec_job *job = (ec_job *)user;
    const ec_cfg *c = job->ctx.cfg;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T], t, s;
    float *tmp = NULL;
    size_t mx = 1;
    for (t = 0; t < c->ntensors; t++)
        if (c->sizes[t] > mx) mx = c->sizes[t];
    tmp = (float *)malloc(mx * sizeof(float));
    ec_engine_desc(c, &d);
    EC_TRY(zero_host_device_create(NULL, &dev));
    d.device = dev;
    d.comm = comm;
    EC_TRY(zero_engine_create(&d, &e));
    EC_TRY(ec_add_tensors(e, c, ids));
    EC_TRY(zero_engine_commit(e));
    if (job->load_dir) {
        EC_TRY(zero_engine_load(e, job->load_dir));
        if (job->after_load) EC_TRY(job->after_load(job, e, ids));
    } else {
        EC_TRY(ec_set_hparams(e, c, ids));
        EC_TRY(ec_set_init(e, c, ids, tmp));
    }
    for (s = job->first; s < job->last; s++) {
        EC_TRY(ec_micro_steps(c, e, ids, rank, s, zero_engine_loss_scale(e)));
        EC_TRY(zero_engine_step(e, NULL));
    }
    if (job->save_dir) EC_TRY(zero_engine_save(e, job->save_dir));
    if (job->finish) EC_TRY(zero_engine_finish_update(e));
    for (t = 0; t < c->ntensors; t++) EC_TRY(ec_read_states(e, &job->ctx, rank, t, ids[t]));
done:
    if (r != ZERO_OK && rank == 0)
        snprintf(job->ctx.res->err, sizeof job->ctx.res->err, "%s", zero_last_error());
    free(tmp);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* Runs job (its ctx zeroed by the caller) for cfg; the result as ec_run's. */
static inline ec_result *ec_run_job(const ec_cfg *c, ec_job *job)
{
    return ec_run_with(c, &job->ctx, ec_job_rank, job);
}

/* Runs cfg on the host device; the result is heap-allocated (free with ec_result_free). */
static inline ec_result *ec_run(const ec_cfg *c)
{
    ec_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    return ec_run_with(c, &ctx, ec_rank_fn, &ctx);
}

/* 1 when a and b hold the same bits for every tensor's master, m, v and params. */
static inline int ec_same_state(const ec_cfg *c, const ec_result *a, const ec_result *b, char *why,
                         size_t whylen)
{
    int t;
    size_t esz = zero_dtype_size(c->dtype);
    for (t = 0; t < c->ntensors; t++) {
        size_t n = c->sizes[t], i;
        const char *what = NULL;
        const unsigned char *x = NULL, *y = NULL;
        size_t w = 4;
        if (memcmp(a->master[t], b->master[t], n * 4)) what = "master", x = (const unsigned char *)a->master[t], y = (const unsigned char *)b->master[t];
        else if (memcmp(a->m[t], b->m[t], n * 4)) what = "m", x = (const unsigned char *)a->m[t], y = (const unsigned char *)b->m[t];
        else if (memcmp(a->v[t], b->v[t], n * 4)) what = "v", x = (const unsigned char *)a->v[t], y = (const unsigned char *)b->v[t];
        else if (memcmp(a->param[t], b->param[t], n * esz)) what = "param", x = a->param[t], y = b->param[t], w = esz;
        if (what) {
            for (i = 0; i < n; i++)
                if (memcmp(x + i * w, y + i * w, w)) break;
            snprintf(why, whylen, "tensor %d %s element %zu differs", t, what, i);
            return 0;
        }
    }
    return 1;
}
#endif

/* ---- a pass-through comm wrapper: counts group calls, can fail the n-th collective ------ */
#ifndef EC_WRAP_IMPL
#define EC_WRAP_IMPL
static pthread_mutex_t ec_wrap_mu = PTHREAD_MUTEX_INITIALIZER;
static int ec_wrap_group_calls;     /* group_start calls, over all ranks */
static int ec_wrap_in_group[EC_MAX_RANKS];
static int ec_wrap_grouped_colls;   /* collectives issued inside a group, over all ranks */
static int ec_wrap_fail_at = -1;    /* fail the n-th collective (0-based) of every rank */
static int ec_wrap_seq[EC_MAX_RANKS];
/* The engine's tags seen by the wrapper (forwarded to the inner comm): collectives without a
   role, and tags whose seq did not follow the rank's previous one. */
static int ec_wrap_untagged;
static int ec_wrap_seq_breaks;
static long long ec_wrap_last_tag_seq[EC_MAX_RANKS];

static zero_comm *ec_inner(zero_comm *c) { return ((ec_wrap *)c->impl)->inner; }

static zero_result ec_wrap_count(zero_comm *c)
{
    zero_result r = ZERO_OK;
    pthread_mutex_lock(&ec_wrap_mu);
    ec_inner(c)->tag = c->tag;
    if (c->tag.role == 0) ec_wrap_untagged++;
    if ((long long)c->tag.seq != ec_wrap_last_tag_seq[c->rank] + 1) ec_wrap_seq_breaks++;
    ec_wrap_last_tag_seq[c->rank] = (long long)c->tag.seq;
    if (ec_wrap_in_group[c->rank]) ec_wrap_grouped_colls++;
    if (ec_wrap_seq[c->rank]++ == ec_wrap_fail_at) r = ZERO_ERROR_COMM;
    pthread_mutex_unlock(&ec_wrap_mu);
#if defined(ZERO_IMPLEMENTATION) /* the message: zero__fail, or zt_fail for a linked test */
    if (r != ZERO_OK) return zero__fail(r, "ec_wrap: injected failure");
#elif defined(ZT_PRIVATE_H)
    if (r != ZERO_OK) return zt_fail(r, "ec_wrap: injected failure");
#endif
    return r;
}

static inline void ec_wrap_reset(int fail_at)
{
    int i;
    ec_wrap_group_calls = ec_wrap_grouped_colls = 0;
    for (i = 0; i < EC_MAX_RANKS; i++) ec_wrap_in_group[i] = ec_wrap_seq[i] = 0;
    ec_wrap_untagged = ec_wrap_seq_breaks = 0;
    for (i = 0; i < EC_MAX_RANKS; i++) ec_wrap_last_tag_seq[i] = -1;
    ec_wrap_fail_at = fail_at;
}

static void ec_wrap_destroy(zero_comm *c) { (void)c; }
static zero_result ec_wrap_ag(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, void *q)
{
    zero_result x = ec_wrap_count(c);
    return x ? x : ec_inner(c)->ops->all_gather(ec_inner(c), s, r, n, d, q);
}
static zero_result ec_wrap_a2a(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d, void *q)
{
    zero_result x = ec_wrap_count(c);
    if (x) return x;
    return ec_inner(c)->ops->all_to_all ? ec_inner(c)->ops->all_to_all(ec_inner(c), s, r, n, d, q)
                                        : ZERO_ERROR_UNSUPPORTED;
}
static zero_result ec_wrap_rs(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d,
                              zero_op op, void *q)
{
    zero_result x = ec_wrap_count(c);
    return x ? x : ec_inner(c)->ops->reduce_scatter(ec_inner(c), s, r, n, d, op, q);
}
static zero_result ec_wrap_ar(zero_comm *c, const void *s, void *r, size_t n, zero_dtype d,
                              zero_op op, void *q)
{
    zero_result x = ec_wrap_count(c);
    return x ? x : ec_inner(c)->ops->all_reduce(ec_inner(c), s, r, n, d, op, q);
}
static zero_result ec_wrap_bc(zero_comm *c, void *b, size_t n, zero_dtype d, int root, void *q)
{
    zero_result x = ec_wrap_count(c);
    return x ? x : ec_inner(c)->ops->broadcast(ec_inner(c), b, n, d, root, q);
}
static zero_result ec_wrap_barrier(zero_comm *c) { return ec_inner(c)->ops->barrier(ec_inner(c)); }
static zero_result ec_wrap_gs(zero_comm *c)
{
    pthread_mutex_lock(&ec_wrap_mu);
    ec_wrap_group_calls++;
    ec_wrap_in_group[c->rank] = 1;
    pthread_mutex_unlock(&ec_wrap_mu);
    return ZERO_OK;
}
static zero_result ec_wrap_ge(zero_comm *c)
{
    pthread_mutex_lock(&ec_wrap_mu);
    ec_wrap_in_group[c->rank] = 0;
    pthread_mutex_unlock(&ec_wrap_mu);
    return ZERO_OK;
}
static zero_comm_ops ec_wrap_ops __attribute__((unused)) = {"wrap", ec_wrap_destroy, ec_wrap_ag, ec_wrap_rs, ec_wrap_ar,
                                    ec_wrap_bc, ec_wrap_barrier, ec_wrap_gs, ec_wrap_ge,
                                    ec_wrap_a2a, NULL};
#endif

/* ---- the stage-equivalence check every engine test uses (needs tests/zt.h first) ---------- */
#if defined(ZT_H) && !defined(EC_CHECK_IMPL)
#define EC_CHECK_IMPL
/* Runs stages 0-3 of one configuration and checks each against stage 0, bit for bit:
   master, m, v and params of every tensor, every rank's step info. */
static inline void ec_check_stages_identical(ec_cfg *c, const char *label)
{
    ec_result *ref = NULL;
    int st, rk, s;
    for (st = 0; st <= 3; st++) {
        ec_result *r;
        char why[160];
        c->stage = st;
        r = ec_run(c);
        ZT_CHECKF(r->rc == ZERO_OK, "%s stage %d: %s", label, st, r->err);
        ZT_CHECKF(r->params_agree, "%s stage %d: ranks hold different params", label, st);
        for (s = 0; s < c->steps && r->rc == ZERO_OK; s++)
            for (rk = 1; rk < c->world; rk++)
                ZT_CHECKF(memcmp(&r->info[rk][s], &r->info[0][s], sizeof r->info[0][s]) == 0,
                          "%s stage %d step %d: rank %d's step info differs", label, st, s, rk);
        if (r->rc == ZERO_OK && c->steps > 0)
            ZT_CHECKF(r->info[0][c->steps - 1].step == c->steps, "%s stage %d: %lld steps", label,
                      st, (long long)r->info[0][c->steps - 1].step);
        if (!ref) {
            ref = r;
            continue;
        }
        if (r->rc == ZERO_OK && ref->rc == ZERO_OK) {
            ZT_CHECKF(ec_same_state(c, ref, r, why, sizeof why), "%s: stage %d vs 0: %s", label,
                      st, why);
            for (s = 0; s < c->steps; s++)
                ZT_CHECKF(r->info[0][s].grad_norm == ref->info[0][s].grad_norm,
                          "%s: stage %d step %d: norm %.9g vs %.9g", label, st, s,
                          (double)r->info[0][s].grad_norm, (double)ref->info[0][s].grad_norm);
        }
        ec_result_free(r);
    }
    ec_result_free(ref);
}
/* A commit across ranks that may disagree: each of 'ranks' local ranks (threads) creates a
   host-device engine from a zeroed descriptor that set(rank, &d) fills (device and comm are
   filled in here), registers one tensor "w" of 1000 elements and commits. Returns the
   commit's result (the same on every rank: MISMATCH when they disagree) and rank 0's
   zero_last_error() in msg. */
typedef void (*ec_desc_fn)(int rank, zero_engine_desc *d);
typedef struct ec_commit_job {
    ec_desc_fn set;
    char *msg;
    size_t n;
} ec_commit_job;

static zero_result ec_commit_rank(int rank, zero_comm *comm, void *user)
{
    const ec_commit_job *job = (const ec_commit_job *)user;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL;
    zero_result r;
    int id = -1;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    job->set(rank, &d);
    d.device = dev;
    d.comm = comm;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_add_tensor(e, "w", 1000, 0, 0, &id) == ZERO_OK);
    r = zero_engine_commit(e);
    if (rank == 0) snprintf(job->msg, job->n, "%s", zero_last_error());
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

static inline zero_result ec_commit_disagreeing(int ranks, ec_desc_fn set, char *msg, size_t n)
{
    ec_commit_job job;
    job.set = set, job.msg = msg, job.n = n;
    msg[0] = '\0';
    return zero_local_run(ranks, ec_commit_rank, &job);
}
#endif
