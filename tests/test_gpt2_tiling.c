/* The GPT-2 example with --tile-embedding K (the tied wte registered as K tile groups,
   gathered one tile at a time for the lookup, the LM head and its backward) against the same
   run without it.

   What must be equal, and why. Tiled, every parameter element sees the same arithmetic in
   the same order as untiled: the lookup adds the same two rows, each logit sums the same C
   products in order, dlnf adds the products over the vocabulary in the same order (tile by
   tile = row by row), and each wte gradient element is the head's sum over positions and
   then the lookup's additions in position order, as untiled; the engine's operations are
   elementwise. One thing is grouped differently: the global gradient norm's fp64 sum of
   squares is taken per group's shard (8 lanes, blocks of 65536), and the tiles are groups.
   So:
   - with --clip 0 the norm changes no parameter: every step's loss, every validation loss
     and the final params checksum are bit-identical;
   - the logged norm may differ. Bound: the squares of fp32 (also bf16/fp16) values are exact
     in fp64 and non-negative, so any summation order of n of them returns S (1 + t) with
     |t| <= gamma(n-1) = (n-1) u / (1 - (n-1) u), u = 2^-53 (Higham, Accuracy and Stability,
     4.2); two orders differ by a relative 2 gamma(n-1) at most, sqrt halves that, and the
     product by the unscale adds at most 2u. For these models (n < 2^20) that is < 2^-32,
     far below the float spacing relative to the value (>= 2^-24), so the two norms, each
     rounded to nearest float, are equal or adjacent floats: at most 1 ulp apart, asserted;
   - with clipping active the multiplier clip / (norm + 1e-6) is a function of that float,
     so while every step's norm so far was bit-equal the runs are bit-identical: asserted
     step by step (loss of step s equal when norms 0..s-1 were equal; params checksum equal
     when every norm was). Past a step whose norm differs by its 1 ulp, the runs may part in
     the last bits and nothing more is asserted of them.
   Stages 0-3, 2 ranks, accumulation 2, an uneven split (256 rows in 3 tiles), bf16, and at
   stage 3 params, gradients and optimizer state on NVMe with a small device budget against
   the plain untiled run (ZeRO-Infinity's code path at a small size). At stage 3 the tiled arena (the
   "gather" bytes of the memory report) is smaller than the untiled one.

   The second test commits GPT-2 124M's shapes (--preset 124M, the example's registration
   and engine settings from gpt2_common.h) on 4 ranks at stage 3, untiled and with
   --tile-embedding 8, on a device whose large buffers are lazy zero mappings (so no memory is
   touched): the default arena (max_live_numel) is the largest group plus two of the
   second-largest (docs/engine.md), i.e. wte + wpe + ln_f plus two blocks untiled, and three
   blocks tiled (a tile is smaller than a block), and the device bytes drop by the difference.
   Runs build/train_gpt2 from the repository root; the first test skips without it. */
#define _DEFAULT_SOURCE /* mkdtemp, popen, MAP_ANONYMOUS */
#include "zero.h"
#include "examples/gpt2_common.h"
#include "tests/zt.h"
#include "tests/lazy_device.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "build/train_gpt2"
#define MAX_STEPS 16

static char dir[64];

typedef struct result {
    char out[16384];
    int steps;
    double loss[MAX_STEPS], val[MAX_STEPS];
    float norm[MAX_STEPS];
    char sum[40];
    double gather_bytes; /* rank 0's arena from the memory report (stage 3), -1 if none */
} result;

/* Runs the example with args, reads its --log CSV and output into *R. 0 on success. */
static int run(const char *args, result *R)
{
    char cmd[1024], log[128], line[256];
    const char *p;
    FILE *f;
    size_t n;
    memset(R, 0, sizeof *R);
    snprintf(log, sizeof log, "%s/log.csv", dir);
    snprintf(cmd, sizeof cmd, "%s %s --sample 0 --nvme-path %s --log %s 2>&1", PROG, args, dir, log);
    if (!(f = popen(cmd, "r"))) return -1;
    n = fread(R->out, 1, sizeof R->out - 1, f);
    R->out[n] = '\0';
    if (pclose(f) != 0) return -1;
    if (!(f = fopen(log, "r"))) return -1;
    while (fgets(line, sizeof line, f)) {
        int s;
        char *q;
        if (sscanf(line, "%d,", &s) != 1 || s != R->steps || s >= MAX_STEPS) continue;
        q = strchr(line, ',') + 1;
        R->loss[s] = strtod(q, &q);
        strtod(q + 1, &q); /* lr */
        R->norm[s] = strtof(q + 1, &q);
        R->val[s] = q[1] == '\n' || q[1] == '\0' ? -1.0 : strtod(q + 1, NULL);
        R->steps++;
    }
    fclose(f);
    remove(log);
    p = strstr(R->out, " gather ");
    R->gather_bytes = p ? strtod(p + 8, NULL) : -1.0;
    p = strstr(R->out, "params checksum: ");
    if (p) snprintf(R->sum, sizeof R->sum, "%.33s", p);
    return R->steps > 0 && p != NULL ? 0 : -1;
}

/* a and b are the same float or adjacent ones */
static int within_one_ulp(float a, float b)
{
    return a == b || nextafterf(a, INFINITY) == b || nextafterf(a, -INFINITY) == b;
}

/* Compares run t (tiled) with run u (untiled) as the header says; clip: whether clipping
   may be active. Returns 1 when every norm was bit-equal. */
static int compare(const char *what, const result *u, const result *t, int clip)
{
    int s, same_norms = 1;
    ZT_CHECKF(u->steps == t->steps, "%s: %d vs %d steps", what, u->steps, t->steps);
    for (s = 0; s < u->steps && s < t->steps; s++) {
        if (!clip || same_norms) {
            ZT_CHECKF(t->loss[s] == u->loss[s], "%s: step %d loss %.17g vs %.17g", what, s, t->loss[s], u->loss[s]);
            ZT_CHECKF(t->val[s] == u->val[s], "%s: step %d val %.17g vs %.17g", what, s, t->val[s], u->val[s]);
            ZT_CHECKF(within_one_ulp(t->norm[s], u->norm[s]), "%s: step %d norm %.9g vs %.9g", what, s,
                      (double)t->norm[s], (double)u->norm[s]);
        }
        if (t->norm[s] != u->norm[s]) same_norms = 0;
    }
    if (!clip || same_norms)
        ZT_CHECKF(strcmp(t->sum, u->sum) == 0 && t->sum[0], "%s: %s vs %s", what, t->sum, u->sum);
    return same_norms;
}

ZT_TEST(tiled_embedding_gives_the_same_run)
{
    static const char *const shape = "--ranks 2 --steps 4 --accum 2 --layers 2 --heads 2 --channels 16 --seq 16 "
                                     "--batch 4 --val-every 2";
    static result u, t;
    char a[512], b[768], what[64];
    int st, clip, bitwise = 0, runs = 0;
    if (access(PROG, X_OK) != 0) ZT_SKIP(PROG " not built (make " PROG ")");
    snprintf(dir, sizeof dir, "/tmp/zero-test-gpt2-tile-XXXXXX");
    ZT_CHECK(mkdtemp(dir) != NULL);
    for (st = 0; st <= 3; st++)
        for (clip = 0; clip <= 1; clip++) {
            snprintf(a, sizeof a, "%s --stage %d --clip %s", shape, st, clip ? "0.5" : "0");
            snprintf(b, sizeof b, "%s --tile-embedding 3", a);
            snprintf(what, sizeof what, "stage %d clip %s", st, clip ? "0.5" : "0");
            ZT_CHECKF(run(a, &u) == 0, "%s failed:\n%s", a, u.out);
            ZT_CHECKF(run(b, &t) == 0, "%s failed:\n%s", b, t.out);
            ZT_CHECKF(u.steps == 4, "%s: %d steps logged", a, u.steps);
            bitwise += compare(what, &u, &t, clip);
            runs++;
            if (st == 3)
                ZT_CHECKF(t.gather_bytes > 0 && t.gather_bytes < u.gather_bytes, "arena tiled %.0f B, untiled %.0f B",
                          t.gather_bytes, u.gather_bytes);
        }
    /* bf16, another tile count */
    snprintf(a, sizeof a, "--stage 1 --ranks 2 --steps 3 --dtype bf16 --layers 3 --heads 2 --channels 16 --seq 24 "
                          "--batch 2 --val-every 3 --clip 0");
    snprintf(b, sizeof b, "%s --tile-embedding 5", a);
    ZT_CHECKF(run(a, &u) == 0 && run(b, &t) == 0, "bf16 failed:\n%s\n%s", u.out, t.out);
    compare("bf16 stage 1", &u, &t, 0);
    /* ZeRO-Infinity's path at a small size: params, gradients and optimizer state on NVMe, a
       device budget below the model states, the embedding tiled; against the plain untiled run */
    snprintf(a, sizeof a, "%s --stage 3 --clip 0", shape);
    snprintf(b, sizeof b,
             "%s --tile-embedding 4 --offload-param nvme --offload-optimizer nvme --offload-gradients nvme "
             "--device-memory 64KiB",
             a);
    ZT_CHECKF(run(a, &u) == 0, "%s failed:\n%s", a, u.out);
    ZT_CHECKF(run(b, &t) == 0, "%s failed:\n%s", b, t.out);
    compare("stage 3 nvme params, gradients, optimizer, tiled", &u, &t, 0);
    ZT_CHECKF(strstr(t.out, "rank 0 nvme") && strstr(t.out, " grad ") && strstr(t.out, "master"), "%s", t.out);
    printf("  tiled vs untiled, stages 0-3 with and without clipping: %d of %d runs had every norm bit-equal\n",
           bitwise, runs);
    ZT_CHECK(rmdir(dir) == 0); /* nothing left behind */
}

/* ---- GPT-2 124M's arena, untiled and tiled --------------------------------------------- */

typedef struct commit124 {
    int tiles;
    zero_engine_desc desc;
    zero_engine_memory mem;
    size_t group0, block, tile; /* padded group sizes from the plan */
    char err[512];
} commit124;

static zero_result commit_rank(int rank, zero_comm *comm, void *user)
{
    commit124 *C = (commit124 *)user;
    char tiles[16];
    char *argv[] = {(char *)"train_gpt2", (char *)"--preset", (char *)"124M", (char *)"--ranks", (char *)"4",
                    (char *)"--batch", (char *)"4", (char *)"--tile-embedding", tiles};
    gpt2_opts o;
    gpt2_tensor *tab = NULL;
    zero_device *dev = NULL, *host = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    int first = -1;
    zero_result r;
    snprintf(tiles, sizeof tiles, "%d", C->tiles);
    gpt2_opts_default(&o);
    if (gpt2_parse_args(C->tiles ? 9 : 7, argv, &o) != 0) return ZERO_ERROR_INVALID_ARGUMENT;
    gpt2_engine_desc(&o, 3, o.batch / 4, &d);
    r = lz_device_create(&dev, &host);
    d.device = dev;
    d.comm = comm;
    tab = (gpt2_tensor *)malloc(sizeof *tab * (size_t)gpt2_num_tensors(&o.cfg));
    if (!tab && r == ZERO_OK) r = ZERO_ERROR_OUT_OF_MEMORY;
    if (r == ZERO_OK) r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) {
        gpt2_param_table(&o.cfg, tab);
        r = gpt2_add_tensors_tiled(e, &o.cfg, tab, o.tile_embedding, &first);
    }
    if (r == ZERO_OK) r = zero_engine_commit(e);
    if (r == ZERO_OK && rank == 0) {
        const zero_plan *p = zero_engine_plan(e);
        zero_group_info gi;
        r = zero_engine_get_desc(e, &C->desc);
        if (r == ZERO_OK) r = zero_engine_memory_usage(e, &C->mem);
        if (r == ZERO_OK && (r = zero_plan_group(p, 0, &gi)) == ZERO_OK) C->group0 = gi.numel;
        if (r == ZERO_OK && (r = zero_plan_group(p, 1, &gi)) == ZERO_OK) C->block = gi.numel;
        if (r == ZERO_OK && C->tiles && (r = zero_plan_group(p, gpt2_tile_group(&o.cfg, 0), &gi)) == ZERO_OK)
            C->tile = gi.numel;
    }
    if (r != ZERO_OK && rank == 0) snprintf(C->err, sizeof C->err, "%s", zero_last_error());
    zero_engine_destroy(e);
    free(dev);
    zero_device_destroy(host);
    free(tab);
    return r;
}

ZT_TEST(tiled_124m_commits_a_smaller_arena)
{
    static commit124 u, t;
    size_t es = 4;
    memset(&u, 0, sizeof u);
    memset(&t, 0, sizeof t);
    t.tiles = 8;
    ZT_CHECKF(zero_local_run(4, commit_rank, &u) == ZERO_OK, "untiled: %s", u.err);
    ZT_CHECKF(zero_local_run(4, commit_rank, &t) == ZERO_OK, "tiled: %s", t.err);
    if (u.err[0] || t.err[0]) return;
    /* untiled, group 0 = wte + wpe + ln_f is the largest; tiled, a tile is below a block */
    ZT_CHECKF(u.group0 > u.block && t.tile < t.block && t.block == u.block, "%zu %zu %zu", u.group0, u.block,
              t.tile);
    ZT_CHECKF(u.desc.max_live_numel == u.group0 + 2 * u.block, "untiled arena %zu, group 0 %zu, block %zu",
              u.desc.max_live_numel, u.group0, u.block);
    ZT_CHECKF(t.desc.max_live_numel == 3 * t.block, "tiled arena %zu, block %zu", t.desc.max_live_numel, t.block);
    ZT_CHECK(t.desc.max_live_numel < u.desc.max_live_numel);
    /* device bytes: the same model states, the arena smaller by the difference */
    ZT_CHECKF(u.mem.total_bytes - t.mem.total_bytes ==
                  (u.desc.max_live_numel - t.desc.max_live_numel) * es + (u.mem.bytes[ZERO_MEM_PARAM] +
                  u.mem.bytes[ZERO_MEM_GRAD] + u.mem.bytes[ZERO_MEM_MASTER] + u.mem.bytes[ZERO_MEM_MOMENT1] +
                  u.mem.bytes[ZERO_MEM_MOMENT2]) - (t.mem.bytes[ZERO_MEM_PARAM] + t.mem.bytes[ZERO_MEM_GRAD] +
                  t.mem.bytes[ZERO_MEM_MASTER] + t.mem.bytes[ZERO_MEM_MOMENT1] + t.mem.bytes[ZERO_MEM_MOMENT2]),
              "device %zu vs %zu", u.mem.total_bytes, t.mem.total_bytes);
    printf("  GPT-2 124M, fp32, 4 ranks, stage 3, the example's settings: max_live_numel %zu untiled, %zu with "
           "--tile-embedding 8; device bytes per rank %.1f MB vs %.1f MB\n",
           u.desc.max_live_numel, t.desc.max_live_numel, u.mem.total_bytes / 1e6, t.mem.total_bytes / 1e6);
}

int main(void)
{
    ZT_RUN(tiled_embedding_gives_the_same_run);
    ZT_RUN(tiled_124m_commits_a_smaller_arena);
    return zt_summary();
}
