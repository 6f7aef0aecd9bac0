/* test_checkpoint.c - checkpoints: CRC32C against published vectors, exact resume at every
   stage / world / dtype with accumulation and loss-scaler events, resharding N -> N' and
   stage s -> s', corruption (flipped byte, truncation, missing file, other plan) reported
   on every rank with the engine unchanged, crash safety under SIGKILL, safetensors out and
   in. Set ZERO_CKPT_KILLS=200 for the full kill test (make test-ckpt-kill). */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char ck_root[256];

static void ck_path(char *dst, size_t n, const char *name)
{
    snprintf(dst, n, "%s/%s", ck_root, name);
}

static void ck_rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "rm -rf %s failed\n", dir);
}

/* ---- CRC32C ------------------------------------------------------------------------------- */

ZT_TEST(crc32c_vectors)
{
    unsigned char buf[48];
    int i;
    /* RFC 3720 (iSCSI) appendix B.4 and the common check value */
    ZT_CHECK(zero_crc32c(0, "123456789", 9) == 0xE3069283u);
    memset(buf, 0, 32);
    ZT_CHECKF(zero_crc32c(0, buf, 32) == 0x8A9136AAu, "%08x", zero_crc32c(0, buf, 32));
    memset(buf, 0xff, 32);
    ZT_CHECKF(zero_crc32c(0, buf, 32) == 0x62A8AB43u, "%08x", zero_crc32c(0, buf, 32));
    for (i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    ZT_CHECKF(zero_crc32c(0, buf, 32) == 0x46DD794Eu, "%08x", zero_crc32c(0, buf, 32));
    for (i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
    ZT_CHECKF(zero_crc32c(0, buf, 32) == 0x113FDB5Cu, "%08x", zero_crc32c(0, buf, 32));
    ZT_CHECK(zero_crc32c(0, NULL, 0) == 0);
}

/* The SSE4.2 path (when the CPU has it) and the table path agree at every length and
   alignment, and continuing over pieces equals one pass. */
ZT_TEST(crc32c_paths_agree)
{
    static unsigned char buf[4096 + 64];
    size_t len, al;
    uint32_t x = 12345;
    for (len = 0; len < sizeof buf; len++) {
        x = x * 1103515245u + 12345u;
        buf[len] = (unsigned char)(x >> 16);
    }
    for (al = 0; al < 8; al++)
        for (len = 0; len < 300; len += 7) {
            uint32_t a = zero_crc32c(0, buf + al, len);
            uint32_t b = ~zero__crc_sw(~0u, buf + al, len);
            uint32_t c = zero_crc32c(zero_crc32c(0, buf + al, len / 3), buf + al + len / 3, len - len / 3);
            ZT_CHECKF(a == b && a == c, "len %zu align %zu: %08x %08x %08x", len, al, a, b, c);
        }
    ZT_CHECK(zero_crc32c(0, buf, 4096) == ~zero__crc_sw(~0u, buf, 4096));
}

/* CRC32C one bit at a time from its definition (reflected 0x82F63B78, init and final
   inversion): the reference of the tests below, independent of the tables and SSE4.2. */
static uint32_t crc_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        c ^= p[i];
        for (k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

/* zero_crc32c_combine(crc(A), crc(B), |B|) = crc(A B): random splits of random lengths
   (0, odd, past the three-lane stride of the SSE4.2 path), zero-length pieces on either
   side, and a range cut into many pieces joined left to right; the long one-pass CRCs
   (three lanes) against the bitwise definition. */
ZT_TEST(crc32c_combine_matches_one_pass)
{
    size_t cap = 3 * 8192 * 3 + 777, len, i;
    unsigned char *buf = (unsigned char *)malloc(cap);
    uint32_t x = 777;
    int it;
    ZT_CHECK(buf != NULL);
    if (!buf) return;
    for (i = 0; i < cap; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
    ZT_CHECK(zero_crc32c_combine(0, 0, 0) == 0);
    ZT_CHECK(zero_crc32c_combine(0xE3069283u, 0, 0) == 0xE3069283u); /* B empty */
    ZT_CHECK(zero_crc32c_combine(0, 0xE3069283u, 9) == 0xE3069283u); /* A empty */
    for (len = cap - 40; len <= cap; len += 13) { /* the three-lane path, odd starts */
        uint32_t ref = crc_bitwise(buf + (len & 7), len - 8);
        ZT_CHECKF(zero_crc32c(0, buf + (len & 7), len - 8) == ref, "len %zu", len - 8);
        ZT_CHECK(~zero__crc_sw(~0u, buf + (len & 7), len - 8) == ref);
    }
    for (it = 0; it < 400; it++) {
        size_t n, a;
        uint32_t whole, ca, cb;
        x = x * 1103515245u + 12345u;
        n = it < 8 ? (size_t)it : (size_t)(x >> 8) % (it % 4 == 0 ? cap : 5000);
        x = x * 1103515245u + 12345u;
        a = it % 10 == 0 ? 0 : it % 10 == 1 ? n : (n ? (size_t)(x >> 8) % (n + 1) : 0);
        whole = zero_crc32c(0, buf, n);
        ca = zero_crc32c(0, buf, a);
        cb = zero_crc32c(0, buf + a, n - a);
        ZT_CHECKF(zero_crc32c_combine(ca, cb, n - a) == whole, "n %zu split %zu", n, a);
        if (it % 50 == 0) ZT_CHECK(whole == crc_bitwise(buf, n));
    }
    { /* many pieces of one range (as the I/O engine's blocks), the last one short */
        size_t piece = 4096 + 3, at = 0;
        uint32_t c = 0;
        len = cap - 11;
        while (at < len) {
            size_t m = len - at < piece ? len - at : piece;
            c = zero_crc32c_combine(c, zero_crc32c(0, buf + at, m), m);
            at += m;
        }
        ZT_CHECK(c == crc_bitwise(buf, len));
    }
    free(buf);
}

/* Shapes: registered, reported, carried by checkpoints; bad shapes refused, nothing added. */
static zero_result shape_fn(int rank, zero_comm *comm, void *user)
{
    int *fails = (int *)user, nd = -1, id = -1;
    uint64_t dims[ZERO_TENSOR_MAX_DIMS], d3[3] = {2, 3, 4}, d0[2] = {5, 0}, big[2] = {UINT64_MAX / 2, 4};
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    (void)rank;
    memset(&d, 0, sizeof d);
    zero_host_device_create(NULL, &dev);
    d.device = dev;
    d.comm = comm;
    zero_engine_create(&d, &e);
    if (zero_engine_add_tensor_shape(e, "w", 3, d3, 0, 0, &id) != ZERO_OK || id != 0) (*fails)++;
    if (zero_engine_add_tensor_shape(e, "z", 2, d0, 0, 0, NULL) != ZERO_ERROR_INVALID_ARGUMENT) (*fails)++;
    if (zero_engine_add_tensor_shape(e, "n", 0, d3, 0, 0, NULL) != ZERO_ERROR_INVALID_ARGUMENT) (*fails)++;
    if (zero_engine_add_tensor_shape(e, "o", 2, big, 0, 0, NULL) != ZERO_ERROR_OVERFLOW) (*fails)++;
    if (zero_engine_add_tensor_shape(e, "w", 1, d3, 0, 0, NULL) != ZERO_ERROR_INVALID_ARGUMENT) (*fails)++;
    if (zero_engine_add_tensor(e, "b", 7, 0, 0, &id) != ZERO_OK || id != 1) (*fails)++;
    if (zero_engine_commit(e) != ZERO_OK) (*fails)++;
    if (zero_engine_tensor_shape(e, 0, &nd, dims) != ZERO_OK || nd != 3 || dims[0] != 2 ||
        dims[1] != 3 || dims[2] != 4)
        (*fails)++;
    if (zero_engine_tensor_shape(e, 1, &nd, dims) != ZERO_OK || nd != 0) (*fails)++;
    if (zero_engine_tensor_shape(e, 2, &nd, dims) != ZERO_ERROR_NOT_FOUND) (*fails)++;
    if (zero_plan_num_tensors(zero_engine_plan(e)) != 2) (*fails)++;
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(tensor_shapes)
{
    int fails = 0;
    ZT_CHECK(zero_local_run(1, shape_fn, &fails) == ZERO_OK);
    ZT_CHECKF(fails == 0, "%d shape checks failed", fails);
}

/* ---- a job: train, load, save on N ranks --------------------------------------------------- */

#define CK_CLIENT_MAX 3000

typedef struct ck_job {
    ec_ctx base; /* first: ec_run_with fills cfg and res */
    const char *load_dir, *save_dir, *st_in;
    const char *load_dir_odd; /* odd ranks load this one instead (ranks given different dirs) */
    int reshape_tensor;       /* tensor 0 registered as [n, 1] instead of [1, n] */
    int pre;      /* steps [0, pre) before the load */
    int s0, s1;   /* steps [s0, s1) after it */
    int rename_tensor, grow_tensor, reflag_tensor;
    int expect_load_fail;
    int prefetch_before_load; /* stage 3: a stale prefetched group must not survive the load */
    unsigned char gathered0[EC_MAX_RANKS][64 * 4]; /* tensor 0 as gathered right after the load */
    zero_result load_rc[EC_MAX_RANKS];
    char load_msg[EC_MAX_RANKS][512];
    int unchanged[EC_MAX_RANKS];
    zero_scaler scaler[EC_MAX_RANKS], scaler_loaded[EC_MAX_RANKS];
    int64_t step[EC_MAX_RANKS];
    /* client state: saved from 'client' (rank 0; the others pass other bytes), loaded with
       zero_engine_load_client() into a buffer of client_cap bytes when load_client is set */
    const unsigned char *client;
    size_t client_n, client_cap;
    int load_client, null_client0; /* null_client0: rank 0 passes NULL with client_n */
    unsigned char client_got[EC_MAX_RANKS][CK_CLIENT_MAX];
    size_t client_len[EC_MAX_RANKS];
    int client_untouched[EC_MAX_RANKS]; /* the buffer kept its fill after a failed load */
} ck_job;

static zero_result ck_train(zero_engine *e, const ec_cfg *c, const int *ids, int rank, int from,
                            int to, ec_result *res)
{
    int s;
    zero_result r = ZERO_OK;
    for (s = from; s < to; s++) {
        zero_step_info info;
        float scale = zero_engine_loss_scale(e);
        EC_TRY(ec_micro_steps(c, e, ids, rank, s, scale));
        EC_TRY(zero_engine_step(e, &info));
        if (s < EC_MAX_STEPS) res->info[rank][s] = info;
    }
done:
    return r;
}

/* A snapshot of every tensor's master, m, v and params as this rank holds them. */
static unsigned char *ck_snapshot(zero_engine *e, const ec_cfg *c, const int *ids, size_t *bytes)
{
    size_t total = 0, at = 0;
    int t, k;
    unsigned char *buf;
    for (t = 0; t < c->ntensors; t++) total += c->sizes[t] * 16;
    buf = (unsigned char *)calloc(1, total);
    for (t = 0; t < c->ntensors; t++)
        for (k = 0; k < 4; k++) {
            zero_range rg;
            zero_engine_read_tensor(e, ids[t], (zero_state_kind)k, buf + at, &rg);
            at += c->sizes[t] * 4;
        }
    *bytes = total;
    return buf;
}

static zero_result ck_rank_fn(int rank, zero_comm *comm, void *user)
{
    ck_job *job = (ck_job *)user;
    ec_ctx *ctx = &job->base;
    const ec_cfg *c = ctx->cfg;
    ec_result *res = ctx->res;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int ids[EC_MAX_T], t;
    float *tmp = NULL;
    size_t mx = 1;
    ec_engine_desc(c, &d);
    EC_TRY(zero_host_device_create(NULL, &dev));
    d.device = dev;
    d.comm = comm;
    EC_TRY(zero_engine_create(&d, &e));
    for (t = 0; t < c->ntensors; t++) {
        char name[32];
        size_t n = c->sizes[t];
        unsigned fl = c->flags[t];
        snprintf(name, sizeof name, t == 1 && job->rename_tensor ? "renamed%d" : "t%d", t);
        if (t == 2 && job->grow_tensor) n++;
        if (t == 3 && job->reflag_tensor) fl ^= ZERO_TENSOR_NO_DECAY;
        if (t == 0) {
            uint64_t dims[2];
            dims[0] = job->reshape_tensor ? n : 1;
            dims[1] = job->reshape_tensor ? 1 : n;
            EC_TRY(zero_engine_add_tensor_shape(e, name, 2, dims, c->groups[t], fl, &ids[t]));
        } else {
            EC_TRY(zero_engine_add_tensor(e, name, n, c->groups[t], fl, &ids[t]));
        }
        if (n > mx) mx = n;
    }
    EC_TRY(zero_engine_commit(e));
    tmp = (float *)malloc(mx * sizeof(float));
    EC_TRY(ec_set_init(e, c, ids, tmp));
    EC_TRY(ck_train(e, c, ids, rank, 0, job->pre, res));
    if (job->st_in) EC_TRY(zero_engine_load_safetensors(e, job->st_in));
    if (job->load_dir) {
        size_t nb = 0, nb2 = 0;
        const char *load_dir = rank % 2 && job->load_dir_odd ? job->load_dir_odd : job->load_dir;
        if (job->prefetch_before_load) EC_TRY(zero_engine_prefetch(e, 0));
        unsigned char *before = job->expect_load_fail ? ck_snapshot(e, c, ids, &nb) : NULL;
        if (job->load_client) {
            size_t k;
            memset(job->client_got[rank], 0xA5, CK_CLIENT_MAX);
            job->client_len[rank] = (size_t)-7;
            r = zero_engine_load_client(e, load_dir, job->client_got[rank], job->client_cap,
                                        &job->client_len[rank]);
            job->client_untouched[rank] = 1;
            for (k = 0; k < CK_CLIENT_MAX; k++)
                if (job->client_got[rank][k] != 0xA5) job->client_untouched[rank] = 0;
        } else {
            r = zero_engine_load(e, load_dir);
        }
        job->load_rc[rank] = r;
        snprintf(job->load_msg[rank], sizeof job->load_msg[rank], "%s", r ? zero_last_error() : "");
        if (before) {
            unsigned char *after = ck_snapshot(e, c, ids, &nb2);
            job->unchanged[rank] = nb == nb2 && memcmp(before, after, nb) == 0;
            free(before);
            free(after);
            if (r == ZERO_OK) goto done;
            r = ZERO_OK; /* the engine must still train */
        }
        if (r != ZERO_OK) goto done;
        zero_engine_scaler_state(e, &job->scaler_loaded[rank]);
        if (job->prefetch_before_load) {
            void *pp;
            zero_tensor_info ti;
            EC_TRY(zero_engine_gather(e, 0, &pp));
            zero_plan_tensor(zero_engine_plan(e), ids[0], &ti);
            memcpy(job->gathered0[rank], (unsigned char *)pp + ti.offset * zero_dtype_size(c->dtype),
                   ti.numel * zero_dtype_size(c->dtype));
            EC_TRY(zero_engine_release(e, 0));
        }
    }
    EC_TRY(ck_train(e, c, ids, rank, job->s0, job->s1, res));
    if (job->save_dir && job->client) { /* only rank 0's bytes count */
        static const unsigned char other[5] = {9, 9, 9, 9, 9};
        EC_TRY(zero_engine_save_client(e, job->save_dir,
                                       rank == 0 ? (job->null_client0 ? NULL : job->client) : other,
                                       rank == 0 ? job->client_n : (size_t)rank % 5));
    } else if (job->save_dir) {
        EC_TRY(zero_engine_save(e, job->save_dir));
    }
    zero_engine_scaler_state(e, &job->scaler[rank]);
    job->step[rank] = zero_engine_step_count(e);
    if (!job->rename_tensor && !job->grow_tensor && !job->reflag_tensor)
        for (t = 0; t < c->ntensors; t++) EC_TRY(ec_read_states(e, ctx, rank, t, ids[t]));
done:
    if (r != ZERO_OK) {
        pthread_mutex_lock(&ctx->mu);
        if (!res->err[0]) snprintf(res->err, sizeof res->err, "rank %d: %.490s", rank, zero_last_error());
        pthread_mutex_unlock(&ctx->mu);
    }
    free(tmp);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

static ec_result *ck_run(const ec_cfg *c, ck_job *job)
{
    return ec_run_with(c, &job->base, ck_rank_fn, job);
}

static int ck_same_scaler(const zero_scaler *a, const zero_scaler *b)
{
    return memcmp(&a->scale, &b->scale, 4) == 0 && a->factor == b->factor &&
           a->min_scale == b->min_scale && a->window == b->window &&
           a->hysteresis == b->hysteresis && a->cur_hysteresis == b->cur_hysteresis &&
           a->consecutive_hysteresis == b->consecutive_hysteresis && a->dynamic == b->dynamic &&
           a->iter == b->iter && a->last_overflow_iter == b->last_overflow_iter;
}

/* The fault schedule: an overflow before the save (hysteresis absorbs it) and one after. */
static void ck_cfg(ec_cfg *c, int stage, int world, zero_dtype dt, int T)
{
    ec_cfg_init(c, stage, world, dt, 2, 2 * T);
    c->window = 3;
    c->hysteresis = 2;
    c->init_scale = 1024.0f;
    c->fault_rank = world - 1;
    c->nfault = 2;
    c->fault_steps[0] = 1;
    c->fault_steps[1] = T; /* the first step after the resume: cur_hysteresis decides */
}

/* 2T steps straight == T steps, save, destroy, new engines, load, T steps. */
static void ck_resume_case(int stage, int world, zero_dtype dt, int T)
{
    ec_cfg c;
    ck_job a, b, s;
    ec_result *ra, *rb, *rs;
    char dir[300], why[200];
    int rk;
    ck_cfg(&c, stage, world, dt, T);
    snprintf(dir, sizeof dir, "%s/resume-s%d-n%d-%s", ck_root, stage, world, zero_dtype_name(dt));
    memset(&s, 0, sizeof s);
    s.s0 = 0;
    s.s1 = 2 * T;
    rs = ck_run(&c, &s);
    memset(&a, 0, sizeof a);
    a.s0 = 0;
    a.s1 = T;
    a.save_dir = dir;
    ra = ck_run(&c, &a);
    memset(&b, 0, sizeof b);
    b.load_dir = dir;
    b.s0 = T;
    b.s1 = 2 * T;
    b.prefetch_before_load = 1;
    rb = ck_run(&c, &b);
    ZT_CHECKF(rs->rc == ZERO_OK && ra->rc == ZERO_OK && rb->rc == ZERO_OK,
              "stage %d N %d %s: %s | %s | %s", stage, world, zero_dtype_name(dt), rs->err,
              ra->err, rb->err);
    if (rs->rc == ZERO_OK && rb->rc == ZERO_OK) {
        ZT_CHECKF(ec_same_state(&c, rs, rb, why, sizeof why), "stage %d N %d %s: %s", stage,
                  world, zero_dtype_name(dt), why);
        for (rk = 0; rk < world; rk++) {
            ZT_CHECKF(ck_same_scaler(&s.scaler[rk], &b.scaler[rk]),
                      "stage %d N %d %s rank %d: scaler scale %g/%g hyst %d/%d iter %lld/%lld",
                      stage, world, zero_dtype_name(dt), rk, (double)s.scaler[rk].scale,
                      (double)b.scaler[rk].scale, s.scaler[rk].cur_hysteresis,
                      b.scaler[rk].cur_hysteresis, (long long)s.scaler[rk].iter,
                      (long long)b.scaler[rk].iter);
            ZT_CHECK(s.step[rk] == b.step[rk]);
            ZT_CHECKF(ck_same_scaler(&a.scaler[rk], &b.scaler_loaded[rk]),
                      "rank %d: the loaded scaler state differs from the saved one", rk);
            ZT_CHECKF(memcmp(b.gathered0[rk], ra->param[0], c.sizes[0] * zero_dtype_size(dt)) == 0,
                      "stage %d N %d rank %d: tensor 0 gathered after the load is stale", stage,
                      world, rk);
        }
        /* the scenario exercised what it claims: a skipped step in each half (fp16) */
        if (dt == ZERO_F16) ZT_CHECKF(s.step[0] == 2 * T - 2, "steps %lld", (long long)s.step[0]);
    }
    ec_result_free(rs);
    ec_result_free(ra);
    ec_result_free(rb);
}

ZT_TEST(exact_resume)
{
    int stage, world, T = zt_quick() ? 3 : 4;
    for (stage = 0; stage <= 3; stage++)
        for (world = 1; world <= 4; world++) {
            if (zt_quick() && world == 3) continue;
            ck_resume_case(stage, world, ZERO_F16, T);
            ck_resume_case(stage, world, ZERO_BF16, T);
        }
}

/* ---- resharding ---------------------------------------------------------------------------- */

static int ck_same_opt_state(const ec_cfg *c, const ec_result *a, const ec_result *b, char *why,
                             size_t n)
{
    int t;
    for (t = 0; t < c->ntensors; t++) {
        size_t e = c->sizes[t] * 4;
        if (memcmp(a->master[t], b->master[t], e) || memcmp(a->m[t], b->m[t], e) ||
            memcmp(a->v[t], b->v[t], e) ||
            memcmp(a->param[t], b->param[t], c->sizes[t] * zero_dtype_size(c->dtype))) {
            snprintf(why, n, "tensor t%d differs", t);
            return 0;
        }
    }
    return 1;
}

ZT_TEST(reshard_any_world_any_stage)
{
    static const int from[][2] = {{4, 3}, {3, 1}, {2, 2}, {1, 0}};
    int f, nw, st, T = 3;
    for (f = 0; f < 4; f++) {
        ec_cfg c, c2;
        ck_job a;
        ec_result *ra;
        char dir[300];
        ck_cfg(&c, from[f][1], from[f][0], ZERO_BF16, T);
        c.nfault = 0;
        snprintf(dir, sizeof dir, "%s/reshard-%d", ck_root, f);
        memset(&a, 0, sizeof a);
        a.s0 = 0;
        a.s1 = T;
        a.save_dir = dir;
        ra = ck_run(&c, &a);
        ZT_CHECKF(ra->rc == ZERO_OK, "save N %d stage %d: %s", from[f][0], from[f][1], ra->err);
        for (nw = 1; nw <= 8; nw++)
            for (st = 0; st <= 3; st++) {
                ck_job b, b2;
                ec_result *rb, *rb2;
                char why[200];
                if (zt_quick() && (nw % 3) != (st % 3)) continue;
                if (!zt_quick() && (nw + st + f) % 2) continue; /* half the grid, every N' and s' */
                c2 = c;
                c2.world = nw;
                c2.stage = st;
                /* loaded, no training: every tensor's state read back bit-identical */
                memset(&b, 0, sizeof b);
                b.load_dir = dir;
                rb = ck_run(&c2, &b);
                ZT_CHECKF(rb->rc == ZERO_OK, "N %d s %d -> N %d s %d: %s", from[f][0], from[f][1],
                          nw, st, rb->err);
                if (rb->rc == ZERO_OK && ra->rc == ZERO_OK) {
                    ZT_CHECKF(ck_same_opt_state(&c, ra, rb, why, sizeof why),
                              "N %d s %d -> N %d s %d: %s", from[f][0], from[f][1], nw, st, why);
                    ZT_CHECKF(rb->params_agree, "params differ across ranks after reshard");
                    ZT_CHECK(b.step[0] == T);
                }
                ec_result_free(rb);
                /* and training continues (at the same N it equals the straight run) */
                memset(&b2, 0, sizeof b2);
                b2.load_dir = dir;
                b2.s0 = T;
                b2.s1 = T + 2;
                rb2 = ck_run(&c2, &b2);
                ZT_CHECKF(rb2->rc == ZERO_OK && b2.step[0] == T + 2, "continue N %d s %d: %s", nw,
                          st, rb2->err);
                if (nw == from[f][0] && rb2->rc == ZERO_OK) {
                    ck_job s;
                    ec_result *rs;
                    ec_cfg c3 = c;
                    c3.steps = T + 2;
                    memset(&s, 0, sizeof s);
                    s.s1 = T + 2;
                    rs = ck_run(&c3, &s);
                    ZT_CHECKF(rs->rc == ZERO_OK && ec_same_state(&c, rs, rb2, why, sizeof why),
                              "stage %d -> %d at N %d continues differently: %s", from[f][1], st,
                              nw, why);
                    ec_result_free(rs);
                }
                ec_result_free(rb2);
            }
        ec_result_free(ra);
    }
}

/* ---- corruption ------------------------------------------------------------------------------ */

static void ck_flip(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    int ch;
    if (!f) return;
    if (off < 0) {
        fseek(f, 0, SEEK_END);
        off += ftell(f);
    }
    fseek(f, off, SEEK_SET);
    ch = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(ch ^ 0x20, f);
    fclose(f);
}

static long ck_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void ck_copy(const char *from, const char *to)
{
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "cp -f '%s' '%s'", from, to);
    if (system(cmd) != 0) fprintf(stderr, "cp failed\n");
}

/* Loads dir into engines that trained 1 step; every rank must fail with code want, a message
   containing needle, and an unchanged engine that still trains. */
static void ck_fail_job(ck_job *b, const char *dir)
{
    memset(b, 0, sizeof *b);
    b->load_dir = dir;
    b->pre = 1;
    b->s0 = 1;
    b->s1 = 2;
    b->expect_load_fail = 1;
}

/* Runs the failing load b (from ck_fail_job) and checks code, message and engine on every
   rank; with load_client set, also that the client buffer was not written. */
static void ck_expect_fail_job(const ec_cfg *c, ck_job *bp, zero_result want, const char *needle,
                               const char *label)
{
    ck_job b = *bp;
    ec_result *rb;
    int rk;
    rb = ck_run(c, &b);
    for (rk = 0; rk < c->world && b.load_client; rk++)
        ZT_CHECKF(b.client_untouched[rk], "%s: rank %d's client buffer was written", label, rk);
    ZT_CHECKF(rb->rc == ZERO_OK, "%s: the engine did not train after the failed load: %s", label, rb->err);
    for (rk = 0; rk < c->world; rk++) {
        ZT_CHECKF(b.load_rc[rk] == want, "%s: rank %d got %s: %s", label, rk,
                  zero_result_string(b.load_rc[rk]), b.load_msg[rk]);
        ZT_CHECKF(strstr(b.load_msg[rk], needle) != NULL, "%s: rank %d message lacks '%s': %s",
                  label, rk, needle, b.load_msg[rk]);
        ZT_CHECKF(b.unchanged[rk], "%s: rank %d's engine changed", label, rk);
        ZT_CHECK(b.step[rk] == 2); /* 1 step before the failed load, 1 after */
    }
    *bp = b;
    ec_result_free(rb);
}

static void ck_expect_fail(const ec_cfg *c, const char *dir, zero_result want, const char *needle,
                           int rename, int grow, int reflag, const char *label)
{
    ck_job b;
    ck_fail_job(&b, dir);
    b.rename_tensor = rename;
    b.grow_tensor = grow;
    b.reflag_tensor = reflag;
    ck_expect_fail_job(c, &b, want, needle, label);
}

ZT_TEST(corruption_detected_everywhere)
{
    ec_cfg c;
    ck_job a;
    ec_result *ra;
    char dir[300], f0[400], f1[400], man[400], bak[400], name[64];
    ck_cfg(&c, 2, 3, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/corrupt", ck_root);
    memset(&a, 0, sizeof a);
    a.s1 = 2;
    a.save_dir = dir;
    ra = ck_run(&c, &a);
    ZT_CHECKF(ra->rc == ZERO_OK, "%s", ra->err);
    ec_result_free(ra);
    zero__ck_shard_name(name, sizeof name, 1, 0);
    snprintf(f0, sizeof f0, "%s/%s", dir, name);
    zero__ck_shard_name(name, sizeof name, 1, 2);
    snprintf(f1, sizeof f1, "%s/%s", dir, name);
    snprintf(man, sizeof man, "%s/zero.manifest", dir);
    snprintf(bak, sizeof bak, "%s/backup", ck_root);
    ZT_CHECKF(ck_size(f0) > 0 && ck_size(f1) > 0, "shard files missing: %s", f0);
    /* the good checkpoint loads (steps: pre 1 is replaced by the loaded 2) */
    {
        ck_job b;
        ec_result *rb;
        memset(&b, 0, sizeof b);
        b.load_dir = dir;
        b.pre = 1;
        rb = ck_run(&c, &b);
        ZT_CHECKF(rb->rc == ZERO_OK && b.step[0] == 2, "%s", rb->err);
        ec_result_free(rb);
    }
    /* a flipped byte in the last data section of rank 2's file */
    ck_copy(f1, bak);
    ck_flip(f1, -3);
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "-00002.shard: checksum mismatch in the params section",
                   0, 0, 0, "flipped data byte");
    {   /* the same through the resharding reader (another world size and stage) */
        ec_cfg c2 = c;
        c2.world = 2;
        c2.stage = 3;
        ck_expect_fail(&c2, dir, ZERO_ERROR_IO, "-00002.shard: checksum mismatch in the params "
                       "section", 0, 0, 0, "flipped data byte, resharding");
    }
    ck_copy(bak, f1);
    /* a flipped byte in a shard header */
    ck_flip(f1, 70);
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "header checksum mismatch", 0, 0, 0, "flipped header byte");
    ck_copy(bak, f1);
    /* a flipped byte in the manifest */
    ck_copy(man, bak);
    ck_flip(man, 100);
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "zero.manifest: checksum mismatch", 0, 0, 0, "manifest byte");
    ck_copy(bak, man);
    /* a truncated shard file */
    ck_copy(f0, bak);
    ZT_CHECK(truncate(f0, ck_size(f0) - 10) == 0);
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "-00000.shard: ", 0, 0, 0, "truncated");
    ck_copy(bak, f0);
    /* a missing shard file */
    ZT_CHECK(rename(f1, bak) == 0);
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "missing shard file of rank 2", 0, 0, 0, "missing file");
    ZT_CHECK(rename(bak, f1) == 0);
    /* plans that differ: a name, a size, a flag */
    ck_expect_fail(&c, dir, ZERO_ERROR_MISMATCH, "tensor 't1' of the checkpoint is not registered",
                   1, 0, 0, "renamed tensor");
    ck_expect_fail(&c, dir, ZERO_ERROR_MISMATCH, "tensor 't2' has 101 elements in the checkpoint, 102",
                   0, 1, 0, "grown tensor");
    ck_expect_fail(&c, dir, ZERO_ERROR_MISMATCH, "tensor 't3' has flags", 0, 0, 1, "flags");
    /* no checkpoint at all */
    ck_expect_fail(&c, ck_root, ZERO_ERROR_NOT_FOUND, "no checkpoint", 0, 0, 0, "no manifest");
    /* the tool-side reader finds the same */
    {
        zero_checkpoint *ck = NULL;
        ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
        ZT_CHECK(ck && zero_checkpoint_verify(ck) == ZERO_OK);
        ck_copy(f1, bak);
        ck_flip(f1, ck_size(f1) / 2);
        ZT_CHECK(ck && zero_checkpoint_verify(ck) == ZERO_ERROR_IO);
        ZT_CHECKF(strstr(zero_last_error(), "checksum mismatch") != NULL, "%s", zero_last_error());
        ck_copy(bak, f1);
        zero_checkpoint_close(ck);
    }
}

/* A save that cannot write fails on every rank with the same message; the engine trains on
   and a later save elsewhere works (and equals a run that never failed). */
ZT_TEST(save_failure_everywhere)
{
    ec_cfg c;
    ck_job a, b;
    ec_result *ra, *rb;
    char bad[400], good[400], why[200];
    FILE *f;
    ck_cfg(&c, 3, 3, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(bad, sizeof bad, "%s/plainfile", ck_root);
    f = fopen(bad, "w");
    if (f) fclose(f);
    snprintf(bad, sizeof bad, "%s/plainfile/ckpt", ck_root); /* its parent is a file */
    snprintf(good, sizeof good, "%s/after-failure", ck_root);
    memset(&a, 0, sizeof a);
    a.s1 = 2;
    a.save_dir = bad;
    ra = ck_run(&c, &a);
    ZT_CHECKF(ra->rc == ZERO_ERROR_IO && strstr(ra->err, "plainfile/ckpt") != NULL, "%s: %s",
              zero_result_string(ra->rc), ra->err);
    ec_result_free(ra);
    memset(&a, 0, sizeof a);
    a.s1 = 2;
    a.save_dir = good;
    ra = ck_run(&c, &a);
    memset(&b, 0, sizeof b);
    b.load_dir = good;
    rb = ck_run(&c, &b);
    ZT_CHECKF(ra->rc == ZERO_OK && rb->rc == ZERO_OK && ec_same_state(&c, ra, rb, why, sizeof why),
              "%s %s %s", ra->err, rb->err, why);
    ec_result_free(ra);
    ec_result_free(rb);
}

/* ---- client state ------------------------------------------------------------------------------ */

static void ck_client_bytes(unsigned char *b, size_t n, unsigned seed)
{
    size_t i;
    uint32_t x = seed * 2654435761u + 1u;
    for (i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        b[i] = (unsigned char)(x >> 16);
    }
}

/* Loads dir at world/stage of c with a client buffer of cap bytes; every rank must get the
   n reference bytes and the saved engine state (ref: the saving run's result). */
static void ck_client_load_ok(const ec_cfg *c, const char *dir, const unsigned char *want,
                              size_t n, size_t cap, const ec_result *ref, const char *label)
{
    ck_job b;
    ec_result *rb;
    char why[200];
    int rk;
    memset(&b, 0, sizeof b);
    b.load_dir = dir;
    b.pre = 1;
    b.load_client = 1;
    b.client_cap = cap;
    rb = ck_run(c, &b);
    ZT_CHECKF(rb->rc == ZERO_OK, "%s: %s", label, rb->err);
    if (rb->rc == ZERO_OK && ref)
        ZT_CHECKF(ec_same_state(c, ref, rb, why, sizeof why), "%s: %s", label, why);
    for (rk = 0; rk < c->world && rb->rc == ZERO_OK; rk++) {
        ZT_CHECKF(b.client_len[rk] == n, "%s: rank %d got %zu bytes of client state, want %zu",
                  label, rk, b.client_len[rk], n);
        ZT_CHECKF(n == 0 ? b.client_untouched[rk] : memcmp(b.client_got[rk], want, n) == 0,
                  "%s: rank %d's client state differs from rank 0's", label, rk);
        ZT_CHECKF(n >= CK_CLIENT_MAX || b.client_got[rk][n] == 0xA5,
                  "%s: rank %d: bytes written past the client state", label, rk);
    }
    ec_result_free(rb);
}

/* zero_engine_save_client / zero_engine_load_client: rank 0's bytes reach every rank, at
   the saving world and resharded to another world and stage, with the engine state; the
   reader API sees the same; a save without client state loads as 0 bytes. */
ZT_TEST(client_state_round_trip)
{
    static unsigned char blob[CK_CLIENT_MAX];
    int world;
    for (world = 1; world <= 4; world++) {
        ec_cfg c, c2;
        ck_job a;
        ec_result *ra;
        char dir[300], label[80];
        size_t n = 1 + 613 * (size_t)world;
        int stage = world % 4;
        if (zt_quick() && world == 3) continue;
        ck_cfg(&c, stage, world, ZERO_F16, 2);
        c.nfault = 0;
        ck_client_bytes(blob, n, (unsigned)world);
        snprintf(dir, sizeof dir, "%s/client-n%d", ck_root, world);
        memset(&a, 0, sizeof a);
        a.s1 = 2;
        a.save_dir = dir;
        a.client = blob;
        a.client_n = n;
        ra = ck_run(&c, &a);
        ZT_CHECKF(ra->rc == ZERO_OK, "save N %d: %s", world, ra->err);
        snprintf(label, sizeof label, "N %d -> %d", world, world);
        ck_client_load_ok(&c, dir, blob, n, CK_CLIENT_MAX, ra, label);
        snprintf(label, sizeof label, "N %d -> %d, exact capacity", world, world);
        ck_client_load_ok(&c, dir, blob, n, n, ra, label);
        c2 = c;
        c2.world = world % 4 + 1;
        c2.stage = (stage + 1) % 4;
        snprintf(label, sizeof label, "N %d stage %d -> N %d stage %d", world, stage, c2.world,
                 c2.stage);
        ck_client_load_ok(&c2, dir, blob, n, CK_CLIENT_MAX, NULL, label);
        {   /* the reader API */
            zero_checkpoint *ck = NULL;
            zero_checkpoint_info in;
            unsigned char got[CK_CLIENT_MAX];
            ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
            if (ck) {
                zero_checkpoint_get_info(ck, &in);
                ZT_CHECKF(in.client_bytes == n, "info: %llu bytes", (unsigned long long)in.client_bytes);
                ZT_CHECK(zero_checkpoint_read_client(ck, got) == ZERO_OK && memcmp(got, blob, n) == 0);
                ZT_CHECKF(zero_checkpoint_verify(ck) == ZERO_OK, "%s", zero_last_error());
                zero_checkpoint_close(ck);
            }
        }
        {   /* a later save without client state: 0 bytes, the old client file is gone */
            ck_job p;
            char old[400], name[64];
            ec_result *rp;
            memset(&p, 0, sizeof p);
            p.s1 = 1;
            p.save_dir = dir;
            rp = ck_run(&c, &p);
            ZT_CHECKF(rp->rc == ZERO_OK, "%s", rp->err);
            ck_client_load_ok(&c, dir, blob, 0, CK_CLIENT_MAX, rp, "no client state");
            zero__ck_client_name(name, sizeof name, 1);
            snprintf(old, sizeof old, "%s/%s", dir, name);
            ZT_CHECKF(ck_size(old) < 0, "%s left behind", old);
            ec_result_free(rp);
        }
        ec_result_free(ra);
    }
}

/* Rewrites dir's manifest as format version 'version' wrote it: 2 without the per-tensor
   hyper-parameters (16 bytes a tensor before the checksum), 1 also without the client state
   entry (16 bytes before them). */
static int ck_manifest_to_version(const char *dir, int version)
{
    char man[400];
    FILE *f;
    unsigned char buf[1 << 16];
    size_t n, i;
    uint32_t crc;
    snprintf(man, sizeof man, "%s/zero.manifest", dir);
    f = fopen(man, "rb");
    if (!f) return 0;
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (n < 200 || n == sizeof buf) return 0;
    {
        size_t T = (size_t)buf[52] | (size_t)buf[53] << 8 | (size_t)buf[54] << 16 |
                   (size_t)buf[55] << 24, cut = 16 * T + (version == 1 ? 16 : 0);
        if (buf[8] != 3 || cut + 200 > n) return 0;
        memmove(buf + n - 4 - cut, buf + n - 4, 4);
        n -= cut;
    }
    buf[8] = (unsigned char)version;
    for (i = 0; i < 8; i++) buf[16 + i] = (unsigned char)((uint64_t)n >> (8 * i));
    crc = zero_crc32c(0, buf, n - 4);
    for (i = 0; i < 4; i++) buf[n - 4 + i] = (unsigned char)(crc >> (8 * i));
    f = fopen(man, "wb");
    if (!f) return 0;
    fwrite(buf, 1, n, f);
    fclose(f);
    return 1;
}

/* Checkpoints in the formats before client state (version 1) and before per-tensor
   hyper-parameters (version 2) load: 0 bytes of client state, every tensor at the defaults. */
ZT_TEST(client_state_old_format)
{
    ec_cfg c;
    ck_job a;
    ec_result *ra;
    char dir[300];
    ck_cfg(&c, 2, 2, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/client-v1", ck_root);
    memset(&a, 0, sizeof a);
    a.s1 = 2;
    a.save_dir = dir;
    ra = ck_run(&c, &a);
    ZT_CHECKF(ra->rc == ZERO_OK, "%s", ra->err);
    ZT_CHECK(ck_manifest_to_version(dir, 1));
    ck_client_load_ok(&c, dir, NULL, 0, CK_CLIENT_MAX, ra, "version 1 manifest");
    ec_result_free(ra);
    /* version 2 (client state, no per-tensor hyper-parameters): loads at the defaults */
    snprintf(dir, sizeof dir, "%s/client-v2", ck_root);
    a.save_dir = dir;
    ra = ck_run(&c, &a);
    ZT_CHECKF(ra->rc == ZERO_OK, "%s", ra->err);
    ZT_CHECK(ck_manifest_to_version(dir, 2));
    ck_client_load_ok(&c, dir, NULL, 0, CK_CLIENT_MAX, ra, "version 2 manifest");
    ec_result_free(ra);
}

/* A corrupt, truncated or missing client state file, and a capacity too small, fail on
   every rank before anything changes (engine and client buffer); too small reports the
   size needed. */
ZT_TEST(client_state_errors)
{
    static unsigned char blob[CK_CLIENT_MAX];
    ec_cfg c;
    ck_job a, b;
    ec_result *ra;
    char dir[300], cf[400], bak[400], name[64];
    size_t n = 1000;
    int rk;
    ck_cfg(&c, 3, 3, ZERO_F16, 2);
    c.nfault = 0;
    ck_client_bytes(blob, n, 77);
    snprintf(dir, sizeof dir, "%s/client-bad", ck_root);
    memset(&a, 0, sizeof a);
    a.s1 = 2;
    a.save_dir = dir;
    a.client = blob;
    a.client_n = n;
    ra = ck_run(&c, &a);
    ZT_CHECKF(ra->rc == ZERO_OK, "%s", ra->err);
    ec_result_free(ra);
    zero__ck_client_name(name, sizeof name, 1);
    snprintf(cf, sizeof cf, "%s/%s", dir, name);
    snprintf(bak, sizeof bak, "%s/client-backup", ck_root);
    ZT_CHECKF(ck_size(cf) == (long)n, "%s: %ld bytes", cf, ck_size(cf));
    /* capacity too small by one byte; and NULL, 0 (the size query) */
    ck_fail_job(&b, dir);
    b.load_client = 1;
    b.client_cap = n - 1;
    ck_expect_fail_job(&c, &b, ZERO_ERROR_INVALID_ARGUMENT, "1000 bytes of client state, the capacity is 999",
                       "capacity too small");
    for (rk = 0; rk < c.world; rk++)
        ZT_CHECKF(b.client_len[rk] == n, "rank %d: needed size reported as %zu", rk, b.client_len[rk]);
    /* a flipped byte */
    ck_copy(cf, bak);
    ck_flip(cf, 500);
    ck_fail_job(&b, dir);
    b.load_client = 1;
    b.client_cap = CK_CLIENT_MAX;
    ck_expect_fail_job(&c, &b, ZERO_ERROR_IO, ".client: client state checksum mismatch",
                       "flipped client byte");
    {   /* zero_checkpoint_verify (zero-ckpt info) finds it too */
        zero_checkpoint *ck = NULL;
        ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
        ZT_CHECK(ck && zero_checkpoint_verify(ck) == ZERO_ERROR_IO &&
                 strstr(zero_last_error(), "client state checksum mismatch"));
        zero_checkpoint_close(ck);
    }
    ck_copy(bak, cf);
    /* truncated, then missing */
    ZT_CHECK(truncate(cf, (off_t)n - 1) == 0);
    ck_fail_job(&b, dir);
    b.load_client = 1;
    b.client_cap = CK_CLIENT_MAX;
    ck_expect_fail_job(&c, &b, ZERO_ERROR_IO, ".client: client state of 999 bytes, the manifest says 1000",
                       "truncated client file");
    ZT_CHECK(unlink(cf) == 0);
    ck_expect_fail_job(&c, &b, ZERO_ERROR_IO, ".client: missing client state file", "missing client file");
    ck_copy(bak, cf);
    ck_client_load_ok(&c, dir, blob, n, CK_CLIENT_MAX, NULL, "restored client file");
    {   /* rank 0 passing NULL with a size fails every rank's save */
        memset(&a, 0, sizeof a);
        a.s1 = 1;
        a.save_dir = dir;
        a.client = blob;
        a.client_n = n;
        a.null_client0 = 1;
        ra = ck_run(&c, &a);
        ZT_CHECKF(ra->rc == ZERO_ERROR_INVALID_ARGUMENT && strstr(ra->err, "client is NULL"), "%s: %s",
                  zero_result_string(ra->rc), ra->err);
        ec_result_free(ra);
        ck_client_load_ok(&c, dir, blob, n, CK_CLIENT_MAX, NULL, "after the refused save");
    }
    {   /* a manifest (checksum valid) claiming 1 TB of client state: zero_checkpoint_verify
           (zero-ckpt info) compares the file's size first and allocates nothing of that size
           (it allocated the claimed bytes: OUT_OF_MEMORY, or an abort under ASan) */
        char man[400];
        unsigned char mb[1 << 16];
        size_t mn, i, at;
        uint32_t crc;
        uint64_t claim = (uint64_t)1 << 40;
        zero_checkpoint *ck = NULL;
        FILE *f;
        snprintf(man, sizeof man, "%s/zero.manifest", dir);
        f = fopen(man, "rb");
        ZT_CHECK(f != NULL);
        mn = f ? fread(mb, 1, sizeof mb, f) : 0;
        if (f) fclose(f);
        ZT_CHECK(mn > 200 && mn < sizeof mb);
        /* the client entry (u64 size = 1000, u32 CRC, u32 0), found from the end: the
           per-tensor entries of later versions follow it */
        for (at = mn - 20; at > 0; at--) {
            uint64_t v = 0;
            for (i = 0; i < 8; i++) v |= (uint64_t)mb[at + i] << (8 * i);
            if (v == n && !mb[at + 12] && !mb[at + 13] && !mb[at + 14] && !mb[at + 15]) break;
        }
        ZT_CHECK(at > 0);
        for (i = 0; i < 8; i++) mb[at + i] = (unsigned char)(claim >> (8 * i));
        crc = zero_crc32c(0, mb, mn - 4);
        for (i = 0; i < 4; i++) mb[mn - 4 + i] = (unsigned char)(crc >> (8 * i));
        f = fopen(man, "wb");
        ZT_CHECK(f && fwrite(mb, 1, mn, f) == mn);
        if (f) fclose(f);
        ZT_CHECKF(zero_checkpoint_open(dir, &ck) == ZERO_OK, "%s", zero_last_error());
        {
            zero_checkpoint_info in;
            memset(&in, 0, sizeof in);
            ZT_CHECK(ck && zero_checkpoint_get_info(ck, &in) == ZERO_OK && in.client_bytes == claim);
        }
        ZT_CHECKF(ck && zero_checkpoint_verify(ck) == ZERO_ERROR_IO &&
                      strstr(zero_last_error(), "client state of 1000 bytes, the manifest says 1099511627776"),
                  "%s", zero_last_error());
        zero_checkpoint_close(ck);
    }
}

/* ---- hostile directories, races and files ------------------------------------------------------ */

/* Saves a checkpoint of c (steps [0, steps)) into dir; 1 on success. */
static int ck_save(const ec_cfg *c, const char *dir, int steps)
{
    ck_job a;
    ec_result *ra;
    int ok;
    memset(&a, 0, sizeof a);
    a.s1 = steps;
    a.save_dir = dir;
    ra = ck_run(c, &a);
    ok = ra->rc == ZERO_OK;
    if (!ok) printf("  save into %s: %s\n", dir, ra->err);
    ec_result_free(ra);
    return ok;
}

/* The generations named by the files of dir (zero-<16 hex>...), sorted; their count. */
static int ck_dir_gens(const char *dir, uint64_t *gens, int cap, int *tmps)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0, i, j;
    if (tmps) *tmps = 0;
    if (!d) return 0;
    while ((de = readdir(d)) != NULL) {
        uint64_t g;
        size_t L = strlen(de->d_name);
        if (tmps && L > 4 && strcmp(de->d_name + L - 4, ".tmp") == 0) (*tmps)++;
        if (!zero__ck_name_gen(de->d_name, &g)) continue;
        for (i = 0; i < n && gens[i] != g; i++) {}
        if (i == n && n < cap) gens[n++] = g;
    }
    closedir(d);
    for (i = 1; i < n; i++) /* insertion sort */
        for (j = i; j > 0 && gens[j - 1] > gens[j]; j--) {
            uint64_t t = gens[j];
            gens[j] = gens[j - 1];
            gens[j - 1] = t;
        }
    return n;
}

static uint64_t ck_gen_of(const char *dir)
{
    zero_checkpoint *ck = NULL;
    zero_checkpoint_info in;
    memset(&in, 0, sizeof in);
    if (zero_checkpoint_open(dir, &ck) != ZERO_OK) return 0;
    zero_checkpoint_get_info(ck, &in);
    zero_checkpoint_close(ck);
    return in.generation;
}

/* A rank-0 commit between the ranks' manifest opens, made deterministic by the stage hook:
   rank 0 opens the old manifest, then a newer checkpoint is committed into the directory
   (its shard files copied in, its manifest renamed over), and only then do the other ranks
   open theirs. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int armed, done;
    char newer[400];
} ck_race = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, ""};

static void ck_race_hook(int rank, int where, const char *dir)
{
    pthread_mutex_lock(&ck_race.mu);
    if (ck_race.armed && rank != 0 && where == 0)
        while (!ck_race.done) pthread_cond_wait(&ck_race.cv, &ck_race.mu);
    if (ck_race.armed && rank == 0 && where == 1 && !ck_race.done) {
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "cp '%s'/zero-*.shard '%s'/ && cp '%s/zero.manifest' '%s/m.new' && "
                 "mv '%s/m.new' '%s/zero.manifest'", ck_race.newer, dir, ck_race.newer, dir, dir, dir);
        if (system(cmd) != 0) printf("  race hook: %s failed\n", cmd);
        ck_race.done = 1;
        pthread_cond_broadcast(&ck_race.cv);
    }
    pthread_mutex_unlock(&ck_race.mu);
}

/* Every rank loads the same checkpoint or none does: ranks given different directories,
   and ranks that open the manifest before and after a concurrent save's commit, fail with
   MISMATCH on every rank, every engine unchanged. The save lock: a live lock fails a save
   at once naming its holder; a stale one (its holder gone) is taken over. */
ZT_TEST(ranks_agree_on_the_checkpoint)
{
    ec_cfg c;
    ck_job b;
    char A[300], B[300], C[300], S[300], lock[400], host[256], want[700];
    int fd;
    ck_cfg(&c, 2, 4, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(A, sizeof A, "%s/agree-a", ck_root);
    snprintf(B, sizeof B, "%s/agree-b", ck_root);
    snprintf(C, sizeof C, "%s/agree-c", ck_root);
    snprintf(S, sizeof S, "%s/agree-s", ck_root);
    ZT_CHECK(ck_save(&c, A, 2) && ck_save(&c, B, 3) && ck_save(&c, C, 2));
    ZT_CHECK(ck_save(&c, S, 1) && ck_save(&c, S, 3) && ck_gen_of(S) == 2 && ck_gen_of(C) == 1);
    /* (b) different directories: both generation 1, different steps and checksums */
    ck_fail_job(&b, A);
    b.load_dir_odd = B;
    ck_expect_fail_job(&c, &b, ZERO_ERROR_MISMATCH, "the ranks opened different checkpoints",
                       "different directories");
    /* (a) a commit between rank 0's open and the others' */
    snprintf(ck_race.newer, sizeof ck_race.newer, "%s", S);
    ck_race.armed = 1;
    ck_race.done = 0;
    zero__ck_stage = ck_race_hook;
    ck_fail_job(&b, C);
    ck_expect_fail_job(&c, &b, ZERO_ERROR_MISMATCH, "the ranks opened different checkpoints",
                       "commit during the load");
    zero__ck_stage = NULL;
    ck_race.armed = 0;
    ZT_CHECK(ck_race.done && ck_gen_of(C) == 2);
    /* the save lock: live (held with flock by this process) */
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    snprintf(lock, sizeof lock, "%s/zero.lock", A);
    fd = open(lock, O_RDWR | O_CREAT | O_EXCL, 0644);
    ZT_CHECK(fd >= 0 && flock(fd, LOCK_EX) == 0);
    if (fd >= 0) {
        char txt[300];
        int n = snprintf(txt, sizeof txt, "pid %ld host %s\n", (long)getpid(), host);
        ZT_CHECK(write(fd, txt, (size_t)n) == n);
    }
    {
        ck_job a;
        ec_result *ra;
        memset(&a, 0, sizeof a);
        a.s1 = 1;
        a.save_dir = A;
        ra = ck_run(&c, &a);
        snprintf(want, sizeof want, "another save is in progress in %s (pid %ld, host %s", A,
                 (long)getpid(), host);
        ZT_CHECKF(ra->rc == ZERO_ERROR_IO && strstr(ra->err, want), "%s: %s",
                  zero_result_string(ra->rc), ra->err);
        ec_result_free(ra);
        ZT_CHECK(ck_gen_of(A) == 1 && ck_size(lock) > 0); /* untouched, lock left to its holder */
    }
    /* stale: the holder is gone (flock released); its pid is this live process */
    if (fd >= 0) close(fd);
    ZT_CHECK(ck_save(&c, A, 1));
    ZT_CHECKF(ck_gen_of(A) == 2 && ck_size(lock) < 0, "generation %llu, lock %ld",
              (unsigned long long)ck_gen_of(A), ck_size(lock));
    /* stale: a dead pid on this host, lock file without any flock holder */
    {
        FILE *f = fopen(lock, "w");
        if (f) {
            fprintf(f, "pid %d host %s\n", 999999999, host);
            fclose(f);
        }
        ZT_CHECK(ck_save(&c, A, 1) && ck_gen_of(A) == 3 && ck_size(lock) < 0);
    }
}

/* The save lock is decided by its flock alone: held = live (a save fails at once naming the
   holder), whatever pid and host the file names (a pid of another PID namespace or host
   reads as dead here); free = stale (taken over), whatever the file holds: empty (a kill -9
   between creating and writing it) or unreadable text. */
static void lk_write(const char *path, const char *text, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ZT_CHECK(fd >= 0 && write(fd, text, n) == (ssize_t)n);
    if (fd >= 0) close(fd);
}

static void lk_expect_live(const ec_cfg *c, const char *dir, const char *lock, const char *want,
                           const char *label)
{
    ck_job a;
    ec_result *ra;
    uint64_t gen = ck_gen_of(dir);
    memset(&a, 0, sizeof a);
    a.s1 = 1;
    a.save_dir = dir;
    ra = ck_run(c, &a);
    ZT_CHECKF(ra->rc == ZERO_ERROR_IO && strstr(ra->err, want), "%s: %s: %s", label,
              zero_result_string(ra->rc), ra->err);
    ec_result_free(ra);
    ZT_CHECKF(ck_gen_of(dir) == gen && ck_size(lock) >= 0, "%s: the live lock was taken", label);
}

ZT_TEST(the_save_lock_is_its_flock)
{
    ec_cfg c;
    char D[300], lock[400], host[256], txt[400], want[700];
    int fd, n, up[2], down[2];
    pid_t child;
    ck_cfg(&c, 2, 4, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(D, sizeof D, "%s/lock", ck_root);
    snprintf(lock, sizeof lock, "%s/zero.lock", D);
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    ZT_CHECK(ck_save(&c, D, 1) && ck_gen_of(D) == 1);
    /* live: flocked by this process (another open file), the pid not visible here */
    n = snprintf(txt, sizeof txt, "pid %d host %s\n", 999999999, host);
    lk_write(lock, txt, (size_t)n);
    fd = open(lock, O_RDONLY);
    ZT_CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
    snprintf(want, sizeof want, "another save is in progress in %s (pid 999999999, host %s", D, host);
    lk_expect_live(&c, D, lock, want, "invisible pid, this host");
    lk_write(lock, "", 0); /* live and empty: its holder has not written it yet */
    lk_expect_live(&c, D, lock, "another save is in progress", "empty, flocked");
    if (fd >= 0) close(fd);
    /* live: flocked by a child process; the file names a pid that does not exist */
    n = snprintf(txt, sizeof txt, "pid %d host %s\n", 2147483000, host);
    lk_write(lock, txt, (size_t)n);
    ZT_CHECK(pipe(up) == 0 && pipe(down) == 0);
    fflush(stdout);
    child = fork();
    if (child == 0) {
        char ch = 1;
        int cfd = open(lock, O_RDONLY);
        close(up[0]);
        close(down[1]);
        if (cfd < 0 || flock(cfd, LOCK_EX) != 0) ch = 0;
        if (write(up[1], &ch, 1) != 1) _exit(2);
        if (read(down[0], &ch, 1) < 0) _exit(3); /* until the parent closes its end */
        _exit(0);
    }
    ZT_CHECK(child > 0);
    close(up[1]);
    close(down[0]);
    if (child > 0) {
        char ch = 0;
        int st = 0;
        ZT_CHECK(read(up[0], &ch, 1) == 1 && ch == 1);
        lk_expect_live(&c, D, lock, "(pid 2147483000, host", "flocked by a child, bogus pid");
        close(down[1]);
        ZT_CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    close(up[0]);
    /* stale: the child is gone, its flock with it */
    ZT_CHECK(ck_save(&c, D, 1) && ck_gen_of(D) == 2 && ck_size(lock) < 0);
    /* stale: empty, nobody holds its flock */
    lk_write(lock, "", 0);
    ZT_CHECKF(ck_save(&c, D, 1) && ck_gen_of(D) == 3 && ck_size(lock) < 0, "empty lock: lock %ld",
              ck_size(lock));
    /* stale: unreadable text */
    lk_write(lock, "\x01\xff garbage", 10);
    ZT_CHECK(ck_save(&c, D, 1) && ck_gen_of(D) == 4 && ck_size(lock) < 0);
    /* no lock in the making is left behind */
    {
        DIR *d = opendir(D);
        struct dirent *de;
        int left = 0;
        while (d && (de = readdir(d)) != NULL)
            if (strncmp(de->d_name, "zero.lock", 9) == 0) left++;
        if (d) closedir(d);
        ZT_CHECK(left == 0);
    }
}

/* Fault injection for the save tests: fails writes to files whose path contains
   ck_fault_match with ck_fault_errno. */
static char ck_fault_match[64];
static int ck_fault_errno;
static int ck_fault_hook(const char *path, int op)
{
    if (op == 'w' && ck_fault_match[0] && strstr(path, ck_fault_match)) return ck_fault_errno;
    if (op == 'o' && ck_fault_match[0] == '@' && strstr(path, ck_fault_match + 1)) return ck_fault_errno;
    return 0;
}

/* A save that fails on one rank (a full disk) after other ranks renamed their shard files
   leaves no file of its generation on any rank, again and again; the previous checkpoint
   stays loadable, and a save succeeds once the space is back. Same for a failed manifest
   write. */
ZT_TEST(failed_save_cleans_up)
{
    ec_cfg c;
    char dir[300];
    uint64_t gens[16];
    int i, tmps = 0, n;
    static const char *const where[2] = {"-00001.shard.", "zero.manifest."};
    ck_cfg(&c, 1, 3, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/enospc", ck_root);
    ZT_CHECK(ck_save(&c, dir, 1));
    zero__ck_io_fault = ck_fault_hook;
    ck_fault_errno = ENOSPC;
    for (i = 0; i < 4; i++) {
        ck_job a;
        ec_result *ra;
        snprintf(ck_fault_match, sizeof ck_fault_match, "%s", where[i % 2]);
        memset(&a, 0, sizeof a);
        a.s1 = 2;
        a.save_dir = dir;
        a.client = (const unsigned char *)"client";
        a.client_n = 6;
        ra = ck_run(&c, &a);
        ZT_CHECKF(ra->rc == ZERO_ERROR_IO && strstr(ra->err, "No space left on device"),
                  "failure %d (%s): %s", i, where[i % 2], ra->err);
        ec_result_free(ra);
        n = ck_dir_gens(dir, gens, 16, &tmps);
        ZT_CHECKF(n == 1 && gens[0] == 1 && tmps == 0,
                  "after failed save %d (%s): %d generations (%llu, %llu), %d temporaries", i,
                  where[i % 2], n, (unsigned long long)gens[0],
                  (unsigned long long)(n > 1 ? gens[1] : 0), tmps);
    }
    ck_fault_match[0] = 0;
    zero__ck_io_fault = NULL;
    ck_client_load_ok(&c, dir, NULL, 0, CK_CLIENT_MAX, NULL, "the checkpoint before the failures");
    ZT_CHECK(ck_save(&c, dir, 2));
    n = ck_dir_gens(dir, gens, 16, &tmps);
    ZT_CHECKF(n == 1 && gens[0] == ck_gen_of(dir) && tmps == 0, "%d generations after the save", n);
}

/* The generation is an exact 64-bit integer: after files of generation 2^53 - 1 .. 2^53 + 2
   the next save takes exactly the next one (a double rounds 2^53 + 1 and 2^53 + 3); after
   2^64 - 1 it wraps to the lowest generation no file names. */
ZT_TEST(generation_is_exact_64_bit)
{
    ec_cfg c;
    char dir[300], orphan[400];
    const uint64_t two53 = (uint64_t)1 << 53;
    const uint64_t after[5] = {two53 - 1, two53, two53 + 1, two53 + 2, UINT64_MAX};
    int i;
    ck_cfg(&c, 2, 2, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/gen64", ck_root);
    ZT_CHECK(ck_save(&c, dir, 1) && ck_gen_of(dir) == 1);
    for (i = 0; i < 5; i++) {
        FILE *f;
        uint64_t want = after[i] == UINT64_MAX ? 1 : after[i] + 1, got;
        /* an orphan shard file of a failed save with that generation */
        snprintf(orphan, sizeof orphan, "%s/zero-%016llx-00007.shard", dir, (unsigned long long)after[i]);
        f = fopen(orphan, "w");
        if (f) fclose(f);
        if (after[i] == UINT64_MAX) want = ck_gen_of(dir) == 1 ? 2 : 1; /* the lowest unused */
        ZT_CHECK(ck_save(&c, dir, 2));
        got = ck_gen_of(dir);
        ZT_CHECKF(got == want, "after %llu: generation %llu, want %llu", (unsigned long long)after[i],
                  (unsigned long long)got, (unsigned long long)want);
        ZT_CHECKF(ck_size(orphan) < 0, "%s left behind", orphan);
        ck_client_load_ok(&c, dir, NULL, 0, CK_CLIENT_MAX, NULL, "after a large generation");
    }
}

/* A manifest whose tensor claims 2^63 + 16 elements: its byte size wraps to a small number
   (2^63 + 16 elements x 14 bytes = 224 mod 2^64) that a shard file with valid checksums
   matches; the reader must refuse it, and zero-ckpt info must not call it verified. */
ZT_TEST(byte_sizes_do_not_wrap)
{
    char dir[300], path[400], cmd[900];
    const uint64_t N = ((uint64_t)1 << 63) + 16, H = 64 + 32 * 4 + 4;
    uint64_t sec[4], off = H, total;
    uint32_t crc0 = zero_crc32c(0, NULL, 0);
    static unsigned char zeros[256];
    zero__ck_buf m, h;
    zero_checkpoint *ck = NULL;
    int k;
    FILE *f;
    snprintf(dir, sizeof dir, "%s/wrap", ck_root);
    mkdir(dir, 0755);
    for (k = 0; k < 4; k++) sec[k] = N * (k == 3 ? 2u : 4u); /* wrapped section sizes */
    total = H + N * 14u;
    ZT_CHECKF(total == H + 224, "%llu", (unsigned long long)total);
    memset(&h, 0, sizeof h);
    zero__ck_put(&h, "ZEROSHRD", 8);
    zero__ck_u32(&h, 1);
    zero__ck_u32(&h, (uint32_t)H);
    zero__ck_u64(&h, 1);
    zero__ck_u32(&h, 0);
    zero__ck_u32(&h, 1);
    zero__ck_u32(&h, 4);
    zero__ck_u32(&h, ZERO_F16);
    zero__ck_u64(&h, total);
    zero__ck_u64(&h, 0);
    zero__ck_u64(&h, 0);
    for (k = 0; k < 4; k++) {
        zero__ck_u32(&h, k == 3 ? 0u : (uint32_t)k + 1u);
        zero__ck_u32(&h, 0);
        zero__ck_u64(&h, off);
        zero__ck_u64(&h, sec[k]);
        zero__ck_u32(&h, zero_crc32c(0, zeros, (size_t)sec[k]));
        zero__ck_u32(&h, 0);
        off += sec[k];
    }
    zero__ck_u32(&h, zero_crc32c(0, h.p, h.n));
    (void)crc0;
    memset(&m, 0, sizeof m);
    zero__ck_put(&m, "ZEROMANI", 8);
    zero__ck_u32(&m, 2);
    zero__ck_u32(&m, 0);
    zero__ck_u64(&m, 0); /* size, patched */
    zero__ck_u64(&m, 1);
    zero__ck_u32(&m, 1);
    zero__ck_u32(&m, 0);
    zero__ck_u32(&m, ZERO_F16);
    zero__ck_u32(&m, 16);
    zero__ck_u32(&m, 1);
    zero__ck_u32(&m, 1);
    zero__ck_u64(&m, 0);
    zero__ck_u32(&m, ZERO_ADAMW);
    zero__ck_u32(&m, 0);
    zero__ck_f64(&m, 1e-3);
    zero__ck_f64(&m, 0.9);
    zero__ck_f64(&m, 0.999);
    zero__ck_f64(&m, 1e-8);
    zero__ck_f64(&m, 0.0);
    zero__ck_f32(&m, 65536.0f);
    zero__ck_f32(&m, 2.0f);
    zero__ck_f32(&m, 1.0f);
    zero__ck_u32(&m, 1000);
    zero__ck_u32(&m, 2);
    zero__ck_u32(&m, 2);
    zero__ck_u32(&m, 0);
    zero__ck_u32(&m, 1);
    zero__ck_u64(&m, 0);
    zero__ck_u64(&m, (uint64_t)-1);
    zero__ck_u32(&m, 0);
    zero__ck_u32(&m, 0);
    zero__ck_u64(&m, 0);
    zero__ck_u64(&m, 0);
    zero__ck_u64(&m, N);
    zero__ck_u64(&m, N);
    zero__ck_u64(&m, N);
    zero__ck_u32(&m, 1);
    zero__ck_put(&m, "w", 1);
    zero__ck_u32(&m, 0);
    zero__ck_u32(&m, 0);
    zero__ck_u64(&m, 0);
    zero__ck_u64(&m, N);
    zero__ck_u32(&m, 0);
    zero__ck_u64(&m, total);
    zero__ck_u32(&m, zero_crc32c(0, h.p, h.n - 4));
    zero__ck_u32(&m, 0);
    zero__ck_u64(&m, 0);
    zero__ck_u32(&m, 0);
    zero__ck_u32(&m, 0);
    for (k = 0; k < 8; k++) m.p[16 + k] = (unsigned char)((uint64_t)(m.n + 4) >> (8 * k));
    zero__ck_u32(&m, zero_crc32c(0, m.p, m.n));
    snprintf(path, sizeof path, "%s/zero.manifest", dir);
    f = fopen(path, "wb");
    if (f) {
        fwrite(m.p, 1, m.n, f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/zero-0000000000000001-00000.shard", dir);
    f = fopen(path, "wb");
    if (f) {
        fwrite(h.p, 1, h.n, f);
        fwrite(zeros, 1, 224, f);
        fclose(f);
    }
    free(m.p);
    free(h.p);
    ZT_CHECK(ck_size(path) == (long)total);
    {
        zero_result r = zero_checkpoint_open(dir, &ck);
        if (r == ZERO_OK) r = zero_checkpoint_verify(ck);
        ZT_CHECKF(r == ZERO_ERROR_IO && strstr(zero_last_error(), "overflow"), "%s: %s",
                  zero_result_string(r), zero_last_error());
        zero_checkpoint_close(ck);
    }
    if (access("build/zero-ckpt", X_OK) == 0) {
        int rc;
        snprintf(cmd, sizeof cmd, "build/zero-ckpt info %s > %s/wrap.txt 2>&1", dir, ck_root);
        rc = system(cmd);
        ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "zero-ckpt info of the wrapping manifest: %d", rc);
        snprintf(path, sizeof path, "%s/wrap.txt", ck_root);
        f = fopen(path, "r");
        if (f) {
            char txt[4096];
            size_t n = fread(txt, 1, sizeof txt - 1, f);
            txt[n] = 0;
            fclose(f);
            ZT_CHECKF(!strstr(txt, "verified") && strstr(txt, "overflow"), "%s", txt);
        }
    }
}

/* zero_engine_load compares the shapes both sides recorded (same element count). */
ZT_TEST(load_compares_shapes)
{
    ec_cfg c;
    ck_job b;
    char dir[300];
    ck_cfg(&c, 1, 2, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/shapes", ck_root);
    ZT_CHECK(ck_save(&c, dir, 2));
    ck_fail_job(&b, dir);
    b.reshape_tensor = 1;
    ck_expect_fail_job(&c, &b, ZERO_ERROR_MISMATCH, "tensor 't0' has shape [1, 37] in the "
                       "checkpoint, [37, 1] in the engine", "transposed shape");
}

/* Runs fn in a child process that a hang cannot stall: SIGALRM after 60 s is a failure. */
static void ck_no_hang(void (*fn)(void), const char *label)
{
    pid_t pid;
    int st = 0;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        alarm(60);
        fn();
        fflush(stdout);
        _exit(zt_cur_failures ? 1 : 0);
    }
    ZT_CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    ZT_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: %s", label,
              WIFSIGNALED(st) ? "hung (killed by the alarm)" : "checks failed");
}

static void ck_fifo_checks(void)
{
    ec_cfg c;
    char dir[300], man[400], shard[400], bak[400], cmd[900];
    zero_checkpoint *ck = NULL;
    ck_cfg(&c, 3, 2, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/fifo", ck_root);
    ZT_CHECK(ck_save(&c, dir, 2));
    snprintf(man, sizeof man, "%s/zero.manifest", dir);
    snprintf(bak, sizeof bak, "%s/fifo-manifest", ck_root);
    snprintf(shard, sizeof shard, "%s/zero-0000000000000001-00001.shard", dir);
    /* a FIFO shard file: load (resharding and not) and verify refuse it */
    ck_copy(shard, bak);
    ZT_CHECK(unlink(shard) == 0 && mkfifo(shard, 0644) == 0);
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "-00001.shard: shard file of rank 1 is not a regular file (a FIFO)",
                   0, 0, 0, "FIFO shard");
    {
        ec_cfg c2 = c;
        c2.world = 3;
        ck_expect_fail(&c2, dir, ZERO_ERROR_IO, "is not a regular file", 0, 0, 0, "FIFO shard, resharding");
    }
    ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
    ZT_CHECK(ck && zero_checkpoint_verify(ck) == ZERO_ERROR_IO && strstr(zero_last_error(), "a FIFO"));
    zero_checkpoint_close(ck);
    ck = NULL;
    if (access("build/zero-ckpt", X_OK) == 0) {
        int rc;
        snprintf(cmd, sizeof cmd, "build/zero-ckpt info %s >/dev/null 2>&1", dir);
        rc = system(cmd);
        ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "zero-ckpt info, FIFO shard: %d", rc);
    }
    ZT_CHECK(unlink(shard) == 0);
    ck_copy(bak, shard);
    /* a FIFO manifest: open, load, save and info refuse it */
    ZT_CHECK(unlink(man) == 0 && mkfifo(man, 0644) == 0);
    ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_ERROR_IO && strstr(zero_last_error(), "manifest is not a regular file"));
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "manifest is not a regular file", 0, 0, 0, "FIFO manifest");
    {
        ck_job a;
        ec_result *ra;
        memset(&a, 0, sizeof a);
        a.s1 = 1;
        a.save_dir = dir;
        ra = ck_run(&c, &a);
        ZT_CHECKF(ra->rc == ZERO_ERROR_IO && strstr(ra->err, "not a regular file"), "save: %s", ra->err);
        ec_result_free(ra);
    }
    if (access("build/zero-ckpt", X_OK) == 0) {
        int rc;
        snprintf(cmd, sizeof cmd, "build/zero-ckpt info %s >/dev/null 2>&1", dir);
        rc = system(cmd);
        ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "zero-ckpt info, FIFO manifest: %d", rc);
    }
}

/* FIFOs named like a manifest or a shard file: info, load and save refuse them with a clear
   message instead of hanging. */
ZT_TEST(special_files_refused)
{
    ck_no_hang(ck_fifo_checks, "FIFO manifest and shard");
}

/* A 1 GiB (sparse) manifest is rejected after reading its header: with a header that
   declares its size, and with none; every rank of a load alike. */
ZT_TEST(manifest_read_is_bounded)
{
    char dir[300], man[400];
    unsigned char hdr[184];
    uint64_t before, size = (uint64_t)1 << 30;
    zero_checkpoint *ck = NULL;
    ec_cfg c;
    int fd, k, pass;
    snprintf(dir, sizeof dir, "%s/hugeman", ck_root);
    mkdir(dir, 0755);
    snprintf(man, sizeof man, "%s/zero.manifest", dir);
    for (pass = 0; pass < 2; pass++) {
        memset(hdr, 0, sizeof hdr);
        if (pass == 0) { /* a plausible header: 1 group, 1 tensor, 1 rank, 1 GiB declared */
            memcpy(hdr, "ZEROMANI", 8);
            hdr[8] = 2;
            for (k = 0; k < 8; k++) hdr[16 + k] = (unsigned char)(size >> (8 * k));
            hdr[24] = 1;
            hdr[32] = 1;
            hdr[40] = ZERO_F16;
            hdr[44] = 16;
            hdr[48] = 1;
            hdr[52] = 1;
        }
        fd = open(man, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ZT_CHECK(fd >= 0 && write(fd, hdr, sizeof hdr) == (ssize_t)sizeof hdr &&
                 ftruncate(fd, (off_t)size) == 0);
        if (fd >= 0) close(fd);
        before = zero__ck_bytes_read;
        ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_ERROR_IO && !ck);
        ZT_CHECKF(strstr(zero_last_error(), pass == 0 ? "more than its 1 groups" : "bad magic"),
                  "%s", zero_last_error());
        ZT_CHECKF(zero__ck_bytes_read - before < 4096, "pass %d: %llu bytes read", pass,
                  (unsigned long long)(zero__ck_bytes_read - before));
    }
    ck_cfg(&c, 1, 4, ZERO_F16, 2);
    c.nfault = 0;
    before = zero__ck_bytes_read;
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "bad magic", 0, 0, 0, "1 GiB manifest, 4 ranks");
    ZT_CHECKF(zero__ck_bytes_read - before < 4 * 4096, "load: %llu bytes read",
              (unsigned long long)(zero__ck_bytes_read - before));
    unlink(man);
}

/* Temporaries are new files with unique names: symlinks planted at the names a save or an
   export used to write (NAME.tmp) are never followed, their targets untouched. zero-ckpt
   export refuses to write into a checkpoint directory and over an existing file unless
   --force. */
ZT_TEST(temporaries_never_follow_links)
{
    ec_cfg c;
    char dir[300], victim[400], link[500], out[400], cmd[1200];
    static const char *const names[4] = {"zero-0000000000000001-00000.shard.tmp",
                                         "zero-0000000000000001-00001.shard.tmp",
                                         "zero-0000000000000001.client.tmp", "zero.manifest.tmp"};
    zero_checkpoint *ck = NULL;
    FILE *f;
    int i;
    ck_cfg(&c, 2, 2, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/links", ck_root);
    snprintf(victim, sizeof victim, "%s/victim", ck_root);
    f = fopen(victim, "w");
    if (f) {
        fputs("precious", f);
        fclose(f);
    }
    mkdir(dir, 0755);
    for (i = 0; i < 4; i++) {
        snprintf(link, sizeof link, "%s/%s", dir, names[i]);
        ZT_CHECK(symlink(victim, link) == 0);
    }
    {
        ck_job a;
        ec_result *ra;
        memset(&a, 0, sizeof a);
        a.s1 = 2;
        a.save_dir = dir;
        a.client = (const unsigned char *)"state";
        a.client_n = 5;
        ra = ck_run(&c, &a);
        ZT_CHECKF(ra->rc == ZERO_OK, "%s", ra->err);
        ec_result_free(ra);
    }
    ZT_CHECKF(ck_size(victim) == 8, "the save wrote through a planted link: victim %ld bytes", ck_size(victim));
    ck_client_load_ok(&c, dir, (const unsigned char *)"state", 5, CK_CLIENT_MAX, NULL, "after planted links");
    /* export: OUT.tmp planted */
    snprintf(out, sizeof out, "%s/links.safetensors", ck_root);
    snprintf(link, sizeof link, "%s.tmp", out);
    ZT_CHECK(symlink(victim, link) == 0);
    ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
    ZT_CHECKF(ck && zero_checkpoint_export(ck, out, ZERO_F32) == ZERO_OK, "%s", zero_last_error());
    ZT_CHECKF(ck_size(victim) == 8, "the export wrote through a planted link: victim %ld bytes", ck_size(victim));
    ZT_CHECK(ck_size(out) > 8);
    /* the library refuses a path inside a checkpoint directory */
    snprintf(link, sizeof link, "%s/zero.manifest", dir);
    ZT_CHECK(ck && zero_checkpoint_export(ck, link, ZERO_F32) == ZERO_ERROR_INVALID_ARGUMENT &&
             strstr(zero_last_error(), "inside a checkpoint directory"));
    zero_checkpoint_close(ck);
    ck = NULL;
    if (access("build/zero-ckpt", X_OK) == 0) {
        int rc;
        long was = ck_size(out);
        snprintf(cmd, sizeof cmd, "build/zero-ckpt export %s %s/zero.manifest >/dev/null 2>&1", dir, dir);
        rc = system(cmd);
        ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) != 0, "export into the checkpoint: %d", rc);
        ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK && zero_checkpoint_verify(ck) == ZERO_OK);
        zero_checkpoint_close(ck);
        f = fopen(out, "w"); /* an existing file of the user's */
        if (f) {
            fputs("mine", f);
            fclose(f);
        }
        snprintf(cmd, sizeof cmd, "build/zero-ckpt export %s %s >/dev/null 2>&1", dir, out);
        rc = system(cmd);
        ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && ck_size(out) == 4, "over an existing file: %d", rc);
        snprintf(cmd, sizeof cmd, "build/zero-ckpt export %s %s --force >/dev/null 2>&1", dir, out);
        rc = system(cmd);
        ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && ck_size(out) == was, "--force: %d", rc);
    }
}

/* Error messages: a missing checkpoint is said once, plainly; a shard file that cannot be
   opened for lack of permission says so (not "missing"). */
ZT_TEST(messages_name_the_cause)
{
    ec_cfg c;
    ck_job b;
    char dir[300], empty[300];
    const char *p, *msg;
    int count = 0, rk;
    ck_cfg(&c, 1, 2, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(empty, sizeof empty, "%s/empty", ck_root);
    mkdir(empty, 0755);
    ck_fail_job(&b, empty);
    ck_expect_fail_job(&c, &b, ZERO_ERROR_NOT_FOUND, "zero.manifest", "no manifest");
    for (rk = 0; rk < 2; rk++) {
        msg = b.load_msg[rk];
        for (count = 0, p = msg; (p = strstr(p, "no checkpoint")) != NULL; p++) count++;
        ZT_CHECKF(count == 1 && strstr(msg, "does not exist"), "rank %d: %s", rk, msg);
    }
    snprintf(dir, sizeof dir, "%s/eacces", ck_root);
    ZT_CHECK(ck_save(&c, dir, 2));
    zero__ck_io_fault = ck_fault_hook;
    ck_fault_errno = EACCES;
    snprintf(ck_fault_match, sizeof ck_fault_match, "@-00001.shard");
    ck_expect_fail(&c, dir, ZERO_ERROR_IO, "-00001.shard: shard file of rank 1: permission denied",
                   0, 0, 0, "EACCES");
    ck_fault_match[0] = 0;
    zero__ck_io_fault = NULL;
}

/* ---- crash safety ------------------------------------------------------------------------------ */

#define KILL_T 6
static const size_t kill_sizes[KILL_T] = {40000, 3, 25001, 777, 60000, 17};
static const int kill_groups[KILL_T] = {0, 0, 1, 1, 2, 2};

static float kill_value(int i, int t, size_t j) { return (float)i + 0.001f * (float)t + 1e-7f * (float)(j % 1000); }

typedef struct kill_ctx {
    int start;    /* first generation value the child writes */
    int report;   /* pipe fd: the child writes each value whose save returned */
    const char *dir;
    int loaded;   /* parent: the value found */
    int ok;
} kill_ctx;

static void kill_cfg(ec_cfg *c, int world)
{
    int t;
    ec_cfg_init(c, 3, world, ZERO_F16, 1, 0);
    c->ntensors = KILL_T;
    for (t = 0; t < KILL_T; t++) {
        c->sizes[t] = kill_sizes[t];
        c->groups[t] = kill_groups[t];
        c->flags[t] = 0;
    }
}

static zero_result kill_engine(int rank, zero_comm *comm, int world, zero_device **dev, zero_engine **e, int *ids)
{
    ec_cfg c;
    zero_engine_desc d;
    zero_result r;
    (void)rank;
    kill_cfg(&c, world);
    ec_engine_desc(&c, &d);
    if ((r = zero_host_device_create(NULL, dev)) != ZERO_OK) return r;
    d.device = *dev;
    d.comm = comm;
    if ((r = zero_engine_create(&d, e)) != ZERO_OK) return r;
    if ((r = ec_add_tensors(*e, &c, ids)) != ZERO_OK) return r;
    return zero_engine_commit(*e);
}

static zero_result kill_child_fn(int rank, zero_comm *comm, void *user)
{
    kill_ctx *k = (kill_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    int ids[KILL_T], i, t;
    float *v = (float *)malloc(60000 * sizeof(float));
    zero_result r = kill_engine(rank, comm, 2, &dev, &e, ids);
    for (i = k->start; r == ZERO_OK; i++) {
        for (t = 0; t < KILL_T && r == ZERO_OK; t++) {
            size_t j;
            for (j = 0; j < kill_sizes[t]; j++) v[j] = kill_value(i, t, j);
            r = zero_engine_set_tensor(e, ids[t], v);
        }
        if (r == ZERO_OK) r = zero_engine_save(e, k->dir);
        if (r == ZERO_OK && rank == 0 && write(k->report, &i, sizeof i) != (ssize_t)sizeof i) r = ZERO_ERROR_IO;
    }
    return r;
}

/* Parent: load into N=1 engines (a reshard too) and check every element comes from one save. */
static zero_result kill_load_fn(int rank, zero_comm *comm, void *user)
{
    kill_ctx *k = (kill_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    int ids[KILL_T], t;
    float *v = (float *)malloc(60000 * sizeof(float));
    zero_result r = kill_engine(rank, comm, 1, &dev, &e, ids);
    k->ok = 0;
    if (r == ZERO_OK) r = zero_engine_load(e, k->dir);
    if (r == ZERO_OK) {
        zero_range rg;
        int i;
        r = zero_engine_read_tensor(e, ids[0], ZERO_STATE_MASTER, v, &rg);
        i = (int)v[0];
        k->loaded = i;
        k->ok = 1;
        for (t = 0; t < KILL_T && r == ZERO_OK; t++) {
            size_t j;
            r = zero_engine_read_tensor(e, ids[t], ZERO_STATE_MASTER, v, &rg);
            for (j = 0; j < kill_sizes[t]; j++)
                if (v[j] != kill_value(i, t, j)) k->ok = 0;
        }
    }
    free(v);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(kill_during_save)
{
    const char *env = getenv("ZERO_CKPT_KILLS");
    int kills = env ? atoi(env) : (zt_quick() ? 6 : 15), n, bad = 0, never = 0, good = 0;
    int last = 0; /* the value of the checkpoint on disk (0 = none yet) */
    char dir[300];
    unsigned seed = 12345;
    snprintf(dir, sizeof dir, "%s/kill", ck_root);
    for (n = 0; n < kills; n++) {
        int fds[2], got[4096], ngot = 0, st;
        kill_ctx k;
        pid_t pid;
        ssize_t rd;
        struct timespec ts;
        memset(&k, 0, sizeof k);
        if (pipe(fds) != 0) break;
        k.start = last + 1;
        k.report = fds[1];
        k.dir = dir;
        pid = fork();
        if (pid == 0) {
            close(fds[0]);
            zero_local_run(2, kill_child_fn, &k);
            _exit(3);
        }
        close(fds[1]);
        /* every other child first completes one save, so that kills also land in later
           saves however slow this build is (sanitizers) */
        if (n % 2 == 0 && read(fds[0], &got[ngot], sizeof(int)) == (ssize_t)sizeof(int)) ngot++;
        seed = seed * 1103515245u + 12345u;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)((seed >> 8) % 40000u) * 1000L; /* 0..40 ms */
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        while ((rd = read(fds[0], &got[ngot], sizeof(int))) == (ssize_t)sizeof(int) && ngot < 4095) ngot++;
        close(fds[0]);
        if (zero_local_run(1, kill_load_fn, &k) != ZERO_OK) {
            /* only acceptable before any checkpoint ever completed */
            if (last != 0 || ngot > 0) {
                bad++;
                fprintf(stderr, "  kill %d: load failed after a completed save: %s\n", n, zero_last_error());
            } else {
                never++;
            }
            continue;
        }
        if (!k.ok) {
            bad++;
            fprintf(stderr, "  kill %d: checkpoint %d mixes saves\n", n, k.loaded);
        } else {
            int lo = ngot ? got[ngot - 1] : last, hi = ngot ? got[ngot - 1] + 1 : last + 1;
            if (k.loaded < lo || k.loaded > hi) {
                bad++;
                fprintf(stderr, "  kill %d: loaded %d, expected %d or %d\n", n, k.loaded, lo, hi);
            } else {
                good++;
            }
            last = k.loaded;
        }
    }
    printf("  kill test: %d kills, %d loads consistent, %d before any save, %d bad; last value %d\n",
           kills, good, never, bad, last);
    ZT_CHECK(bad == 0);
    ZT_CHECK(good > 0);
}

/* ---- safetensors ------------------------------------------------------------------------------- */

static void ck_write_raw(const char *path, const char *hdr, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    uint64_t hl = strlen(hdr);
    unsigned char lb[8];
    int i;
    for (i = 0; i < 8; i++) lb[i] = (unsigned char)(hl >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

ZT_TEST(safetensors_round_trip)
{
    ec_cfg c;
    ck_job a;
    ec_result *ra;
    char dir[300], out[400];
    const zero_dtype dts[3] = {ZERO_F32, ZERO_F16, ZERO_BF16};
    int k;
    const char *pyout = getenv("ZERO_ST_EXPORT_DIR"); /* the Python check reads these */
    unsigned char client[123];
    ck_cfg(&c, 3, 2, ZERO_BF16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/st", pyout ? pyout : ck_root);
    ck_client_bytes(client, sizeof client, 5);
    memset(&a, 0, sizeof a);
    a.s1 = 2;
    a.save_dir = dir;
    a.client = client; /* read back by tests/read_checkpoint.py */
    a.client_n = sizeof client;
    ra = ck_run(&c, &a);
    ZT_CHECKF(ra->rc == ZERO_OK, "%s", ra->err);
    for (k = 0; k < 3; k++) {
        zero_checkpoint *ck = NULL;
        ck_job b;
        ec_result *rb;
        int t;
        snprintf(out, sizeof out, "%s/model-%s.safetensors", pyout ? pyout : ck_root,
                 zero_dtype_name(dts[k]));
        ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
        ZT_CHECKF(zero_checkpoint_export(ck, out, dts[k]) == ZERO_OK, "%s", zero_last_error());
        zero_checkpoint_close(ck);
        /* import into fresh engines at another N and stage: master = the exported values */
        c.world = 3;
        c.stage = 1;
        memset(&b, 0, sizeof b);
        b.st_in = out;
        rb = ck_run(&c, &b);
        ZT_CHECKF(rb->rc == ZERO_OK, "%s", rb->err);
        for (t = 0; t < c.ntensors && rb->rc == ZERO_OK && ra->rc == ZERO_OK; t++) {
            size_t i;
            int bad = 0;
            for (i = 0; i < c.sizes[t]; i++) {
                float want = ra->master[t][i];
                if (dts[k] == ZERO_F16) want = zero_f16_to_f32(zero_f32_to_f16(want));
                if (dts[k] == ZERO_BF16) want = ec_to_f32(ra->param[t], ZERO_BF16, i); /* the params */
                if (memcmp(&want, &rb->master[t][i], 4) != 0) bad++;
                if (rb->m[t][i] != 0.0f) bad++;
            }
            ZT_CHECKF(bad == 0, "%s tensor %d: %d elements differ", zero_dtype_name(dts[k]), t, bad);
        }
        ec_result_free(rb);
        c.world = 2;
        c.stage = 3;
    }
    if (pyout && ra->rc == ZERO_OK) { /* names, shapes and the fp32 masters, for Python */
        FILE *js, *bin;
        size_t off = 0;
        int t;
        snprintf(out, sizeof out, "%s/expect.json", pyout);
        js = fopen(out, "w");
        snprintf(out, sizeof out, "%s/expect-f32.bin", pyout);
        bin = fopen(out, "wb");
        ZT_CHECK(js && bin);
        if (js && bin) {
            fprintf(js, "[");
            for (t = 0; t < c.ntensors; t++) {
                if (t == 0) fprintf(js, "{\"name\": \"t0\", \"shape\": [1, %zu], \"offset\": 0}", c.sizes[0]);
                else fprintf(js, ", {\"name\": \"t%d\", \"shape\": [%zu], \"offset\": %zu}", t, c.sizes[t], off);
                fwrite(ra->master[t], 4, c.sizes[t], bin);
                off += c.sizes[t] * 4;
            }
            fprintf(js, "]\n");
        }
        if (js) fclose(js);
        if (bin) fclose(bin);
        snprintf(out, sizeof out, "%s/expect-client.bin", pyout);
        bin = fopen(out, "wb");
        ZT_CHECK(bin && fwrite(client, 1, sizeof client, bin) == sizeof client);
        if (bin) fclose(bin);
    }
    ec_result_free(ra);
}

/* build/zero-ckpt: usage errors exit 2, a good checkpoint verifies (0), a bad one exits 1
   naming the file, export writes what the importer reads back. */
ZT_TEST(tool_zero_ckpt)
{
    ec_cfg c;
    ck_job a;
    ec_result *ra;
    char dir[300], cmd[900], out[400];
    int rc;
    FILE *f;
    if (access("build/zero-ckpt", X_OK) != 0) ZT_SKIP("build/zero-ckpt not built (make build/zero-ckpt)");
    ck_cfg(&c, 1, 2, ZERO_F16, 2);
    c.nfault = 0;
    snprintf(dir, sizeof dir, "%s/tool", ck_root);
    memset(&a, 0, sizeof a);
    a.s1 = 2;
    a.save_dir = dir;
    ra = ck_run(&c, &a);
    ZT_CHECKF(ra->rc == ZERO_OK, "%s", ra->err);
    ec_result_free(ra);
    rc = system("build/zero-ckpt >/dev/null 2>&1");
    ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "no args: %d", rc);
    snprintf(cmd, sizeof cmd, "build/zero-ckpt export %s x.safetensors --dtype f8 >/dev/null 2>&1", dir);
    rc = system(cmd);
    ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "bad dtype: %d", rc);
    snprintf(cmd, sizeof cmd, "build/zero-ckpt info %s > %s/info.txt 2>&1", dir, ck_root);
    rc = system(cmd);
    ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "info: %d", rc);
    snprintf(out, sizeof out, "%s/info.txt", ck_root);
    f = fopen(out, "r");
    if (f) {
        char txt[8192];
        size_t n = fread(txt, 1, sizeof txt - 1, f);
        txt[n] = 0;
        fclose(f);
        ZT_CHECKF(strstr(txt, "step 2, world 2, stage 1, params f16") && strstr(txt, "tensor t0") &&
                  strstr(txt, "shape [1, 37]") && strstr(txt, "verified") &&
                  strstr(txt, "-00001.shard  "), "%s", txt);
    }
    snprintf(cmd, sizeof cmd, "build/zero-ckpt export %s %s/tool.safetensors --dtype bf16 >/dev/null", dir, ck_root);
    rc = system(cmd);
    ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "export: %d", rc);
    {
        ck_job b;
        ec_result *rb;
        snprintf(out, sizeof out, "%s/tool.safetensors", ck_root);
        memset(&b, 0, sizeof b);
        b.st_in = out;
        rb = ck_run(&c, &b);
        ZT_CHECKF(rb->rc == ZERO_OK, "import of the tool's export: %s", rb->err);
        ec_result_free(rb);
    }
    {
        char name[64], path[400];
        zero__ck_shard_name(name, sizeof name, 1, 1);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        ck_flip(path, ck_size(path) - 1);
        snprintf(cmd, sizeof cmd, "build/zero-ckpt info %s > %s/info.txt 2>&1", dir, ck_root);
        rc = system(cmd);
        ZT_CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "corrupt info: %d", rc);
        snprintf(out, sizeof out, "%s/info.txt", ck_root);
        f = fopen(out, "r");
        if (f) {
            char txt[8192];
            size_t n = fread(txt, 1, sizeof txt - 1, f);
            txt[n] = 0;
            fclose(f);
            ZT_CHECKF(strstr(txt, "-00001.shard: checksum mismatch"), "%s", txt);
        }
    }
}

ZT_TEST(safetensors_errors)
{
    ec_cfg c;
    char path[400];
    static const struct { const char *hdr; size_t data; zero_result want; const char *needle; } cases[] = {
        {"{\"t0\":{\"dtype\":\"F32\",\"shape\":[1,37],\"data_offsets\":[0,148]}}", 148,
         ZERO_ERROR_NOT_FOUND, "no tensor named 't1'"},
        {"{\"t0\":{\"dtype\":\"F32\",\"shape\":[1,36],\"data_offsets\":[0,144]}}", 144,
         ZERO_ERROR_MISMATCH, "tensor 't0' has 36 elements"},
        {"{\"t0\":{\"dtype\":\"F32\",\"shape\":[1,37],\"data_offsets\":[0,148]}", 148,
         ZERO_ERROR_IO, "malformed safetensors header"},
        {"{\"t0\":{\"dtype\":\"F32\",\"shape\":[1,37],\"data_offsets\":[0,140]}}", 140,
         ZERO_ERROR_IO, "do not hold its shape"},
        {"{\"t0\":{\"dtype\":\"F32\",\"shape\":[1,37],\"data_offsets\":[0,148]}}", 100,
         ZERO_ERROR_IO, "the file holds 100"},
        {"{\"t0\":{\"dtype\":\"Q4\",\"shape\":[1,37],\"data_offsets\":[0,148]}}", 148,
         ZERO_ERROR_IO, "unknown dtype"},
        {"{\"t0\":{\"dtype\":\"I32\",\"shape\":[1,37],\"data_offsets\":[0,148]}}", 148,
         ZERO_ERROR_UNSUPPORTED, "tensor 't0' is I32"},
        {"{\"t0\":{\"dtype\":\"F32\",\"shape\":[37],\"data_offsets\":[0,148]}}", 148,
         ZERO_ERROR_MISMATCH, "tensor 't0' has another shape"},
        {"{\"t0\":{\"dtype\":\"F32\",\"shape\":[37,1],\"data_offsets\":[0,148]},\"t1\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[148,168]}}", 168,
         ZERO_ERROR_MISMATCH, "tensor 't0' has another shape"},
    };
    static unsigned char zeros[4096];
    size_t i;
    ck_cfg(&c, 2, 2, ZERO_F16, 1);
    c.steps = 0;
    ck_path(path, sizeof path, "bad.safetensors");
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_job b;
        ec_result *rb;
        ck_write_raw(path, cases[i].hdr, zeros, cases[i].data);
        memset(&b, 0, sizeof b);
        b.st_in = path;
        rb = ck_run(&c, &b);
        ZT_CHECKF(rb->rc == cases[i].want, "case %zu: %s (%s)", i, zero_result_string(rb->rc), rb->err);
        ZT_CHECKF(strstr(rb->err, cases[i].needle) != NULL, "case %zu: %s", i, rb->err);
        ec_result_free(rb);
    }
}

/* ---- the shard file's O_DIRECT writer ------------------------------------------------------- */

/* A save writes its shard file with O_DIRECT where the file system takes it (the blocks
   where sections meet staged apart) and with buffered pwrites where O_DIRECT is refused:
   the files are byte for byte the same, the reader verifies every checksum, and a load of
   either gives the saving engine's state bit for bit. Sizes:
   sections longer than one 4 MiB chunk (the partial block carried between chunks), shorter
   than one block (several sections in one block), frozen params, fp16 / bf16 / fp32. */
#define DW_T 6
static const size_t dw_sizes[DW_T] = {1100003, 5, 1021, 70001, 3, 1300};
static const int dw_groups[DW_T] = {0, 0, 1, 2, 3, 3};
typedef struct dw_job {
    int stage;
    zero_dtype dt;
    const char *dirs[3];
    int ndirs;
} dw_job;
static int dw_mode; /* 0: default, 1: zero__ck_direct_off, 2: O_DIRECT refused (the hook) */
static int dw_refuse_direct(const char *path, int op)
{
    (void)path;
    return op == 'd' ? EINVAL : 0;
}

static zero_result dw_rank(int rank, zero_comm *comm, void *user)
{
    dw_job *J = (dw_job *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    float *v = NULL;
    int t, g, k, i;
    memset(&d, 0, sizeof d);
    d.stage = J->stage;
    d.param_dtype = J->dt;
    d.comm = comm;
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    d.device = dev;
    r = zero_engine_create(&d, &e);
    for (t = 0; t < DW_T && r == ZERO_OK; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        r = zero_engine_add_tensor(e, name, dw_sizes[t], dw_groups[t], t == 4 ? ZERO_TENSOR_FROZEN : 0, NULL);
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    if (r == ZERO_OK) { /* room for the largest tensor and the largest shard */
        size_t most = dw_sizes[0];
        for (g = 0; g < e->layout.ngroups; g++)
            if (e->layout.groups[g].shard_numel > most) most = e->layout.groups[g].shard_numel;
        if (!(v = (float *)malloc(most * sizeof *v))) r = ZERO_ERROR_OUT_OF_MEMORY;
    }
    for (t = 0; t < DW_T && r == ZERO_OK; t++) {
        size_t j;
        for (j = 0; j < dw_sizes[t]; j++) v[j] = (float)t + 1e-3f * (float)(j % 977) - 0.25f;
        r = zero_engine_set_tensor(e, t, v);
    }
    /* m and v of every tensor's part of this rank's shard: values of their own (set_tensor
       leaves them 0); the padding between tensors stays 0 (a load never writes it) */
    for (g = 0; g < e->layout.ngroups && r == ZERO_OK; g++) {
        size_t n = e->layout.groups[g].shard_numel, j;
        for (k = 1; k <= 2 && r == ZERO_OK; k++) {
            memset(v, 0, n * sizeof *v);
            for (t = 0; t < DW_T; t++) {
                zero_tensor_info ti;
                zero_range sn;
                uint64_t pos;
                memset(&ti, 0, sizeof ti);
                memset(&sn, 0, sizeof sn);
                if (zero_plan_tensor(e->layout.plan, t, &ti) != ZERO_OK || ti.group != g ||
                    zero_plan_intersect(e->layout.plan, t, rank, &sn) != ZERO_OK || sn.numel == 0)
                    continue;
                pos = zero__plan_shard_pos(e->layout.plan, t, rank, sn.offset);
                for (j = 0; j < sn.numel && pos + j < n; j++)
                    v[pos + j] = (float)(k * 1000 + rank * 100 + g) + 1e-4f * (float)(j % 4099);
            }
            r = zero__ck_state_io(e, k == 1 ? ZERO_STATE_M : ZERO_STATE_V, g, 0, n, v, 1);
            if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
        }
    }
    for (i = 0; i < J->ndirs && r == ZERO_OK; i++) {
        if (rank == 0) { /* set before every rank's save (the agreement inside orders them) */
            zero__ck_direct_off = i == 1;
            zero__ck_io_fault = i == 2 ? dw_refuse_direct : NULL;
        }
        r = comm->ops->barrier(comm);
        if (r == ZERO_OK) r = zero_engine_save(e, J->dirs[i]);
        if (r == ZERO_OK) r = comm->ops->barrier(comm);
        if (r == ZERO_OK && rank == 0) dw_mode |= __atomic_load_n(&zero__ck_direct_used, __ATOMIC_RELAXED) << i;
    }
    /* loads of the O_DIRECT save and of the refused one: the state is the saving engine's,
       bit for bit */
    for (i = 0; i < 3 && r == ZERO_OK; i += 2) {
        zero_engine *e2 = NULL;
        r = zero_engine_create(&d, &e2);
        for (t = 0; t < DW_T && r == ZERO_OK; t++) {
            char name[16];
            snprintf(name, sizeof name, "w%d", t);
            r = zero_engine_add_tensor(e2, name, dw_sizes[t], dw_groups[t], t == 4 ? ZERO_TENSOR_FROZEN : 0, NULL);
        }
        if (r == ZERO_OK) r = zero_engine_commit(e2);
        if (r == ZERO_OK) r = zero_engine_load(e2, J->dirs[i]);
        for (g = 0; g < e->layout.ngroups && r == ZERO_OK; g++) {
            for (k = 0; k < 4 && r == ZERO_OK; k++) {
                zero_state_kind kind = k == 0 ? ZERO_STATE_MASTER : k == 1 ? ZERO_STATE_M : k == 2 ? ZERO_STATE_V : ZERO_STATE_PARAM;
                size_t m = k < 3 ? e->layout.groups[g].shard_numel : e->layout.groups[g].pshard_numel;
                size_t esz = k < 3 ? 4 : zero_dtype_size(J->dt);
                unsigned char *a = (unsigned char *)malloc(m * esz + 1), *b = (unsigned char *)malloc(m * esz + 1);
                if (!a || !b) r = ZERO_ERROR_OUT_OF_MEMORY;
                if (r == ZERO_OK) r = zero__ck_state_io(e, kind, g, 0, m, a, 0);
                if (r == ZERO_OK) r = zero__ck_state_io(e2, kind, g, 0, m, b, 0);
                if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
                if (r == ZERO_OK && memcmp(a, b, m * esz) != 0)
                    r = zero__fail(ZERO_ERROR_MISMATCH, "rank %d: load of %s: group %d kind %d differs", rank,
                                   J->dirs[i], g, k);
                free(a);
                free(b);
            }
        }
        zero_engine_destroy(e2);
    }
    if (rank == 0) {
        zero__ck_direct_off = 0;
        zero__ck_io_fault = NULL;
    }
    free(v);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* 1 when the two files hold the same bytes. */
static int dw_same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb, ca = 0, cb = 0;
    while (same && ca != EOF) {
        ca = fgetc(fa);
        cb = fgetc(fb);
        same = ca == cb;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

ZT_TEST(shard_file_direct_equals_buffered)
{
    static const struct { int world, stage; zero_dtype dt; } cases[] = {
        {1, 3, ZERO_F16}, {2, 2, ZERO_BF16}, {2, 3, ZERO_F32}};
    size_t ci, nc = getenv("ZT_QUICK") ? 2 : sizeof cases / sizeof cases[0]; /* sanitizers: 2 */
    for (ci = 0; ci < nc; ci++) {
        char dirs[3][320];
        dw_job J;
        zero_result r;
        int i, q;
        memset(&J, 0, sizeof J);
        J.stage = cases[ci].stage;
        J.dt = cases[ci].dt;
        J.ndirs = 3;
        for (i = 0; i < 3; i++) {
            snprintf(dirs[i], sizeof dirs[i], "%s/direct-%zu-%s", ck_root, ci,
                     i == 0 ? "default" : i == 1 ? "buffered" : "refused");
            J.dirs[i] = dirs[i];
        }
        dw_mode = 0;
        r = zero_local_run(cases[ci].world, dw_rank, &J);
        ZT_CHECKF(r == ZERO_OK, "case %zu: %s", ci, zero_last_error());
        if (r != ZERO_OK) continue;
        /* the buffered saves were buffered; the default one took O_DIRECT unless refused */
        ZT_CHECKF((dw_mode & 6) == 0, "case %zu: mode bits %d", ci, dw_mode);
        if (ci == 0 && !(dw_mode & 1)) printf("  (O_DIRECT refused under %s: both paths wrote buffered)\n", ck_root);
        for (i = 0; i < 3; i++) {
            zero_checkpoint *ck = NULL;
            r = zero_checkpoint_open(dirs[i], &ck);
            if (r == ZERO_OK) r = zero_checkpoint_verify(ck);
            ZT_CHECKF(r == ZERO_OK, "case %zu, %s: %s", ci, dirs[i], zero_last_error());
            zero_checkpoint_close(ck);
        }
        for (q = 0; q <= cases[ci].world; q++) { /* every shard file, then the manifest */
            char a[400], b[400], name[64];
            if (q < cases[ci].world) zero__ck_shard_name(name, sizeof name, 1, q);
            else snprintf(name, sizeof name, "%s", ZERO__CK_MANIFEST);
            for (i = 1; i < 3; i++) {
                snprintf(a, sizeof a, "%s/%s", dirs[0], name);
                snprintf(b, sizeof b, "%s/%s", dirs[i], name);
                ZT_CHECKF(ck_size(a) > 0 && ck_size(a) == ck_size(b) && dw_same_file(a, b),
                          "case %zu: %s (%ld bytes) and %s (%ld bytes) differ", ci, a, ck_size(a), b,
                          ck_size(b));
            }
        }
    }
}

/* CK_ONLY=part runs only the tests whose name contains it (while working on one). */
#define CK_RUN(fn)                                                                           \
    do {                                                                                     \
        const char *only_ = getenv("CK_ONLY");                                               \
        if (!only_ || strstr(#fn, only_)) ZT_RUN(fn);                                        \
    } while (0)

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(ck_root, sizeof ck_root, "%s/zero-ckpt-test-%d", tmp ? tmp : "/tmp", (int)getpid());
    ck_rm_rf(ck_root);
    if (mkdir(ck_root, 0755) != 0) {
        perror(ck_root);
        return 1;
    }
    CK_RUN(crc32c_vectors);
    CK_RUN(crc32c_paths_agree);
    CK_RUN(crc32c_combine_matches_one_pass);
    CK_RUN(tensor_shapes);
    CK_RUN(exact_resume);
    CK_RUN(reshard_any_world_any_stage);
    CK_RUN(corruption_detected_everywhere);
    CK_RUN(save_failure_everywhere);
    CK_RUN(client_state_round_trip);
    CK_RUN(client_state_old_format);
    CK_RUN(client_state_errors);
    CK_RUN(ranks_agree_on_the_checkpoint);
    CK_RUN(the_save_lock_is_its_flock);
    CK_RUN(failed_save_cleans_up);
    CK_RUN(generation_is_exact_64_bit);
    CK_RUN(byte_sizes_do_not_wrap);
    CK_RUN(load_compares_shapes);
    CK_RUN(special_files_refused);
    CK_RUN(manifest_read_is_bounded);
    CK_RUN(temporaries_never_follow_links);
    CK_RUN(messages_name_the_cause);
    CK_RUN(kill_during_save);
    CK_RUN(safetensors_round_trip);
    CK_RUN(safetensors_errors);
    CK_RUN(tool_zero_ckpt);
    CK_RUN(shard_file_direct_equals_buffered);
    ck_rm_rf(ck_root);
    return zt_summary();
}
