/* zero_engine_offload_states / zero_engine_reload_states: the model states leave the device
   between training phases and come back. Checked here: a run that offloads and reloads in
   its middle ends with the same bits as the run that never did (stages 0-3, host memory and
   NVMe, every kind of state, with and without the engine's own offload settings); the
   device bytes between the calls drop by exactly the moved categories' bytes, which the
   host or NVMe tier then holds, and everything is back after the reload; every refused call
   (a group gathered, a gradient buffer out, a micro-step under way, a second offload, bad
   arguments) changes nothing. */
#define _XOPEN_SOURCE 700
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/nvme_dir.h"

#include <unistd.h>

static const unsigned masks[] = {ZERO_STATES_ALL, ZERO_STATES_PARAMS, ZERO_STATES_GRADS | ZERO_STATES_MASTER,
                                 ZERO_STATES_M | ZERO_STATES_V};

/* The device categories a mask moves. */
static int moves(unsigned what, int cat)
{
    return (cat == ZERO_MEM_PARAM && (what & ZERO_STATES_PARAMS)) ||
           (cat == ZERO_MEM_GRAD && (what & ZERO_STATES_GRADS)) ||
           (cat == ZERO_MEM_MASTER && (what & ZERO_STATES_MASTER)) ||
           (cat == ZERO_MEM_MOMENT1 && (what & ZERO_STATES_M)) ||
           (cat == ZERO_MEM_MOMENT2 && (what & ZERO_STATES_V));
}

/* c with offload + reload before step 2 against c without: same bits; the accounting. */
static void check_states(ec_cfg *c, const char *label, int expect_moved)
{
    ec_result *ref, *got;
    char why[160];
    int s, rk, k, tierk;
    unsigned what = c->states_what;
    c->states_what = 0;
    ref = ec_run(c);
    c->states_what = what;
    got = ec_run(c);
    ZT_CHECKF(ref->rc == ZERO_OK && got->rc == ZERO_OK, "%s: %s %s", label, ref->err, got->err);
    if (ref->rc != ZERO_OK || got->rc != ZERO_OK) goto out;
    ZT_CHECKF(got->params_agree, "%s: ranks disagree", label);
    ZT_CHECKF(ec_same_state(c, ref, got, why, sizeof why), "%s: %s", label, why);
    for (s = 0; s < c->steps; s++)
        for (rk = 0; rk < c->world; rk++)
            ZT_CHECKF(memcmp(&ref->info[rk][s], &got->info[rk][s], sizeof ref->info[rk][s]) == 0,
                      "%s: step %d rank %d: info differs", label, s, rk);
    tierk = c->states_tier == ZERO_OFFLOAD_NVME ? ZERO_TIER_NVME : ZERO_TIER_HOST;
    for (rk = 0; rk < c->world; rk++) {
        const zero_engine_memory *dev0 = &got->states_mem[rk][0][ZERO_TIER_DEVICE],
                                 *dev1 = &got->states_mem[rk][1][ZERO_TIER_DEVICE],
                                 *dev2 = &got->states_mem[rk][2][ZERO_TIER_DEVICE],
                                 *t0 = &got->states_mem[rk][0][tierk], *t1 = &got->states_mem[rk][1][tierk],
                                 *t2 = &got->states_mem[rk][2][tierk];
        size_t moved = 0;
        ZT_CHECKF(got->states_refused[rk] == ZERO_ERROR_INVALID_STATE, "%s: a gather while offloaded: %d",
                  label, (int)got->states_refused[rk]);
        for (k = 0; k < ZERO_MEM_COUNT; k++) {
            if (moves(what, k)) {
                moved += dev0->bytes[k];
                ZT_CHECKF(dev1->bytes[k] == 0, "%s: rank %d category %d: %zu device bytes left", label, rk, k,
                          dev1->bytes[k]);
                ZT_CHECKF(t1->bytes[k] == t0->bytes[k] + dev0->bytes[k],
                          "%s: rank %d category %d: tier %zu, want %zu + %zu", label, rk, k, t1->bytes[k],
                          t0->bytes[k], dev0->bytes[k]);
            } else {
                ZT_CHECK(dev1->bytes[k] == dev0->bytes[k] && t1->bytes[k] == t0->bytes[k]);
            }
            ZT_CHECK(dev2->bytes[k] == dev0->bytes[k] && t2->bytes[k] == t0->bytes[k]);
        }
        ZT_CHECKF(dev1->total_bytes == dev0->total_bytes - moved, "%s: device %zu, want %zu - %zu", label,
                  dev1->total_bytes, dev0->total_bytes, moved);
        if (tierk == ZERO_TIER_HOST) ZT_CHECK(t1->total_bytes == t0->total_bytes + moved);
        else /* the file: each buffer rounded up to 4096 */
            ZT_CHECK(t1->total_bytes >= t0->total_bytes + moved && t1->total_bytes < t0->total_bytes + moved + 6 * 4096);
        ZT_CHECK(dev2->total_bytes == dev0->total_bytes && t2->total_bytes == t0->total_bytes);
        if (expect_moved) ZT_CHECKF(moved > 0, "%s: nothing moved", label);
    }
out:
    ec_result_free(ref);
    ec_result_free(got);
}

/* Stages 0-3, N = 1 and 2, fp16 with accumulation 2 and bf16, every mask, host memory and
   NVMe; then with the engine's offload (optimizer on the host at ratio 0.5, so the device
   part's master, m, v and gradients move; stage 3 with the params on the host too). */
ZT_TEST(round_trip_in_the_middle_is_bit_identical)
{
    char dbuf[64];
    const char *dir = nd_make_dir(dbuf, sizeof dbuf, "states");
    int st, w, mi, nv, off;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (st = 0; st <= 3; st++)
        for (w = 1; w <= 2; w++)
            for (mi = 0; mi < 4; mi++)
                for (nv = 0; nv < 2; nv++)
                    for (off = 0; off < (st ? 3 : 1); off++) {
                        ec_cfg c;
                        char label[160];
                        if (zt_quick() && (w == 1 || nv) && mi) continue;
                        ec_cfg_init(&c, st, w, mi & 1 ? ZERO_BF16 : ZERO_F16, mi & 1 ? 1 : 2, 4);
                        c.clip = 0.05f;
                        c.nvme_path = dir;
                        c.states_what = masks[mi];
                        c.states_tier = nv ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
                        c.states_at = 2;
                        if (st == 3) c.persist = 20;
                        if (off) {
                            c.offload_opt = ZERO_OFFLOAD_CPU;
                            c.offload_ratio = 0.5;
                            c.sub_group = 29;
                        }
                        if (off == 2) { /* everything on the host already: the params of stage 3 */
                            c.offload_ratio = 1.0;
                            if (st == 3) c.offload_param = ZERO_OFFLOAD_CPU;
                        }
                        snprintf(label, sizeof label, "stage %d N %d mask 0x%x %s offload %s", st, w,
                                 masks[mi], nv ? "nvme" : "cpu",
                                 off == 0 ? "none" : off == 1 ? "cpu r 0.5" : "cpu r 1");
                        check_states(&c, label, off < 2);
                    }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* ---- refusals ---- */

typedef struct refuse_ctx {
    ec_ctx base;
    int failures;
} refuse_ctx;

#define RCHECK(cond)                                                                          \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "  rank %d: %s:%d: %s (%s)\n", rank, __FILE__, __LINE__, #cond,   \
                    zero_last_error());                                                       \
            X->failures++;                                                                    \
        }                                                                                     \
    } while (0)

static zero_result refuse_rank(int rank, zero_comm *comm, void *user)
{
    refuse_ctx *X = (refuse_ctx *)user;
    const ec_cfg *c = X->base.cfg;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_engine_memory m0, m1;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T], G;
    float tmp[512];
    void *p = NULL;
    ec_engine_desc(c, &d);
    EC_TRY(zero_host_device_create(NULL, &dev));
    d.device = dev;
    d.comm = comm;
    EC_TRY(zero_engine_create(&d, &e));
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_ALL, ZERO_OFFLOAD_CPU) == ZERO_ERROR_INVALID_STATE);
    EC_TRY(ec_add_tensors(e, c, ids));
    EC_TRY(zero_engine_commit(e));
    EC_TRY(ec_set_init(e, c, ids, tmp));
    G = zero_plan_num_groups(zero_engine_plan(e));
    zero_engine_memory_usage(e, &m0);
    /* arguments */
    RCHECK(zero_engine_offload_states(e, 0, ZERO_OFFLOAD_CPU) == ZERO_ERROR_INVALID_ARGUMENT);
    RCHECK(zero_engine_offload_states(e, 64, ZERO_OFFLOAD_CPU) == ZERO_ERROR_INVALID_ARGUMENT);
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_ALL, ZERO_OFFLOAD_NONE) == ZERO_ERROR_INVALID_ARGUMENT);
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_ALL, ZERO_OFFLOAD_NVME) == ZERO_ERROR_INVALID_ARGUMENT);
    RCHECK(strstr(zero_last_error(), "nvme_path") != NULL);
    /* a group gathered */
    EC_TRY(zero_engine_gather(e, 0, &p));
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_ALL, ZERO_OFFLOAD_CPU) == ZERO_ERROR_INVALID_STATE);
    RCHECK(strstr(zero_last_error(), "gathered") != NULL);
    EC_TRY(zero_engine_release(e, 0));
    /* a gradient buffer out, then a group ready: a micro-step under way */
    EC_TRY(zero_engine_grads(e, G - 1, &p));
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_GRADS, ZERO_OFFLOAD_CPU) == ZERO_ERROR_INVALID_STATE);
    RCHECK(strstr(zero_last_error(), "handed out") != NULL);
    memset(p, 0, 2);
    EC_TRY(zero_engine_grads_ready(e, G - 1));
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_ALL, ZERO_OFFLOAD_CPU) == ZERO_ERROR_INVALID_STATE);
    RCHECK(strstr(zero_last_error(), "middle of a step") != NULL);
    zero_engine_memory_usage(e, &m1);
    RCHECK(m1.total_bytes == m0.total_bytes); /* nothing moved */
    zero_engine_destroy(e); /* (a fresh engine for the rest: this one is mid-step) */
    e = NULL;
    EC_TRY(zero_engine_create(&d, &e));
    EC_TRY(ec_add_tensors(e, c, ids));
    EC_TRY(zero_engine_commit(e));
    EC_TRY(ec_set_init(e, c, ids, tmp));
    /* reload with nothing offloaded: nothing to do */
    RCHECK(zero_engine_reload_states(e) == ZERO_OK);
    zero_engine_memory_usage(e, &m1);
    RCHECK(m1.total_bytes == m0.total_bytes);
    /* offload, a second offload is refused (nothing more moves), calls that need the state
       are refused, queries answer */
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_MASTER, ZERO_OFFLOAD_CPU) == ZERO_OK);
    zero_engine_memory_usage(e, &m1);
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_ALL, ZERO_OFFLOAD_CPU) == ZERO_ERROR_INVALID_STATE);
    RCHECK(strstr(zero_last_error(), "offloaded already") != NULL);
    {
        zero_engine_memory m2;
        zero_range rg;
        zero_engine_memory_usage(e, &m2);
        RCHECK(m2.total_bytes == m1.total_bytes && m1.total_bytes < m0.total_bytes);
        RCHECK(zero_engine_read_tensor(e, ids[0], ZERO_STATE_PARAM, tmp, &rg) == ZERO_ERROR_INVALID_STATE);
        RCHECK(strstr(zero_last_error(), "zero_engine_reload_states") != NULL);
        RCHECK(zero_engine_set_tensor(e, ids[0], tmp) == ZERO_ERROR_INVALID_STATE);
        RCHECK(zero_engine_step(e, NULL) == ZERO_ERROR_INVALID_STATE);
        RCHECK(zero_engine_grads(e, 0, &p) == ZERO_ERROR_INVALID_STATE);
    }
    RCHECK(zero_engine_reload_states(e) == ZERO_OK);
    RCHECK(zero_engine_reload_states(e) == ZERO_OK); /* the second: nothing to do */
    zero_engine_memory_usage(e, &m1);
    RCHECK(m1.total_bytes == m0.total_bytes);
    /* destroy while offloaded frees everything (ASan: no leak) */
    RCHECK(zero_engine_offload_states(e, ZERO_STATES_ALL, ZERO_OFFLOAD_CPU) == ZERO_OK);
done:
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(refused_calls_change_nothing)
{
    int st;
    for (st = 0; st <= 3; st++) {
        ec_cfg c;
        refuse_ctx X;
        ec_result *res;
        ec_cfg_init(&c, st, 2, ZERO_F16, 2, 1);
        memset(&X, 0, sizeof X);
        res = ec_run_with(&c, &X.base, refuse_rank, &X);
        ZT_CHECKF(res->rc == ZERO_OK, "stage %d: %s", st, res->err);
        ZT_CHECKF(X.failures == 0, "stage %d: %d failed checks", st, X.failures);
        ec_result_free(res);
    }
}

int main(void)
{
    ZT_RUN(refused_calls_change_nothing);
    ZT_RUN(round_trip_in_the_middle_is_bit_identical);
    return zt_summary();
}
