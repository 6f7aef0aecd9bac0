/* The engine on the GPU: the same engine, the same model and synthetic gradients as the
   CPU engine tests (tests/engine_common.h), run over the CUDA device and the device comm
   (N ranks as threads on one GPU). Stages 0-3 give bit-identical master weights, moments,
   params and step info at the same N, and equal the host-device run bit for bit (the
   kernels, the reduction order and the sum of squares all match the host's), with
   clipping, accumulation, fp16 and bf16, and a skipped (NaN) step. The engine's memory on
   the GPU is one arena per rank: no cudaMalloc after commit.
   Without a GPU it prints one skip line and exits 0. */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "tests/zt.h"
#include "tests/cuda/gpu_probe.h"
/* engine_common.h is C; as C++ its "= {0}" initialisers draw -Wmissing-field-initializers */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include "tests/engine_common.h"
#pragma GCC diagnostic pop
#include "tests/nvme_dir.h"

#define NTESTS 7

/* ec_rank_fn with the device chosen and every param read / gradient write done through the
   device's download / upload on the compute queue (the engine hands out device pointers);
   the descriptor, tensors, initial values, gradients and state read-back are
   engine_common.h's. */
typedef struct cu_ctx {
    ec_ctx base;
    int use_cuda;
    unsigned long long mallocs_after_commit[EC_MAX_RANKS], mallocs_at_end[EC_MAX_RANKS];
    size_t fallback_bytes[EC_MAX_RANKS];
} cu_ctx;

static zero_result cu_rank_fn(int rank, zero_comm *host_comm, void *user)
{
    cu_ctx *cx = (cu_ctx *)user;
    const ec_cfg *c = cx->base.cfg;
    ec_result *res = cx->base.res;
    zero_device *dev = NULL;
    zero_comm *dcomm = NULL, *comm = host_comm;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T], t, s, k, g, G = 0;
    const zero_plan *plan;
    size_t es = zero_dtype_size(c->dtype), maxg = 1;
    unsigned char *hp = NULL, *hg = NULL;
    float *tmp = NULL;
    ec_engine_desc(c, &d);
    if (cx->use_cuda) {
        EC_TRY(zero_cuda_device_create(NULL, &dev));
        EC_TRY(zero_cuda_local_comm_create(host_comm, dev, &dcomm));
        comm = dcomm;
    } else {
        EC_TRY(zero_host_device_create(NULL, &dev));
    }
    d.device = dev;
    d.comm = comm;
    EC_TRY(zero_engine_create(&d, &e));
    EC_TRY(ec_add_tensors(e, c, ids));
    EC_TRY(zero_engine_commit(e));
    EC_TRY(ec_set_hparams(e, c, ids));
    if (cx->use_cuda) {
        zero_cuda_stats st;
        EC_TRY(zero_cuda_device_stats(dev, &st));
        cx->mallocs_after_commit[rank] = st.cuda_mallocs;
        cx->fallback_bytes[rank] = st.fallback_bytes;
    }
    plan = zero_engine_plan(e);
    G = zero_plan_num_groups(plan);
    for (g = 0; g < G; g++) {
        zero_group_info gi;
        zero_plan_group(plan, g, &gi);
        if (gi.numel > maxg) maxg = gi.numel;
    }
    hp = (unsigned char *)malloc(maxg * es);
    hg = (unsigned char *)malloc(maxg * es);
    tmp = (float *)malloc(maxg * sizeof(float));
    EC_TRY(ec_set_init(e, c, ids, tmp));
    for (s = 0; s < c->steps; s++) {
        zero_step_info info;
        float scale = zero_engine_loss_scale(e);
        if (c->states_what && s == c->states_at) { /* between phases: off the GPU and back */
            zero_engine_memory m0, m1;
            void *pp = NULL;
            EC_TRY(zero_engine_memory_usage(e, &m0));
            EC_TRY(zero_engine_offload_states(e, c->states_what, c->states_tier));
            EC_TRY(zero_engine_memory_usage(e, &m1));
            res->states_mem[rank][0][0] = m0;
            res->states_mem[rank][1][0] = m1;
            res->states_refused[rank] = zero_engine_gather(e, 0, &pp);
            EC_TRY(zero_engine_reload_states(e));
        }
        for (k = 0; k < c->accum; k++) {
            void *pp, *gp;
            EC_TRY(ec_forward(e, G));
            for (g = G - 1; g >= 0; g--) {
                zero_group_info gi;
                zero_plan_group(plan, g, &gi);
                EC_TRY(zero_engine_gather(e, g, &pp));
                EC_TRY(zero_engine_grads(e, g, &gp));
                EC_TRY(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, hp, pp, gi.numel * es));
                EC_TRY(dev->ops->sync(dev, ZERO_QUEUE_COMPUTE));
                memset(hg, 0, gi.numel * es); /* padding stays zero */
                ec_fill_grads(c, plan, ids, g, rank, k, s, scale, hp, hg);
                EC_TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, gp, hg, gi.numel * es));
                EC_TRY(zero_engine_release(e, g));
                EC_TRY(zero_engine_grads_ready(e, g));
            }
        }
        EC_TRY(zero_engine_step(e, &info));
        res->info[rank][s] = info;
    }
    if (cx->use_cuda) {
        zero_cuda_stats st;
        EC_TRY(zero_cuda_device_stats(dev, &st));
        cx->mallocs_at_end[rank] = st.cuda_mallocs;
    }
    for (t = 0; t < c->ntensors; t++) EC_TRY(ec_read_states(e, &cx->base, rank, t, ids[t]));
done:
    if (r != ZERO_OK) {
        pthread_mutex_lock(&cx->base.mu);
        if (!res->err[0]) snprintf(res->err, sizeof res->err, "rank %d: %.480s", rank, zero_last_error());
        pthread_mutex_unlock(&cx->base.mu);
    }
    free(tmp);
    free(hp);
    free(hg);
    zero_engine_destroy(e);
    zero_comm_destroy(dcomm);
    zero_device_destroy(dev);
    return r;
}

/* ec_run with cu_rank_fn; cx receives the allocation counters. */
static ec_result *cu_run(const ec_cfg *c, int use_cuda, cu_ctx *cx)
{
    memset(cx, 0, sizeof *cx);
    cx->use_cuda = use_cuda;
    return ec_run_with(c, &cx->base, cu_rank_fn, cx);
}

/* CUDA stages 0-3 against CUDA stage 0, and CUDA stage 0 against the host device. */
static void check_config(ec_cfg *c, const char *label)
{
    ec_result *host, *ref = NULL;
    cu_ctx cx;
    char why[160];
    int st, rk, s;
    c->stage = 0;
    host = cu_run(c, 0, &cx);
    ZT_CHECKF(host->rc == ZERO_OK, "%s host: %s", label, host->err);
    for (st = 0; st <= 3; st++) {
        ec_result *r;
        c->stage = st;
        r = cu_run(c, 1, &cx);
        ZT_CHECKF(r->rc == ZERO_OK, "%s cuda stage %d: %s", label, st, r->err);
        ZT_CHECKF(r->params_agree, "%s cuda stage %d: ranks hold different params", label, st);
        for (rk = 0; rk < c->world; rk++) {
            ZT_CHECKF(cx.fallback_bytes[rk] == 0, "%s stage %d rank %d: %zu bytes outside the arena", label, st, rk,
                      cx.fallback_bytes[rk]);
            ZT_CHECKF(cx.mallocs_at_end[rk] == cx.mallocs_after_commit[rk],
                      "%s stage %d rank %d: cudaMalloc on the training path (%llu -> %llu)", label, st, rk,
                      cx.mallocs_after_commit[rk], cx.mallocs_at_end[rk]);
        }
        for (s = 0; s < c->steps && r->rc == ZERO_OK; s++)
            for (rk = 1; rk < c->world; rk++)
                ZT_CHECKF(memcmp(&r->info[rk][s], &r->info[0][s], sizeof r->info[0][s]) == 0,
                          "%s stage %d step %d: rank %d's step info differs", label, st, s, rk);
        if (st == 0 && r->rc == ZERO_OK && host->rc == ZERO_OK) {
            ZT_CHECKF(ec_same_state(c, host, r, why, sizeof why), "%s: cuda vs host: %s", label, why);
            for (s = 0; s < c->steps; s++)
                ZT_CHECKF(memcmp(&r->info[0][s], &host->info[0][s], sizeof r->info[0][s]) == 0,
                          "%s step %d: cuda vs host step info (norm %.9g vs %.9g, mul %.9g vs %.9g)", label, s,
                          (double)r->info[0][s].grad_norm, (double)host->info[0][s].grad_norm,
                          (double)r->info[0][s].grad_mul, (double)host->info[0][s].grad_mul);
        }
        if (!ref) {
            ref = r;
            continue;
        }
        if (r->rc == ZERO_OK && ref->rc == ZERO_OK)
            ZT_CHECKF(ec_same_state(c, ref, r, why, sizeof why), "%s: cuda stage %d vs 0: %s", label, st, why);
        ec_result_free(r);
    }
    ec_result_free(ref);
    ec_result_free(host);
}

ZT_TEST(test_stages_equal_and_equal_host)
{
    static const int worlds_full[] = {1, 2, 3, 4, 8}, worlds_quick[] = {1, 3};
    const int *worlds = zt_quick() ? worlds_quick : worlds_full;
    int nw = zt_quick() ? 2 : 5, wi, di, ai;
    const zero_dtype dts[] = {ZERO_F16, ZERO_BF16};
    const int accums[] = {1, 3};
    for (wi = 0; wi < nw; wi++)
        for (di = 0; di < 2; di++)
            for (ai = 0; ai < 2; ai++) {
                ec_cfg c;
                char label[96];
                ec_cfg_init(&c, 0, worlds[wi], dts[di], accums[ai], 6);
                c.persist = 20;
                c.clip = 0.5f; /* clipping on some steps: the norm must match the host's */
                snprintf(label, sizeof label, "N=%d %s accum=%d", worlds[wi], zero_dtype_name(dts[di]), accums[ai]);
                check_config(&c, label);
                if (zt_cur_failures) return;
            }
}

ZT_TEST(test_fp32_comm_and_skip)
{
    ec_cfg c;
    ec_cfg_init(&c, 0, 3, ZERO_F16, 2, 6);
    c.comm_dtype = ZERO_F32;
    check_config(&c, "N=3 f16 comm f32");
    ec_cfg_init(&c, 0, 2, ZERO_F16, 1, 6);
    c.fault_rank = 1;
    c.fault_steps[0] = 2;
    c.fault_steps[1] = 3;
    c.nfault = 2;
    check_config(&c, "N=2 f16 NaN at steps 2, 3");
    ec_cfg_init(&c, 0, 2, ZERO_F32, 1, 4);
    c.fault_rank = 0;
    c.fault_inf = 1;
    c.fault_steps[0] = 1;
    c.nfault = 1;
    check_config(&c, "N=2 f32 inf at step 1");
}

/* A larger model (tensors of 10^5..10^6 elements, more than one sumsq block per shard) so
   the vector paths and the two-pass sum carry real weight. */
ZT_TEST(test_larger_model)
{
    ec_cfg c;
    if (zt_quick()) ZT_SKIP("ZT_QUICK");
    ec_cfg_init(&c, 0, 4, ZERO_BF16, 2, 3);
    c.ntensors = 4;
    c.sizes[0] = 1000003;
    c.sizes[1] = 4099;
    c.sizes[2] = 262147;
    c.sizes[3] = 77;
    c.groups[0] = 0;
    c.groups[1] = 0;
    c.groups[2] = 1;
    c.groups[3] = 1;
    c.flags[0] = c.flags[2] = 0;
    c.flags[1] = c.flags[3] = ZERO_TENSOR_NO_DECAY;
    c.clip = 1.0f;
    check_config(&c, "N=4 bf16 1.3M params");
}

/* ZeRO-Offload on the GPU: master, m, v in pinned host memory (the device's host_alloc),
   gradient tiles down on the OFFLOAD stream, the host Adam, param tiles up; at stage 3 also
   the param shards on the host. The same bits as the plain CUDA run. */
ZT_TEST(test_offload_equals_plain)
{
    int st, par;
    for (st = 1; st <= 3; st++)
        for (par = 0; par <= (st == 3); par++) {
            ec_cfg c;
            cu_ctx cx;
            ec_result *ref, *off;
            char why[160];
            ec_cfg_init(&c, st, 2, ZERO_F16, 2, 4);
            c.clip = 0.5f;
            c.sub_group = 37; /* many tiles: the staging tiles are reused */
            c.pin_memory = 1; /* cudaHostAlloc through the device's host_alloc */
            ref = cu_run(&c, 1, &cx);
            c.offload_opt = ZERO_OFFLOAD_CPU;
            c.offload_param = par ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
            off = cu_run(&c, 1, &cx);
            ZT_CHECKF(ref->rc == ZERO_OK && off->rc == ZERO_OK, "stage %d: %s %s", st, ref->err, off->err);
            if (ref->rc == ZERO_OK && off->rc == ZERO_OK)
                ZT_CHECKF(ec_same_state(&c, ref, off, why, sizeof why), "stage %d param %d: %s", st, par, why);
            ec_result_free(ref);
            ec_result_free(off);
        }
}

/* ZeRO-Infinity on the GPU: master, m, v (and at stage 3 the param shards) on NVMe through
   pinned staging, against the host device running the same configuration, and against the
   plain CUDA run: bit for bit, every step's info included. */
ZT_TEST(test_offload_nvme_equals_host)
{
    static const int worlds[] = {1, 2, 3};
    char dir[64];
    int wi, st;
    if (!nd_make_dir(dir, sizeof dir, "cuda-nvme")) ZT_SKIP("no temporary directory");
    for (wi = 0; wi < 3; wi++)
        for (st = 1; st <= 3; st += 2) {
            ec_cfg c;
            cu_ctx cx;
            ec_result *host, *cuda, *plain;
            char why[160];
            int s, rk;
            ec_cfg_init(&c, st, worlds[wi], wi == 1 ? ZERO_BF16 : ZERO_F16, wi == 2 ? 3 : 1, 4);
            c.clip = 0.5f;
            c.sub_group = 37;
            c.pin_memory = 1;
            plain = cu_run(&c, 1, &cx);
            c.offload_opt = ZERO_OFFLOAD_NVME;
            c.offload_param = st == 3 ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_NONE;
            c.nvme_path = dir;
            host = cu_run(&c, 0, &cx);
            cuda = cu_run(&c, 1, &cx);
            ZT_CHECKF(host->rc == ZERO_OK && cuda->rc == ZERO_OK && plain->rc == ZERO_OK, "N=%d stage %d: %s %s %s",
                      worlds[wi], st, host->err, cuda->err, plain->err);
            if (host->rc == ZERO_OK && cuda->rc == ZERO_OK && plain->rc == ZERO_OK) {
                ZT_CHECKF(ec_same_state(&c, host, cuda, why, sizeof why), "N=%d stage %d nvme: cuda vs host: %s",
                          worlds[wi], st, why);
                ZT_CHECKF(ec_same_state(&c, plain, cuda, why, sizeof why), "N=%d stage %d: nvme vs plain: %s",
                          worlds[wi], st, why);
                for (s = 0; s < c.steps; s++)
                    for (rk = 0; rk < c.world; rk++)
                        ZT_CHECKF(memcmp(&cuda->info[rk][s], &host->info[rk][s], sizeof host->info[rk][s]) == 0,
                                  "N=%d stage %d step %d rank %d: step info differs from the host's", worlds[wi], st,
                                  s, rk);
            }
            ec_result_free(host);
            ec_result_free(cuda);
            ec_result_free(plain);
        }
    ZT_CHECKF(nd_dir_is_empty(dir), "%s: files left behind", dir);
    rmdir(dir);
}

/* Partial offload (offload_optimizer_ratio: the device part's Adam is the fused CUDA
   kernel, the host part's the host Adam) and zero_engine_offload_states / _reload_states
   in the middle of the run (every state to pinned-less host memory and to NVMe, through
   the device's free / alloc / download / upload): the plain CUDA run's bits. */
ZT_TEST(test_offload_ratio_and_states)
{
    char dir[64];
    int st, v;
    if (!nd_make_dir(dir, sizeof dir, "cuda-states")) ZT_SKIP("no temporary directory");
    for (st = 0; st <= 3; st++)
        for (v = 0; v < 3; v++) {
            ec_cfg c;
            cu_ctx cx;
            ec_result *ref, *got;
            char why[160];
            int rk;
            if (st == 0 && v == 0) continue; /* no offload at stage 0 */
            ec_cfg_init(&c, st, 2, ZERO_F16, 2, 4);
            c.clip = 0.5f;
            c.sub_group = 37;
            c.pin_memory = 1;
            c.nvme_path = dir;
            ref = cu_run(&c, 1, &cx);
            if (v == 0) {
                c.offload_opt = ZERO_OFFLOAD_CPU;
                c.offload_ratio = 0.4;
            } else {
                c.states_what = ZERO_STATES_ALL;
                c.states_tier = v == 1 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NVME;
                c.states_at = 2;
            }
            got = cu_run(&c, 1, &cx);
            ZT_CHECKF(ref->rc == ZERO_OK && got->rc == ZERO_OK, "stage %d v %d: %s %s", st, v, ref->err, got->err);
            if (ref->rc == ZERO_OK && got->rc == ZERO_OK) {
                ZT_CHECKF(ec_same_state(&c, ref, got, why, sizeof why), "stage %d v %d: %s", st, v, why);
                for (rk = 0; v > 0 && rk < 2; rk++) {
                    const zero_engine_memory *m0 = &got->states_mem[rk][0][0], *m1 = &got->states_mem[rk][1][0];
                    ZT_CHECK(got->states_refused[rk] == ZERO_ERROR_INVALID_STATE);
                    ZT_CHECKF(m1->total_bytes == m0->total_bytes - m0->bytes[ZERO_MEM_PARAM] - m0->bytes[ZERO_MEM_GRAD] -
                                                     m0->bytes[ZERO_MEM_MASTER] - m0->bytes[ZERO_MEM_MOMENT1] -
                                                     m0->bytes[ZERO_MEM_MOMENT2],
                              "stage %d v %d rank %d: device %zu of %zu", st, v, rk, m1->total_bytes, m0->total_bytes);
                }
            }
            ec_result_free(ref);
            ec_result_free(got);
        }
    ZT_CHECKF(nd_dir_is_empty(dir), "%s: files left behind", dir);
    rmdir(dir);
}

/* Eight parameter groups (zero_engine_set_tensor_hparams): eight distinct Adam constant
   sets, every one in the fused kernel's table of one launch; the CUDA device gives the host
   device's bits at every stage. */
ZT_TEST(test_parameter_groups)
{
    ec_cfg c;
    ec_cfg_init(&c, 0, 2, ZERO_BF16, 2, 3);
    c.lr = 1e-2f;
    c.wd = 0.05f;
    ec_param_groups(&c);
    check_config(&c, "N=2 bf16 eight parameter groups");
}

int main(void)
{
    {
        int rc = zt_gpu_probe(NTESTS); /* skip only without a GPU */
        if (rc >= 0) return rc;
    }
    ZT_RUN(test_stages_equal_and_equal_host);
    ZT_RUN(test_fp32_comm_and_skip);
    ZT_RUN(test_larger_model);
    ZT_RUN(test_offload_equals_plain);
    ZT_RUN(test_offload_ratio_and_states);
    ZT_RUN(test_offload_nvme_equals_host);
    ZT_RUN(test_parameter_groups);
    return zt_summary();
}
