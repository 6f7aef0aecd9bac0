/* ZeRO-Offload in the engine: the knobs, the device memory budget, exactness of the
   offloaded step against the same run without offload (bit for bit), and the accounting of
   each tier against the ZeRO-Offload formula plus the declared staging buffers. */
#define _XOPEN_SOURCE 700 /* POSIX names (mkdtemp, pwrite): zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/nvme_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* Runs c with and without offload and checks master, m, v, params and every step's info
   for the same bits. */
static void check_offload_exact(ec_cfg *c, const char *label)
{
    ec_result *ref, *off;
    char why[160];
    int s, rk;
    zero_offload_device oo = c->offload_opt, op = c->offload_param;
    c->offload_opt = ZERO_OFFLOAD_NONE;
    c->offload_param = ZERO_OFFLOAD_NONE;
    ref = ec_run(c);
    c->offload_opt = oo;
    c->offload_param = op;
    off = ec_run(c);
    ZT_CHECKF(ref->rc == ZERO_OK, "%s (plain): %s", label, ref->err);
    ZT_CHECKF(off->rc == ZERO_OK, "%s (offload): %s", label, off->err);
    if (ref->rc == ZERO_OK && off->rc == ZERO_OK) {
        ZT_CHECKF(off->params_agree, "%s: ranks hold different params", label);
        ZT_CHECKF(ec_same_state(c, ref, off, why, sizeof why), "%s: %s", label, why);
        for (s = 0; s < c->steps; s++)
            for (rk = 0; rk < c->world; rk++)
                ZT_CHECKF(memcmp(&ref->info[rk][s], &off->info[rk][s], sizeof ref->info[rk][s]) == 0,
                          "%s: step %d rank %d: info differs (norm %.9g vs %.9g, skipped %d vs %d)",
                          label, s, rk, (double)ref->info[rk][s].grad_norm,
                          (double)off->info[rk][s].grad_norm, ref->info[rk][s].skipped,
                          off->info[rk][s].skipped);
    }
    ec_result_free(ref);
    ec_result_free(off);
}

/* Every stage where allowed, N in {1, 2, 4}, fp16 and bf16, with and without gradient
   accumulation; tiles much smaller than a shard, so a tensor spans tiles and a tile spans
   tensors and padding. */
ZT_TEST(offloaded_step_is_bit_identical)
{
    static const int worlds[] = {1, 2, 4};
    int st, wi, dt, acc, par;
    int steps = zt_quick() ? 2 : 4;
    for (st = 1; st <= 3; st++)
        for (wi = 0; wi < 3; wi++)
            for (dt = 0; dt < 2; dt++)
                for (acc = 0; acc < 2; acc++)
                    for (par = 0; par <= (st == 3); par++) {
                        ec_cfg c;
                        char label[128];
                        ec_cfg_init(&c, st, worlds[wi], dt ? ZERO_BF16 : ZERO_F16, acc ? 3 : 1, steps);
                        c.offload_opt = ZERO_OFFLOAD_CPU;
                        c.offload_param = par ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
                        c.sub_group = 23 + (size_t)wi * 7;
                        c.host_threads = 1 + acc;
                        c.clip = acc ? 0.05f : 0.0f; /* clipping active in half the runs */
                        if (st == 3 && dt) c.persist = 20; /* a persistent group too */
                        snprintf(label, sizeof label, "stage %d N %d %s accum %d param %s", st,
                                 worlds[wi], dt ? "bf16" : "fp16", c.accum, par ? "cpu" : "none");
                        check_offload_exact(&c, label);
                    }
}

/* fp32 communication, buckets and prefetch, an inf step that is skipped on every rank, and
   big tiles (one per group): still the same bits. */
ZT_TEST(offload_exact_with_faults_and_settings)
{
    ec_cfg c;
    int st;
    for (st = 1; st <= 3; st++) {
        char label[96];
        ec_cfg_init(&c, st, 3, ZERO_F16, 2, 4);
        c.comm_dtype = ZERO_F32;
        c.bucket = 300;
        c.prefetch = 2;
        c.offload_opt = ZERO_OFFLOAD_CPU;
        c.offload_param = st == 3 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
        c.fault_steps[0] = 1;
        c.nfault = 1;
        c.fault_rank = 2;
        c.fault_inf = 1;
        snprintf(label, sizeof label, "stage %d fp32 comm, skip at step 1", st);
        check_offload_exact(&c, label);
    }
    /* the skipped step really was skipped (counted once, not by the offload path) */
    ec_cfg_init(&c, 2, 2, ZERO_F16, 1, 3);
    c.offload_opt = ZERO_OFFLOAD_CPU;
    c.fault_steps[0] = 0;
    c.nfault = 1;
    c.fault_rank = 1;
    {
        ec_result *r = ec_run(&c);
        ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
        ZT_CHECK(r->info[0][0].skipped == 1 && r->info[0][2].step == 2);
        ec_result_free(r);
    }
}

/* ---- gradients off the device ---- */

/* The reduced gradients leave the device as they are produced (reduced in place in the
   bucket, fused group calls with fp16 communication, micro-steps k > 0 added on the host):
   the clip norm and the inf/NaN verdict are the same bits as on the device. Stages 1-3,
   fp16 with a skipped (inf) step, clipping active, accumulation 1 and 3, N = 2 and 3; the
   host tier and NVMe. */
ZT_TEST(grads_off_device_are_exact)
{
    const char *dir = NULL;
    char tmpl[64];
    int st, w, acc, nv;
    snprintf(tmpl, sizeof tmpl, "/tmp/zero-test-grads-XXXXXX");
    dir = mkdtemp(tmpl);
    ZT_CHECK(dir != NULL);
    for (st = 1; st <= 3; st++)
        for (w = 2; w <= 3; w++)
            for (acc = 1; acc <= 3; acc += 2)
                for (nv = 0; nv <= (dir != NULL); nv++) {
                    ec_cfg c;
                    char label[128];
                    zero_offload_device where = nv ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
                    if (zt_quick() && nv && w == 2) continue;
                    ec_cfg_init(&c, st, w, ZERO_F16, acc, 4);
                    c.clip = 0.05f;
                    c.bucket = 300; /* several groups per reduction: grouped calls */
                    c.fault_steps[0] = 1;
                    c.nfault = 1;
                    c.fault_rank = w - 1;
                    c.fault_inf = 1;
                    c.offload_opt = where;
                    c.offload_param = st == 3 ? where : ZERO_OFFLOAD_NONE;
                    c.nvme_path = dir;
                    c.sub_group = 57;
                    snprintf(label, sizeof label, "grads off: stage %d N %d accum %d %s", st, w, acc,
                             nv ? "nvme" : "cpu");
                    check_offload_exact(&c, label);
                }
    if (dir) rmdir(dir);
}

/* A model of ng groups of one 300-element tensor each, stage 3 on 2 ranks, both offloads. */
static void ladder_model(ec_cfg *c, int ng, zero_offload_device where, const char *dir)
{
    int t;
    ec_cfg_init(c, 3, 2, ZERO_F16, 2, 2);
    c->ntensors = ng;
    for (t = 0; t < ng; t++) {
        c->sizes[t] = 300;
        c->groups[t] = t;
        c->flags[t] = 0;
    }
    c->offload_opt = where;
    c->offload_param = where;
    c->nvme_path = dir;
}

/* With both offloads nothing on the device grows with Psi: its bytes are exactly the
   gather arena + the reduce buckets + the scratch (no params, gradients or optimizer
   state), and the same at Psi = 4 and 16 groups, on every rank, on the host tier and on
   NVMe; the plain run's device bytes grow with Psi. Then a device budget of exactly those
   bytes, which the gradient shard alone (2 Psi / N) exceeds, still commits and trains. */
ZT_TEST(device_bytes_with_both_offloads_do_not_grow_with_psi)
{
    char tmpl[64];
    const char *dir;
    int nv, rk, i;
    snprintf(tmpl, sizeof tmpl, "/tmp/zero-test-psi-XXXXXX");
    dir = mkdtemp(tmpl);
    ZT_CHECK(dir != NULL);
    for (nv = 0; nv <= (dir != NULL); nv++) {
        size_t dev[2] = {0, 0}, plain[2] = {0, 0}, shard_grad = 0;
        static const int ngs[2] = {4, 16};
        zero_offload_device where = nv ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
        ec_cfg c;
        ec_result *r;
        for (i = 0; i < 2; i++) {
            ladder_model(&c, ngs[i], where, dir);
            r = ec_run(&c);
            ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
            for (rk = 0; rk < 2 && r->rc == ZERO_OK; rk++) {
                const zero_engine_memory *m = &r->mem[rk];
                ZT_CHECK(m->bytes[ZERO_MEM_PARAM] == 0 && m->bytes[ZERO_MEM_GRAD] == 0 &&
                         m->bytes[ZERO_MEM_MASTER] == 0 && m->bytes[ZERO_MEM_MOMENT1] == 0 &&
                         m->bytes[ZERO_MEM_MOMENT2] == 0);
                ZT_CHECK(m->bytes[ZERO_MEM_SCRATCH] == 64);
                ZT_CHECKF(m->total_bytes == m->bytes[ZERO_MEM_GATHER] + m->bytes[ZERO_MEM_BUCKET] +
                                                m->bytes[ZERO_MEM_SCRATCH],
                          "ng %d rank %d: device %zu", ngs[i], rk, m->total_bytes);
                ZT_CHECK(m->peak_total_bytes == m->total_bytes);
                if (rk == 0) dev[i] = m->total_bytes;
                else ZT_CHECK(m->total_bytes == dev[i]);
            }
            shard_grad = r->plan_shard_total * 2;
            ec_result_free(r);
            c.offload_opt = c.offload_param = ZERO_OFFLOAD_NONE;
            r = ec_run(&c);
            ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
            plain[i] = r->mem[0].total_bytes;
            ec_result_free(r);
        }
        ZT_CHECKF(dev[0] == dev[1] && dev[0] > 0, "%s: device bytes %zu at 4 groups, %zu at 16",
                  nv ? "nvme" : "cpu", dev[0], dev[1]);
        ZT_CHECK(plain[1] > plain[0] + 12 * 300 * 12 / 2); /* 12 more groups of 16 Psi / N */
        /* the budget: exactly arena + buckets + scratch, below the gradient shard alone */
        ZT_CHECKF(shard_grad > dev[1], "gradient shard %zu vs device %zu", shard_grad, dev[1]);
        ladder_model(&c, 16, where, dir);
        c.device_capacity = dev[1];
        r = ec_run(&c);
        ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
        if (r->rc == ZERO_OK) ZT_CHECK(r->info[0][1].step == 2 && r->mem[0].peak_total_bytes <= dev[1]);
        ec_result_free(r);
        c.offload_opt = c.offload_param = ZERO_OFFLOAD_NONE;
        r = ec_run(&c);
        ZT_CHECK(r->rc == ZERO_ERROR_OUT_OF_MEMORY);
        ec_result_free(r);
        /* one byte less with both offloads: the message names the bulk and what fits */
        ladder_model(&c, 16, where, dir);
        c.device_capacity = dev[1] - 1;
        r = ec_run(&c);
        ZT_CHECK(r->rc == ZERO_ERROR_OUT_OF_MEMORY);
        ZT_CHECKF(strstr(r->err, "the bulk is the arena (2560 bytes)") &&
                      strstr(r->err, "max_live_numel=640 with prefetch_depth=-1 would fit (1344 bytes)"),
                  "%s", r->err);
        ec_result_free(r);
        /* below that: groups of at most (budget - scratch) / (an arena of two groups of 2-byte
           elements) = (1343 - 64) / 4 = 319 */
        c.device_capacity = 1343;
        r = ec_run(&c);
        ZT_CHECK(r->rc == ZERO_ERROR_OUT_OF_MEMORY);
        ZT_CHECKF(strstr(r->err, "needs (1344 bytes)") &&
                      strstr(r->err, "groups of at most 319 elements (the largest has 320) with "
                                     "max_live_numel=638 would fit"),
                  "%s", r->err);
        ec_result_free(r);
    }
    if (dir) {
        ZT_CHECK(nd_dir_is_empty(dir));
        rmdir(dir);
    }
}

/* ---- knobs ---- */

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
    zero_engine_desc d;
    zero_engine *e = NULL;
    zero_engine_desc got;
    (void)rank;
    (void)user;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
#define DESC(...) (memset(&d, 0, sizeof d), __VA_ARGS__, &d)
    ZT_CHECK(create_with(DESC(d.stage = 0, d.offload_optimizer = ZERO_OFFLOAD_CPU), dev, comm) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "offload_optimizer") != NULL);
    ZT_CHECK(create_with(DESC(d.stage = 2, d.offload_optimizer = ZERO_OFFLOAD_CPU,
                              d.offload_param = ZERO_OFFLOAD_CPU), dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "offload_param") && strstr(zero_last_error(), "stage 3"));
    ZT_CHECK(create_with(DESC(d.stage = 3, d.offload_param = ZERO_OFFLOAD_CPU), dev, comm) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(create_with(DESC(d.stage = 3, d.offload_optimizer = ZERO_OFFLOAD_NVME), dev, comm) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "nvme_path") != NULL);
    ZT_CHECK(create_with(DESC(d.stage = 3, d.offload_optimizer = ZERO_OFFLOAD_CPU,
                              d.offload_param = ZERO_OFFLOAD_NVME), dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(create_with(DESC(d.stage = 1, d.offload_optimizer = (zero_offload_device)3), dev, comm) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(create_with(DESC(d.stage = 1, d.offload_optimizer = ZERO_OFFLOAD_CPU, d.block_size = 5000),
                         dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(create_with(DESC(d.stage = 1, d.offload_optimizer = ZERO_OFFLOAD_CPU, d.queue_depth = -1),
                         dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(create_with(DESC(d.stage = 1, d.offload_optimizer = ZERO_OFFLOAD_CPU, d.buffer_count = 1),
                         dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(create_with(DESC(d.stage = 1, d.pin_memory = 2), dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(create_with(DESC(d.stage = 1, d.pin_memory = -2), dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    /* defaults: DeepSpeed's */
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.offload_optimizer = ZERO_OFFLOAD_CPU;
    d.offload_param = ZERO_OFFLOAD_CPU;
    d.device = dev;
    d.comm = comm;
    memset(&got, 0, sizeof got);
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK);
    ZT_CHECK(got.sub_group_size == 1000000000u && got.buffer_count == 4 &&
             got.buffer_size == 100000000u && got.block_size == 1048576u && got.queue_depth == 8 &&
             got.pin_memory == ZERO_PIN_MEMORY_OFF /* the host device has no pinned memory */ &&
             got.host_threads >= 1);
    zero_engine_destroy(e);
#undef DESC
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(knobs_validated_with_clear_errors)
{
    ZT_CHECK(zero_local_run(1, knobs_rank, NULL) == ZERO_OK);
    ZT_CHECK(strcmp(zero_offload_device_name(ZERO_OFFLOAD_NVME), "nvme") == 0);
}

/* ---- the device memory budget ---- */

ZT_TEST(host_device_budget)
{
    zero_host_device_desc hd;
    zero_device *dev;
    void *a = NULL, *b = NULL;
    size_t cap = 0, used = 0;
    char want[64];
    memset(&hd, 0, sizeof hd);
    hd.capacity = 1000;
    ZT_CHECK(zero_host_device_create(&hd, &dev) == ZERO_OK);
    ZT_CHECK(dev->ops->alloc(dev, 600, ZERO_MEM_PARAM, &a) == ZERO_OK);
    ZT_CHECK(dev->ops->alloc(dev, 401, ZERO_MEM_MASTER, &b) == ZERO_ERROR_OUT_OF_MEMORY && b == NULL);
    ZT_CHECK(strstr(zero_last_error(), "401 bytes") && strstr(zero_last_error(), "budget 1000"));
    ZT_CHECK(dev->ops->memory_info(dev, &cap, &used) == ZERO_OK && cap == 1000 && used == 600);
    ZT_CHECK(dev->ops->alloc(dev, 400, ZERO_MEM_MASTER, &b) == ZERO_OK); /* exactly full */
    ZT_CHECK(dev->ops->free(dev, a) == ZERO_OK);
    ZT_CHECK(dev->ops->alloc(dev, 600, ZERO_MEM_PARAM, &a) == ZERO_OK); /* freed bytes return */
    ZT_CHECK(dev->ops->alloc(dev, 2000, ZERO_MEM_PARAM, &b) == ZERO_ERROR_OUT_OF_MEMORY);
    snprintf(want, sizeof want, "%d bytes", 2000);
    ZT_CHECK(strstr(zero_last_error(), want) != NULL);
    zero_device_destroy(dev);
    /* no budget: capacity reported as SIZE_MAX */
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    ZT_CHECK(dev->ops->memory_info(dev, &cap, NULL) == ZERO_OK && cap == (size_t)-1);
    zero_device_destroy(dev);
}

/* A model whose states exceed the budget: commit fails on every rank with the message that
   names the budget and the offload setting that fits; with that setting it trains. */
ZT_TEST(over_budget_commit_names_the_fitting_offload)
{
    ec_cfg c;
    ec_result *r;
    size_t S, plain_dev, cap;
    int world = 2;
    ec_cfg_init(&c, 2, world, ZERO_F16, 1, 2);
    c.sizes[5] = 4000; /* a bigger model so states dominate the buffers */
    /* device bytes without offload and with, from a run without budget */
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    plain_dev = r->mem[0].total_bytes;
    S = r->plan_shard_total;
    ec_result_free(r);
    cap = plain_dev - 12 * S + 64; /* room for everything but the optimizer state */
    c.device_capacity = cap;
    r = ec_run(&c);
    ZT_CHECK(r->rc == ZERO_ERROR_OUT_OF_MEMORY);
    ZT_CHECKF(strstr(r->err, "offload_optimizer=cpu would fit") != NULL, "%s", r->err);
    ZT_CHECKF(strstr(r->err, "budget") != NULL, "%s", r->err);
    ec_result_free(r);
    c.offload_opt = ZERO_OFFLOAD_CPU;
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    ZT_CHECK(r->mem[0].peak_total_bytes <= cap);
    ec_result_free(r);
    /* stage 3: only offloading the params too fits */
    ec_cfg_init(&c, 3, world, ZERO_F16, 1, 2);
    c.sizes[5] = 4000;
    c.offload_opt = ZERO_OFFLOAD_CPU;
    c.offload_param = ZERO_OFFLOAD_CPU;
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    cap = r->mem[0].peak_total_bytes;
    ec_result_free(r);
    c.offload_opt = ZERO_OFFLOAD_NONE;
    c.offload_param = ZERO_OFFLOAD_NONE;
    c.device_capacity = cap + S; /* half of the 2 S bytes of param shards: only their offload fits */
    r = ec_run(&c);
    ZT_CHECK(r->rc == ZERO_ERROR_OUT_OF_MEMORY);
    ZT_CHECKF(strstr(r->err, "offload_param=cpu would fit") != NULL, "%s", r->err);
    ec_result_free(r);
}

/* ---- accounting per tier ---- */

/* Device and host bytes of every rank equal the ZeRO-Offload formula plus the declared
   buffers: the device loses master, m, v (12 S) and the gradient accumulator (S c:
   offloaded gradients reduce in place and leave the device); the host holds them (S c, plus (M/N) c receiving micro-steps
   k > 0 before their add), and 2 staging tiles of params (2 T p); with offload_param the
   partitioned groups' param shards (p S_np) move from the device to the host. */
ZT_TEST(tier_accounting_matches_the_formula)
{
    int st, par, rk;
    for (st = 1; st <= 3; st++)
        for (par = 0; par <= (st == 3); par++) {
            ec_cfg c;
            ec_result *plain, *off;
            size_t T = 40, p = 2, S, Snp = 0, Ms, grads;
            ec_cfg_init(&c, st, 3, ZERO_F16, 2, 1);
            c.comm_dtype = ZERO_F32;
            if (st == 3) c.persist = 20;
            plain = ec_run(&c);
            c.offload_opt = ZERO_OFFLOAD_CPU;
            c.offload_param = par ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
            c.sub_group = T;
            off = ec_run(&c);
            ZT_CHECKF(plain->rc == ZERO_OK && off->rc == ZERO_OK, "%s %s", plain->err, off->err);
            S = off->plan_shard_total;
            Ms = off->max_group / 3;
            grads = 4 * S + 4 * Ms; /* host: comm dtype f32, accum 2 (k > 0 lands in Ms first) */
            if (st == 3) Snp = (off->plan_total - off->persist_total) / 3;
            for (rk = 0; rk < 3; rk++) {
                const zero_engine_memory *pd = &plain->mem[rk], *od = &off->mem[rk],
                                         *oh = &off->host_mem[rk];
                ZT_CHECK(od->bytes[ZERO_MEM_MASTER] == 0 && od->bytes[ZERO_MEM_MOMENT1] == 0 &&
                         od->bytes[ZERO_MEM_MOMENT2] == 0);
                ZT_CHECK(oh->bytes[ZERO_MEM_MASTER] == 4 * S && oh->bytes[ZERO_MEM_MOMENT1] == 4 * S &&
                         oh->bytes[ZERO_MEM_MOMENT2] == 4 * S);
                ZT_CHECKF(od->total_bytes + 12 * S + 4 * S + (par ? p * Snp : 0) == pd->total_bytes,
                          "stage %d par %d: device %zu, plain %zu", st, par, od->total_bytes,
                          pd->total_bytes);
                ZT_CHECK(od->bytes[ZERO_MEM_GRAD] + 4 * S == pd->bytes[ZERO_MEM_GRAD]);
                ZT_CHECK(od->bytes[ZERO_MEM_BUCKET] == pd->bytes[ZERO_MEM_BUCKET]);
                ZT_CHECK(od->bytes[ZERO_MEM_PARAM] + (par ? p * Snp : 0) == pd->bytes[ZERO_MEM_PARAM]);
                ZT_CHECK(oh->bytes[ZERO_MEM_GRAD] == grads);
                ZT_CHECKF(oh->bytes[ZERO_MEM_PARAM] == 2 * T * p + (par ? p * Snp : 0),
                          "stage %d par %d: host params %zu", st, par, oh->bytes[ZERO_MEM_PARAM]);
                ZT_CHECK(oh->total_bytes == 12 * S + grads + 2 * T * p + (par ? p * Snp : 0));
                ZT_CHECK(oh->peak_total_bytes == oh->total_bytes);
                ZT_CHECK(oh->allocations == (size_t)(par ? 7 : 6));
                ZT_CHECK(plain->host_mem[rk].total_bytes == 0);
            }
            ec_result_free(plain);
            ec_result_free(off);
        }
}

/* The estimator's offload rows (paper mode): the optimizer state moves to host or NVMe,
   with offload_param the param shard too. */
ZT_TEST(estimator_offload_tiers)
{
    zero_estimate_desc d;
    zero_estimate a, b;
    uint64_t mx_plain, mx_off;
    memset(&d, 0, sizeof d);
    d.params = 1000003;
    d.ranks = 4;
    d.stage = 3;
    ZT_CHECK(zero_estimate_compute(&d, &a) == ZERO_OK);
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_param = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_estimate_compute(&d, &b) == ZERO_OK);
    ZT_CHECK(b.device_bytes == a.grads_bytes && b.params_bytes == 0);
    ZT_CHECK(b.nvme_bytes == a.optimizer_bytes && b.host_bytes == a.params_bytes);
    d.offload_param = ZERO_OFFLOAD_NONE;
    d.stage = 2;
    d.offload_param = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_estimate_compute(&d, &b) == ZERO_ERROR_INVALID_ARGUMENT);
    d.offload_param = ZERO_OFFLOAD_NONE;
    d.offload_optimizer = ZERO_OFFLOAD_NONE;
    ZT_CHECK(zero_estimate_max_params(&d, 1u << 30, &mx_plain) == ZERO_OK);
    d.offload_optimizer = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_estimate_max_params(&d, 1u << 30, &mx_off) == ZERO_OK);
    /* stage 2, N = 4: 2 Psi + 14 Psi/4 = 5.5 Psi vs 2 Psi + 2 Psi/4 = 2.5 Psi */
    ZT_CHECK(mx_off > 2 * mx_plain && mx_off < 3 * mx_plain);
}

ZT_TEST(memory_tier_query_errors)
{
    zero_engine_memory m;
    ZT_CHECK(zero_engine_memory_tier(NULL, ZERO_TIER_HOST, &m) == ZERO_ERROR_INVALID_ARGUMENT);
}


/* ---- the NVMe tier (ZeRO-Infinity): optimizer state in files under nvme_path ---- */

static char nvme_dir[256];

static const char *make_nvme_dir(void) { return nd_make_dir(nvme_dir, sizeof nvme_dir, "offload"); }

ZT_TEST(nvme_step_is_bit_identical)
{
    static const int worlds[] = {1, 2, 4};
    const char *dir = make_nvme_dir();
    int st, wi, dt, acc;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (st = 1; st <= 3; st++)
        for (wi = 0; wi < 3; wi++)
            for (dt = 0; dt < 2; dt++)
                for (acc = 0; acc < 2; acc++) {
                    ec_cfg c;
                    char label[128];
                    if (zt_quick() && wi == 1) continue;
                    ec_cfg_init(&c, st, worlds[wi], dt ? ZERO_BF16 : ZERO_F16, acc ? 2 : 1, 3);
                    c.offload_opt = ZERO_OFFLOAD_NVME;
                    c.offload_param = st == 3 && acc ? (dt ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU)
                                                     : ZERO_OFFLOAD_NONE;
                    if (st == 3 && dt && !acc) c.persist = 20; /* persistent groups beside */
                    c.nvme_path = dir;
                    c.sub_group = 31; /* many tiles: reads ahead and writes behind overlap */
                    c.clip = dt ? 0.05f : 0.0f;
                    snprintf(label, sizeof label, "nvme stage %d N %d %s accum %d", st, worlds[wi],
                             dt ? "bf16" : "fp16", c.accum);
                    check_offload_exact(&c, label);
                }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* NVMe tier bytes: master, m, v of the shard (4 S each) plus the alignment of each tile's
   record to ZERO_IO_ALIGN; the host keeps only the swap slots and the staging tiles. */
ZT_TEST(nvme_tier_accounting)
{
    const char *dir = make_nvme_dir();
    ec_cfg c;
    ec_result *r;
    int rk;
    size_t T = 40;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    ec_cfg_init(&c, 2, 2, ZERO_F16, 1, 1);
    c.offload_opt = ZERO_OFFLOAD_NVME;
    c.nvme_path = dir;
    c.sub_group = T;
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    for (rk = 0; rk < 2 && r->rc == ZERO_OK; rk++) {
        const zero_engine_memory *n = &r->nvme_mem[rk], *h = &r->host_mem[rk], *d = &r->mem[rk];
        size_t S = r->plan_shard_total, pad = n->bytes[ZERO_MEM_SCRATCH];
        ZT_CHECK(n->bytes[ZERO_MEM_MASTER] == 4 * S && n->bytes[ZERO_MEM_MOMENT1] == 4 * S &&
                 n->bytes[ZERO_MEM_MOMENT2] == 4 * S);
        /* each tile's record (12 x its elements, at most 12 T bytes) is padded to the
           alignment: less than one ZERO_IO_ALIGN per tile */
        ZT_CHECK(n->total_bytes == 12 * S + pad && n->total_bytes % ZERO_IO_ALIGN == 0);
        ZT_CHECK(pad < ZERO_IO_ALIGN * (S / T + (size_t)r->ngroups));
        ZT_CHECK(n->allocations == 1);
        ZT_CHECK(h->bytes[ZERO_MEM_MASTER] == 0 && h->bytes[ZERO_MEM_MOMENT1] == 0);
        ZT_CHECK(h->bytes[ZERO_MEM_SCRATCH] == 4 * zero_io_align_up(12 * T)); /* 4 swap slots */
        ZT_CHECK(d->bytes[ZERO_MEM_MASTER] == 0);
    }
    ec_result_free(r);
    /* both on NVMe: the tier's total is the sum of its categories */
    ec_cfg_init(&c, 3, 2, ZERO_F16, 1, 1);
    c.offload_opt = ZERO_OFFLOAD_NVME;
    c.offload_param = ZERO_OFFLOAD_NVME;
    c.nvme_path = dir;
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    if (r->rc == ZERO_OK) {
        const zero_engine_memory *n = &r->nvme_mem[0];
        size_t S = r->plan_shard_total, k, sum = 0;
        for (k = 0; k < ZERO_MEM_COUNT; k++) sum += n->bytes[k];
        ZT_CHECK(n->bytes[ZERO_MEM_MASTER] == 4 * S && n->bytes[ZERO_MEM_PARAM] == 2 * S);
        ZT_CHECK(n->total_bytes == sum && n->allocations == 2);
    }
    ec_result_free(r);
    /* stage 3, optimizer on the CPU, param shards on NVMe (a skipped step in the middle):
       the same bits as the plain run; the NVMe tier holds p S of params plus alignment */
    ec_cfg_init(&c, 3, 2, ZERO_F16, 1, 3);
    c.offload_opt = ZERO_OFFLOAD_CPU;
    c.offload_param = ZERO_OFFLOAD_NVME;
    c.nvme_path = dir;
    c.fault_steps[0] = 1;
    c.nfault = 1;
    c.fault_rank = 0;
    check_offload_exact(&c, "stage 3 param nvme");
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    for (rk = 0; rk < 2 && r->rc == ZERO_OK; rk++) {
        const zero_engine_memory *n = &r->nvme_mem[rk], *d = &r->mem[rk];
        ZT_CHECK(n->bytes[ZERO_MEM_PARAM] == 2 * r->plan_shard_total && n->bytes[ZERO_MEM_MASTER] == 0);
        ZT_CHECK(n->total_bytes % ZERO_IO_ALIGN == 0 && n->total_bytes >= 2 * r->plan_shard_total);
        ZT_CHECK(n->total_bytes == n->bytes[ZERO_MEM_PARAM] + n->bytes[ZERO_MEM_SCRATCH]);
        ZT_CHECK(d->bytes[ZERO_MEM_PARAM] == 0);
    }
    ec_result_free(r);
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* Faults: a missing nvme_path fails every rank's commit with the path named; a file changed
   under the engine fails the next step on every rank (checksum per tile), no hang. */
typedef struct fault_ctx {
    const char *dir;
    int corrupt; /* 1: overwrite bytes of rank 0's file between steps; 2: truncate it;
                    3: overwrite its stage-3 param file (the next gather fails) */
    zero_result step_rc[2];
    char err[2][512];
} fault_ctx;

static zero_result fault_rank(int rank, zero_comm *comm, void *user)
{
    fault_ctx *F = (fault_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    float vals[300];
    int t, s, i;
    memset(&d, 0, sizeof d);
    d.stage = F->corrupt == 3 ? 3 : 2;
    d.offload_optimizer = F->corrupt == 3 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NVME;
    d.offload_param = F->corrupt == 3 ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_NONE;
    d.nvme_path = F->dir;
    d.sub_group_size = 64;
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    d.device = dev;
    d.comm = comm;
    for (i = 0; i < 300; i++) vals[i] = 0.01f * (float)i;
    r = zero_engine_create(&d, &e);
    if (!r) r = zero_engine_add_tensor(e, "w", 300, 0, 0, &t);
    if (!r) r = zero_engine_commit(e);
    if (!r) r = zero_engine_set_tensor(e, t, vals);
    if (r) {
        snprintf(F->err[rank], sizeof F->err[rank], "%s", zero_last_error());
        F->step_rc[rank] = r;
        goto out;
    }
    for (s = 0; s < 2; s++) {
        void *pp, *gp;
        if (s == 1 && rank == 0 && F->corrupt) { /* between the steps: change rank 0's file */
            DIR *dd = opendir(F->dir);
            struct dirent *de;
            while (dd && (de = readdir(dd)) != NULL) {
                char path[512];
                int fd;
                if (!strstr(de->d_name, "-r0-") || !strstr(de->d_name, F->corrupt == 3 ? "param" : "optim"))
                    continue;
                snprintf(path, sizeof path, "%s/%s", F->dir, de->d_name);
                fd = open(path, O_WRONLY);
                if (fd >= 0) {
                    if (F->corrupt != 2) {
                        char junk[64];
                        memset(junk, 0x5a, sizeof junk);
                        ZT_CHECK(pwrite(fd, junk, sizeof junk, 100) == (ssize_t)sizeof junk);
                    } else {
                        ZT_CHECK(ftruncate(fd, 4096) == 0);
                    }
                    close(fd);
                }
            }
            if (dd) closedir(dd);
        }
        if ((r = zero_engine_gather(e, 0, &pp)) || (r = zero_engine_grads(e, 0, &gp))) break;
        for (i = 0; i < 300; i++) ((uint16_t *)gp)[i] = zero_f32_to_f16(100.0f);
        if ((r = zero_engine_release(e, 0)) || (r = zero_engine_grads_ready(e, 0))) break;
        r = zero_engine_step(e, NULL);
        if (r) break;
    }
    F->step_rc[rank] = r;
    snprintf(F->err[rank], sizeof F->err[rank], "%s", r ? zero_last_error() : "");
out:
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* ---- the NVMe tier between steps: each byte moved once ---- */

typedef struct once_run {
    const char *dir, *ckdir;
    int failures;
} once_run;

static zero_result once_rank(int rank, zero_comm *comm, void *user)
{
    static const size_t sizes[] = {37, 300, 5, 1000, 13, 250};
    static const int groups[] = {0, 0, 1, 2, 2, 3};
    once_run *o = (once_run *)user;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL, *e2 = NULL;
    zero_engine_memory nv;
    zero_io_stats s0, s1;
    uint64_t bytes, rd, wr;
    float *vals = NULL;
    int t, pass;
    (void)rank;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    vals = (float *)malloc(1000 * sizeof *vals);
    for (pass = 0; pass < 2; pass++) {
        zero_engine **pe = pass ? &e2 : &e;
        memset(&d, 0, sizeof d);
        d.stage = 3;
        d.device = dev;
        d.comm = comm;
        d.offload_optimizer = ZERO_OFFLOAD_NVME;
        d.offload_param = ZERO_OFFLOAD_NVME;
        d.nvme_path = o->dir;
        d.sub_group_size = 64; /* many tiles, tensors across tiles and tiles across tensors */
        ZT_CHECK(zero_engine_create(&d, pe) == ZERO_OK);
        for (t = 0; t < 6; t++) {
            char name[16];
            snprintf(name, sizeof name, "t%d", t);
            ZT_CHECK(zero_engine_add_tensor(*pe, name, sizes[t], groups[t], 0, NULL) == ZERO_OK);
        }
        ZT_CHECK(zero_engine_commit(*pe) == ZERO_OK);
    }
    /* the tier's bytes: 12 S of optimizer records, p S_np of param shards */
    ZT_CHECK(zero_engine_memory_tier(e, ZERO_TIER_NVME, &nv) == ZERO_OK);
    bytes = nv.bytes[ZERO_MEM_MASTER] + nv.bytes[ZERO_MEM_MOMENT1] + nv.bytes[ZERO_MEM_MOMENT2] +
            nv.bytes[ZERO_MEM_PARAM];
    /* commit writes nothing: the preallocated files read as zeros */
    ZT_CHECK(zero_engine_nvme_stats(e, &s0) == ZERO_OK);
    ZT_CHECKF(s0.bytes_written == 0 && s0.bytes_read == 0, "commit moved %llu / %llu bytes",
              (unsigned long long)s0.bytes_read, (unsigned long long)s0.bytes_written);
    /* set_tensor of every tensor: each record and shard read at most once */
    for (t = 0; t < 6; t++) {
        size_t i;
        for (i = 0; i < sizes[t]; i++) vals[i] = 0.001f * (float)(i + 7 * t);
        ZT_CHECK(zero_engine_set_tensor(e, t, vals) == ZERO_OK);
    }
    ZT_CHECK(zero_engine_nvme_stats(e, &s1) == ZERO_OK);
    ZT_CHECKF(s1.bytes_read <= bytes && s1.bytes_written <= bytes,
              "set_tensor of every tensor read %llu, wrote %llu bytes of a %llu-byte tier",
              (unsigned long long)s1.bytes_read, (unsigned long long)s1.bytes_written,
              (unsigned long long)bytes);
    /* the values are there */
    ZT_CHECK(zero_engine_read_tensor(e, 3, ZERO_STATE_MASTER, vals, NULL) == ZERO_OK);
    /* save reads each byte of the tier at most once (records never written since commit are
       the file's zeros and not read at all) */
    ZT_CHECK(zero_engine_nvme_stats(e, &s0) == ZERO_OK);
    ZT_CHECK(zero_engine_save(e, o->ckdir) == ZERO_OK);
    ZT_CHECK(zero_engine_nvme_stats(e, &s1) == ZERO_OK);
    rd = s1.bytes_read - s0.bytes_read;
    ZT_CHECKF(rd <= bytes && rd > 0, "save read %llu bytes of a %llu-byte tier", (unsigned long long)rd,
              (unsigned long long)bytes);
    /* load: every record and shard read at most once and written at most once */
    ZT_CHECK(zero_engine_nvme_stats(e2, &s0) == ZERO_OK);
    ZT_CHECK(zero_engine_load(e2, o->ckdir) == ZERO_OK);
    ZT_CHECK(zero_engine_nvme_stats(e2, &s1) == ZERO_OK);
    rd = s1.bytes_read - s0.bytes_read;
    wr = s1.bytes_written - s0.bytes_written;
    ZT_CHECKF(rd <= bytes && wr <= bytes && wr > 0, "load read %llu, wrote %llu of a %llu-byte tier",
              (unsigned long long)rd, (unsigned long long)wr, (unsigned long long)bytes);
    for (t = 0; t < 6; t++) { /* and the loaded engine holds what the first one had */
        float a[1000], b[1000];
        zero_range ra, rb;
        int k;
        for (k = ZERO_STATE_MASTER; k <= ZERO_STATE_V; k++) {
            ZT_CHECK(zero_engine_read_tensor(e, t, (zero_state_kind)k, a, &ra) == ZERO_OK);
            ZT_CHECK(zero_engine_read_tensor(e2, t, (zero_state_kind)k, b, &rb) == ZERO_OK);
            if (ra.numel != rb.numel ||
                memcmp(a + ra.offset, b + rb.offset, ra.numel * sizeof(float)) != 0)
                o->failures++;
        }
    }
    free(vals);
    zero_engine_destroy(e);
    zero_engine_destroy(e2);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* The NVMe tier between steps, counted in bytes by the tier's I/O engine: commit writes
   nothing (the preallocated files read as zeros), set_tensor of every tensor reads and
   writes each record and param shard at most once (a write-back cache instead of a
   read-modify-write per tensor), a save reads each byte at most once, a load reads and
   writes each at most once, and the loaded state equals the saved one. */
ZT_TEST(nvme_tier_moves_each_byte_once)
{
    char d1[64], d2[64];
    once_run o;
    snprintf(d1, sizeof d1, "/tmp/zero-test-once-XXXXXX");
    snprintf(d2, sizeof d2, "/tmp/zero-test-oncek-XXXXXX");
    memset(&o, 0, sizeof o);
    o.dir = mkdtemp(d1);
    o.ckdir = mkdtemp(d2);
    ZT_CHECK(o.dir && o.ckdir);
    if (!o.dir || !o.ckdir) return;
    ZT_CHECK(zero_local_run(2, once_rank, &o) == ZERO_OK);
    ZT_CHECKF(o.failures == 0, "%d tensors differ after the load", o.failures);
    ZT_CHECK(nd_dir_is_empty(o.dir));
    rmdir(o.dir);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", o.ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
}

ZT_TEST(nvme_faults_fail_every_rank)
{
    fault_ctx F;
    const char *dir = make_nvme_dir();
    int mode;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    /* a missing directory */
    memset(&F, 0, sizeof F);
    F.dir = "/nonexistent/zero-nvme";
    ZT_CHECK(zero_local_run(2, fault_rank, &F) == ZERO_OK);
    ZT_CHECK(F.step_rc[0] == ZERO_ERROR_IO && F.step_rc[1] == ZERO_ERROR_IO);
    ZT_CHECKF(strstr(F.err[0], "/nonexistent/zero-nvme") != NULL, "%s", F.err[0]);
    for (mode = 1; mode <= 3; mode++) {
        memset(&F, 0, sizeof F);
        F.dir = dir;
        F.corrupt = mode;
        ZT_CHECK(zero_local_run(2, fault_rank, &F) == ZERO_OK);
        ZT_CHECKF(F.step_rc[0] == ZERO_ERROR_IO, "mode %d: %d %s", mode, (int)F.step_rc[0], F.err[0]);
        ZT_CHECKF(F.step_rc[1] == ZERO_ERROR_IO, "mode %d: %d %s", mode, (int)F.step_rc[1], F.err[1]);
        ZT_CHECKF(strstr(F.err[0], "NVMe") && strstr(F.err[0], dir), "%s", F.err[0]);
        ZT_CHECKF(strstr(F.err[1], "rank 0") != NULL, "%s", F.err[1]);
    }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* ---- checkpoints of offloaded runs ---- */

/* Trains steps [s0, s1) of cfg on e (the harness' forward, backward and gradients). */
static zero_result ck_train(zero_engine *e, const ec_cfg *c, const int *ids, int rank, int s0, int s1)
{
    zero_result r = ZERO_OK;
    int s;
    for (s = s0; s < s1 && r == ZERO_OK; s++) {
        float scale = zero_engine_loss_scale(e);
        r = ec_micro_steps(c, e, ids, rank, s, scale);
        if (r == ZERO_OK) r = zero_engine_step(e, NULL);
    }
    return r;
}

typedef struct ck_ctx {
    ec_ctx base;
    const char *ckdir, *nvme;
    int split;
    zero_offload_device save_opt, save_par, load_opt, load_par, save_grad, load_grad;
} ck_ctx;

/* Engine A (the save settings) trains steps [0, split) and saves; engine B (the load
   settings) loads, trains the rest, and its state goes to the result. */
static zero_result ck_rank(int rank, zero_comm *comm, void *user)
{
    ck_ctx *X = (ck_ctx *)user;
    const ec_cfg *c = X->base.cfg;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T], t, phase;
    float tmp[512];
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    for (phase = 0; phase < 2 && r == ZERO_OK; phase++) {
        ec_engine_desc(c, &d);
        d.device = dev;
        d.comm = comm;
        d.nvme_path = X->nvme;
        d.offload_optimizer = phase ? X->load_opt : X->save_opt;
        d.offload_param = phase ? X->load_par : X->save_par;
        d.offload_gradients = phase ? X->load_grad : X->save_grad;
        r = zero_engine_create(&d, &e);
        if (r == ZERO_OK) r = ec_add_tensors(e, c, ids);
        if (r == ZERO_OK) r = zero_engine_commit(e);
        if (r != ZERO_OK) break;
        if (phase == 0) {
            r = ec_set_init(e, c, ids, tmp);
            if (r == ZERO_OK) r = ck_train(e, c, ids, rank, 0, X->split);
            if (r == ZERO_OK) r = zero_engine_save(e, X->ckdir);
        } else {
            r = zero_engine_load(e, X->ckdir);
            if (r == ZERO_OK) r = ck_train(e, c, ids, rank, X->split, c->steps);
            for (t = 0; t < c->ntensors && r == ZERO_OK; t++) r = ec_read_states(e, &X->base, rank, t, ids[t]);
        }
        zero_engine_destroy(e);
        e = NULL;
    }
    if (r != ZERO_OK && rank == 0) snprintf(X->base.res->err, sizeof X->base.res->err, "%s", zero_last_error());
    zero_device_destroy(dev);
    return r;
}

/* A run saved with its optimizer state (and stage-3 params, and the gradients' tier) on the
   CPU or NVMe and loaded into an engine with the same, another or no offload continues
   bit-identically to the plain run without a checkpoint. (Saves come between steps, when no
   gradient is held: the gradient tier has nothing to save.) */
ZT_TEST(checkpoint_of_offloaded_state)
{
    static const zero_offload_device combos[][6] = {
        /* save opt, save param, load opt, load param, save grads, load grads */
        {ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NONE, 0, 0},
        {ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE, 0, 0},
        {ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE, 0, 0},
        {ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME, 0, 0},
        {ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_CPU, 0, 0},
        /* the gradients on NVMe: saved from, loaded into, and both */
        {ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NVME, 0},
        {ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE, 0, ZERO_OFFLOAD_NVME},
        {ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME,
         ZERO_OFFLOAD_NVME},
    };
    const int ncombos = (int)(sizeof combos / sizeof combos[0]);
    const char *dir = make_nvme_dir();
    char ckdir[300];
    int st, ci;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    for (st = 1; st <= 3; st++)
        for (ci = 0; ci < ncombos; ci++) {
            ec_cfg c;
            ck_ctx X;
            ec_result *ref, *got;
            char why[160];
            if ((combos[ci][1] || combos[ci][3]) && st != 3) continue;
            ec_cfg_init(&c, st, 2, ZERO_F16, 2, 4);
            c.sub_group = 29;
            ref = ec_run(&c);
            memset(&X, 0, sizeof X);
            X.ckdir = ckdir;
            X.nvme = dir;
            X.split = 2;
            X.save_opt = combos[ci][0];
            X.save_par = combos[ci][1];
            X.load_opt = combos[ci][2];
            X.load_par = combos[ci][3];
            X.save_grad = combos[ci][4];
            X.load_grad = combos[ci][5];
            got = ec_run_with(&c, &X.base, ck_rank, &X);
            ZT_CHECKF(ref->rc == ZERO_OK && got->rc == ZERO_OK, "stage %d combo %d: %s", st, ci, got->err);
            if (ref->rc == ZERO_OK && got->rc == ZERO_OK)
                ZT_CHECKF(ec_same_state(&c, ref, got, why, sizeof why), "stage %d combo %d: %s", st, ci, why);
            ec_result_free(ref);
            ec_result_free(got);
        }
    {   /* the checkpoint's files, then the directory */
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

int main(void)
{
    ZT_RUN(knobs_validated_with_clear_errors);
    ZT_RUN(host_device_budget);
    ZT_RUN(offloaded_step_is_bit_identical);
    ZT_RUN(offload_exact_with_faults_and_settings);
    ZT_RUN(over_budget_commit_names_the_fitting_offload);
    ZT_RUN(tier_accounting_matches_the_formula);
    ZT_RUN(grads_off_device_are_exact);
    ZT_RUN(device_bytes_with_both_offloads_do_not_grow_with_psi);
    ZT_RUN(estimator_offload_tiers);
    ZT_RUN(memory_tier_query_errors);
    ZT_RUN(nvme_step_is_bit_identical);
    ZT_RUN(nvme_tier_accounting);
    ZT_RUN(nvme_tier_moves_each_byte_once);
    ZT_RUN(nvme_faults_fail_every_rank);
    ZT_RUN(checkpoint_of_offloaded_state);
    return zt_summary();
}
