/* Local comm implementation (section of zero.h): N ranks as threads, one mutex and one
   condition variable per group.

   A collective is a sequence of sync points (a generation barrier). At the first, every rank
   posts its call (kind, numel, dtype, op, root, buffers) and the last rank to arrive checks
   that all posts agree, so every rank reads the same verdict. Between two sync points the
   ranks read each other's buffers without the lock (a "data phase"; the mutex hand-offs at
   the sync points order those reads after the posts and before the buffers are reused):

       barrier         post
       all_gather      post, copy every block, end
       reduce_scatter  post, reduce block 'rank' of every send, end
       broadcast       post, copy from the root, end
       all_reduce      post, reduce slice 'rank' into recv, mid, copy the other slices
                       from their owners' recv, end

   so every output element is reduced exactly once, and in-place calls are safe (a rank only
   writes what no peer reads in the same phase). Posts are double-buffered by the parity of
   the collective's sequence number: a rank can post call k+1 while a peer still reads the
   posts of call k, and cannot post k+2 before every peer has arrived at k+1.

   Failure: a wait that passes its deadline, zero_local_abort() or a destroyed comm breaks
   the group (broken != ZERO_OK, once, with a message); waiters wake and return that code,
   and later calls fail at once. 'active' counts the ranks inside a data phase; a rank leaves
   with an error only when it is 0, so no peer still reads a buffer its caller may free. */

#include <pthread.h>
#include <time.h>

enum {
    ZERO__LC_BARRIER = 1,
    ZERO__LC_ALL_GATHER,
    ZERO__LC_REDUCE_SCATTER,
    ZERO__LC_ALL_REDUCE,
    ZERO__LC_BROADCAST
};

enum { ZERO__SYNC_POST, ZERO__SYNC_MID, ZERO__SYNC_END };

/* Elements reduced per tile (fp32 / fp64 accumulators on the stack). */
#define ZERO__LOCAL_TILE 512

typedef struct zero__local_post {
    int kind;
    int bad; /* this rank's own arguments were invalid */
    zero_dtype dtype;
    zero_op op;
    int root;
    size_t numel;
    const void *send;
    void *recv;
} zero__local_post;

struct zero_local_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zero_allocator allocator;
    zero_simd simd; /* for the fp16/bf16 <-> fp32 tiles, resolved once */
    int world;
    int timeout_ms;
    int arrived;              /* ranks waiting at the current sync point                 */
    unsigned long long gen;   /* sync points completed                                   */
    int active;               /* ranks inside a data phase                               */
    zero_result broken;       /* ZERO_OK, or why every call now fails                    */
    char broken_msg[256];
    int live;                 /* comms alive                                             */
    int orphaned;             /* zero_local_group_destroy() was called                   */
    unsigned char *here;      /* [world]: arrived at the current sync point              */
    unsigned char *has_comm;  /* [world]                                                 */
    zero__local_post *posts;  /* [2][world]: by parity of the collective's sequence       */
    int verdict_ok[2];
    char verdict_msg[2][320];
};

typedef struct zero__local_comm {
    zero_comm base;
    zero_local_group *group;
    unsigned long long seq; /* collectives this rank has called */
    const void **srcs;      /* [world]: the inputs of one reduction */
} zero__local_comm;

static void zero__local_destroy(zero_comm *comm);

static const char *zero__local_kind_name(int kind)
{
    switch (kind) {
    case ZERO__LC_BARRIER: return "barrier";
    case ZERO__LC_ALL_GATHER: return "all_gather";
    case ZERO__LC_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO__LC_ALL_REDUCE: return "all_reduce";
    case ZERO__LC_BROADCAST: return "broadcast";
    }
    return "?";
}

/* "all_reduce(numel 10, f32, sum)" */
static void zero__local_describe(char *buf, size_t size, const zero__local_post *p)
{
    const char *name = zero__local_kind_name(p->kind);
    if (p->bad)
        snprintf(buf, size, "%s(invalid arguments)", name);
    else if (p->kind == ZERO__LC_BARRIER)
        snprintf(buf, size, "barrier()");
    else if (p->kind == ZERO__LC_BROADCAST)
        snprintf(buf, size, "broadcast(numel %zu, %s, root %d)", p->numel, zero_dtype_name(p->dtype),
                 p->root);
    else if (p->kind == ZERO__LC_ALL_GATHER)
        snprintf(buf, size, "all_gather(numel %zu, %s)", p->numel, zero_dtype_name(p->dtype));
    else
        snprintf(buf, size, "%s(numel %zu, %s, %s)", name, p->numel, zero_dtype_name(p->dtype),
                 p->op == ZERO_OP_MAX ? "max" : "sum");
}

static int zero__local_same(const zero__local_post *a, const zero__local_post *b)
{
    return !a->bad && !b->bad && a->kind == b->kind && a->numel == b->numel &&
           a->dtype == b->dtype && a->op == b->op && a->root == b->root;
}

/* Under the lock, by the last rank to post: do all posts of parity 'par' agree? */
static int zero__local_judge(zero_local_group *g, int par, unsigned long long seq)
{
    const zero__local_post *p = g->posts + (size_t)par * (size_t)g->world;
    char a[96], b[96];
    int r;
    for (r = 0; r < g->world; r++)
        if (p[r].bad) {
            snprintf(g->verdict_msg[par], sizeof g->verdict_msg[par],
                     "collective #%llu: rank %d passed invalid arguments to %s", seq, r,
                     zero__local_kind_name(p[r].kind));
            return 0;
        }
    for (r = 1; r < g->world; r++)
        if (!zero__local_same(&p[0], &p[r])) {
            zero__local_describe(a, sizeof a, &p[0]);
            zero__local_describe(b, sizeof b, &p[r]);
            snprintf(g->verdict_msg[par], sizeof g->verdict_msg[par],
                     "ranks disagree at collective #%llu: rank 0 called %s, rank %d called %s",
                     seq, a, r, b);
            return 0;
        }
    g->verdict_msg[par][0] = '\0';
    return 1;
}

/* Under the lock: breaks the group once (later causes are ignored) and wakes everyone. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void zero__local_break(zero_local_group *g, zero_result why, const char *fmt, ...)
{
    va_list ap;
    if (g->broken != ZERO_OK) return;
    g->broken = why;
    va_start(ap, fmt);
    vsnprintf(g->broken_msg, sizeof g->broken_msg, fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&g->cv); /* cannot fail on an initialised cond */
}

static void zero__local_deadline(const zero_local_group *g, struct timespec *ts)
{
#if defined(__APPLE__)
    clock_gettime(CLOCK_REALTIME, ts);
#else
    clock_gettime(CLOCK_MONOTONIC, ts); /* the cond waits on this clock (condattr) */
#endif
    ts->tv_sec += g->timeout_ms / 1000;
    ts->tv_nsec += (long)(g->timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Under the lock: the error of a broken group, once no peer is inside a data phase. */
static zero_result zero__local_fail_broken(zero_local_group *g, const char *what, int rank)
{
    zero_result why = g->broken;
    while (g->active > 0)
        if (pthread_cond_wait(&g->cv, &g->mu) != 0) break; /* cannot fail on a held mutex */
    pthread_mutex_unlock(&g->mu);
    return zero__fail(why, "%s (rank %d): group is broken: %s", what, rank, g->broken_msg);
}

/* One sync point for rank c. At ZERO__SYNC_POST the rank publishes *post first; the
   verdict on all posts is then in *ok. MID and END close a data phase; POST (when the
   verdict is good and the call moves data) and MID open one. */
static zero_result zero__local_sync(zero__local_comm *c, int point, const zero__local_post *post,
                                    int *ok)
{
    zero_local_group *g = c->group;
    int rank = c->base.rank, world = g->world, par = (int)(c->seq & 1u), rc, r;
    const char *what = zero__local_kind_name(post->kind);
    unsigned long long my_gen;
    struct timespec deadline;
    zero__local_deadline(g, &deadline);
    rc = pthread_mutex_lock(&g->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_COMM, "%s (rank %d): pthread_mutex_lock failed: %s", what, rank,
                          strerror(rc));
    if (point != ZERO__SYNC_POST && --g->active == 0 && g->broken != ZERO_OK)
        pthread_cond_broadcast(&g->cv); /* a failing peer waits for active == 0 */
    if (g->broken != ZERO_OK) return zero__local_fail_broken(g, what, rank);
    if (point == ZERO__SYNC_POST) g->posts[(size_t)par * (size_t)world + (size_t)rank] = *post;
    g->here[rank] = 1;
    if (++g->arrived == world) {
        g->arrived = 0;
        memset(g->here, 0, (size_t)world);
        g->gen++;
        if (point == ZERO__SYNC_POST) {
            g->verdict_ok[par] = zero__local_judge(g, par, c->seq);
            g->active = g->verdict_ok[par] && post->kind != ZERO__LC_BARRIER ? world : 0;
        } else if (point == ZERO__SYNC_MID) {
            g->active = world;
        }
        pthread_cond_broadcast(&g->cv);
    } else {
        my_gen = g->gen;
        while (g->gen == my_gen) {
            if (g->broken != ZERO_OK) return zero__local_fail_broken(g, what, rank);
            rc = pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
            if (g->gen != my_gen || g->broken != ZERO_OK) continue;
            if (rc == ETIMEDOUT) {
                char missing[128];
                size_t used = 0;
                missing[0] = '\0';
                for (r = 0; r < world && used + 8 < sizeof missing; r++)
                    if (!g->here[r])
                        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                                 used ? ", " : "", r);
                zero__local_break(g, ZERO_ERROR_TIMEOUT,
                                  "rank %d timed out after %d ms in %s #%llu waiting for rank(s) %s",
                                  rank, g->timeout_ms, what, c->seq, missing);
            } else if (rc != 0) {
                zero__local_break(g, ZERO_ERROR_COMM, "rank %d: pthread_cond_timedwait failed: %s",
                                  rank, strerror(rc));
            }
        }
    }
    if (ok) *ok = g->verdict_ok[par];
    pthread_mutex_unlock(&g->mu);
    return ZERO_OK;
}

/* ---- the data phases ---- */

static void zero__local_load(float *out, const void *src, zero_dtype dtype, size_t n,
                             zero_simd simd)
{
    if (dtype == ZERO_F32) memcpy(out, src, n * sizeof(float));
    else zero_convert(out, ZERO_F32, src, dtype, n, simd); /* arguments valid: cannot fail */
}

/* dst[i] = op over s = 0..nsrc-1 of src[s][i], in rank order, accumulated in fp32 (fp64 for
   F64), rounded once. Tile by tile: all inputs of a tile are read before its output is
   written, so dst may be one of the inputs. */
static void zero__local_reduce(void *dst, const void *const *src, int nsrc, size_t numel,
                               zero_dtype dtype, zero_op op, zero_simd simd)
{
    size_t es = zero_dtype_size(dtype), base, n, i;
    int s;
    if (nsrc == 1) {
        if (dst != src[0]) memcpy(dst, src[0], numel * es);
        return;
    }
    for (base = 0; base < numel; base += n) {
        n = numel - base < ZERO__LOCAL_TILE ? numel - base : ZERO__LOCAL_TILE;
        if (dtype == ZERO_F64) {
            double acc[ZERO__LOCAL_TILE], x[ZERO__LOCAL_TILE];
            memcpy(acc, (const double *)src[0] + base, n * sizeof(double));
            for (s = 1; s < nsrc; s++) {
                memcpy(x, (const double *)src[s] + base, n * sizeof(double));
                if (op == ZERO_OP_SUM)
                    for (i = 0; i < n; i++) acc[i] += x[i];
                else
                    for (i = 0; i < n; i++)
                        if (x[i] > acc[i] || x[i] != x[i]) acc[i] = acc[i] != acc[i] ? acc[i] : x[i];
            }
            memcpy((double *)dst + base, acc, n * sizeof(double));
        } else {
            float acc[ZERO__LOCAL_TILE], x[ZERO__LOCAL_TILE];
            const unsigned char *in;
            zero__local_load(acc, (const unsigned char *)src[0] + base * es, dtype, n, simd);
            for (s = 1; s < nsrc; s++) {
                in = (const unsigned char *)src[s] + base * es;
                zero__local_load(x, in, dtype, n, simd);
                if (op == ZERO_OP_SUM)
                    for (i = 0; i < n; i++) acc[i] += x[i];
                else
                    for (i = 0; i < n; i++)
                        if (x[i] > acc[i] || x[i] != x[i]) acc[i] = acc[i] != acc[i] ? acc[i] : x[i];
            }
            if (dtype == ZERO_F32) memcpy((float *)dst + base, acc, n * sizeof(float));
            else zero_convert((unsigned char *)dst + base * es, dtype, acc, ZERO_F32, n, simd);
        }
    }
}

/* All_reduce's slice of rank r: [off, off + len), in whole cache lines where numel allows. */
static void zero__local_slice(size_t numel, size_t es, int world, int r, size_t *off, size_t *len)
{
    size_t line = 64 / es, chunk = (numel + (size_t)world - 1) / (size_t)world;
    chunk = (chunk + line - 1) / line * line;
    *off = chunk * (size_t)r < numel ? chunk * (size_t)r : numel;
    *len = numel - *off < chunk ? numel - *off : chunk;
}

/* ---- the collectives ---- */

static zero__local_comm *zero__local_get(zero_comm *comm)
{
    if (!comm || !comm->ops || comm->ops->destroy != zero__local_destroy || !comm->impl) return NULL;
    return (zero__local_comm *)comm->impl;
}

/* Validates this rank's arguments into post->bad and 'why'. */
static void zero__local_check(zero__local_post *p, const zero_local_group *g, char *why,
                              size_t why_size)
{
    size_t es = zero_dtype_size(p->dtype), total = p->numel, bytes;
    const char *name = zero__local_kind_name(p->kind);
    p->bad = 1;
    if (p->kind == ZERO__LC_BARRIER) {
        p->bad = 0;
        return;
    }
    if (es == 0) {
        snprintf(why, why_size, "%s: unknown dtype %d", name, (int)p->dtype);
        return;
    }
    if (p->op != ZERO_OP_SUM && p->op != ZERO_OP_MAX) {
        snprintf(why, why_size, "%s: unknown op %d", name, (int)p->op);
        return;
    }
    if (p->root < 0 || p->root >= g->world) {
        snprintf(why, why_size, "%s: root = %d with world = %d", name, p->root, g->world);
        return;
    }
    if ((p->kind == ZERO__LC_ALL_GATHER || p->kind == ZERO__LC_REDUCE_SCATTER) &&
        zero__mul_size(p->numel, (size_t)g->world, &total) != 0) {
        snprintf(why, why_size, "%s: numel %zu times world %d overflows", name, p->numel, g->world);
        return;
    }
    if (zero__mul_size(total, es, &bytes) != 0) {
        snprintf(why, why_size, "%s: %zu elements of %s overflow size_t bytes", name, total,
                 zero_dtype_name(p->dtype));
        return;
    }
    if (p->numel > 0 && (!p->send || !p->recv)) {
        snprintf(why, why_size, "%s: %s is NULL with numel = %zu", name,
                 !p->send ? (p->kind == ZERO__LC_BROADCAST ? "buf" : "send") : "recv", p->numel);
        return;
    }
    p->bad = 0;
}

static zero_result zero__local_collective(zero_comm *comm, zero__local_post *p)
{
    zero__local_comm *c = zero__local_get(comm);
    zero_local_group *g;
    char why[160];
    const char *name = zero__local_kind_name(p->kind);
    size_t es, n, off, len;
    int ok = 0, rank, world, s;
    zero_result res;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: comm is not a local comm", name);
    g = c->group;
    rank = comm->rank;
    world = g->world;
    why[0] = '\0';
    zero__local_check(p, g, why, sizeof why);
    c->seq++;
    res = zero__local_sync(c, ZERO__SYNC_POST, p, &ok);
    if (res != ZERO_OK) return res;
    if (p->bad) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s", why);
    if (!ok)
        return zero__fail(ZERO_ERROR_MISMATCH, "%s (rank %d): %s", name, rank,
                          g->verdict_msg[c->seq & 1u]);
    if (p->kind == ZERO__LC_BARRIER) return ZERO_OK;

    {
        const zero__local_post *peer = g->posts + (size_t)(c->seq & 1u) * (size_t)world;
        es = zero_dtype_size(p->dtype);
        n = p->numel;
        switch (p->kind) {
        case ZERO__LC_ALL_GATHER:
            for (s = 0; s < world; s++) {
                int from = (rank + s) % world; /* spread the readers over the sources */
                unsigned char *dst = (unsigned char *)p->recv + (size_t)from * n * es;
                if (n && dst != peer[from].send) memcpy(dst, peer[from].send, n * es);
            }
            break;
        case ZERO__LC_REDUCE_SCATTER:
            for (s = 0; s < world; s++)
                c->srcs[s] = (const unsigned char *)peer[s].send + (size_t)rank * n * es;
            if (n) zero__local_reduce(p->recv, c->srcs, world, n, p->dtype, p->op, g->simd);
            break;
        case ZERO__LC_ALL_REDUCE:
            zero__local_slice(n, es, world, rank, &off, &len);
            for (s = 0; s < world; s++) c->srcs[s] = (const unsigned char *)peer[s].send + off * es;
            if (len)
                zero__local_reduce((unsigned char *)p->recv + off * es, c->srcs, world, len, p->dtype,
                                   p->op, g->simd);
            res = zero__local_sync(c, ZERO__SYNC_MID, p, NULL);
            if (res != ZERO_OK) return res;
            for (s = 1; s < world; s++) {
                int from = (rank + s) % world;
                zero__local_slice(n, es, world, from, &off, &len);
                if (len)
                    memcpy((unsigned char *)p->recv + off * es,
                           (const unsigned char *)peer[from].recv + off * es, len * es);
            }
            break;
        case ZERO__LC_BROADCAST:
            if (rank != p->root && n && p->recv != peer[p->root].recv)
                memcpy(p->recv, peer[p->root].recv, n * es);
            break;
        }
    }
    return zero__local_sync(c, ZERO__SYNC_END, p, NULL);
}

static zero_result zero__local_all_gather(zero_comm *comm, const void *send, void *recv,
                                          size_t send_numel, zero_dtype dtype, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_ALL_GATHER;
    p.send = send;
    p.recv = recv;
    p.numel = send_numel;
    p.dtype = dtype;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_reduce_scatter(zero_comm *comm, const void *send, void *recv,
                                              size_t recv_numel, zero_dtype dtype, zero_op op,
                                              void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_REDUCE_SCATTER;
    p.send = send;
    p.recv = recv;
    p.numel = recv_numel;
    p.dtype = dtype;
    p.op = op;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_all_reduce(zero_comm *comm, const void *send, void *recv,
                                          size_t numel, zero_dtype dtype, zero_op op, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_ALL_REDUCE;
    p.send = send;
    p.recv = recv;
    p.numel = numel;
    p.dtype = dtype;
    p.op = op;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_broadcast(zero_comm *comm, void *buf, size_t numel,
                                         zero_dtype dtype, int root, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_BROADCAST;
    p.send = buf;
    p.recv = buf;
    p.numel = numel;
    p.dtype = dtype;
    p.root = root;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_barrier(zero_comm *comm)
{
    zero__local_post p;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_BARRIER;
    return zero__local_collective(comm, &p);
}

/* ---- lifetime ---- */

static void zero__local_group_free(zero_local_group *g)
{
    zero_allocator a = g->allocator;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    zero__free(&a, g->posts);
    zero__free(&a, g->has_comm);
    zero__free(&a, g->here);
    zero__free(&a, g);
}

static void zero__local_destroy(zero_comm *comm)
{
    zero__local_comm *c = zero__local_get(comm);
    zero_local_group *g;
    int last;
    if (!c) return;
    g = c->group;
    pthread_mutex_lock(&g->mu);
    zero__local_break(g, ZERO_ERROR_COMM, "rank %d left the group (its comm was destroyed)",
                      comm->rank);
    g->has_comm[comm->rank] = 0;
    last = --g->live == 0 && g->orphaned;
    pthread_mutex_unlock(&g->mu);
    c->base.impl = NULL; /* a stale handle is then rejected, not followed */
    zero__free(&g->allocator, c->srcs);
    zero__free(&g->allocator, c);
    if (last) zero__local_group_free(g);
}

static const zero_comm_ops zero__local_ops = {
    "local",
    zero__local_destroy,
    zero__local_all_gather,
    zero__local_reduce_scatter,
    zero__local_all_reduce,
    zero__local_broadcast,
    zero__local_barrier,
    NULL,
    NULL,
};

ZERODEF zero_result zero_local_group_create(const zero_local_desc *desc, zero_local_group **out)
{
    zero_local_group *g;
    zero_allocator a;
    pthread_condattr_t attr;
    size_t w;
    int rc;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: desc is NULL");
    if (desc->world < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: world = %d (must be >= 1)",
                          desc->world);
    if (desc->timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_local_group_create: timeout_ms = %d (0 = default, else > 0)",
                          desc->timeout_ms);
    if ((desc->allocator.alloc != NULL) != (desc->allocator.free != NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_local_group_create: allocator needs both alloc and free, or neither");
    a = desc->allocator;
    w = (size_t)desc->world;
    g = (zero_local_group *)zero__alloc(&a, sizeof *g);
    if (!g) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_group_create: out of memory");
    memset(g, 0, sizeof *g);
    g->allocator = a;
    g->world = desc->world;
    g->timeout_ms = desc->timeout_ms ? desc->timeout_ms : 60000;
    g->simd = zero_simd_detect();
    g->here = (unsigned char *)zero__alloc(&a, w);
    g->has_comm = (unsigned char *)zero__alloc(&a, w);
    g->posts = (zero__local_post *)zero__alloc(&a, 2 * w * sizeof *g->posts);
    if (!g->here || !g->has_comm || !g->posts) {
        zero__free(&a, g->posts);
        zero__free(&a, g->has_comm);
        zero__free(&a, g->here);
        zero__free(&a, g);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_group_create: out of memory (world %d)",
                          desc->world);
    }
    memset(g->here, 0, w);
    memset(g->has_comm, 0, w);
    memset(g->posts, 0, 2 * w * sizeof *g->posts);
    rc = pthread_mutex_init(&g->mu, NULL);
    if (rc == 0) {
        rc = pthread_condattr_init(&attr);
        if (rc == 0) {
#if !defined(__APPLE__)
            rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
#endif
            if (rc == 0) rc = pthread_cond_init(&g->cv, &attr);
            pthread_condattr_destroy(&attr);
        }
        if (rc != 0) pthread_mutex_destroy(&g->mu);
    }
    if (rc != 0) {
        zero__free(&a, g->posts);
        zero__free(&a, g->has_comm);
        zero__free(&a, g->here);
        zero__free(&a, g);
        return zero__fail(ZERO_ERROR_COMM, "zero_local_group_create: pthread init failed: %s",
                          strerror(rc));
    }
    *out = g;
    return ZERO_OK;
}

ZERODEF void zero_local_group_destroy(zero_local_group *group)
{
    int now;
    if (!group) return;
    pthread_mutex_lock(&group->mu);
    group->orphaned = 1;
    now = group->live == 0;
    pthread_mutex_unlock(&group->mu);
    if (now) zero__local_group_free(group);
}

ZERODEF zero_result zero_local_comm_create(zero_local_group *group, int rank, zero_comm **out)
{
    zero__local_comm *c;
    zero_result res = ZERO_OK;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: out is NULL");
    *out = NULL;
    if (!group) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: group is NULL");
    if (rank < 0 || rank >= group->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: rank = %d with world = %d",
                          rank, group->world);
    c = (zero__local_comm *)zero__alloc(&group->allocator, sizeof *c);
    if (c) {
        memset(c, 0, sizeof *c);
        c->srcs = (const void **)zero__alloc(&group->allocator, (size_t)group->world * sizeof *c->srcs);
    }
    if (!c || !c->srcs) {
        if (c) zero__free(&group->allocator, c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_comm_create: out of memory");
    }
    c->base.ops = &zero__local_ops;
    c->base.impl = c;
    c->base.rank = rank;
    c->base.world = group->world;
    c->group = group;
    pthread_mutex_lock(&group->mu);
    if (group->has_comm[rank])
        res = zero__fail(ZERO_ERROR_INVALID_STATE, "zero_local_comm_create: rank %d already has a comm",
                         rank);
    else if (group->orphaned)
        res = zero__fail(ZERO_ERROR_INVALID_STATE, "zero_local_comm_create: the group was destroyed");
    if (res == ZERO_OK) {
        group->has_comm[rank] = 1;
        group->live++;
    }
    pthread_mutex_unlock(&group->mu);
    if (res != ZERO_OK) {
        zero__free(&group->allocator, c->srcs);
        zero__free(&group->allocator, c);
        return res;
    }
    *out = &c->base;
    return ZERO_OK;
}

ZERODEF void zero_comm_destroy(zero_comm *comm)
{
    if (comm && comm->ops && comm->ops->destroy) comm->ops->destroy(comm);
}

ZERODEF zero_result zero_local_abort(zero_comm *comm)
{
    zero__local_comm *c = zero__local_get(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_abort: comm is not a local comm");
    pthread_mutex_lock(&c->group->mu);
    zero__local_break(c->group, ZERO_ERROR_COMM, "rank %d called zero_local_abort", comm->rank);
    pthread_mutex_unlock(&c->group->mu);
    return ZERO_OK;
}

/* ---- zero_local_run ---- */

typedef struct zero__local_runner {
    zero_result (*fn)(int rank, zero_comm *comm, void *user);
    void *user;
    zero_comm *comm;
    zero_local_group *group;
    int rank;
    int first;     /* failed while the group was still whole: a root cause */
    zero_result result;
    char msg[512];
} zero__local_runner;

static void *zero__local_run_thread(void *arg)
{
    zero__local_runner *t = (zero__local_runner *)arg;
    zero_local_group *g = t->group;
    t->result = t->fn(t->rank, t->comm, t->user);
    if (t->result != ZERO_OK) {
        snprintf(t->msg, sizeof t->msg, "%s", zero_last_error());
        pthread_mutex_lock(&g->mu);
        t->first = g->broken == ZERO_OK;
        zero__local_break(g, ZERO_ERROR_COMM, "rank %d's function failed: %s: %s", t->rank,
                          zero_result_string(t->result), t->msg);
        pthread_mutex_unlock(&g->mu);
    }
    zero_comm_destroy(t->comm); /* peers still waiting for this rank fail, not hang */
    t->comm = NULL;
    return NULL;
}

ZERODEF zero_result zero_local_run_desc(const zero_local_desc *desc,
                                        zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                        void *user)
{
    zero_local_group *g = NULL;
    zero__local_runner *t;
    pthread_t *th;
    zero_result res;
    int r, started = 0, rc = 0, pick = -1;
    if (!desc || !fn)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_run: %s is NULL", desc ? "fn" : "desc");
    res = zero_local_group_create(desc, &g);
    if (res != ZERO_OK) return res;
    t = (zero__local_runner *)zero__alloc(&g->allocator, (size_t)desc->world * sizeof *t);
    th = (pthread_t *)zero__alloc(&g->allocator, (size_t)desc->world * sizeof *th);
    if (!t || !th) {
        zero__free(&g->allocator, th);
        zero__free(&g->allocator, t);
        zero_local_group_destroy(g);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_run: out of memory (world %d)", desc->world);
    }
    memset(t, 0, (size_t)desc->world * sizeof *t);
    for (r = 0; r < desc->world && res == ZERO_OK; r++) {
        t[r].fn = fn;
        t[r].user = user;
        t[r].group = g;
        t[r].rank = r;
        res = zero_local_comm_create(g, r, &t[r].comm);
    }
    for (r = 0; r < desc->world && res == ZERO_OK; r++) {
        rc = pthread_create(&th[r], NULL, zero__local_run_thread, &t[r]);
        if (rc != 0) {
            res = zero__fail(ZERO_ERROR_COMM, "zero_local_run: pthread_create for rank %d failed: %s", r,
                             strerror(rc));
            pthread_mutex_lock(&g->mu);
            zero__local_break(g, ZERO_ERROR_COMM, "zero_local_run could not start rank %d", r);
            pthread_mutex_unlock(&g->mu);
            break;
        }
        started++;
    }
    for (r = 0; r < started; r++) pthread_join(th[r], NULL);
    if (res == ZERO_OK) {
        for (r = 0; r < desc->world; r++)
            if (t[r].result != ZERO_OK && (pick < 0 || (t[r].first && !t[pick].first))) pick = r;
        if (pick >= 0)
            res = zero__fail(t[pick].result, "rank %d: %s", pick, t[pick].msg);
    }
    for (r = started; r < desc->world; r++) zero_comm_destroy(t[r].comm); /* never started */
    zero__free(&g->allocator, th);
    zero__free(&g->allocator, t);
    zero_local_group_destroy(g);
    return res;
}

ZERODEF zero_result zero_local_run(int world, zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                   void *user)
{
    zero_local_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.world = world;
    return zero_local_run_desc(&desc, fn, user);
}
