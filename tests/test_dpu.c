/* The delayed parameter update (delayed_update, delayed_update_after = K; the ZeRO-Offload
   paper's DPU; docs/offload.md "Delayed parameter update").

   The definition: updates 1..K are applied at once; every later one is computed by the host
   Adam while the caller's next forward and backward run, and its params are published at the
   end of the next zero_engine_step (or by zero_engine_finish_update). So the backward of a
   step whose previous step's update was delayed computes its gradients from the params
   gathered one step earlier. The reference implements exactly that with an engine WITHOUT
   the delayed update (tests/engine_common.h, ec_stale): the driver keeps the params each
   backward gathered and, when the previous step's update was one the delayed engine delays
   (at least K updates before it), computes this step's gradients from the previous step's
   params. The loss scaler and clipping see each step's own gradients in both. Checked:
   master, m, v, params, every step's info and loss scale bit for bit, stages 1-3 with the
   delayed update against the reference at stage 0 (so against each other), N = 1-3, fp16
   with skipped steps, scale changes and clipping, accumulation, bf16 with bf16 optimizer
   states, stage 3 with offload_param = cpu and persistent groups; K = 0, 2 and larger than
   the run (the run without the delayed update); a checkpoint in the middle that resumes bit
   for bit; the memory of the host tier; the descriptor's validation and the commit's
   agreement across ranks. */
#define _XOPEN_SOURCE 700
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/nvme_dir.h"

#include <sys/stat.h>
#include <unistd.h>

static void stale_free(ec_stale *st)
{
    int r, g;
    for (r = 0; r < EC_MAX_RANKS; r++)
        for (g = 0; g < EC_STALE_G; g++) {
            free(st->prev[r][g]);
            free(st->cur[r][g]);
        }
    memset(st, 0, sizeof *st);
}

/* The reference of c with K: stage 0, no offload, the delayed schedule driven by hand. */
static ec_result *run_reference(const ec_cfg *c, int K)
{
    ec_cfg ref = *c;
    ec_stale st;
    ec_result *res;
    memset(&st, 0, sizeof st);
    ref.stage = 0;
    ref.offload_opt = ref.offload_param = ZERO_OFFLOAD_NONE;
    ref.offload_grad = ZERO_OFFLOAD_NONE;
    ref.persist = 0;
    ref.hpz = 0;
    ref.dpu = ref.dpu_after = 0;
    ref.stale = &st;
    ref.stale_after = K;
    res = ec_run(&ref);
    stale_free(&st);
    return res;
}

/* Master, m, v, params, every rank's step info and every loss scale the same bits. */
static void check_same(const ec_cfg *c, const ec_result *ref, const ec_result *got, const char *label)
{
    char why[160];
    int s, rk;
    ZT_CHECKF(ref->rc == ZERO_OK && got->rc == ZERO_OK, "%s: %s | %s", label, ref->err, got->err);
    if (ref->rc != ZERO_OK || got->rc != ZERO_OK) return;
    ZT_CHECKF(got->params_agree, "%s: ranks hold different params", label);
    ZT_CHECKF(ec_same_state(c, ref, got, why, sizeof why), "%s: %s", label, why);
    for (s = 0; s < c->steps; s++) {
        ZT_CHECKF(ref->loss_scale_before[s] == got->loss_scale_before[s], "%s: step %d scale %g vs %g",
                  label, s, (double)ref->loss_scale_before[s], (double)got->loss_scale_before[s]);
        for (rk = 0; rk < c->world; rk++)
            ZT_CHECKF(!memcmp(&ref->info[rk][s], &got->info[rk][s], sizeof(zero_step_info)),
                      "%s: rank %d step %d info (step %lld/%lld skipped %d/%d norm %.9g/%.9g)", label,
                      rk, s, (long long)ref->info[rk][s].step, (long long)got->info[rk][s].step,
                      ref->info[rk][s].skipped, got->info[rk][s].skipped,
                      (double)ref->info[rk][s].grad_norm, (double)got->info[rk][s].grad_norm);
    }
}

/* The reference is discriminating: the delayed schedule changes the state (against the
   same driver with nothing delayed). */
static void check_delay_shows(const ec_cfg *c, const ec_result *ref, const char *label)
{
    ec_result *undelayed = run_reference(c, 1 << 30);
    char why[160];
    ZT_CHECKF(undelayed->rc == ZERO_OK && ref->rc == ZERO_OK, "%s: %s", label, undelayed->err);
    if (undelayed->rc == ZERO_OK && ref->rc == ZERO_OK)
        ZT_CHECKF(!ec_same_state(c, undelayed, ref, why, sizeof why),
                  "%s: the delayed schedule changed nothing", label);
    ec_result_free(undelayed);
}

/* fp16, accumulation 2, a small scale that grows, NaN/inf steps on the last rank, clipping. */
static void cfg_fp16(ec_cfg *c, int stage, int world, int steps)
{
    static const int faults[] = {1, 4, 5};
    int i;
    ec_cfg_init(c, stage, world, ZERO_F16, 2, steps);
    c->init_scale = 512.0f;
    c->window = 2;
    c->hysteresis = 1;
    c->clip = 0.05f;
    c->lr = 1e-2f; /* large enough that one step's staleness shows in the gradients */
    c->fault_rank = world - 1;
    c->fault_inf = world & 1;
    for (i = 0; i < 3; i++) c->fault_steps[i] = faults[i];
    c->nfault = 3;
    c->sub_group = 23; /* tiles much smaller than a shard */
    c->offload_opt = ZERO_OFFLOAD_CPU;
    c->dpu = 1;
}

ZT_TEST(delayed_update_equals_its_reference)
{
    static const int Ks[] = {0, 2};
    int world, ki, st;
    for (world = 1; world <= (zt_quick() ? 2 : 3); world++)
        for (ki = 0; ki < 2; ki++) {
            ec_cfg c;
            ec_result *ref;
            cfg_fp16(&c, 1, world, 8);
            c.dpu_after = Ks[ki];
            ref = run_reference(&c, Ks[ki]);
            check_delay_shows(&c, ref, "fp16");
            for (st = 1; st <= 3; st++) {
                ec_result *got;
                char label[96];
                c.stage = st;
                got = ec_run(&c);
                snprintf(label, sizeof label, "fp16 N=%d K=%d stage %d", world, Ks[ki], st);
                check_same(&c, ref, got, label);
                /* the delay is real: every step updated something (some skipped) */
                if (got->rc == ZERO_OK) ZT_CHECK(got->info[0][7].step >= 4);
                ec_result_free(got);
            }
            ec_result_free(ref);
        }
}

/* bf16 params with bf16 optimizer states (stochastic rounding keyed by the step), and stage
   3 with offload_param = cpu beside persistent groups. */
ZT_TEST(delayed_update_bf16_states_and_offloaded_params)
{
    int world;
    for (world = 1; world <= 2; world++) {
        ec_cfg c;
        ec_result *ref, *got;
        char label[96];
        ec_cfg_init(&c, 1, world, ZERO_BF16, 1, 6);
        c.lr = 3e-3f;
        c.offload_opt = ZERO_OFFLOAD_CPU;
        c.opt_dtype = ZERO_BF16;
        c.opt_seed = 77;
        c.sub_group = 31;
        c.dpu = 1;
        c.dpu_after = 1;
        ref = run_reference(&c, 1);
        check_delay_shows(&c, ref, "bf16 states");
        for (c.stage = 1; c.stage <= 3; c.stage++) {
            got = ec_run(&c);
            snprintf(label, sizeof label, "bf16 states N=%d stage %d", world, c.stage);
            check_same(&c, ref, got, label);
            ec_result_free(got);
        }
        ec_result_free(ref);
        cfg_fp16(&c, 3, world, 6);
        c.offload_param = ZERO_OFFLOAD_CPU;
        c.persist = 20; /* groups 2 (16 elements) stays whole */
        c.prefetch = 1;
        c.dpu_after = 0;
        ref = run_reference(&c, 0);
        check_delay_shows(&c, ref, "stage 3 offload_param");
        got = ec_run(&c);
        snprintf(label, sizeof label, "stage 3 offload_param N=%d", world);
        check_same(&c, ref, got, label);
        ec_result_free(got);
        ec_result_free(ref);
    }
    {   /* stage 3 with ZeRO++'s hpZ (secondary partitions of 2 in a node of 4) */
        ec_cfg c;
        ec_result *ref, *got;
        cfg_fp16(&c, 3, 4, 5);
        c.ranks_per_node = 4;
        c.hpz = 2;
        c.dpu_after = 1;
        ref = run_reference(&c, 1);
        got = ec_run(&c);
        check_same(&c, ref, got, "stage 3 hpZ N=4");
        ec_result_free(got);
        ec_result_free(ref);
    }
}

/* K larger than the run: every update is applied at once, the same bits as the offloaded run
   without the delayed update. And the delay changes training (the reference with K = 0 is
   not the undelayed run), so the comparisons above can fail. */
ZT_TEST(large_k_is_the_undelayed_run)
{
    ec_cfg c;
    ec_result *plain, *big, *k0;
    char why[160];
    cfg_fp16(&c, 2, 2, 6);
    c.dpu = 0;
    plain = ec_run(&c);
    c.dpu = 1;
    c.dpu_after = 7;
    big = ec_run(&c);
    check_same(&c, plain, big, "K = 7 > 6 steps vs no delayed update");
    c.dpu_after = 0;
    k0 = ec_run(&c);
    ZT_CHECK(k0->rc == ZERO_OK);
    if (k0->rc == ZERO_OK && plain->rc == ZERO_OK)
        ZT_CHECKF(!ec_same_state(&c, plain, k0, why, sizeof why), "K = 0 gave the undelayed run's state");
    ec_result_free(plain);
    ec_result_free(big);
    ec_result_free(k0);
}

/* Without zero_engine_finish_update the params lag the master by the pending update: the
   master, m, v equal the reference's, the params do not (and equal after the finish, checked
   by the tests above). */
ZT_TEST(params_lag_until_finish_update)
{
    ec_cfg c;
    ec_result *ref, *got;
    int t, lag = 0;
    cfg_fp16(&c, 2, 2, 4);
    c.nfault = 0;
    c.dpu_no_finish = 1;
    ref = run_reference(&c, 0);
    got = ec_run(&c);
    ZT_CHECK(ref->rc == ZERO_OK && got->rc == ZERO_OK);
    for (t = 0; t < c.ntensors && ref->rc == ZERO_OK && got->rc == ZERO_OK; t++) {
        ZT_CHECK(!memcmp(ref->master[t], got->master[t], c.sizes[t] * 4));
        ZT_CHECK(!memcmp(ref->m[t], got->m[t], c.sizes[t] * 4));
        lag += memcmp(ref->param[t], got->param[t], c.sizes[t] * 2) != 0;
    }
    ZT_CHECKF(lag == c.ntensors, "%d of %d tensors' params lag", lag, c.ntensors);
    ec_result_free(ref);
    ec_result_free(got);
}

/* ---- checkpoints ---- */

/* Steps 0-3 with the delayed update, save (an update pending), load into a new engine
   (another stage), steps 4-7, finish: the same bits as 8 steps in one run (whose reference
   is checked above). */
ZT_TEST(checkpoint_with_an_update_pending_resumes_exactly)
{
    char dbuf[64];
    const char *dir = nd_make_dir(dbuf, sizeof dbuf, "dpu");
    char ckdir[300], cmd[400];
    static const int stages[][2] = {{1, 1}, {2, 3}, {3, 1}};
    int i;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    for (i = 0; i < 3; i++) {
        ec_cfg c;
        ec_job j1, j2;
        ec_result *whole, *a, *b;
        char label[64];
        cfg_fp16(&c, stages[i][0], 2, 8);
        c.dpu_after = 1;
        whole = ec_run(&c);
        memset(&j1, 0, sizeof j1);
        memset(&j2, 0, sizeof j2);
        j1.save_dir = ckdir;
        j1.first = 0;
        j1.last = 4;
        a = ec_run_job(&c, &j1);
        {
            zero_checkpoint *ck = NULL;
            zero_checkpoint_info ci;
            memset(&ci, 0, sizeof ci);
            ZT_CHECK(zero_checkpoint_open(ckdir, &ck) == ZERO_OK);
            if (ck) ZT_CHECK(zero_checkpoint_get_info(ck, &ci) == ZERO_OK && ci.update_pending == 1);
            zero_checkpoint_close(ck);
        }
        c.stage = stages[i][1];
        j2.load_dir = ckdir;
        j2.first = 4;
        j2.last = 8;
        j2.finish = 1;
        b = ec_run_job(&c, &j2);
        snprintf(label, sizeof label, "stage %d -> %d", stages[i][0], stages[i][1]);
        ZT_CHECKF(whole->rc == ZERO_OK && a->rc == ZERO_OK && b->rc == ZERO_OK, "%s: %s %s %s", label,
                  whole->err, a->err, b->err);
        if (whole->rc == ZERO_OK && b->rc == ZERO_OK) {
            char why[160];
            ZT_CHECKF(ec_same_state(&c, whole, b, why, sizeof why), "%s: %s", label, why);
        }
        ec_result_free(whole);
        ec_result_free(a);
        ec_result_free(b);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* ---- memory ---- */

/* The host tier gains S c bytes of GRAD (the second gradient shard) and S p of PARAM (the
   pending params), nothing else; the device tier is unchanged. */
ZT_TEST(host_tier_holds_the_two_buffers)
{
    int st;
    for (st = 1; st <= 3; st++) {
        ec_cfg c;
        ec_result *off, *dpu;
        int rk, k;
        cfg_fp16(&c, st, 2, 2);
        c.nfault = 0;
        c.dpu = 0;
        off = ec_run(&c);
        c.dpu = 1;
        dpu = ec_run(&c);
        ZT_CHECK(off->rc == ZERO_OK && dpu->rc == ZERO_OK);
        for (rk = 0; rk < 2 && off->rc == ZERO_OK && dpu->rc == ZERO_OK; rk++) {
            size_t S = off->plan_shard_total;
            for (k = 0; k < ZERO_MEM_COUNT; k++) {
                size_t want = off->host_mem[rk].bytes[k] +
                              (k == ZERO_MEM_GRAD ? S * 2 : k == ZERO_MEM_PARAM ? S * 2 : 0);
                ZT_CHECKF(dpu->host_mem[rk].bytes[k] == want, "stage %d rank %d %s: %zu, want %zu",
                          st, rk, zero_mem_category_name((zero_mem_category)k),
                          dpu->host_mem[rk].bytes[k], want);
                ZT_CHECK(dpu->mem[rk].bytes[k] == off->mem[rk].bytes[k]);
            }
        }
        ec_result_free(off);
        ec_result_free(dpu);
    }
}

/* ---- the descriptor and the commit ---- */

static zero_result create_with(zero_engine_desc *d, zero_device *dev, zero_comm *comm)
{
    zero_engine *e = NULL;
    zero_result r;
    d->device = dev;
    d->comm = comm;
    r = zero_engine_create(d, &e);
    zero_engine_destroy(e);
    return r;
}

static zero_result knobs_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine_desc d, got;
    zero_engine *e = NULL;
    (void)rank;
    (void)user;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
#define DESC(...) (memset(&d, 0, sizeof d), d.stage = 2, d.offload_optimizer = ZERO_OFFLOAD_CPU, \
                   d.delayed_update = 1, __VA_ARGS__, &d)
#define REFUSED(desc, word)                                                                      \
    do {                                                                                         \
        ZT_CHECK(create_with(desc, dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);                   \
        ZT_CHECKF(strstr(zero_last_error(), word) != NULL, "%s", zero_last_error());             \
    } while (0)
    REFUSED(DESC(d.delayed_update = 2), "delayed_update = 2");
    REFUSED(DESC(d.delayed_update_after = -1), "delayed_update_after = -1");
    REFUSED(DESC(d.delayed_update = 0, d.delayed_update_after = 5), "needs delayed_update = 1");
    REFUSED(DESC(d.offload_optimizer = ZERO_OFFLOAD_NONE), "nothing to hide");
    REFUSED(DESC(d.stage = 0, d.offload_optimizer = ZERO_OFFLOAD_NONE), "offload_optimizer = cpu");
    REFUSED(DESC(d.offload_optimizer = ZERO_OFFLOAD_NVME, d.nvme_path = "/tmp"), "NVMe");
    REFUSED(DESC(d.offload_optimizer_ratio = 0.5), "offload_optimizer_ratio");
    REFUSED(DESC(d.stage = 3, d.offload_optimizer = ZERO_OFFLOAD_NVME, d.offload_param = ZERO_OFFLOAD_NVME,
                 d.nvme_path = "/tmp"),
            "offload_optimizer = cpu");
    /* accepted: K = 0, a large K, stage 3 with offload_param = cpu; the desc reads back */
    ZT_CHECK(create_with(DESC(d.delayed_update_after = 0), dev, comm) == ZERO_OK);
    ZT_CHECK(create_with(DESC(d.delayed_update_after = 1 << 30), dev, comm) == ZERO_OK);
    ZT_CHECK(create_with(DESC(d.stage = 3, d.offload_param = ZERO_OFFLOAD_CPU), dev, comm) == ZERO_OK);
    memset(&got, 0, sizeof got);
    ZT_CHECK(zero_engine_create(DESC(d.delayed_update_after = 3, d.device = dev, d.comm = comm), &e) == ZERO_OK);
    ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK && got.delayed_update == 1 &&
             got.delayed_update_after == 3);
    zero_engine_destroy(e);
#undef REFUSED
#undef DESC
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(delayed_update_validated_with_clear_errors)
{
    ZT_CHECK(zero_local_run(1, knobs_rank, NULL) == ZERO_OK);
}

/* Two ranks with different K (or one without the delayed update): MISMATCH naming it. */
static int mismatch_case;
static void dpu_desc(int rank, zero_engine_desc *d)
{
    d->stage = 2;
    d->offload_optimizer = ZERO_OFFLOAD_CPU;
    d->delayed_update = mismatch_case == 1 && rank == 1 ? 0 : 1;
    d->delayed_update_after = mismatch_case == 0 && rank == 1 ? 3 : 0;
}

ZT_TEST(ranks_with_different_k_mismatch)
{
    char msg[400];
    for (mismatch_case = 0; mismatch_case < 2; mismatch_case++) {
        ZT_CHECK(ec_commit_disagreeing(2, dpu_desc, msg, sizeof msg) == ZERO_ERROR_MISMATCH);
        ZT_CHECKF(strstr(msg, "delayed_update_after") != NULL, "%s", msg);
    }
}

/* finish_update: refused mid-step and while a group is gathered, harmless without the
   delayed update or with nothing pending, and it publishes: the params gathered after it
   are the master rounded. */
static zero_result finish_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL;
    int id = -1, pass;
    void *p = NULL, *gp = NULL;
    float vals[100], master[100];
    uint16_t got[100];
    size_t i;
    zero_range rg;
    (void)rank;
    (void)user;
    ZT_CHECK(zero_engine_finish_update(NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    for (pass = 0; pass < 2; pass++) {
        memset(&d, 0, sizeof d);
        d.stage = 1;
        d.offload_optimizer = ZERO_OFFLOAD_CPU;
        d.delayed_update = pass;
        d.device = dev;
        d.comm = comm;
        ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
        ZT_CHECK(zero_engine_add_tensor(e, "w", 100, 0, 0, &id) == ZERO_OK);
        ZT_CHECK(zero_engine_commit(e) == ZERO_OK);
        for (i = 0; i < 100; i++) vals[i] = 0.01f * (float)i - 0.3f;
        ZT_CHECK(zero_engine_set_tensor(e, id, vals) == ZERO_OK);
        ZT_CHECK(zero_engine_finish_update(e) == ZERO_OK); /* nothing pending */
        ZT_CHECK(zero_engine_gather(e, 0, &p) == ZERO_OK);
        ZT_CHECK(zero_engine_finish_update(e) == ZERO_ERROR_INVALID_STATE); /* gathered */
        ZT_CHECK(zero_engine_grads(e, 0, &gp) == ZERO_OK);
        for (i = 0; i < 100; i++) ((uint16_t *)gp)[i] = zero_f32_to_f16(1000.0f);
        ZT_CHECK(zero_engine_release(e, 0) == ZERO_OK);
        ZT_CHECK(zero_engine_grads_ready(e, 0) == ZERO_OK);
        ZT_CHECK(zero_engine_finish_update(e) == ZERO_ERROR_INVALID_STATE); /* mid-step */
        ZT_CHECKF(strstr(zero_last_error(), "middle of a step") != NULL, "%s", zero_last_error());
        ZT_CHECK(zero_engine_step(e, NULL) == ZERO_OK);
        ZT_CHECK(zero_engine_read_tensor(e, id, ZERO_STATE_PARAM, got, &rg) == ZERO_OK);
        ZT_CHECK(zero_engine_read_tensor(e, id, ZERO_STATE_MASTER, master, &rg) == ZERO_OK);
        /* delayed: the params are the initial ones until the finish, then the master rounded */
        for (i = 0; i < 100; i++)
            if (got[i] != zero_f32_to_f16(pass ? vals[i] : master[i])) break;
        ZT_CHECKF(i == 100, "pass %d: element %zu before the finish", pass, i);
        ZT_CHECK(zero_engine_finish_update(e) == ZERO_OK);
        ZT_CHECK(zero_engine_read_tensor(e, id, ZERO_STATE_PARAM, got, &rg) == ZERO_OK);
        for (i = 0; i < 100; i++)
            if (got[i] != zero_f32_to_f16(master[i]) || master[i] == vals[i]) break;
        ZT_CHECKF(i == 100, "pass %d: element %zu after the finish", pass, i);
        zero_engine_destroy(e);
        e = NULL;
    }
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(finish_update_rules)
{
    ZT_CHECK(zero_local_run(1, finish_rank, NULL) == ZERO_OK);
}

/* ---- the estimator ---- */

/* Paper mode: delayed_update adds (grad + param bytes) x ceil((Psi - F) / N) to host_bytes,
   nothing to the device; refused without offload_optimizer = cpu at ratio 1. */
ZT_TEST(estimator_counts_the_two_buffers)
{
    zero_estimate_desc d;
    zero_estimate a, b;
    int st;
    for (st = 1; st <= 3; st++) {
        memset(&d, 0, sizeof d);
        d.params = 1000003;
        d.ranks = 4;
        d.stage = st;
        d.frozen = 3;
        d.offload_optimizer = ZERO_OFFLOAD_CPU;
        d.offload_param = st == 3 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
        ZT_CHECK(zero_estimate_compute(&d, &a) == ZERO_OK);
        d.delayed_update = 1;
        ZT_CHECK(zero_estimate_compute(&d, &b) == ZERO_OK);
        ZT_CHECK(b.device_bytes == a.device_bytes);
        ZT_CHECKF(b.host_bytes == a.host_bytes + 250000u * 4u, "stage %d: %llu vs %llu", st,
                  (unsigned long long)b.host_bytes, (unsigned long long)a.host_bytes);
        d.grad_bytes = 4; /* fp32 gradient communication */
        ZT_CHECK(zero_estimate_compute(&d, &b) == ZERO_OK);
        d.delayed_update = 0;
        ZT_CHECK(zero_estimate_compute(&d, &a) == ZERO_OK);
        ZT_CHECK(b.host_bytes == a.host_bytes + 250000u * 6u);
    }
    d.delayed_update = 1;
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_param = ZERO_OFFLOAD_NONE;
    ZT_CHECK(zero_estimate_compute(&d, &b) == ZERO_ERROR_INVALID_ARGUMENT);
    d.offload_optimizer = ZERO_OFFLOAD_CPU;
    d.offload_optimizer_ratio = 0.5;
    ZT_CHECK(zero_estimate_compute(&d, &b) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "delayed_update") != NULL);
}

int main(void)
{
    ZT_RUN(delayed_update_validated_with_clear_errors);
    ZT_RUN(ranks_with_different_k_mismatch);
    ZT_RUN(delayed_update_equals_its_reference);
    ZT_RUN(delayed_update_bf16_states_and_offloaded_params);
    ZT_RUN(large_k_is_the_undelayed_run);
    ZT_RUN(params_lag_until_finish_update);
    ZT_RUN(checkpoint_with_an_update_pending_resumes_exactly);
    ZT_RUN(host_tier_holds_the_two_buffers);
    ZT_RUN(finish_update_rules);
    ZT_RUN(estimator_counts_the_two_buffers);
    return zt_summary();
}
