/* What a user meets when a call is wrong: the message names the cause and what to do.
   - zero_engine_step with gradients handed out but never marked ready names those groups;
   - a commit mismatch names the first setting or tensor that differs and each rank's value;
   - after a failed commit, later calls and a second commit say the commit failed and why
     (not "a device or comm failure", not "already committed");
   - a checkpoint whose dtype is not the engine's: a dtype mismatch, named, with both;
   - debug_guards: a write one element past a gradient or param buffer is caught at
     grads_ready / release, naming the group and the buffer; with guards and without, the
     parameters after two steps are bit-identical (stages 0-3, 2 ranks). */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include "zero.h"
#include "tests/zt.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NR 3
typedef struct msgs {
    int variant;
    zero_result got[NR][4];
    char text[NR][4][700];
    char dir[64];
} msgs;

static void keep(msgs *m, int rank, int k, zero_result r)
{
    m->got[rank][k] = r;
    snprintf(m->text[rank][k], sizeof m->text[rank][k], "%s", r == ZERO_OK ? "" : zero_last_error());
}

static zero_result mk(zero_comm *comm, zero_device **dev, zero_engine **e, int stage, int accum,
                      double lr)
{
    zero_engine_desc d;
    zero_result r = zero_host_device_create(NULL, dev);
    if (r) return r;
    memset(&d, 0, sizeof d);
    d.stage = stage;
    d.accum_steps = accum;
    d.adam.lr = lr;
    d.device = *dev;
    d.comm = comm;
    return zero_engine_create(&d, e);
}

/* Groups 0..4, one tensor each; rank-dependent variants for the commit check. */
static zero_result add5(zero_engine *e, int rank, int variant)
{
    int g;
    zero_result r = ZERO_OK;
    for (g = 0; g < 5 && !r; g++) {
        char name[16];
        size_t n = 40;
        snprintf(name, sizeof name, "t%d", g);
        if (variant == 1 && g == 3 && rank == 2) n = 41;           /* tensor 3's size    */
        if (variant == 2 && g == 2 && rank == 1) strcpy(name, "x"); /* tensor 2's name    */
        if (variant == 3 && g == 4 && rank == 0) break;             /* rank 0: 4 tensors  */
        r = zero_engine_add_tensor(e, name, n, g, 0, NULL);
    }
    return r;
}

/* a: groups 1 and 3 ready, 0 and 2 handed out but never marked ready, 4 never asked for
   (stages 2-3 hold two buckets by default), then the step. */
static zero_result step_rank(int rank, zero_comm *comm, void *user)
{
    msgs *m = (msgs *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_step_info info;
    void *g;
    int k;
    zero_result r = mk(comm, &dev, &e, m->variant, 1, 0);
    if (!r) r = add5(e, rank, 0);
    if (!r) r = zero_engine_commit(e);
    for (k = 1; k <= 3 && !r; k += 2) {
        r = zero_engine_grads(e, k, &g);
        if (!r) r = zero_engine_grads_ready(e, k);
    }
    for (k = 0; k <= 2 && !r; k += 2) r = zero_engine_grads(e, k, &g);
    if (!r) keep(m, rank, 0, zero_engine_step(e, &info));
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(step_names_groups_never_marked_ready)
{
    int st, rk;
    for (st = 0; st <= 3; st++) {
        msgs m;
        zero_result r;
        memset(&m, 0, sizeof m);
        m.variant = st;
        r = zero_local_run(2, step_rank, &m);
        ZT_CHECKF(r == ZERO_OK, "stage %d: %s", st, zero_last_error());
        for (rk = 0; rk < 2; rk++) {
            const char *t = m.text[rk][0];
            ZT_CHECK(m.got[rk][0] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECKF(strstr(t, "zero_engine_grads_ready): groups 0, 2;") &&
                          strstr(t, "never asked for: group 4") && strstr(t, "2 of 5 groups are ready"),
                      "stage %d: %s", st, t);
        }
    }
}

/* b, c: ranks that disagree; the commit names the difference; later calls say so. */
static zero_result commit_rank(int rank, zero_comm *comm, void *user)
{
    msgs *m = (msgs *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_step_info info;
    void *p;
    double lr = m->variant == 0 && rank == 1 ? 2e-3 : 1e-3;
    zero_result r = mk(comm, &dev, &e, 2, 1, lr);
    if (!r) r = add5(e, rank, m->variant);
    if (!r) keep(m, rank, 0, zero_engine_commit(e));
    if (!r) keep(m, rank, 1, zero_engine_gather(e, 0, &p));
    if (!r) keep(m, rank, 2, zero_engine_step(e, &info));
    if (!r) keep(m, rank, 3, zero_engine_commit(e));
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(commit_mismatch_names_the_difference)
{
    /* per variant: what every rank's message names, and rank k's own value */
    static const char *const names[4] = {"adam.lr", "tensor 3", "tensor 2", "tensor 4"};
    static const char *const own[4][NR] = {
        {"adam.lr = 0.001", "adam.lr = 0.002", "adam.lr = 0.001"},
        {"'t3' (numel 40", "'t3' (numel 40", "'t3' (numel 41"},
        {"'t2'", "'x'", "'t2'"},
        {"no tensor 4 (it registered 4 tensors)", "'t4' (numel 40", "'t4' (numel 40"}};
    int v, rk;
    for (v = 0; v < 4; v++) {
        msgs m;
        zero_result r;
        memset(&m, 0, sizeof m);
        m.variant = v;
        r = zero_local_run(NR, commit_rank, &m);
        ZT_CHECKF(r == ZERO_OK, "variant %d: %s", v, zero_last_error());
        for (rk = 0; rk < NR; rk++) {
            const char *t = m.text[rk][0];
            ZT_CHECKF(m.got[rk][0] == ZERO_ERROR_MISMATCH, "variant %d rank %d: %s", v, rk, t);
            ZT_CHECKF(strstr(t, names[v]) && strstr(t, own[v][rk]), "variant %d rank %d: %s", v, rk, t);
            if (v == 0) ZT_CHECKF(strstr(t, "[0.001, 0.002]") != NULL, "range: %s", t);
            /* later calls: the commit failed, with its reason, and what to do */
            ZT_CHECK(m.got[rk][1] == ZERO_ERROR_INVALID_STATE && m.got[rk][2] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECKF(strstr(m.text[rk][1], "commit failed") && strstr(m.text[rk][1], "mismatch") &&
                          strstr(m.text[rk][1], names[v]) && strstr(m.text[rk][1], "destroy") &&
                          !strstr(m.text[rk][1], "device or comm"),
                      "variant %d rank %d: %s", v, rk, m.text[rk][1]);
            ZT_CHECKF(strstr(m.text[rk][2], "zero_engine_step") && strstr(m.text[rk][2], "commit failed"),
                      "%s", m.text[rk][2]);
            ZT_CHECK(m.got[rk][3] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECKF(!strstr(m.text[rk][3], "already committed") &&
                          strstr(m.text[rk][3], "cannot be retried") && strstr(m.text[rk][3], "commit failed"),
                      "%s", m.text[rk][3]);
        }
    }
}

/* The settings and tensors all agree: the commit succeeds (the search is not run). */
ZT_TEST(commit_agreeing_ranks_still_commit)
{
    msgs m;
    int rk;
    memset(&m, 0, sizeof m);
    m.variant = 9; /* no rank-dependent change */
    ZT_CHECK(zero_local_run(NR, commit_rank, &m) == ZERO_OK);
    for (rk = 0; rk < NR; rk++) {
        ZT_CHECK(m.got[rk][0] == ZERO_OK && m.got[rk][1] == ZERO_OK);
        ZT_CHECKF(m.got[rk][3] == ZERO_ERROR_INVALID_STATE && strstr(m.text[rk][3], "already committed"),
                  "%s", m.text[rk][3]);
    }
}

/* d: a checkpoint of f16 params loaded into a bf16 engine. */
static zero_result dtype_rank(int rank, zero_comm *comm, void *user)
{
    msgs *m = (msgs *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    int k;
    for (k = 0; k < 2; k++) {
        r = zero_host_device_create(NULL, &dev);
        memset(&d, 0, sizeof d);
        d.param_dtype = k == 0 ? ZERO_F16 : ZERO_BF16;
        d.device = dev;
        d.comm = comm;
        if (!r) r = zero_engine_create(&d, &e);
        if (!r) r = add5(e, rank, 0);
        if (!r) r = zero_engine_commit(e);
        if (!r && k == 0) r = zero_engine_save(e, m->dir);
        if (!r && k == 1) keep(m, rank, 0, zero_engine_load(e, m->dir));
        zero_engine_destroy(e);
        zero_device_destroy(dev);
        e = NULL;
        dev = NULL;
        if (r) return r;
    }
    return ZERO_OK;
}

ZT_TEST(checkpoint_dtype_mismatch_is_named)
{
    msgs m;
    char cmd[300];
    memset(&m, 0, sizeof m);
    snprintf(m.dir, sizeof m.dir, "/tmp/zt_msg_ckpt_%d", (int)getpid());
    ZT_CHECKF(zero_local_run(2, dtype_rank, &m) == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(m.got[0][0] == ZERO_ERROR_MISMATCH && m.got[1][0] == ZERO_ERROR_MISMATCH);
    ZT_CHECKF(strstr(m.text[0][0], "dtype mismatch") && strstr(m.text[0][0], "f16") &&
                  strstr(m.text[0][0], "bf16"), "%s", m.text[0][0]);
    ZT_CHECK(strstr(zero_result_string(ZERO_ERROR_MISMATCH), "a file and the engine") != NULL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", m.dir);
    ZT_CHECK(system(cmd) == 0);
}

/* e: a save whose directory cannot be made names the call once (it said
   "zero_engine_save: zero_engine_save: mkdir ..."). */
static zero_result mkdir_rank(int rank, zero_comm *comm, void *user)
{
    msgs *m = (msgs *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = zero_host_device_create(NULL, &dev);
    memset(&d, 0, sizeof d);
    d.device = dev;
    d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    if (!r) r = add5(e, rank, 0);
    if (!r) r = zero_engine_commit(e);
    if (!r) keep(m, rank, 0, zero_engine_save(e, m->dir));
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(save_mkdir_failure_names_the_call_once)
{
    msgs m;
    int rk;
    memset(&m, 0, sizeof m);
    snprintf(m.dir, sizeof m.dir, "/nonexistent-zero-%d/a/b", (int)getpid());
    ZT_CHECKF(zero_local_run(2, mkdir_rank, &m) == ZERO_OK, "%s", zero_last_error());
    for (rk = 0; rk < 2; rk++) {
        const char *t = m.text[rk][0], *first = strstr(t, "zero_engine_save:");
        ZT_CHECKF(m.got[rk][0] == ZERO_ERROR_IO && strstr(t, "zero_engine_save: mkdir /nonexistent-zero-") &&
                      strstr(t, "No such file or directory"), "rank %d: %s", rk, t);
        ZT_CHECKF(first && !strstr(first + 1, "zero_engine_save:"), "rank %d: %s", rk, t);
    }
}

/* ---- debug guards ---- */

typedef struct gctx {
    int stage, guards, overrun; /* overrun: 1 = a gradient buffer, 2 = a param buffer */
    float master[2][2][64];     /* [rank][tensor]: this rank's copy after the steps */
    zero_result got[2];
    char msg[2][600];
} gctx;

static zero_result guard_rank(int rank, zero_comm *comm, void *user)
{
    gctx *c = (gctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_step_info info;
    float v[64];
    int t, step, k;
    size_t i;
    zero_result r = zero_host_device_create(NULL, &dev);
    memset(&d, 0, sizeof d);
    d.stage = c->stage;
    d.debug_guards = c->guards ? 1 : -1;
    d.device = dev;
    d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    if (!r) r = zero_engine_add_tensor(e, "a", 40, 0, 0, NULL);
    if (!r) r = zero_engine_add_tensor(e, "b", 64, 1, 0, NULL);
    if (!r) r = zero_engine_commit(e);
    for (t = 0; t < 2 && !r; t++) {
        for (i = 0; i < 64; i++) v[i] = 0.01f * (float)(i + 1) * (t ? -1.0f : 1.0f);
        r = zero_engine_set_tensor(e, t, v);
    }
    for (step = 0; step < 2 && !r; step++) {
        for (k = 1; k >= 0 && !r; k--) {
            void *p, *g;
            zero_group_info gi;
            uint16_t *gh;
            if ((r = zero_engine_gather(e, k, &p)) != ZERO_OK) break;
            if ((r = zero_engine_grads(e, k, &g)) != ZERO_OK) break;
            zero_plan_group(zero_engine_plan(e), k, &gi);
            gh = (uint16_t *)g;
            for (i = 0; i < gi.used_numel; i++)
                gh[i] = zero_f32_to_f16(((const uint16_t *)p)[i] ? 0.5f * (float)(rank + 1) : 0.25f);
            if (c->overrun == 1 && rank == 0 && k == 1) gh[gi.numel] = 0x3c00; /* one past the end */
            if (c->overrun == 2 && rank == 0 && k == 0) ((uint16_t *)p)[gi.numel] = 1;
            r = zero_engine_release(e, k);
            if (r != ZERO_OK) {
                c->got[rank] = r;
                snprintf(c->msg[rank], sizeof c->msg[rank], "%s", zero_last_error());
                break;
            }
            r = zero_engine_grads_ready(e, k);
            if (r != ZERO_OK) {
                c->got[rank] = r;
                snprintf(c->msg[rank], sizeof c->msg[rank], "%s", zero_last_error());
            }
        }
        if (!r) r = zero_engine_step(e, &info);
    }
    for (t = 0; t < 2 && !r; t++) {
        zero_range rg;
        r = zero_engine_read_tensor(e, t, ZERO_STATE_MASTER, c->master[rank][t], &rg);
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(debug_guards_catch_overruns)
{
    int st, which;
    for (st = 0; st <= 3; st++) {
        gctx a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        a.stage = b.stage = st;
        b.guards = 1;
        ZT_CHECKF(zero_local_run(2, guard_rank, &a) == ZERO_OK, "stage %d: %s", st, zero_last_error());
        ZT_CHECKF(zero_local_run(2, guard_rank, &b) == ZERO_OK, "stage %d guards: %s", st, zero_last_error());
        ZT_CHECKF(memcmp(a.master, b.master, sizeof a.master) == 0, "stage %d: guards changed the result", st);
        for (which = 1; which <= 2; which++) {
            gctx c;
            memset(&c, 0, sizeof c);
            c.stage = st;
            c.guards = 1;
            c.overrun = which;
            ZT_CHECK(zero_local_run(1, guard_rank, &c) != ZERO_OK); /* the rank stops there */
            ZT_CHECK(c.got[0] == ZERO_ERROR_INVALID_STATE);
            ZT_CHECKF(strstr(c.msg[0], which == 1 ? "zero_engine_grads_ready: group 1's gradient buffer"
                                                  : "zero_engine_release: group 0's param buffer") &&
                          strstr(c.msg[0], "written past its end") && strstr(c.msg[0], "f16"),
                      "stage %d: %s", st, c.msg[0]);
        }
    }
}

int main(void)
{
    ZT_RUN(step_names_groups_never_marked_ready);
    ZT_RUN(commit_mismatch_names_the_difference);
    ZT_RUN(commit_agreeing_ranks_still_commit);
    ZT_RUN(checkpoint_dtype_mismatch_is_named);
    ZT_RUN(save_mkdir_failure_names_the_call_once);
    ZT_RUN(debug_guards_catch_overruns);
    return zt_summary();
}
