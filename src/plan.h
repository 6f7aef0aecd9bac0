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

/* A new, empty plan. allocator may be NULL (ZERO_MALLOC/ZERO_FREE). */
ZERODEF zero_result zero_plan_create(zero_plan **out, const zero_allocator *allocator);
ZERODEF void zero_plan_destroy(zero_plan *plan);

/* Registers a tensor of numel (> 0) elements in group 'group' (>= 0). Names are unique,
   non-empty, at most 255 bytes. Tensor ids are 0, 1, 2... in registration order. Errors:
   after commit (INVALID_STATE), bad or duplicate name, numel 0, negative group. */
ZERODEF zero_result zero_plan_add(zero_plan *plan, const char *name, size_t numel, int group,
                                  int *out_tensor);

/* Lays out every group for 'world' ranks: each tensor start aligned to align_numel
   (0 = ZERO_DEFAULT_ALIGN_NUMEL), each group padded to a multiple of world * align_numel.
   Group ids must be exactly 0..G-1, each used. Groups with used_numel < persist_numel are
   marked persistent. Errors leave the plan uncommitted and unchanged. */
ZERODEF zero_result zero_plan_commit(zero_plan *plan, int world, size_t align_numel,
                                     size_t persist_numel);

ZERODEF int zero_plan_is_committed(const zero_plan *plan);
ZERODEF int zero_plan_world(const zero_plan *plan);          /* 0 before commit */
ZERODEF int zero_plan_num_groups(const zero_plan *plan);     /* 0 before commit */
ZERODEF int zero_plan_num_tensors(const zero_plan *plan);
ZERODEF size_t zero_plan_total_numel(const zero_plan *plan); /* sum of padded groups */
ZERODEF size_t zero_plan_align(const zero_plan *plan);

/* Queries: INVALID_STATE before commit, NOT_FOUND for an unknown id or name,
   INVALID_ARGUMENT for a rank outside 0..world-1 or a NULL out. */
ZERODEF zero_result zero_plan_group(const zero_plan *plan, int group, zero_group_info *out);
ZERODEF zero_result zero_plan_tensor(const zero_plan *plan, int tensor, zero_tensor_info *out);
ZERODEF zero_result zero_plan_find(const zero_plan *plan, const char *name, int *out_tensor);
/* Rank r's shard of a group: [r * shard_numel, (r + 1) * shard_numel). */
ZERODEF zero_result zero_plan_shard(const zero_plan *plan, int group, int rank, zero_range *out);
/* The part of a tensor inside rank r's shard of its group, as a range of the group buffer
   (numel 0 when they do not meet). The offset within the tensor is out->offset minus the
   tensor's offset. */
ZERODEF zero_result zero_plan_intersect(const zero_plan *plan, int tensor, int rank,
                                        zero_range *out);
/* A 64-bit hash of everything that shapes the layout (names, sizes, groups, world, align,
   persistence). Equal plans hash equal on every rank. 0 before commit. */
ZERODEF uint64_t zero_plan_hash(const zero_plan *plan);
