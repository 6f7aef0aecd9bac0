/* Partial optimizer offload (offload_optimizer_ratio, DeepSpeed's offload_optimizer.ratio):
   the first H = max(1, floor(r S + 0.5)) elements of each rank's optimizer shard in the host
   (or NVMe) tier, the rest on the device. Checked here: bit-identical to the run without
   offload at every r (shards of a few hundred elements, where DeepSpeed's sub-groups of 1e9
   elements would offload everything), the accounting of each tier against the formula with
   r, the descriptor's validation, the commit's agreement across ranks, and checkpoints saved
   with one r that resume with another. */
#define _XOPEN_SOURCE 700
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/nvme_dir.h"

#include <sys/stat.h>
#include <unistd.h>

static const double ratios[] = {0.01, 0.3, 0.5, 0.999, 1.0};
#define NRATIOS ((int)(sizeof ratios / sizeof ratios[0]))

/* The split the engine documents, computed here in long double: r S rounded to nearest
   (halves up), at least 1, at most S. */
static size_t host_part(size_t S, double r)
{
    long double h = floorl((long double)r * (long double)S + 0.5L);
    size_t H = h >= (long double)S ? S : (size_t)h;
    if (S == 0) return 0;
    return H < 1 ? 1 : H;
}

/* Runs c without offload and with it at ratio r: same master, m, v, params, step infos. */
static void check_ratio_exact(ec_cfg *c, const char *label)
{
    ec_result *ref, *off;
    char why[160];
    int s, rk;
    zero_offload_device oo = c->offload_opt;
    double r = c->offload_ratio;
    c->offload_opt = ZERO_OFFLOAD_NONE;
    c->offload_ratio = 0.0;
    ref = ec_run(c);
    c->offload_opt = oo;
    c->offload_ratio = r;
    off = ec_run(c);
    ZT_CHECKF(ref->rc == ZERO_OK, "%s (plain): %s", label, ref->err);
    ZT_CHECKF(off->rc == ZERO_OK, "%s (ratio): %s", label, off->err);
    if (ref->rc == ZERO_OK && off->rc == ZERO_OK) {
        ZT_CHECKF(off->params_agree, "%s: ranks hold different params", label);
        ZT_CHECKF(ec_same_state(c, ref, off, why, sizeof why), "%s: %s", label, why);
        for (s = 0; s < c->steps; s++)
            for (rk = 0; rk < c->world; rk++)
                ZT_CHECKF(memcmp(&ref->info[rk][s], &off->info[rk][s], sizeof ref->info[rk][s]) == 0,
                          "%s: step %d rank %d: info differs", label, s, rk);
    }
    ec_result_free(ref);
    ec_result_free(off);
}

/* Stages 1-3 (stage 0 allows no offload; the plain runs of every stage are the same bits,
   tests/test_engine.c), N = 1, 2, 3, every ratio, fp16 and bf16, accumulation 1 and 2,
   clipping; tiles of 23 elements so the split falls inside tiles, tensors and groups. */
ZT_TEST(every_ratio_is_bit_identical)
{
    int st, w, ri, dt;
    for (st = 1; st <= 3; st++)
        for (w = 1; w <= 3; w++)
            for (ri = 0; ri < NRATIOS; ri++)
                for (dt = 0; dt < 2; dt++) {
                    ec_cfg c;
                    char label[128];
                    if (zt_quick() && dt && w != 2) continue;
                    ec_cfg_init(&c, st, w, dt ? ZERO_BF16 : ZERO_F16, 1 + dt, 3);
                    c.offload_opt = ZERO_OFFLOAD_CPU;
                    c.offload_ratio = ratios[ri];
                    c.sub_group = 23;
                    c.clip = dt ? 0.05f : 0.0f;
                    if (st == 3 && dt) c.persist = 20;
                    snprintf(label, sizeof label, "stage %d N %d r %g %s", st, w, ratios[ri],
                             dt ? "bf16 accum 2 clip" : "fp16");
                    check_ratio_exact(&c, label);
                }
}

/* The NVMe tier with a ratio, fp32 communication through buckets, prefetch and a skipped
   (inf) step; and big tiles (one per group, the split inside a group). */
ZT_TEST(ratio_exact_on_nvme_and_with_faults)
{
    char dbuf[64];
    const char *dir = nd_make_dir(dbuf, sizeof dbuf, "ratio");
    int st, ri;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (st = 1; st <= 3; st++)
        for (ri = 0; ri < NRATIOS; ri++) {
            ec_cfg c;
            char label[128];
            ec_cfg_init(&c, st, 2, ZERO_F16, 2, 3);
            c.comm_dtype = ZERO_F32;
            c.bucket = 300;
            c.prefetch = 2;
            c.offload_opt = ri & 1 ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
            c.nvme_path = dir;
            c.offload_ratio = ratios[ri];
            c.sub_group = ri == 2 ? 0 : 31;
            c.fault_steps[0] = 1;
            c.nfault = 1;
            c.fault_rank = 1;
            c.fault_inf = 1;
            snprintf(label, sizeof label, "stage %d r %g %s, skip at step 1", st, ratios[ri],
                     ri & 1 ? "nvme" : "cpu");
            check_ratio_exact(&c, label);
        }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* Device, host and NVMe bytes of every rank against the formula: with S the shard, H the
   host part, c the comm dtype's bytes, the device holds master, m, v of S - H elements (4
   each) and their gradients ((S - H) c, GRAD) on top of the ratio-1 run's device bytes;
   the host (or NVMe) tier holds master, m, v of H elements; nothing else changes. */
ZT_TEST(tiers_hold_the_formula_with_r)
{
    char dbuf[64];
    const char *dir = nd_make_dir(dbuf, sizeof dbuf, "ratio");
    int st, ri, nv, rk;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (st = 1; st <= 3; st++)
        for (nv = 0; nv < 2; nv++)
            for (ri = 0; ri < NRATIOS; ri++) {
                ec_cfg c;
                ec_result *one, *part;
                size_t S, H, cb = 4;
                ec_cfg_init(&c, st, 3, ZERO_F16, 2, 1);
                c.comm_dtype = ZERO_F32;
                c.offload_opt = nv ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
                c.nvme_path = dir;
                c.sub_group = 40;
                one = ec_run(&c);
                c.offload_ratio = ratios[ri];
                part = ec_run(&c);
                ZT_CHECKF(one->rc == ZERO_OK && part->rc == ZERO_OK, "%s %s", one->err, part->err);
                if (one->rc != ZERO_OK || part->rc != ZERO_OK) goto next;
                S = part->plan_shard_total;
                H = host_part(S, ratios[ri]);
                for (rk = 0; rk < 3; rk++) {
                    const zero_engine_memory *d1 = &one->mem[rk], *dr = &part->mem[rk];
                    const zero_engine_memory *t1 = nv ? &one->nvme_mem[rk] : &one->host_mem[rk];
                    const zero_engine_memory *tr = nv ? &part->nvme_mem[rk] : &part->host_mem[rk];
                    int k;
                    ZT_CHECKF(d1->bytes[ZERO_MEM_MASTER] == 0 && dr->bytes[ZERO_MEM_MASTER] == 4 * (S - H) &&
                                  dr->bytes[ZERO_MEM_MOMENT1] == 4 * (S - H) &&
                                  dr->bytes[ZERO_MEM_MOMENT2] == 4 * (S - H),
                              "stage %d r %g rank %d: device master %zu, S %zu H %zu", st, ratios[ri], rk,
                              dr->bytes[ZERO_MEM_MASTER], S, H);
                    ZT_CHECKF(dr->bytes[ZERO_MEM_GRAD] == d1->bytes[ZERO_MEM_GRAD] + cb * (S - H),
                              "stage %d r %g: device grad %zu vs %zu + %zu", st, ratios[ri],
                              dr->bytes[ZERO_MEM_GRAD], d1->bytes[ZERO_MEM_GRAD], cb * (S - H));
                    ZT_CHECK(dr->total_bytes == d1->total_bytes + (12 + cb) * (S - H));
                    ZT_CHECKF(t1->bytes[ZERO_MEM_MASTER] == 4 * S && tr->bytes[ZERO_MEM_MASTER] == 4 * H &&
                                  tr->bytes[ZERO_MEM_MOMENT1] == 4 * H && tr->bytes[ZERO_MEM_MOMENT2] == 4 * H,
                              "stage %d r %g %s: tier master %zu, want %zu", st, ratios[ri],
                              nv ? "nvme" : "host", tr->bytes[ZERO_MEM_MASTER], 4 * H);
                    for (k = 0; k < ZERO_MEM_COUNT; k++) /* nothing else moves */
                        if (k != ZERO_MEM_MASTER && k != ZERO_MEM_MOMENT1 && k != ZERO_MEM_MOMENT2 &&
                            k != ZERO_MEM_SCRATCH)
                            ZT_CHECKF(tr->bytes[k] == t1->bytes[k], "category %d: %zu vs %zu", k,
                                      tr->bytes[k], t1->bytes[k]);
                    if (!nv) ZT_CHECK(tr->total_bytes + 12 * (S - H) == t1->total_bytes);
                }
            next:
                ec_result_free(one);
                ec_result_free(part);
            }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* A device budget that the ratio-1 run fits and the ratio-0.5 run does not: commit fails
   with OUT_OF_MEMORY naming ratio 1 and its exact device bytes; with it, it trains. */
ZT_TEST(over_budget_names_ratio_one)
{
    ec_cfg c;
    ec_result *r;
    size_t one;
    ec_cfg_init(&c, 2, 2, ZERO_F16, 1, 2);
    c.sizes[5] = 4000;
    c.offload_opt = ZERO_OFFLOAD_CPU;
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    one = r->mem[0].peak_total_bytes;
    ec_result_free(r);
    c.device_capacity = one;
    c.offload_ratio = 0.5;
    r = ec_run(&c);
    ZT_CHECK(r->rc == ZERO_ERROR_OUT_OF_MEMORY);
    {
        char want[96];
        snprintf(want, sizeof want, "offload_optimizer_ratio=1 would fit (%zu device bytes)", one);
        ZT_CHECKF(strstr(r->err, want) != NULL, "%s", r->err);
    }
    ec_result_free(r);
    c.offload_ratio = 1.0;
    r = ec_run(&c);
    ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
    ec_result_free(r);
}

/* ---- the descriptor ---- */

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
    static const double bad[] = {-0.1, 1.5, -1.0, 2.0};
    int i;
    (void)rank;
    (void)user;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
#define DESC(...) (memset(&d, 0, sizeof d), d.stage = 2, d.offload_optimizer = ZERO_OFFLOAD_CPU, __VA_ARGS__, &d)
    for (i = 0; i < 4; i++) {
        ZT_CHECK(create_with(DESC(d.offload_optimizer_ratio = bad[i]), dev, comm) ==
                 ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECKF(strstr(zero_last_error(), "offload_optimizer_ratio") != NULL, "%s", zero_last_error());
    }
    ZT_CHECK(create_with(DESC(d.offload_optimizer_ratio = nan("")), dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "offload_optimizer_ratio") != NULL);
    ZT_CHECK(create_with(DESC(d.offload_optimizer = ZERO_OFFLOAD_NONE, d.offload_optimizer_ratio = 0.5),
                         dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "needs offload_optimizer") != NULL);
    ZT_CHECK(create_with(DESC(d.stage = 3, d.offload_param = ZERO_OFFLOAD_CPU, d.offload_optimizer_ratio = 0.5),
                         dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "offload_param") != NULL);
    ZT_CHECK(create_with(DESC(d.offload_optimizer = ZERO_OFFLOAD_NVME, d.nvme_path = "/tmp",
                              d.offload_gradients = ZERO_OFFLOAD_NVME, d.offload_optimizer_ratio = 0.5),
                         dev, comm) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "offload_gradients") != NULL);
    /* accepted: 1 with offload_param; tiny and exact-one ratios */
    ZT_CHECK(create_with(DESC(d.stage = 3, d.offload_param = ZERO_OFFLOAD_CPU, d.offload_optimizer_ratio = 1.0),
                         dev, comm) == ZERO_OK);
    ZT_CHECK(create_with(DESC(d.offload_optimizer_ratio = 1e-300), dev, comm) == ZERO_OK);
    /* resolved: 0 becomes 1 with offload, stays 0 without */
    memset(&got, 0, sizeof got);
    ZT_CHECK(zero_engine_create(DESC(d.device = dev, d.comm = comm), &e) == ZERO_OK);
    ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK && got.offload_optimizer_ratio == 1.0);
    zero_engine_destroy(e);
    e = NULL;
    ZT_CHECK(zero_engine_create(DESC(d.offload_optimizer = ZERO_OFFLOAD_NONE, d.device = dev, d.comm = comm),
                                &e) == ZERO_OK);
    ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK && got.offload_optimizer_ratio == 0.0);
    zero_engine_destroy(e);
#undef DESC
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(ratio_validated_with_clear_errors)
{
    ZT_CHECK(zero_local_run(1, knobs_rank, NULL) == ZERO_OK);
}

/* Two ranks with different ratios: commit fails with MISMATCH on both, naming the setting. */
static void ratio_desc(int rank, zero_engine_desc *d)
{
    d->stage = 2;
    d->offload_optimizer = ZERO_OFFLOAD_CPU;
    d->offload_optimizer_ratio = rank == 0 ? 0.5 : 0.25;
}

ZT_TEST(ranks_with_different_ratios_mismatch)
{
    char msg[400];
    ZT_CHECK(ec_commit_disagreeing(2, ratio_desc, msg, sizeof msg) == ZERO_ERROR_MISMATCH);
    ZT_CHECKF(strstr(msg, "offload_optimizer_ratio") != NULL, "%s", msg);
}

/* ---- checkpoints ---- */

/* Trains 2 steps with ratio a (or no offload), saves, loads into an engine with ratio b (or
   none) and trains 2 more: the same bits as 4 steps in one plain run. */
ZT_TEST(checkpoint_saved_with_one_ratio_resumes_with_another)
{
    static const double pairs[][2] = {{0.3, 0.7}, {0.01, 1.0}, {1.0, 0.5}, {0.999, 0.0}, {0.0, 0.3}};
    char dbuf[64];
    const char *dir = nd_make_dir(dbuf, sizeof dbuf, "ratio");
    char ckdir[300];
    int st, pi;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    for (st = 1; st <= 3; st++)
        for (pi = 0; pi < (int)(sizeof pairs / sizeof pairs[0]); pi++) {
            ec_cfg c;
            ec_job j1, j2;
            ec_result *ref, *a, *b;
            char why[160], cmd[400];
            ec_cfg_init(&c, st, 2, ZERO_F16, 2, 4);
            c.sub_group = 29;
            ref = ec_run(&c);
            memset(&j1, 0, sizeof j1);
            memset(&j2, 0, sizeof j2);
            j1.save_dir = ckdir;
            j1.first = 0;
            j1.last = 2;
            c.offload_opt = pairs[pi][0] > 0 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
            if (pi == 1) c.offload_opt = ZERO_OFFLOAD_NVME;
            c.nvme_path = dir;
            c.offload_ratio = pairs[pi][0];
            a = ec_run_job(&c, &j1);
            j2.load_dir = ckdir;
            j2.first = 2;
            j2.last = 4;
            c.offload_opt = pairs[pi][1] > 0 ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
            if (pi == 2) c.offload_opt = ZERO_OFFLOAD_NVME;
            c.offload_ratio = pairs[pi][1];
            b = ec_run_job(&c, &j2);
            ZT_CHECKF(ref->rc == ZERO_OK && a->rc == ZERO_OK && b->rc == ZERO_OK,
                      "stage %d pair %d: %s %s", st, pi, a->err, b->err);
            if (ref->rc == ZERO_OK && b->rc == ZERO_OK)
                ZT_CHECKF(ec_same_state(&c, ref, b, why, sizeof why), "stage %d r %g -> %g: %s", st,
                          pairs[pi][0], pairs[pi][1], why);
            ec_result_free(ref);
            ec_result_free(a);
            ec_result_free(b);
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckdir);
            ZT_CHECK(system(cmd) == 0);
        }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* ---- the estimator ---- */

/* Paper mode: the tier holds K H of the K S optimizer bytes per rank (H as the engine
   splits S = ceil(Psi / N)), the device the rest; validation as the engine's. */
ZT_TEST(estimator_splits_the_optimizer_state)
{
    zero_estimate_desc d;
    zero_estimate full, part;
    int ri, nv;
    for (nv = 0; nv < 2; nv++)
        for (ri = 0; ri < NRATIOS; ri++) {
            uint64_t S;
            memset(&d, 0, sizeof d);
            d.params = 1000003;
            d.ranks = 4;
            d.stage = 2;
            d.offload_optimizer = nv ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
            ZT_CHECK(zero_estimate_compute(&d, &full) == ZERO_OK);
            d.offload_optimizer_ratio = ratios[ri];
            ZT_CHECK(zero_estimate_compute(&d, &part) == ZERO_OK);
            S = (d.params + 3) / 4;
            ZT_CHECK((nv ? part.nvme_bytes : part.host_bytes) == 12 * (uint64_t)host_part((size_t)S, ratios[ri]));
            ZT_CHECK(part.optimizer_bytes == 12 * (S - host_part((size_t)S, ratios[ri])));
            ZT_CHECK(part.optimizer_bytes + (nv ? part.nvme_bytes : part.host_bytes) ==
                     (nv ? full.nvme_bytes : full.host_bytes));
            ZT_CHECK(part.device_bytes == full.device_bytes + part.optimizer_bytes);
        }
    memset(&d, 0, sizeof d);
    d.params = 1000;
    d.ranks = 2;
    d.stage = 1;
    d.offload_optimizer_ratio = 0.5; /* without offload */
    ZT_CHECK(zero_estimate_compute(&d, &part) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "offload_optimizer_ratio") != NULL);
    d.offload = 1;
    ZT_CHECK(zero_estimate_compute(&d, &part) == ZERO_OK && part.host_bytes == 12 * 250);
    d.offload_optimizer_ratio = nan("");
    ZT_CHECK(zero_estimate_compute(&d, &part) == ZERO_ERROR_INVALID_ARGUMENT);
    d.offload_optimizer_ratio = 1.01;
    ZT_CHECK(zero_estimate_compute(&d, &part) == ZERO_ERROR_INVALID_ARGUMENT);
}

int main(void)
{
    ZT_RUN(ratio_validated_with_clear_errors);
    ZT_RUN(ranks_with_different_ratios_mismatch);
    ZT_RUN(every_ratio_is_bit_identical);
    ZT_RUN(ratio_exact_on_nvme_and_with_faults);
    ZT_RUN(tiers_hold_the_formula_with_r);
    ZT_RUN(over_budget_names_ratio_one);
    ZT_RUN(checkpoint_saved_with_one_ratio_resumes_with_another);
    ZT_RUN(estimator_splits_the_optimizer_state);
    return zt_summary();
}
