/* zero_cuda.h's host-side helpers that need no GPU, so this runs everywhere nvcc does:
   the vector/scalar split (zero_cuda__head). The kernels' conversions are zero.h's own
   integer converters (ZERO_HOSTDEV), checked on the CPU by tests/test_convert.c and on the
   GPU against the host device by test_cuda_kernels. */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "tests/zt.h"

#include <math.h>

ZT_TEST(test_vector_head)
{
    /* the first index where every pointer is 16-byte aligned, or -1 */
    char *base = (char *)(uintptr_t)0x10000;
    const void *p[3];
    size_t es[3] = {4, 4, 2};
    p[0] = base;
    p[1] = base + 64;
    p[2] = base + 32;
    ZT_CHECK(zero_cuda__head(p, es, 3) == 0);
    p[0] = base + 4; /* fp32 at element 1: aligned at elements 3, 7 */
    p[1] = base + 4;
    p[2] = base + 2; /* fp16 at element 1: aligned at element 7 */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 7);
    p[0] = base + 12;
    p[1] = base + 12;
    p[2] = base + 2; /* fp32: heads 1, 5; fp16: head 7: none common */
    ZT_CHECK(zero_cuda__head(p, es, 3) == -1);
    p[2] = base + 14; /* fp16: 14 + 2h = 16 -> h = 1; fp32: 12 + 4 = 16 -> h = 1 */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 1);
    p[1] = NULL; /* NULL pointers (no param) do not count */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 1);
    p[0] = base + 1; /* not even element-aligned */
    ZT_CHECK(zero_cuda__head(p, es, 1) == -1);
}


/* ---- host models of the GPU's index schemes, against the host device ----

   The sum-of-squares kernel, run on the CPU: the same table, piece lookup
   (zero_cuda__find_piece), staging (zero_cuda__sq_stage: raw bits loaded first, widened
   and squared after), lane adds (zero_cuda__sq_add), tile walk (2048 elements, thread t
   holding elements 8t..8t+7, lane k adding tile[8j + k] in j order, +0 past the end), lane
   tree and piece closing (zero_cuda__sq_close) as zero_cuda__sumsq_kernel; compared bit for
   bit with the host device's sumsq over the same buffers in the same order. */

template <int DT>
static void model_sumsq_launch(const zero_cuda__sq_table *tab, double *partials, double *running, int *flag)
{
    typedef typename zero_cuda__raw<DT>::T T;
    static double tile[ZERO_CUDA__SQ_TILE];
    size_t nblocks = tab->start[tab->n], g;
    for (g = 0; g < nblocks; g++) { /* launch blocks in any order: each is independent */
        int p = zero_cuda__find_piece(tab->start, tab->n, g), bad = 0, tt, t, k, j;
        const T *x = (const T *)tab->x[p];
        size_t numel = tab->numel[p];
        size_t begin = (tab->first_block[p] + (g - tab->start[p])) * ZERO_CUDA__SUMSQ_BLOCK;
        size_t len = numel - begin < ZERO_CUDA__SUMSQ_BLOCK ? numel - begin : ZERO_CUDA__SUMSQ_BLOCK;
        int ntiles = (int)((len + ZERO_CUDA__SQ_TILE - 1) / ZERO_CUDA__SQ_TILE);
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (tt = 0; tt < ntiles; tt++) {
            for (t = 0; t < ZERO_CUDA__THREADS; t++)
                for (k = 0; k < 8; k++) {
                    size_t i = begin + (size_t)tt * ZERO_CUDA__SQ_TILE + 8 * (size_t)t + (size_t)k;
                    T raw = i < numel ? x[i] : (T)0;
                    tile[8 * t + k] = zero_cuda__sq_stage<DT>(raw, &bad);
                }
            for (k = 0; k < 8; k++)
                for (j = 0; j < ZERO_CUDA__SQ_TILE / 8; j++) lane[k] = zero_cuda__sq_add<DT>(lane[k], tile[8 * j + k]);
        }
        partials[g] = zero_cuda__sq_tree(lane);
        if (bad && (tab->flags[p] & ZERO_CUDA__SQ_NONFINITE)) *flag = 1;
    }
    {
        double total = (tab->flags[0] & ZERO_CUDA__SQ_FIRST) ? 0.0 : *running;
        int p = 0;
        for (g = 0; g < nblocks; g++) {
            while (g == tab->start[p + 1]) total = zero_cuda__sq_close(tab, p++, total, tab->acc, running);
            total = total + partials[g];
        }
        for (; p < tab->n; p++) total = zero_cuda__sq_close(tab, p, total, tab->acc, running);
    }
}

/* Tables as the device's flush builds them (zero_cuda__sq_build itself), with small block
   and piece budgets per launch so that buffers are cut into pieces carried across launches. */
template <int DT>
static void model_sumsq(const void *const *xs, const size_t *ns, int nbuf, size_t parts, int pieces, double *acc,
                        int *flag)
{
    static zero_cuda__sq_table tab;
    static double partials[ZERO_CUDA__SQ_PARTS];
    static zero_cuda__sq_req req[64];
    double running = -12345.0; /* garbage: a first piece must not read it */
    int i;
    memset(&tab, 0, sizeof tab);
    tab.acc = acc;
    for (i = 0; i < nbuf; i++) {
        req[i].x = xs[i];
        req[i].numel = ns[i];
        req[i].flags = ZERO_CUDA__SQ_SUM | ZERO_CUDA__SQ_NONFINITE;
    }
    (void)zero_cuda__sq_build(
        req, nbuf, parts, pieces, &tab,
        [&](const zero_cuda__sq_table *t) {
            model_sumsq_launch<DT>(t, partials, &running, flag);
            return ZERO_OK;
        },
        [](const zero_cuda__sq_req *) { return ZERO_OK; });
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd64(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Random bit patterns of dtype dt: mostly ordinary values of mixed magnitude, with
   subnormals, zeros of both signs, and (when specials) inf and NaN. */
static void fill_bits(void *buf, zero_dtype dt, size_t n, int specials)
{
    size_t i;
    for (i = 0; i < n; i++) {
        uint64_t r = rnd64();
        int kind = (int)(r % 64);
        float f = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0) *
                  (float)(1u << (r % 7)) * ((r >> 3) % 5 == 0 ? 1e-3f : 1.0f);
        if (kind == 0) f = 0.0f;
        if (kind == 1) f = -0.0f;
        if (kind == 2) f = 1e-41f;   /* an fp32 subnormal */
        if (kind == 3) f = 3e-6f;    /* an fp16 subnormal */
        if (specials && kind == 4) f = (r & 32) ? INFINITY : -INFINITY;
        if (specials && kind == 5) f = NAN;
        switch (dt) {
        case ZERO_F32: ((float *)buf)[i] = f; break;
        case ZERO_F64: ((double *)buf)[i] = (double)f * (1.0 + (double)(r & 0xffff) * 1e-9); break;
        default: zero_convert((uint16_t *)buf + i, dt, &f, ZERO_F32, 1, ZERO_SIMD_AUTO); break;
        }
    }
}

template <int DT> static void check_sumsq_dt(zero_device *host)
{
    const size_t sizes[] = {0, 1, 7, 8, 9, 2047, 2048, 2049, 65535, 65536, 65537, 3 * 65536 + 123, 300007};
    const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
    const zero_dtype dt = (zero_dtype)DT;
    size_t es = zero_dtype_size(dt), total = 0, off = 0;
    const void *xs[16];
    size_t ns[16];
    unsigned char *buf;
    int i, specials, parts_case;
    for (i = 0; i < nsizes; i++) total += sizes[i] + 1;
    buf = (unsigned char *)malloc(total * es + 16);
    ZT_CHECK(buf != NULL);
    if (!buf) return;
    for (specials = 0; specials < 2; specials++) {
        fill_bits(buf, dt, total + 16 / es, specials);
        /* each size alone, at an aligned and (one element further) a misaligned address */
        for (i = 0; i < nsizes; i++) {
            int mis;
            for (mis = 0; mis < 2; mis++) {
                const void *x = buf + (size_t)mis * es;
                double want = 0.25, got = 0.25; /* a non-zero start: *acc += total */
                int flag = 0;
                float hflag = 0.0f;
                ZT_CHECK(host->ops->sumsq(host, ZERO_QUEUE_COMPUTE, x, dt, sizes[i], &want) == ZERO_OK);
                ZT_CHECK(host->ops->nonfinite(host, ZERO_QUEUE_COMPUTE, x, dt, sizes[i], &hflag) == ZERO_OK);
                model_sumsq<DT>(&x, &sizes[i], 1, ZERO_CUDA__SQ_PARTS, ZERO_CUDA__SQ_MAX, &got, &flag);
                ZT_CHECKF(memcmp(&want, &got, 8) == 0 || (want != want && got != got),
                          "%s n=%zu mis=%d: host %.17g model %.17g", zero_dtype_name(dt), sizes[i], mis, want, got);
                ZT_CHECKF((hflag != 0.0f) == (flag != 0), "%s n=%zu: nonfinite host %g model %d",
                          zero_dtype_name(dt), sizes[i], (double)hflag, flag);
            }
        }
        /* many buffers in one batch, and tiny launch budgets that cut buffers into pieces */
        off = 0;
        for (i = 0; i < nsizes && i < 16; i++) {
            xs[i] = buf + off * es;
            ns[i] = sizes[i];
            off += sizes[i] + 1;
        }
        for (parts_case = 0; parts_case < 4; parts_case++) {
            size_t parts = parts_case == 0 ? ZERO_CUDA__SQ_PARTS : parts_case == 1 ? 2 : 1;
            int pieces = parts_case == 3 ? 2 : ZERO_CUDA__SQ_MAX; /* 2 pieces per launch */
            double want = 0.0, got = 0.0;
            int flag = 0;
            for (i = 0; i < nsizes; i++)
                ZT_CHECK(host->ops->sumsq(host, ZERO_QUEUE_COMPUTE, xs[i], dt, ns[i], &want) == ZERO_OK);
            model_sumsq<DT>(xs, ns, nsizes, parts, pieces, &got, &flag);
            ZT_CHECKF(memcmp(&want, &got, 8) == 0 || (want != want && got != got),
                      "%s batch of %d, %zu blocks / %d pieces per launch: host %.17g model %.17g",
                      zero_dtype_name(dt), nsizes, parts, pieces, want, got);
        }
    }
    free(buf);
}

ZT_TEST(test_sumsq_model)
{
    zero_device *host = NULL;
    zero_host_device_desc hd;
    memset(&hd, 0, sizeof hd);
    hd.threads = 2; /* the host's own block order must not depend on its threads either */
    ZT_CHECK(zero_host_device_create(&hd, &host) == ZERO_OK);
    if (!host) return;
    check_sumsq_dt<ZERO_F32>(host);
    check_sumsq_dt<ZERO_F16>(host);
    check_sumsq_dt<ZERO_BF16>(host);
    check_sumsq_dt<ZERO_F64>(host);
    zero_device_destroy(host);
}

/* The Adam table's slots: over every chunk of a table, as the kernel walks them, each
   element of each range is visited exactly once, and a 16-byte slot starts where every
   pointer of its range is 16-byte aligned. */
ZT_TEST(test_adam_slots_model)
{
    static zero_cuda__adam_table tab;
    static unsigned char seen[70000];
    const size_t sizes[] = {1, 5, 7, 8, 9, 15, 16, 17, 255, 256, 2047, 2048, 2049, 2055, 65543};
    const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
    char *base = (char *)(uintptr_t)0x100000;
    int r, h, ok = 1;
    memset(&tab, 0, sizeof tab);
    for (r = 0; r < nsizes * 9 && r < ZERO_CUDA__ADAM_MAX; r++) {
        zero_cuda__adam_seg *s = &tab.seg[r];
        size_t slots;
        h = r % 9; /* element offsets 0..7 of a 2-byte gradient against fp32 master: heads vary; 8 = none */
        s->numel = sizes[r / 9];
        s->master = (float *)(base + 4 * (size_t)(h == 8 ? 1 : 0));
        s->grad = base + 2 * (size_t)h;
        {
            const void *ptrs[2] = {s->master, s->grad};
            size_t es[2] = {4, 2};
            int hh = zero_cuda__head(ptrs, es, 2);
            s->head = hh < 0 ? 8u : (unsigned)hh;
        }
        slots = zero_cuda__adam_slots(s->numel, s->head);
        tab.start[r + 1] = tab.start[r] + (slots + ZERO_CUDA__THREADS - 1) / ZERO_CUDA__THREADS;
        tab.n = r + 1;
    }
    for (r = 0; r < tab.n; r++) {
        const zero_cuda__adam_seg *s = &tab.seg[r];
        size_t ch, q, lo, hi, i;
        memset(seen, 0, s->numel);
        for (ch = 0; ch < tab.start[tab.n]; ch++) {
            int t;
            if (zero_cuda__find_piece(tab.start, tab.n, ch) != r) continue;
            for (t = 0; t < ZERO_CUDA__THREADS; t++) {
                q = (ch - tab.start[r]) * ZERO_CUDA__THREADS + (size_t)t;
                if (q >= zero_cuda__adam_slots(s->numel, s->head)) continue;
                if (zero_cuda__adam_slot(s->numel, s->head, q, &lo, &hi)) {
                    ok &= hi - lo == 8 && ((uintptr_t)(s->master + lo) % 16 == 0) &&
                          ((uintptr_t)((const char *)s->grad + 2 * lo) % 16 == 0);
                }
                ok &= hi - lo <= ZERO_CUDA__ADAM_SLOT;
                for (i = lo; i < hi; i++) seen[i]++;
            }
        }
        for (i = 0; i < s->numel; i++) ok &= seen[i] == 1;
        ZT_CHECKF(ok, "range %d: numel %zu head %u", r, s->numel, s->head);
        if (!ok) break;
    }
}

/* Walks an Adam table as zero_cuda__adam_kernel does (every chunk, every thread of it) and
   checks: every element of every range visited exactly once, no slot longer than
   ZERO_CUDA__ADAM_SLOT elements (a thread's share), and every 16-byte slot aligned for all
   five pointers. Returns the number of failed ranges (after the first, it stops). */
static int walk_adam_table(const zero_cuda__adam_table *tab, unsigned char *seen, const char *label)
{
    int r;
    for (r = 0; r < tab->n; r++) {
        const zero_cuda__adam_seg *s = &tab->seg[r];
        size_t ch, q, lo, hi, i, longest = 0;
        int ok = 1;
        memset(seen, 0, s->numel);
        for (ch = 0; ch < tab->start[tab->n]; ch++) {
            int t;
            if (zero_cuda__find_piece(tab->start, tab->n, ch) != r) continue;
            for (t = 0; t < ZERO_CUDA__THREADS; t++) {
                q = (ch - tab->start[r]) * ZERO_CUDA__THREADS + (size_t)t;
                if (q >= zero_cuda__adam_slots(s->numel, s->head)) continue;
                if (zero_cuda__adam_slot(s->numel, s->head, q, &lo, &hi)) {
                    const uintptr_t gb = (uintptr_t)s->grad, pb = (uintptr_t)s->param;
                    ok &= hi - lo == 8 && (uintptr_t)(s->master + lo) % 16 == 0 &&
                          (uintptr_t)(s->m + lo) % 16 == 0 && (uintptr_t)(s->v + lo) % 16 == 0 &&
                          (gb + 2 * lo) % 16 == 0 && (!pb || (pb + 2 * lo) % 16 == 0);
                }
                if (hi - lo > longest) longest = hi - lo;
                for (i = lo; i < hi; i++) seen[i]++;
            }
        }
        for (i = 0; i < s->numel; i++) ok &= seen[i] == 1;
        ok &= longest <= ZERO_CUDA__ADAM_SLOT;
        if (!ok) {
            ZT_CHECKF(ok, "%s: range %d of %zu elements, head %u: longest slot %zu (bound %d), "
                          "or an element not visited exactly once, or a misaligned vector",
                      label, r, s->numel, s->head, longest, ZERO_CUDA__ADAM_SLOT);
            return 1;
        }
    }
    return 0;
}

/* The engine's Adam ranges for align_numel 1..16 and odd world sizes, built with the plan
   and the engine's offsets (master, m, v, the reduced-gradient shard and the params of
   stages 1-3, each buffer 256-byte aligned as the CUDA arena gives them; fp16 gradients
   and params), pushed through zero_cuda__adam_push as the device does: an align_numel
   below 8 puts odd ranks' segments at element offsets where fp32 and fp16 pointers have
   no common 16-byte aligned element (head 8). Each such range must still be cut into
   8-element slots, never one thread for the whole segment. */
ZT_TEST(test_adam_slots_engine_ranges)
{
    static zero_cuda__adam_table tab;
    static unsigned char seen[8192];
    static const size_t sizes[] = {1001, 37, 5, 257, 3, 2049, 77, 8, 9};
    const int ntensors = (int)(sizeof sizes / sizeof sizes[0]);
    char *const mbase = (char *)(uintptr_t)0x1000000, *const gbase = (char *)(uintptr_t)0x2000000,
                *const pbase = (char *)(uintptr_t)0x3000000;
    size_t align;
    int world, misaligned = 0, ranges = 0, failed = 0;
    for (align = 1; align <= 16 && !failed; align++)
        for (world = 1; world <= 7 && !failed; world += 2) {
            zero_plan *plan = NULL;
            int t, g, rank, stage;
            ZT_CHECK(zero_plan_create(&plan, NULL) == ZERO_OK);
            for (t = 0; t < ntensors; t++) {
                char name[16];
                snprintf(name, sizeof name, "t%d", t);
                ZT_CHECK(zero_plan_add(plan, name, sizes[t], t / 3, NULL) == ZERO_OK);
            }
            ZT_CHECK(zero_plan_commit(plan, world, align, 0) == ZERO_OK);
            for (stage = 1; stage <= 3; stage++)
                for (rank = 0; rank < world && !failed; rank++) {
                    size_t off_whole = 0, off_shard = 0;
                    char label[96];
                    memset(&tab, 0, sizeof tab);
                    for (g = 0; g < zero_plan_num_groups(plan); g++) {
                        zero_group_info gi;
                        zero_range sh;
                        int k;
                        memset(&gi, 0, sizeof gi);
                        memset(&sh, 0, sizeof sh);
                        ZT_CHECK(zero_plan_group(plan, g, &gi) == ZERO_OK);
                        ZT_CHECK(zero_plan_shard(plan, g, rank, &sh) == ZERO_OK);
                        for (k = 0; k < gi.num_tensors; k++) {
                            zero_range seg;
                            zero_adam_range ar;
                            size_t mo, po;
                            memset(&ar, 0, sizeof ar);
                            memset(&seg, 0, sizeof seg);
                            ZT_CHECK(zero_plan_intersect(plan, gi.tensors[k], rank, &seg) == ZERO_OK);
                            if (seg.numel == 0) continue;
                            mo = off_shard + (seg.offset - sh.offset);
                            po = stage < 3 ? off_whole + seg.offset : off_shard + (seg.offset - sh.offset);
                            memset(&ar, 0, sizeof ar);
                            ar.numel = seg.numel;
                            ar.master = (float *)(void *)mbase + mo;
                            ar.m = (float *)(void *)(mbase + 0x400000) + mo;
                            ar.v = (float *)(void *)(mbase + 0x800000) + mo;
                            ar.grad = gbase + 2 * (off_shard + (seg.offset - sh.offset));
                            ar.grad_dtype = ZERO_F16;
                            ar.param = pbase + 2 * po;
                            ar.param_dtype = ZERO_F16;
                            zero_cuda__adam_push(&tab, &ar, 0);
                            misaligned += tab.seg[tab.n - 1].head == 8;
                            ranges++;
                        }
                        off_whole += gi.numel;
                        off_shard += gi.shard_numel;
                    }
                    snprintf(label, sizeof label, "align_numel %zu, world %d, stage %d, rank %d", align,
                             world, stage, rank);
                    failed += walk_adam_table(&tab, seen, label);
                }
            zero_plan_destroy(plan);
        }
    /* the case this test is about occurred, and not everywhere */
    ZT_CHECKF(misaligned > 0 && misaligned < ranges, "%d of %d ranges misaligned", misaligned, ranges);
}

/* The probe: without a GPU it must say 0 (skip), never an error, on a machine with no
   driver; where it succeeds it agrees with zero_cuda_device_count. */
ZT_TEST(test_probe)
{
    int n = -1;
    zero_result r = zero_cuda_device_probe(&n);
    ZT_CHECK(zero_cuda_device_probe(NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    if (r != ZERO_OK) {
        ZT_CHECKF(r == ZERO_ERROR_DEVICE && n == 0 && strstr(zero_last_error(), "cudaGetDeviceCount"), "%s",
                  zero_last_error());
        printf("  (probe: %s)\n", zero_last_error());
        return;
    }
    ZT_CHECK(n >= 0 && n == zero_cuda_device_count());
}

/* cudaStreamPerThread is refused before any CUDA call (so this runs without a GPU). */
ZT_TEST(test_per_thread_stream_refused)
{
    zero_cuda_desc desc;
    zero_device *dev = (zero_device *)&desc;
    memset(&desc, 0, sizeof desc);
    desc.compute_stream = (void *)cudaStreamPerThread;
    ZT_CHECK(zero_cuda_device_create(&desc, &dev) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev == NULL);
    ZT_CHECK(strstr(zero_last_error(), "cudaStreamPerThread") != NULL);
}

int main(void)
{
    ZT_RUN(test_vector_head);
    ZT_RUN(test_probe);
    ZT_RUN(test_per_thread_stream_refused);
    ZT_RUN(test_sumsq_model);
    ZT_RUN(test_adam_slots_model);
    ZT_RUN(test_adam_slots_engine_ranges);
    return zt_summary();
}
