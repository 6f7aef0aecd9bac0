/* The engine, hardening (issue 8): what attacking it with bad input found, each with the
   case that failed before the fix.
   - zero_engine_get_desc returned the loss-scaler block all zeros though documented as
     "every default filled in";
   - the stage-3 default max_live_numel overflowed for a group of SIZE_MAX / 3 elements and
     reported INVALID_ARGUMENT "exceeds max_live_numel = 0" instead of OVERFLOW;
   - ranks whose control flow diverged (rank 0 gathers group 0 while rank 1 gathers group 1
     of the same size; grads_ready on different groups) passed the comm's agreement check
     and mixed shards or summed gradients of different groups: the engine's tag (group,
     role, sequence) now travels with every collective and the local comm compares it. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "tests/zt.h"
/* engine_common.h: added with the divergence tests */

/* One engine on a one-rank local comm and the host device (no collective partner needed). */
typedef struct solo {
    zero_local_group *grp;
    zero_comm *comm;
    zero_device *dev;
} solo;

static int solo_open(solo *s)
{
    zero_local_desc ld;
    memset(s, 0, sizeof *s);
    memset(&ld, 0, sizeof ld);
    ld.world = 1;
    if (zero_local_group_create(&ld, &s->grp) != ZERO_OK) return 0;
    if (zero_local_comm_create(s->grp, 0, &s->comm) != ZERO_OK) return 0;
    return zero_host_device_create(NULL, &s->dev) == ZERO_OK;
}

static void solo_close(solo *s)
{
    zero_device_destroy(s->dev);
    zero_comm_destroy(s->comm);
    zero_local_group_destroy(s->grp);
}

/* The documented defaults (zero.h, scaler declarations: DeepSpeed's DynamicLossScaler),
   written out here as the independent reference. */
ZT_TEST(get_desc_fills_scaler_defaults)
{
    static const zero_dtype dts[] = {ZERO_F16, ZERO_BF16, ZERO_F32, ZERO_DTYPE_DEFAULT};
    solo s;
    int i;
    ZT_CHECK(solo_open(&s));
    for (i = 0; i < 4; i++) {
        zero_engine_desc d, out;
        zero_engine *e = NULL;
        zero_scaler sc;
        memset(&d, 0, sizeof d);
        d.param_dtype = dts[i];
        d.device = s.dev;
        d.comm = s.comm;
        ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
        if (!e) continue;
        memset(&out, 0xff, sizeof out);
        ZT_CHECK(zero_engine_get_desc(e, &out) == ZERO_OK);
        ZT_CHECKF(out.scaler.mode == ((dts[i] == ZERO_F16 || dts[i] == ZERO_DTYPE_DEFAULT)
                                          ? ZERO_SCALER_DYNAMIC
                                          : ZERO_SCALER_NONE),
                  "dtype %d: mode %d", (int)dts[i], (int)out.scaler.mode);
        ZT_CHECKF(out.scaler.init_scale == 65536.0f, "init_scale %g", (double)out.scaler.init_scale);
        ZT_CHECKF(out.scaler.window == 1000, "window %d", out.scaler.window);
        ZT_CHECKF(out.scaler.hysteresis == 2, "hysteresis %d", out.scaler.hysteresis);
        ZT_CHECKF(out.scaler.min_scale == 1.0f, "min_scale %g", (double)out.scaler.min_scale);
        ZT_CHECKF(out.scaler.factor == 2.0f, "factor %g", (double)out.scaler.factor);
        ZT_CHECK(out.scaler.consecutive_hysteresis == 0);
        /* the filled descriptor is itself valid and resolves to the same scaler */
        ZT_CHECK(zero_scaler_init(&sc, &out.scaler, out.param_dtype) == ZERO_OK);
        ZT_CHECK(sc.scale == (out.scaler.mode == ZERO_SCALER_DYNAMIC ? 65536.0f : 1.0f));
        ZT_CHECK(zero_engine_loss_scale(e) == sc.scale);
        /* and the rest of the block as documented */
        ZT_CHECK(out.param_dtype == (dts[i] == ZERO_DTYPE_DEFAULT ? ZERO_F16 : dts[i]));
        ZT_CHECK(out.grad_comm_dtype == out.param_dtype);
        ZT_CHECK(out.accum_steps == 1 && out.prefetch_depth == 1);
        ZT_CHECK(out.align_numel == ZERO_DEFAULT_ALIGN_NUMEL);
        zero_engine_destroy(e);
    }
    { /* settings given are kept as given */
        zero_engine_desc d, out;
        zero_engine *e = NULL;
        memset(&d, 0, sizeof d);
        d.device = s.dev;
        d.comm = s.comm;
        d.scaler.mode = ZERO_SCALER_STATIC;
        d.scaler.init_scale = 128.0f;
        d.scaler.window = 7;
        d.scaler.factor = 4.0f;
        ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
        if (e) {
            ZT_CHECK(zero_engine_get_desc(e, &out) == ZERO_OK);
            ZT_CHECK(out.scaler.mode == ZERO_SCALER_STATIC && out.scaler.init_scale == 128.0f);
            ZT_CHECK(out.scaler.window == 7 && out.scaler.factor == 4.0f);
            ZT_CHECK(out.scaler.hysteresis == 2 && out.scaler.min_scale == 1.0f);
            zero_engine_destroy(e);
        }
    }
    solo_close(&s);
}

/* A stage-3 group of n elements with the default pool: (2 + depth) x n must be checked. */
static zero_result commit_one_group(solo *s, size_t n, int prefetch, char *err, size_t errn)
{
    zero_engine_desc d;
    zero_engine *e = NULL;
    zero_result r;
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = s->dev;
    d.comm = s->comm;
    d.prefetch_depth = prefetch;
    r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "huge", n, 0, 0, NULL);
    if (r == ZERO_OK) r = zero_engine_commit(e);
    snprintf(err, errn, "%s", zero_last_error());
    zero_engine_destroy(e); /* always safe after a failed commit */
    return r;
}

ZT_TEST(stage3_default_pool_overflow)
{
    solo s;
    char err[512];
    size_t n = SIZE_MAX / 3 + 1, sz, b[ZERO_MEM_COUNT];
    int k;
    zero_result r;
    ZT_CHECK(solo_open(&s));
    /* reference: 3 x n does not fit size_t (depth 1 gives 3 slots) */
    ZT_CHECK(n > SIZE_MAX / 3);
    r = commit_one_group(&s, n, 0, err, sizeof err);
    ZT_CHECKF(r == ZERO_ERROR_OVERFLOW, "%s: %s", zero_result_string(r), err);
    ZT_CHECKF(strstr(err, "max_live_numel = 0") == NULL, "%s", err);
    ZT_CHECKF(strstr(err, "default max_live_numel") != NULL, "%s", err);
    /* deeper prefetch, a group a little smaller but still overflowing 5 x n */
    r = commit_one_group(&s, SIZE_MAX / 5 + 1, 3, err, sizeof err);
    ZT_CHECKF(r == ZERO_ERROR_OVERFLOW, "%s: %s", zero_result_string(r), err);
    /* nothing left behind on the device */
    ZT_CHECK(zero_host_device_stats(s.dev, b, &sz) == ZERO_OK);
    ZT_CHECKF(sz == 0, "%zu allocations left", sz);
    for (k = 0; k < ZERO_MEM_COUNT; k++) ZT_CHECKF(b[k] == 0, "category %d: %zu bytes left", k, b[k]);
    solo_close(&s);
}

int main(void)
{
    ZT_RUN(get_desc_fills_scaler_defaults);
    ZT_RUN(stage3_default_pool_overflow);
    return zt_summary();
}
