/* The NVMe tier's pipelines between and inside steps: stage-3 param shards read ahead of
   the gathers param_read_ahead groups deep in the recorded order (bit-identical to the plain
   run, depth honoured, no read wasted, the backward served without a read on demand, the
   host shard buffers accounted exactly), and the caches' writes behind (every injected
   write or read failure of an init + save reaches the caller as ZERO_ERROR_IO, never lost). */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/nvme_dir.h"

#include <dirent.h>
#include <errno.h>
#include <unistd.h>

static char tier_dir[64];

static const char *tier_make_dir(void) { return nd_make_dir(tier_dir, sizeof tier_dir, "nvme-tier"); }

/* The engine's block request number 'request' (from 1, counted from now) fails with EIO. */
static void inject_eio(zero_io *io, uint64_t request)
{
    zero_io_fault f;
    memset(&f, 0, sizeof f);
    f.kind = ZERO_IO_FAULT_ERRNO;
    f.request = request;
    f.err = EIO;
    ZT_CHECK(zero_io_inject_fault(io, &f) == ZERO_OK);
}

/* Eight groups of one tensor each (uneven sizes), so the order has room to read ahead. */
static void tier_model(ec_cfg *c)
{
    static const size_t sizes[] = {40, 33, 64, 17, 90, 25, 50, 12};
    int t;
    c->ntensors = 8;
    for (t = 0; t < 8; t++) {
        c->sizes[t] = sizes[t];
        c->groups[t] = t;
        c->flags[t] = 0;
    }
}

/* Stage 3, both offloads on NVMe, 2 ranks, 3 steps (forward 0..7, backward 7..0), at read
   ahead depths 1, 2 and 4: params, master, m, v and every step's info equal the plain
   run's bit for bit. Gather statistics of every rank, steps 2..3 (the 3-step run minus the
   1-step run; the first step records the order): the depth is honoured (exactly D reads
   ahead in flight at the forward's start), no read ahead is wasted, and one read per step
   is on demand (the forward's first group, after the step emptied the slots; each
   backward's first D + 1 groups are the forward's last shards, kept clean in the slots,
   and the others were read ahead). The host tier holds 1 + D shard buffers (at least 2) of
   the largest shard rounded to ZERO_IO_ALIGN. */
ZT_TEST(param_read_ahead_depth_is_honoured_and_exact)
{
    static const int depths[] = {1, 2, 4};
    const char *dir = tier_make_dir();
    size_t host_param[3] = {0, 0, 0};
    int di, rk;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (di = 0; di < 3; di++) {
        ec_cfg c;
        ec_result *ref, *off, *one;
        char why[160];
        int D = depths[di];
        ec_cfg_init(&c, 3, 2, ZERO_BF16, 1, 3);
        tier_model(&c);
        c.nvme_path = dir;
        c.param_read_ahead = D;
        ref = ec_run(&c);
        c.offload_opt = ZERO_OFFLOAD_NVME;
        c.offload_param = ZERO_OFFLOAD_NVME;
        off = ec_run(&c);
        c.steps = 1;
        one = ec_run(&c);
        c.steps = 3;
        ZT_CHECKF(ref->rc == ZERO_OK && off->rc == ZERO_OK && one->rc == ZERO_OK, "depth %d: %s %s %s", D,
                  ref->err, off->err, one->err);
        if (ref->rc == ZERO_OK && off->rc == ZERO_OK && one->rc == ZERO_OK) {
            ZT_CHECKF(ec_same_state(&c, ref, off, why, sizeof why), "depth %d: %s", D, why);
            ZT_CHECK(memcmp(ref->info, off->info, sizeof ref->info) == 0);
            for (rk = 0; rk < 2; rk++) {
                const zero_gather_stats *g = &off->gstats[rk], *g1 = &one->gstats[rk];
                uint64_t ahead = g->nvme_reads_ahead - g1->nvme_reads_ahead;
                ZT_CHECKF(g->nvme_reads_in_flight_max == D, "depth %d rank %d: %d reads in flight at most", D, rk,
                          g->nvme_reads_in_flight_max);
                ZT_CHECKF(g->nvme_reads_wasted == g1->nvme_reads_wasted, "depth %d rank %d: %llu wasted in steps 2..3",
                          D, rk, (unsigned long long)(g->nvme_reads_wasted - g1->nvme_reads_wasted));
                ZT_CHECKF(g->nvme_reads_demand - g1->nvme_reads_demand == 2, "depth %d rank %d: %llu on demand", D,
                          rk, (unsigned long long)(g->nvme_reads_demand - g1->nvme_reads_demand));
                /* each step: 7 of the forward's 8 groups, 7 - D of the backward's */
                ZT_CHECKF(ahead == (uint64_t)(2 * (7 + 7 - D)), "depth %d rank %d: %llu ahead", D, rk,
                          (unsigned long long)ahead);
                ZT_CHECK(g->nvme_read_wait_s >= 0.0 && g1->nvme_read_wait_s >= 0.0);
            }
            host_param[di] = off->host_mem[0].bytes[ZERO_MEM_PARAM];
        }
        ec_result_free(ref);
        ec_result_free(off);
        ec_result_free(one);
    }
    /* shards of at most 45 bf16 elements: each buffer is one ZERO_IO_ALIGN */
    ZT_CHECKF(host_param[1] - host_param[0] == 1 * ZERO_IO_ALIGN && host_param[2] - host_param[0] == 3 * ZERO_IO_ALIGN,
              "host PARAM bytes %zu, %zu, %zu at depths 1, 2, 4", host_param[0], host_param[1], host_param[2]);
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* Without a trace (read ahead in the direction of travel) and with accumulation (the second micro-step's
   forward starts on the group the backward ended with): still the plain run's bits. */
ZT_TEST(param_read_ahead_with_accumulation_is_exact)
{
    const char *dir = tier_make_dir();
    ec_cfg c;
    ec_result *ref, *off;
    char why[160];
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    ec_cfg_init(&c, 3, 3, ZERO_F16, 2, 3);
    tier_model(&c);
    c.nvme_path = dir;
    c.param_read_ahead = 3;
    c.sub_group = 23; /* many tiles: the optimizer records are read ahead and written behind too */
    ref = ec_run(&c);
    c.offload_opt = ZERO_OFFLOAD_NVME;
    c.offload_param = ZERO_OFFLOAD_NVME;
    off = ec_run(&c);
    ZT_CHECKF(ref->rc == ZERO_OK && off->rc == ZERO_OK, "%s %s", ref->err, off->err);
    if (ref->rc == ZERO_OK && off->rc == ZERO_OK) {
        ZT_CHECKF(ec_same_state(&c, ref, off, why, sizeof why), "%s", why);
        ZT_CHECK(off->gstats[0].nvme_reads_wasted == 0);
    }
    ec_result_free(ref);
    ec_result_free(off);
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

static zero_result validate_rank(int rank, zero_comm *comm, void *user)
{
    static const int bad[] = {-1, 17};
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL;
    int i;
    (void)rank;
    (void)user;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    for (i = 0; i < 2; i++) {
        char want[40];
        memset(&d, 0, sizeof d);
        d.stage = 3;
        d.device = dev;
        d.comm = comm;
        d.param_read_ahead = bad[i];
        ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT && e == NULL);
        snprintf(want, sizeof want, "param_read_ahead = %d", bad[i]);
        ZT_CHECKF(strstr(zero_last_error(), want) != NULL, "%s", zero_last_error());
    }
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(param_read_ahead_validated)
{
    ZT_CHECK(zero_local_run(1, validate_rank, NULL) == ZERO_OK);
}

/* ---- writes behind: an I/O failure is returned, never lost ---- */

typedef struct wb_run {
    const char *dir, *ckdir;
    uint64_t fail_request; /* 0: no fault; k: the k-th block request after commit fails */
    uint64_t requests;     /* without a fault: the block requests of the init + save */
    uint64_t written, read; /* without a fault: bytes written by the init + save, read by the save */
    uint64_t master_param;  /* the tier's master and param bytes (4 S + p S)                 */
    zero_result first;     /* the first error returned */
    char msg[512];
    int calls_ok_after;    /* calls that returned OK after the first error (must be 0) */
} wb_run;

static zero_result wb_rank(int rank, zero_comm *comm, void *user)
{
    static const size_t sizes[] = {300, 5, 1000, 13, 250, 77, 640};
    static const int groups[] = {0, 0, 1, 2, 2, 3, 4};
    wb_run *w = (wb_run *)user;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL;
    zero_io_stats st;
    zero_engine_memory nv;
    float vals[1000];
    int t;
    zero_result r;
    (void)rank;
    w->first = ZERO_OK;
    w->calls_ok_after = 0;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = dev;
    d.comm = comm;
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_param = ZERO_OFFLOAD_NVME;
    d.nvme_path = w->dir;
    d.sub_group_size = 128; /* many records: the cache moves, writing behind, while set_tensor runs */
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    for (t = 0; t < 7; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        ZT_CHECK(zero_engine_add_tensor(e, name, sizes[t], groups[t], 0, NULL) == ZERO_OK);
    }
    ZT_CHECK(zero_engine_commit(e) == ZERO_OK);
    if (w->fail_request) inject_eio(e->nvme.io, w->fail_request);
    for (t = 0; t < 7; t++) {
        size_t i;
        for (i = 0; i < sizes[t]; i++) vals[i] = 0.01f * (float)(i % 97) - 0.3f * (float)t;
        r = zero_engine_set_tensor(e, t, vals);
        if (r != ZERO_OK && w->first == ZERO_OK) {
            w->first = r;
            snprintf(w->msg, sizeof w->msg, "%s", zero_last_error());
        } else if (r == ZERO_OK && w->first != ZERO_OK) {
            w->calls_ok_after++;
        }
    }
    ZT_CHECK(zero_engine_nvme_stats(e, &st) == ZERO_OK);
    w->read = st.bytes_read;
    r = zero_engine_save(e, w->ckdir);
    if (r != ZERO_OK && w->first == ZERO_OK) {
        w->first = r;
        snprintf(w->msg, sizeof w->msg, "%s", zero_last_error());
    } else if (r == ZERO_OK && w->first != ZERO_OK) {
        w->calls_ok_after++;
    }
    ZT_CHECK(zero_engine_nvme_stats(e, &st) == ZERO_OK);
    w->requests = st.requests;
    w->written = st.bytes_written;
    w->read = st.bytes_read - w->read;
    ZT_CHECK(zero_engine_memory_tier(e, ZERO_TIER_NVME, &nv) == ZERO_OK);
    w->master_param = nv.bytes[ZERO_MEM_MASTER] + nv.bytes[ZERO_MEM_PARAM];
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* set_tensor of every tensor then a save, with the k-th block request after commit failing
   (EIO), for every k the fault-free run issues: the write behind of a tile record or a
   param shard (or a read of the save) fails, and the error reaches the caller as
   ZERO_ERROR_IO, from the set_tensor that needed the slot or from the save (which waits for
   every write behind first), with the cause; no later call reports success. */
ZT_TEST(write_behind_errors_are_never_lost)
{
    char d1[64], d2[64];
    wb_run w;
    uint64_t k, n;
    snprintf(d1, sizeof d1, "/tmp/zero-test-wb-XXXXXX");
    snprintf(d2, sizeof d2, "/tmp/zero-test-wbk-XXXXXX");
    memset(&w, 0, sizeof w);
    w.dir = mkdtemp(d1);
    w.ckdir = mkdtemp(d2);
    ZT_CHECK(w.dir && w.ckdir);
    if (!w.dir || !w.ckdir) return;
    ZT_CHECK(zero_local_run(1, wb_rank, &w) == ZERO_OK);
    ZT_CHECKF(w.first == ZERO_OK, "fault-free: %s", w.msg);
    /* set_tensor sets params and master: the records' m and v stay the files' zeros and are
       neither written nor read (each record's master is its own range), so the init writes
       4 S + p S bytes and the save reads them back, instead of 12 S + p S */
    ZT_CHECKF(w.written == w.master_param && w.read == w.master_param,
              "init + save wrote %llu, save read %llu; master + params %llu", (unsigned long long)w.written,
              (unsigned long long)w.read, (unsigned long long)w.master_param);
    n = w.requests;
    ZT_CHECKF(n >= 10, "%llu requests", (unsigned long long)n);
    for (k = 1; k <= n; k++) {
        w.fail_request = k;
        ZT_CHECK(zero_local_run(1, wb_rank, &w) == ZERO_OK);
        ZT_CHECKF(w.first == ZERO_ERROR_IO, "request %llu of %llu failed: returned %s",
                  (unsigned long long)k, (unsigned long long)n, zero_result_string(w.first));
        ZT_CHECKF(strstr(w.msg, "Input/output error") != NULL, "request %llu: %s", (unsigned long long)k, w.msg);
        ZT_CHECKF(w.calls_ok_after == 0, "request %llu: %d calls succeeded after the error",
                  (unsigned long long)k, w.calls_ok_after);
    }
    ZT_CHECK(nd_dir_is_empty(w.dir));
    rmdir(w.dir);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", w.ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
}

/* ---- a save reads several records and shards ahead ---- */

typedef struct sa_run {
    const char *dir, *ckdir;
    int buffer_count;
    int ahead_max, ntiles; /* the most record reads ahead in flight during the save; tiles */
    int exact;             /* the checkpoint loads into a plain engine with the values set */
} sa_run;

static float sa_value(int t, size_t i) { return 0.01f * (float)(i % 97) - 0.3f * (float)t; }

static zero_result sa_rank(int rank, zero_comm *comm, void *user)
{
    static const size_t sizes[] = {300, 5, 1000, 13, 250, 77, 640};
    static const int groups[] = {0, 0, 1, 2, 2, 3, 4};
    sa_run *w = (sa_run *)user;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL, *p = NULL;
    float vals[1000], got[1000];
    int t, k;
    (void)rank;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = dev;
    d.comm = comm;
    ZT_CHECK(zero_engine_create(&d, &p) == ZERO_OK); /* plain: loads the checkpoint */
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_param = ZERO_OFFLOAD_NVME;
    d.nvme_path = w->dir;
    d.sub_group_size = 128;
    d.buffer_count = w->buffer_count;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    for (t = 0; t < 7; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        ZT_CHECK(zero_engine_add_tensor(e, name, sizes[t], groups[t], 0, NULL) == ZERO_OK);
        ZT_CHECK(zero_engine_add_tensor(p, name, sizes[t], groups[t], 0, NULL) == ZERO_OK);
    }
    ZT_CHECK(zero_engine_commit(e) == ZERO_OK && zero_engine_commit(p) == ZERO_OK);
    for (t = 0; t < 7; t++) {
        size_t i;
        for (i = 0; i < sizes[t]; i++) vals[i] = sa_value(t, i);
        ZT_CHECK(zero_engine_set_tensor(e, t, vals) == ZERO_OK);
    }
    for (t = 0; t < 7; t++) { /* m and v of records written master-only read as zeros */
        zero_range rg;
        size_t i;
        int kind;
        for (kind = ZERO_STATE_M; kind <= ZERO_STATE_V; kind++) {
            memset(got, 0x7f, sizeof got);
            ZT_CHECK(zero_engine_read_tensor(e, t, (zero_state_kind)kind, got, &rg) == ZERO_OK);
            for (i = 0; i < sizes[t]; i++) ZT_CHECK(got[i] == 0.0f);
        }
    }
    w->ntiles = e->host.ntiles;
    for (k = 0; k < e->host.ntiles; k++) /* every record written (the cached one at the save) */
        ZT_CHECK(e->nvme.tile_fresh[k] != 1 || k == e->nvme.cached_tile);
    e->nvme.records_ahead_max = 0;
    ZT_CHECK(zero_engine_save(e, w->ckdir) == ZERO_OK);
    w->ahead_max = e->nvme.records_ahead_max;
    ZT_CHECK(zero_engine_load(p, w->ckdir) == ZERO_OK);
    w->exact = 1;
    for (t = 0; t < 7; t++) {
        zero_range rg;
        size_t i;
        ZT_CHECK(zero_engine_read_tensor(p, t, ZERO_STATE_MASTER, got, &rg) == ZERO_OK);
        for (i = 0; i < sizes[t]; i++) {
            float want = sa_value(t, i);
            w->exact &= memcmp(&got[i], &want, 4) == 0;
        }
    }
    zero_engine_destroy(e);
    zero_engine_destroy(p);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* A save walks the NVMe records in shard order and reads up to buffer_count - 1 of them
   ahead (into the swap slots: no other memory), and each group's param shard ahead
   (param_read_ahead deep): at buffer_count 3, 4 and 6 the most reads ahead in flight is
   buffer_count - 1 (the records outnumber the slots), and the checkpoint loads into a
   plain engine with every master value as set, bit for bit. */
ZT_TEST(save_reads_records_ahead)
{
    static const int counts[] = {3, 4, 6};
    char d1[64], d2[64];
    sa_run w;
    int i;
    snprintf(d1, sizeof d1, "/tmp/zero-test-sa-XXXXXX");
    snprintf(d2, sizeof d2, "/tmp/zero-test-sak-XXXXXX");
    memset(&w, 0, sizeof w);
    w.dir = mkdtemp(d1);
    w.ckdir = mkdtemp(d2);
    ZT_CHECK(w.dir && w.ckdir);
    if (!w.dir || !w.ckdir) return;
    for (i = 0; i < 3; i++) {
        w.buffer_count = counts[i];
        ZT_CHECK(zero_local_run(1, sa_rank, &w) == ZERO_OK);
        ZT_CHECKF(w.ntiles > counts[i], "%d tiles", w.ntiles);
        ZT_CHECKF(w.ahead_max == counts[i] - 1, "buffer_count %d: %d records read ahead at most", counts[i],
                  w.ahead_max);
        ZT_CHECK(w.exact);
    }
    ZT_CHECK(nd_dir_is_empty(w.dir));
    rmdir(w.dir);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", w.ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
}

/* ---- a load into the NVMe tier: an I/O error on one rank is agreed ---- */

typedef struct ld_run {
    const char *nvme, *ckdir;
    int stage;
    zero_offload_device opt, par;
    int save;          /* 1: a plain engine sets every tensor and saves (the checkpoint) */
    int fail_rank;     /* the rank whose block request fail_request fails (EIO)          */
    uint64_t fail_request;
    zero_result rc[2], after[2];
    uint64_t requests[2]; /* block requests this rank's load issued              */
    int exact[2];         /* a load that succeeded: master equals the saved values */
    char msg[2][512];
} ld_run;

static float ld_value(int t, size_t i) { return 0.015625f * (float)(i % 61) - 0.25f * (float)t; }

static zero_result ld_rank(int rank, zero_comm *comm, void *user)
{
    static const size_t sizes[] = {40, 33, 64, 17, 90, 25, 50, 12};
    ld_run *L = (ld_run *)user;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL;
    zero_io_stats st0, st1;
    float vals[128], got[128];
    zero_result r;
    int t;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.stage = L->save ? 3 : L->stage;
    d.device = dev;
    d.comm = comm;
    if (!L->save) {
        d.offload_optimizer = L->opt;
        d.offload_param = L->par;
        d.nvme_path = L->nvme;
        d.sub_group_size = 48; /* several tile records: many requests to fail */
    }
    r = zero_engine_create(&d, &e);
    for (t = 0; t < 8 && r == ZERO_OK; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        r = zero_engine_add_tensor(e, name, sizes[t], t, 0, NULL);
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    ZT_CHECKF(r == ZERO_OK, "rank %d: %s", rank, zero_last_error());
    if (r == ZERO_OK && L->save) {
        for (t = 0; t < 8 && r == ZERO_OK; t++) {
            size_t i;
            for (i = 0; i < sizes[t]; i++) vals[i] = ld_value(t, i);
            r = zero_engine_set_tensor(e, t, vals);
        }
        if (r == ZERO_OK) r = zero_engine_save(e, L->ckdir);
        ZT_CHECKF(r == ZERO_OK, "save: %s", zero_last_error());
    } else if (r == ZERO_OK) {
        memset(&st0, 0, sizeof st0);
        memset(&st1, 0, sizeof st1);
        ZT_CHECK(zero_engine_nvme_stats(e, &st0) == ZERO_OK);
        if (L->fail_request && rank == L->fail_rank) inject_eio(e->nvme.io, L->fail_request);
        L->rc[rank] = zero_engine_load(e, L->ckdir);
        snprintf(L->msg[rank], sizeof L->msg[rank], "%s", zero_last_error());
        ZT_CHECK(zero_engine_nvme_stats(e, &st1) == ZERO_OK);
        L->requests[rank] = st1.requests - st0.requests;
        L->exact[rank] = 1;
        for (t = 0; t < 8 && L->rc[rank] == ZERO_OK; t++) {
            zero_range rg;
            size_t i;
            memset(&rg, 0, sizeof rg);
            if (zero_engine_read_tensor(e, t, ZERO_STATE_MASTER, got, &rg) != ZERO_OK) L->exact[rank] = 0;
            for (i = rg.offset; i < rg.offset + rg.numel; i++)
                if (got[i] != ld_value(t, i)) L->exact[rank] = 0;
        }
        /* a failed load leaves no rank with a usable half-loaded engine: the next call fails at once */
        if (L->rc[rank] != ZERO_OK) L->after[rank] = zero_engine_load(e, L->ckdir);
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* zero_engine_load into an engine with an NVMe tier (optimizer at stages 1-3; params, with
   the optimizer on the CPU or NVMe, at stage 3), 2 ranks: the fault-free load restores the
   saved master weights exactly; then, for each rank and every block request that rank's
   load issues, that request fails with EIO. Every rank returns ZERO_ERROR_IO with the
   cause, at once (no rank waits for the comm's timeout in the load's all-gathers), and
   every rank's engine is broken (the next call is INVALID_STATE): no rank returns OK, and
   none keeps a half-loaded state. */
ZT_TEST(a_load_error_on_one_rank_is_agreed)
{
    static const struct {
        int stage;
        zero_offload_device opt, par;
    } cfgs[] = {{1, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE}, {2, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE},
                {3, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE}, {3, ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NVME},
                {3, ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME}};
    char d2[64];
    const char *nvme = tier_make_dir();
    ld_run L;
    zero_local_desc ld;
    size_t c;
    int f, runs = 0;
    snprintf(d2, sizeof d2, "/tmp/zero-test-ld-XXXXXX");
    memset(&L, 0, sizeof L);
    L.nvme = nvme;
    L.ckdir = mkdtemp(d2);
    ZT_CHECK(nvme && L.ckdir);
    if (!nvme || !L.ckdir) return;
    memset(&ld, 0, sizeof ld);
    ld.world = 2;
    ld.timeout_ms = 5000;
    L.save = 1;
    ZT_CHECK(zero_local_run_desc(&ld, ld_rank, &L) == ZERO_OK);
    L.save = 0;
    for (c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        uint64_t n[2], k;
        L.stage = cfgs[c].stage;
        L.opt = cfgs[c].opt;
        L.par = cfgs[c].par;
        L.fail_request = 0;
        ZT_CHECK(zero_local_run_desc(&ld, ld_rank, &L) == ZERO_OK);
        ZT_CHECKF(L.rc[0] == ZERO_OK && L.rc[1] == ZERO_OK && L.exact[0] && L.exact[1],
                  "config %zu, fault-free: %s / %s", c, L.msg[0], L.msg[1]);
        n[0] = L.requests[0];
        n[1] = L.requests[1];
        ZT_CHECKF(n[0] >= 2 && n[1] >= 2, "config %zu: %llu / %llu requests", c, (unsigned long long)n[0],
                  (unsigned long long)n[1]);
        for (f = 0; f < 2; f++)
            for (k = 1; k <= n[f]; k++) {
                double t0 = zt_now_ms();
                L.fail_rank = f;
                L.fail_request = k;
                memset(L.rc, 0, sizeof L.rc);
                memset(L.after, 0, sizeof L.after);
                ZT_CHECK(zero_local_run_desc(&ld, ld_rank, &L) == ZERO_OK);
                runs++;
                ZT_CHECKF(L.rc[0] == ZERO_ERROR_IO && L.rc[1] == ZERO_ERROR_IO,
                          "config %zu (stage %d), rank %d request %llu of %llu: %s (%s) / %s (%s)", c, L.stage, f,
                          (unsigned long long)k, (unsigned long long)n[f], zero_result_string(L.rc[0]), L.msg[0],
                          zero_result_string(L.rc[1]), L.msg[1]);
                ZT_CHECKF(strstr(L.msg[0], "Input/output error") && strstr(L.msg[1], "Input/output error"),
                          "config %zu, rank %d request %llu: %s / %s", c, f, (unsigned long long)k, L.msg[0],
                          L.msg[1]);
                ZT_CHECKF(L.after[0] == ZERO_ERROR_INVALID_STATE && L.after[1] == ZERO_ERROR_INVALID_STATE,
                          "config %zu, rank %d request %llu: after: %s / %s", c, f, (unsigned long long)k,
                          zero_result_string(L.after[0]), zero_result_string(L.after[1]));
                ZT_CHECKF(zt_now_ms() - t0 < 4000, "config %zu, rank %d request %llu: %.0f ms (timeout: 5 s)", c,
                          f, (unsigned long long)k, zt_now_ms() - t0);
            }
    }
    ZT_CHECK(runs >= 20);
    ZT_CHECK(nd_dir_is_empty(nvme));
    rmdir(nvme);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", L.ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
}

/* ---- commit touches no host-tier byte ---- */

static size_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (!f) return 0;
    if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
    fclose(f);
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

typedef struct touch_run {
    const char *dir;
    size_t host_bytes, dev_bytes, grown;
} touch_run;

static zero_result touch_rank(int rank, zero_comm *comm, void *user)
{
    touch_run *T = (touch_run *)user;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL;
    zero_engine_memory h, dm;
    size_t before;
    int g;
    (void)rank;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.param_dtype = ZERO_BF16;
    d.device = dev;
    d.comm = comm;
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_param = ZERO_OFFLOAD_NVME;
    d.nvme_path = T->dir;
    d.pin_memory = ZERO_PIN_MEMORY_OFF;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    for (g = 0; g < 4; g++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", g);
        ZT_CHECK(zero_engine_add_tensor(e, name, (size_t)2 << 20, g, 0, NULL) == ZERO_OK);
    }
    before = resident_bytes();
    ZT_CHECK(zero_engine_commit(e) == ZERO_OK);
    T->grown = resident_bytes() - before;
    ZT_CHECK(zero_engine_memory_tier(e, ZERO_TIER_HOST, &h) == ZERO_OK);
    T->host_bytes = h.total_bytes;
    ZT_CHECK(zero_engine_memory_usage(e, &dm) == ZERO_OK);
    T->dev_bytes = dm.total_bytes;
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZT_HAS_TSAN 1
#endif
#endif
#ifndef ZT_HAS_TSAN
#define ZT_HAS_TSAN 0
#endif

/* Commit of an engine with both offloads on NVMe (8M bf16 params: a host tier of about
   140 MB of swap slots, shard buffers, gradient shard and staging) leaves the host tier's
   pages untouched: its zeroed buffers come from calloc and the staging buffers are filled
   before each use, so commit costs no page faults whatever Psi (at Psi = 4B it spent tens
   of seconds writing zeros into 13 GB of host buffers). The resident set grows by the host
   device's memory (filled with zeros at commit) and less than a twentieth of the host
   tier. */
ZT_TEST(commit_touches_no_host_tier_memory)
{
    char d1[64];
    touch_run T;
    snprintf(d1, sizeof d1, "/tmp/zero-test-touch-XXXXXX");
    memset(&T, 0, sizeof T);
    T.dir = mkdtemp(d1);
    ZT_CHECK(T.dir != NULL);
    if (!T.dir || resident_bytes() == 0) ZT_SKIP("no /proc/self/statm");
#if defined(__SANITIZE_THREAD__) || ZT_HAS_TSAN
    rmdir(T.dir);
    ZT_SKIP("ThreadSanitizer's calloc writes its zeros, so resident bytes do not measure the engine");
#endif
    ZT_CHECK(zero_local_run(1, touch_rank, &T) == ZERO_OK);
    ZT_CHECKF(T.host_bytes > ((size_t)100 << 20) && T.grown < T.dev_bytes + T.host_bytes / 20,
              "commit made %zu bytes resident; the device holds %zu, the host tier %zu", T.grown, T.dev_bytes,
              T.host_bytes);
    ZT_CHECK(nd_dir_is_empty(T.dir));
    rmdir(T.dir);
}

/* ---- fresh records and shards are filled as written, not cleared first ---- */

typedef struct fo_run {
    const char *dir, *ckdir;
    int big; /* records of 2 x queue_depth blocks or more: the write-behind cache alternates
                between two swap slots, and a save reads one record ahead */
    int mismatches, checked, ahead_max;
} fo_run;

static float fo_value(int t, size_t i, int pass) { return 0.0078125f * (float)(i % 53) + 0.5f * (float)t - (float)pass; }

/* Compares every tensor's master, m, v and params of e with p's (bit for bit). */
static void fo_compare(fo_run *w, zero_engine *e, zero_engine *p, const size_t *sizes, size_t scale, int nt)
{
    static float a[4400], b[4400];
    int t, kind;
    for (t = 0; t < nt; t++)
        for (kind = ZERO_STATE_PARAM; kind <= ZERO_STATE_V; kind++) {
            zero_range ra, rb;
            memset(a, 0x7f, sizeof a);
            memset(b, 0x3f, sizeof b);
            ZT_CHECK(zero_engine_read_tensor(e, t, (zero_state_kind)kind, a, &ra) == ZERO_OK);
            ZT_CHECK(zero_engine_read_tensor(p, t, (zero_state_kind)kind, b, &rb) == ZERO_OK);
            ZT_CHECK(ra.offset == rb.offset && ra.numel == rb.numel);
            {
                size_t esz = kind == ZERO_STATE_PARAM ? 2u : 4u, off = ra.offset * esz, n = ra.numel * esz;
                w->checked++;
                if (ra.numel > sizes[t] * scale || memcmp((char *)a + off, (char *)b + off, n) != 0) w->mismatches++;
            }
        }
}

static zero_result fo_rank(int rank, zero_comm *comm, void *user)
{
    /* tiles of 128 elements holding several tensors and parts of tensors; groups of
       several tensors (one param shard each) */
    static const size_t sizes[] = {300, 5, 1000, 13, 250, 77, 640, 9};
    static const int groups[] = {0, 0, 1, 2, 2, 3, 4, 4};
    static const int order[] = {6, 2, 0, 4, 7, 1, 4, 5}; /* 3 never set; 4 twice */
    fo_run *w = (fo_run *)user;
    zero_device *dev = NULL;
    zero_engine_desc d;
    zero_engine *e = NULL, *p = NULL, *e2 = NULL;
    static float vals[4000], got[4000];
    size_t scale = w->big ? 4 : 1;
    zero_range rg;
    int t, k;
    (void)rank;
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.device = dev;
    d.comm = comm;
    d.param_dtype = ZERO_BF16;
    ZT_CHECK(zero_engine_create(&d, &p) == ZERO_OK); /* plain: the reference */
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_param = ZERO_OFFLOAD_NVME;
    d.nvme_path = w->dir;
    d.sub_group_size = w->big ? 2048 : 128;
    if (w->big) { /* 8 KiB of master per record = 2 x queue_depth x block_size */
        d.block_size = 4096;
        d.queue_depth = 1;
    }
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_create(&d, &e2) == ZERO_OK);
    for (t = 0; t < 8; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        ZT_CHECK(zero_engine_add_tensor(e, name, sizes[t] * scale, groups[t], 0, NULL) == ZERO_OK);
        ZT_CHECK(zero_engine_add_tensor(e2, name, sizes[t] * scale, groups[t], 0, NULL) == ZERO_OK);
        ZT_CHECK(zero_engine_add_tensor(p, name, sizes[t] * scale, groups[t], 0, NULL) == ZERO_OK);
    }
    ZT_CHECK(zero_engine_commit(e) == ZERO_OK && zero_engine_commit(p) == ZERO_OK && zero_engine_commit(e2) == ZERO_OK);
    for (k = 0; k < 8; k++) { /* out of order, one skipped, one twice; a read between sets */
        size_t i;
        t = order[k];
        for (i = 0; i < sizes[t] * scale; i++) vals[i] = fo_value(t, i, k);
        ZT_CHECK(zero_engine_set_tensor(e, t, vals) == ZERO_OK);
        ZT_CHECK(zero_engine_set_tensor(p, t, vals) == ZERO_OK);
        if (k == 1 || k == 4) fo_compare(w, e, p, sizes, scale, 8);
        memset(got, 0x7f, sizeof got); /* the tensor after it in the shard: zeros or its values */
        ZT_CHECK(zero_engine_read_tensor(e, (t + 1) % 8, ZERO_STATE_MASTER, got, &rg) == ZERO_OK);
    }
    fo_compare(w, e, p, sizes, scale, 8);
    /* a save of the plain engine loaded into a fresh NVMe engine (its m and v: the load
       writes them piece by piece past the padding), and the NVMe engine's own save */
    e->nvme.records_ahead_max = 0;
    ZT_CHECK(zero_engine_save(e, w->ckdir) == ZERO_OK);
    w->ahead_max = e->nvme.records_ahead_max;
    ZT_CHECK(zero_engine_load(e2, w->ckdir) == ZERO_OK);
    fo_compare(w, e2, p, sizes, scale, 8);
    zero_engine_destroy(e);
    zero_engine_destroy(e2);
    zero_engine_destroy(p);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* The tier's caches fill a record or param shard never written since commit (the file's
   zeros) with zeros only where the calls leave gaps, as they go (an init writes each byte
   once): set_tensor in any order, a tensor never set, one set twice, reads of partly set
   records and shards between the sets, a save and a load into a fresh NVMe engine; with
   small records (every swap slot in turn) and with records of 2 x queue_depth blocks (two
   slots alternate, and the save reads one record ahead, not buffer_count - 1 = 3). Every
   tensor's master, m, v and params equal a plain engine's, given the same calls, bit for
   bit. */
ZT_TEST(fresh_records_fill_in_any_order)
{
    char d1[64], d2[64];
    fo_run w;
    memset(&w, 0, sizeof w);
    snprintf(d1, sizeof d1, "/tmp/zero-test-fo-XXXXXX");
    snprintf(d2, sizeof d2, "/tmp/zero-test-fok-XXXXXX");
    w.dir = mkdtemp(d1);
    w.ckdir = mkdtemp(d2);
    ZT_CHECK(w.dir && w.ckdir);
    if (!w.dir || !w.ckdir) return;
    for (w.big = 0; w.big < 2; w.big++) {
        w.mismatches = w.checked = 0;
        ZT_CHECK(zero_local_run(1, fo_rank, &w) == ZERO_OK);
        ZT_CHECKF(w.mismatches == 0 && w.checked == 4 * 8 * 4, "records of %s: %d of %d reads differ",
                  w.big ? "8 KiB" : "512 bytes", w.mismatches, w.checked);
        ZT_CHECKF(w.ahead_max == (w.big ? 1 : 3), "records of %s: the save read %d ahead at most",
                  w.big ? "8 KiB" : "512 bytes", w.ahead_max);
    }
    ZT_CHECK(nd_dir_is_empty(w.dir));
    rmdir(w.dir);
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", w.ckdir);
        ZT_CHECK(system(cmd) == 0);
    }
}

int main(void)
{
    ZT_RUN(param_read_ahead_depth_is_honoured_and_exact);
    ZT_RUN(param_read_ahead_with_accumulation_is_exact);
    ZT_RUN(param_read_ahead_validated);
    ZT_RUN(write_behind_errors_are_never_lost);
    ZT_RUN(save_reads_records_ahead);
    ZT_RUN(a_load_error_on_one_rank_is_agreed);
    ZT_RUN(commit_touches_no_host_tier_memory);
    ZT_RUN(fresh_records_fill_in_any_order);
    return zt_summary();
}
