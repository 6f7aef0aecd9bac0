/* A learning rate of 0 is 0 (issue 25, item 5): zero_engine_set_lr(e, 0) and a schedule's 0
   move no param, AdamW's decoupled decay (lr * wd) included, while m and v still take the
   step's gradient; only a descriptor's lr of 0, at create, means the default 1e-3. Checked
   at every stage, on 1 and 2 ranks, against a float64 Adam, and through
   zero_adam_coefs_make_lr, the constants a schedule of one's own uses; and through the GPT
   example's cosine schedule with --lr-min-frac 0 (its last step is at lr 0). */
#define _DEFAULT_SOURCE /* popen */
#include "zero.h"
#include "tests/zt.h"
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#define LZ_T 3
static const size_t lz_sizes[LZ_T] = {37, 5, 101};
static const unsigned lz_flags[LZ_T] = {0, ZERO_TENSOR_NO_DECAY, 0};

typedef struct lz_ctx {
    int stage;
    double lr1;          /* the first step's lr, set in the descriptor                  */
    double lr2;          /* the second step's, by zero_engine_set_lr                    */
    int world;
    int failures;        /* elements off the reference, over ranks                      */
    int moved;           /* params or masters that changed at the second step           */
    int checked;         /* elements compared                                           */
    char err[400];
    pthread_mutex_t mu;
} lz_ctx;

static double lz_grad(int rank, int step, int t, size_t i)
{
    return 0.01 * (1.5 + sin(0.37 * (double)i + 1.3 * rank + 0.19 * step + 0.5 * t));
}

static float lz_init(int t, size_t i)
{
    return (float)(0.5 * sin(0.1 * (double)i + 0.7 * t + 0.3));
}

/* One step: the manual's pattern, gradients lz_grad. */
static zero_result lz_step(zero_engine *e, int rank, int step, const int *ids)
{
    const zero_plan *plan = zero_engine_plan(e);
    int G = zero_plan_num_groups(plan), g, t;
    void *p, *gp;
    zero_result r;
    zero_step_info info;
    for (g = 0; g < G; g++)
        if ((r = zero_engine_gather(e, g, &p)) != ZERO_OK || (r = zero_engine_release(e, g)) != ZERO_OK)
            return r;
    for (g = G - 1; g >= 0; g--) {
        if ((r = zero_engine_gather(e, g, &p)) != ZERO_OK) return r;
        if ((r = zero_engine_grads(e, g, &gp)) != ZERO_OK) return r;
        for (t = 0; t < LZ_T; t++) {
            zero_tensor_info ti;
            size_t i;
            zero_plan_tensor(plan, ids[t], &ti);
            if (ti.group != g) continue;
            for (i = 0; i < ti.numel; i++)
                ((float *)gp)[ti.offset + i] = (float)lz_grad(rank, step, t, i);
        }
        if ((r = zero_engine_release(e, g)) != ZERO_OK) return r;
        if ((r = zero_engine_grads_ready(e, g)) != ZERO_OK) return r;
    }
    return zero_engine_step(e, &info);
}

static int lz_close(double got, double want)
{
    return fabs(got - want) <= 1e-6 * fabs(want) + 1e-30;
}

static zero_result lz_rank(int rank, zero_comm *comm, void *user)
{
    lz_ctx *c = (lz_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    int ids[LZ_T], t, bad = 0, moved = 0, checked = 0;
    float *before[LZ_T][4], *after[LZ_T][4];
    memset(before, 0, sizeof before);
    memset(after, 0, sizeof after);
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    memset(&d, 0, sizeof d);
    d.stage = c->stage;
    d.param_dtype = ZERO_F32;
    d.adam.lr = c->lr1;
    d.adam.weight_decay = 0.1;
    d.device = dev;
    d.comm = comm;
    r = zero_engine_create(&d, &e);
    for (t = 0; t < LZ_T && r == ZERO_OK; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        r = zero_engine_add_tensor(e, name, lz_sizes[t], t == 2 ? 1 : 0, lz_flags[t], &ids[t]);
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    for (t = 0; t < LZ_T && r == ZERO_OK; t++) {
        float v[128];
        size_t i;
        for (i = 0; i < lz_sizes[t]; i++) v[i] = lz_init(t, i);
        r = zero_engine_set_tensor(e, ids[t], v);
    }
    if (r == ZERO_OK) r = lz_step(e, rank, 1, ids);
    /* the states after the first step (this rank's part) */
    for (t = 0; t < LZ_T && r == ZERO_OK; t++) {
        int k;
        zero_range rg;
        for (k = 0; k < 4 && r == ZERO_OK; k++) {
            before[t][k] = (float *)calloc(lz_sizes[t], sizeof(float));
            after[t][k] = (float *)calloc(lz_sizes[t], sizeof(float));
            if (!before[t][k] || !after[t][k]) r = ZERO_ERROR_OUT_OF_MEMORY;
            else r = zero_engine_read_tensor(e, ids[t], (zero_state_kind)k, before[t][k], &rg);
        }
    }
    if (r == ZERO_OK) r = zero_engine_set_lr(e, c->lr2);
    if (r == ZERO_OK) r = lz_step(e, rank, 2, ids);
    for (t = 0; t < LZ_T && r == ZERO_OK; t++) {
        zero_range rg[4];
        size_t i;
        int k;
        for (k = 0; k < 4 && r == ZERO_OK; k++)
            r = zero_engine_read_tensor(e, ids[t], (zero_state_kind)k, after[t][k], &rg[k]);
        if (r != ZERO_OK) break;
        for (i = rg[1].offset; i < rg[1].offset + rg[1].numel; i++) {
            /* float64 Adam's second step: m and v from the first step's (read back), the
               gradient the mean over ranks; at lr 0 the master stays where it was */
            double gbar = 0.0, m, v, p = before[t][1][i], b1 = 0.9, b2 = 0.999, bc1, bc2, wd;
            int q;
            for (q = 0; q < c->world; q++) gbar += lz_grad(q, 2, t, i);
            gbar /= c->world;
            m = b1 * before[t][2][i] + (1 - b1) * gbar;
            v = b2 * before[t][3][i] + (1 - b2) * gbar * gbar;
            bc1 = 1 - b1 * b1;
            bc2 = 1 - b2 * b2;
            wd = lz_flags[t] ? 0.0 : 0.1;
            p = p - c->lr2 * wd * p - c->lr2 / bc1 * m / (sqrt(v) / sqrt(bc2) + 1e-8);
            bad += !lz_close(after[t][1][i], p) || !lz_close(after[t][2][i], m) ||
                   !lz_close(after[t][3][i], v);
            if (c->lr2 == 0.0)
                moved += memcmp(&after[t][1][i], &before[t][1][i], sizeof(float)) != 0;
            checked++;
        }
        /* the params (whole or shard) bit for bit where lr is 0 */
        for (i = rg[0].offset; c->lr2 == 0.0 && i < rg[0].offset + rg[0].numel; i++)
            moved += memcmp(&after[t][0][i], &before[t][0][i], sizeof(float)) != 0;
    }
    pthread_mutex_lock(&c->mu);
    c->failures += bad;
    c->moved += moved;
    c->checked += checked;
    if (r != ZERO_OK && !c->err[0]) snprintf(c->err, sizeof c->err, "%s", zero_last_error());
    pthread_mutex_unlock(&c->mu);
    for (t = 0; t < LZ_T; t++) {
        int k;
        for (k = 0; k < 4; k++) {
            free(before[t][k]);
            free(after[t][k]);
        }
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* The second step at lr 0 moves nothing, whatever the stage and world; at a small lr the
   same reference agrees (so the comparison can tell the two apart). */
ZT_TEST(lr_zero_moves_no_param)
{
    static const double lr2s[] = {0.0, 1e-4};
    int stage, world, k;
    for (k = 0; k < 2; k++)
        for (stage = 0; stage <= 3; stage++)
            for (world = 1; world <= 2; world++) {
                lz_ctx c;
                zero_result r;
                memset(&c, 0, sizeof c);
                pthread_mutex_init(&c.mu, NULL);
                c.stage = stage;
                c.world = world;
                c.lr1 = 1e-2;
                c.lr2 = lr2s[k];
                r = zero_local_run(world, lz_rank, &c);
                ZT_CHECKF(r == ZERO_OK, "stage %d world %d: %s", stage, world, c.err);
                ZT_CHECKF(c.checked == (int)(lz_sizes[0] + lz_sizes[1] + lz_sizes[2]),
                          "stage %d world %d: %d elements compared", stage, world, c.checked);
                ZT_CHECKF(c.failures == 0, "stage %d world %d lr %g: %d elements off float64",
                          stage, world, c.lr2, c.failures);
                ZT_CHECKF(c.moved == 0, "stage %d world %d: %d params moved at lr 0", stage, world,
                          c.moved);
                pthread_mutex_destroy(&c.mu);
            }
}

/* The constants: zero_adam_coefs_make_lr takes lr as given (0: no step, no decay), while
   zero_adam_coefs_make resolves its desc (lr 0 there is the default 1e-3, as documented). */
ZT_TEST(coefs_make_lr_takes_lr_as_given)
{
    zero_adam_desc d;
    zero_adam_coefs c, ref;
    memset(&d, 0, sizeof d);
    d.weight_decay = 0.1;
    ZT_CHECK(zero_adam_coefs_make_lr(&c, &d, 0.0, 0.1, 3) == ZERO_OK);
    ZT_CHECK(c.step_size == 0.0f && c.neg_lr_wd == 0.0f);
    ZT_CHECK(zero_adam_coefs_make(&ref, &d, 0.1, 3) == ZERO_OK);
    ZT_CHECK(ref.step_size == (float)(1e-3 / (1.0 - pow(0.9, 3))));
    ZT_CHECK(c.beta1 == ref.beta1 && c.beta2 == ref.beta2 && c.eps == ref.eps &&
             c.inv_sqrt_bc2 == ref.inv_sqrt_bc2);
    /* a non-zero lr gives what the desc with that lr gives */
    d.lr = 2.5e-3;
    ZT_CHECK(zero_adam_coefs_make(&ref, &d, 0.1, 3) == ZERO_OK);
    d.lr = 0.0;
    ZT_CHECK(zero_adam_coefs_make_lr(&c, &d, 2.5e-3, 0.1, 3) == ZERO_OK);
    ZT_CHECK(memcmp(&c, &ref, sizeof c) == 0);
    /* refused, nothing written */
    memset(&c, 0x33, sizeof c);
    ref = c;
    ZT_CHECK(zero_adam_coefs_make_lr(&c, &d, -1e-3, 0.1, 3) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "lr") != NULL);
    ZT_CHECK(zero_adam_coefs_make_lr(&c, &d, NAN, 0.1, 3) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_adam_coefs_make_lr(&c, &d, INFINITY, 0.1, 3) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_adam_coefs_make_lr(&c, NULL, 0.0, 0.1, 3) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_adam_coefs_make_lr(NULL, &d, 0.0, 0.1, 3) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(memcmp(&c, &ref, sizeof c) == 0);
}

/* The params checksum build/train_gpt2 prints for args ("" on failure). */
static void lz_gpt2_sum(const char *args, char *sum, size_t n)
{
    char cmd[512], out[8192];
    const char *p;
    size_t got;
    FILE *f;
    sum[0] = '\0';
    snprintf(cmd, sizeof cmd, "build/train_gpt2 %s 2>&1", args);
    if (!(f = popen(cmd, "r"))) return;
    got = fread(out, 1, sizeof out - 1, f);
    out[got] = '\0';
    if (pclose(f) != 0) return;
    if ((p = strstr(out, "params checksum: ")) != NULL) snprintf(sum, n, "%.33s", p);
}

/* --steps 3 --lr-min-frac 0: step 2 runs at lr 0, so stopping after step 1 (--stop-at 2,
   the same schedule) leaves the same params; at --lr-min-frac 0.5 it does not. */
ZT_TEST(gpt2_schedule_ending_at_zero_moves_nothing)
{
    static const char *const shape = "--stage 3 --ranks 2 --steps 3 --warmup 0 --layers 1 --heads 2 "
                                     "--channels 16 --seq 16 --batch 2 --sample 0 --val-every 0";
    char a[400], sa[64], sb[64];
    if (access("build/train_gpt2", X_OK) != 0) ZT_SKIP("build/train_gpt2 not built (make build/train_gpt2)");
    snprintf(a, sizeof a, "%s --lr-min-frac 0 --stop-at 2", shape);
    lz_gpt2_sum(a, sa, sizeof sa);
    snprintf(a, sizeof a, "%s --lr-min-frac 0", shape);
    lz_gpt2_sum(a, sb, sizeof sb);
    ZT_CHECKF(sa[0] && strcmp(sa, sb) == 0, "2 steps: '%s', 3 steps: '%s'", sa, sb);
    snprintf(a, sizeof a, "%s --lr-min-frac 0.5", shape);
    lz_gpt2_sum(a, sb, sizeof sb);
    ZT_CHECKF(sb[0] && strcmp(sa, sb) != 0, "3 steps ending at lr/2 left the params: '%s'", sb);
}

int main(void)
{
    ZT_RUN(lr_zero_moves_no_param);
    ZT_RUN(coefs_make_lr_takes_lr_as_given);
    ZT_RUN(gpt2_schedule_ending_at_zero_moves_nothing);
    return zt_summary();
}
