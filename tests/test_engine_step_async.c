/* async_step: zero_engine_step(e, NULL) returns without reading the step's verdict; the
   engine applies it to the loss scaler and the step count when it next needs them. The
   reference is the same run with the synchronous step: parameters, moments, master weights,
   every step's info and every loss scale must be the same bits, at every stage, with
   skipped steps (inf and NaN on one rank), clipping, accumulation and scale growth. */
#define _XOPEN_SOURCE 700 /* POSIX names (mkdtemp, pwrite): zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

static void compare(ec_cfg *c, const char *what)
{
    ec_result *sync_r, *async_r;
    char why[256];
    int s, r;
    c->async_step = 0;
    sync_r = ec_run(c);
    c->async_step = 1;
    async_r = ec_run(c);
    ZT_CHECKF(sync_r->rc == ZERO_OK && async_r->rc == ZERO_OK, "%s: %s %s", what, sync_r->err, async_r->err);
    if (sync_r->rc == ZERO_OK && async_r->rc == ZERO_OK) {
        ZT_CHECKF(ec_same_state(c, sync_r, async_r, why, sizeof why), "%s: %s", what, why);
        for (s = 0; s < c->steps; s++) {
            ZT_CHECKF(sync_r->loss_scale_before[s] == async_r->loss_scale_before[s],
                      "%s: step %d loss scale %g vs %g", what, s, (double)sync_r->loss_scale_before[s],
                      (double)async_r->loss_scale_before[s]);
            for (r = 0; r < c->world; r++)
                ZT_CHECKF(!memcmp(&sync_r->info[r][s], &async_r->info[r][s], sizeof(zero_step_info)),
                          "%s: rank %d step %d info differs (step %lld/%lld, skipped %d/%d, norm %g/%g)", what, r,
                          s, (long long)sync_r->info[r][s].step, (long long)async_r->info[r][s].step,
                          sync_r->info[r][s].skipped, async_r->info[r][s].skipped,
                          (double)sync_r->info[r][s].grad_norm, (double)async_r->info[r][s].grad_norm);
        }
    }
    ec_result_free(sync_r);
    ec_result_free(async_r);
}

ZT_TEST(test_async_equals_sync)
{
    static const int pattern[] = {1, 2, 5, 6, 9};
    int stage, world, i;
    for (stage = 0; stage <= 3; stage++)
        for (world = 1; world <= (zt_quick() ? 2 : 3); world++) {
            ec_cfg c;
            char what[64];
            ec_cfg_init(&c, stage, world, ZERO_F16, 2, zt_quick() ? 8 : 12);
            c.init_scale = 1024.0f;
            c.window = 2; /* the scale grows and shrinks within the run */
            c.hysteresis = 1;
            c.clip = 0.5f;
            c.fault_rank = world - 1;
            c.fault_inf = stage & 1;
            for (i = 0; i < 5; i++) c.fault_steps[i] = pattern[i];
            c.nfault = 5;
            snprintf(what, sizeof what, "stage %d world %d", stage, world);
            compare(&c, what);
        }
}

/* zero_engine_last_step before any step, and its argument checks. */
ZT_TEST(test_last_step_args)
{
    zero_step_info info;
    ZT_CHECK(zero_engine_last_step(NULL, &info) == ZERO_ERROR_INVALID_ARGUMENT);
}

int main(void)
{
    ZT_RUN(test_async_equals_sync);
    ZT_RUN(test_last_step_args);
    return zt_summary();
}
