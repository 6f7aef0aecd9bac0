/* The safetensors reader on hostile and large headers, and zero_engine_load_safetensors on
   failure:
   - 1 M (ZT_QUICK: 128 K) tensor names parse; the duplicate check's name comparisons stay
     within n log2 n and grow like n log n (n and 2n compared: ratio under 2.2, where a
     quadratic check gives 4), and the parser's peak memory is a small multiple of the
     header (a buffer per name sized to the rest of the header grows with n times the
     header); no timing;
   - __metadata__ must be an object of strings (`tttt`, numbers, arrays, nested objects and a
     second __metadata__ are refused); names must be UTF-8 (raw bytes and \u escapes:
     overlong forms, lone surrogates refused; a surrogate pair becomes its 4-byte UTF-8);
     zero_engine_add_tensor refuses a name that is not UTF-8, naming the byte;
   - an allocation failure on one rank inside zero_engine_load_safetensors (each allocation
     in turn, through ZERO_MALLOC) fails every rank's call and leaves every rank's params
     and master weights as they were; the retry loads the file on every rank. */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include <stddef.h>
static void *st_malloc(size_t bytes);
static void st_free(void *p);
#define ZERO_MALLOC(sz) st_malloc(sz)
#define ZERO_FREE(p) st_free(p)
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "tests/zt.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

/* ---- the hooks: live and peak bytes; a per-thread countdown to a failure ---------------- */

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t mem_live, mem_peak;
static ZERO__THREAD_LOCAL long countdown = -1; /* the countdown-th allocation fails */
static ZERO__THREAD_LOCAL int fired;

static void *st_malloc(size_t bytes)
{
    size_t *p;
    if (countdown >= 0 && countdown-- == 0) {
        fired = 1;
        return NULL;
    }
    p = (size_t *)malloc(bytes + 16);
    if (!p) return NULL;
    p[0] = bytes;
    pthread_mutex_lock(&mem_mu);
    mem_live += bytes;
    if (mem_live > mem_peak) mem_peak = mem_live;
    pthread_mutex_unlock(&mem_mu);
    return (unsigned char *)p + 16;
}

static void st_free(void *q)
{
    size_t *p;
    if (!q) return;
    p = (size_t *)(void *)((unsigned char *)q - 16);
    pthread_mutex_lock(&mem_mu);
    mem_live -= p[0];
    pthread_mutex_unlock(&mem_mu);
    free(p);
}

/* ---- headers -------------------------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = (char *)realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* n one-byte U8 tensors with names t<hash-like digits> in a scrambled order (so the sort
   works), tiling n data bytes. */
static void many_names(buf *b, int n)
{
    int i;
    b->n = 0;
    put(b, "{", 1);
    for (i = 0; i < n; i++) {
        char e[128];
        unsigned long long k = ((unsigned long long)i * 2654435761u) % 4294967291u;
        int len = snprintf(e, sizeof e, "%s\"t%010llu_%d\":{\"dtype\":\"U8\",\"shape\":[1],"
                           "\"data_offsets\":[%d,%d]}", i ? "," : "", k, i, i, i + 1);
        put(b, e, (size_t)len);
    }
    put(b, "}", 1);
}

static zero_result parse(const char *h, uint64_t data_bytes, zero__st_file *f)
{
    return zero__st_parse((const unsigned char *)h, strlen(h), data_bytes, "test.safetensors", f);
}

ZT_TEST(many_names_n_log_n)
{
    int n = getenv("ZT_QUICK") ? 1 << 17 : 1 << 20, k;
    uint64_t cmp[2];
    size_t hn[2], peak[2];
    buf b;
    memset(&b, 0, sizeof b);
    for (k = 0; k < 2; k++) {
        zero__st_file f;
        int m = k == 0 ? n / 2 : n;
        zero_result r;
        many_names(&b, m);
        pthread_mutex_lock(&mem_mu);
        mem_peak = mem_live;
        peak[k] = mem_live;
        pthread_mutex_unlock(&mem_mu);
        r = parse(b.p, (uint64_t)m, &f);
        ZT_CHECKF(r == ZERO_OK, "%d names: %s", m, zero_last_error());
        if (r != ZERO_OK) break;
        ZT_CHECK(f.n == m);
        cmp[k] = f.compares;
        hn[k] = b.n;
        pthread_mutex_lock(&mem_mu);
        peak[k] = mem_peak - peak[k];
        pthread_mutex_unlock(&mem_mu);
        /* every name found by the lookup the loader uses; one that is absent is not */
        ZT_CHECK(zero__st_find(&f, f.ent[m / 3].name) == &f.ent[m / 3]);
        ZT_CHECK(zero__st_find(&f, "t") == NULL);
        zero__st_free(&f);
        /* n log2 n bounds a merge sort's comparisons */
        ZT_CHECKF((double)cmp[k] <= (double)m * 21.0, "%d names: %llu comparisons", m,
                  (unsigned long long)cmp[k]);
        /* the entries (a fixed size each) and the names: a small multiple of the header */
        ZT_CHECKF(peak[k] <= 4 * hn[k], "%d names: peak %zu bytes for a header of %zu", m, peak[k], hn[k]);
    }
    if (cmp[0] > 0)
        ZT_CHECKF((double)cmp[1] / (double)cmp[0] < 2.2, "n = %d: %llu comparisons, n/2: %llu", n,
                  (unsigned long long)cmp[1], (unsigned long long)cmp[0]);
    /* a duplicate among them is found */
    many_names(&b, 1000);
    {
        char *second = strstr(b.p + 2, "\"t");
        zero__st_file f;
        memcpy(second + 1, b.p + 2, 13); /* the second name := the first ("t" + 10 digits + "_0") */
        ZT_CHECK(parse(b.p, 1000, &f) == ZERO_ERROR_IO && strstr(zero_last_error(), "appears twice"));
    }
    free(b.p);
}

ZT_TEST(metadata_is_an_object_of_strings)
{
    static const char *const bad[] = {
        "{\"__metadata__\": tttt}", "{\"__metadata__\": 5}", "{\"__metadata__\": true}",
        "{\"__metadata__\": [\"a\"]}", "{\"__metadata__\": \"a\"}", "{\"__metadata__\": {\"a\": 1}}",
        "{\"__metadata__\": {\"a\": {\"b\": \"c\"}}}", "{\"__metadata__\": {\"a\": null}}",
        "{\"__metadata__\": {\"a\": \"b\"}, \"__metadata__\": {}}", "{\"__metadata__\": {\"a\" \"b\"}}"};
    size_t i;
    zero__st_file f;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ZT_CHECKF(parse(bad[i], 0, &f) == ZERO_ERROR_IO, "accepted: %s", bad[i]);
    ZT_CHECK(parse("{\"__metadata__\": {\"format\": \"pt\", \"x\": \"\\u00e9\"}}", 0, &f) == ZERO_OK);
    zero__st_free(&f);
    ZT_CHECK(parse("{\"__metadata__\": {}}", 0, &f) == ZERO_OK);
    zero__st_free(&f);
}

ZT_TEST(names_are_utf8)
{
    static const char *const bad[] = {
        "\xff", "a\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\\ud800",
        "\\udc00x", "\\ud800\\u0041", "\\u12"};
    zero__st_file f;
    char h[256];
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", bad[i]);
        ZT_CHECKF(parse(h, 1, &f) == ZERO_ERROR_IO, "accepted name %zu", i);
    }
    /* U+1F600 as a surrogate pair, and as raw UTF-8: the same 4 bytes */
    ZT_CHECK(parse("{\"a\\ud83d\\ude00\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                   "\"\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, &f) == ZERO_OK);
    ZT_CHECK(f.n == 2 && strcmp(f.ent[0].name, "a\xf0\x9f\x98\x80") == 0 && strcmp(f.ent[1].name, "\xc3\xa9") == 0);
    zero__st_free(&f);
    { /* the engine refuses a name that is not UTF-8, and takes one that is */
        zero_plan *plan = NULL;
        ZT_CHECK(zero_plan_create(&plan, NULL) == ZERO_OK);
        ZT_CHECK(zero_plan_add(plan, "w\xff", 4, 0, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECKF(strstr(zero_last_error(), "not UTF-8") && strstr(zero_last_error(), "0xff"), "%s",
                  zero_last_error());
        ZT_CHECK(zero_plan_add(plan, "w\xc3\xa9\x01", 4, 0, NULL) == ZERO_OK);
        zero_plan_destroy(plan);
    }
}

/* ---- a failed load changes no rank -------------------------------------------------------- */

#define NT 3
static const size_t tn[NT] = {100, 37, 64};

typedef struct lctx {
    char path[64];
    int stage;
    int fail_rank;
    long k;               /* the allocation that fails on fail_rank */
    zero_result got[2];
    int fired, same_before[2], loaded[2];
    char msg[2][520];
} lctx;

static float init_value(int t, size_t i) { return 0.01f * (float)(t + 1) + 0.001f * (float)i; }
static float file_value(int t, size_t i) { return -0.5f + 0.25f * (float)t + 0.003f * (float)i; }

/* Writes the F32 file of file_value. */
static int write_file(const char *path)
{
    char h[512];
    size_t at = 0, hl, i;
    unsigned char len[8];
    int t, k;
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    hl = (size_t)snprintf(h, sizeof h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (t = 0; t < NT; t++) {
        hl += (size_t)snprintf(h + hl, sizeof h - hl, ",\"t%d\":{\"dtype\":\"F32\",\"shape\":[%zu],"
                               "\"data_offsets\":[%zu,%zu]}", t, tn[t], at, at + 4 * tn[t]);
        at += 4 * tn[t];
    }
    hl += (size_t)snprintf(h + hl, sizeof h - hl, "}");
    for (k = 0; k < 8; k++) len[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    fwrite(len, 1, 8, fp);
    fwrite(h, 1, hl, fp);
    for (t = 0; t < NT; t++)
        for (i = 0; i < tn[t]; i++) {
            float v = file_value(t, i);
            fwrite(&v, 4, 1, fp);
        }
    return fclose(fp);
}

/* Each tensor's master (this rank's range) and params, as bytes, compared to values(t, i). */
static int state_is(zero_engine *e, float (*values)(int, size_t))
{
    int t;
    for (t = 0; t < NT; t++) {
        float m[100];
        uint16_t p[100];
        zero_range rm, rp;
        size_t i;
        if (zero_engine_read_tensor(e, t, ZERO_STATE_MASTER, m, &rm) != ZERO_OK) return 0;
        if (zero_engine_read_tensor(e, t, ZERO_STATE_PARAM, p, &rp) != ZERO_OK) return 0;
        for (i = rm.offset; i < rm.offset + rm.numel; i++)
            if (m[i] != values(t, i)) return 0;
        for (i = rp.offset; i < rp.offset + rp.numel; i++)
            if (p[i] != zero_f32_to_f16(values(t, i))) return 0;
    }
    return 1;
}

static zero_result load_rank(int rank, zero_comm *comm, void *user)
{
    lctx *L = (lctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    float v[100];
    int t;
    size_t i;
    zero_result r = zero_host_device_create(NULL, &dev);
    memset(&d, 0, sizeof d);
    d.stage = L->stage;
    d.param_dtype = ZERO_F16;
    d.device = dev;
    d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    for (t = 0; t < NT && !r; t++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", t);
        r = zero_engine_add_tensor(e, name, tn[t], t == 0 ? 0 : 1, 0, NULL);
    }
    if (!r) r = zero_engine_commit(e);
    for (t = 0; t < NT && !r; t++) {
        for (i = 0; i < tn[t]; i++) v[i] = init_value(t, i);
        r = zero_engine_set_tensor(e, t, v);
    }
    if (!r) {
        if (rank == L->fail_rank) {
            fired = 0;
            countdown = L->k;
        }
        L->got[rank] = zero_engine_load_safetensors(e, L->path);
        if (rank == L->fail_rank) {
            countdown = -1;
            L->fired = fired;
        }
        snprintf(L->msg[rank], sizeof L->msg[rank], "%s", zero_last_error());
        L->same_before[rank] = state_is(e, init_value);
        if (L->got[rank] != ZERO_OK) /* the engine is usable: the retry loads the file */
            L->got[rank] = zero_engine_load_safetensors(e, L->path) == ZERO_OK ? ZERO_ERROR_IO : ZERO_ERROR_INVALID_STATE;
        L->loaded[rank] = state_is(e, file_value);
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(failed_load_changes_no_rank)
{
    lctx L;
    int st, rk;
    for (st = 1; st <= 3; st += 2) {
        long k;
        for (k = 0; k < 64; k++) {
            zero_result r;
            memset(&L, 0, sizeof L);
            snprintf(L.path, sizeof L.path, "/tmp/zt_st_load_%d.safetensors", (int)getpid());
            ZT_CHECK(write_file(L.path) == 0);
            L.stage = st;
            L.fail_rank = 1;
            L.k = k;
            r = zero_local_run(2, load_rank, &L);
            ZT_CHECKF(r == ZERO_OK, "stage %d k %ld: %s", st, k, zero_last_error());
            if (!L.fired) { /* past the last allocation: the load went through */
                for (rk = 0; rk < 2; rk++)
                    ZT_CHECKF(L.got[rk] == ZERO_OK && L.loaded[rk], "stage %d rank %d: %s", st, rk, L.msg[rk]);
                break;
            }
            for (rk = 0; rk < 2; rk++) {
                /* failed on every rank (IO: the retry succeeded), nothing changed, then loaded */
                ZT_CHECKF(L.got[rk] == ZERO_ERROR_IO, "stage %d k %ld rank %d: the failed load was "
                          "not refused everywhere or the retry failed (%d): %s", st, k, rk, L.got[rk], L.msg[rk]);
                ZT_CHECKF(L.same_before[rk], "stage %d k %ld rank %d: changed by a failed load", st, k, rk);
                ZT_CHECK(L.loaded[rk]);
            }
            ZT_CHECKF(strstr(L.msg[0], "reported by rank 1") != NULL, "%s", L.msg[0]);
        }
        ZT_CHECK(k > 3 && k < 64); /* several allocations were failed in turn */
    }
    remove(L.path);
}

/* A FIFO (or another special file) named as the safetensors file is refused at once with
   a clear message on every rank; the engine is unchanged (a child with an alarm: a hang
   fails the test instead of stalling the suite). */
static void fifo_child(void)
{
    lctx L;
    memset(&L, 0, sizeof L);
    snprintf(L.path, sizeof L.path, "/tmp/zt_st_fifo_%d.safetensors", (int)getpid());
    unlink(L.path);
    if (mkfifo(L.path, 0644) != 0) _exit(3);
    L.stage = 3;
    L.fail_rank = -1;
    alarm(60);
    if (zero_local_run(2, load_rank, &L) != ZERO_OK) _exit(4);
    unlink(L.path);
    if (L.got[0] == ZERO_OK || L.got[1] == ZERO_OK) _exit(5);
    if (!strstr(L.msg[0], "not a regular file (a FIFO)") || !L.same_before[0] || !L.same_before[1]) {
        fprintf(stderr, "fifo: %s\n", L.msg[0]);
        _exit(6);
    }
    _exit(0);
}

ZT_TEST(fifo_is_refused)
{
    int st = 0;
    pid_t pid;
    fflush(stdout);
    pid = fork();
    if (pid == 0) fifo_child();
    ZT_CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    ZT_CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s (status %d)",
              WIFSIGNALED(st) ? "hung (killed by the alarm)" : "checks failed", WEXITSTATUS(st));
}

/* ---- a Hugging Face checkpoint: sharded, prefix-less ---------------------------------------- */

/* Writes tensors t[first, last) of file_value under names "<prefix>t<k>" as one F32 file. */
static int write_part(const char *path, const char *prefix, int first, int last)
{
    char h[512];
    size_t at = 0, hl, i;
    unsigned char len[8];
    int t, k;
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    hl = (size_t)snprintf(h, sizeof h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (t = first; t < last; t++) {
        hl += (size_t)snprintf(h + hl, sizeof h - hl, ",\"%st%d\":{\"dtype\":\"F32\",\"shape\":[%zu],"
                               "\"data_offsets\":[%zu,%zu]}", prefix, t, tn[t], at, at + 4 * tn[t]);
        at += 4 * tn[t];
    }
    hl += (size_t)snprintf(h + hl, sizeof h - hl, "}");
    for (k = 0; k < 8; k++) len[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    fwrite(len, 1, 8, fp);
    fwrite(h, 1, hl, fp);
    for (t = first; t < last; t++)
        for (i = 0; i < tn[t]; i++) {
            float v = file_value(t, i);
            fwrite(&v, 4, 1, fp);
        }
    return fclose(fp);
}

typedef struct pctx {
    const char *path, *prefix;
    int use_plain; /* zero_engine_load_safetensors instead of zero_engine_load_pretrained */
    zero_result got[2];
    int unchanged[2], loaded[2];
    char msg[2][520];
} pctx;

/* Engine tensors "model.t<k>" at stage 3, f16 params, loaded from P->path. */
static zero_result pre_rank(int rank, zero_comm *comm, void *user)
{
    pctx *P = (pctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    float v[100];
    int t;
    size_t i;
    zero_result r = zero_host_device_create(NULL, &dev);
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.param_dtype = ZERO_F16;
    d.device = dev;
    d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    for (t = 0; t < NT && !r; t++) {
        char name[16];
        snprintf(name, sizeof name, "model.t%d", t % 10);
        r = zero_engine_add_tensor(e, name, tn[t], t == 0 ? 0 : 1, 0, NULL);
    }
    if (!r) r = zero_engine_commit(e);
    for (t = 0; t < NT && !r; t++) {
        for (i = 0; i < tn[t]; i++) v[i] = init_value(t, i);
        r = zero_engine_set_tensor(e, t, v);
    }
    if (!r) {
        P->got[rank] = P->use_plain ? zero_engine_load_safetensors(e, P->path)
                                    : zero_engine_load_pretrained(e, P->path, P->prefix);
        snprintf(P->msg[rank], sizeof P->msg[rank], "%s", zero_last_error());
        P->unchanged[rank] = state_is(e, init_value);
        P->loaded[rank] = state_is(e, file_value);
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    }
}

/* zero_engine_load_pretrained: a directory, a sharded index (weight_map over two files, with
   a metadata object holding numbers), names with and without the prefix; the index given to
   zero_engine_load_safetensors says it is JSON; a malformed index, a shard name with a '/'
   and a missing shard are refused on every rank with nothing changed. */
ZT_TEST(pretrained_sharded_and_prefixless)
{
    char dir[64], p[3][128], idx[128], text[512];
    pctx P;
    int rk, c;
    snprintf(dir, sizeof dir, "/tmp/zt_st_hf_%d", (int)getpid());
    ZT_CHECK(mkdir(dir, 0755) == 0);
    snprintf(p[0], sizeof p[0], "%s/model.safetensors", dir);
    snprintf(p[1], sizeof p[1], "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p[2], sizeof p[2], "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    for (c = 0; c < 8; c++) {
        const char *prefix = c == 0 || c == 2 ? "" : "model."; /* names in the files */
        const char *want = "";                                 /* a word the error must hold */
        memset(&P, 0, sizeof P);
        P.prefix = "model.";
        P.path = dir;
        remove(p[0]);
        remove(p[1]);
        remove(p[2]);
        remove(idx);
        if (c <= 1) { /* one file in the directory, either layout */
            ZT_CHECK(write_part(p[0], prefix, 0, NT) == 0);
        } else {      /* two shards and the index (a directory, then the index itself) */
            ZT_CHECK(write_part(p[1], prefix, 0, 2) == 0);
            ZT_CHECK(write_part(p[2], prefix, 2, NT) == 0);
            snprintf(text, sizeof text, "{\n  \"metadata\": {\"total_size\": 804, \"x\": [1, -2.5e3, true, null, {}]},\n"
                     "  \"weight_map\": {\"%st0\": \"model-00001-of-00002.safetensors\", \"%st1\": "
                     "\"model-00001-of-00002.safetensors\", \"%st2\": \"model-00002-of-00002.safetensors\"}\n}\n",
                     prefix, prefix, prefix);
            write_text(idx, text);
            if (c >= 3) P.path = idx;
            if (c == 4) P.use_plain = 1, want = "a JSON file, not a safetensors file";
            if (c == 5) write_text(idx, "{\"weight_map\": {\"model.t0\": \"../x.safetensors\"}}"), want = "not a plain file name";
            if (c == 6) remove(p[2]), want = "missing";
            if (c == 7) write_text(idx, "{\"weight_map\": {\"model.t0\" \"a\"}}"), want = "expected ':'";
        }
        ZT_CHECK(zero_local_run(2, pre_rank, &P) == ZERO_OK);
        for (rk = 0; rk < 2; rk++) {
            if (c <= 3) {
                ZT_CHECKF(P.got[rk] == ZERO_OK && P.loaded[rk], "case %d rank %d: %s", c, rk, P.msg[rk]);
            } else {
                ZT_CHECKF(P.got[rk] != ZERO_OK && P.unchanged[rk], "case %d rank %d: not refused or changed (%s)", c,
                          rk, P.msg[rk]);
                ZT_CHECKF(rk == 1 || strstr(P.msg[rk], want) != NULL, "case %d: '%s' lacks '%s'", c, P.msg[rk], want);
            }
        }
    }
    /* without the prefix, a prefix-less file's names are not found, naming both */
    memset(&P, 0, sizeof P);
    ZT_CHECK(write_part(p[0], "", 0, NT) == 0);
    P.path = p[0];
    P.prefix = "model.";
    P.use_plain = 1;
    ZT_CHECK(zero_local_run(2, pre_rank, &P) == ZERO_OK);
    ZT_CHECKF(P.got[0] == ZERO_ERROR_NOT_FOUND && strstr(P.msg[0], "'model.t0'"), "%s", P.msg[0]);
    remove(p[0]);
    remove(p[1]);
    remove(p[2]);
    remove(idx);
    ZT_CHECK(rmdir(dir) == 0);
}

int main(void)
{
    ZT_RUN(many_names_n_log_n);
    ZT_RUN(metadata_is_an_object_of_strings);
    ZT_RUN(names_are_utf8);
    ZT_RUN(failed_load_changes_no_rank);
    ZT_RUN(fifo_is_refused);
    ZT_RUN(pretrained_sharded_and_prefixless);
    return zt_summary();
}
