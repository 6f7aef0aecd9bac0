/* The single-process multi-rank comm over device memory (zero_cuda_local_comm_create):
   N = 1, 2, 3, 4, 8 ranks (threads) on one GPU, every collective, dtype and op, in-place
   forms, sizes 0 .. 65537, against the host local comm run on the same inputs by the same
   ranks: bit for bit (MAX, copies) or NaN-aware (SUM: a GPU NaN result has no payload).
   Every transfer is enqueued on the rank's comm stream with no host sync between the
   upload, the collective and the download, so the cross-rank event ordering is what makes
   the results right. Also: disagreement and invalid arguments (every rank returns, the
   group stays usable), a timeout, the barrier, and create's argument checks.
   Without a GPU it prints one skip line and exits 0. */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "tests/zt.h"
#include "tests/cuda/gpu_probe.h"

#include <math.h>
#include <time.h>

#define NTESTS 5
#define MAXW 8
#define MAXN 65537

enum { AG, RS, AR, BC };
static const char *KIND[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
static const zero_dtype DTS[4] = {ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64};

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Values whose sums round differently in different orders, with a few NaN / inf. */
static void gen(zero_dtype dt, void *p, size_t n, uint64_t seed, int specials)
{
    size_t i;
    for (i = 0; i < n; i++) {
        uint64_t r = mix(seed * 1000003u + i);
        double v = ldexp((double)(r >> 11) / 9007199254740992.0 - 0.5, (int)(r % 17) - 8);
        float f;
        if (specials && r % 97 == 3) v = NAN;
        if (specials && r % 89 == 5) v = (r & 1) ? INFINITY : -INFINITY;
        f = (float)v;
        switch (dt) {
        case ZERO_F32: ((float *)p)[i] = f; break;
        case ZERO_F16: ((uint16_t *)p)[i] = zero_f32_to_f16(f); break;
        case ZERO_BF16: ((uint16_t *)p)[i] = zero_f32_to_bf16(f); break;
        default: ((double *)p)[i] = v * (1.0 + ldexp((double)(r >> 44), -30)); break;
        }
    }
}

static int same(zero_dtype dt, const void *a, const void *b, size_t n, int nan_ok, size_t *where)
{
    size_t es = zero_dtype_size(dt), i;
    for (i = 0; i < n; i++) {
        const unsigned char *x = (const unsigned char *)a + i * es, *y = (const unsigned char *)b + i * es;
        int xn, yn;
        if (memcmp(x, y, es) == 0) continue;
        if (dt == ZERO_F32) { float f, g; memcpy(&f, x, 4); memcpy(&g, y, 4); xn = f != f; yn = g != g; }
        else if (dt == ZERO_F64) { double f, g; memcpy(&f, x, 8); memcpy(&g, y, 8); xn = f != f; yn = g != g; }
        else {
            uint16_t f, g, m = dt == ZERO_F16 ? 0x7c00 : 0x7f80;
            memcpy(&f, x, 2);
            memcpy(&g, y, 2);
            xn = (f & 0x7fff) > m;
            yn = (g & 0x7fff) > m;
        }
        if (nan_ok && xn && yn) continue;
        *where = i;
        return 0;
    }
    return 1;
}

/* ---- the sweep: one zero_local_run per world size ---- */

typedef struct sweep {
    int world;
    int quick;
    pthread_mutex_t mu;
    int failures;
    char msg[512];
    long cases;
} sweep;

static void sweep_fail(sweep *s, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&s->mu);
    if (s->failures++ == 0) {
        va_start(ap, fmt);
        vsnprintf(s->msg, sizeof s->msg, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&s->mu);
}

#define RTRY(call)                                                                           \
    do {                                                                                     \
        zero_result r_ = (call);                                                             \
        if (r_ != ZERO_OK) {                                                                 \
            sweep_fail(s, "rank %d: %s: %s", rank, #call, zero_last_error());                \
            res = r_;                                                                        \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

static zero_result sweep_rank(int rank, zero_comm *comm, void *user)
{
    static const size_t sizes_full[] = {0, 1, 5, 17, 1000, MAXN}, sizes_quick[] = {0, 1, 17, 1000};
    sweep *s = (sweep *)user;
    const int W = comm->world;
    const size_t *sizes = s->quick ? sizes_quick : sizes_full;
    const int nsizes = s->quick ? 4 : 6;
    zero_device *dev = NULL;
    zero_comm *dc = NULL;
    zero_result res = ZERO_OK;
    size_t cap = (size_t)W * MAXN * 8;
    unsigned char *hin = (unsigned char *)malloc(cap), *href = (unsigned char *)malloc(cap), *hout = (unsigned char *)malloc(cap);
    void *dsend = NULL, *drecv = NULL;
    int kind, di, op, si, inplace;
    long id = 0;
    RTRY(zero_cuda_device_create(NULL, &dev));
    RTRY(zero_cuda_local_comm_create(comm, dev, &dc));
    RTRY(dev->ops->alloc(dev, cap, ZERO_MEM_BUCKET, &dsend));
    RTRY(dev->ops->alloc(dev, cap, ZERO_MEM_BUCKET, &drecv));
    for (kind = 0; kind < 4; kind++)
        for (di = 0; di < 4; di++)
            for (op = 0; op < 2; op++)
                for (si = 0; si < nsizes; si++)
                    for (inplace = 0; inplace < 2; inplace++) {
                        zero_dtype dt = DTS[di];
                        size_t n = sizes[si], es = zero_dtype_size(dt), in_n, out_n, where = 0;
                        int root = (int)(id % W), nan_ok = (kind == RS || kind == AR) && op == ZERO_OP_SUM;
                        unsigned char *hs, *hr;
                        char *ds, *dr;
                        zero_queue cq = ZERO_QUEUE_COMM;
                        void *queue = dev->ops->native_queue(dev, cq);
                        id++;
                        if ((kind == AG || kind == BC) && op == ZERO_OP_MAX) continue;
                        if (kind == BC && inplace) continue; /* always in place */
                        in_n = kind == RS ? (size_t)W * n : n;
                        out_n = kind == AG ? (size_t)W * n : n;
                        /* host reference, laid out as the call wants it */
                        memset(href, 0xA5, cap);
                        hs = hin;
                        hr = href;
                        if (kind == AG && inplace) hs = href + (size_t)rank * n * es;
                        if (kind == RS && inplace) { hs = href; hr = href + (size_t)rank * n * es; }
                        if (kind == AR && inplace) hs = hr = href;
                        if (kind == BC) hs = hr = href;
                        gen(dt, hs, in_n, (uint64_t)id * 64 + (uint64_t)rank, 1);
                        if (kind == BC && rank != root) memset(hs, 0x5A, n * es); /* overwritten */
                        /* the device buffers: the same layout in dsend/drecv */
                        ds = (char *)dsend;
                        dr = (char *)drecv;
                        if (kind == AG && inplace) ds = dr + (size_t)rank * n * es;
                        if (kind == RS && inplace) { ds = dr; dr = dr + (size_t)rank * n * es; }
                        if ((kind == AR && inplace) || kind == BC) ds = dr;
                        {
                            /* upload what the host reference starts from, all on the comm queue */
                            size_t whole = kind == AG ? (size_t)W * n : kind == RS && inplace ? (size_t)W * n : out_n;
                            if (!((kind == AG && inplace) || (kind == RS && inplace) || (kind == AR && inplace) || kind == BC)) {
                                if (in_n) RTRY(dev->ops->upload(dev, cq, ds, hs, in_n * es));
                                memset(hout, 0xA5, whole * es); /* recv starts as garbage */
                                if (whole) RTRY(dev->ops->upload(dev, cq, drecv, hout, whole * es));
                            } else {
                                unsigned char *base = (kind == RS && inplace) ? href : (kind == AG ? href : hr);
                                if (whole) RTRY(dev->ops->upload(dev, cq, drecv, base, whole * es));
                            }
                        }
                        /* the collectives: device first (enqueued), then the host reference */
                        switch (kind) {
                        case AG: RTRY(dc->ops->all_gather(dc, n ? ds : NULL, n ? dr : NULL, n, dt, queue)); break;
                        case RS: RTRY(dc->ops->reduce_scatter(dc, n ? ds : NULL, n ? dr : NULL, n, dt, (zero_op)op, queue)); break;
                        case AR: RTRY(dc->ops->all_reduce(dc, n ? ds : NULL, n ? dr : NULL, n, dt, (zero_op)op, queue)); break;
                        default: RTRY(dc->ops->broadcast(dc, n ? dr : NULL, n, dt, root, queue)); break;
                        }
                        switch (kind) {
                        case AG: RTRY(comm->ops->all_gather(comm, hs, hr, n, dt, NULL)); break;
                        case RS: RTRY(comm->ops->reduce_scatter(comm, hs, hr, n, dt, (zero_op)op, NULL)); break;
                        case AR: RTRY(comm->ops->all_reduce(comm, hs, hr, n, dt, (zero_op)op, NULL)); break;
                        default: RTRY(comm->ops->broadcast(comm, hr, n, dt, root, NULL)); break;
                        }
                        if (out_n) RTRY(dev->ops->download(dev, cq, hout, dr, out_n * es));
                        RTRY(dev->ops->sync(dev, cq));
                        if (!same(dt, hout, hr, out_n, nan_ok, &where)) {
                            sweep_fail(s, "N=%d rank %d %s %s %s n=%zu %s: element %zu differs", W, rank, KIND[kind],
                                       zero_dtype_name(dt), op ? "max" : "sum", n, inplace ? "in place" : "",
                                       where);
                            res = ZERO_ERROR_MISMATCH;
                            goto done;
                        }
                        if (rank == 0) s->cases++;
                    }
    RTRY(dc->ops->barrier(dc));
done:
    if (dsend) dev->ops->free(dev, dsend);
    if (drecv) dev->ops->free(dev, drecv);
    zero_comm_destroy(dc);
    zero_device_destroy(dev);
    free(hin);
    free(href);
    free(hout);
    return res;
}

ZT_TEST(test_collectives_vs_local)
{
    static const int worlds[] = {1, 2, 3, 4, 8};
    int wi;
    for (wi = 0; wi < 5; wi++) {
        sweep s;
        zero_result r;
        memset(&s, 0, sizeof s);
        pthread_mutex_init(&s.mu, NULL);
        s.world = worlds[wi];
        s.quick = zt_quick();
        if (s.quick && worlds[wi] > 4) continue;
        r = zero_local_run(worlds[wi], sweep_rank, &s);
        ZT_CHECKF(r == ZERO_OK && s.failures == 0, "N=%d: %s (%s)", worlds[wi], s.msg, zero_last_error());
        ZT_CHECKF(s.cases > 100, "N=%d: only %ld cases ran", worlds[wi], s.cases);
        pthread_mutex_destroy(&s.mu);
    }
}

/* ---- disagreement, invalid arguments, timeout ---- */

typedef struct misuse {
    zero_result got[MAXW][5];
    char tag_err[MAXW][512]; /* case 4's message */
    double ms;
    int timeout_ms; /* longer under ZT_QUICK (sanitizers slow everything down) */
} misuse;

static zero_result misuse_rank(int rank, zero_comm *comm, void *user)
{
    misuse *m = (misuse *)user;
    zero_device *dev = NULL;
    zero_comm *dc = NULL;
    void *buf = NULL;
    zero_result r = zero_cuda_device_create(NULL, &dev);
    if (r == ZERO_OK) r = zero_cuda_local_comm_create(comm, dev, &dc);
    if (r == ZERO_OK) r = dev->ops->alloc(dev, 4096, ZERO_MEM_SCRATCH, &buf);
    if (r != ZERO_OK) goto done;
    /* 0: numel disagrees on rank 1 */
    m->got[rank][0] = dc->ops->all_reduce(dc, buf, buf, rank == 1 ? 8 : 16, ZERO_F32, ZERO_OP_SUM, NULL);
    /* 1: rank 0 passes NULL with numel > 0 */
    m->got[rank][1] = dc->ops->all_reduce(dc, rank == 0 ? NULL : buf, buf, 16, ZERO_F32, ZERO_OP_SUM, NULL);
    /* 2: the group is still usable */
    m->got[rank][2] = dc->ops->all_gather(dc, buf, (char *)buf + 1024, 8, ZERO_F64, NULL);
    if (m->got[rank][2] == ZERO_OK) m->got[rank][2] = dc->ops->barrier(dc);
    /* 4: equal arguments, different engine tags (rank r says group r): MISMATCH naming both */
    dc->tag.group = rank;
    dc->tag.role = ZERO_ROLE_GATHER;
    dc->tag.seq = 5;
    m->got[rank][4] = dc->ops->all_gather(dc, buf, (char *)buf + 1024, 8, ZERO_F64, NULL);
    snprintf(m->tag_err[rank], sizeof m->tag_err[rank], "%s", zero_last_error());
    memset(&dc->tag, 0, sizeof dc->tag);
    /* 3: rank 1 never comes: rank 0 times out (the local comm's timeout) */
    if (rank == 0) {
        double t0 = zt_now_ms();
        m->got[0][3] = dc->ops->broadcast(dc, buf, 16, ZERO_F32, 0, NULL);
        m->ms = zt_now_ms() - t0;
    } else {
        zt_sleep_ms(3 * m->timeout_ms);
        m->got[1][3] = ZERO_OK;
    }
done:
    if (buf) dev->ops->free(dev, buf);
    zero_comm_destroy(dc);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(test_misuse_and_timeout)
{
    misuse m;
    zero_local_desc desc;
    memset(&m, 0, sizeof m);
    memset(&desc, 0, sizeof desc);
    desc.world = 2;
    desc.timeout_ms = m.timeout_ms = zt_quick() ? 3000 : 1000;
    (void)zero_local_run_desc(&desc, misuse_rank, &m);
    ZT_CHECKF(m.got[0][0] == ZERO_ERROR_MISMATCH && m.got[1][0] == ZERO_ERROR_MISMATCH, "disagreement: %d %d",
              m.got[0][0], m.got[1][0]);
    ZT_CHECKF(m.got[0][1] == ZERO_ERROR_INVALID_ARGUMENT && m.got[1][1] == ZERO_ERROR_MISMATCH, "invalid: %d %d",
              m.got[0][1], m.got[1][1]);
    ZT_CHECKF(m.got[0][2] == ZERO_OK && m.got[1][2] == ZERO_OK, "after errors: %d %d", m.got[0][2], m.got[1][2]);
    for (int r = 0; r < 2; r++)
        ZT_CHECKF(m.got[r][4] == ZERO_ERROR_MISMATCH &&
                      strstr(m.tag_err[r], "rank 0 all_gather group 0 (gather, seq 5) vs rank 1 all_gather group 1 "
                                           "(gather, seq 5)") != NULL,
                  "tags, rank %d: %d: %s", r, m.got[r][4], m.tag_err[r]);
    ZT_CHECKF(m.got[0][3] == ZERO_ERROR_TIMEOUT, "timeout: %d (%s)", m.got[0][3], zero_result_string(m.got[0][3]));
    ZT_CHECKF(m.ms < 2.5 * m.timeout_ms, "the timeout (%d ms) took %.0f ms", m.timeout_ms, m.ms);
}

/* ---- create's checks ---- */

static void fake_destroy(zero_comm *c) { (void)c; }

ZT_TEST(test_create_checks)
{
    zero_comm_ops ops;
    zero_comm fake;
    zero_comm *out = (zero_comm *)1;
    zero_device *dev = NULL, *host = NULL;
    memset(&ops, 0, sizeof ops);
    ops.name = "nccl";
    ops.destroy = fake_destroy;
    fake.ops = &ops;
    fake.impl = NULL;
    fake.rank = 0;
    fake.world = 1;
    ZT_CHECK(zero_cuda_device_create(NULL, &dev) == ZERO_OK);
    ZT_CHECK(zero_host_device_create(NULL, &host) == ZERO_OK);
    ZT_CHECK(zero_cuda_local_comm_create(&fake, dev, &out) == ZERO_ERROR_UNSUPPORTED && out == NULL);
    ops.name = "local";
    ZT_CHECK(zero_cuda_local_comm_create(&fake, host, &out) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_cuda_local_comm_create(NULL, dev, &out) == ZERO_ERROR_INVALID_ARGUMENT);
    fake.world = ZERO_CUDA_MAX_RANKS + 1;
    ZT_CHECK(zero_cuda_local_comm_create(&fake, dev, &out) == ZERO_ERROR_UNSUPPORTED);
    zero_device_destroy(dev);
    zero_device_destroy(host);
}

/* ---- a long run of small collectives on two queues: no wait binds to a stale record ---- */

static zero_result churn_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_comm *dc = NULL;
    float *buf = NULL, h[64];
    zero_result r = zero_cuda_device_create(NULL, &dev);
    int it, i;
    (void)user;
    if (r == ZERO_OK) r = zero_cuda_local_comm_create(comm, dev, &dc);
    if (r == ZERO_OK) r = dev->ops->alloc(dev, 64 * 4 * 8, ZERO_MEM_SCRATCH, (void **)&buf);
    for (it = 0; it < (zt_quick() ? 100 : 2000) && r == ZERO_OK; it++) {
        /* each rank contributes it + rank; alternate the queue so the events cross streams */
        zero_queue q = (it & 1) ? ZERO_QUEUE_COMM : ZERO_QUEUE_COMPUTE;
        for (i = 0; i < 64; i++) h[i] = (float)(it + rank);
        r = dev->ops->upload(dev, q, buf, h, sizeof h);
        if (r == ZERO_OK) r = dc->ops->all_reduce(dc, buf, buf, 64, ZERO_F32, ZERO_OP_SUM, dev->ops->native_queue(dev, q));
        if (r == ZERO_OK) r = dev->ops->download(dev, q, h, buf, sizeof h);
        if (r == ZERO_OK) r = dev->ops->sync(dev, q);
        if (r == ZERO_OK) {
            float want = 0.0f;
            for (i = 0; i < comm->world; i++) want += (float)(it + i);
            for (i = 0; i < 64; i++)
                if (h[i] != want) r = zero__fail(ZERO_ERROR_MISMATCH, "iteration %d: %g, want %g", it, (double)h[i], (double)want);
        }
    }
    if (buf) dev->ops->free(dev, buf);
    zero_comm_destroy(dc);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(test_churn)
{
    zero_result r = zero_local_run(zt_quick() ? 2 : 4, churn_rank, NULL);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
}

/* ---- split and all_to_all ----

   At N = 4 and 8: the device comm split into nodes of 2 (color rank / 2, key rank), across
   nodes with reversed keys (color rank % 2, key -rank), and a group with rank 0 left out
   (color -1: NULL). Each child has the host split's rank and world; its all_reduce (fp32
   sum with NaN and inf) equals the host child's, bit for bit; its all_to_all at 3 sizes and
   4 dtypes puts block 'me' of every peer's data in block 'peer' (the values regenerated
   here from the peer's seed: a pure copy). The parent is destroyed before the children on
   odd ranks, after on even ones; an all_to_all with send and recv overlapping is refused on
   every rank and the comm stays usable. */
static zero_result split_rank(int rank, zero_comm *comm, void *user)
{
    static const size_t sizes[] = {1, 17, 1000};
    const int W = comm->world;
    zero_device *dev = NULL;
    zero_comm *dc = NULL, *kids[3] = {NULL, NULL, NULL}, *hkids[3] = {NULL, NULL, NULL};
    zero_result r = zero_cuda_device_create(NULL, &dev);
    unsigned char *hin = (unsigned char *)malloc((size_t)W * 1000 * 8), *hout = (unsigned char *)malloc((size_t)W * 1000 * 8),
                  *want = (unsigned char *)malloc((size_t)W * 1000 * 8);
    char *dsend = NULL, *drecv = NULL;
    int k, di, si, p;
    (void)user;
    if (!hin || !hout || !want) r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host buffers");
    if (r == ZERO_OK) r = zero_cuda_local_comm_create(comm, dev, &dc);
    if (r == ZERO_OK) r = dev->ops->alloc(dev, (size_t)W * 1000 * 8, ZERO_MEM_BUCKET, (void **)&dsend);
    if (r == ZERO_OK) r = dev->ops->alloc(dev, (size_t)W * 1000 * 8, ZERO_MEM_BUCKET, (void **)&drecv);
    for (k = 0; k < 3 && r == ZERO_OK; k++) {
        int color = k == 0 ? rank / 2 : k == 1 ? rank % 2 : (rank == 0 ? -1 : 0);
        int key = k == 1 ? -rank : rank;
        r = zero_comm_split(dc, color, key, &kids[k]);
        if (r == ZERO_OK) r = zero_comm_split(comm, color, key, &hkids[k]); /* the host reference */
        if (r == ZERO_OK && (color < 0) != (kids[k] == NULL))
            r = zero__fail(ZERO_ERROR_MISMATCH, "split %d: color %d gave %s", k, color, kids[k] ? "a comm" : "NULL");
        if (r == ZERO_OK && kids[k] &&
            (kids[k]->rank != hkids[k]->rank || kids[k]->world != hkids[k]->world))
            r = zero__fail(ZERO_ERROR_MISMATCH, "split %d: rank %d of %d, the host split's %d of %d", k,
                           kids[k]->rank, kids[k]->world, hkids[k]->rank, hkids[k]->world);
    }
    if (r == ZERO_OK && (rank & 1)) { /* odd ranks drop the parent before using the children */
        zero_comm_destroy(dc);
        dc = NULL;
    }
    for (k = 0; k < 3 && r == ZERO_OK; k++) {
        zero_comm *kc = kids[k], *hc = hkids[k];
        void *q = dev->ops->native_queue(dev, ZERO_QUEUE_COMM);
        size_t where = 0;
        if (!kc) continue;
        /* all_reduce: the host child's bits */
        gen(ZERO_F32, hin, 1000, (uint64_t)(k * 100 + rank), 1);
        r = dev->ops->upload(dev, ZERO_QUEUE_COMM, dsend, hin, 4000);
        if (r == ZERO_OK) r = kc->ops->all_reduce(kc, dsend, drecv, 1000, ZERO_F32, ZERO_OP_SUM, q);
        if (r == ZERO_OK) r = hc->ops->all_reduce(hc, hin, want, 1000, ZERO_F32, ZERO_OP_SUM, NULL);
        if (r == ZERO_OK) r = dev->ops->download(dev, ZERO_QUEUE_COMM, hout, drecv, 4000);
        if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMM);
        if (r == ZERO_OK && !same(ZERO_F32, hout, want, 1000, 1, &where))
            r = zero__fail(ZERO_ERROR_MISMATCH, "split %d rank %d: all_reduce element %zu differs from the host's", k,
                           rank, where);
        for (di = 0; di < 4 && r == ZERO_OK; di++)
            for (si = 0; si < 3 && r == ZERO_OK; si++) {
                zero_dtype dt = DTS[di];
                size_t n = sizes[si], es = zero_dtype_size(dt), wn = (size_t)kc->world * n;
                uint64_t seed = (uint64_t)(1000 + k * 64 + di * 8 + si) * 64;
                gen(dt, hin, wn, seed + (uint64_t)kc->rank, 1);
                r = dev->ops->upload(dev, ZERO_QUEUE_COMM, dsend, hin, wn * es);
                if (r == ZERO_OK) r = kc->ops->all_to_all(kc, dsend, drecv, n, dt, q);
                if (r == ZERO_OK) r = dev->ops->download(dev, ZERO_QUEUE_COMM, hout, drecv, wn * es);
                if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMM);
                for (p = 0; p < kc->world && r == ZERO_OK; p++) { /* peer p's block 'me' */
                    gen(dt, want, wn, seed + (uint64_t)p, 1);
                    if (memcmp(hout + (size_t)p * n * es, want + (size_t)kc->rank * n * es, n * es) != 0)
                        r = zero__fail(ZERO_ERROR_MISMATCH, "split %d rank %d %s n=%zu: block from peer %d differs", k,
                                       kc->rank, zero_dtype_name(dt), n, p);
                }
            }
        if (r == ZERO_OK) { /* overlapping buffers: refused on every rank, then the comm works */
            zero_result bad = kc->ops->all_to_all(kc, dsend, dsend + 4, 10, ZERO_F32, q);
            if (bad != ZERO_ERROR_INVALID_ARGUMENT && bad != ZERO_ERROR_MISMATCH)
                r = zero__fail(ZERO_ERROR_MISMATCH, "split %d: overlapping all_to_all gave %d", k, (int)bad);
            if (r == ZERO_OK) r = kc->ops->all_to_all(kc, dsend, drecv, 10, ZERO_F32, q);
            if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMM);
        }
    }
    for (k = 0; k < 3; k++) {
        zero_comm_destroy(kids[k]);
        zero_comm_destroy(hkids[k]);
    }
    if (dsend) dev->ops->free(dev, dsend);
    if (drecv) dev->ops->free(dev, drecv);
    zero_comm_destroy(dc);
    zero_device_destroy(dev);
    free(hin);
    free(hout);
    free(want);
    return r;
}

ZT_TEST(test_split_and_all_to_all)
{
    static const int worlds[] = {4, 8};
    int wi;
    for (wi = 0; wi < (zt_quick() ? 1 : 2); wi++) {
        zero_result r = zero_local_run(worlds[wi], split_rank, NULL);
        ZT_CHECKF(r == ZERO_OK, "N=%d: %s", worlds[wi], zero_last_error());
    }
}

int main(void)
{
    {
        int rc = zt_gpu_probe(NTESTS); /* skip only without a GPU */
        if (rc >= 0) return rc;
    }
    ZT_RUN(test_create_checks);
    ZT_RUN(test_collectives_vs_local);
    ZT_RUN(test_misuse_and_timeout);
    ZT_RUN(test_churn);
    ZT_RUN(test_split_and_all_to_all);
    return zt_summary();
}
