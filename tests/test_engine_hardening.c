/* The engine, hardening: what attacking it with bad input found, each with the
   case that failed before the fix.
   - zero_engine_get_desc returned the loss-scaler block all zeros though documented as
     "every default filled in";
   - the stage-3 default max_live_numel overflowed for a group of SIZE_MAX / 3 elements and
     reported INVALID_ARGUMENT "exceeds max_live_numel = 0" instead of OVERFLOW;
   - ranks whose control flow diverged (rank 0 gathers group 0 while rank 1 gathers group 1
     of the same size; grads_ready on different groups) passed the comm's agreement check
     and mixed shards or summed gradients of different groups: the engine's tag (group,
     role, sequence) now travels with every collective and the local comm compares it. */
#define _XOPEN_SOURCE 700 /* POSIX names (mkdtemp, pwrite): zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

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
        /* DeepSpeed's raise_error_at_min_scale = true, resolved */
        ZT_CHECKF(out.scaler.at_min == ZERO_SCALER_AT_MIN_ERROR, "at_min %d", (int)out.scaler.at_min);
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

/* ---- ranks that diverge: the engine's tag in the local comm ------------------------------ */

/* Two groups of the same size (so every argument of their collectives agrees) and a third. */
#define DV_G 3
static const size_t dv_numel[DV_G] = {96, 96, 40};

typedef enum dv_kind { DV_GATHER = 0, DV_GRADS_READY = 1, DV_SAME = 2, DV_PREFETCH = 3 } dv_kind;

typedef struct dv_ctx {
    int stage;
    dv_kind kind;
    zero_result rc[2];
    char err[2][512];
    uint16_t gathered[2][96];
} dv_ctx;

static float dv_value(int g, size_t i) { return (float)(g + 1) + 0.01f * (float)i; }

static zero_result dv_rank(int rank, zero_comm *comm, void *user)
{
    dv_ctx *x = (dv_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    int g, mine = x->kind == DV_SAME ? 0 : rank; /* the group this rank works on */
    void *p;
    r = zero_host_device_create(NULL, &dev);
    memset(&d, 0, sizeof d);
    d.stage = x->stage;
    d.device = dev;
    d.comm = comm;
    d.prefetch_depth = -1;
    if (r == ZERO_OK) r = zero_engine_create(&d, &e);
    for (g = 0; g < DV_G && r == ZERO_OK; g++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", g);
        r = zero_engine_add_tensor(e, name, dv_numel[g], g, 0, NULL);
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    for (g = 0; g < DV_G && r == ZERO_OK; g++) { /* each group tells which it is */
        float v[96];
        size_t i;
        for (i = 0; i < dv_numel[g]; i++) v[i] = dv_value(g, i);
        r = zero_engine_set_tensor(e, g, v);
    }
    if (r == ZERO_OK) {
        if (x->kind == DV_GATHER) {
            r = zero_engine_gather(e, mine, &p);
        } else if (x->kind == DV_PREFETCH) { /* rank 0 prefetches group 1, rank 1 gathers it */
            if (rank == 0) r = zero_engine_prefetch(e, 1);
            if (r == ZERO_OK) r = zero_engine_gather(e, 1, &p);
            if (r == ZERO_OK) memcpy(x->gathered[rank], p, sizeof x->gathered[rank]);
        } else {
            r = zero_engine_grads(e, mine, &p);
            if (r == ZERO_OK) r = zero_engine_grads_ready(e, mine);
        }
        x->rc[rank] = r;
        snprintf(x->err[rank], sizeof x->err[rank], "%s", r != ZERO_OK ? zero_last_error() : "");
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

static void dv_run(dv_ctx *x)
{
    memset(x->rc, 0, sizeof x->rc);
    memset(x->err, 0, sizeof x->err);
    x->rc[0] = x->rc[1] = ZERO_ERROR_INVALID_STATE; /* overwritten by the call under test */
    ZT_CHECK(zero_local_run(2, dv_rank, x) == ZERO_OK);
}

/* Stage 3: rank 0 gathers group 0 while rank 1 gathers group 1 of the same size. Before the
   tag both returned OK with shards of different groups mixed. The engine's collectives
   before it: one (the commit check, seq 0), so the gather is seq 1 on both ranks. */
ZT_TEST(diverging_gather_is_a_mismatch)
{
    dv_ctx x;
    int r;
    const char *want = "rank 0 all_gather group 0 (gather, seq 1) vs rank 1 all_gather group 1 "
                       "(gather, seq 1)";
    memset(&x, 0, sizeof x);
    x.stage = 3;
    x.kind = DV_GATHER;
    dv_run(&x);
    for (r = 0; r < 2; r++) {
        ZT_CHECKF(x.rc[r] == ZERO_ERROR_MISMATCH, "rank %d: %s: %s", r, zero_result_string(x.rc[r]),
                  x.err[r]);
        ZT_CHECKF(strstr(x.err[r], want) != NULL, "rank %d: %s", r, x.err[r]);
        if (getenv("DV_SHOW")) printf("  %s\n", x.err[r]);
    }
    /* the same program on the same group: no complaint */
    x.kind = DV_SAME;
    dv_run(&x);
    ZT_CHECKF(x.rc[0] == ZERO_OK && x.rc[1] == ZERO_OK, "%s / %s", x.err[0], x.err[1]);
}

/* A prefetch and an on-demand gather of the same group are one collective (both GATHER):
   rank 0 prefetching group 1 while rank 1 gathers it agrees, and both hold the same group. */
ZT_TEST(prefetch_and_gather_agree)
{
    dv_ctx x;
    memset(&x, 0, sizeof x);
    x.stage = 3;
    x.kind = DV_PREFETCH;
    dv_run(&x);
    ZT_CHECKF(x.rc[0] == ZERO_OK && x.rc[1] == ZERO_OK, "%s / %s", x.err[0], x.err[1]);
    { /* both hold group 1 (tensor w1 at offset 0), as set */
        int r;
        size_t i;
        for (r = 0; r < 2; r++)
            for (i = 0; i < 96; i++)
                ZT_CHECKF(x.gathered[r][i] == zero_f32_to_f16(dv_value(1, i)), "rank %d element %zu",
                          r, i);
    }
}

/* grads_ready on different groups at every stage: before the tag the ranks summed the
   gradients of different groups. */
ZT_TEST(diverging_grads_ready_is_a_mismatch)
{
    dv_ctx x;
    int st, r;
    memset(&x, 0, sizeof x);
    for (st = 0; st <= 3; st++) {
        const char *kind = st == 0 ? "all_reduce" : "reduce_scatter";
        char want[160];
        snprintf(want, sizeof want,
                 "rank 0 %s group 0 (grad_reduce, seq 1) vs rank 1 %s group 1 (grad_reduce, seq 1)",
                 kind, kind);
        x.stage = st;
        x.kind = DV_GRADS_READY;
        dv_run(&x);
        for (r = 0; r < 2; r++) {
            ZT_CHECKF(x.rc[r] == ZERO_ERROR_MISMATCH, "stage %d rank %d: %s: %s", st, r,
                      zero_result_string(x.rc[r]), x.err[r]);
            ZT_CHECKF(strstr(x.err[r], want) != NULL, "stage %d rank %d: %s", st, r, x.err[r]);
        }
        x.kind = DV_SAME;
        dv_run(&x);
        ZT_CHECKF(x.rc[0] == ZERO_OK && x.rc[1] == ZERO_OK, "stage %d: %s / %s", st, x.err[0],
                  x.err[1]);
    }
}

/* Direct users of the comm are untagged and not compared on the tag; a tagged call and an
   untagged one with equal arguments agree; equal tags agree; a different seq or role is a
   mismatch naming both sides. */
typedef struct tag_case {
    zero_comm_tag t[2];
    zero_result rc[2];
    char err[2][512];
} tag_case;

static zero_result tag_rank(int rank, zero_comm *comm, void *user)
{
    tag_case *x = (tag_case *)user;
    float v[4] = {1, 2, 3, 4}, out[8];
    comm->tag = x->t[rank];
    x->rc[rank] = comm->ops->all_gather(comm, v, out, 4, ZERO_F32, NULL);
    snprintf(x->err[rank], sizeof x->err[rank], "%s", x->rc[rank] ? zero_last_error() : "");
    /* the group stays usable after a mismatch */
    memset(&comm->tag, 0, sizeof comm->tag);
    return comm->ops->all_reduce(comm, v, v, 4, ZERO_F32, ZERO_OP_SUM, NULL);
}

ZT_TEST(local_comm_compares_tags)
{
    tag_case x;
    int r;
    memset(&x, 0, sizeof x);
    ZT_CHECK(zero_local_run(2, tag_rank, &x) == ZERO_OK);
    ZT_CHECK(x.rc[0] == ZERO_OK && x.rc[1] == ZERO_OK);
    x.t[0].role = ZERO_ROLE_GATHER; /* rank 1 untagged */
    x.t[0].group = 5;
    ZT_CHECK(zero_local_run(2, tag_rank, &x) == ZERO_OK);
    ZT_CHECK(x.rc[0] == ZERO_OK && x.rc[1] == ZERO_OK);
    x.t[1] = x.t[0];
    ZT_CHECK(zero_local_run(2, tag_rank, &x) == ZERO_OK);
    ZT_CHECK(x.rc[0] == ZERO_OK && x.rc[1] == ZERO_OK);
    x.t[1].seq = 3;
    ZT_CHECK(zero_local_run(2, tag_rank, &x) == ZERO_OK);
    for (r = 0; r < 2; r++) {
        ZT_CHECK(x.rc[r] == ZERO_ERROR_MISMATCH);
        ZT_CHECKF(strstr(x.err[r], "rank 0 all_gather group 5 (gather, seq 0) vs rank 1 all_gather "
                                   "group 5 (gather, seq 3)") != NULL, "%s", x.err[r]);
    }
    x.t[1] = x.t[0];
    x.t[1].role = ZERO_ROLE_PARAM_UPDATE;
    x.t[0].group = x.t[1].group = -1;
    ZT_CHECK(zero_local_run(2, tag_rank, &x) == ZERO_OK);
    for (r = 0; r < 2; r++)
        ZT_CHECKF(x.rc[r] == ZERO_ERROR_MISMATCH &&
                      strstr(x.err[r], "rank 0 all_gather (gather, seq 0) vs rank 1 all_gather "
                                       "(param_update, seq 0)") != NULL, "%s", x.err[r]);
    /* a payload split into pieces: the same role, group and seq, another whole count */
    x.t[1] = x.t[0];
    x.t[0].role = x.t[1].role = ZERO_ROLE_USER;
    x.t[0].count = 8;
    x.t[1].count = 9;
    ZT_CHECK(zero_local_run(2, tag_rank, &x) == ZERO_OK);
    for (r = 0; r < 2; r++)
        ZT_CHECKF(x.rc[r] == ZERO_ERROR_MISMATCH &&
                      strstr(x.err[r], "rank 0 all_gather (user, seq 0, count 8) vs rank 1 all_gather "
                                       "(user, seq 0, count 9)") != NULL, "%s", x.err[r]);
    /* the role names */
    ZT_CHECK(strcmp(zero_comm_role_name(ZERO_ROLE_NONE), "untagged") == 0);
    ZT_CHECK(strcmp(zero_comm_role_name(ZERO_ROLE_NORM), "norm") == 0);
    ZT_CHECK(strcmp(zero_comm_role_name(99), "?") == 0);
}

/* Every collective the engine runs is tagged, with seq counting 0, 1, 2, ... on each rank
   (a wrapper comm sees each call), and runs with equal tags are unaffected: the wrapped
   run equals the plain one bit for bit, at every stage, with accumulation, persistence,
   bucketing and grouped calls. */
ZT_TEST(engine_tags_every_collective)
{
    int st;
    for (st = 0; st <= 3; st++) {
        ec_cfg c;
        ec_result *plain, *wrapped;
        char why[160];
        ec_cfg_init(&c, st, 3, ZERO_F16, 2, 3);
        c.persist = 20;
        c.bucket = 200;
        plain = ec_run(&c);
        c.wrap_ops = &ec_wrap_ops;
        ec_wrap_reset(-1);
        wrapped = ec_run(&c);
        ZT_CHECKF(plain->rc == ZERO_OK && wrapped->rc == ZERO_OK, "stage %d: %s %s", st,
                  plain->err, wrapped->err);
        ZT_CHECKF(ec_wrap_untagged == 0, "stage %d: %d untagged engine collectives", st,
                  ec_wrap_untagged);
        ZT_CHECKF(ec_wrap_seq_breaks == 0, "stage %d: %d tags out of sequence", st,
                  ec_wrap_seq_breaks);
        ZT_CHECKF(ec_wrap_seq[0] > 10, "stage %d: %d collectives", st, ec_wrap_seq[0]);
        if (plain->rc == ZERO_OK && wrapped->rc == ZERO_OK)
            ZT_CHECKF(ec_same_state(&c, plain, wrapped, why, sizeof why), "stage %d: %s", st, why);
        ec_result_free(plain);
        ec_result_free(wrapped);
    }
}

int main(void)
{
    ZT_RUN(get_desc_fills_scaler_defaults);
    ZT_RUN(stage3_default_pool_overflow);
    ZT_RUN(diverging_gather_is_a_mismatch);
    ZT_RUN(prefetch_and_gather_agree);
    ZT_RUN(diverging_grads_ready_is_a_mismatch);
    ZT_RUN(local_comm_compares_tags);
    ZT_RUN(engine_tags_every_collective);
    return zt_summary();
}
