/* The NVMe I/O engine (zero_io_*): the checksum against its definition computed another
   way, round trips through both backends and both paths
   (O_DIRECT and buffered) checked against the bytes written and against the file read with
   plain stdio, many tickets in flight, the buffered fallback said once, and the faults of
   ZeRO-Infinity's NVMe tier: a missing, unwritable or full nvme_path, a failed request, a
   short read, a file truncated or changed under the engine. Swap-file names: a job that
   finds the names an earlier job with its pid left (a restart after kill -9, or another
   container's pid 1) still creates its files; the files of a job that is gone (its lock
   free, here a child process killed with SIGKILL) are removed at the next create with a
   log line, a live job's (a child holding its lock) and other files are not. Each test makes its own
   directory and removes it. ZT_NVME_DIR picks where (default: the first of /var/tmp, /tmp,
   build where O_DIRECT works). */
#define _XOPEN_SOURCE 700 /* POSIX names (mkdtemp, pwrite): zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "tests/zt.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <pthread.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

static char base_dir[512]; /* where O_DIRECT works, or "" */

/* ---- helpers ---- */

static zero_io *make_io(zero_io_backend backend, zero_io_direct direct, size_t block, int depth)
{
    zero_io_desc d;
    zero_io *io = NULL;
    memset(&d, 0, sizeof d);
    d.backend = backend;
    d.direct = direct;
    d.block_size = block;
    d.queue_depth = depth;
    if (zero_io_create(&d, &io) != ZERO_OK) return NULL;
    return io;
}

/* A fresh directory under parent (mkdtemp), "" on failure. */
static int make_dir(const char *parent, char *out, size_t size)
{
    snprintf(out, size, "%s/zt-nvme-XXXXXX", parent);
    if (!mkdtemp(out)) {
        out[0] = '\0';
        return -1;
    }
    return 0;
}

/* Removes the directory; fails the test if a file was left in it (rmdir refuses). */
static int remove_dir(const char *dir) { return rmdir(dir); }

static void fill(unsigned char *p, size_t n, unsigned long long seed)
{
    size_t i;
    zt_seed(seed);
    for (i = 0; i + 8 <= n; i += 8) {
        unsigned long long v = zt_rand64();
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (unsigned char)zt_rand64();
}

/* Reads [offset, offset + n) of path with stdio (no O_DIRECT, no engine). */
static int read_plain(const char *path, uint64_t offset, unsigned char *out, size_t n)
{
    FILE *fp = fopen(path, "rb");
    size_t got;
    if (!fp) return -1;
    if (fseek(fp, (long)offset, SEEK_SET) != 0) {
        fclose(fp);
        return -1;
    }
    got = fread(out, 1, n, fp);
    fclose(fp);
    return got == n ? 0 : -1;
}

static int contains(const char *s, const char *what) { return strstr(s, what) != NULL; }

static int log_calls;
static char log_text[512];
static void count_log(const char *message, void *user)
{
    (void)user;
    log_calls++;
    snprintf(log_text, sizeof log_text, "%s", message);
}

/* ---- checksum ---- */

/* The checksum's definition (zero.h), computed another way: B_j by its closed form
   sum (K - i) w_i instead of running sums, words assembled from bytes by hand. */
static uint64_t ref_mix(uint64_t h, uint64_t v)
{
    const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P4 = 0x85EBCA77C2B2AE63ull;
    v *= P2;
    v = (v << 31) | (v >> 33);
    v *= P1;
    return (h ^ v) * P1 + P4;
}

static uint64_t ref_checksum(const unsigned char *p, size_t n)
{
    const uint64_t P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull;
    size_t padded = (n + 31) / 32 * 32, K = padded / 32, i;
    uint64_t h = (uint64_t)n * P3;
    int j, k;
    for (j = 0; j < 8; j++) {
        uint64_t A = 0, B = 0;
        for (i = 0; i < K; i++) {
            uint64_t w = 0;
            for (k = 3; k >= 0; k--) {
                size_t at = 32 * i + 4 * (size_t)j + (size_t)k;
                w = (w << 8) | (at < n ? p[at] : 0u);
            }
            A += w;
            B += (uint64_t)(K - i) * w;
        }
        h = ref_mix(h, A);
        h = ref_mix(h, B);
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

ZT_TEST(checksum_definition_and_sensitivity)
{
    static const size_t sizes[] = {0, 1, 3, 4, 31, 32, 33, 63, 64, 100, 1000, 4099, 65536 + 5};
    unsigned char *buf = (unsigned char *)malloc(65536 + 64);
    size_t i;
    ZT_CHECK(buf != NULL);
    if (!buf) return;
    fill(buf, 65536 + 64, 11);
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        ZT_CHECKF(zero_io_checksum(buf, sizes[i]) == ref_checksum(buf, sizes[i]), "n = %zu", sizes[i]);
    /* all-ones words: the sums wrap mod 2^64 the same way */
    memset(buf, 0xff, 65536);
    ZT_CHECK(zero_io_checksum(buf, 65536) == ref_checksum(buf, 65536));
    fill(buf, 65536 + 64, 12);
    /* one flipped bit anywhere, two words swapped, a trailing zero byte: all change it */
    for (i = 0; i < 200; i++) {
        uint64_t h0 = zero_io_checksum(buf, 4099);
        size_t at = (size_t)(zt_rand64() % 4099);
        unsigned char bit = (unsigned char)(1u << (zt_rand64() % 8)), tmp[4];
        buf[at] ^= bit;
        ZT_CHECK(zero_io_checksum(buf, 4099) != h0);
        buf[at] ^= bit;
        if (memcmp(buf + 4 * (i % 500), buf + 4 * (i % 500) + 32, 4) != 0) {
            memcpy(tmp, buf + 4 * (i % 500), 4); /* same lane, neighbouring stripes */
            memcpy(buf + 4 * (i % 500), buf + 4 * (i % 500) + 32, 4);
            memcpy(buf + 4 * (i % 500) + 32, tmp, 4);
            ZT_CHECK(zero_io_checksum(buf, 4099) != h0);
            memcpy(buf + 4 * (i % 500) + 32, buf + 4 * (i % 500), 4);
            memcpy(buf + 4 * (i % 500), tmp, 4);
        }
        ZT_CHECK(zero_io_checksum(buf, 4099) == h0);
    }
    buf[100] = 0;
    ZT_CHECK(zero_io_checksum(buf, 100) != zero_io_checksum(buf, 101));
    ZT_CHECK(zero_io_checksum(NULL, 10) == 0);
    free(buf);
}

/* ---- create: arguments ---- */

ZT_TEST(create_arguments)
{
    zero_io_desc d;
    zero_io *io = (zero_io *)1;
    zero_io_stats st;
    memset(&d, 0, sizeof d);
    ZT_CHECK(zero_io_create(&d, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    d.block_size = 1000;
    ZT_CHECK(zero_io_create(&d, &io) == ZERO_ERROR_INVALID_ARGUMENT && io == NULL);
    ZT_CHECK(contains(zero_last_error(), "block_size = 1000"));
    d.block_size = 0;
    d.queue_depth = -1;
    ZT_CHECK(zero_io_create(&d, &io) == ZERO_ERROR_INVALID_ARGUMENT);
    d.queue_depth = 2000;
    ZT_CHECK(zero_io_create(&d, &io) == ZERO_ERROR_INVALID_ARGUMENT);
    d.queue_depth = 0;
    d.backend = (zero_io_backend)7;
    ZT_CHECK(zero_io_create(&d, &io) == ZERO_ERROR_INVALID_ARGUMENT);
    d.backend = ZERO_IO_BACKEND_AUTO;
    d.direct = (zero_io_direct)9;
    ZT_CHECK(zero_io_create(&d, &io) == ZERO_ERROR_INVALID_ARGUMENT);
    /* defaults: 1 MiB, 8, a resolved backend */
    ZT_CHECK(zero_io_create(NULL, &io) == ZERO_OK);
    ZT_CHECK(zero_io_get_stats(io, &st) == ZERO_OK);
    ZT_CHECK(st.block_size == (1u << 20) && st.queue_depth == 8);
    ZT_CHECK(st.backend == ZERO_IO_BACKEND_IO_URING || st.backend == ZERO_IO_BACKEND_THREADS);
    printf("  backend under AUTO: %s\n", zero_io_backend_name(st.backend));
    zero_io_destroy(io);
    zero_io_destroy(NULL);
}

ZT_TEST(buffers_are_aligned)
{
    zero_io *io = make_io(ZERO_IO_BACKEND_THREADS, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    void *p[5];
    size_t sizes[5] = {1, 4095, 4096, 4097, 3u << 20};
    int i;
    ZT_CHECK(io != NULL);
    if (!io) return;
    for (i = 0; i < 5; i++) {
        ZT_CHECK(zero_io_buffer_alloc(io, sizes[i], &p[i]) == ZERO_OK);
        ZT_CHECK(((uintptr_t)p[i] % ZERO_IO_ALIGN) == 0);
        memset(p[i], 0xab, (size_t)zero_io_align_up(sizes[i])); /* the rounded size is usable */
    }
    for (i = 0; i < 5; i++) zero_io_buffer_free(io, p[i]);
    ZT_CHECK(zero_io_buffer_alloc(io, 0, &p[0]) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_buffer_alloc(io, (size_t)-1, &p[0]) == ZERO_ERROR_OVERFLOW);
    zero_io_destroy(io);
}

/* ---- round trips ---- */

/* Writes 'tiles' ranges of assorted sizes (aligned and not, buffers aligned and not), all in
   flight at once, waits, checks the file with stdio, reads them back in another order (all
   in flight) and compares. */
static void round_trip(zero_io_backend backend, zero_io_direct direct, const char *parent,
                       int expect_direct)
{
    enum { TILES = 12 };
    size_t block = 64 * 1024, sizes[TILES];
    uint64_t offs[TILES], moff[TILES], total = 0, mtotal = 0; /* file and memory offsets */
    unsigned char *src, *dst, *plain;
    zero_io *io = make_io(backend, direct, block, 4);
    zero_io_file *f = NULL;
    zero_io_ticket t[TILES];
    zero_io_stats st;
    char dir[600];
    int i, scale = zt_quick() ? 1 : 4;
    ZT_CHECK(io != NULL);
    if (!io) return;
    ZT_CHECK(make_dir(parent, dir, sizeof dir) == 0);
    for (i = 0; i < TILES; i++) {
        /* whole blocks, a block and a bit, less than one alignment unit, odd sizes */
        size_t s = i % 4 == 0 ? 3 * block : i % 4 == 1 ? block + 100 : i % 4 == 2 ? (size_t)77 : (size_t)(50000 + i);
        sizes[i] = s * (size_t)(i % 4 == 1 ? scale : 1);
        offs[i] = total;
        moff[i] = mtotal; /* room for the one-byte shifts below */
        total += zero_io_align_up(sizes[i]);
        mtotal += zero_io_align_up(sizes[i]) + 64;
    }
    src = (unsigned char *)malloc((size_t)mtotal);
    dst = (unsigned char *)malloc((size_t)mtotal);
    plain = (unsigned char *)malloc((size_t)mtotal);
    ZT_CHECK(src && dst && plain);
    if (!src || !dst || !plain) goto done;
    fill(src, (size_t)mtotal, 42);
    memset(dst, 0, (size_t)mtotal);
    ZT_CHECK(zero_io_file_create(io, dir, "optim", 3, total, &f) == ZERO_OK);
    if (!f) goto done;
    ZT_CHECK(zero_io_file_direct(f) == expect_direct);
    ZT_CHECK(contains(zero_io_file_path(f), "zero-optim-r3-"));
    /* odd tiles come from a buffer at an odd address (bounced in O_DIRECT mode) */
    for (i = 0; i < TILES; i++)
        ZT_CHECK(zero_io_write(f, offs[i], src + moff[i] + (i & 1), sizes[i], &t[i]) == ZERO_OK);
    for (i = 0; i < TILES; i++) ZT_CHECKF(zero_io_wait(io, t[i]) == ZERO_OK, "%s", zero_last_error());
    for (i = 0; i < TILES; i++) {
        ZT_CHECK(read_plain(zero_io_file_path(f), offs[i], plain, sizes[i]) == 0);
        ZT_CHECKF(memcmp(plain, src + moff[i] + (i & 1), sizes[i]) == 0, "tile %d on disk", i);
    }
    for (i = TILES - 1; i >= 0; i--)
        ZT_CHECK(zero_io_read(f, offs[i], dst + moff[i] + (i % 3 == 0), sizes[i], &t[i]) == ZERO_OK);
    ZT_CHECK(zero_io_wait_all(io) == ZERO_OK);
    for (i = 0; i < TILES; i++)
        ZT_CHECKF(memcmp(dst + moff[i] + (i % 3 == 0), src + moff[i] + (i & 1), sizes[i]) == 0,
                  "tile %d read back", i);
    ZT_CHECK(zero_io_get_stats(io, &st) == ZERO_OK);
    ZT_CHECK(st.bytes_written == st.bytes_read && st.bytes_read > 0);
    ZT_CHECK(st.max_in_flight >= 2 && st.max_in_flight <= 4);
    ZT_CHECK(expect_direct ? st.bounced > 0 : st.bounced == 0);
done:
    zero_io_file_destroy(f);
    zero_io_destroy(io);
    free(src);
    free(dst);
    free(plain);
    ZT_CHECK(dir[0] == '\0' || remove_dir(dir) == 0); /* the file is gone */
}

ZT_TEST(round_trip_uring_direct)
{
    zero_io *probe = make_io(ZERO_IO_BACKEND_IO_URING, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    if (!probe) ZT_SKIP("io_uring not available here (the thread pool is tested below)");
    zero_io_destroy(probe);
    if (!base_dir[0]) ZT_SKIP("no directory where O_DIRECT works");
    round_trip(ZERO_IO_BACKEND_IO_URING, ZERO_IO_DIRECT_REQUIRE, base_dir, 1);
}

ZT_TEST(round_trip_uring_buffered)
{
    zero_io *probe = make_io(ZERO_IO_BACKEND_IO_URING, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    if (!probe) ZT_SKIP("io_uring not available here");
    zero_io_destroy(probe);
    round_trip(ZERO_IO_BACKEND_IO_URING, ZERO_IO_DIRECT_OFF, base_dir[0] ? base_dir : "/tmp", 0);
}

ZT_TEST(round_trip_threads_direct)
{
    if (!base_dir[0]) ZT_SKIP("no directory where O_DIRECT works");
    round_trip(ZERO_IO_BACKEND_THREADS, ZERO_IO_DIRECT_REQUIRE, base_dir, 1);
}

ZT_TEST(round_trip_threads_buffered)
{
    round_trip(ZERO_IO_BACKEND_THREADS, ZERO_IO_DIRECT_OFF, base_dir[0] ? base_dir : "/tmp", 0);
}

/* Queue depths beyond the thread pool's 64 workers, a block size that is not a power of
   two, and a depth of 1: the same bytes come back, and the requests in flight never exceed
   the depth. */
ZT_TEST(depths_and_block_sizes)
{
    static const struct { int backend, depth; size_t block; } cfg[] = {
        {ZERO_IO_BACKEND_THREADS, 100, 4096}, {ZERO_IO_BACKEND_IO_URING, 100, 4096},
        {ZERO_IO_BACKEND_THREADS, 1, 12288},  {ZERO_IO_BACKEND_IO_URING, 3, 12288}};
    size_t n = zt_quick() ? (size_t)600000 : (size_t)2500000;
    unsigned char *src = (unsigned char *)malloc(n), *dst = (unsigned char *)malloc(n);
    size_t c;
    char dir[600];
    ZT_CHECK(src && dst);
    if (!src || !dst) goto done;
    fill(src, n, 77);
    ZT_CHECK(make_dir(base_dir[0] ? base_dir : "/tmp", dir, sizeof dir) == 0);
    for (c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        zero_io *io = make_io((zero_io_backend)cfg[c].backend, ZERO_IO_DIRECT_DEFAULT, cfg[c].block, cfg[c].depth);
        zero_io_file *f = NULL;
        zero_io_ticket t;
        zero_io_stats st;
        if (!io) continue; /* io_uring missing here */
        memset(dst, 0, n);
        ZT_CHECK(zero_io_file_create(io, dir, "deep", 0, n, &f) == ZERO_OK);
        ZT_CHECK(zero_io_write(f, 0, src, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
        ZT_CHECK(zero_io_read(f, 0, dst, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
        ZT_CHECKF(memcmp(src, dst, n) == 0, "config %zu", c);
        ZT_CHECK(zero_io_get_stats(io, &st) == ZERO_OK);
        ZT_CHECKF(st.max_in_flight >= 1 && st.max_in_flight <= cfg[c].depth, "config %zu: %d in flight", c,
                  st.max_in_flight);
        ZT_CHECK(st.requests == 2 * ((n + cfg[c].block - 1) / cfg[c].block));
        zero_io_file_destroy(f);
        zero_io_destroy(io);
    }
    ZT_CHECK(remove_dir(dir) == 0);
done:
    free(src);
    free(dst);
}

/* The buffered fallback: O_DIRECT refused (injected as EINVAL, what tmpfs and overlayfs
   answer) gives a buffered file that works, said once per engine through the log callback;
   with REQUIRE it is an error and no file is left. */
ZT_TEST(buffered_fallback_said_once)
{
    zero_io_desc d;
    zero_io *io = NULL;
    zero_io_file *f1 = NULL, *f2 = NULL;
    zero_io_fault fault;
    zero_io_stats st;
    zero_io_ticket t;
    unsigned char src[10000], dst[10000];
    char dir[600];
    const char *parent = base_dir[0] ? base_dir : "/tmp";
    memset(&d, 0, sizeof d);
    d.log = count_log;
    log_calls = 0;
    ZT_CHECK(make_dir(parent, dir, sizeof dir) == 0);
    ZT_CHECK(zero_io_create(&d, &io) == ZERO_OK);
    if (!io) return;
    memset(&fault, 0, sizeof fault);
    fault.kind = ZERO_IO_FAULT_OPEN_DIRECT;
    ZT_CHECK(zero_io_inject_fault(io, &fault) == ZERO_OK);
    ZT_CHECK(zero_io_file_create(io, dir, "a", 0, 1 << 20, &f1) == ZERO_OK);
    ZT_CHECK(zero_io_inject_fault(io, &fault) == ZERO_OK);
    ZT_CHECK(zero_io_file_create(io, dir, "b", 0, 1 << 20, &f2) == ZERO_OK);
    ZT_CHECK(f1 && f2 && !zero_io_file_direct(f1) && !zero_io_file_direct(f2));
    ZT_CHECKF(log_calls == 1, "log called %d times", log_calls);
    ZT_CHECK(contains(log_text, "O_DIRECT refused") && contains(log_text, "buffered"));
    ZT_CHECK(zero_io_get_stats(io, &st) == ZERO_OK && st.buffered_fallbacks == 2);
    fill(src, sizeof src, 7);
    if (f2) {
        ZT_CHECK(zero_io_write(f2, 4096, src, sizeof src, &t) == ZERO_OK);
        ZT_CHECK(zero_io_wait(io, t) == ZERO_OK);
        ZT_CHECK(zero_io_read(f2, 4096, dst, sizeof dst, &t) == ZERO_OK);
        ZT_CHECK(zero_io_wait(io, t) == ZERO_OK);
        ZT_CHECK(memcmp(src, dst, sizeof src) == 0);
    }
    zero_io_file_destroy(f1);
    zero_io_file_destroy(f2);
    zero_io_destroy(io);
    /* REQUIRE: an error, nothing on disk */
    d.direct = ZERO_IO_DIRECT_REQUIRE;
    ZT_CHECK(zero_io_create(&d, &io) == ZERO_OK);
    if (io) {
        ZT_CHECK(zero_io_inject_fault(io, &fault) == ZERO_OK);
        ZT_CHECK(zero_io_file_create(io, dir, "c", 0, 1 << 20, &f1) == ZERO_ERROR_UNSUPPORTED && !f1);
        ZT_CHECK(contains(zero_last_error(), "O_DIRECT refused"));
        zero_io_destroy(io);
    }
    ZT_CHECK(log_calls == 1);
    ZT_CHECK(remove_dir(dir) == 0);
}

/* ---- faults: nvme_path ---- */

ZT_TEST(nvme_path_missing_or_not_a_directory)
{
    zero_io *io = make_io(ZERO_IO_BACKEND_AUTO, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    zero_io_file *f = (zero_io_file *)1;
    char dir[600], path[700];
    FILE *fp;
    ZT_CHECK(io != NULL);
    if (!io) return;
    ZT_CHECK(make_dir("/tmp", dir, sizeof dir) == 0);
    snprintf(path, sizeof path, "%s/missing", dir);
    ZT_CHECK(zero_io_file_create(io, path, "optim", 0, 4096, &f) == ZERO_ERROR_IO && f == NULL);
    ZT_CHECKF(contains(zero_last_error(), path) && contains(zero_last_error(), "must exist"), "%s",
              zero_last_error());
    snprintf(path, sizeof path, "%s/file", dir);
    fp = fopen(path, "wb");
    ZT_CHECK(fp != NULL);
    if (fp) fclose(fp);
    ZT_CHECK(zero_io_file_create(io, path, "optim", 0, 4096, &f) == ZERO_ERROR_IO);
    ZT_CHECK(contains(zero_last_error(), "not a directory"));
    unlink(path);
    /* bad arguments */
    ZT_CHECK(zero_io_file_create(io, dir, "a/b", 0, 4096, &f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_file_create(io, dir, "", 0, 4096, &f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_file_create(io, dir, "a", -1, 4096, &f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_file_create(io, dir, "a", 0, 0, &f) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_file_create(io, NULL, "a", 0, 1, &f) == ZERO_ERROR_INVALID_ARGUMENT);
    zero_io_destroy(io);
    ZT_CHECK(remove_dir(dir) == 0);
}

/* A read-only directory: chmod for a normal user; root ignores modes, so a read-only tmpfs
   mount then (skipped where mounting is not allowed). */
ZT_TEST(nvme_path_not_writable)
{
    zero_io *io = make_io(ZERO_IO_BACKEND_AUTO, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    zero_io_file *f = NULL;
    char dir[600];
    int mounted = 0;
    zero_result r;
    ZT_CHECK(io != NULL);
    if (!io) return;
    ZT_CHECK(make_dir("/tmp", dir, sizeof dir) == 0);
    if (geteuid() != 0) {
        ZT_CHECK(chmod(dir, 0500) == 0);
    } else if (mount("zt-nvme", dir, "tmpfs", MS_RDONLY, "size=1m") == 0) {
        mounted = 1;
    } else {
        zero_io_destroy(io);
        rmdir(dir);
        ZT_SKIP("running as root and mount(tmpfs, ro) not permitted here");
    }
    r = zero_io_file_create(io, dir, "optim", 0, 4096, &f);
    ZT_CHECKF(r == ZERO_ERROR_IO && f == NULL, "r = %d", (int)r);
    ZT_CHECKF(contains(zero_last_error(), "not writable") && contains(zero_last_error(), dir), "%s",
              zero_last_error());
    zero_io_file_destroy(f);
    if (mounted) ZT_CHECK(umount(dir) == 0);
    if (!mounted) chmod(dir, 0700);
    zero_io_destroy(io);
    ZT_CHECK(remove_dir(dir) == 0);
}

/* A full file system: a 1 MiB tmpfs asked for 2 MiB fails at create (the space is reserved
   up front), naming the bytes asked and free, and leaves nothing behind. */
ZT_TEST(nvme_path_full)
{
    zero_io *io = make_io(ZERO_IO_BACKEND_AUTO, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    zero_io_file *f = NULL;
    char dir[600];
    zero_result r;
    ZT_CHECK(io != NULL);
    if (!io) return;
    ZT_CHECK(make_dir("/tmp", dir, sizeof dir) == 0);
    if (mount("zt-nvme", dir, "tmpfs", 0, "size=1m") != 0) {
        zero_io_destroy(io);
        rmdir(dir);
        ZT_SKIP("mount(tmpfs, size=1m) not permitted here (ENOSPC is injected in failed_write_*)");
    }
    r = zero_io_file_create(io, dir, "optim", 0, 2u << 20, &f);
    ZT_CHECKF(r == ZERO_ERROR_IO && f == NULL, "r = %d", (int)r);
    ZT_CHECKF(contains(zero_last_error(), "No space left") && contains(zero_last_error(), "2097152 bytes"),
              "%s", zero_last_error());
    /* what fits still works */
    r = zero_io_file_create(io, dir, "optim", 0, 256u << 10, &f);
    ZT_CHECK(r == ZERO_OK);
    zero_io_file_destroy(f);
    zero_io_destroy(io);
    ZT_CHECK(umount(dir) == 0);
    ZT_CHECK(remove_dir(dir) == 0);
}

/* ---- faults: requests ---- */

/* The k-th request fails with ENOSPC: that ticket's wait names the file, offset and cause;
   the other tickets in flight are unaffected; the failed range reads as an error until it
   is written again; nothing hangs. Both backends. */
static void failed_write(zero_io_backend backend)
{
    size_t block = 16 * 1024, n = 5 * block;
    unsigned char *src = NULL, *dst = NULL;
    zero_io *io = make_io(backend, ZERO_IO_DIRECT_DEFAULT, block, 2);
    zero_io_file *f = NULL;
    zero_io_fault fault;
    zero_io_ticket t[3];
    char dir[600];
    const char *parent = base_dir[0] ? base_dir : "/tmp";
    int i;
    zero_result r;
    if (!io) ZT_SKIP("backend not available here");
    ZT_CHECK(make_dir(parent, dir, sizeof dir) == 0);
    ZT_CHECK(zero_io_buffer_alloc(io, 3 * n, (void **)&src) == ZERO_OK);
    ZT_CHECK(zero_io_buffer_alloc(io, 3 * n, (void **)&dst) == ZERO_OK);
    ZT_CHECK(zero_io_file_create(io, dir, "optim", 1, 3 * n, &f) == ZERO_OK);
    if (!src || !dst || !f) goto done;
    fill(src, 3 * n, 99);
    memset(&fault, 0, sizeof fault);
    fault.kind = ZERO_IO_FAULT_ERRNO;
    fault.request = 8; /* the 3rd block of the second tile (5 blocks per tile) */
    fault.err = ENOSPC;
    ZT_CHECK(zero_io_inject_fault(io, &fault) == ZERO_OK);
    for (i = 0; i < 3; i++) ZT_CHECK(zero_io_write(f, (uint64_t)i * n, src + i * n, n, &t[i]) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t[0]) == ZERO_OK);
    r = zero_io_wait(io, t[1]);
    ZT_CHECK(r == ZERO_ERROR_IO);
    ZT_CHECKF(contains(zero_last_error(), "write of") && contains(zero_last_error(), zero_io_file_path(f)) &&
                  contains(zero_last_error(), "No space left") &&
                  contains(zero_last_error(), "at offset 114688"),
              "%s", zero_last_error());
    ZT_CHECK(zero_io_wait(io, t[2]) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t[1]) == ZERO_ERROR_INVALID_ARGUMENT); /* forgotten */
    /* the failed range: an error at read; the others read back */
    ZT_CHECK(zero_io_read(f, n, dst + n, n, &t[1]) == ZERO_ERROR_IO);
    ZT_CHECK(contains(zero_last_error(), "failed"));
    ZT_CHECK(zero_io_read(f, 0, dst, n, &t[0]) == ZERO_OK);
    ZT_CHECK(zero_io_read(f, 2 * n, dst + 2 * n, n, &t[2]) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t[0]) == ZERO_OK && zero_io_wait(io, t[2]) == ZERO_OK);
    ZT_CHECK(memcmp(src, dst, n) == 0 && memcmp(src + 2 * n, dst + 2 * n, n) == 0);
    /* written again, it is whole */
    ZT_CHECK(zero_io_write(f, n, src + n, n, &t[1]) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t[1]) == ZERO_OK);
    ZT_CHECK(zero_io_read(f, n, dst + n, n, &t[1]) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t[1]) == ZERO_OK);
    ZT_CHECK(memcmp(src + n, dst + n, n) == 0);
done:
    zero_io_file_destroy(f);
    zero_io_buffer_free(io, src);
    zero_io_buffer_free(io, dst);
    zero_io_destroy(io);
    ZT_CHECK(remove_dir(dir) == 0);
}

ZT_TEST(failed_write_threads) { failed_write(ZERO_IO_BACKEND_THREADS); }
ZT_TEST(failed_write_uring) { failed_write(ZERO_IO_BACKEND_IO_URING); }

/* Short reads: injected (a request that meets the end of the file), and real (the file
   truncated under the engine); a file changed under the engine: a checksum mismatch. */
static void short_and_changed(zero_io_backend backend, zero_io_direct direct)
{
    size_t block = 8192, n = 4 * block + 300;
    unsigned char *src = NULL, *dst = NULL;
    zero_io *io = make_io(backend, direct, block, 3);
    zero_io_file *f = NULL;
    zero_io_fault fault;
    zero_io_ticket t;
    char dir[600];
    const char *parent = base_dir[0] ? base_dir : "/tmp";
    uint64_t off2 = zero_io_align_up(n);
    int fd;
    if (!io) ZT_SKIP("backend not available here");
    ZT_CHECK(make_dir(parent, dir, sizeof dir) == 0);
    src = (unsigned char *)malloc(2 * n);
    dst = (unsigned char *)malloc(2 * n);
    ZT_CHECK(zero_io_file_create(io, dir, "param", 2, 2 * off2, &f) == ZERO_OK);
    if (!src || !dst || !f) goto done;
    fill(src, 2 * n, 5);
    ZT_CHECK(zero_io_write(f, 0, src, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(zero_io_write(f, off2, src + n, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    /* injected short read on the 2nd request */
    memset(&fault, 0, sizeof fault);
    fault.kind = ZERO_IO_FAULT_SHORT;
    fault.request = 2;
    ZT_CHECK(zero_io_inject_fault(io, &fault) == ZERO_OK);
    ZT_CHECK(zero_io_read(f, 0, dst, n, &t) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t) == ZERO_ERROR_IO);
    ZT_CHECKF(contains(zero_last_error(), "short read") && contains(zero_last_error(), "offset 8192"), "%s",
              zero_last_error());
    /* the range is fine: the next read succeeds */
    ZT_CHECK(zero_io_read(f, 0, dst, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(memcmp(dst, src, n) == 0);
    /* a byte changed under the engine (another writer) */
    fd = open(zero_io_file_path(f), O_WRONLY);
    ZT_CHECK(fd >= 0);
    if (fd >= 0) {
        unsigned char x = (unsigned char)(src[1000] ^ 1);
        ZT_CHECK(pwrite(fd, &x, 1, 1000) == 1);
        fsync(fd);
        close(fd);
    }
    ZT_CHECK(zero_io_read(f, 0, dst, n, &t) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t) == ZERO_ERROR_IO);
    ZT_CHECKF(contains(zero_last_error(), "checksum mismatch") && contains(zero_last_error(), "changed under"),
              "%s", zero_last_error());
    /* a byte changed in each block of the range (its CRC is joined from one per block, the
       last one short): detected wherever it is; put back, the range reads again */
    fd = open(zero_io_file_path(f), O_WRONLY);
    ZT_CHECK(fd >= 0);
    if (fd >= 0) {
        static const size_t at[] = {1000, 8192 + 7, 2 * 8192 + 4095, 3 * 8192, 4 * 8192 + 299};
        size_t i;
        for (i = 0; i < sizeof at / sizeof at[0]; i++) {
            unsigned char x = (unsigned char)(src[at[i]] ^ 0x40);
            size_t back = at[i == 0 ? 0 : i - 1]; /* the byte changed before, put back */
            ZT_CHECK(pwrite(fd, &src[back], 1, (off_t)back) == 1 && fsync(fd) == 0);
            ZT_CHECK(zero_io_read(f, 0, dst, n, &t) == ZERO_OK);
            ZT_CHECKF(zero_io_wait(io, t) == ZERO_OK && memcmp(dst, src, n) == 0, "%s", zero_last_error());
            ZT_CHECK(pwrite(fd, &x, 1, (off_t)at[i]) == 1 && fsync(fd) == 0);
            ZT_CHECK(zero_io_read(f, 0, dst, n, &t) == ZERO_OK);
            ZT_CHECKF(zero_io_wait(io, t) == ZERO_ERROR_IO && contains(zero_last_error(), "checksum mismatch"),
                      "byte %zu: %s", at[i], zero_last_error());
        }
        ZT_CHECK(pwrite(fd, &src[at[4]], 1, (off_t)at[4]) == 1 && fsync(fd) == 0);
        close(fd);
        ZT_CHECK(zero_io_read(f, 0, dst, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
        ZT_CHECK(memcmp(dst, src, n) == 0);
    }
    /* truncated under the engine: the second range ends past the new end of the file */
    ZT_CHECK(truncate(zero_io_file_path(f), (off_t)(off2 + 2 * block)) == 0);
    ZT_CHECK(zero_io_read(f, off2, dst + n, n, &t) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t) == ZERO_ERROR_IO);
    ZT_CHECKF(contains(zero_last_error(), "short read") && contains(zero_last_error(), "end of file"), "%s",
              zero_last_error());
done:
    zero_io_file_destroy(f);
    zero_io_destroy(io);
    free(src);
    free(dst);
    ZT_CHECK(remove_dir(dir) == 0);
}

ZT_TEST(short_read_and_changed_file_threads_direct)
{
    if (!base_dir[0]) ZT_SKIP("no directory where O_DIRECT works");
    short_and_changed(ZERO_IO_BACKEND_THREADS, ZERO_IO_DIRECT_REQUIRE);
}
ZT_TEST(short_read_and_changed_file_threads_buffered)
{
    short_and_changed(ZERO_IO_BACKEND_THREADS, ZERO_IO_DIRECT_OFF);
}
ZT_TEST(short_read_and_changed_file_uring_direct)
{
    if (!base_dir[0]) ZT_SKIP("no directory where O_DIRECT works");
    short_and_changed(ZERO_IO_BACKEND_IO_URING, ZERO_IO_DIRECT_REQUIRE);
}
ZT_TEST(short_read_and_changed_file_uring_buffered)
{
    short_and_changed(ZERO_IO_BACKEND_IO_URING, ZERO_IO_DIRECT_OFF);
}

/* ---- misuse ---- */

ZT_TEST(reads_name_written_ranges)
{
    zero_io *io = make_io(ZERO_IO_BACKEND_AUTO, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    zero_io_file *f = NULL;
    zero_io_ticket t, t2;
    unsigned char *a = NULL, *b = NULL;
    size_t n = 3u << 20;
    char dir[600];
    ZT_CHECK(io != NULL);
    if (!io) return;
    ZT_CHECK(make_dir(base_dir[0] ? base_dir : "/tmp", dir, sizeof dir) == 0);
    ZT_CHECK(zero_io_buffer_alloc(io, n, (void **)&a) == ZERO_OK);
    ZT_CHECK(zero_io_buffer_alloc(io, n, (void **)&b) == ZERO_OK);
    ZT_CHECK(zero_io_file_create(io, dir, "m", 0, 2 * n, &f) == ZERO_OK);
    if (!a || !b || !f) goto done;
    fill(a, n, 3);
    ZT_CHECK(zero_io_read(f, 0, b, n, &t) == ZERO_ERROR_INVALID_ARGUMENT); /* never written */
    ZT_CHECK(t == 0);
    ZT_CHECK(zero_io_write(f, 100, a, n, &t) == ZERO_ERROR_INVALID_ARGUMENT); /* unaligned */
    ZT_CHECK(zero_io_write(f, 2 * n - 4096, a, 8192, &t) == ZERO_ERROR_INVALID_ARGUMENT); /* past end */
    ZT_CHECK(zero_io_write(f, 0, a, 0, &t) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_write(f, 0, NULL, 1, &t) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_write(f, 0, a, n, &t) == ZERO_OK);
    /* its write is not waited for yet: reading it, or writing over it, is refused */
    ZT_CHECK(zero_io_read(f, 0, b, n, &t2) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(zero_io_write(f, 4096, a, 4096, &t2) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t) == ZERO_ERROR_INVALID_ARGUMENT); /* twice */
    ZT_CHECK(zero_io_wait(io, 0) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_read(f, 0, b, n - 1, &t) == ZERO_ERROR_INVALID_ARGUMENT); /* other size */
    ZT_CHECK(contains(zero_last_error(), "were written"));
    ZT_CHECK(zero_io_read(f, 4096, b, 4096, &t) == ZERO_ERROR_INVALID_ARGUMENT); /* inside */
    /* a queued read blocks a write over it until waited for */
    ZT_CHECK(zero_io_read(f, 0, b, n, &t) == ZERO_OK);
    ZT_CHECK(zero_io_write(f, 0, a, n, &t2) == ZERO_ERROR_INVALID_STATE);
    ZT_CHECK(zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(memcmp(a, b, n) == 0);
    /* an overlapping write forgets the old range */
    ZT_CHECK(zero_io_write(f, n - 4096, a, 8192, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(zero_io_read(f, 0, b, n, &t) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_io_read(f, n - 4096, b, 8192, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(memcmp(a, b, 8192) == 0);
    /* tickets left behind: destroy waits for them and frees them (ASan checks the leak) */
    ZT_CHECK(zero_io_write(f, n, a, n, &t) == ZERO_OK);
done:
    zero_io_file_destroy(f);
    zero_io_buffer_free(io, a);
    zero_io_buffer_free(io, b);
    zero_io_destroy(io);
    ZT_CHECK(remove_dir(dir) == 0);
}

/* A range declared zero reads back as zeros without a byte written (the preallocated file
   holds them); its read checks every byte is zero, so a byte changed under the engine
   fails; a declaration may not overlap a range written before; a write replaces it. */
ZT_TEST(declared_zero_ranges)
{
    zero_io *io = make_io(ZERO_IO_BACKEND_AUTO, ZERO_IO_DIRECT_DEFAULT, 0, 0);
    zero_io_file *f = NULL;
    zero_io_ticket t;
    zero_io_stats st;
    unsigned char *a = NULL, *b = NULL;
    size_t n = 1u << 20, i, nz = 0;
    char dir[600];
    int fd;
    ZT_CHECK(io != NULL);
    if (!io) return;
    ZT_CHECK(make_dir(base_dir[0] ? base_dir : "/tmp", dir, sizeof dir) == 0);
    ZT_CHECK(zero_io_buffer_alloc(io, n, (void **)&a) == ZERO_OK);
    ZT_CHECK(zero_io_buffer_alloc(io, n, (void **)&b) == ZERO_OK);
    ZT_CHECK(zero_io_file_create(io, dir, "z", 0, 3 * n, &f) == ZERO_OK);
    if (!a || !b || !f) goto done;
    ZT_CHECK(zero_io_declare_zeros(f, 0, n + 100) == ZERO_OK);
    ZT_CHECK(zero_io_declare_zeros(f, 2 * n, n) == ZERO_OK);
    ZT_CHECK(zero_io_declare_zeros(f, 4096, 10) == ZERO_ERROR_INVALID_STATE); /* overlaps */
    ZT_CHECK(zero_io_declare_zeros(f, 100, 10) == ZERO_ERROR_INVALID_ARGUMENT); /* unaligned */
    ZT_CHECK(zero_io_declare_zeros(f, 3 * n, 4096) == ZERO_ERROR_INVALID_ARGUMENT); /* past end */
    ZT_CHECK(zero_io_get_stats(io, &st) == ZERO_OK && st.bytes_written == 0);
    memset(b, 0xAB, n);
    ZT_CHECK(zero_io_read(f, 2 * n, b, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    for (i = 0; i < n; i++) nz += b[i] != 0;
    ZT_CHECK(nz == 0);
    ZT_CHECK(zero_io_read(f, 0, b, n, &t) == ZERO_ERROR_INVALID_ARGUMENT); /* other size */
    /* a byte changed through another descriptor: the read fails, naming the byte */
    fd = open(zero_io_file_path(f), O_WRONLY);
    ZT_CHECK(fd >= 0);
    if (fd >= 0) {
        ZT_CHECK(pwrite(fd, "x", 1, 2 * n + 777) == 1);
        close(fd);
    }
    ZT_CHECK(zero_io_read(f, 2 * n, b, n, &t) == ZERO_OK);
    ZT_CHECK(zero_io_wait(io, t) == ZERO_ERROR_IO);
    ZT_CHECK(contains(zero_last_error(), "byte 777 is not zero"));
    /* a write replaces the declaration; the range then reads back with its checksum */
    fill(a, n, 5);
    ZT_CHECK(zero_io_write(f, 2 * n, a, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(zero_io_read(f, 2 * n, b, n, &t) == ZERO_OK && zero_io_wait(io, t) == ZERO_OK);
    ZT_CHECK(memcmp(a, b, n) == 0);
    ZT_CHECK(zero_io_declare_zeros(NULL, 0, 4096) == ZERO_ERROR_INVALID_ARGUMENT);
done:
    zero_io_file_destroy(f);
    zero_io_buffer_free(io, a);
    zero_io_buffer_free(io, b);
    zero_io_destroy(io);
    ZT_CHECK(remove_dir(dir) == 0);
}

/* ---- several threads (ranks) on one engine, each its own file ---- */

typedef struct rank_arg {
    zero_io *io;
    const char *dir;
    int rank, ok;
} rank_arg;

static void *rank_main(void *p)
{
    rank_arg *a = (rank_arg *)p;
    size_t tile = 100000, tiles = 6, i, slot = (size_t)zero_io_align_up(tile);
    unsigned char *src = (unsigned char *)malloc(tile * tiles), *dst = (unsigned char *)malloc(tile * tiles);
    zero_io_file *f = NULL;
    zero_io_ticket t[6];
    int ok = src && dst;
    if (ok) ok = zero_io_file_create(a->io, a->dir, "optim", a->rank, slot * tiles, &f) == ZERO_OK;
    if (ok) {
        unsigned long long s = 1000 + (unsigned long long)a->rank;
        for (i = 0; i < tile * tiles; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            src[i] = (unsigned char)(s >> 56);
        }
        for (i = 0; i < tiles && ok; i++) ok = zero_io_write(f, i * slot, src + i * tile, tile, &t[i]) == ZERO_OK;
        for (i = 0; i < tiles && ok; i++) ok = zero_io_wait(a->io, t[i]) == ZERO_OK;
        for (i = 0; i < tiles && ok; i++) ok = zero_io_read(f, i * slot, dst + i * tile, tile, &t[i]) == ZERO_OK;
        for (i = 0; i < tiles && ok; i++) ok = zero_io_wait(a->io, t[i]) == ZERO_OK;
        ok = ok && memcmp(src, dst, tile * tiles) == 0;
    }
    zero_io_file_destroy(f);
    free(src);
    free(dst);
    a->ok = ok;
    return NULL;
}

ZT_TEST(ranks_share_an_engine)
{
    enum { R = 4 };
    pthread_t th[R];
    rank_arg args[R];
    char dir[600];
    int b, r;
    for (b = 1; b <= 2; b++) {
        zero_io *io = make_io((zero_io_backend)b, ZERO_IO_DIRECT_DEFAULT, 32768, 4);
        if (!io) continue; /* io_uring missing: the threads pass still runs */
        ZT_CHECK(make_dir(base_dir[0] ? base_dir : "/tmp", dir, sizeof dir) == 0);
        for (r = 0; r < R; r++) {
            args[r].io = io;
            args[r].dir = dir;
            args[r].rank = r;
            args[r].ok = 0;
            ZT_CHECK(pthread_create(&th[r], NULL, rank_main, &args[r]) == 0);
        }
        for (r = 0; r < R; r++) {
            pthread_join(th[r], NULL);
            ZT_CHECKF(args[r].ok, "%s rank %d", zero_io_backend_name((zero_io_backend)b), r);
        }
        zero_io_destroy(io);
        ZT_CHECK(remove_dir(dir) == 0);
    }
}

/* ---- swap-file names and the files of dead jobs ---- */

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int log_lines;
static char log_all[4096];
static void keep_log(const char *message, void *user)
{
    size_t at = strlen(log_all);
    (void)user;
    log_lines++;
    snprintf(log_all + at, sizeof log_all - at, "%s\n", message);
}

ZT_TEST(swap_files_of_dead_jobs)
{
    zero_io_desc d;
    zero_io *a = NULL, *b = NULL;
    zero_io_file *fa = NULL, *fb = NULL, *fc = NULL;
    char dir[600], path[800], dead[800], live[800], other[800], child_file[800];
    int k, p1[2], p2[2], fd;
    char c = 0;
    pid_t pid;
    const char *parent = "/tmp";
    memset(&d, 0, sizeof d);
    d.direct = ZERO_IO_DIRECT_OFF;
    d.log = keep_log;
    ZT_CHECK(make_dir(parent, dir, sizeof dir) == 0);
    /* an earlier job with this pid left files under the names this process would have used
       (pid and a counter): the new names do not collide with them */
    for (k = 0; k < 400; k++) {
        snprintf(path, sizeof path, "%s/zero-optim-r0-%ld-%d.bin", dir, (long)getpid(), k);
        fd = open(path, O_CREAT | O_WRONLY, 0600);
        if (fd >= 0) close(fd);
    }
    /* a dead job's file (no lock), a file some live job holds, and a file of the user's */
    snprintf(dead, sizeof dead, "%s/zero-optim-r3-1-0123456789abcdef.bin", dir);
    snprintf(live, sizeof live, "%s/zero-param-r1-1-fedcba9876543210.bin", dir);
    snprintf(other, sizeof other, "%s/zero-notes.bin", dir);
    fd = open(dead, O_CREAT | O_WRONLY, 0600);
    ZT_CHECK(fd >= 0 && write(fd, "dead", 4) == 4);
    if (fd >= 0) close(fd);
    fd = open(other, O_CREAT | O_WRONLY, 0600);
    ZT_CHECK(fd >= 0 && write(fd, "mine", 4) == 4);
    if (fd >= 0) close(fd);
    /* an empty one (a live job's between its create and its lock): left alone */
    snprintf(path, sizeof path, "%s/zero-optim-r4-1-00000000000000aa.bin", dir);
    fd = open(path, O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) close(fd);
    /* the live job: a child process that takes its file's lock, waits, and is killed */
    ZT_CHECK(pipe(p1) == 0 && pipe(p2) == 0);
    snprintf(child_file, sizeof child_file, "%s", live);
    pid = fork();
    if (pid == 0) {
        int cfd = open(child_file, O_CREAT | O_RDWR | O_EXCL, 0600);
        if (cfd < 0 || flock(cfd, LOCK_EX | LOCK_NB) != 0 || write(cfd, "live", 4) != 4) _exit(1);
        if (write(p1[1], "x", 1) != 1) _exit(1);
        if (read(p2[0], &c, 1) < 0) _exit(1); /* until killed */
        _exit(0);
    }
    ZT_CHECK(pid > 0 && read(p1[0], &c, 1) == 1);
    log_lines = 0;
    log_all[0] = '\0';
    ZT_CHECK(zero_io_create(&d, &a) == ZERO_OK);
    ZT_CHECK(zero_io_create(&d, &b) == ZERO_OK);
    if (!a || !b) return;
    /* two jobs (two engines) with the same name and rank in one directory: both create */
    ZT_CHECKF(zero_io_file_create(a, dir, "optim", 0, 8192, &fa) == ZERO_OK, "%s", zero_last_error());
    ZT_CHECKF(zero_io_file_create(b, dir, "optim", 0, 8192, &fb) == ZERO_OK, "%s", zero_last_error());
    ZT_CHECK(fa && fb && strcmp(zero_io_file_path(fa), zero_io_file_path(fb)) != 0);
    /* the dead job's file went, with a log line; the live one's, the user's and engine a's
       (live: b's create swept after a's) stay */
    ZT_CHECK(!exists(dead) && exists(live) && exists(other) && exists(path));
    unlink(path);
    ZT_CHECK(fa && exists(zero_io_file_path(fa)));
    ZT_CHECKF(log_lines == 1 && contains(log_all, dead) && contains(log_all, "gone"), "%d lines: %s",
              log_lines, log_all);
    /* kill -9 the live job: its lock goes with it, and the next create removes its file */
    ZT_CHECK(kill(pid, SIGKILL) == 0 && waitpid(pid, NULL, 0) == pid);
    ZT_CHECK(exists(live));
    ZT_CHECK(zero_io_file_create(b, dir, "param", 1, 8192, &fc) == ZERO_OK);
    ZT_CHECKF(!exists(live) && log_lines == 2 && contains(log_all, live), "%s", log_all);
    ZT_CHECK(fa && fb && exists(zero_io_file_path(fa)) && exists(zero_io_file_path(fb)));
    zero_io_file_destroy(fa);
    zero_io_file_destroy(fb);
    zero_io_file_destroy(fc);
    zero_io_destroy(a);
    zero_io_destroy(b);
    close(p1[0]);
    close(p1[1]);
    close(p2[0]);
    close(p2[1]);
    for (k = 0; k < 400; k++) {
        snprintf(path, sizeof path, "%s/zero-optim-r0-%ld-%d.bin", dir, (long)getpid(), k);
        unlink(path);
    }
    unlink(other);
    ZT_CHECKF(remove_dir(dir) == 0, "%s: files left", dir);
}

/* Picks the directory for the O_DIRECT tests. */
static void find_base_dir(void)
{
    const char *env = getenv("ZT_NVME_DIR");
    const char *cands[4];
    int i, n = 0;
    zero_io *io = make_io(ZERO_IO_BACKEND_THREADS, ZERO_IO_DIRECT_REQUIRE, 0, 1);
    if (env && *env) cands[n++] = env;
    cands[n++] = "/var/tmp";
    cands[n++] = "/tmp";
    cands[n++] = "build";
    if (!io) return;
    for (i = 0; i < n && !base_dir[0]; i++) {
        zero_io_file *f = NULL;
        if (zero_io_file_create(io, cands[i], "probe", 0, 4096, &f) == ZERO_OK) {
            snprintf(base_dir, sizeof base_dir, "%s", cands[i]);
            zero_io_file_destroy(f);
        }
    }
    zero_io_destroy(io);
    if (base_dir[0])
        printf("  O_DIRECT tests under %s\n", base_dir);
    else
        printf("  no directory takes O_DIRECT here: the direct-path tests skip\n");
}

int main(void)
{
    find_base_dir();
    ZT_RUN(checksum_definition_and_sensitivity);
    ZT_RUN(create_arguments);
    ZT_RUN(buffers_are_aligned);
    ZT_RUN(round_trip_uring_direct);
    ZT_RUN(round_trip_uring_buffered);
    ZT_RUN(round_trip_threads_direct);
    ZT_RUN(round_trip_threads_buffered);
    ZT_RUN(depths_and_block_sizes);
    ZT_RUN(buffered_fallback_said_once);
    ZT_RUN(nvme_path_missing_or_not_a_directory);
    ZT_RUN(nvme_path_not_writable);
    ZT_RUN(nvme_path_full);
    ZT_RUN(failed_write_threads);
    ZT_RUN(failed_write_uring);
    ZT_RUN(short_read_and_changed_file_threads_direct);
    ZT_RUN(short_read_and_changed_file_threads_buffered);
    ZT_RUN(short_read_and_changed_file_uring_direct);
    ZT_RUN(short_read_and_changed_file_uring_buffered);
    ZT_RUN(reads_name_written_ranges);
    ZT_RUN(declared_zero_ranges);
    ZT_RUN(ranks_share_an_engine);
    ZT_RUN(swap_files_of_dead_jobs);
    return zt_summary();
}
