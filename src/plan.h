/* Plan declarations (section of zero.h). */

#define ZERO_DEFAULT_ALIGN_NUMEL 16

typedef struct zero_range {
    size_t offset; /* first element, in the group's flat buffer */
    size_t numel;
} zero_range;

typedef struct zero_tensor_info {
    const char *name; /* owned by the plan */
    int group;
    size_t offset;    /* first element in the group's flat buffer; a multiple of align */
    size_t numel;
} zero_tensor_info;

typedef struct zero_group_info {
    size_t numel;        /* padded flat size: a multiple of world * align               */
    size_t used_numel;   /* end of the group's last tensor (<= numel)                   */
    size_t shard_numel;  /* numel / world                                               */
    const int *tensors;  /* the group's tensor ids in registration order (plan-owned)  */
    int num_tensors;
    int persistent;      /* used_numel < persist_numel: stage 3 keeps it whole         */
} zero_group_info;

typedef struct zero_plan zero_plan;

/* A new, empty plan. allocator may be NULL (ZERO_MALLOC/ZERO_FREE); otherwise it is copied
   and every allocation of the plan, the plan itself included, goes through it until
   zero_plan_destroy(). A committed plan is read-only: its queries may run concurrently. */
ZERODEF zero_result zero_plan_create(zero_plan **out, const zero_allocator *allocator);
ZERODEF void zero_plan_destroy(zero_plan *plan);

/* Registers a tensor of numel (> 0) elements in group 'group' (>= 0). Names are unique,
   non-empty, at most 255 bytes (the plan keeps a copy). Tensor ids are 0, 1, 2... in
   registration order; out_tensor may be NULL. Errors: after commit (INVALID_STATE); NULL,
   empty, too long or duplicate name, numel 0, negative group (INVALID_ARGUMENT);
   OUT_OF_MEMORY. A failed add changes nothing. */
ZERODEF zero_result zero_plan_add(zero_plan *plan, const char *name, size_t numel, int group,
                                  int *out_tensor);

/* Lays out every group for 'world' ranks: each tensor start aligned to align_numel
   (0 = ZERO_DEFAULT_ALIGN_NUMEL), each group padded to a multiple of world * align_numel.
   Group ids must be exactly 0..G-1, each used. Groups with used_numel < persist_numel are
   marked persistent (0 = none); their shards are still the equal slices. Errors: world <= 0
   or a missing group id, named (INVALID_ARGUMENT); no tensors, or already committed
   (INVALID_STATE); a padded group or the total past SIZE_MAX (OVERFLOW); OUT_OF_MEMORY.
   Errors leave the plan uncommitted and unchanged. */
ZERODEF zero_result zero_plan_commit(zero_plan *plan, int world, size_t align_numel,
                                     size_t persist_numel);

ZERODEF int zero_plan_is_committed(const zero_plan *plan);
ZERODEF int zero_plan_world(const zero_plan *plan);          /* 0 before commit */
ZERODEF int zero_plan_num_groups(const zero_plan *plan);     /* 0 before commit */
ZERODEF int zero_plan_num_tensors(const zero_plan *plan);
ZERODEF size_t zero_plan_total_numel(const zero_plan *plan); /* sum of padded groups */
ZERODEF size_t zero_plan_align(const zero_plan *plan);       /* 0 before commit */

/* Queries: INVALID_STATE before commit, NOT_FOUND for an unknown id or name,
   INVALID_ARGUMENT for a rank outside 0..world-1 or a NULL out. */
ZERODEF zero_result zero_plan_group(const zero_plan *plan, int group, zero_group_info *out);
ZERODEF zero_result zero_plan_tensor(const zero_plan *plan, int tensor, zero_tensor_info *out);
ZERODEF zero_result zero_plan_find(const zero_plan *plan, const char *name, int *out_tensor);
/* Rank r's shard of a group: [r * shard_numel, (r + 1) * shard_numel). */
ZERODEF zero_result zero_plan_shard(const zero_plan *plan, int group, int rank, zero_range *out);
/* The part of a tensor inside rank r's shard of its group, as a range of the group buffer
   (numel 0 when they do not meet). The offset within the tensor is out->offset minus the
   tensor's offset. An empty result has its offset clamped into the tensor, so that
   offset - tensor offset is always within 0..numel and never decreases with the rank. */
ZERODEF zero_result zero_plan_intersect(const zero_plan *plan, int tensor, int rank,
                                        zero_range *out);
/* A 64-bit hash of everything that shapes the layout (names, sizes, groups, world, align,
   which groups are persistent), FNV-1a over a fixed little-endian encoding (docs/plan.md):
   equal plans hash equal on every rank, host and build. Never 0 after commit; 0 before. */
ZERODEF uint64_t zero_plan_hash(const zero_plan *plan);
