/* The local comm (ranks as threads): every collective, dtype and op against references
   computed here element by element (rank order 0..N-1, fp32 accumulation, fp64 for F64,
   one rounding), in-place forms, reduce_scatter == all_reduce bit for bit, agreement
   checks, timeout, abort, lifetime and a long run of small collectives. */
#define _XOPEN_SOURCE 700 /* zero.h is linked (build/zero_impl.o); its private helpers: tests/zt_private.h */
#include "zero.h"
#include "tests/zt.h"
#include "tests/zt_private.h"

#include <time.h>

#define MAXW 8

enum { K_ALL_GATHER, K_REDUCE_SCATTER, K_ALL_REDUCE, K_BROADCAST };
static const char *kind_name[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};

/* ---- element helpers ---- */

static float ld_f(zero_dtype dt, const unsigned char *p, size_t i)
{
    uint16_t h;
    float f;
    if (dt == ZERO_F32) {
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    memcpy(&h, p + 2 * i, 2);
    return dt == ZERO_F16 ? zero_f16_to_f32(h) : zero_bf16_to_f32(h);
}

static void st_f(zero_dtype dt, unsigned char *p, size_t i, float f)
{
    uint16_t h;
    if (dt == ZERO_F32) {
        memcpy(p + 4 * i, &f, 4);
        return;
    }
    h = dt == ZERO_F16 ? zero_f32_to_f16(f) : zero_f32_to_bf16(f);
    memcpy(p + 2 * i, &h, 2);
}

/* A value of varied magnitude (2^-8 .. 2^8), so the order of additions shows in the bits. */
static void gen(zero_dtype dt, unsigned char *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        double v = (zt_uniform() * 2.0 - 1.0) * ldexp(1.0, (int)(zt_rand64() % 17) - 8);
        if (dt == ZERO_F64) memcpy(p + 8 * i, &v, 8);
        else st_f(dt, p, i, (float)v);
    }
}

/* The reference: op over src[0..N-1][i] in rank order, fp32 accumulation (fp64 for F64),
   rounded once into dst[j]. MAX: the largest; NaN if any input is NaN. */
static void ref_elem(zero_dtype dt, zero_op op, int N, unsigned char *const *src, size_t i,
                     unsigned char *dst, size_t j)
{
    int s;
    if (dt == ZERO_F64) {
        double acc, x;
        memcpy(&acc, src[0] + 8 * i, 8);
        for (s = 1; s < N; s++) {
            memcpy(&x, src[s] + 8 * i, 8);
            if (op == ZERO_OP_SUM) acc = acc + x;
            else if (isnan(x) || (!isnan(acc) && x > acc)) acc = isnan(acc) ? acc : x;
        }
        memcpy(dst + 8 * j, &acc, 8);
    } else {
        float acc = ld_f(dt, src[0], i), x;
        for (s = 1; s < N; s++) {
            x = ld_f(dt, src[s], i);
            if (op == ZERO_OP_SUM) acc = acc + x;
            else if (isnan(x) || (!isnan(acc) && x > acc)) acc = isnan(acc) ? acc : x;
        }
        st_f(dt, dst, j, acc);
    }
}

/* ---- one collective on N ranks ---- */

typedef struct coll_case {
    int world, kind, inplace, root;
    zero_dtype dtype;
    zero_op op;
    size_t n;             /* the numel argument                                        */
    unsigned char *in[MAXW];   /* each rank's input                                    */
    unsigned char *work[MAXW]; /* the buffer the collective writes (recv / send / buf) */
    zero_result res[MAXW];
    char msg[MAXW][512];
} coll_case;

static zero_result coll_fn(int rank, zero_comm *comm, void *user)
{
    coll_case *c = (coll_case *)user;
    size_t es = zero_dtype_size(c->dtype), n = c->n;
    unsigned char *w = c->work[rank];
    zero_result r = ZERO_OK;
    switch (c->kind) {
    case K_ALL_GATHER:
        r = comm->ops->all_gather(comm, c->inplace ? w + (size_t)rank * n * es : c->in[rank], w, n,
                                  c->dtype, NULL);
        break;
    case K_REDUCE_SCATTER:
        /* in place: work holds the whole input, the result lands in block 'rank' */
        r = comm->ops->reduce_scatter(comm, c->inplace ? w : c->in[rank],
                                      c->inplace ? w + (size_t)rank * n * es : w, n, c->dtype, c->op, NULL);
        break;
    case K_ALL_REDUCE:
        r = comm->ops->all_reduce(comm, c->inplace ? w : c->in[rank], w, n, c->dtype, c->op, NULL);
        break;
    case K_BROADCAST:
        r = comm->ops->broadcast(comm, w, n, c->dtype, c->root, NULL);
        break;
    }
    c->res[rank] = r;
    snprintf(c->msg[rank], sizeof c->msg[rank], "%s", zero_last_error());
    return r;
}

static size_t in_numel(const coll_case *c)
{
    return c->kind == K_REDUCE_SCATTER ? c->n * (size_t)c->world : c->n;
}
static size_t work_numel(const coll_case *c)
{
    return c->kind == K_ALL_GATHER || (c->kind == K_REDUCE_SCATTER && c->inplace)
               ? c->n * (size_t)c->world
               : c->n;
}

/* Sets up inputs and work buffers, runs, checks every rank's output bit for bit. Returns
   the number of wrong elements (and reports the first). */
static int run_case(coll_case *c)
{
    size_t es = zero_dtype_size(c->dtype), n = c->n, i, ni = in_numel(c), nw = work_numel(c);
    unsigned char *expect = (unsigned char *)malloc((nw ? nw : 1) * es);
    int r, s, bad = 0;
    zero_result res;
    for (r = 0; r < c->world; r++) {
        c->in[r] = (unsigned char *)malloc((ni ? ni : 1) * es);
        c->work[r] = (unsigned char *)malloc((nw ? nw : 1) * es);
        gen(c->dtype, c->in[r], ni);
        memset(c->work[r], 0xab, nw * es);
        if (c->kind == K_ALL_GATHER && c->inplace) memcpy(c->work[r] + (size_t)r * n * es, c->in[r], n * es);
        if ((c->kind == K_ALL_REDUCE || c->kind == K_REDUCE_SCATTER) && c->inplace)
            memcpy(c->work[r], c->in[r], ni * es);
        if (c->kind == K_BROADCAST) memcpy(c->work[r], c->in[r], n * es);
        c->res[r] = ZERO_ERROR_INVALID_STATE;
    }
    res = zero_local_run(c->world, coll_fn, c);
    ZT_CHECKF(res == ZERO_OK, "%s N=%d %s n=%zu: %s (%s)", kind_name[c->kind], c->world,
              zero_dtype_name(c->dtype), n, zero_result_string(res), zero_last_error());
    for (r = 0; r < c->world; r++) {
        unsigned char *got = c->work[r];
        size_t off = 0;
        ZT_CHECKF(c->res[r] == ZERO_OK, "rank %d: %s", r, c->msg[r]);
        switch (c->kind) {
        case K_ALL_GATHER:
            for (s = 0; s < c->world; s++) memcpy(expect + (size_t)s * n * es, c->in[s], n * es);
            break;
        case K_REDUCE_SCATTER:
            for (i = 0; i < n; i++) ref_elem(c->dtype, c->op, c->world, c->in, (size_t)r * n + i, expect, i);
            if (c->inplace) off = (size_t)r * n * es;
            break;
        case K_ALL_REDUCE:
            for (i = 0; i < n; i++) ref_elem(c->dtype, c->op, c->world, c->in, i, expect, i);
            break;
        case K_BROADCAST:
            memcpy(expect, c->in[c->root], n * es);
            break;
        }
        {
            size_t cmp = c->kind == K_ALL_GATHER ? n * (size_t)c->world : n;
            for (i = 0; i < cmp; i++)
                if (memcmp(got + off + i * es, expect + i * es, es) != 0) {
                    if (bad == 0)
                        ZT_CHECKF(0, "%s N=%d %s %s n=%zu inplace=%d root=%d: rank %d element %zu differs",
                                  kind_name[c->kind], c->world, zero_dtype_name(c->dtype),
                                  c->op == ZERO_OP_MAX ? "max" : "sum", n, c->inplace, c->root, r, i);
                    bad++;
                }
        }
    }
    for (r = 0; r < c->world; r++) {
        free(c->in[r]);
        free(c->work[r]);
    }
    free(expect);
    return bad;
}

static const int worlds[] = {1, 2, 3, 4, 8};
static const zero_dtype dtypes[] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64};

ZT_TEST(every_collective_matches_reference)
{
    size_t sizes[] = {1, 7, 1003, 4099};
    int wi, di, si, kind, inplace, op, root, cases = 0;
    zt_seed(1);
    for (wi = 0; wi < 5; wi++)
        for (di = 0; di < 4; di++)
            for (si = 0; si < (zt_quick() ? 3 : 4); si++)
                for (kind = 0; kind < 4; kind++)
                    for (inplace = 0; inplace < (kind == K_BROADCAST ? 1 : 2); inplace++)
                        for (op = 0; op < (kind == K_REDUCE_SCATTER || kind == K_ALL_REDUCE ? 2 : 1); op++)
                            for (root = 0; root < (kind == K_BROADCAST ? worlds[wi] : 1); root++) {
                                coll_case c;
                                memset(&c, 0, sizeof c);
                                c.world = worlds[wi];
                                c.kind = kind;
                                c.dtype = dtypes[di];
                                c.op = (zero_op)op;
                                c.n = sizes[si];
                                c.inplace = inplace;
                                c.root = root;
                                run_case(&c);
                                cases++;
                            }
    printf("  %d collective cases\n", cases);
}

/* The same elements reduce to the same bits whichever collective reduces them. */
typedef struct rs_ar {
    zero_dtype dtype;
    size_t n; /* per block */
    unsigned char *in[MAXW];
    unsigned char *rs[MAXW];
    unsigned char *ar[MAXW];
} rs_ar;

static zero_result rs_ar_fn(int rank, zero_comm *comm, void *user)
{
    rs_ar *t = (rs_ar *)user;
    zero_result r;
    r = comm->ops->reduce_scatter(comm, t->in[rank], t->rs[rank], t->n, t->dtype, ZERO_OP_SUM, NULL);
    if (r != ZERO_OK) return r;
    return comm->ops->all_reduce(comm, t->in[rank], t->ar[rank], t->n * (size_t)comm->world, t->dtype,
                                 ZERO_OP_SUM, NULL);
}

ZT_TEST(reduce_scatter_equals_all_reduce_slice)
{
    int wi, di, r;
    zt_seed(2);
    for (wi = 0; wi < 5; wi++)
        for (di = 0; di < 4; di++) {
            rs_ar t;
            int N = worlds[wi];
            size_t es = zero_dtype_size(dtypes[di]);
            memset(&t, 0, sizeof t);
            t.dtype = dtypes[di];
            t.n = 1000 + 3;
            for (r = 0; r < N; r++) {
                t.in[r] = (unsigned char *)malloc(t.n * (size_t)N * es);
                t.rs[r] = (unsigned char *)malloc(t.n * es);
                t.ar[r] = (unsigned char *)malloc(t.n * (size_t)N * es);
                gen(t.dtype, t.in[r], t.n * (size_t)N);
            }
            ZT_CHECKF(zero_local_run(N, rs_ar_fn, &t) == ZERO_OK, "%s", zero_last_error());
            for (r = 0; r < N; r++) {
                ZT_CHECKF(memcmp(t.rs[r], t.ar[r] + (size_t)r * t.n * es, t.n * es) == 0,
                          "N=%d %s rank %d: reduce_scatter block != all_reduce slice", N,
                          zero_dtype_name(t.dtype), r);
                ZT_CHECKF(memcmp(t.ar[r], t.ar[0], t.n * (size_t)N * es) == 0, "N=%d all_reduce differs by rank", N);
            }
            for (r = 0; r < N; r++) {
                free(t.in[r]);
                free(t.rs[r]);
                free(t.ar[r]);
            }
        }
}

/* MAX: -0/+0, inf and NaN; the sum's order shows in fp32 (1 + 2^-24 + 2^-24 ...). */
typedef struct special {
    float in[4][4];
    float max_out[4][4];
    float sum_out[4][4];
} special;

static zero_result special_fn(int rank, zero_comm *comm, void *user)
{
    special *s = (special *)user;
    zero_result r = comm->ops->all_reduce(comm, s->in[rank], s->max_out[rank], 4, ZERO_F32, ZERO_OP_MAX, NULL);
    if (r == ZERO_OK)
        r = comm->ops->all_reduce(comm, s->in[rank], s->sum_out[rank], 4, ZERO_F32, ZERO_OP_SUM, NULL);
    return r;
}

ZT_TEST(max_and_rank_order_edge_cases)
{
    special s;
    int r;
    float tiny = ldexpf(1.0f, -24);
    memset(&s, 0, sizeof s);
    /* element 0: 1, 2^-24, 2^-24, 2^-24: in rank order every tiny addend rounds away
       (1 + 2^-24 ties to 1), so the fp32 sum is 1; summed the other way it is 1 + 2^-22. */
    s.in[0][0] = 1.0f;
    s.in[1][0] = tiny;
    s.in[2][0] = tiny;
    s.in[3][0] = tiny;
    /* element 1: a NaN at rank 2 */
    s.in[0][1] = 1.0f;
    s.in[1][1] = 5.0f;
    s.in[2][1] = NAN;
    s.in[3][1] = 2.0f;
    /* element 2: -inf, -3, +inf, 7 */
    s.in[0][2] = -INFINITY;
    s.in[1][2] = -3.0f;
    s.in[2][2] = INFINITY;
    s.in[3][2] = 7.0f;
    /* element 3: all -0 */
    for (r = 0; r < 4; r++) s.in[r][3] = -0.0f;
    ZT_CHECKF(zero_local_run(4, special_fn, &s) == ZERO_OK, "%s", zero_last_error());
    for (r = 0; r < 4; r++) {
        ZT_CHECKF(s.sum_out[r][0] == 1.0f, "rank order: %a", (double)s.sum_out[r][0]);
        ZT_CHECK(s.max_out[r][0] == 1.0f);
        ZT_CHECK(isnan(s.max_out[r][1]) && isnan(s.sum_out[r][1]));
        ZT_CHECK(s.max_out[r][2] == INFINITY && isnan(s.sum_out[r][2]));
        ZT_CHECK(s.max_out[r][3] == 0.0f && signbit(s.max_out[r][3]));
        ZT_CHECK(s.sum_out[r][3] == 0.0f && signbit(s.sum_out[r][3]));
    }
}

/* numel 0: a checked synchronisation point; NULL buffers allowed. */
static zero_result zero_numel_fn(int rank, zero_comm *comm, void *user)
{
    zero_result r;
    (void)rank;
    (void)user;
    if ((r = comm->ops->all_gather(comm, NULL, NULL, 0, ZERO_F16, NULL)) != ZERO_OK) return r;
    if ((r = comm->ops->reduce_scatter(comm, NULL, NULL, 0, ZERO_F32, ZERO_OP_SUM, NULL)) != ZERO_OK) return r;
    if ((r = comm->ops->all_reduce(comm, NULL, NULL, 0, ZERO_BF16, ZERO_OP_MAX, NULL)) != ZERO_OK) return r;
    if ((r = comm->ops->broadcast(comm, NULL, 0, ZERO_F64, comm->world - 1, NULL)) != ZERO_OK) return r;
    return comm->ops->barrier(comm);
}

ZT_TEST(zero_numel_is_a_sync_point)
{
    int wi;
    for (wi = 0; wi < 5; wi++)
        ZT_CHECKF(zero_local_run(worlds[wi], zero_numel_fn, NULL) == ZERO_OK, "%s", zero_last_error());
}

/* Barrier orders: everything written before it is seen after it by every rank. */
typedef struct barrier_t {
    int world;
    int mark[MAXW];
    int seen_all[MAXW];
} barrier_t;

static zero_result barrier_fn(int rank, zero_comm *comm, void *user)
{
    barrier_t *b = (barrier_t *)user;
    int i, it, ok = 1;
    zero_result r;
    for (it = 1; it <= 50; it++) {
        b->mark[rank] = it;
        if ((r = comm->ops->barrier(comm)) != ZERO_OK) return r;
        for (i = 0; i < b->world; i++) ok &= b->mark[i] == it;
        if ((r = comm->ops->barrier(comm)) != ZERO_OK) return r;
    }
    b->seen_all[rank] = ok;
    return ZERO_OK;
}

ZT_TEST(barrier_orders_writes)
{
    int wi, r;
    for (wi = 0; wi < 5; wi++) {
        barrier_t b;
        memset(&b, 0, sizeof b);
        b.world = worlds[wi];
        ZT_CHECKF(zero_local_run(b.world, barrier_fn, &b) == ZERO_OK, "%s", zero_last_error());
        for (r = 0; r < b.world; r++) ZT_CHECKF(b.seen_all[r], "N=%d rank %d", b.world, r);
    }
}

/* ---- agreement ---- */

typedef struct mism {
    int world;
    int variant;
    zero_result first[MAXW], second[MAXW];
    char msg[MAXW][512];
    float out[MAXW][16];
} mism;

static zero_result mism_fn(int rank, zero_comm *comm, void *user)
{
    mism *m = (mism *)user;
    float in[17], out[17 * MAXW];
    size_t n = 8;
    int i;
    zero_result r = ZERO_OK;
    for (i = 0; i < 17; i++) in[i] = (float)(rank + 1);
    if (rank == 1) {
        switch (m->variant) {
        case 0: r = comm->ops->all_reduce(comm, in, out, n + 1, ZERO_F32, ZERO_OP_SUM, NULL); break;
        case 1: r = comm->ops->all_reduce(comm, in, out, n, ZERO_F16, ZERO_OP_SUM, NULL); break;
        case 2: r = comm->ops->all_reduce(comm, in, out, n, ZERO_F32, ZERO_OP_MAX, NULL); break;
        case 3: r = comm->ops->barrier(comm); break;
        case 4: r = comm->ops->all_reduce(comm, NULL, out, n, ZERO_F32, ZERO_OP_SUM, NULL); break;
        case 5: r = comm->ops->all_reduce(comm, in, out, n, (zero_dtype)42, ZERO_OP_SUM, NULL); break;
        case 6: r = comm->ops->broadcast(comm, out, n, ZERO_F32, 1, NULL); break;
        case 7: r = comm->ops->broadcast(comm, out, n, ZERO_F32, 99, NULL); break;
        case 8: r = comm->ops->reduce_scatter(comm, in, out, n, ZERO_F32, ZERO_OP_SUM, NULL); break;
        }
    } else if (m->variant >= 6 && m->variant <= 7) {
        r = comm->ops->broadcast(comm, out, n, ZERO_F32, 0, NULL);
    } else {
        r = comm->ops->all_reduce(comm, in, out, n, ZERO_F32, ZERO_OP_SUM, NULL);
    }
    m->first[rank] = r;
    snprintf(m->msg[rank], sizeof m->msg[rank], "%s", zero_last_error());
    /* the group is still usable */
    m->second[rank] = comm->ops->all_reduce(comm, in, m->out[rank], 16, ZERO_F32, ZERO_OP_SUM, NULL);
    return ZERO_OK;
}

ZT_TEST(mismatch_fails_every_rank_and_group_survives)
{
    int wi, v, r, i;
    for (wi = 1; wi < 5; wi++)
        for (v = 0; v <= 8; v++) {
            mism m;
            int N = worlds[wi];
            int invalid = v == 4 || v == 5 || v == 7;
            memset(&m, 0, sizeof m);
            m.world = N;
            m.variant = v;
            ZT_CHECKF(zero_local_run(N, mism_fn, &m) == ZERO_OK, "%s", zero_last_error());
            for (r = 0; r < N; r++) {
                zero_result want = invalid && r == 1 ? ZERO_ERROR_INVALID_ARGUMENT : ZERO_ERROR_MISMATCH;
                ZT_CHECKF(m.first[r] == want, "N=%d variant %d rank %d: got %s (%s)", N, v, r,
                          zero_result_string(m.first[r]), m.msg[r]);
                ZT_CHECKF(m.second[r] == ZERO_OK, "N=%d variant %d rank %d: next collective %s", N, v, r,
                          zero_result_string(m.second[r]));
                for (i = 0; i < 16; i++) ZT_CHECK(m.out[r][i] == (float)(N * (N + 1) / 2));
            }
            if (v == 0) {
                ZT_CHECKF(strstr(m.msg[0], "numel 8") && strstr(m.msg[0], "numel 9"), "message: %s", m.msg[0]);
            }
        }
}

/* ---- failure: timeout, abort, departure ---- */

typedef struct fail_t {
    int mode;
    int sleep_ms;
    zero_result res[MAXW], later[MAXW];
    double took_ms[MAXW], later_ms[MAXW];
    char msg[MAXW][512];
} fail_t;

static zero_result fail_fn(int rank, zero_comm *comm, void *user)
{
    fail_t *f = (fail_t *)user;
    float buf[64];
    double t0;
    memset(buf, 0, sizeof buf);
    if (rank == 2) {
        if (f->mode == 2) return ZERO_OK; /* leaves at once: its comm is destroyed */
        if (f->mode == 3) return zt_fail(ZERO_ERROR_INVALID_ARGUMENT, "rank 2 gave up");
        zt_sleep_ms(f->sleep_ms);
        if (f->mode == 1) zero_local_abort(comm);
    }
    t0 = zt_now_ms();
    f->res[rank] = comm->ops->all_reduce(comm, buf, buf, 64, ZERO_F32, ZERO_OP_SUM, NULL);
    f->took_ms[rank] = zt_now_ms() - t0;
    snprintf(f->msg[rank], sizeof f->msg[rank], "%s", zero_last_error());
    t0 = zt_now_ms();
    f->later[rank] = comm->ops->barrier(comm);
    f->later_ms[rank] = zt_now_ms() - t0;
    return f->res[rank];
}

static zero_result run_fail(fail_t *f, int timeout_ms)
{
    zero_local_desc d;
    memset(&d, 0, sizeof d);
    d.world = 3;
    d.timeout_ms = timeout_ms;
    return zero_local_run_desc(&d, fail_fn, f);
}

ZT_TEST(late_rank_times_out)
{
    fail_t f;
    zero_result res;
    int r;
    memset(&f, 0, sizeof f);
    f.mode = 0;
    f.sleep_ms = 700;
    res = run_fail(&f, 200);
    for (r = 0; r < 2; r++) {
        ZT_CHECKF(f.res[r] == ZERO_ERROR_TIMEOUT, "rank %d: %s", r, zero_result_string(f.res[r]));
        ZT_CHECKF(f.took_ms[r] >= 150 && f.took_ms[r] < 650, "rank %d waited %.0f ms", r, f.took_ms[r]);
        ZT_CHECKF(strstr(f.msg[r], "waiting for rank(s) 2") != NULL, "message: %s", f.msg[r]);
    }
    /* the late rank and every later call fail at once */
    ZT_CHECKF(f.res[2] == ZERO_ERROR_TIMEOUT && f.took_ms[2] < 50, "rank 2: %s after %.0f ms",
              zero_result_string(f.res[2]), f.took_ms[2]);
    for (r = 0; r < 3; r++)
        ZT_CHECKF(f.later[r] == ZERO_ERROR_TIMEOUT && f.later_ms[r] < 50, "rank %d later: %s", r,
                  zero_result_string(f.later[r]));
    ZT_CHECKF(res == ZERO_ERROR_TIMEOUT, "run: %s", zero_result_string(res));
}

ZT_TEST(abort_wakes_waiting_ranks)
{
    fail_t f;
    zero_result res;
    int r;
    memset(&f, 0, sizeof f);
    f.mode = 1;
    f.sleep_ms = 50;
    res = run_fail(&f, 10000);
    for (r = 0; r < 3; r++) {
        ZT_CHECKF(f.res[r] == ZERO_ERROR_COMM, "rank %d: %s", r, zero_result_string(f.res[r]));
        ZT_CHECKF(f.took_ms[r] < 2000, "rank %d waited %.0f ms", r, f.took_ms[r]);
        ZT_CHECKF(strstr(f.msg[r], "zero_local_abort") != NULL, "message: %s", f.msg[r]);
        ZT_CHECK(f.later[r] == ZERO_ERROR_COMM);
    }
    ZT_CHECK(res == ZERO_ERROR_COMM);
}

ZT_TEST(departed_rank_fails_peers_fast)
{
    fail_t f;
    zero_result res;
    int r;
    memset(&f, 0, sizeof f);
    f.mode = 2;
    res = run_fail(&f, 10000);
    for (r = 0; r < 2; r++) {
        ZT_CHECKF(f.res[r] == ZERO_ERROR_COMM, "rank %d: %s", r, zero_result_string(f.res[r]));
        ZT_CHECKF(f.took_ms[r] < 2000, "rank %d waited %.0f ms", r, f.took_ms[r]);
        ZT_CHECKF(strstr(f.msg[r], "rank 2 left") != NULL, "message: %s", f.msg[r]);
    }
    ZT_CHECKF(res == ZERO_ERROR_COMM && strstr(zero_last_error(), "rank 0:") != NULL, "run: %s: %s",
              zero_result_string(res), zero_last_error());
}

ZT_TEST(run_reports_the_root_cause)
{
    fail_t f;
    zero_result res;
    memset(&f, 0, sizeof f);
    f.mode = 3;
    res = run_fail(&f, 10000);
    ZT_CHECKF(res == ZERO_ERROR_INVALID_ARGUMENT, "run: %s", zero_result_string(res));
    ZT_CHECKF(strstr(zero_last_error(), "rank 2: rank 2 gave up") != NULL, "message: %s", zero_last_error());
    ZT_CHECK(f.res[0] == ZERO_ERROR_COMM && f.res[1] == ZERO_ERROR_COMM);
}

/* ---- lifetime and argument errors ---- */

static int hooks_live;
static void *hook_alloc(size_t bytes, void *user)
{
    (void)user;
    __atomic_add_fetch(&hooks_live, 1, __ATOMIC_RELAXED);
    return malloc(bytes);
}
static void hook_free(void *p, void *user)
{
    (void)user;
    __atomic_sub_fetch(&hooks_live, 1, __ATOMIC_RELAXED);
    free(p);
}

ZT_TEST(lifetime_and_argument_errors)
{
    zero_local_desc d;
    zero_local_group *g = NULL;
    zero_comm *c0 = NULL, *c1 = NULL, *dup = NULL, fake;
    float x = 1.0f, y = 0.0f;
    memset(&d, 0, sizeof d);
    ZT_CHECK(zero_local_group_create(&d, &g) == ZERO_ERROR_INVALID_ARGUMENT && g == NULL);
    d.world = 2;
    d.timeout_ms = -1;
    ZT_CHECK(zero_local_group_create(&d, &g) == ZERO_ERROR_INVALID_ARGUMENT);
    d.timeout_ms = 0;
    ZT_CHECK(zero_local_group_create(NULL, &g) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_local_group_create(&d, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    d.allocator.alloc = hook_alloc;
    d.allocator.free = hook_free;
    ZT_CHECK(zero_local_group_create(&d, &g) == ZERO_OK && g != NULL);
    ZT_CHECK(zero_local_comm_create(g, 2, &c0) == ZERO_ERROR_INVALID_ARGUMENT && c0 == NULL);
    ZT_CHECK(zero_local_comm_create(g, -1, &c0) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_local_comm_create(NULL, 0, &c0) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_local_comm_create(g, 0, &c0) == ZERO_OK && c0 && c0->rank == 0 && c0->world == 2);
    ZT_CHECK(strcmp(c0->ops->name, "local") == 0);
    ZT_CHECK(zero_local_comm_create(g, 0, &dup) == ZERO_ERROR_INVALID_STATE && dup == NULL);
    ZT_CHECK(zero_local_comm_create(g, 1, &c1) == ZERO_OK);
    /* a comm that is not a local comm */
    fake = *c0;
    fake.impl = NULL;
    ZT_CHECK(c0->ops->all_reduce(&fake, &x, &y, 1, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(c0->ops->barrier(NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_local_abort(NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    /* the group outlives its destroy call until its last comm goes */
    zero_local_group_destroy(g);
    ZT_CHECK(zero_local_comm_create(g, 1, &dup) == ZERO_ERROR_INVALID_STATE);
    zero_comm_destroy(c0);
    /* the group is broken now: rank 1 alone fails at once instead of waiting */
    ZT_CHECK(c1->ops->all_reduce(c1, &x, &y, 1, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_ERROR_COMM);
    ZT_CHECK(strstr(zero_last_error(), "rank 0 left") != NULL);
    zero_comm_destroy(c1);
    zero_comm_destroy(NULL);
    zero_local_group_destroy(NULL);
    ZT_CHECKF(hooks_live == 0, "%d allocations leaked", hooks_live);
    ZT_CHECK(zero_local_run(0, zero_numel_fn, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_local_run(2, NULL, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
}

/* A single-rank group needs no peers and no threads. */
ZT_TEST(single_rank_without_threads)
{
    zero_local_desc d;
    zero_local_group *g = NULL;
    zero_comm *c = NULL;
    uint16_t h[3], out[3];
    int i;
    memset(&d, 0, sizeof d);
    d.world = 1;
    ZT_CHECK(zero_local_group_create(&d, &g) == ZERO_OK);
    ZT_CHECK(zero_local_comm_create(g, 0, &c) == ZERO_OK);
    for (i = 0; i < 3; i++) h[i] = zero_f32_to_f16((float)i + 0.5f);
    ZT_CHECK(c->ops->all_reduce(c, h, out, 3, ZERO_F16, ZERO_OP_SUM, NULL) == ZERO_OK);
    ZT_CHECK(memcmp(h, out, sizeof h) == 0);
    ZT_CHECK(c->ops->barrier(c) == ZERO_OK);
    zero_comm_destroy(c);
    zero_local_group_destroy(g);
}

/* ---- many small collectives back to back ---- */

typedef struct stress {
    int iters;
    int errors[MAXW];
    zero_result res[MAXW];
} stress;

static zero_result stress_fn(int rank, zero_comm *comm, void *user)
{
    stress *s = (stress *)user;
    int N = comm->world, it, i, errors = 0;
    float a[3 * MAXW], b[3 * MAXW];
    zero_result r = ZERO_OK;
    for (it = 0; it < s->iters && r == ZERO_OK; it++) {
        float v = (float)(rank + it % 7);
        switch (it % 5) {
        case 0: /* in-place all_reduce */
            for (i = 0; i < 3; i++) a[i] = v + (float)i;
            r = comm->ops->all_reduce(comm, a, a, 3, ZERO_F32, ZERO_OP_SUM, NULL);
            for (i = 0; i < 3 && r == ZERO_OK; i++)
                errors += a[i] != (float)(N * (N - 1) / 2 + N * (it % 7 + i));
            break;
        case 1: /* in-place all_gather */
            a[rank] = v;
            r = comm->ops->all_gather(comm, a + rank, a, 1, ZERO_F32, NULL);
            for (i = 0; i < N && r == ZERO_OK; i++) errors += a[i] != (float)(i + it % 7);
            break;
        case 2:
            for (i = 0; i < N; i++) a[i] = v * (float)(i + 1);
            r = comm->ops->reduce_scatter(comm, a, b, 1, ZERO_F32, ZERO_OP_MAX, NULL);
            if (r == ZERO_OK) errors += b[0] != (float)(N - 1 + it % 7) * (float)(rank + 1);
            break;
        case 3:
            a[0] = v;
            r = comm->ops->broadcast(comm, a, 1, ZERO_F32, it % N, NULL);
            if (r == ZERO_OK) errors += a[0] != (float)(it % N + it % 7);
            break;
        case 4:
            r = comm->ops->barrier(comm);
            break;
        }
    }
    s->errors[rank] = errors;
    s->res[rank] = r;
    return r;
}

ZT_TEST(many_small_collectives)
{
    int wi, r;
    double t0;
    for (wi = 0; wi < 5; wi++) {
        stress s;
        memset(&s, 0, sizeof s);
        s.iters = zt_long() ? 20000 : zt_quick() ? 500 : 1000; /* make test-long: the long run */
        t0 = zt_now_ms();
        ZT_CHECKF(zero_local_run(worlds[wi], stress_fn, &s) == ZERO_OK, "%s", zero_last_error());
        for (r = 0; r < worlds[wi]; r++) ZT_CHECKF(s.errors[r] == 0, "N=%d rank %d: %d wrong", worlds[wi], r, s.errors[r]);
        printf("  N=%d: %d collectives in %.1f ms\n", worlds[wi], s.iters, zt_now_ms() - t0);
    }
}

/* ---- a larger all_reduce: throughput, and fp16 tiles across slice boundaries ---- */

typedef struct big {
    size_t n;
    float *buf[MAXW];
    uint16_t *h[MAXW];
} big;

static zero_result big_fn(int rank, zero_comm *comm, void *user)
{
    big *b = (big *)user;
    zero_result r = comm->ops->all_reduce(comm, b->buf[rank], b->buf[rank], b->n, ZERO_F32, ZERO_OP_SUM, NULL);
    if (r == ZERO_OK) r = comm->ops->all_reduce(comm, b->h[rank], b->h[rank], b->n, ZERO_F16, ZERO_OP_SUM, NULL);
    return r;
}

ZT_TEST(large_in_place_all_reduce)
{
    big b;
    int N = 4, r;
    size_t i, wrong = 0;
    double t0;
    memset(&b, 0, sizeof b);
    b.n = zt_quick() ? 100003 : 1000003;
    for (r = 0; r < N; r++) {
        b.buf[r] = (float *)malloc(b.n * sizeof(float));
        b.h[r] = (uint16_t *)malloc(b.n * sizeof(uint16_t));
        for (i = 0; i < b.n; i++) {
            b.buf[r][i] = (float)((i + (size_t)r) % 1000);
            b.h[r][i] = zero_f32_to_f16((float)((i * 7 + (size_t)r) % 100) * 0.25f);
        }
    }
    t0 = zt_now_ms();
    ZT_CHECKF(zero_local_run(N, big_fn, &b) == ZERO_OK, "%s", zero_last_error());
    printf("  all_reduce of %zu f32 + f16 elements on %d ranks: %.1f ms\n", b.n, N, zt_now_ms() - t0);
    for (r = 0; r < N; r++)
        for (i = 0; i < b.n; i++) {
            float want = 0.0f, wh = 0.0f;
            int s;
            for (s = 0; s < N; s++) {
                want += (float)((i + (size_t)s) % 1000);
                wh += (float)((i * 7 + (size_t)s) % 100) * 0.25f;
            }
            wrong += b.buf[r][i] != want || b.h[r][i] != zero_f32_to_f16(wh);
        }
    ZT_CHECKF(wrong == 0, "%zu wrong elements", wrong);
    for (r = 0; r < N; r++) {
        free(b.buf[r]);
        free(b.h[r]);
    }
}

int main(void)
{
    ZT_RUN(every_collective_matches_reference);
    ZT_RUN(reduce_scatter_equals_all_reduce_slice);
    ZT_RUN(max_and_rank_order_edge_cases);
    ZT_RUN(zero_numel_is_a_sync_point);
    ZT_RUN(barrier_orders_writes);
    ZT_RUN(mismatch_fails_every_rank_and_group_survives);
    ZT_RUN(late_rank_times_out);
    ZT_RUN(abort_wakes_waiting_ranks);
    ZT_RUN(departed_rank_fails_peers_fast);
    ZT_RUN(run_reports_the_root_cause);
    ZT_RUN(lifetime_and_argument_errors);
    ZT_RUN(single_rank_without_threads);
    ZT_RUN(many_small_collectives);
    ZT_RUN(large_in_place_all_reduce);
    return zt_summary();
}
