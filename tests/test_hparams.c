/* test_hparams.c - per-tensor hyper-parameters (zero_engine_set_tensor_hparams, PyTorch's
   parameter groups): the engine's AdamW with an lr multiplier and a weight decay per tensor
   against float64 AdamW computed here with the same groups; stages 0-3 bit-identical and the
   CPU-offloaded step equal to the plain one with them; saved in checkpoints (a run that
   saves, loads into an engine at the defaults and continues equals the straight run, bit
   for bit); bad values refused naming the tensor, nothing changed. */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

#include <stdlib.h>
#include <unistd.h>

/* ec_default_model (odd sizes, four groups, the small ones NO_DECAY) in eight parameter
   groups (ec_param_groups), fp32, lr 1e-2, default decay 0.05. */
static void hp_cfg(ec_cfg *c, int stage, int world, int steps)
{
    ec_cfg_init(c, stage, world, ZERO_F32, 1, steps);
    c->lr = 1e-2f;
    c->wd = 0.05f;
    ec_param_groups(c);
}

/* float64 AdamW (torch.optim.AdamW's update) over every tensor with its group's lr and decay,
   on the mean of the ranks' synthetic gradients; returns the largest |engine - reference|. */
static double hp_reference_gap(const ec_cfg *c, const ec_result *r, int *frozen_ok)
{
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double worst = 0.0;
    int t;
    *frozen_ok = 1;
    for (t = 0; t < c->ntensors; t++) {
        size_t n = c->sizes[t], i;
        double *p = (double *)calloc(n, sizeof(double)), *m = (double *)calloc(n, sizeof(double)),
               *v = (double *)calloc(n, sizeof(double));
        double lr = (double)c->lr * c->lr_mul[t];
        double wd = c->hp_wd[t] >= 0 ? c->hp_wd[t]
                                     : ((c->flags[t] & ZERO_TENSOR_NO_DECAY) ? 0.0 : (double)c->wd);
        int s, rk;
        for (i = 0; i < n; i++) p[i] = (double)ec_init_value(t, i);
        for (s = 0; s < c->steps; s++) {
            double bc1 = 1.0 - pow(b1, s + 1), bc2 = 1.0 - pow(b2, s + 1);
            for (i = 0; i < n; i++) {
                double g = 0.0;
                for (rk = 0; rk < c->world; rk++) g += ec_synth_grad((float)p[i], rk, 0, s, i, t);
                g /= c->world;
                p[i] *= 1.0 - lr * wd;
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
            }
        }
        for (i = 0; i < n; i++) {
            double d = fabs((double)r->master[t][i] - p[i]);
            if (d > worst) worst = d;
            if (c->lr_mul[t] == 0.0 && r->master[t][i] != ec_init_value(t, i)) *frozen_ok = 0;
        }
        free(p);
        free(m);
        free(v);
    }
    return worst;
}

/* Each tensor moves about lr * lr_mul per step (Adam's update is near +-lr), and the decays
   take lr * wd * |p| ~ 1e-3 a step: ignoring a multiplier or a decay is off by 1e-3 or more
   after 6 steps. fp32 rounding keeps the engine within 2e-6 of float64 here. */
ZT_TEST(hparams_match_float64_adamw)
{
    int world, stage;
    for (world = 1; world <= 3; world++)
        for (stage = 0; stage <= 3; stage++) {
            ec_cfg c;
            ec_result *r;
            int frozen_ok = 0;
            double gap;
            hp_cfg(&c, stage, world, 6);
            r = ec_run(&c);
            ZT_CHECKF(r->rc == ZERO_OK, "N=%d stage %d: %s", world, stage, r->err);
            if (r->rc == ZERO_OK) {
                gap = hp_reference_gap(&c, r, &frozen_ok);
                ZT_CHECKF(gap <= 2e-6, "N=%d stage %d: %.3g from float64 AdamW", world, stage, gap);
                ZT_CHECKF(frozen_ok, "N=%d stage %d: a tensor at lr_mul 0 moved", world, stage);
            }
            ec_result_free(r);
        }
    /* the reference tells the groups apart: without them the engine is far from it */
    {
        ec_cfg c;
        ec_result *r;
        int frozen_ok = 0;
        hp_cfg(&c, 1, 2, 6);
        c.hp_on = 0;
        r = ec_run(&c);
        ZT_CHECK(r->rc == ZERO_OK);
        c.hp_on = 1;
        if (r->rc == ZERO_OK) ZT_CHECK(hp_reference_gap(&c, r, &frozen_ok) > 1e-4);
        ec_result_free(r);
    }
}

ZT_TEST(hparams_stages_identical)
{
    ec_cfg c;
    hp_cfg(&c, 0, 3, 4);
    c.dtype = ZERO_BF16;
    c.accum = 2;
    ec_check_stages_identical(&c, "N=3 bf16 accum 2 with parameter groups");
    hp_cfg(&c, 0, 2, 3);
    c.dtype = ZERO_F16;
    ec_check_stages_identical(&c, "N=2 f16 with parameter groups");
}

/* The offloaded step (host Adam tile by tile) applies the same per-tensor constants. */
ZT_TEST(hparams_offload_equals_plain)
{
    int stage;
    for (stage = 1; stage <= 3; stage++) {
        ec_cfg c;
        ec_result *a, *b;
        char why[160];
        hp_cfg(&c, stage, 2, 3);
        c.dtype = ZERO_BF16;
        a = ec_run(&c);
        c.offload_opt = ZERO_OFFLOAD_CPU;
        c.sub_group = 40; /* tiles that cut tensors */
        b = ec_run(&c);
        ZT_CHECKF(a->rc == ZERO_OK && b->rc == ZERO_OK, "stage %d: %s %s", stage, a->err, b->err);
        if (a->rc == ZERO_OK && b->rc == ZERO_OK)
            ZT_CHECKF(ec_same_state(&c, a, b, why, sizeof why), "stage %d offload: %s", stage, why);
        ec_result_free(a);
        ec_result_free(b);
    }
}

/* ---- checkpoints ---- */

/* after_load: every tensor's hyper-parameters are the saved ones (cfg's). */
static zero_result hp_after_load(ec_job *job, zero_engine *e, const int *ids)
{
    const ec_cfg *c = job->ctx.cfg;
    int t, ok = 1;
    for (t = 0; t < c->ntensors; t++) {
        double mul = -1, wd = -1;
        double want = c->hp_wd[t] >= 0 ? c->hp_wd[t]
                      : (c->flags[t] & ZERO_TENSOR_NO_DECAY) ? 0.0 : (double)c->wd;
        zero_result r = zero_engine_tensor_hparams(e, ids[t], &mul, &wd);
        if (r != ZERO_OK) return r;
        ok &= mul == c->lr_mul[t] && wd == want;
    }
    pthread_mutex_lock(&job->ctx.mu);
    job->checked += ok;
    pthread_mutex_unlock(&job->ctx.mu);
    return ZERO_OK;
}

ZT_TEST(hparams_saved_in_checkpoints)
{
    char dir[] = "/tmp/zero_hparams_XXXXXX";
    ec_cfg c;
    ec_job j1, j2, j3;
    ec_result *straight, *before, *after;
    char why[160];
    zero_checkpoint *ck = NULL;
    int t;
    if (!mkdtemp(dir)) ZT_SKIP("mkdtemp failed");
    hp_cfg(&c, 2, 2, 4);
    memset(&j1, 0, sizeof j1);
    memset(&j2, 0, sizeof j2);
    memset(&j3, 0, sizeof j3);
    j1.first = 0;
    j1.last = 4;
    straight = ec_run_job(&c, &j1);
    j2.first = 0;
    j2.last = 2;
    j2.save_dir = dir;
    before = ec_run_job(&c, &j2);
    ZT_CHECKF(straight->rc == ZERO_OK && before->rc == ZERO_OK, "%s %s", straight->err, before->err);
    /* the checkpoint's tensor table carries them */
    ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
    for (t = 0; ck && t < c.ntensors; t++) {
        zero_checkpoint_tensor ct;
        ZT_CHECK(zero_checkpoint_get_tensor(ck, t, &ct) == ZERO_OK);
        ZT_CHECKF(ct.lr_mul == c.lr_mul[t] && ct.weight_decay == c.hp_wd[t], "tensor %d: %g %g", t,
                  ct.lr_mul, ct.weight_decay);
    }
    zero_checkpoint_close(ck);
    /* an engine at the defaults loads them and continues as the straight run did */
    j3.first = 2;
    j3.last = 4;
    j3.load_dir = dir;
    j3.after_load = hp_after_load;
    after = ec_run_job(&c, &j3);
    ZT_CHECKF(after->rc == ZERO_OK, "%s", after->err);
    ZT_CHECKF(j3.checked == c.world, "%d of %d ranks loaded the hyper-parameters", j3.checked,
              c.world);
    if (after->rc == ZERO_OK && straight->rc == ZERO_OK)
        ZT_CHECKF(ec_same_state(&c, straight, after, why, sizeof why), "resumed: %s", why);
    ec_result_free(straight);
    ec_result_free(before);
    ec_result_free(after);
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        ZT_CHECK(system(cmd) == 0);
    }
}

/* ---- misuse ---- */

static zero_result hp_misuse_rank(int rank, zero_comm *comm, void *user)
{
    int *fails = (int *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    double mul = 0, wd = 0;
    int a = -1, b = -1;
#define HP_EXPECT(call, code, text)                                                          \
    do {                                                                                     \
        zero_result rr_ = (call);                                                            \
        if (rr_ != (code) || !strstr(zero_last_error(), (text))) {                           \
            fprintf(stderr, "  rank %d: %s gave %d '%s'\n", rank, #call, (int)rr_,           \
                    zero_last_error());                                                      \
            (*fails)++;                                                                      \
        }                                                                                    \
    } while (0)
    memset(&d, 0, sizeof d);
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    d.device = dev;
    d.comm = comm;
    d.adam.lr = 1e-3;
    d.adam.weight_decay = 0.1;
    r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "w", 10, 0, 0, &a);
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "b", 3, 0, ZERO_TENSOR_NO_DECAY, &b);
    if (r == ZERO_OK) {
        HP_EXPECT(zero_engine_set_tensor_hparams(e, a, 1.0, 0.0), ZERO_ERROR_INVALID_STATE,
                  "before zero_engine_commit");
        HP_EXPECT(zero_engine_tensor_hparams(e, a, &mul, &wd), ZERO_ERROR_INVALID_STATE,
                  "before zero_engine_commit");
        r = zero_engine_commit(e);
    }
    if (r == ZERO_OK) {
        /* defaults: 1, the engine's decay, 0 for NO_DECAY */
        if (zero_engine_tensor_hparams(e, a, &mul, &wd) != ZERO_OK || mul != 1.0 || wd != 0.1)
            (*fails)++;
        if (zero_engine_tensor_hparams(e, b, &mul, &wd) != ZERO_OK || mul != 1.0 || wd != 0.0)
            (*fails)++;
        r = zero_engine_set_tensor_hparams(e, a, 2.0, 0.01);
        HP_EXPECT(zero_engine_set_tensor_hparams(e, 2, 1.0, 0.0), ZERO_ERROR_NOT_FOUND, "tensor 2");
        HP_EXPECT(zero_engine_set_tensor_hparams(e, -1, 1.0, 0.0), ZERO_ERROR_NOT_FOUND,
                  "tensor -1");
        HP_EXPECT(zero_engine_set_tensor_hparams(e, a, -0.5, 0.0), ZERO_ERROR_INVALID_ARGUMENT,
                  "tensor 'w': lr_mul = -0.5");
        HP_EXPECT(zero_engine_set_tensor_hparams(e, a, NAN, 0.0), ZERO_ERROR_INVALID_ARGUMENT,
                  "lr_mul = nan");
        HP_EXPECT(zero_engine_set_tensor_hparams(e, a, INFINITY, 0.0), ZERO_ERROR_INVALID_ARGUMENT,
                  "lr_mul = inf");
        HP_EXPECT(zero_engine_set_tensor_hparams(e, b, 1.0, -0.5), ZERO_ERROR_INVALID_ARGUMENT,
                  "tensor 'b': weight_decay = -0.5");
        HP_EXPECT(zero_engine_set_tensor_hparams(e, b, 1.0, INFINITY), ZERO_ERROR_INVALID_ARGUMENT,
                  "weight_decay = inf");
        HP_EXPECT(zero_engine_set_tensor_hparams(e, a, 1e300, 0.0), ZERO_ERROR_INVALID_ARGUMENT,
                  "not finite in fp32");
        HP_EXPECT(zero_engine_tensor_hparams(NULL, a, &mul, &wd), ZERO_ERROR_INVALID_ARGUMENT,
                  "engine is NULL");
        /* the failed calls changed nothing */
        if (zero_engine_tensor_hparams(e, a, &mul, &wd) != ZERO_OK || mul != 2.0 || wd != 0.01)
            (*fails)++;
        /* an explicit decay overrides NO_DECAY; the default brings the flag back */
        if (zero_engine_set_tensor_hparams(e, b, 1.0, 0.2) != ZERO_OK ||
            zero_engine_tensor_hparams(e, b, NULL, &wd) != ZERO_OK || wd != 0.2)
            (*fails)++;
        if (zero_engine_set_tensor_hparams(e, b, 1.0, ZERO_WEIGHT_DECAY_DEFAULT) != ZERO_OK ||
            zero_engine_tensor_hparams(e, b, NULL, &wd) != ZERO_OK || wd != 0.0)
            (*fails)++;
    }
#undef HP_EXPECT
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(hparams_misuse)
{
    int fails = 0;
    ZT_CHECK(zero_local_run(1, hp_misuse_rank, &fails) == ZERO_OK);
    ZT_CHECKF(fails == 0, "%d checks failed", fails);
}

int main(void)
{
    ZT_RUN(hparams_match_float64_adamw);
    ZT_RUN(hparams_stages_identical);
    ZT_RUN(hparams_offload_equals_plain);
    ZT_RUN(hparams_saved_in_checkpoints);
    ZT_RUN(hparams_misuse);
    return zt_summary();
}
