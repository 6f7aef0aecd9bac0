/* The partition plan: layout rules, shards, views, intersections, hash, every error path. */
#include "zero.h"
#include "tests/zt.h"

#include <stdint.h>

/* ---- helpers ---------------------------------------------------------------------------- */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* A random tensor list. Group ids are drawn from 0..G-1, then the first G tensors get a
   random permutation of 0..G-1 so every id is used. */
typedef struct spec {
    int n, groups;
    size_t numel[128];
    int group[128];
    char name[128][32];
} spec;

static void random_spec(spec *s)
{
    int i, g;
    s->n = 1 + (int)(zt_rand64() % 40);
    s->groups = 1 + (int)(zt_rand64() % (unsigned)(s->n < 8 ? s->n : 8));
    for (i = 0; i < s->n; i++) {
        /* log-uniform in 1..~10k: many small tensors (biases), some large */
        s->numel[i] = (size_t)(exp(zt_uniform() * log(10000.0)) + 0.5);
        if (s->numel[i] < 1) s->numel[i] = 1;
        s->group[i] = (int)(zt_rand64() % (unsigned)s->groups);
        snprintf(s->name[i], sizeof s->name[i], "layer%d.t%d", (int)(zt_rand64() % 1000), i);
    }
    for (g = 0; g < s->groups; g++) s->group[g] = g;
    for (g = s->groups - 1; g > 0; g--) { /* shuffle the first G ids */
        int j = (int)(zt_rand64() % (unsigned)(g + 1)), t = s->group[g];
        s->group[g] = s->group[j];
        s->group[j] = t;
    }
}

static zero_plan *build(const spec *s, int world, size_t align, size_t persist)
{
    zero_plan *p = NULL;
    int i, id;
    if (zero_plan_create(&p, NULL) != ZERO_OK) return NULL;
    for (i = 0; i < s->n; i++)
        if (zero_plan_add(p, s->name[i], s->numel[i], s->group[i], &id) != ZERO_OK || id != i) {
            zero_plan_destroy(p);
            return NULL;
        }
    if (zero_plan_commit(p, world, align, persist) != ZERO_OK) {
        zero_plan_destroy(p);
        return NULL;
    }
    return p;
}

/* ---- layout properties over random plans, N = 1..64 ------------------------------------ */

static int check_plan(const spec *s, const zero_plan *p, int world, size_t align, size_t persist)
{
    int failures_before = zt_cur_failures;
    int g, i, r, k;
    size_t unit = (size_t)world * align;
    size_t total = 0;
    ZT_CHECK(zero_plan_is_committed(p));
    ZT_CHECK(zero_plan_world(p) == world);
    ZT_CHECK(zero_plan_align(p) == align);
    ZT_CHECK(zero_plan_num_groups(p) == s->groups);
    ZT_CHECK(zero_plan_num_tensors(p) == s->n);
    ZT_CHECK(zero_plan_hash(p) != 0);

    for (g = 0; g < s->groups; g++) {
        zero_group_info gi;
        int *owner_tensor, *owner_count;
        size_t e, cursor = 0;
        int prev_id = -1, expect_count = 0;
        ZT_CHECK(zero_plan_group(p, g, &gi) == ZERO_OK);

        /* the layout, recomputed here from the rule: registration order, aligned starts */
        for (i = 0; i < s->n; i++) {
            zero_tensor_info ti;
            if (s->group[i] != g) continue;
            ZT_CHECK(zero_plan_tensor(p, i, &ti) == ZERO_OK);
            ZT_CHECKF(ti.offset == round_up(cursor, align), "tensor %d offset %zu", i, ti.offset);
            ZT_CHECK(ti.offset % align == 0);
            ZT_CHECK(ti.numel == s->numel[i] && ti.group == g);
            ZT_CHECK(expect_count < gi.num_tensors && gi.tensors[expect_count] == i);
            ZT_CHECK(i > prev_id);
            prev_id = i;
            expect_count++;
            cursor = ti.offset + ti.numel;
        }
        ZT_CHECK(gi.num_tensors == expect_count);
        ZT_CHECK(gi.used_numel == cursor);
        ZT_CHECKF(gi.numel % unit == 0 && gi.numel >= gi.used_numel &&
                      gi.numel - gi.used_numel < unit,
                  "group %d numel %zu used %zu unit %zu", g, gi.numel, gi.used_numel, unit);
        ZT_CHECK(gi.shard_numel * (size_t)world == gi.numel);
        ZT_CHECK(gi.persistent == (gi.used_numel < persist));
        total += gi.numel;

        /* coverage: tensors over the group buffer (no overlap, padding outside tensors) */
        owner_tensor = (int *)malloc(gi.numel * sizeof(int));
        owner_count = (int *)calloc(gi.numel, sizeof(int));
        for (e = 0; e < gi.numel; e++) owner_tensor[e] = -1;
        for (k = 0; k < gi.num_tensors; k++) {
            zero_tensor_info ti;
            zero_plan_tensor(p, gi.tensors[k], &ti);
            ZT_CHECK(ti.offset + ti.numel <= gi.used_numel);
            for (e = ti.offset; e < ti.offset + ti.numel; e++) {
                ZT_CHECKF(owner_tensor[e] == -1, "element %zu of group %d in two tensors", e, g);
                owner_tensor[e] = gi.tensors[k];
            }
        }
        /* shards: equal, in order, tiling the group; every element owned by one rank */
        for (r = 0; r < world; r++) {
            zero_range sh;
            ZT_CHECK(zero_plan_shard(p, g, r, &sh) == ZERO_OK);
            ZT_CHECK(sh.numel == gi.shard_numel);
            ZT_CHECK(sh.offset == (size_t)r * gi.shard_numel);
            for (e = sh.offset; e < sh.offset + sh.numel && e < gi.numel; e++) owner_count[e]++;
        }
        for (e = 0; e < gi.numel; e++)
            ZT_CHECKF(owner_count[e] == 1, "group %d element %zu owned by %d ranks", g, e,
                      owner_count[e]);

        /* intersections against brute force: scan each tensor's elements, ask which shard
           holds each one by scanning the shard ranges */
        for (k = 0; k < gi.num_tensors; k++) {
            zero_tensor_info ti;
            size_t next = 0; /* intersections over ranks must tile the tensor in order */
            int t = gi.tensors[k];
            zero_plan_tensor(p, t, &ti);
            for (r = 0; r < world; r++) {
                zero_range sh, is;
                size_t lo = (size_t)-1, cnt = 0;
                zero_plan_shard(p, g, r, &sh);
                for (e = ti.offset; e < ti.offset + ti.numel; e++)
                    if (e >= sh.offset && e < sh.offset + sh.numel) {
                        if (lo == (size_t)-1) lo = e;
                        cnt++;
                    }
                ZT_CHECK(zero_plan_intersect(p, t, r, &is) == ZERO_OK);
                ZT_CHECKF(is.numel == cnt, "tensor %d rank %d: %zu vs %zu", t, r, is.numel, cnt);
                if (cnt) ZT_CHECK(is.offset == lo);
                ZT_CHECK(is.offset >= ti.offset && is.offset - ti.offset <= ti.numel);
                ZT_CHECK(is.offset - ti.offset == next || is.numel == 0);
                if (is.numel) next = is.offset - ti.offset + is.numel;
            }
            ZT_CHECKF(next == ti.numel, "tensor %d: intersections cover %zu of %zu", t, next,
                      ti.numel);
        }
        free(owner_tensor);
        free(owner_count);
    }
    ZT_CHECK(zero_plan_total_numel(p) == total);

    /* views round-trip */
    for (i = 0; i < s->n; i++) {
        int id = -1;
        zero_tensor_info ti;
        ZT_CHECK(zero_plan_find(p, s->name[i], &id) == ZERO_OK && id == i);
        ZT_CHECK(zero_plan_tensor(p, id, &ti) == ZERO_OK && strcmp(ti.name, s->name[i]) == 0);
    }
    return zt_cur_failures == failures_before;
}

ZT_TEST(random_layouts_for_every_world_1_to_64)
{
    static const size_t aligns[] = {1, 2, 4, 8, 16, 64};
    int world, rep, reps = zt_quick() ? 2 : 8;
    zt_seed(1);
    for (world = 1; world <= 64; world++)
        for (rep = 0; rep < reps; rep++) {
            spec s;
            size_t align = aligns[zt_rand64() % 6];
            size_t persist = (zt_rand64() % 4 == 0) ? (size_t)(zt_rand64() % 20000) : 0;
            zero_plan *p;
            random_spec(&s);
            p = build(&s, world, align, persist);
            ZT_CHECKF(p != NULL, "world %d: %s", world, zero_last_error());
            if (!p) continue;
            if (!check_plan(&s, p, world, align, persist)) {
                printf("  (world %d align %zu persist %zu, %d tensors, %d groups)\n", world,
                       align, persist, s.n, s.groups);
                zero_plan_destroy(p);
                return;
            }
            zero_plan_destroy(p);
        }
}

/* ---- the worked example of docs/plan.md ------------------------------------------------- */

ZT_TEST(worked_example)
{
    zero_plan *p = NULL;
    zero_group_info g0, g1;
    zero_tensor_info t;
    zero_range rr;
    int id;
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "embed", 1000, 0, &id) == ZERO_OK && id == 0);
    ZT_CHECK(zero_plan_add(p, "ln.w", 10, 0, &id) == ZERO_OK && id == 1);
    ZT_CHECK(zero_plan_add(p, "fc.w", 300, 1, &id) == ZERO_OK && id == 2);
    ZT_CHECK(zero_plan_add(p, "ln.b", 10, 0, &id) == ZERO_OK && id == 3);
    ZT_CHECK(zero_plan_add(p, "fc.b", 5, 1, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_commit(p, 4, 16, 500) == ZERO_OK);
    /* group 0: embed [0,1000), ln.w at round_up(1000,16) = 1008, ln.b at 1024; used 1034,
       padded to a multiple of 4 * 16 = 64: 1088; shards of 272 */
    ZT_CHECK(zero_plan_group(p, 0, &g0) == ZERO_OK);
    ZT_CHECK(g0.numel == 1088 && g0.used_numel == 1034 && g0.shard_numel == 272);
    ZT_CHECK(g0.num_tensors == 3 && g0.tensors[0] == 0 && g0.tensors[1] == 1 &&
             g0.tensors[2] == 3 && !g0.persistent);
    ZT_CHECK(zero_plan_tensor(p, 1, &t) == ZERO_OK && t.offset == 1008);
    ZT_CHECK(zero_plan_tensor(p, 3, &t) == ZERO_OK && t.offset == 1024);
    /* group 1: fc.w [0,300), fc.b at 304; used 309, padded to 320; shards of 80;
       309 < 500 so it is persistent */
    ZT_CHECK(zero_plan_group(p, 1, &g1) == ZERO_OK);
    ZT_CHECK(g1.numel == 320 && g1.used_numel == 309 && g1.shard_numel == 80 && g1.persistent);
    ZT_CHECK(zero_plan_total_numel(p) == 1408);
    /* embed over ranks: [0,272) [272,544) [544,816) [816,1000) */
    ZT_CHECK(zero_plan_intersect(p, 0, 2, &rr) == ZERO_OK && rr.offset == 544 && rr.numel == 272);
    ZT_CHECK(zero_plan_intersect(p, 0, 3, &rr) == ZERO_OK && rr.offset == 816 && rr.numel == 184);
    /* ln.w lies wholly in rank 3's shard [816,1088); rank 0 gets an empty range */
    ZT_CHECK(zero_plan_intersect(p, 1, 3, &rr) == ZERO_OK && rr.offset == 1008 && rr.numel == 10);
    ZT_CHECK(zero_plan_intersect(p, 1, 0, &rr) == ZERO_OK && rr.numel == 0 && rr.offset == 1008);
    /* fc.b [304,309) is in rank 3's shard [240,320) of group 1 */
    ZT_CHECK(zero_plan_intersect(p, 4, 3, &rr) == ZERO_OK && rr.offset == 304 && rr.numel == 5);
    ZT_CHECK(zero_plan_shard(p, 1, 3, &rr) == ZERO_OK && rr.offset == 240 && rr.numel == 80);
    /* The hash is pinned: it is over a canonical byte encoding, so it is the same on every
       host and build. A change here breaks every saved checkpoint's plan check. */
    ZT_CHECKF(zero_plan_hash(p) == 0x90e4ef654c57cdf6ull, "hash 0x%016llx",
              (unsigned long long)zero_plan_hash(p));
    zero_plan_destroy(p);
}

/* ---- hash ------------------------------------------------------------------------------ */

ZT_TEST(hash_equal_for_equal_plans_different_otherwise)
{
    spec s, v;
    uint64_t h0, h;
    zero_plan *p;
    int i;
    zt_seed(7);
    do random_spec(&s); while (s.groups < 2 || s.n < 4);
    p = build(&s, 4, 16, 0);
    ZT_CHECK(p != NULL);
    h0 = zero_plan_hash(p);
    zero_plan_destroy(p);
    for (i = 0; i < 3; i++) { /* equal plans, built again */
        p = build(&s, 4, 16, 0);
        ZT_CHECK(p && zero_plan_hash(p) == h0);
        zero_plan_destroy(p);
    }
#define HASH_OF(sp, w, a, per)                                                               \
    (p = build(sp, w, a, per), h = p ? zero_plan_hash(p) : 0, zero_plan_destroy(p), h)
    v = s;
    v.numel[s.n - 1] += 1; /* one size */
    ZT_CHECK(HASH_OF(&v, 4, 16, 0) != h0 && h != 0);
    v = s;
    v.name[1][0] = 'L'; /* one name */
    ZT_CHECK(HASH_OF(&v, 4, 16, 0) != h0 && h != 0);
    v = s;
    for (i = 0; i < v.n; i++) /* one group: move a tensor of a group with more than one */
        if (i >= v.groups) {
            v.group[i] = (v.group[i] + 1) % v.groups;
            break;
        }
    if (i < v.n) ZT_CHECK(HASH_OF(&v, 4, 16, 0) != h0 && h != 0);
    ZT_CHECK(HASH_OF(&s, 3, 16, 0) != h0 && h != 0);            /* world */
    ZT_CHECK(HASH_OF(&s, 4, 8, 0) != h0 && h != 0);             /* align */
    ZT_CHECK(HASH_OF(&s, 4, 16, (size_t)-1) != h0 && h != 0);   /* every group persistent */
    ZT_CHECK(HASH_OF(&s, 4, 0, 0) == h0);                       /* 0 means the default 16 */
    /* persistence is hashed by its outcome (which groups stay whole), not the threshold */
    ZT_CHECK(HASH_OF(&s, 4, 16, 1) == h0);
#undef HASH_OF
}

/* ---- errors ----------------------------------------------------------------------------- */

/* The plan's observable state, to show an error changed nothing. */
typedef struct snapshot {
    int committed, world, groups, tensors;
    size_t total, align;
    uint64_t hash;
} snapshot;

static snapshot snap(const zero_plan *p)
{
    snapshot s;
    s.committed = zero_plan_is_committed(p);
    s.world = zero_plan_world(p);
    s.groups = zero_plan_num_groups(p);
    s.tensors = zero_plan_num_tensors(p);
    s.total = zero_plan_total_numel(p);
    s.align = zero_plan_align(p);
    s.hash = zero_plan_hash(p);
    return s;
}

static int same(snapshot a, snapshot b)
{
    return a.committed == b.committed && a.world == b.world && a.groups == b.groups &&
           a.tensors == b.tensors && a.total == b.total && a.align == b.align &&
           a.hash == b.hash;
}

#define EXPECT_ERR(call, code, p)                                                            \
    do {                                                                                     \
        snapshot before_ = snap(p);                                                          \
        zero_result r_;                                                                      \
        zero_clear_error();                                                                  \
        r_ = (call);                                                                         \
        ZT_CHECKF(r_ == (code), "%s gave %d (%s)", #call, (int)r_, zero_last_error());       \
        ZT_CHECKF(zero_last_error()[0] != '\0', "%s set no error detail", #call);            \
        ZT_CHECKF(same(before_, snap(p)), "%s changed the plan", #call);                     \
    } while (0)

ZT_TEST(add_errors_change_nothing)
{
    zero_plan *p = NULL;
    char longname[300];
    int id = 12345;
    EXPECT_ERR(zero_plan_create(NULL, NULL), ZERO_ERROR_INVALID_ARGUMENT, p);
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "a", 10, 0, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_add(NULL, "x", 1, 0, NULL), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_add(p, NULL, 1, 0, &id), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_add(p, "", 1, 0, &id), ZERO_ERROR_INVALID_ARGUMENT, p);
    memset(longname, 'n', sizeof longname);
    longname[256] = '\0';
    EXPECT_ERR(zero_plan_add(p, longname, 1, 0, &id), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_add(p, "a", 1, 0, &id), ZERO_ERROR_INVALID_ARGUMENT, p);
    ZT_CHECK(strstr(zero_last_error(), "\"a\"") != NULL);
    EXPECT_ERR(zero_plan_add(p, "b", 0, 0, &id), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_add(p, "b", 1, -1, &id), ZERO_ERROR_INVALID_ARGUMENT, p);
    ZT_CHECK(id == 12345); /* untouched on error */
    longname[255] = '\0';  /* 255 bytes is allowed */
    ZT_CHECK(zero_plan_add(p, longname, 1, 0, &id) == ZERO_OK && id == 1);
    ZT_CHECK(zero_plan_add(p, "b", 1, 0, &id) == ZERO_OK && id == 2);
    ZT_CHECK(zero_plan_num_tensors(p) == 3);
    zero_plan_destroy(p);
    zero_plan_destroy(NULL); /* no-op */
}

ZT_TEST(queries_before_commit_are_invalid_state)
{
    zero_plan *p = NULL;
    zero_group_info gi;
    zero_tensor_info ti;
    zero_range rr;
    int id;
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 2, 16, 0), ZERO_ERROR_INVALID_STATE, p); /* no tensors */
    ZT_CHECK(zero_plan_add(p, "w", 100, 0, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_group(p, 0, &gi), ZERO_ERROR_INVALID_STATE, p);
    EXPECT_ERR(zero_plan_tensor(p, 0, &ti), ZERO_ERROR_INVALID_STATE, p);
    EXPECT_ERR(zero_plan_find(p, "w", &id), ZERO_ERROR_INVALID_STATE, p);
    EXPECT_ERR(zero_plan_shard(p, 0, 0, &rr), ZERO_ERROR_INVALID_STATE, p);
    EXPECT_ERR(zero_plan_intersect(p, 0, 0, &rr), ZERO_ERROR_INVALID_STATE, p);
    ZT_CHECK(zero_plan_hash(p) == 0 && zero_plan_world(p) == 0 && zero_plan_num_groups(p) == 0);
    ZT_CHECK(zero_plan_total_numel(p) == 0 && !zero_plan_is_committed(p));
    ZT_CHECK(zero_plan_num_tensors(p) == 1);
    zero_plan_destroy(p);
    ZT_CHECK(zero_plan_hash(NULL) == 0 && zero_plan_num_tensors(NULL) == 0);
}

ZT_TEST(commit_errors_change_nothing)
{
    zero_plan *p = NULL;
    zero_group_info gi;
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "a", 100, 0, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "c", 100, 2, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "d", 100, 4, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(NULL, 2, 16, 0), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_commit(p, 0, 16, 0), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_commit(p, -3, 16, 0), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_commit(p, 2, 16, 0), ZERO_ERROR_INVALID_ARGUMENT, p);
    ZT_CHECKF(strstr(zero_last_error(), "group 1 ") != NULL, "%s", zero_last_error());
    ZT_CHECK(zero_plan_add(p, "b", 100, 1, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 2, 16, 0), ZERO_ERROR_INVALID_ARGUMENT, p);
    ZT_CHECKF(strstr(zero_last_error(), "group 3 ") != NULL, "%s", zero_last_error());
    ZT_CHECK(zero_plan_add(p, "e", 100, 3, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_commit(p, 2, 16, 0) == ZERO_OK); /* still usable after the errors */
    ZT_CHECK(zero_plan_num_groups(p) == 5 && zero_plan_group(p, 4, &gi) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 2, 16, 0), ZERO_ERROR_INVALID_STATE, p); /* twice */
    EXPECT_ERR(zero_plan_add(p, "f", 1, 0, NULL), ZERO_ERROR_INVALID_STATE, p);
    zero_plan_destroy(p);

    /* a huge group id with few tensors names the smallest missing id */
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "a", 1, 0, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "z", 1, 2147483647, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 1, 1, 0), ZERO_ERROR_INVALID_ARGUMENT, p);
    ZT_CHECKF(strstr(zero_last_error(), "group 1 ") != NULL, "%s", zero_last_error());
    zero_plan_destroy(p);
}

ZT_TEST(overflowing_sizes_are_refused)
{
    zero_plan *p = NULL;
    const size_t huge = (size_t)-1;
    /* one tensor whose padding to world * align does not fit */
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "huge", huge - 5, 0, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 4, 16, 0), ZERO_ERROR_OVERFLOW, p);
    ZT_CHECK(zero_plan_commit(p, 1, 1, 0) == ZERO_OK); /* fits unpadded: still usable */
    zero_plan_destroy(p);
    /* two tensors whose sum does not fit */
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "a", huge / 2 + 1, 0, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "b", huge / 2 + 1, 0, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 1, 1, 0), ZERO_ERROR_OVERFLOW, p);
    zero_plan_destroy(p);
    /* alignment of the second start overflows */
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "a", huge - 3, 0, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "b", 1, 0, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 1, 8, 0), ZERO_ERROR_OVERFLOW, p);
    zero_plan_destroy(p);
    /* two groups that fit alone but not together */
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "a", huge / 4 * 3, 0, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "b", huge / 4 * 3, 1, NULL) == ZERO_OK);
    EXPECT_ERR(zero_plan_commit(p, 1, 1, 0), ZERO_ERROR_OVERFLOW, p);
    /* world * align itself */
    EXPECT_ERR(zero_plan_commit(p, 2147483647, huge / 2, 0), ZERO_ERROR_OVERFLOW, p);
    zero_plan_destroy(p);
}

ZT_TEST(query_errors_after_commit_change_nothing)
{
    spec s;
    zero_plan *p;
    zero_group_info gi;
    zero_tensor_info ti;
    zero_range rr;
    char longname[300];
    int id;
    zt_seed(3);
    random_spec(&s);
    p = build(&s, 3, 8, 0);
    ZT_CHECK(p != NULL);
    if (!p) return;
    EXPECT_ERR(zero_plan_group(p, -1, &gi), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_group(p, s.groups, &gi), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_group(p, 0, NULL), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_group(NULL, 0, &gi), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_tensor(p, -1, &ti), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_tensor(p, s.n, &ti), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_tensor(p, 0, NULL), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_find(p, "no such tensor", &id), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_find(p, "", &id), ZERO_ERROR_NOT_FOUND, p);
    memset(longname, 'x', sizeof longname);
    longname[299] = '\0';
    EXPECT_ERR(zero_plan_find(p, longname, &id), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_find(p, NULL, &id), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_find(p, s.name[0], NULL), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_shard(p, 0, -1, &rr), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_shard(p, 0, 3, &rr), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_shard(p, -1, 0, &rr), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_shard(p, 0, 0, NULL), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_intersect(p, 0, 3, &rr), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_intersect(p, 0, -1, &rr), ZERO_ERROR_INVALID_ARGUMENT, p);
    EXPECT_ERR(zero_plan_intersect(p, s.n, 0, &rr), ZERO_ERROR_NOT_FOUND, p);
    EXPECT_ERR(zero_plan_intersect(p, 0, 0, NULL), ZERO_ERROR_INVALID_ARGUMENT, p);
    /* still usable, and still the same layout */
    ZT_CHECK(check_plan(&s, p, 3, 8, 0));
    zero_plan_destroy(p);
}

/* ---- allocator: every byte through the hooks; failures change nothing and leak nothing -- */

typedef struct counting {
    long live, calls, fail_at; /* fail the fail_at-th call (0-based); -1 = never */
} counting;

static void *counting_alloc(size_t bytes, void *user)
{
    counting *c = (counting *)user;
    if (c->fail_at >= 0 && c->calls++ == c->fail_at) return NULL;
    c->live++;
    return malloc(bytes);
}

static void counting_free(void *ptr, void *user)
{
    ((counting *)user)->live--;
    free(ptr);
}

ZT_TEST(allocation_failures_change_nothing_and_leak_nothing)
{
    long k;
    int completed = 0;
    for (k = 0; !completed; k++) {
        counting c = {0, 0, 0};
        zero_allocator a;
        zero_plan *p = NULL;
        zero_result r;
        int i, added = 0;
        c.fail_at = k;
        a.alloc = counting_alloc;
        a.free = counting_free;
        a.user = &c;
        r = zero_plan_create(&p, &a);
        if (r != ZERO_OK) {
            ZT_CHECK(r == ZERO_ERROR_OUT_OF_MEMORY && p == NULL && c.live == 0);
            continue;
        }
        for (i = 0; i < 100; i++) {
            char name[32];
            snprintf(name, sizeof name, "t%d", i);
            r = zero_plan_add(p, name, (size_t)(i * 37 % 500 + 1), i % 3, NULL);
            if (r == ZERO_OK) {
                added++;
            } else {
                ZT_CHECK(r == ZERO_ERROR_OUT_OF_MEMORY);
                i--; /* retry the same tensor: the plan must take it now */
                c.fail_at = -1;
            }
        }
        ZT_CHECK(added == 100 && zero_plan_num_tensors(p) == 100);
        r = zero_plan_commit(p, 4, 16, 0);
        if (r != ZERO_OK) {
            ZT_CHECK(r == ZERO_ERROR_OUT_OF_MEMORY && !zero_plan_is_committed(p));
            c.fail_at = -1;
            r = zero_plan_commit(p, 4, 16, 0);
            ZT_CHECK(r == ZERO_OK);
        } else if (c.fail_at >= 0) {
            completed = 1; /* nothing failed: every allocation point has been tried */
        }
        {
            int id;
            ZT_CHECK(zero_plan_find(p, "t57", &id) == ZERO_OK && id == 57);
        }
        zero_plan_destroy(p);
        ZT_CHECKF(c.live == 0, "fail_at %ld: %ld blocks leaked", k, c.live);
    }
    ZT_CHECK(k > 10);
}

/* ---- scale: 100k tensors (names hashed, not searched) ----------------------------------- */

ZT_TEST(hundred_thousand_tensors)
{
    int n = zt_quick() ? 20000 : 100000, i, id;
    zero_plan *p = NULL;
    char name[32];
    int ok = 1;
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    for (i = 0; i < n && ok; i++) {
        snprintf(name, sizeof name, "blocks.%d.weight", i);
        ok = zero_plan_add(p, name, (size_t)(i % 97 + 1), i / 1000, &id) == ZERO_OK && id == i;
    }
    ZT_CHECK(ok);
    snprintf(name, sizeof name, "blocks.%d.weight", n / 2);
    ZT_CHECK(zero_plan_add(p, name, 1, 0, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_plan_commit(p, 8, 16, 4096) == ZERO_OK);
    for (i = 0; i < n && ok; i++) {
        snprintf(name, sizeof name, "blocks.%d.weight", i);
        ok = zero_plan_find(p, name, &id) == ZERO_OK && id == i;
    }
    ZT_CHECK(ok);
    ZT_CHECK(zero_plan_num_groups(p) == (n + 999) / 1000);
    zero_plan_destroy(p);
}

int main(void)
{
    ZT_RUN(random_layouts_for_every_world_1_to_64);
    ZT_RUN(worked_example);
    ZT_RUN(hash_equal_for_equal_plans_different_otherwise);
    ZT_RUN(add_errors_change_nothing);
    ZT_RUN(queries_before_commit_are_invalid_state);
    ZT_RUN(commit_errors_change_nothing);
    ZT_RUN(overflowing_sizes_are_refused);
    ZT_RUN(query_errors_after_commit_change_nothing);
    ZT_RUN(allocation_failures_change_nothing_and_leak_nothing);
    ZT_RUN(hundred_thousand_tensors);
    return zt_summary();
}
