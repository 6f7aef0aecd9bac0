/* The activation tier: zero_engine_stash / zero_engine_fetch (ZeRO-R's activation offload,
   ZeRO-Infinity's activation tier).

   Every test compares what comes back with a copy the test kept of what went in (bit for
   bit), for the host (CPU) and NVMe tiers; checks that the NVMe tier serves a backward
   (fetches in reverse stash order) from its prefetches, not from reads on demand; that the
   accounting is exactly the settings' bytes; the errors; and, on the race-model device with
   late transfers, that no access of the caller's buffers is unordered with the copies.
   Defines ZERO_IMPLEMENTATION to reach the tier's I/O engine for fault injection. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "tests/zt.h"
#include "tests/vc_device.h"

#include <dirent.h>
#include <unistd.h>

static char nvme_dir[256];

static const char *make_nvme_dir(void)
{
    snprintf(nvme_dir, sizeof nvme_dir, "/tmp/zero-test-act-XXXXXX");
    return mkdtemp(nvme_dir);
}

/* Files left in the directory (the tier's file must be gone after destroy). */
static int files_in(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d) return -1;
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

typedef struct act_cfg {
    zero_offload_device tier;
    size_t host_bytes, nvme_bytes;
    int pin, vc; /* pinned host memory; the race-model device with late transfers */
    const char *dir;
} act_cfg;

/* One rank's engine with an activation tier (a tiny model: the tier needs a commit). */
static zero_result act_engine(const act_cfg *c, zero_comm *comm, zero_device **dev, zero_engine **e)
{
    zero_engine_desc d;
    zero_result r;
    *e = NULL;
    r = c->vc ? vc_create(dev) : zero_host_device_create(NULL, dev);
    if (r != ZERO_OK) return r;
    if (c->vc) vc_current->defer = 1;
    memset(&d, 0, sizeof d);
    d.stage = 1;
    d.device = *dev;
    d.comm = comm;
    d.offload_activations = c->tier;
    d.activation_host_bytes = c->host_bytes;
    d.activation_nvme_bytes = c->nvme_bytes;
    d.nvme_path = c->dir;
    d.pin_memory = c->pin ? ZERO_PIN_MEMORY_ON : ZERO_PIN_MEMORY_OFF; /* pin 0: plain memory */
    r = zero_engine_create(&d, e);
    if (r == ZERO_OK) r = zero_engine_add_tensor(*e, "w", 100, 0, 0, NULL);
    if (r == ZERO_OK) r = zero_engine_commit(*e);
    return r;
}

static void act_close(zero_device *dev, zero_engine *e)
{
    zero_engine_destroy(e);
    zero_device_destroy(dev);
}

/* Device buffer helpers (the host device's and vc's pointers are host memory, but the test
   moves bytes with the device ops, as a GPU program would). */
static void *dev_buf(zero_device *dev, size_t bytes)
{
    void *p = NULL;
    if (dev->ops->alloc(dev, bytes, ZERO_MEM_SCRATCH, &p) != ZERO_OK) return NULL;
    return p;
}

/* Random bytes from the caller's own splitmix64 state: ranks run as threads, so a shared
   generator (zt_rand64) would be a data race and make each run's data differ. */
static unsigned long long act_rand(unsigned long long *state)
{
    unsigned long long z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_random(unsigned long long *state, unsigned char *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) p[i] = (unsigned char)act_rand(state);
}

/* ---- round trip ---------------------------------------------------------------------------- */

#define RT_KEYS 24

typedef struct rt_run {
    act_cfg c;
    int failures[4];
    char msg[4][256];
    zero_activation_stats st[4];
} rt_run;

static size_t rt_size(int rank, int pass, int k)
{
    static const size_t base[] = {1, 4095, 4096, 4097, 10000, 65536, 100003, 3};
    return base[(k + pass + rank) % 8] + (size_t)(k * 37 % 11);
}

/* Two passes of stash-all, overwrite the sources, fetch-all: pass 0 in reverse, pass 1 in a
   shuffled order with other sizes; every byte compared with the kept copy. Ranks stash
   different sizes: the tier is local. */
static zero_result rt_rank(int rank, zero_comm *comm, void *user)
{
    rt_run *R = (rt_run *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    unsigned char *ref[RT_KEYS], *tmp;
    void *src[RT_KEYS], *dst;
    size_t n[RT_KEYS];
    int order[RT_KEYS], k, pass, fails = 0;
    unsigned long long rng = 0x5eed0000ull + (unsigned long long)rank;
    zero_result r = act_engine(&R->c, comm, &dev, &e);
    memset(ref, 0, sizeof ref);
    memset(src, 0, sizeof src);
    dst = dev_buf(dev, 200000);
    tmp = (unsigned char *)malloc(200000);
    for (pass = 0; pass < 2 && r == ZERO_OK; pass++) {
        for (k = 0; k < RT_KEYS && r == ZERO_OK; k++) {
            n[k] = rt_size(rank, pass, k);
            if (!src[k]) src[k] = dev_buf(dev, 200000);
            free(ref[k]);
            ref[k] = (unsigned char *)malloc(n[k]);
            fill_random(&rng, ref[k], n[k]);
            r = dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, src[k], ref[k], n[k]);
            if (r == ZERO_OK) r = zero_engine_stash(e, 1000 * rank + k, src[k], n[k]);
        }
        if (r == ZERO_OK) r = zero_engine_stash_fence(e);
        for (k = 0; k < RT_KEYS && r == ZERO_OK; k++) { /* the sources are reused */
            memset(tmp, 0xA5, n[k]);
            r = dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, src[k], tmp, n[k]);
        }
        for (k = 0; k < RT_KEYS; k++) order[k] = RT_KEYS - 1 - k;
        if (pass == 1)
            for (k = RT_KEYS - 1; k > 0; k--) {
                int j = (int)(act_rand(&rng) % (unsigned long long)(k + 1)), t = order[k];
                order[k] = order[j];
                order[j] = t;
            }
        for (k = 0; k < RT_KEYS && r == ZERO_OK; k++) {
            int key = order[k];
            r = zero_engine_fetch(e, 1000 * rank + key, dst, n[key]);
            if (r == ZERO_OK) r = dev->ops->download(dev, ZERO_QUEUE_COMPUTE, tmp, dst, n[key]);
            if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
            if (r == ZERO_OK && memcmp(tmp, ref[key], n[key]) != 0) {
                if (fails++ == 0)
                    snprintf(R->msg[rank], sizeof R->msg[rank], "pass %d key %d (%zu bytes) differs",
                             pass, key, n[key]);
            }
        }
    }
    if (r == ZERO_OK) r = zero_engine_activation_stats(e, &R->st[rank]);
    R->failures[rank] = fails;
    for (k = 0; k < RT_KEYS; k++) {
        free(ref[k]);
        if (src[k]) dev->ops->free(dev, src[k]);
    }
    if (dst) dev->ops->free(dev, dst);
    free(tmp);
    act_close(dev, e);
    return r;
}

static size_t rt_total(int rank, int pass, int spans)
{
    size_t s = 0;
    int k;
    for (k = 0; k < RT_KEYS; k++) {
        size_t b = rt_size(rank, pass, k);
        s += spans ? (size_t)zero_io_align_up(b) : b;
    }
    return s;
}

ZT_TEST(round_trip_host_and_nvme)
{
    int tier, pin, rk;
    const char *dir = make_nvme_dir();
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (tier = ZERO_OFFLOAD_CPU; tier <= ZERO_OFFLOAD_NVME; tier++)
        for (pin = 0; pin < 2; pin++) {
            rt_run R;
            zero_result r;
            size_t need = rt_total(0, 0, 1) > rt_total(0, 1, 1) ? rt_total(0, 0, 1) : rt_total(0, 1, 1);
            memset(&R, 0, sizeof R);
            for (rk = 1; rk < 2; rk++) {
                if (rt_total(rk, 0, 1) > need) need = rt_total(rk, 0, 1);
                if (rt_total(rk, 1, 1) > need) need = rt_total(rk, 1, 1);
            }
            R.c.tier = (zero_offload_device)tier;
            R.c.pin = pin;
            R.c.dir = dir;
            if (tier == ZERO_OFFLOAD_CPU) {
                R.c.host_bytes = need; /* exactly what the largest pass needs */
            } else {
                R.c.nvme_bytes = need;
                R.c.host_bytes = 3 * zero_io_align_up(100013); /* staging for three of the largest */
            }
            zt_seed(99 + (unsigned)tier * 2 + (unsigned)pin);
            r = zero_local_run(2, rt_rank, &R);
            ZT_CHECKF(r == ZERO_OK, "tier %d pin %d: %s", tier, pin, zero_last_error());
            for (rk = 0; rk < 2; rk++) {
                const zero_activation_stats *s = &R.st[rk];
                ZT_CHECKF(R.failures[rk] == 0, "tier %d pin %d rank %d: %d buffers differ, first %s",
                          tier, pin, rk, R.failures[rk], R.msg[rk]);
                ZT_CHECK(s->stashes == 2 * RT_KEYS && s->fetches == 2 * RT_KEYS);
                ZT_CHECK(s->bytes_stashed == rt_total(rk, 0, 0) + rt_total(rk, 1, 0));
                ZT_CHECK(s->bytes_fetched == s->bytes_stashed);
                ZT_CHECK(s->live_bytes == 0 && s->live_keys == 0);
                ZT_CHECKF(s->peak_live_bytes == (rt_total(rk, 0, 0) > rt_total(rk, 1, 0) ? rt_total(rk, 0, 0) : rt_total(rk, 1, 0)),
                          "peak %zu", s->peak_live_bytes);
                if (tier == ZERO_OFFLOAD_NVME)
                    ZT_CHECKF(s->staging_hits + s->prefetch_hits + s->demand_reads == s->fetches,
                              "%llu + %llu + %llu", (unsigned long long)s->staging_hits,
                              (unsigned long long)s->prefetch_hits, (unsigned long long)s->demand_reads);
                else
                    ZT_CHECK(s->staging_hits + s->prefetch_hits + s->demand_reads + s->prefetches == 0);
            }
        }
    ZT_CHECKF(files_in(dir) == 0, "%d files left in %s", files_in(dir), dir);
    rmdir(dir);
}

/* ---- prefetch in reverse order ------------------------------------------------------------- */

typedef struct pf_run {
    act_cfg c;
    int keys, reverse;
    size_t bytes;
    zero_activation_stats st;
    zero_io_stats io;
    int bad;
} pf_run;

static zero_result pf_rank(int rank, zero_comm *comm, void *user)
{
    pf_run *P = (pf_run *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    unsigned char *ref = (unsigned char *)malloc(P->bytes * (size_t)P->keys), *tmp = (unsigned char *)malloc(P->bytes);
    void *buf;
    int k;
    unsigned long long rng = 0x9f000000ull + (unsigned long long)rank;
    zero_result r = act_engine(&P->c, comm, &dev, &e);
    (void)rank;
    buf = dev_buf(dev, P->bytes);
    fill_random(&rng, ref, P->bytes * (size_t)P->keys);
    for (k = 0; k < P->keys && r == ZERO_OK; k++) { /* one buffer reused for every stash */
        r = dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, buf, ref + (size_t)k * P->bytes, P->bytes);
        if (r == ZERO_OK) r = zero_engine_stash(e, k, buf, P->bytes);
        if (r == ZERO_OK) r = zero_engine_stash_fence(e);
    }
    for (k = 0; k < P->keys && r == ZERO_OK; k++) {
        int key = P->reverse ? P->keys - 1 - k : k;
        r = zero_engine_fetch(e, key, buf, P->bytes);
        if (r == ZERO_OK) r = dev->ops->download(dev, ZERO_QUEUE_COMPUTE, tmp, buf, P->bytes);
        if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
        if (r == ZERO_OK && memcmp(tmp, ref + (size_t)key * P->bytes, P->bytes) != 0) P->bad++;
    }
    if (r == ZERO_OK) r = zero_engine_activation_stats(e, &P->st);
    if (r == ZERO_OK) r = zero_io_get_stats(e->act->io, &P->io);
    free(ref);
    free(tmp);
    if (buf) dev->ops->free(dev, buf);
    act_close(dev, e);
    return r;
}

ZT_TEST(nvme_prefetch_follows_reverse_order)
{
    const char *dir = make_nvme_dir();
    pf_run P;
    zero_result r;
    uint64_t span;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    memset(&P, 0, sizeof P);
    P.keys = 12;
    P.bytes = 50000;
    span = zero_io_align_up(P.bytes);
    P.c.tier = ZERO_OFFLOAD_NVME;
    P.c.dir = dir;
    P.c.nvme_bytes = (size_t)span * 12;
    P.c.host_bytes = (size_t)span * 2; /* staging: two buffers */
    P.reverse = 1;
    r = zero_local_run(1, pf_rank, &P);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(P.bad == 0);
    /* The last two stashed are still in staging; every other fetch finds its bytes read
       ahead by the prefetch the fetch before it started; none reads on demand. */
    ZT_CHECKF(P.st.staging_hits == 2 && P.st.prefetch_hits == 10 && P.st.demand_reads == 0,
              "staging %llu prefetch %llu demand %llu", (unsigned long long)P.st.staging_hits,
              (unsigned long long)P.st.prefetch_hits, (unsigned long long)P.st.demand_reads);
    ZT_CHECK(P.st.prefetches == 10);
    /* Written once each except the last one (fetched before its write), read once each
       except the two served from staging: the I/O engine's own counters agree. */
    ZT_CHECKF(P.st.nvme_bytes_written == 11 * span && P.io.bytes_written == 11 * span,
              "%llu %llu", (unsigned long long)P.st.nvme_bytes_written, (unsigned long long)P.io.bytes_written);
    ZT_CHECKF(P.st.nvme_bytes_read == 10 * span && P.io.bytes_read == 10 * span, "%llu %llu",
              (unsigned long long)P.st.nvme_bytes_read, (unsigned long long)P.io.bytes_read);
    /* Fetching in stash order instead defeats the prefetch (it guesses reverse order): the
       counters see the difference. */
    memset(&P.st, 0, sizeof P.st);
    P.reverse = 0;
    r = zero_local_run(1, pf_rank, &P);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(P.bad == 0);
    ZT_CHECKF(P.st.demand_reads >= 9 && P.st.prefetch_hits == 0, "demand %llu prefetch hits %llu",
              (unsigned long long)P.st.demand_reads, (unsigned long long)P.st.prefetch_hits);
    ZT_CHECK(files_in(dir) == 0);
    rmdir(dir);
}

/* ---- accounting ---------------------------------------------------------------------------- */

typedef struct acc_run {
    act_cfg c;
    zero_engine_memory tier[ZERO_TIER_COUNT];
    zero_activation_stats mid;
} acc_run;

static zero_result acc_rank(int rank, zero_comm *comm, void *user)
{
    acc_run *A = (acc_run *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    void *buf;
    int t;
    zero_result r = act_engine(&A->c, comm, &dev, &e);
    (void)rank;
    buf = dev_buf(dev, 10000);
    for (t = 0; t < ZERO_TIER_COUNT && r == ZERO_OK; t++)
        r = zero_engine_memory_tier(e, (zero_mem_tier)t, &A->tier[t]);
    if (r == ZERO_OK && A->c.tier != ZERO_OFFLOAD_NONE) {
        r = zero_engine_stash(e, 1, buf, 10000);
        if (r == ZERO_OK) r = zero_engine_stash(e, 2, buf, 333);
        if (r == ZERO_OK) r = zero_engine_activation_stats(e, &A->mid);
        if (r == ZERO_OK) r = zero_engine_stash_clear(e);
    }
    if (buf) dev->ops->free(dev, buf);
    act_close(dev, e);
    return r;
}

ZT_TEST(accounting_is_exact)
{
    const char *dir = make_nvme_dir();
    acc_run base, A;
    int tier, t, k;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    memset(&base, 0, sizeof base);
    ZT_CHECK(zero_local_run(1, acc_rank, &base) == ZERO_OK);
    for (tier = ZERO_OFFLOAD_CPU; tier <= ZERO_OFFLOAD_NVME; tier++) {
        size_t want[ZERO_TIER_COUNT] = {0, 0, 0};
        memset(&A, 0, sizeof A);
        A.c.tier = (zero_offload_device)tier;
        A.c.dir = dir;
        A.c.host_bytes = tier == ZERO_OFFLOAD_CPU ? 100000 : 0; /* NVMe: the default staging */
        A.c.nvme_bytes = 1000000;
        ZT_CHECKF(zero_local_run(1, acc_rank, &A) == ZERO_OK, "%s", zero_last_error());
        /* rounded up to 4096: 100000 -> 102400, 1000000 -> 1003520; staging 64 MiB */
        want[ZERO_TIER_HOST] = tier == ZERO_OFFLOAD_CPU ? 102400 : (size_t)64 << 20;
        want[ZERO_TIER_NVME] = tier == ZERO_OFFLOAD_NVME ? 1003520 : 0;
        for (t = 0; t < ZERO_TIER_COUNT; t++) {
            const zero_engine_memory *m = &A.tier[t], *b = &base.tier[t];
            ZT_CHECKF(m->bytes[ZERO_MEM_ACTIVATION] == want[t] && m->peak_bytes[ZERO_MEM_ACTIVATION] == want[t],
                      "tier %d: %zu, want %zu", t, m->bytes[ZERO_MEM_ACTIVATION], want[t]);
            ZT_CHECK(m->total_bytes == b->total_bytes + want[t]);
            ZT_CHECK(m->peak_total_bytes == b->peak_total_bytes + want[t]);
            ZT_CHECK(m->allocations == b->allocations + (want[t] ? 1u : 0u));
            for (k = 0; k < ZERO_MEM_COUNT; k++)
                if (k != ZERO_MEM_ACTIVATION) ZT_CHECK(m->bytes[k] == b->bytes[k]);
        }
        ZT_CHECK(A.mid.live_bytes == 10333 && A.mid.live_keys == 2 && A.mid.peak_live_bytes == 10333);
    }
    ZT_CHECK(strcmp(zero_mem_category_name(ZERO_MEM_ACTIVATION), "activation") == 0);
    ZT_CHECK(files_in(dir) == 0);
    rmdir(dir);
}

/* ---- errors -------------------------------------------------------------------------------- */

static zero_result err_rank(int rank, zero_comm *comm, void *user)
{
    const char *dir = (const char *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_activation_stats st;
    act_cfg c;
    unsigned char in[8192], out[8192];
    void *buf, *buf2;
    size_t i;
    zero_result r;
    (void)rank;
    /* descriptor errors */
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.stage = 1;
    d.device = dev;
    d.comm = comm;
    d.offload_activations = (zero_offload_device)7;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT && e == NULL);
    ZT_CHECK(strstr(zero_last_error(), "offload_activations") != NULL);
    d.offload_activations = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "activation_host_bytes") != NULL);
    d.offload_activations = ZERO_OFFLOAD_NVME;
    d.activation_nvme_bytes = 4096;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "nvme_path") != NULL);
    d.nvme_path = dir;
    d.activation_nvme_bytes = 0;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "activation_nvme_bytes") != NULL);
    /* no tier: every call says how to get one */
    d.offload_activations = ZERO_OFFLOAD_NONE;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_stash(e, 0, in, 16) == ZERO_ERROR_INVALID_STATE); /* before commit */
    ZT_CHECK(zero_engine_add_tensor(e, "w", 100, 0, 0, NULL) == ZERO_OK);
    ZT_CHECK(zero_engine_commit(e) == ZERO_OK);
    buf = dev_buf(dev, 8192);
    ZT_CHECK(zero_engine_stash(e, 0, buf, 16) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(strstr(zero_last_error(), "offload_activations") != NULL);
    ZT_CHECK(zero_engine_fetch(e, 0, buf, 16) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(zero_engine_stash_fence(e) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(zero_engine_stash_drop(e, 0) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(zero_engine_stash_clear(e) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(zero_engine_activation_stats(e, &st) == ZERO_OK && st.stashes == 0);
    ZT_CHECK(zero_engine_activation_stats(e, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    dev->ops->free(dev, buf);
    zero_engine_destroy(e);
    zero_device_destroy(dev);

    /* a host tier of 3 pages */
    memset(&c, 0, sizeof c);
    c.tier = ZERO_OFFLOAD_CPU;
    c.host_bytes = 3 * 4096;
    if ((r = act_engine(&c, comm, &dev, &e)) != ZERO_OK) return r;
    buf = dev_buf(dev, 8192);
    buf2 = dev_buf(dev, 8192);
    for (i = 0; i < sizeof in; i++) in[i] = (unsigned char)(i * 7 + 1);
    ZT_CHECK(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, buf, in, sizeof in) == ZERO_OK);
    ZT_CHECK(zero_engine_stash(e, 5, NULL, 16) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_stash(e, 5, buf, 0) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_fetch(e, 5, buf2, 100) == ZERO_ERROR_NOT_FOUND); /* never stashed */
    ZT_CHECK(zero_engine_stash(e, 5, buf, 5000) == ZERO_OK);              /* two pages */
    ZT_CHECK(zero_engine_stash(e, 5, buf, 100) == ZERO_ERROR_INVALID_STATE); /* stashed already */
    ZT_CHECK(zero_engine_stash(e, 6, buf, 4097) == ZERO_ERROR_OUT_OF_MEMORY); /* 2 pages, 1 free */
    ZT_CHECK(strstr(zero_last_error(), "activation_host_bytes") != NULL);
    ZT_CHECK(zero_engine_stash(e, 6, buf, 4096) == ZERO_OK); /* one page fits */
    ZT_CHECK(zero_engine_fetch(e, 5, buf2, 4999) == ZERO_ERROR_INVALID_ARGUMENT); /* size mismatch */
    ZT_CHECK(strstr(zero_last_error(), "5000") != NULL);
    ZT_CHECK(zero_engine_fetch(e, 5, NULL, 5000) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_engine_activation_stats(e, &st) == ZERO_OK && st.live_keys == 2 && st.fetches == 0);
    ZT_CHECK(zero_engine_fetch(e, 5, buf2, 5000) == ZERO_OK); /* nothing changed by the errors */
    ZT_CHECK(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, out, buf2, 5000) == ZERO_OK);
    ZT_CHECK(memcmp(in, out, 5000) == 0);
    ZT_CHECK(zero_engine_fetch(e, 5, buf2, 5000) == ZERO_ERROR_INVALID_STATE); /* fetched twice */
    ZT_CHECK(strstr(zero_last_error(), "already fetched") != NULL);
    ZT_CHECK(zero_engine_stash_drop(e, 5) == ZERO_ERROR_NOT_FOUND);
    ZT_CHECK(zero_engine_stash_drop(e, 77) == ZERO_ERROR_NOT_FOUND);
    ZT_CHECK(zero_engine_stash_drop(e, 6) == ZERO_OK);
    ZT_CHECK(zero_engine_fetch(e, 6, buf2, 4096) == ZERO_ERROR_NOT_FOUND); /* dropped */
    ZT_CHECK(zero_engine_stash(e, 5, buf, 8192) == ZERO_OK); /* the key again, the space again */
    ZT_CHECK(zero_engine_stash(e, -3, buf, 4096) == ZERO_OK);   /* any int is a key */
    ZT_CHECK(zero_engine_fetch(e, -3, buf2, 4096) == ZERO_OK);
    ZT_CHECK(zero_engine_fetch(e, 5, buf2, 8192) == ZERO_OK);
    ZT_CHECK(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, out, buf2, 8192) == ZERO_OK);
    ZT_CHECK(memcmp(in, out, 8192) == 0);
    ZT_CHECK(zero_engine_activation_stats(e, &st) == ZERO_OK && st.live_keys == 0 && st.live_bytes == 0);
    dev->ops->free(dev, buf);
    dev->ops->free(dev, buf2);
    act_close(dev, e);

    /* NVMe: a stash larger than the staging, and a full file */
    memset(&c, 0, sizeof c);
    c.tier = ZERO_OFFLOAD_NVME;
    c.dir = dir;
    c.host_bytes = 4096;
    c.nvme_bytes = 2 * 4096;
    if ((r = act_engine(&c, comm, &dev, &e)) != ZERO_OK) return r;
    buf = dev_buf(dev, 8192);
    ZT_CHECK(zero_engine_stash(e, 1, buf, 4097) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "activation_host_bytes") != NULL);
    ZT_CHECK(zero_engine_stash(e, 1, buf, 4096) == ZERO_OK);
    ZT_CHECK(zero_engine_stash(e, 2, buf, 4096) == ZERO_OK);
    ZT_CHECK(zero_engine_stash(e, 3, buf, 1) == ZERO_ERROR_OUT_OF_MEMORY);
    ZT_CHECK(strstr(zero_last_error(), "activation_nvme_bytes") != NULL);
    ZT_CHECK(zero_engine_stash_clear(e) == ZERO_OK);
    ZT_CHECK(zero_engine_stash(e, 3, buf, 1) == ZERO_OK);
    dev->ops->free(dev, buf);
    act_close(dev, e); /* destroy with a key still stashed: nothing leaks (ASan) */
    return ZERO_OK;
}

ZT_TEST(errors_are_clear)
{
    const char *dir = make_nvme_dir();
    zero_result r;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    r = zero_local_run(1, err_rank, (void *)dir);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(files_in(dir) == 0);
    rmdir(dir);
}

/* ---- the key table ------------------------------------------------------------------------- */

/* A new key for every stash (a counter), 65536 of them, host and NVMe tiers: every fetch
   returns its bytes, and the key table stays small (it held every key ever stashed and
   searched them linearly: 213 us per stash + fetch at 64k keys). Then 3000 live keys at
   once: the table grows, finds each key (fetched in a shuffled order), and shrinks back
   once they are fetched. A key fetched twice in a row is INVALID_STATE, a key never
   stashed NOT_FOUND. (Timing is bench/bench_activations.c's.) */
static zero_result keys_rank(int rank, zero_comm *comm, void *user)
{
    const char *dir = (const char *)user;
    int tier, k, n, bad = 0, peak_cap = 0, order[3000];
    unsigned long long rng = 0x4b455953ull;
    (void)rank;
    for (tier = 0; tier < 2; tier++) {
        zero_device *dev = NULL;
        zero_engine *e = NULL;
        act_cfg c;
        unsigned char in[64], out[64];
        void *buf, *dst;
        memset(&c, 0, sizeof c);
        c.tier = tier ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_CPU;
        c.dir = dir;
        c.host_bytes = (size_t)(tier ? 8 : 16) << 20; /* 3000 live keys of 4096 bytes each (aligned) */
        c.nvme_bytes = (size_t)16 << 20;
        bad = 0;
        peak_cap = 0;
        ZT_CHECK(act_engine(&c, comm, &dev, &e) == ZERO_OK);
        if (!e) return ZERO_ERROR_INVALID_STATE;
        buf = dev_buf(dev, 64);
        dst = dev_buf(dev, 64);
        n = tier ? 8192 : 65536; /* NVMe: each stash is a file write */
        for (k = 0; k < n; k++) {
            memset(in, (unsigned char)k, sizeof in);
            in[0] = (unsigned char)(k >> 8);
            if (dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, buf, in, 64) != ZERO_OK ||
                zero_engine_stash(e, 7 * k + 3, buf, 64) != ZERO_OK ||
                zero_engine_fetch(e, 7 * k + 3, dst, 64) != ZERO_OK ||
                dev->ops->download(dev, ZERO_QUEUE_COMPUTE, out, dst, 64) != ZERO_OK ||
                dev->ops->sync(dev, ZERO_QUEUE_COMPUTE) != ZERO_OK || memcmp(in, out, 64) != 0)
                bad++;
            if (e->act->cap > peak_cap) peak_cap = e->act->cap;
        }
        ZT_CHECKF(bad == 0, "tier %d: %d keys came back wrong", tier, bad);
        ZT_CHECKF(peak_cap <= 64 && e->act->nkeys <= 48, "tier %d: a key table of %d entries (%d used) for "
                  "one live key", tier, peak_cap, e->act->nkeys);
        ZT_CHECK(zero_engine_fetch(e, 7 * (n - 1) + 3, dst, 64) == ZERO_ERROR_INVALID_STATE);
        ZT_CHECK(strstr(zero_last_error(), "already fetched") != NULL);
        ZT_CHECK(zero_engine_fetch(e, -5, dst, 64) == ZERO_ERROR_NOT_FOUND);
        if (tier == 0) { /* many live keys: the table grows, then shrinks */
            for (k = 0; k < 3000; k++) {
                memset(in, 0, sizeof in);
                memcpy(in, &k, sizeof k);
                bad += dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, buf, in, 64) != ZERO_OK;
                bad += zero_engine_stash(e, k * 100003, buf, 64) != ZERO_OK;
                bad += zero_engine_stash_fence(e) != ZERO_OK;
                order[k] = k;
            }
            ZT_CHECKF(bad == 0 && e->act->cap >= 3000, "%d errors, table %d", bad, e->act->cap);
            for (k = 2999; k > 0; k--) {
                int j = (int)(act_rand(&rng) % (unsigned long long)(k + 1)), t = order[k];
                order[k] = order[j];
                order[j] = t;
            }
            for (k = 0; k < 3000; k++) {
                int got = -1;
                bad += zero_engine_fetch(e, order[k] * 100003, dst, 64) != ZERO_OK;
                bad += dev->ops->download(dev, ZERO_QUEUE_COMPUTE, out, dst, 64) != ZERO_OK;
                bad += dev->ops->sync(dev, ZERO_QUEUE_COMPUTE) != ZERO_OK;
                memcpy(&got, out, sizeof got);
                bad += got != order[k];
            }
            ZT_CHECKF(bad == 0, "%d wrong", bad);
            ZT_CHECKF(e->act->cap <= 64, "after every fetch the table still has %d entries", e->act->cap);
        }
        dev->ops->free(dev, buf);
        dev->ops->free(dev, dst);
        act_close(dev, e);
    }
    return ZERO_OK;
}

ZT_TEST(the_key_table_stays_small)
{
    const char *dir = make_nvme_dir();
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    ZT_CHECKF(zero_local_run(1, keys_rank, (void *)dir) == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(files_in(dir) == 0);
    rmdir(dir);
}

/* ---- I/O errors ---------------------------------------------------------------------------- */

static zero_result io_rank(int rank, zero_comm *comm, void *user)
{
    const char *dir = (const char *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_io_fault f;
    act_cfg c;
    unsigned char in[3][4096], out[4096];
    void *buf, *dst;
    int k;
    unsigned long long rng = 0x10000000ull + (unsigned long long)rank;
    zero_result r;
    memset(&c, 0, sizeof c);
    c.tier = ZERO_OFFLOAD_NVME;
    c.dir = dir;
    c.host_bytes = 4096; /* staging: one buffer, so every stash waits for the write before */
    c.nvme_bytes = 3 * 4096;
    if ((r = act_engine(&c, comm, &dev, &e)) != ZERO_OK) return r;
    buf = dev_buf(dev, 4096);
    dst = dev_buf(dev, 4096);
    for (k = 0; k < 3; k++) fill_random(&rng, in[k], 4096);
    /* The write of key 0 fails (EIO): its fetch says so, after the others came back. */
    memset(&f, 0, sizeof f);
    f.kind = ZERO_IO_FAULT_ERRNO;
    f.request = 1;
    f.err = EIO;
    ZT_CHECK(zero_io_inject_fault(e->act->io, &f) == ZERO_OK);
    for (k = 0; k < 3; k++) {
        ZT_CHECK(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, buf, in[k], 4096) == ZERO_OK);
        ZT_CHECK(zero_engine_stash(e, k, buf, 4096) == ZERO_OK);
        ZT_CHECK(zero_engine_stash_fence(e) == ZERO_OK);
    }
    for (k = 2; k >= 1; k--) {
        ZT_CHECK(zero_engine_fetch(e, k, dst, 4096) == ZERO_OK);
        ZT_CHECK(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, out, dst, 4096) == ZERO_OK);
        ZT_CHECK(memcmp(out, in[k], 4096) == 0);
    }
    ZT_CHECK(zero_engine_fetch(e, 0, dst, 4096) == ZERO_ERROR_IO);
    ZT_CHECKF(strstr(zero_last_error(), "write") && strstr(zero_last_error(), "key 0"), "%s", zero_last_error());
    ZT_CHECK(zero_engine_fetch(e, 0, dst, 4096) == ZERO_ERROR_NOT_FOUND); /* reported once */
    /* A read fails (the prefetch of key 1, started by the fetch of key 2): the fetch of key 1
       returns IO, the key stays stashed, and a second fetch reads it again. */
    for (k = 0; k < 3; k++) {
        ZT_CHECK(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, buf, in[k], 4096) == ZERO_OK);
        ZT_CHECK(zero_engine_stash(e, k, buf, 4096) == ZERO_OK);
        ZT_CHECK(zero_engine_stash_fence(e) == ZERO_OK);
    }
    ZT_CHECK(zero_io_inject_fault(e->act->io, &f) == ZERO_OK);
    ZT_CHECK(zero_engine_fetch(e, 2, dst, 4096) == ZERO_OK);
    ZT_CHECK(zero_engine_fetch(e, 1, dst, 4096) == ZERO_ERROR_IO);
    ZT_CHECKF(strstr(zero_last_error(), "read") && strstr(zero_last_error(), "key 1"), "%s", zero_last_error());
    ZT_CHECK(zero_engine_fetch(e, 1, dst, 4096) == ZERO_OK);
    ZT_CHECK(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, out, dst, 4096) == ZERO_OK);
    ZT_CHECK(memcmp(out, in[1], 4096) == 0);
    ZT_CHECK(zero_engine_fetch(e, 0, dst, 4096) == ZERO_OK);
    ZT_CHECK(dev->ops->download(dev, ZERO_QUEUE_COMPUTE, out, dst, 4096) == ZERO_OK);
    ZT_CHECK(memcmp(out, in[0], 4096) == 0);
    dev->ops->free(dev, buf);
    dev->ops->free(dev, dst);
    act_close(dev, e);
    return ZERO_OK;
}

ZT_TEST(io_errors_are_reported)
{
    const char *dir = make_nvme_dir();
    zero_result r;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    r = zero_local_run(1, io_rank, (void *)dir);
    ZT_CHECKF(r == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(files_in(dir) == 0);
    rmdir(dir);
}

/* ---- the race model: late transfers, the caller's accesses logged --------------------------- */

typedef struct race_run {
    act_cfg c;
    int fence;    /* 0: the caller reuses its buffer without zero_engine_stash_fence (a misuse) */
    int distinct; /* one buffer per block, never overwritten: no fence needed */
    int races, bad;
    char first[256];
} race_run;

#define RACE_L 6
#define RACE_B 20000

/* A model's pattern: one device buffer x holds each block's input in turn; the forward
   stashes x[l] and overwrites x with x[l+1] (compute-queue writes); the backward fetches
   x[l] into a second buffer and reads it on the compute queue. With 'distinct' each block's
   input has its own buffer, written once per step before its stash (no fence). */
static zero_result race_rank(int rank, zero_comm *comm, void *user)
{
    race_run *R = (race_run *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    vc_dev *v;
    unsigned char *ref = (unsigned char *)malloc((size_t)RACE_L * RACE_B);
    unsigned char *x, *y, *xs[RACE_L];
    int l, step;
    unsigned long long rng = 0x7ace0000ull + (unsigned long long)rank;
    zero_result r = act_engine(&R->c, comm, &dev, &e);
    v = vc_current;
    x = (unsigned char *)dev_buf(dev, RACE_B);
    y = (unsigned char *)dev_buf(dev, RACE_B);
    for (l = 0; l < RACE_L; l++) xs[l] = R->distinct ? (unsigned char *)dev_buf(dev, RACE_B) : x;
    for (step = 0; step < 2 && r == ZERO_OK; step++) {
        fill_random(&rng, ref, (size_t)RACE_L * RACE_B);
        for (l = 0; l < RACE_L && r == ZERO_OK; l++) {
            vc_begin(v, ZERO_QUEUE_COMPUTE); /* block l-1's forward writes x[l] */
            vc_touch(v, ZERO_QUEUE_COMPUTE, xs[l], RACE_B, 1, "forward writes x");
            memcpy(xs[l], ref + (size_t)l * RACE_B, RACE_B);
            r = zero_engine_stash(e, l, xs[l], RACE_B);
            if (r == ZERO_OK && R->fence) r = zero_engine_stash_fence(e);
        }
        for (l = RACE_L - 1; l >= 0 && r == ZERO_OK; l--) {
            r = zero_engine_fetch(e, l, y, RACE_B);
            if (r != ZERO_OK) break;
            vc_begin(v, ZERO_QUEUE_COMPUTE); /* the recompute of block l reads x[l] */
            vc_touch(v, ZERO_QUEUE_COMPUTE, y, RACE_B, 0, "backward reads x[l]");
            if (memcmp(y, ref + (size_t)l * RACE_B, RACE_B) != 0) R->bad++;
            vc_begin(v, ZERO_QUEUE_COMPUTE); /* and the backward writes into y */
            vc_touch(v, ZERO_QUEUE_COMPUTE, y, RACE_B, 1, "backward writes y");
            memset(y, 0x5a, RACE_B);
        }
    }
    R->races = v->races;
    memcpy(R->first, v->first_race, sizeof R->first);
    free(ref);
    if (R->distinct)
        for (l = 0; l < RACE_L; l++)
            if (xs[l]) dev->ops->free(dev, xs[l]);
    if (x) dev->ops->free(dev, x);
    if (y) dev->ops->free(dev, y);
    act_close(dev, e);
    return r;
}

/* Every tier and staging size (NVMe: one buffer, where a prefetch must not take the region
   an upload still reads; two), with pinned and plain host memory, both patterns. */
ZT_TEST(race_model_no_use_before_arrival)
{
    const char *dir = make_nvme_dir();
    int tier, pin, staging, distinct;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (tier = ZERO_OFFLOAD_CPU; tier <= ZERO_OFFLOAD_NVME; tier++)
        for (staging = 1; staging <= (tier == ZERO_OFFLOAD_NVME ? 2 : 1); staging++)
            for (pin = 0; pin < 2; pin++)
                for (distinct = 0; distinct < 2; distinct++) {
                    race_run R;
                    zero_result r;
                    char label[64];
                    snprintf(label, sizeof label, "tier %d staging %d pin %d distinct %d", tier,
                             staging, pin, distinct);
                    memset(&R, 0, sizeof R);
                    R.c.tier = (zero_offload_device)tier;
                    R.c.vc = 1;
                    R.c.pin = pin;
                    R.c.dir = dir;
                    R.c.host_bytes = tier == ZERO_OFFLOAD_CPU ? (size_t)RACE_L * 20480 : (size_t)staging * 20480;
                    R.c.nvme_bytes = (size_t)RACE_L * 20480;
                    R.fence = !distinct;
                    R.distinct = distinct;
                    vc_pinned_total = 0;
                    r = zero_local_run(1, race_rank, &R);
                    ZT_CHECKF(r == ZERO_OK, "%s: %s", label, zero_last_error());
                    ZT_CHECKF(R.races == 0, "%s: %d races, first: %s", label, R.races, R.first);
                    ZT_CHECKF(R.bad == 0, "%s: %d fetches gave other bytes", label, R.bad);
                    ZT_CHECKF(vc_pinned_live == 0, "%d pinned buffers not given back", vc_pinned_live);
                    ZT_CHECK((vc_pinned_total > 0) == (pin > 0));
                    if (distinct) continue;
                    /* The checker sees the misuse the fence prevents: the forward overwrites x
                       while the late copy of the stash has not read it yet. */
                    memset(&R.races, 0, sizeof R - offsetof(race_run, races));
                    R.fence = 0;
                    r = zero_local_run(1, race_rank, &R);
                    ZT_CHECKF(r == ZERO_OK, "%s: %s", label, zero_last_error());
                    ZT_CHECKF(R.races > 0 && R.bad > 0, "%s without the fence: %d races, %d bad",
                              label, R.races, R.bad);
                }
    ZT_CHECK(files_in(dir) == 0);
    rmdir(dir);
}

int main(void)
{
    ZT_RUN(round_trip_host_and_nvme);
    ZT_RUN(nvme_prefetch_follows_reverse_order);
    ZT_RUN(accounting_is_exact);
    ZT_RUN(errors_are_clear);
    ZT_RUN(the_key_table_stays_small);
    ZT_RUN(io_errors_are_reported);
    ZT_RUN(race_model_no_use_before_arrival);
    return zt_summary();
}
