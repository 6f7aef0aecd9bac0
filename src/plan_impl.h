/* Plan implementation (section of zero.h).

   Tensors live in one array in registration order; a hash table of names (open addressing,
   linear probing, at most half full) makes zero_plan_add's duplicate check and
   zero_plan_find O(1). Commit builds every group's layout into fresh arrays and installs
   them only when all of it succeeded, so a failed commit changes nothing. */

#define ZERO__PLAN_MAX_NAME 255
#define ZERO__PLAN_MAX_TENSORS 0x3ffffffe /* ids and id + 1 fit an int with room to spare */

typedef struct zero__plan_tensor {
    char *name;
    size_t name_len;
    uint64_t name_hash;
    size_t numel;
    int group;
    size_t offset; /* set by commit */
} zero__plan_tensor;

typedef struct zero__plan_group {
    size_t numel;
    size_t used_numel;
    size_t shard_numel;
    int first;          /* index into group_tensors */
    int num_tensors;
    int persistent;
} zero__plan_group;

struct zero_plan {
    zero_allocator alloc;
    zero__plan_tensor *tensors;
    int num_tensors;
    int cap_tensors;
    int *table;          /* tensor id + 1, 0 = empty; table_cap is a power of two */
    size_t table_cap;
    /* set by a successful commit */
    int committed;
    int world;
    size_t align;
    size_t persist;
    int num_groups;
    zero__plan_group *groups;
    int *group_tensors;  /* tensor ids, group by group, registration order within each */
    size_t total_numel;
    uint64_t hash;
};

#define ZERO__FNV_OFFSET 0xcbf29ce484222325ull
#define ZERO__FNV_PRIME 0x100000001b3ull

static uint64_t zero__fnv1a(uint64_t h, const void *data, size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= ZERO__FNV_PRIME;
    }
    return h;
}

/* Hashes v as 8 little-endian bytes, whatever the host's byte order and size_t width. */
static uint64_t zero__fnv1a_u64(uint64_t h, uint64_t v)
{
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return zero__fnv1a(h, b, 8);
}

/* The slot holding 'name' in the table, or the empty slot where it would go. */
static size_t zero__plan_slot(const zero_plan *plan, const char *name, size_t len, uint64_t h)
{
    size_t mask = plan->table_cap - 1, i = (size_t)h & mask;
    for (;;) {
        int id = plan->table[i];
        if (id == 0) return i;
        {
            const zero__plan_tensor *t = &plan->tensors[id - 1];
            if (t->name_hash == h && t->name_len == len && memcmp(t->name, name, len) == 0)
                return i;
        }
        i = (i + 1) & mask;
    }
}

ZERODEF zero_result zero_plan_create(zero_plan **out, const zero_allocator *allocator)
{
    zero_plan *plan;
    zero_allocator a = {NULL, NULL, NULL};
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_create: out is NULL");
    *out = NULL;
    if (allocator) a = *allocator;
    plan = (zero_plan *)zero__alloc(&a, sizeof *plan);
    if (!plan)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_create: %zu bytes",
                          sizeof *plan);
    memset(plan, 0, sizeof *plan);
    plan->alloc = a;
    *out = plan;
    return ZERO_OK;
}

ZERODEF void zero_plan_destroy(zero_plan *plan)
{
    int i;
    zero_allocator a;
    if (!plan) return;
    a = plan->alloc;
    for (i = 0; i < plan->num_tensors; i++) zero__free(&a, plan->tensors[i].name);
    zero__free(&a, plan->tensors);
    zero__free(&a, plan->table);
    zero__free(&a, plan->groups);
    zero__free(&a, plan->group_tensors);
    zero__free(&a, plan);
}

/* Grows the name table to new_cap slots (a power of two), rehashing every tensor. */
static zero_result zero__plan_rehash(zero_plan *plan, size_t new_cap)
{
    size_t bytes, i, mask = new_cap - 1;
    int *table;
    int id;
    if (zero__mul_size(new_cap, sizeof(int), &bytes))
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: name table of %zu slots",
                          new_cap);
    table = (int *)zero__alloc(&plan->alloc, bytes);
    if (!table)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: name table of %zu bytes",
                          bytes);
    memset(table, 0, bytes);
    for (id = 0; id < plan->num_tensors; id++) {
        i = (size_t)plan->tensors[id].name_hash & mask;
        while (table[i] != 0) i = (i + 1) & mask;
        table[i] = id + 1;
    }
    zero__free(&plan->alloc, plan->table);
    plan->table = table;
    plan->table_cap = new_cap;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_add(zero_plan *plan, const char *name, size_t numel, int group,
                                  int *out_tensor)
{
    size_t len = 0, slot;
    uint64_t h;
    char *copy;
    zero_result r;
    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: plan is NULL");
    if (plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_plan_add: the plan is committed; add tensors before commit");
    if (!name) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: name is NULL");
    while (len <= ZERO__PLAN_MAX_NAME && name[len] != '\0') len++;
    if (len == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: name is empty");
    if (len > ZERO__PLAN_MAX_NAME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: name \"%.32s...\" is longer than %d bytes", name,
                          ZERO__PLAN_MAX_NAME);
    if (numel == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: tensor \"%s\": numel = 0",
                          name);
    if (group < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: tensor \"%s\": group = %d (must be >= 0)", name, group);
    h = zero__fnv1a(ZERO__FNV_OFFSET, name, len);
    if (plan->table_cap != 0 && plan->table[zero__plan_slot(plan, name, len, h)] != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: tensor name \"%s\" is already registered", name);
    if (plan->num_tensors == ZERO__PLAN_MAX_TENSORS)
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: too many tensors (%d)",
                          plan->num_tensors);
    /* Grow the tensor array and the table first: a failure leaves the plan as it was
       (bigger arrays, same contents). */
    if (plan->num_tensors == plan->cap_tensors) {
        int cap = plan->cap_tensors == 0                             ? 16
                  : plan->cap_tensors > ZERO__PLAN_MAX_TENSORS / 2 ? ZERO__PLAN_MAX_TENSORS
                                                                   : plan->cap_tensors * 2;
        zero__plan_tensor *grown;
        size_t bytes;
        if (zero__mul_size((size_t)cap, sizeof *grown, &bytes))
            return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: %d tensors", cap);
        grown = (zero__plan_tensor *)zero__alloc(&plan->alloc, bytes);
        if (!grown)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: %zu bytes", bytes);
        if (plan->num_tensors)
            memcpy(grown, plan->tensors, (size_t)plan->num_tensors * sizeof *grown);
        zero__free(&plan->alloc, plan->tensors);
        plan->tensors = grown;
        plan->cap_tensors = cap;
    }
    if ((size_t)(plan->num_tensors + 1) * 2 > plan->table_cap) {
        r = zero__plan_rehash(plan, plan->table_cap ? plan->table_cap * 2 : 64);
        if (r != ZERO_OK) return r;
    }
    copy = (char *)zero__alloc(&plan->alloc, len + 1);
    if (!copy) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: %zu bytes", len + 1);
    memcpy(copy, name, len + 1);
    slot = zero__plan_slot(plan, name, len, h);
    {
        zero__plan_tensor *t = &plan->tensors[plan->num_tensors];
        t->name = copy;
        t->name_len = len;
        t->name_hash = h;
        t->numel = numel;
        t->group = group;
        t->offset = 0;
    }
    plan->table[slot] = plan->num_tensors + 1;
    if (out_tensor) *out_tensor = plan->num_tensors;
    plan->num_tensors++;
    return ZERO_OK;
}

/* x rounded up to a multiple of a (a > 0); -1 on overflow. */
static int zero__round_up(size_t x, size_t a, size_t *out)
{
    size_t rem = x % a;
    if (rem == 0) {
        *out = x;
        return 0;
    }
    return zero__add_size(x, a - rem, out);
}

ZERODEF zero_result zero_plan_commit(zero_plan *plan, int world, size_t align_numel,
                                     size_t persist_numel)
{
    int ntensors, ngroups, max_group = -1, i, g;
    size_t unit, bytes, total = 0, count_len;
    int *counts = NULL, *ids = NULL;
    size_t *offsets = NULL;
    zero__plan_group *groups = NULL;
    uint64_t h;
    zero_result r = ZERO_OK;

    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_commit: plan is NULL");
    if (plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_plan_commit: already committed");
    if (world <= 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_commit: world = %d (must be >= 1)", world);
    if (align_numel == 0) align_numel = ZERO_DEFAULT_ALIGN_NUMEL;
    ntensors = plan->num_tensors;
    if (ntensors == 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_plan_commit: no tensors registered");
    if (zero__mul_size((size_t)world, align_numel, &unit))
        return zero__fail(ZERO_ERROR_OVERFLOW,
                          "zero_plan_commit: world (%d) * align_numel (%zu) overflows size_t",
                          world, align_numel);

    /* Group ids must be exactly 0..G-1. At most ntensors distinct ids exist, so a missing id,
       if any, is below ntensors + 1: counting that far finds the smallest. */
    for (i = 0; i < ntensors; i++)
        if (plan->tensors[i].group > max_group) max_group = plan->tensors[i].group;
    count_len = (size_t)max_group + 1;
    if (count_len > (size_t)ntensors + 1) count_len = (size_t)ntensors + 1;
    counts = (int *)zero__alloc(&plan->alloc, count_len * sizeof(int));
    if (!counts) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_commit: %zu bytes",
                       count_len * sizeof(int));
        goto done;
    }
    memset(counts, 0, count_len * sizeof(int));
    for (i = 0; i < ntensors; i++)
        if ((size_t)plan->tensors[i].group < count_len) counts[plan->tensors[i].group]++;
    for (g = 0; (size_t)g < count_len && g <= max_group; g++)
        if (counts[g] == 0) {
            r = zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                           "zero_plan_commit: group ids must be 0..G-1 each used: group %d has "
                           "no tensor (largest id %d)",
                           g, max_group);
            goto done;
        }
    ngroups = max_group + 1;

    /* Layout, into fresh arrays: tensor offsets, groups, the group -> tensors index. */
    if (zero__mul_size((size_t)ngroups, sizeof *groups, &bytes)) {
        r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_commit: %d groups", ngroups);
        goto done;
    }
    groups = (zero__plan_group *)zero__alloc(&plan->alloc, bytes);
    ids = (int *)zero__alloc(&plan->alloc, (size_t)ntensors * sizeof(int));
    offsets = (size_t *)zero__alloc(&plan->alloc, (size_t)ntensors * sizeof(size_t));
    if (!groups || !ids || !offsets) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_commit: layout of %d tensors",
                       ntensors);
        goto done;
    }
    memset(groups, 0, bytes);
    {
        int first = 0;
        for (g = 0; g < ngroups; g++) {
            groups[g].first = first;
            first += counts[g];
        }
    }
    for (i = 0; i < ntensors; i++) {
        const zero__plan_tensor *t = &plan->tensors[i];
        zero__plan_group *grp = &groups[t->group];
        size_t off, end;
        if (zero__round_up(grp->used_numel, align_numel, &off) ||
            zero__add_size(off, t->numel, &end)) {
            r = zero__fail(ZERO_ERROR_OVERFLOW,
                           "zero_plan_commit: group %d overflows size_t at tensor \"%s\" "
                           "(numel %zu)",
                           t->group, t->name, t->numel);
            goto done;
        }
        offsets[i] = off;
        grp->used_numel = end;
        ids[grp->first + grp->num_tensors++] = i;
    }
    for (g = 0; g < ngroups; g++) {
        zero__plan_group *grp = &groups[g];
        if (zero__round_up(grp->used_numel, unit, &grp->numel) ||
            zero__add_size(total, grp->numel, &total)) {
            r = zero__fail(ZERO_ERROR_OVERFLOW,
                           "zero_plan_commit: group %d (%zu elements) padded to a multiple of "
                           "%zu overflows size_t",
                           g, grp->used_numel, unit);
            goto done;
        }
        grp->shard_numel = grp->numel / (size_t)world;
        grp->persistent = grp->used_numel < persist_numel;
    }

    /* The hash: FNV-1a 64 over a canonical byte encoding (fixed-width little-endian
       integers, length-prefixed names), never over struct memory. */
    h = zero__fnv1a(ZERO__FNV_OFFSET, "zero-plan-v1", 12);
    h = zero__fnv1a_u64(h, (uint64_t)world);
    h = zero__fnv1a_u64(h, (uint64_t)align_numel);
    h = zero__fnv1a_u64(h, (uint64_t)ntensors);
    for (i = 0; i < ntensors; i++) {
        const zero__plan_tensor *t = &plan->tensors[i];
        h = zero__fnv1a_u64(h, (uint64_t)t->name_len);
        h = zero__fnv1a(h, t->name, t->name_len);
        h = zero__fnv1a_u64(h, (uint64_t)t->numel);
        h = zero__fnv1a_u64(h, (uint64_t)t->group);
    }
    h = zero__fnv1a_u64(h, (uint64_t)ngroups);
    for (g = 0; g < ngroups; g++) h = zero__fnv1a_u64(h, (uint64_t)groups[g].persistent);
    if (h == 0) h = 1; /* 0 means "not committed" */

    /* Install. Nothing below can fail. */
    for (i = 0; i < ntensors; i++) plan->tensors[i].offset = offsets[i];
    plan->groups = groups;
    plan->group_tensors = ids;
    groups = NULL;
    ids = NULL;
    plan->num_groups = ngroups;
    plan->world = world;
    plan->align = align_numel;
    plan->persist = persist_numel;
    plan->total_numel = total;
    plan->hash = h;
    plan->committed = 1;

done:
    zero__free(&plan->alloc, counts);
    zero__free(&plan->alloc, offsets);
    zero__free(&plan->alloc, groups);
    zero__free(&plan->alloc, ids);
    return r;
}

ZERODEF int zero_plan_is_committed(const zero_plan *plan) { return plan && plan->committed; }
ZERODEF int zero_plan_world(const zero_plan *plan) { return plan ? plan->world : 0; }
ZERODEF int zero_plan_num_groups(const zero_plan *plan) { return plan ? plan->num_groups : 0; }
ZERODEF int zero_plan_num_tensors(const zero_plan *plan) { return plan ? plan->num_tensors : 0; }
ZERODEF size_t zero_plan_total_numel(const zero_plan *plan)
{
    return plan ? plan->total_numel : 0;
}
ZERODEF size_t zero_plan_align(const zero_plan *plan) { return plan ? plan->align : 0; }
ZERODEF uint64_t zero_plan_hash(const zero_plan *plan) { return plan ? plan->hash : 0; }

/* The common checks of the queries. */
static zero_result zero__plan_query(const zero_plan *plan, const void *out, const char *fn)
{
    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: plan is NULL", fn);
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: the plan is not committed", fn);
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_group(const zero_plan *plan, int group, zero_group_info *out)
{
    const zero__plan_group *g;
    zero_result r = zero__plan_query(plan, out, "zero_plan_group");
    if (r != ZERO_OK) return r;
    if (group < 0 || group >= plan->num_groups)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_group: group %d (the plan has %d)",
                          group, plan->num_groups);
    g = &plan->groups[group];
    out->numel = g->numel;
    out->used_numel = g->used_numel;
    out->shard_numel = g->shard_numel;
    out->tensors = plan->group_tensors + g->first;
    out->num_tensors = g->num_tensors;
    out->persistent = g->persistent;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_tensor(const zero_plan *plan, int tensor, zero_tensor_info *out)
{
    const zero__plan_tensor *t;
    zero_result r = zero__plan_query(plan, out, "zero_plan_tensor");
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= plan->num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_tensor: tensor %d (the plan has %d)",
                          tensor, plan->num_tensors);
    t = &plan->tensors[tensor];
    out->name = t->name;
    out->group = t->group;
    out->offset = t->offset;
    out->numel = t->numel;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_find(const zero_plan *plan, const char *name, int *out_tensor)
{
    size_t len = 0;
    int id;
    zero_result r = zero__plan_query(plan, out_tensor, "zero_plan_find");
    if (r != ZERO_OK) return r;
    if (!name) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_find: name is NULL");
    while (len <= ZERO__PLAN_MAX_NAME && name[len] != '\0') len++;
    id = 0;
    if (len >= 1 && len <= ZERO__PLAN_MAX_NAME)
        id = plan->table[zero__plan_slot(plan, name, len,
                                         zero__fnv1a(ZERO__FNV_OFFSET, name, len))];
    if (id == 0)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_find: no tensor named \"%.64s\"",
                          name);
    *out_tensor = id - 1;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_shard(const zero_plan *plan, int group, int rank, zero_range *out)
{
    const zero__plan_group *g;
    zero_result r = zero__plan_query(plan, out, "zero_plan_shard");
    if (r != ZERO_OK) return r;
    if (group < 0 || group >= plan->num_groups)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_shard: group %d (the plan has %d)",
                          group, plan->num_groups);
    if (rank < 0 || rank >= plan->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_shard: rank %d outside 0..%d", rank, plan->world - 1);
    g = &plan->groups[group];
    out->offset = (size_t)rank * g->shard_numel;
    out->numel = g->shard_numel;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_intersect(const zero_plan *plan, int tensor, int rank,
                                        zero_range *out)
{
    const zero__plan_tensor *t;
    size_t s0, s1, t0, t1, lo, hi;
    zero_result r = zero__plan_query(plan, out, "zero_plan_intersect");
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= plan->num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND,
                          "zero_plan_intersect: tensor %d (the plan has %d)", tensor,
                          plan->num_tensors);
    if (rank < 0 || rank >= plan->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_intersect: rank %d outside 0..%d", rank, plan->world - 1);
    t = &plan->tensors[tensor];
    s0 = (size_t)rank * plan->groups[t->group].shard_numel;
    s1 = s0 + plan->groups[t->group].shard_numel;
    t0 = t->offset;
    t1 = t0 + t->numel;
    lo = s0 > t0 ? s0 : t0;
    hi = s1 < t1 ? s1 : t1;
    if (lo < hi) {
        out->offset = lo;
        out->numel = hi - lo;
    } else {
        /* Empty: the offset is the shard start clamped into the tensor, so that
           out->offset - tensor offset stays within 0..numel and grows with the rank. */
        out->offset = s0 < t0 ? t0 : (s0 > t1 ? t1 : s0);
        out->numel = 0;
    }
    return ZERO_OK;
}
